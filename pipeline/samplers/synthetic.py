"""Synthetic acceptance: a verify step that accepts at set rates, for speed measurements only.

Not a verify rule: it ignores what the models say about the draft tokens. Each draft position i is accepted with a
set conditional probability P_i, given that positions 0..i-1 were accepted, so a step accepts

    n = the first i with u_i >= P_i (γ when there is none),   P(n > i | n >= i) = P_i

with u the step's one ``torch.rand((B, γ+1))`` draw (:func:`pipeline.samplers.contract.uniforms`: column i < γ
decides position i; the run's generator seeds it, so a seeded run repeats its accepted counts). The emitted token
(the corrected or bonus token) is the target's argmax at position n: a cheap deterministic choice, not a sample from
any distribution. What it is for: the real models' shapes with random weights (a GPU machine without network) accept
nothing under a real rule; with the rates a real pair measured (its results' ``metrics.position_acceptance``,
``--synthetic-rates``) the random pair decodes with that pair's tokens per step, so its speed is the speed the real
pair would have at that acceptance (vLLM's synthetic rejection sampler does this for load tests).

Rates: ``synthetic_acceptance`` (--synthetic-acceptance P) for every position, or ``rates`` (--synthetic-rates, a
comma list or a results JSON; pipeline/config.py) per position; positions past the list reuse its last rate.

Lossless "never" (pipeline/rules.py), speed only (``Rule.speed_only``): the output is neither the target's nor the
draft's, so its quality scores say nothing about any rule; the runs table leaves them out and the report says so.

The contract (:mod:`pipeline.samplers.contract`): batched, CPU or CUDA, no host sync, per-row draft lengths g_b
(positions past g_b rejected; a row that accepts all g_b emits the target's argmax at g_b), deterministic drafts
(draft_logits None) at any temperature, the draft logits read only at the drafted tokens for ``draft_ok``, and
``target_ok`` False where a target row's maximum is NaN, +inf or -inf (as greedy's).
"""

from __future__ import annotations

import math

import torch

from pipeline.errors import SamplerInputError
from pipeline.rules import RULES
from pipeline.samplers.contract import uniforms
from pipeline.samplers.torch_ref import Sampler, argmax_result

_SYNTHETIC = RULES["synthetic"].defaults()


def check_rate(value, what: str) -> float:
    """``value`` as a float in [0, 1]; a one-line SamplerInputError otherwise."""
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = math.nan
    if not 0.0 <= rate <= 1.0:
        raise SamplerInputError(f"{what} must be a probability in [0, 1]; got {value!r}")
    return rate


def rates_for(rates, gamma: int) -> list[float]:
    """[γ] per-position rates from a list (positions past its end reuse its last rate; cut past γ)."""
    rates = list(rates)
    return [rates[min(i, len(rates) - 1)] for i in range(gamma)] if rates else []


class SyntheticSampler(Sampler):
    """Accept each draft position i with probability P_i given the positions before it were accepted, then emit the
    target's argmax. Speed measurements only (lossless "never"); see the module docstring."""

    name = "synthetic"

    def __init__(self, temperature: float = 1.0, synthetic_acceptance: float = _SYNTHETIC["synthetic_acceptance"],
                 rates=None) -> None:
        super().__init__(temperature)
        self.synthetic_acceptance = check_rate(synthetic_acceptance, "synthetic acceptance (--synthetic-acceptance)")
        if rates is not None:
            rates = tuple(check_rate(r, "each synthetic rate (--synthetic-rates)") for r in rates)
            if not rates:
                raise SamplerInputError("synthetic rates (--synthetic-rates) must list at least one rate")
        self.rates = rates
        self._tables: dict[tuple[int, str], torch.Tensor] = {}

    @property
    def params(self) -> dict:
        return {"temperature": self.temperature, "synthetic_acceptance": self.synthetic_acceptance,
                "rates": self.rates}

    @property
    def verifies_by_argmax(self) -> bool:
        return False  # it accepts at its rates, the target's argmax or not

    def rates_for(self, gamma: int) -> list[float]:
        """The [γ] conditional rates a step of γ draft tokens uses."""
        return rates_for(self.rates if self.rates is not None else (self.synthetic_acceptance,), gamma)

    def _table(self, gamma: int, device: torch.device) -> torch.Tensor:
        """float32 [γ] rates on ``device``, built once per (γ, device) so a step copies nothing from the host."""
        key = (gamma, str(device))
        if key not in self._tables:
            self._tables[key] = torch.tensor(self.rates_for(gamma), dtype=torch.float32, device=device)
        return self._tables[key]

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        u = uniforms(B, gamma, draft_tokens.device, generator)                  # [B, γ+1]; column γ unused
        target_max, target_argmax = target_logits.max(dim=-1)                   # [B, γ+1]
        return argmax_result(u[:, :gamma] < self._table(gamma, draft_tokens.device), draft_tokens, draft_logits,
                             target_max, target_argmax, lengths)
