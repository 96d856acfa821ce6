"""Hugging Face's own verify step, behind the sampler contract: the baseline the paper measured against.

This calls transformers' ``_speculative_sampling`` itself (it is not copied), so it measures what HF users
run: two full-vocabulary softmaxes, host syncs, batch 1. HF's function draws from torch's global RNG; when a
``generator`` is passed, a seed is drawn from it (from the one row's own generator of a RowGenerators) and HF runs
under a forked, re-seeded global RNG.
HF has no NaN check of its own: NaN logits reach ``torch.multinomial``, which raises.

Deterministic drafts (``draft_logits=None``): ``_speculative_sampling`` takes the draft's logits, so this sampler
builds them, one-hot (0 at each proposed token, -inf elsewhere), [1, γ, V_t] fp32: batch 1, where this rule is the
baseline, and what the string mode of a draft with another tokenizer handed every rule before deterministic drafts
existed. Through HF's softmax that is q(x) = 1, so HF accepts x with probability p(x) and resamples from p with x
removed: the same law as `exact`'s deterministic path (lossless), and what transformers' own loop computes for
candidates without logits (prompt lookup: it samples from the target and keeps the draft while they match). The
one-hot tensor and HF's softmax of it are part of what this baseline costs, as they are in HF's function.
"""

from __future__ import annotations

import inspect

import torch

from pipeline.errors import SamplerInputError, SpecsweepError
from pipeline.rng import RowGenerators
from pipeline.samplers.contract import SamplerResult
from pipeline.samplers.torch_ref import ExactSampler, Sampler

_EXPECTED_PARAMS = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")


def hf_speculative_sampling():
    """transformers' ``_speculative_sampling`` as fn(candidate_input_ids, candidate_logits, candidate_length,
    new_logits), after checking it still has the signature we call. Releases up to about 5.17 (and the 4.x
    the paper used) take a fifth argument, ``is_done_candidate`` (the last draft ends the sequence); a
    verify step on its own is never done, so it is passed False."""
    import transformers
    from transformers.generation import utils as hf_utils

    fn = getattr(hf_utils, "_speculative_sampling", None)
    if fn is None:
        raise SpecsweepError(
            f"transformers {transformers.__version__} has no generation.utils._speculative_sampling: "
            "install the tested version from constraints.txt")
    names = tuple(inspect.signature(fn).parameters)
    if names[: len(_EXPECTED_PARAMS)] != _EXPECTED_PARAMS:
        raise SpecsweepError(
            f"transformers {transformers.__version__} changed _speculative_sampling{names}; specsweep calls it "
            f"as {_EXPECTED_PARAMS}: install the tested version from constraints.txt")
    if names[len(_EXPECTED_PARAMS): len(_EXPECTED_PARAMS) + 1] == ("is_done_candidate",):
        def not_done(candidate_input_ids, candidate_logits, candidate_length, new_logits):
            return fn(candidate_input_ids, candidate_logits, candidate_length, new_logits, False)

        return not_done
    return fn


class HFSampler(Sampler):
    """transformers' ``_speculative_sampling`` (Leviathan et al. algorithm 1), batch 1, temperature > 0."""

    name = "hf"

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__(temperature)
        if self.temperature == 0.0:
            raise SamplerInputError(
                "the hf sampler needs temperature > 0 (at T = 0 HF verifies by token matching): use sampler greedy")
        self._fn = hf_speculative_sampling()

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        if B != 1:
            raise SamplerInputError(f"the hf sampler runs batch 1, as HF does; got batch {B}: use --batch-size 1")
        if lengths is not None and gamma > 0:
            # The row's own draft length (adaptive drafting): transformers' function takes the candidates it
            # verifies, so the draft is cut on the host, as transformers' own loop cuts it (one read; its verify
            # step reads its accepted count back anyway).
            own = int(lengths[0])
            if own < gamma:
                res = self.verify_checked(draft_tokens[:, :own],
                                          None if draft_logits is None else draft_logits[:, :own],
                                          target_logits[:, : own + 1], generator)
                tokens = torch.full((1, gamma + 1), -1, dtype=torch.int64, device=draft_tokens.device)
                tokens[:, : own + 1] = res.tokens
                return SamplerResult(accepted=res.accepted, tokens=tokens, draft_ok=res.draft_ok,
                                     target_ok=res.target_ok)
        if gamma == 0:
            # A step with no draft (the engine drafts fewer tokens as a row nears its limit): HF's loop then just
            # samples from the target; so does this, as the reference does at γ = 0.
            return ExactSampler(self.temperature).verify_checked(draft_tokens, draft_logits, target_logits, generator,
                                                                 None)
        # HF hands the sampler fp32 logits already divided by the temperature (its logits warpers do that).
        new_logits = target_logits.float() / self.temperature
        if draft_logits is None:  # a deterministic draft: one-hot logits [1, γ, V_t] for HF's function (docstring)
            candidate_logits = torch.full_like(new_logits[:, :gamma], float("-inf")).scatter_(
                2, draft_tokens[..., None], 0.0)
        else:
            candidate_logits = draft_logits.float() / self.temperature
        v_t, v_d = new_logits.shape[-1], candidate_logits.shape[-1]
        if v_d < v_t:  # padded target vocabulary: the draft's missing entries have probability 0
            candidate_logits = torch.nn.functional.pad(candidate_logits, (0, v_t - v_d), value=float("-inf"))
        if generator is None:
            valid, n_matches = self._fn(draft_tokens, candidate_logits, gamma, new_logits)
        else:
            if isinstance(generator, RowGenerators):  # batch 1: the one row's own generator
                generator = generator.row_generator(0)
            seed = int(torch.randint(2**62, (1,), generator=generator, device=generator.device).item())
            devices = [draft_tokens.device] if draft_tokens.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                valid, n_matches = self._fn(draft_tokens, candidate_logits, gamma, new_logits)
        accepted = n_matches.reshape(1).to(torch.int64)
        tokens = torch.full((1, gamma + 1), -1, dtype=torch.int64, device=draft_tokens.device)
        tokens[:, : valid.shape[1]] = valid
        ok = torch.ones(1, dtype=torch.bool, device=draft_tokens.device)
        return SamplerResult(accepted=accepted, tokens=tokens, draft_ok=ok, target_ok=ok)
