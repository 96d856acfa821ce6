"""The torch reference samplers: what `exact`, `sigmoid` and `greedy` compute.

Every other backend (the CUDA kernels) is held to these by the same tests. Batched, CPU or CUDA, no host
sync inside a step. See :mod:`pipeline.samplers.contract` for the call signature and shapes.

The two stochastic samplers share one algorithm, :func:`rejection_verify`, and differ only in the weight
function w(z) that turns a logit into an (unnormalised) probability:

    exact    w(z) = softmax(z / T)                 (normalised over the vocabulary)
    sigmoid  w(z) = sigmoid(alpha * z / T + beta)  (element-wise; normalised only where a sample is drawn)

For draft token x_i at position i: accept with probability min(1, w_t(x_i) / w_d(x_i)), reject outright when
w_d(x_i) == 0. At the first rejection n draw the emitted token from norm(max(0, w_t[n] - w_d[n])); if all γ
are accepted draw the bonus token from norm(w_t[γ]). With softmax weights this is the modified rejection
sampling of Leviathan et al. (2023) / Chen et al. (2023): the emitted tokens follow the target exactly.

Deterministic drafts (``draft_logits=None``, see the contract): the draft's weights are the point mass on x_i, w_d = 1
at x_i and 0 elsewhere, which is what one-hot draft logits give through the softmax, computed without them: accept
x_i with probability min(1, w_t(x_i)) = p_i(x_i), and at the first rejection draw from max(0, w_t - onehot(x_n)),
i.e. the target row n with x_n removed (p_n(x_n) - 1 <= 0), renormalised. The weights are those of the one-hot-logits
path bit for bit (p - 0 = p, and p(x) - 1 clamps to 0), so given the same uniforms both paths emit the same tokens.
Why this is lossless: Leviathan et al.'s proof holds for any draft distribution, a point mass included; directly,
P(emit x) = p(x), and P(emit y != x) = (1 - p(x)) * p(y) / (1 - p(x)) = p(y). At T = 0 it is greedy verification.
``greedy`` never needed draft logits (it reads them only for the finiteness flag).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pipeline.errors import SamplerInputError
from pipeline.rules import RULES, Rule
from pipeline.samplers.contract import (
    RESIDUAL_ZERO_TOL,
    SamplerResult,
    assemble_tokens,
    clamp_lengths,
    count_accepted,
    emit_uniform,
    is_full,
    sample_from_weights,
    uniforms,
    validate_inputs,
    validate_lengths,
    within_lengths,
)


class Sampler:
    """Base class: validates inputs against the contract, then runs ``verify_checked``.

    Subclasses set ``name`` and ``backend`` and implement ``verify_checked(draft_tokens, draft_logits, target_logits,
    generator, lengths)`` with the contract's shapes; ``lengths`` (per-row draft lengths) arrives None or already
    clamped into [0, γ]; ``draft_logits`` arrives None for a deterministic draft only where the rule takes one at
    this temperature (``Rule.deterministic_drafts``; the call is refused in one line otherwise).
    """

    name = "?"
    backend = "torch"

    def __init__(self, temperature: float = 1.0) -> None:
        temperature = float(temperature)
        if not temperature >= 0.0:  # also catches NaN
            raise SamplerInputError(f"temperature must be >= 0 (0 means greedy verify); got {temperature}")
        self.temperature = temperature

    @property
    def params(self) -> dict:
        return {"temperature": self.temperature}

    @property
    def draft_temperature(self) -> float:
        """The temperature the draft should propose at: the one this rule's acceptance is computed for (0 means
        the draft proposes its argmax)."""
        return self.temperature

    @property
    def verifies_by_argmax(self) -> bool:
        """True when this rule accepts a draft token iff it is the target's argmax (temperature 0, or greedy)."""
        return self.temperature == 0.0

    @property
    def rule(self) -> Rule:
        """This sampler's registry entry (pipeline/rules.py)."""
        return RULES[self.name]

    @property
    def takes_deterministic_drafts(self) -> bool:
        """Whether a call with ``draft_logits=None`` (a deterministic draft) is verified at this temperature."""
        return self.rule.takes_deterministic_drafts(self.temperature)

    def __call__(self, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None, target_logits: torch.Tensor,
                 generator: torch.Generator | None = None, lengths: torch.Tensor | None = None) -> SamplerResult:
        validate_inputs(draft_tokens, draft_logits, target_logits)
        validate_lengths(lengths, draft_tokens)
        if draft_logits is None:
            check_deterministic(self)
        return self.verify_checked(draft_tokens, draft_logits, target_logits, generator,
                                   clamp_lengths(lengths, draft_tokens.shape[1]))

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths) -> SamplerResult:
        """The rule itself, on inputs the contract has checked (``__call__``): what each subclass implements, and
        what another rule calls to fall back on this one (e.g. exact's draw at γ = 0)."""
        raise NotImplementedError

    def step_distribution(self, target_logits: torch.Tensor,
                          draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """In closed form, what this rule emits at one drafted position at T > 0, the draft token drawn from
        softmax(draft_logits / T): target_logits float [N, V_t], draft_logits float [N, V_d] (V_d <= V_t) ->
        (float32 [N, V_t]: the distribution of the emitted token; float32 [N]: the probability that the draft token
        is accepted). A lossless rule's distribution is softmax(target_logits / T). How far a lossy rule's is from it
        is its distortion (pipeline/benchmarks/distortion.py). Rules without a closed form here raise
        NotImplementedError."""
        raise NotImplementedError(f"{self.name} has no closed-form step distribution")

    def bonus_distribution(self, target_logits: torch.Tensor) -> torch.Tensor:
        """What this rule emits after a fully accepted block at T > 0: target_logits float [N, V_t] -> float32
        [N, V_t] (the target's softmax at T unless the rule says otherwise)."""
        return softmax_fp32(target_logits, 1.0 / self.temperature)

    def _proposal(self, draft_logits: torch.Tensor, size: int) -> torch.Tensor:
        """The draft's proposal distribution softmax(z_d / T), float32 [N, size] (zero past the draft's vocabulary)."""
        return pad_vocabulary(softmax_fp32(draft_logits, 1.0 / self.temperature), size, 0.0)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}(backend={self.backend!r}, {args})"


def check_deterministic(sampler) -> None:
    """Refuse a deterministic draft (draft_logits=None) in one line where ``sampler``'s rule does not take one at its
    temperature (pipeline/rules.py says which). Metadata only."""
    error = RULES[sampler.name].deterministic_draft_error(sampler.temperature)
    if error is not None:
        raise SamplerInputError(error)


def finite_max_ok(max_values: torch.Tensor) -> torch.Tensor:
    """bool [B]: True where every per-position maximum is finite (NaN, +inf and all -inf rows are not)."""
    return torch.isfinite(max_values).all(dim=1)


def _no_nan_or_posinf(values: torch.Tensor) -> torch.Tensor:
    """bool [B] for values [B, k]: -inf is a legitimate zero probability; NaN and +inf are not."""
    return ~(values.isnan() | values.isposinf()).any(dim=1)


def drafted_ok(draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None) -> torch.Tensor:
    """bool [B]: no NaN/+inf among the draft logits [B, γ, V_d] at the drafted tokens [B, γ] (-inf is a legitimate
    zero probability); all True for a deterministic draft (draft_logits None: there are no logits)."""
    if draft_logits is None:
        return torch.ones(draft_tokens.shape[0], dtype=torch.bool, device=draft_tokens.device)
    return _no_nan_or_posinf(draft_logits.gather(2, draft_tokens[..., None]).squeeze(2))


def greedy_verify(draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
                  target_logits: torch.Tensor, lengths: torch.Tensor | None = None) -> SamplerResult:
    """Accept while the draft token equals argmax of the target (within each row's draft length, lengths int64 [B]
    or None), then emit the target's argmax.

    Reads the whole target tensor (one max pass) and the draft logits only at the drafted tokens (not at all for a
    deterministic draft, draft_logits None).
    """
    gamma = draft_tokens.shape[1]
    target_max, target_argmax = target_logits.max(dim=-1)                  # [B, γ+1]
    if gamma == 0:  # autoregressive decoding: the target's argmax, nothing to accept
        ok = finite_max_ok(target_max)
        return SamplerResult(accepted=torch.zeros_like(target_argmax[:, 0]), tokens=target_argmax,
                             draft_ok=torch.ones_like(ok), target_ok=ok)
    return argmax_result(draft_tokens == target_argmax[:, :gamma], draft_tokens, draft_logits, target_max,
                         target_argmax, lengths)


def argmax_result(accept: torch.Tensor, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
                  target_max: torch.Tensor, target_argmax: torch.Tensor,
                  lengths: torch.Tensor | None) -> SamplerResult:
    """The result of a rule that accepts the drafted prefix where ``accept`` bool [B, γ] holds (within each row's
    length) and then emits the target's argmax: target_max and target_argmax [B, γ+1] are the target logits' max."""
    accepted = count_accepted(within_lengths(accept, lengths))
    next_token = target_argmax.gather(1, accepted[:, None]).squeeze(1)
    return SamplerResult(
        accepted=accepted,
        tokens=assemble_tokens(draft_tokens, accepted, next_token),
        draft_ok=drafted_ok(draft_tokens, draft_logits),
        target_ok=finite_max_ok(target_max),
    )


def rejection_verify(
    draft_tokens: torch.Tensor,
    target_point: torch.Tensor,
    draft_point: torch.Tensor,
    target_row: Callable[[torch.Tensor], torch.Tensor],
    draft_row: Callable[[torch.Tensor], torch.Tensor] | None,
    u: torch.Tensor,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Modified rejection sampling over arbitrary non-negative weights.

    draft_tokens  int64   [B, γ]
    target_point  float32 [B, γ]   w_t(x_i) at the drafted tokens
    draft_point   float32 [B, γ]   w_d(x_i) at the drafted tokens (1 for a deterministic draft)
    target_row    n int64 [B] -> float32 [B, V_t]   w_t over the vocabulary at position n[b] (n in 0..γ)
    draft_row     n int64 [B] -> float32 [B, V_d]   w_d over the vocabulary at position n[b] (n in 0..γ-1);
                  None: a deterministic draft, w_d the point mass on x_n (the residual is w_t with x_n removed)
    u             float32 [B, γ+1] uniforms (see contract.uniforms)
    lengths       int64 [B] per-row draft lengths in 0..γ, or None (all γ): see the contract
    returns       (accepted int64 [B], next_token int64 [B])
    """
    gamma = draft_tokens.shape[1]
    # u < w_t/w_d without dividing; w_d == 0 (underflow, masked token) always rejects.
    accept = (draft_point > 0) & (u[:, :gamma] * draft_point < target_point)
    accepted = count_accepted(within_lengths(accept, lengths))
    weights = target_row(accepted)                                           # [B, V_t]
    if gamma > 0:
        at = accepted.clamp_max(gamma - 1)
        if draft_row is None:   # max(0, w_t - onehot(x_n)): x_n removed, exactly what one-hot logits give
            residual = weights.scatter(1, draft_tokens.gather(1, at[:, None]), 0.0)
        else:
            residual = weights.clone()
            d_row = draft_row(at)                                            # [B, V_d]
            residual[:, : d_row.shape[1]] -= d_row
            residual.clamp_min_(0.0)
        # Use the residual where a draft token was rejected and the residual is more than rounding noise.
        use_residual = ~is_full(accepted, gamma, lengths) & (
            residual.sum(dim=1) > RESIDUAL_ZERO_TOL * weights.sum(dim=1))
        weights = torch.where(use_residual[:, None], residual, weights)
    return accepted, sample_from_weights(weights, emit_uniform(u, lengths))


def rejection_distribution(proposal: torch.Tensor, target_w: torch.Tensor,
                           draft_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`rejection_verify` emits at one drafted position, in closed form (no draw).

    proposal  float32 [N, V]  the distribution the draft token was drawn from (zero past the draft's vocabulary)
    target_w  float32 [N, V]  w_t over the vocabulary
    draft_w   float32 [N, V]  w_d over the vocabulary (zero past the draft's vocabulary)
    returns   (float32 [N, V]: P(emit x) = q(x) min(1, w_t(x) / w_d(x)) + (1 - a) r(x), with r the residual
              norm(max(0, w_t - w_d)), or norm(w_t) where the residual is rounding noise, as rejection_verify draws;
              float32 [N]: a, the probability that the draft token is accepted)
    """
    ratio = torch.where(draft_w > 0, target_w / draft_w.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    kept = proposal * ratio.clamp_max(1.0)                                  # [N, V]
    acceptance = kept.sum(dim=1)
    residual = (target_w - draft_w).clamp_min(0.0)
    use_residual = residual.sum(dim=1) > RESIDUAL_ZERO_TOL * target_w.sum(dim=1)
    rest = torch.where(use_residual[:, None], residual, target_w)
    rest = rest / rest.sum(dim=1, keepdim=True)
    return kept + (1.0 - acceptance)[:, None] * rest, acceptance


def pad_vocabulary(rows: torch.Tensor, size: int, value: float) -> torch.Tensor:
    """rows [N, V_d] -> [N, size] filled with ``value`` past V_d (a draft's vocabulary inside the target's)."""
    if rows.shape[1] == size:
        return rows
    return torch.nn.functional.pad(rows, (0, size - rows.shape[1]), value=value)


def rows_at(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """logits [B, P, V], positions int64 [B] -> logits[b, positions[b]] as [B, V] (a copy)."""
    return logits[torch.arange(logits.shape[0], device=logits.device), positions]


class ExactSampler(Sampler):
    """Modified rejection sampling: the emitted tokens are distributed exactly as the target's samples.

    Cost: one fused softmax over each logit tensor (the normalisers are unavoidable for exact ratios), one
    residual row per batch row, and a two-level inverse-CDF draw. ``temperature=0`` verifies greedily.
    A deterministic draft (``draft_logits=None``) skips the draft's softmax: accept x with probability p(x), the
    residual is p with x removed (module docstring).
    """

    name = "exact"

    def step_distribution(self, target_logits, draft_logits):
        q = self._proposal(draft_logits, target_logits.shape[1])
        return rejection_distribution(q, softmax_fp32(target_logits, 1.0 / self.temperature), q)

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        if self.temperature == 0.0:
            return greedy_verify(draft_tokens, draft_logits, target_logits, lengths)
        B, gamma = draft_tokens.shape
        inv_t = 1.0 / self.temperature
        p = softmax_fp32(target_logits, inv_t)                               # [B, γ+1, V_t]
        if gamma == 0:  # autoregressive decoding: a plain draw from the target
            next_token = sample_from_weights(p[:, 0], uniforms(B, 0, draft_tokens.device, generator)[:, 0])
            ok = torch.ones(B, dtype=torch.bool, device=p.device)
            return SamplerResult(accepted=torch.zeros(B, dtype=torch.int64, device=p.device),
                                 tokens=next_token[:, None], draft_ok=ok, target_ok=~p[:, 0, 0].isnan())
        idx = draft_tokens[..., None]
        p_x = p[:, :gamma].gather(2, idx).squeeze(2)
        u = uniforms(B, gamma, draft_tokens.device, generator)
        if draft_logits is None:  # a deterministic draft: q is the point mass on x (q(x) = 1, no [B, γ, V] tensor)
            accepted, next_token = rejection_verify(
                draft_tokens, p_x, torch.ones_like(p_x), lambda n: rows_at(p, n), None, u, lengths)
            draft_ok = torch.ones(B, dtype=torch.bool, device=p.device)
        else:
            q = softmax_fp32(draft_logits, inv_t)                            # [B, γ, V_d]
            q_x = q.gather(2, idx).squeeze(2)
            accepted, next_token = rejection_verify(
                draft_tokens, p_x, q_x, lambda n: rows_at(p, n), lambda n: rows_at(q, n), u, lengths)
            draft_ok = ~q[:, :, 0].isnan().any(dim=1)
        # A softmax row that saw NaN, +inf, or only -inf is NaN in every entry: one entry per row tells.
        return SamplerResult(
            accepted=accepted,
            tokens=assemble_tokens(draft_tokens, accepted, next_token),
            draft_ok=draft_ok,
            target_ok=~p[:, :, 0].isnan().any(dim=1),
        )


def softmax_fp32(logits: torch.Tensor, inv_t: float) -> torch.Tensor:
    """softmax(logits [..., V] * inv_t) in float32 [..., V] (the scaling skipped at inv_t 1)."""
    if inv_t != 1.0:
        logits = logits.float() * inv_t
    return torch.softmax(logits, dim=-1, dtype=torch.float32)


class SigmoidSampler(Sampler):
    """The paper's approximation: softmax replaced by w(z) = sigmoid(alpha * z / T + beta).

    NOT distribution-preserving: outputs do not follow the target's distribution. The acceptance ratio uses
    the unnormalised weights w_t(x)/w_d(x), and the residual and bonus rows are normalised only where a token
    is drawn, so no full-vocabulary reduction is needed for positions that are accepted. That is where the
    speed comes from: only the γ drafted logits and one vocabulary row per batch row are read.

    Parameters (the paper writes sigmoid((z - a) / b); here alpha = 1/b, beta = -a/b):
      alpha > 0  scale of the tempered logit. Default 1.
      beta       shift. Default -20: for alpha*z/T below ~-5, sigmoid(x) ~= exp(x), so the normalised rows (residual,
                 bonus) match softmax's at temperature T/alpha; logits that push alpha*z/T + beta towards 0 or
                 above saturate at 1, flattening the top of the distribution.

    Even as beta -> -inf (and alpha = 1) the sampler is not exact: the acceptance ratio w_t(x)/w_d(x) tends to
    exp((z_t(x) - z_d(x))/T), while exact's p(x)/q(x) carries the normalisers' ratio Z_d/Z_t besides, which the
    element-wise weights never see. Only logits whose log-partition functions agree (log-probabilities, say) make it
    exact in that limit; two models' raw logits generally do not. How far a pair's sampler is from the target's
    distribution, per token: ``step_distribution`` and `specsweep bench distortion`.

    ``SigmoidSampler.paper(...)`` reproduces the constants of the paper's released kernels,
    sigmoid((z + 1e4) / 2e4), i.e. alpha = 5e-5, beta = 0.5. With logits of ordinary size (|z| < 100) every
    weight is within 0.001 of sigmoid(0.5) = 0.62: the ratio w_t/w_d is ~1, so nearly every draft token is
    accepted whatever the target thinks, and residual/bonus draws are close to uniform over the vocabulary.

    Deterministic drafts (``draft_logits=None``) are refused at T > 0 (pipeline/rules.py): the ratio w_t/w_d compares
    two unnormalised sigmoids of logits, and a draft without logits has no w_d to compare (a point-mass reading,
    w_d(x) = 1, would compare an unnormalised sigmoid with a probability and reject nearly everything at beta = -20).
    At T = 0 it verifies greedily, which needs none.
    """

    name = "sigmoid"
    PAPER_ALPHA = RULES["sigmoid"].presets["paper"]["alpha"]
    PAPER_BETA = RULES["sigmoid"].presets["paper"]["beta"]

    def __init__(self, temperature: float = 1.0, alpha: float = RULES["sigmoid"].defaults()["alpha"],
                 beta: float = RULES["sigmoid"].defaults()["beta"]) -> None:
        super().__init__(temperature)
        alpha, beta = float(alpha), float(beta)
        if not alpha > 0.0 or alpha == float("inf"):
            raise SamplerInputError(f"sigmoid alpha must be a finite number > 0; got {alpha}")
        if beta != beta or abs(beta) == float("inf"):
            raise SamplerInputError(f"sigmoid beta must be finite; got {beta}")
        self.alpha, self.beta = alpha, beta

    @classmethod
    def paper(cls, temperature: float = 1.0) -> SigmoidSampler:
        """The paper's released-kernel constants: sigmoid((z + 1e4) / 2e4). Accepts nearly every draft token."""
        return cls(temperature=temperature, alpha=cls.PAPER_ALPHA, beta=cls.PAPER_BETA)

    @property
    def params(self) -> dict:
        return {"temperature": self.temperature, "alpha": self.alpha, "beta": self.beta}

    def _weights(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits.float() * (self.alpha / self.temperature) + self.beta)

    def step_distribution(self, target_logits, draft_logits):
        size = target_logits.shape[1]
        return rejection_distribution(self._proposal(draft_logits, size), self._weights(target_logits),
                                      pad_vocabulary(self._weights(draft_logits), size, 0.0))

    def bonus_distribution(self, target_logits):
        weights = self._weights(target_logits)
        return weights / weights.sum(dim=1, keepdim=True)

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        if self.temperature == 0.0:
            return greedy_verify(draft_tokens, draft_logits, target_logits, lengths)
        B, gamma = draft_tokens.shape
        idx = draft_tokens[..., None]
        z_t = target_logits[:, :gamma].gather(2, idx).squeeze(2)               # [B, γ]
        z_d = draft_logits.gather(2, idx).squeeze(2)
        u = uniforms(B, gamma, draft_tokens.device, generator)

        row_max = {}

        def target_row(n):
            z = rows_at(target_logits, n)
            row_max["target"] = z.amax(dim=1)
            return self._weights(z)

        def draft_row(n):
            z = rows_at(draft_logits, n)
            row_max["draft"] = z.amax(dim=1)
            return self._weights(z)

        accepted, next_token = rejection_verify(
            draft_tokens, self._weights(z_t), self._weights(z_d), target_row, draft_row, u, lengths)
        # Everything this step read: the drafted logits and the drawn rows. A drafted target logit of -inf is
        # a legitimate zero; NaN and +inf are not, nor is a drawn row whose maximum is not finite.
        target_ok = _no_nan_or_posinf(z_t) & torch.isfinite(row_max["target"])
        draft_ok = _no_nan_or_posinf(z_d)
        if "draft" in row_max:
            draft_ok &= torch.isfinite(row_max["draft"])
        return SamplerResult(
            accepted=accepted,
            tokens=assemble_tokens(draft_tokens, accepted, next_token),
            draft_ok=draft_ok,
            target_ok=target_ok,
        )


class GreedySampler(Sampler):
    """Accept while the draft token equals the target's argmax; then emit the target's argmax.

    Deterministic; ignores temperature and the draft's probabilities. Equivalent to `exact` at T = 0. Takes a
    deterministic draft (``draft_logits=None``) as it is: it reads draft logits only for the finiteness flag.
    """

    name = "greedy"

    def __init__(self, temperature: float = 0.0) -> None:
        super().__init__(temperature)

    @property
    def draft_temperature(self) -> float:
        """Greedy verification accepts only the target's argmax, so the draft proposes its own argmax."""
        return 0.0

    @property
    def verifies_by_argmax(self) -> bool:
        return True

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        return greedy_verify(draft_tokens, draft_logits, target_logits, lengths)
