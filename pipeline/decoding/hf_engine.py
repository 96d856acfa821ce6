"""The `hf` engine: Hugging Face's own assisted generation, with our sampler as its verify step.

``target.generate(assistant_model=draft, ...)`` runs HF's loop (batch 1, as HF requires). For the duration
of each call, transformers' ``_speculative_sampling`` is replaced by a shim that runs any specsweep sampler
(the paper's ``--use_custom_sampler`` method) and HF's function is put back afterwards, also on error.
HF hands the verify step logits already divided by the temperature, so the shim's sampler runs at T = 1.
At T = 0 HF verifies by token matching and never calls the verify step.

The draft is given a constant schedule of γ tokens with no confidence threshold, so HF drafts exactly what
our engine drafts. transformers 5 reads that schedule from the *assistant's* generation config and ignores
``num_assistant_tokens`` & co. passed to ``generate`` (left at its defaults it drafts up to 20 tokens and stops
early on a confidence threshold), so ``assistant_schedule`` sets it on the draft for the call and puts the old
values back. Time in draft and target forwards is measured with forward hooks.

A draft with another tokenizer (``tokenizers``: the target's and the draft's) runs transformers' Universal Assisted
Generation (``generate(..., tokenizer=, assistant_tokenizer=)``) at T = 0: the draft's text re-tokenised for the
target and matched greedily, the baseline of our string mode (pipeline/decoding/drafters/cross_tokenizer.py). Its
sampling variant
prunes the draft's LM head in place, which would change the draft that later runs of a grid share, so it is not
offered (the runner refuses it in one line).
"""

from __future__ import annotations

import copy
import time
from contextlib import ExitStack, contextmanager

import torch

from pipeline.decoding.engine import GenerationResult
from pipeline.decoding.timing import PhaseTimer, peak_memory_mb, reset_peak_memory
from pipeline.samplers import FiniteCheck, Sampler


@contextmanager
def hf_verify_step(sampler: Sampler | None, generator: torch.Generator | None, stats: dict,
                   timer: PhaseTimer | None = None):
    """Put ``sampler`` in place of transformers' ``_speculative_sampling`` inside the block; with ``sampler``
    None, HF's own function runs unchanged and is only counted.

    ``stats`` gains calls / accepted / drafted counts and hist {(candidate length, accepted): calls}; with a
    sampler, a FiniteCheck under stats["finite"] is checked by the caller.
    """
    from transformers.generation import utils as hf_utils

    original = hf_utils._speculative_sampling
    guard = stats.setdefault("finite", FiniteCheck()) if sampler is not None else None

    def specsweep_verify(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs):
        if timer is not None:
            timer.start("verify")
        if sampler is None:
            valid, accepted = original(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                                       *args, **kwargs)
        else:
            result = sampler(candidate_input_ids[:, -candidate_length:], candidate_logits, new_logits,
                             generator=generator)
            accepted = result.accepted[0]
        if timer is not None:
            timer.stop("verify")
        n = int(accepted)  # HF's loop needs host integers here anyway
        if sampler is not None:
            guard.update(result)
            valid = result.tokens[:, : n + 1]
            # transformers up to about 5.17 passes is_done_candidate (the last draft ends the sequence) fifth,
            # and expects no token after it: every draft accepted is then reported as n = γ - 1 with the γ
            # drafts as the tokens, as HF's own function does
            is_done = bool(args[0]) if args else bool(kwargs.get("is_done_candidate", False))
            if is_done and n == candidate_length:
                valid = candidate_input_ids[:, -candidate_length:]
                accepted = accepted - 1
        stats["calls"] = stats.get("calls", 0) + 1
        stats["accepted"] = stats.get("accepted", 0) + n
        stats["drafted"] = stats.get("drafted", 0) + candidate_length
        hist = stats.setdefault("hist", {})
        hist[(candidate_length, n)] = hist.get((candidate_length, n), 0) + 1
        return valid, accepted

    hf_utils._speculative_sampling = specsweep_verify
    try:
        yield stats
    finally:
        hf_utils._speculative_sampling = original


ASSISTANT_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
"""The keys of the assistant's generation config that set how far transformers' assisted generation drafts."""


def assistant_defaults(draft) -> dict:
    """What transformers' assisted generation drafts with out of the box for ``draft`` (:data:`ASSISTANT_SETTINGS`):
    its generation config's values and, where they are unset, transformers' own defaults, filled in as its candidate
    generator fills them at generate time (transformers 5: ``GenerationConfig``'s table of defaults, read from the
    installed version, never copied here; earlier versions keep the defaults on the config itself)."""
    from transformers import GenerationConfig

    config = copy.deepcopy(draft.generation_config)
    # transformers' own table, the one its candidate generator reads (a staticmethod of the installed version)
    defaults = getattr(GenerationConfig, "_get_default_generation_params", None)
    if defaults is not None:
        config.update(**defaults(), defaults_only=True)
    return {key: getattr(config, key) for key in ASSISTANT_SETTINGS}


@contextmanager
def assistant_config(draft, settings: dict):
    """Set ``settings`` (keys of :data:`ASSISTANT_SETTINGS`) on ``draft.generation_config``, where transformers'
    candidate generator reads them, inside the block, and put every key of :data:`ASSISTANT_SETTINGS` back after it
    (transformers writes the heuristic schedule's last draft length back to the draft's config after each call:
    restored too). ``settings`` empty: the draft's own config, out of the box."""
    config = draft.generation_config
    saved = {k: getattr(config, k, None) for k in ASSISTANT_SETTINGS}
    for key, value in settings.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


def assistant_schedule(draft, gamma: int):
    """Make HF's assisted generation draft exactly ``gamma`` tokens per step (fewer only at max_new_tokens) inside
    the block: ``num_assistant_tokens``, a constant schedule and no confidence threshold on the draft's generation
    config (:func:`assistant_config`)."""
    return assistant_config(draft, {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                                    "assistant_confidence_threshold": 0.0})


@contextmanager
def forward_timing(model, timer: PhaseTimer, name: str):
    """Time (and count) every forward of ``model`` as phase ``name`` of ``timer`` inside the block (hooks)."""
    handles = [model.register_forward_pre_hook(lambda *_: timer.start(name)),
               model.register_forward_hook(lambda *_: timer.stop(name))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class HFEngine:
    """Runs ``target.generate(assistant_model=draft)`` one row at a time with ``sampler`` as the verify step.

    ``sampler`` must be built at temperature 1 when ``temperature`` > 0 (HF applies the temperature itself).
    """

    def __init__(self, target, draft, sampler: Sampler, gamma: int, temperature: float, device: str,
                 eos_token_ids: list[int], pad_token_id: int = 0, tokenizers: tuple | None = None) -> None:
        self.target, self.draft, self.sampler = target, draft, sampler
        self.tokenizers = tokenizers if gamma > 0 else None     # (target's, draft's): another tokenizer, T = 0
        if self.tokenizers is not None and temperature > 0:
            raise ValueError("transformers' assisted generation with another tokenizer runs here at T = 0 only")
        self.bridge_mode = "string" if self.tokenizers is not None else "shared"
        self.gamma, self.temperature = gamma, temperature
        self.device = torch.device(device)
        self.eos, self.pad = eos_token_ids, pad_token_id

    def _generate_kwargs(self, max_new_tokens: int) -> dict:
        kwargs = {"max_new_tokens": max_new_tokens, "min_new_tokens": 0, "pad_token_id": self.pad,
                  "eos_token_id": self.eos or None, "do_sample": self.temperature > 0, "top_k": None,
                  "top_p": None, "num_beams": 1, "return_dict_in_generate": False}
        if self.temperature > 0:
            kwargs["temperature"] = self.temperature
        if self.gamma > 0:
            kwargs["assistant_model"] = self.draft  # its schedule: assistant_schedule in generate
        if self.tokenizers is not None:
            kwargs["tokenizer"], kwargs["assistant_tokenizer"] = self.tokenizers
        return kwargs

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 generator: torch.Generator | None = None, encoder_inputs: dict | None = None) -> GenerationResult:
        """input_ids, attention_mask int64 [B, L] (left-padded); each row is generated alone (HF: batch 1).

        With ``encoder_inputs`` (Whisper's input_features [B, n_mels, frames]) HF builds the decoder prompt
        itself; input_ids then only name the prompt tokens to strip from its output."""
        dev = self.device
        timer = PhaseTimer(str(dev))
        stats: dict = {}
        reset_peak_memory(dev)
        tokens, row_stats = [], []
        t_start = time.perf_counter()
        kwargs = self._generate_kwargs(max_new_tokens)
        with ExitStack() as stack:
            stack.enter_context(hf_verify_step(self.sampler, generator, stats, timer))
            stack.enter_context(forward_timing(self.target, timer, "target"))
            if self.gamma > 0:
                stack.enter_context(assistant_schedule(self.draft, self.gamma))
                stack.enter_context(forward_timing(self.draft, timer, "draft"))
            for row in range(input_ids.shape[0]):
                keep = attention_mask[row].bool()
                ids = input_ids[row][keep][None].to(dev)
                before = {k: stats.get(k, 0) for k in ("calls", "accepted", "drafted")}
                target_calls_before = timer.counts["target"]
                draft_calls_before = timer.counts["draft"]
                t_row = time.perf_counter()
                if generator is not None:  # HF draws from the global RNG: seed it from our generator
                    torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator,
                                                        device=generator.device).item()))
                if encoder_inputs is None:
                    out = self.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
                    new = out[0, ids.shape[1]:].tolist()
                else:
                    dtype = next(self.target.parameters()).dtype
                    row_inputs = {k: v[row: row + 1].to(dev, dtype=dtype) for k, v in encoder_inputs.items()}
                    new = self.target.generate(**row_inputs, **kwargs)[0].tolist()
                    prompt = ids[0].tolist()
                    while new and prompt and new[0] == prompt[0]:  # HF may return its decoder prompt too
                        new, prompt = new[1:], prompt[1:]
                tokens.append(new)
                steps = timer.counts["target"] - target_calls_before
                counted = stats.get("calls", 0) > before["calls"]
                if counted:  # sampled: the shim counted exactly
                    accepted = stats["accepted"] - before["accepted"]
                    drafted = stats["drafted"] - before["drafted"]
                else:  # greedy: HF matched tokens itself. One draft forward per drafted token; every step
                    # emits its accepted tokens plus one (the last step may be cut at max_new_tokens or EOS)
                    accepted = max(0, len(new) - steps)
                    drafted = timer.counts["draft"] - draft_calls_before
                row_stats.append({"new_tokens": len(new), "verify_steps": steps, "accepted": accepted,
                                  "drafted": drafted, "wall_time_s": time.perf_counter() - t_row,
                                  "acceptance_counted": counted or self.gamma == 0})
        stats["finite"].check()
        wall = time.perf_counter() - t_start
        peak = peak_memory_mb(dev)
        calls = dict(timer.counts)
        return GenerationResult(tokens=tokens, row_stats=row_stats, wall_time_s=wall,
                                verify_steps=sum(r["verify_steps"] for r in row_stats),
                                phase_time_s=timer.totals(), phase_calls=calls, peak_memory_mb=peak,
                                extra={"draft_forwards": calls.get("draft", 0),
                                       "accepted_histogram": self._histogram(stats)})

    def _histogram(self, stats: dict) -> list[int] | None:
        """[γ+1] counts of full-γ verify calls that accepted k tokens (None at T = 0: HF matched tokens itself)."""
        if not stats.get("hist") or self.gamma == 0:
            return None
        return [stats["hist"].get((self.gamma, k), 0) for k in range(self.gamma + 1)]

