"""Lossy acceptance rules: the torch reference of `typical`, `fuzzy`, `relaxed` and `accept_all`.

None of them preserves the target's distribution (pipeline/rules.py marks them lossless "never"); each trades
some of it for more accepted draft tokens. All four follow the sampler contract
(:mod:`pipeline.samplers.contract`): batched, CPU or CUDA, no host sync inside a step, fp32 arithmetic, a draft
vocabulary V_d <= V_t (draft entries past V_d are probability 0), at most one ``torch.rand((B, γ+1))`` per step
(column γ draws the emitted token where one is drawn; the acceptance tests below are deterministic except
fuzzy's, which uses columns 0..γ-1 as `exact` does), and NaN/+inf logits reported through ``draft_ok`` /
``target_ok`` for the logits the step read. With per-row draft lengths g_b (the contract's ``lengths``) each row is
verified as it would be alone with γ = g_b: γ below reads g_b, n <= g_b, and the bonus comes from p at g_b.

Notation: at position i < γ the draft proposed x_i; z_t,i and z_d,i are the raw target and draft logits,
p_i = softmax(z_t,i / T) and q_i = softmax(z_d,i / T) the tempered distributions; n is the number of accepted
drafts (the first rejected position, or γ). The step emits x_0..x_{n-1} and one more token y_n.

typical     Typical acceptance: Medusa (Cai et al. 2024, "MEDUSA: Simple LLM Inference Acceleration Framework
            with Multiple Decoding Heads", §3.3.1) as vLLM implements it (TypicalAcceptanceSampler):

                accept x_i  iff  p_i(x_i) > min(epsilon, delta * exp(-H(p_i))),   H(p) = -Σ_v p(v) log(p(v) + 1e-5)

            (the 1e-5 inside the log is the guard of Medusa's and vLLM's code, kept so thresholds mean the same
            here). The draft's probabilities are not read. y_n = argmax z_t,n where n < γ (vLLM's "replacement
            token"; its first version emitted it only when the whole block was rejected, later versions emit the
            target's own sample at T there); the bonus y_γ ~ p_γ. T = 0: greedy verification (the T -> 0 limit:
            p_i is one-hot, H = 0, and with epsilon < 1 the test is x_i = argmax). epsilon = vLLM's
            posterior_threshold (default 0.09), delta = posterior_alpha (default 0.3 = sqrt(0.09), vLLM's).

fuzzy       Fuzzy Speculative Decoding (Holsman, Huang and Dhingra, ACL Findings 2025, "Fuzzy Speculative Decoding
            for a Tunable Accuracy-Runtime Tradeoff"), divergence: Jensen-Shannon in nats (0 <= JS <= ln 2), the
            default of the authors' code (fsd_div_type="js_div"):

                JS_i < threshold:  accept x_i outright
                otherwise:         exact's test, accept with probability min(1, p_i(x_i) / q_i(x_i))
                y_n ~ norm(max(0, p_n - q_n)) where n < γ (exact's residual), y_γ ~ p_γ

            The authors' code rejects outright where JS_i >= threshold and then draws y_n from p_n; exact's test
            and residual emit a p_n-distributed token there too, so the generated text has the same law (each
            token from q where JS < threshold, from p elsewhere) and this form only keeps more drafts.
            threshold <= 0 is `exact`, token for token (same uniforms, same tokens). JS is measured between the
            tempered p_i and q_i (the authors' code measures it before temperature; the same at T = 1). T = 0:
            the limit (p, q one-hot: JS = 0 where the argmaxes agree, ln 2 where not), i.e. greedy verification
            that also accepts x_i where the draft's and the target's argmax agree (always, above ln 2).
            threshold: default 0.4, the authors' README example for js_div.

relaxed     Relaxed acceptance of TensorRT-LLM's MTP (use_relaxed_acceptance_for_thinking, relaxed_topk,
            relaxed_delta; mtpRelaxedAcceptanceKernel): with P_i = softmax(z_t,i) (no temperature: it is a
            greedy-decoding rule),

                accept x_i  iff  x_i is among the top_k tokens of z_t,i  and  P_i(x_i) >= max P_i - prob_delta

            (a probability gap, as TensorRT-LLM computes it: its candidates come from torch.softmax; the
            "logprobs" in its variable names are probabilities). Ranks break ties by token id, as argmax does;
            a token the target gives logit -inf is never accepted. y_n = argmax z_t,n, bonus included. top_k = 1
            (or prob_delta = 0, ties of the maximum aside) is `greedy`. Temperature is ignored and the draft
            proposes its argmax. Defaults top_k = 10, prob_delta = 0.6: TensorRT-LLM's DeepSeek-R1 setting.

accept_all  The floor: every draft token accepted (n = γ), the bonus y_γ ~ p_γ (argmax z_t,γ at T = 0). What the
            draft alone is worth; the paper's sigmoid preset (`sigmoid --preset paper`) behaves almost like it.

Deterministic drafts (``draft_logits=None``, the contract): each rule does what it does with one-hot draft logits
(q_i the point mass on x_i), computed without them.
  typical, relaxed, accept_all   never read the draft's distribution (only its logits at x_i, for ``draft_ok``):
            the same decisions and tokens as with any draft logits; ``draft_ok`` is True.
  fuzzy     JS(p_i, δ_x) depends on a = p_i(x_i) alone: with m = (p + δ_x) / 2, the entries v != x_i give (1 - a) ln 2,
            so JS = ln 2 + (a ln a - (1 + a) ln(1 + a)) / 2, decreasing from ln 2 (a = 0) to 0 (a = 1). A position is
            accepted outright where that is below the threshold (where p_i(x_i) is high enough), else with
            probability p_i(x_i) (exact's test with q(x) = 1), and the residual is p_n with x_n removed. At T = 0 the
            draft's argmax is x_i itself, so the limit rule is greedy verification (everything above ln 2).
"""

from __future__ import annotations

import math

import torch

from pipeline.errors import SamplerInputError
from pipeline.rules import RULES
from pipeline.samplers.contract import (
    SamplerResult,
    assemble_tokens,
    count_accepted,
    emit_uniform,
    is_full,
    sample_from_weights,
    uniforms,
    within_lengths,
)
from pipeline.samplers.torch_ref import (
    ExactSampler,
    Sampler,
    argmax_result,
    drafted_ok,
    finite_max_ok,
    greedy_verify,
    rejection_verify,
    rows_at,
    softmax_fp32,
)

LN2 = math.log(2.0)
# Medusa's and vLLM's guard inside the entropy's logarithm: H(p) = -sum p log(p + 1e-5).
TYPICAL_ENTROPY_EPS = 1e-5

_TYPICAL = RULES["typical"].defaults()
_FUZZY = RULES["fuzzy"].defaults()
_RELAXED = RULES["relaxed"].defaults()


def _drafted(draft_tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """logits [B, γ, V] at the drafted tokens -> [B, γ]."""
    return logits.gather(2, draft_tokens[..., None]).squeeze(2)


def _finite(value, what: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise SamplerInputError(f"{what} must be a finite number; got {value}")
    return value


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in nats, per row: p float32 [..., V_t], q float32 [..., V_d] with V_d <= V_t (q is 0
    past V_d) -> float32 [...], in [0, ln 2]. NaN where a row is NaN."""
    if q.shape[-1] < p.shape[-1]:
        q = torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1]))
    m = (0.5 * (p + q)).clamp_min(torch.finfo(torch.float32).tiny)  # m == 0 only where p == q == 0: terms are 0
    js = 0.5 * (torch.xlogy(p, p / m) + torch.xlogy(q, q / m)).sum(dim=-1)
    return js.clamp_min(0.0)


def js_to_point_mass(a: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in nats between a distribution p and the point mass on a token x, from a = p(x)
    (float32 [...], in [0, 1]) alone: ln 2 + (a ln a - (1 + a) ln(1 + a)) / 2 -> float32 [...] in [0, ln 2]. What
    :func:`js_divergence` gives for q one-hot at x (module docstring), without a vocabulary-sized tensor."""
    a = a.float()
    return (LN2 + 0.5 * (torch.xlogy(a, a) - torch.xlogy(1.0 + a, 1.0 + a))).clamp(0.0, LN2)


class TypicalSampler(Sampler):
    """Typical acceptance (Medusa; vLLM): accept x_i while p_i(x_i) > min(epsilon, delta * exp(-H(p_i))); at the
    first rejection emit the target's argmax, after a full block sample the bonus from the target. Lossy. See the
    module docstring for the exact definition and its sources."""

    name = "typical"

    def __init__(self, temperature: float = 1.0, epsilon: float = _TYPICAL["epsilon"],
                 delta: float = _TYPICAL["delta"]) -> None:
        super().__init__(temperature)
        epsilon, delta = float(epsilon), float(delta)
        if not 0.0 <= epsilon < 1.0:
            raise SamplerInputError(f"typical epsilon (posterior threshold) must be in [0, 1); got {epsilon}")
        if not 0.0 <= delta < float("inf"):
            raise SamplerInputError(f"typical delta (posterior alpha) must be a finite number >= 0; got {delta}")
        self.epsilon, self.delta = epsilon, delta

    @property
    def params(self) -> dict:
        return {"temperature": self.temperature, "epsilon": self.epsilon, "delta": self.delta}

    def _threshold(self, p: torch.Tensor) -> torch.Tensor:
        """min(ε, δ e^{-H(p)}) per position: p [..., V] -> [...]."""
        entropy = -(p * torch.log(p + TYPICAL_ENTROPY_EPS)).sum(dim=-1)
        return (self.delta * torch.exp(-entropy)).clamp_max(self.epsilon)

    def step_distribution(self, target_logits, draft_logits):
        p = softmax_fp32(target_logits, 1.0 / self.temperature)                 # [N, V_t]
        kept = self._proposal(draft_logits, p.shape[1]) * (p > self._threshold(p)[:, None])
        acceptance = kept.sum(dim=1)
        recovered = torch.nn.functional.one_hot(target_logits.argmax(dim=-1), p.shape[1]).float()
        return kept + (1.0 - acceptance)[:, None] * recovered, acceptance

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        if self.temperature == 0.0:
            return greedy_verify(draft_tokens, draft_logits, target_logits, lengths)
        B, gamma = draft_tokens.shape
        p = softmax_fp32(target_logits, 1.0 / self.temperature)                 # [B, γ+1, V_t]
        p_block = p[:, :gamma]
        threshold = self._threshold(p_block)                                    # [B, γ]
        accepted = count_accepted(within_lengths(_drafted(draft_tokens, p_block) > threshold, lengths))
        u = uniforms(B, gamma, draft_tokens.device, generator)
        last = p[:, gamma].contiguous() if lengths is None else rows_at(p, lengths)
        bonus = sample_from_weights(last, emit_uniform(u, lengths))
        recovered = rows_at(target_logits, accepted).argmax(dim=-1)
        next_token = torch.where(is_full(accepted, gamma, lengths), bonus, recovered)
        return SamplerResult(
            accepted=accepted,
            tokens=assemble_tokens(draft_tokens, accepted, next_token),
            draft_ok=drafted_ok(draft_tokens, draft_logits),
            target_ok=~p[:, :, 0].isnan().any(dim=1),  # a softmax row that saw NaN, +inf or only -inf is all NaN
        )


class FuzzySampler(Sampler):
    """Fuzzy speculative decoding (Holsman et al. 2025): accept x_i outright where JS(p_i, q_i) < threshold, else
    exact's rejection test and residual. threshold <= 0 is `exact` token for token. Lossy. See the module
    docstring for the exact definition and its sources."""

    name = "fuzzy"

    def __init__(self, temperature: float = 1.0, threshold: float = _FUZZY["threshold"]) -> None:
        super().__init__(temperature)
        self.threshold = _finite(threshold, "fuzzy threshold (a Jensen-Shannon divergence in nats)")

    @property
    def params(self) -> dict:
        return {"temperature": self.temperature, "threshold": self.threshold}

    @property
    def verifies_by_argmax(self) -> bool:
        # At T = 0 a draft that is the draft's own argmax is accepted iff it is the target's, up to threshold ln 2.
        return self.temperature == 0.0 and self.threshold <= LN2

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        if gamma == 0:  # nothing to accept: exact's draw from the target (or its argmax at T = 0)
            return ExactSampler(self.temperature).verify_checked(draft_tokens, draft_logits, target_logits, generator)
        if self.temperature == 0.0:
            return self._verify_limit(draft_tokens, draft_logits, target_logits, lengths)
        inv_t = 1.0 / self.temperature
        p = softmax_fp32(target_logits, inv_t)                                   # [B, γ+1, V_t]
        p_x = _drafted(draft_tokens, p[:, :gamma])                                # [B, γ]
        one = torch.ones_like(p_x)  # w_t = w_d = 1 at a close position: u * 1 < 1 always accepts
        u = uniforms(B, gamma, draft_tokens.device, generator)
        if draft_logits is None:    # a deterministic draft: q_i the point mass on x_i, JS from p_i(x_i) alone
            close = js_to_point_mass(p_x) < self.threshold
            accepted, next_token = rejection_verify(
                draft_tokens, torch.where(close, one, p_x), one, lambda n: rows_at(p, n), None, u, lengths)
            draft_ok = torch.ones(B, dtype=torch.bool, device=p.device)
        else:
            q = softmax_fp32(draft_logits, inv_t)                                # [B, γ, V_d]
            close = js_divergence(p[:, :gamma], q) < self.threshold              # [B, γ]
            q_x = _drafted(draft_tokens, q)
            accepted, next_token = rejection_verify(
                draft_tokens, torch.where(close, one, p_x), torch.where(close, one, q_x),
                lambda n: rows_at(p, n), lambda n: rows_at(q, n), u, lengths)
            draft_ok = ~q[:, :, 0].isnan().any(dim=1)
        return SamplerResult(
            accepted=accepted,
            tokens=assemble_tokens(draft_tokens, accepted, next_token),
            draft_ok=draft_ok,
            target_ok=~p[:, :, 0].isnan().any(dim=1),
        )

    def _verify_limit(self, draft_tokens, draft_logits, target_logits, lengths=None) -> SamplerResult:
        """T = 0: p and q are one-hot at their argmaxes, so JS is 0 where those agree and ln 2 where not. A
        deterministic draft's argmax is its token."""
        if self.threshold <= 0.0:
            return greedy_verify(draft_tokens, draft_logits, target_logits, lengths)
        gamma = draft_tokens.shape[1]
        target_max, target_argmax = target_logits.max(dim=-1)                   # [B, γ+1]
        if draft_logits is None:
            draft_ok, draft_argmax = torch.ones_like(target_max[:, 0], dtype=torch.bool), draft_tokens
        else:
            draft_max, draft_argmax = draft_logits.max(dim=-1)                   # [B, γ]
            draft_ok = finite_max_ok(draft_max)
        close = draft_argmax == target_argmax[:, :gamma]
        if self.threshold > LN2:
            close = torch.ones_like(close)
        accepted = count_accepted(within_lengths(close | (draft_tokens == target_argmax[:, :gamma]), lengths))
        next_token = target_argmax.gather(1, accepted[:, None]).squeeze(1)
        return SamplerResult(
            accepted=accepted,
            tokens=assemble_tokens(draft_tokens, accepted, next_token),
            draft_ok=draft_ok,
            target_ok=finite_max_ok(target_max),
        )


class RelaxedSampler(Sampler):
    """TensorRT-LLM's relaxed acceptance: accept x_i while it is among the target's top_k tokens and its probability
    is within prob_delta of the top one; then emit the target's argmax (bonus included). Deterministic, ignores
    temperature; top_k = 1 is `greedy`. Lossy. See the module docstring for the exact definition and its source."""

    name = "relaxed"

    def __init__(self, temperature: float = 0.0, top_k: int = _RELAXED["top_k"],
                 prob_delta: float = _RELAXED["prob_delta"]) -> None:
        super().__init__(temperature)
        k = float(top_k)
        if not (k >= 1 and k == int(k) and math.isfinite(k)):
            raise SamplerInputError(f"relaxed top_k must be an integer >= 1; got {top_k}")
        prob_delta = float(prob_delta)
        if not 0.0 <= prob_delta < float("inf"):
            raise SamplerInputError(f"relaxed prob_delta must be a finite number >= 0; got {prob_delta}")
        self.top_k, self.prob_delta = int(k), prob_delta

    @property
    def params(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "prob_delta": self.prob_delta}

    @property
    def draft_temperature(self) -> float:
        """Relaxed acceptance verifies against the target's top tokens: the draft proposes its own argmax."""
        return 0.0

    @property
    def verifies_by_argmax(self) -> bool:
        return self.top_k == 1

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        gamma = draft_tokens.shape[1]
        target_max, target_argmax = target_logits.max(dim=-1)                   # [B, γ+1]
        z = target_logits[:, :gamma]                                             # [B, γ, V_t]
        z_x = _drafted(draft_tokens, z)                                          # [B, γ]
        # rank of x among the target's tokens, ties broken by token id (as argmax breaks them)
        vocab = torch.arange(z.shape[-1], device=z.device)
        above = (z > z_x[..., None]) | ((z == z_x[..., None]) & (vocab < draft_tokens[..., None]))
        rank = above.sum(dim=-1)
        lse = torch.logsumexp(z.float(), dim=-1)
        gap = torch.exp(target_max[:, :gamma].float() - lse) - torch.exp(z_x.float() - lse)   # max P - P(x)
        accept = (rank < self.top_k) & (gap <= self.prob_delta) & (z_x > float("-inf"))
        return argmax_result(accept, draft_tokens, draft_logits, target_max, target_argmax, lengths)


class AcceptAllSampler(Sampler):
    """The floor: every draft token accepted; the bonus token sampled from the target at T (its argmax at T = 0).
    Reads only the target's last position (and the draft logits at the drafted tokens, for the flag). Lossy."""

    name = "accept_all"

    @property
    def verifies_by_argmax(self) -> bool:
        return False  # it accepts every draft token, the target's argmax or not

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        if lengths is None:
            accepted = torch.full((B,), gamma, dtype=torch.int64, device=draft_tokens.device)
            last = target_logits[:, gamma]                                       # [B, V_t]
        else:                                                                    # each row's own draft, whole
            accepted, last = lengths, rows_at(target_logits, lengths)
        if self.temperature == 0.0:
            row_max, next_token = last.max(dim=-1)
            target_ok = torch.isfinite(row_max)
        else:
            p = softmax_fp32(last, 1.0 / self.temperature).contiguous()
            u = uniforms(B, gamma, draft_tokens.device, generator)
            next_token = sample_from_weights(p, emit_uniform(u, lengths))
            target_ok = ~p[:, 0].isnan()
        return SamplerResult(
            accepted=accepted,
            tokens=assemble_tokens(draft_tokens, accepted, next_token),
            draft_ok=drafted_ok(draft_tokens, draft_logits),
            target_ok=target_ok,
        )
