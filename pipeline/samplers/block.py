"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025,
arXiv 2403.10444): the γ draft tokens are verified jointly instead of one by one. Lossless, and never accepts
fewer tokens in expectation than token-wise verification (`exact`); the gain grows with γ.

With p(· | X^i) the target's and q(· | X^i) the draft's tempered softmax after the prefix X^i of the draft
block X_1..X_γ (q zero-padded to the target's vocabulary) and η_1..η_γ the step's acceptance uniforms::

    p_0 = 1
    p_i = min(1, p_{i-1} · p(X_i | X^{i-1}) / q(X_i | X^{i-1}))          i = 1..γ  (0 where q(X_i | ·) = 0)
    h_i = S_i / (S_i + 1 - p_i),  S_i = Σ_x max(p_i · p(x | X^i) - q(x | X^i), 0)      i = 1..γ-1
    h_γ = p_γ
    τ   = the LAST i with η_i < h_i (0 if none): X_1..X_τ are accepted, even where an earlier η_j failed
    Y   ~ p(· | X^γ)                                       if τ = γ  (the bonus token)
    Y   ~ norm(max(p_τ · p(· | X^τ) - q(· | X^τ), 0))      if τ < γ  (p_0 = 1: the usual residual at τ = 0)

p_i is the probability that the prefix X^i "survives" (could still be part of a sample of the target), h_i the
probability of stopping at i given the prefix got there, and the residual at τ adds exactly the mass the
joint test took away, so X^τ, Y followed by target samples is distributed as the target (Theorem 1 of the
paper). A residual whose mass is rounding noise (p_τ · p = q up to fp32 error) is replaced by the target row,
as in :func:`pipeline.samplers.torch_ref.rejection_verify`; where S_i + 1 - p_i = 0 (then p = q after X^i)
h_i = 1, which the proof allows (any value is exact there).

At γ = 1 this is token-wise verification. At temperature 0 it verifies greedily and at γ = 0 it draws from
the target, both exactly as `exact` does (it delegates to :class:`ExactSampler`).

Shapes (see :mod:`pipeline.samplers.contract`): draft_tokens int64 [B, γ], draft_logits [B, γ, V_d],
target_logits [B, γ+1, V_t], V_d <= V_t; arithmetic in fp32; one ``torch.rand((B, γ+1))`` per step (columns
0..γ-1 are η_1..η_γ, column γ draws Y); no host sync (a Python loop over the γ positions, no branch on tensor
values). Cost over `exact`: the survival products and one [B, γ-1, V_t] pass for S_1..S_{γ-1}.

Per-row draft lengths g_b (the contract's ``lengths``): row b is verified as the block X_1..X_{g_b} alone, so
h_{g_b} = p_{g_b}, h_i = 0 past g_b (those positions never pass), Y is the bonus where τ = g_b, and column g_b of the
uniforms draws Y.

Deterministic drafts (``draft_logits=None``; the contract): q(· | X^{i-1}) is the point mass on the proposed x_i.
With a_i = p(x_i | x^{i-1}), put into the formulas above:

    p_i = min(1, p_{i-1} · a_i / 1) = a_1 ··· a_i = P_i     (the target's probability of the prefix x^i; P_0 = 1)
    S_i = Σ_x max(P_i · p(x | x^i) - 1[x = x_{i+1}], 0) = P_i (1 - a_{i+1})      (P_i a_{i+1} <= 1 clamps to 0)
    h_i = P_i (1 - a_{i+1}) / (P_i (1 - a_{i+1}) + 1 - P_i) = (P_i - P_{i+1}) / (1 - P_{i+1})     i = 1..γ-1
    h_γ = P_γ
    Y   ~ norm(max(P_τ · p(· | x^τ) - 1[· = x_{τ+1}], 0)) = p(· | x^τ) with x_{τ+1} removed, renormalised    (τ < γ)

so no [B, γ, V] tensor is needed: the P_i and h_i come from the γ drafted probabilities, and the residual is the
target row with one entry zeroed (as `exact`'s deterministic residual; the rounding-noise test compares its mass with
the target row's, the P_τ factor cancelling). h_i = 1 where P_{i+1} = 1, as above.

Lossless, directly (Theorem 1 of the paper covers any q, a point mass included; this is the special case in full).
With h_0 := 1 and 1 - h_i = (1 - P_i) / (1 - P_{i+1}) for 1 <= i < γ, the product over i = k+1..γ-1 telescopes to
(1 - P_{k+1}) / (1 - P_γ), and with 1 - h_γ = 1 - P_γ:

    P(τ = k) = h_k · Π_{i=k+1..γ} (1 - h_i) = h_k (1 - P_{k+1}) = P_k - P_{k+1} = P_k (1 - a_{k+1})     k < γ
    P(τ = γ) = h_γ = P_γ

and given τ = k < γ, Y ~ p(· | x^k) without x_{k+1}. So the step emits x^k followed by y != x_{k+1} with probability
P_k (1 - a_{k+1}) · p(y | x^k) / (1 - a_{k+1}) = P_k p(y | x^k), and x^γ followed by y with P_γ p(y | x^γ): exactly the
target's probabilities of those sequences, which partition the target's outcomes by where its sample first departs
from x (or that it does not within γ). Continued with target samples, the output is the target's law.

Also: P(τ >= k) = P_k, token-wise `exact`'s law of its accepted count, and the most any lossless rule can accept (it
may keep x^k only where the target's own sample starts with x^k). So with a deterministic draft block verification
accepts no more than `exact` in expectation; it stays lossless, at the cost of its O(B γ) extra arithmetic only.
"""

from __future__ import annotations

import torch

from pipeline.samplers.contract import (
    RESIDUAL_ZERO_TOL,
    SamplerResult,
    assemble_tokens,
    emit_uniform,
    is_full,
    sample_from_weights,
    uniforms,
)
from pipeline.samplers.torch_ref import ExactSampler, Sampler, rows_at, softmax_fp32


def survival_probs(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """float32 [B, γ]: p_1..p_γ from the target's and draft's probabilities of the drafted tokens, p_x and q_x
    [B, γ]. A token the draft gave probability 0 ends survival (p_i = 0), as `exact` rejects it outright."""
    surv = []
    prev = torch.ones_like(p_x[:, 0])
    for i in range(p_x.shape[1]):
        # (prev * p) / q, not prev * (p / q): a q that underflows must not make 0 * inf = NaN
        prev = torch.where(q_x[:, i] > 0, prev * p_x[:, i] / q_x[:, i], 0.0).clamp_max(1.0)
        surv.append(prev)
    return torch.stack(surv, dim=1)


def stop_probs(p: torch.Tensor, q: torch.Tensor, surv: torch.Tensor) -> torch.Tensor:
    """float32 [B, γ]: h_1..h_γ. p [B, γ+1, V_t] and q [B, γ, V_d] the tempered softmaxes, surv [B, γ] the
    survival probabilities p_1..p_γ."""
    gamma = q.shape[1]
    if gamma == 1:
        return surv
    # S_i over positions 1..γ-1: the mass of p_i · p(· | X^i) above q(· | X^i); q is 0 past V_d
    excess = p[:, 1:gamma] * surv[:, : gamma - 1, None]                          # [B, γ-1, V_t]
    excess[..., : q.shape[2]] -= q[:, 1:gamma]
    s = excess.clamp_min_(0.0).sum(dim=-1)                                       # [B, γ-1]
    denom = s + (1.0 - surv[:, : gamma - 1])
    h = torch.where(denom > 0, s / denom, 1.0)
    return torch.cat([h, surv[:, gamma - 1:]], dim=1)


def cut_at_lengths(h: torch.Tensor, surv: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """float32 [B, γ]: h_1..h_γ of each row's own block X_1..X_{g_b} (lengths int64 [B], or None: all γ): h_{g_b} is
    that block's last stop probability p_{g_b}, and the positions past it never pass (0)."""
    if lengths is None:
        return h
    pos = torch.arange(1, h.shape[1] + 1, device=h.device)
    return torch.where(pos == lengths[:, None], surv, torch.where(pos > lengths[:, None], 0.0, h))


def last_passing(h: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """int64 [B]: τ, the last position i (1-based) with u[:, i-1] < h[:, i-1]; 0 where none passes.
    h [B, γ], u [B, γ+1] (only the first γ columns are read)."""
    gamma = h.shape[1]
    pos = torch.arange(1, gamma + 1, device=h.device)
    return torch.where(u[:, :gamma] < h, pos, 0).amax(dim=1)


def residual_draw(p: torch.Tensor, q: torch.Tensor, surv: torch.Tensor, tau: torch.Tensor,
                  u: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [B]: Y, drawn with uniforms u [B] from norm(max(p_τ · p(· | X^τ) - q(· | X^τ), 0)) where τ < γ
    (the target row where that residual is rounding noise) and from p(· | X^γ) where τ = γ (γ: each row's own
    length where ``lengths`` int64 [B] is given).
    p [B, γ+1, V_t], q [B, γ, V_d], surv [B, γ] (p_1..p_γ), tau int64 [B]."""
    gamma = q.shape[1]
    weights = rows_at(p, tau)                                                      # [B, V_t]
    p_tau = torch.nn.functional.pad(surv, (1, 0), value=1.0).gather(1, tau[:, None])   # [B, 1], p_0 = 1
    residual = weights * p_tau
    residual[:, : q.shape[2]] -= rows_at(q, tau.clamp_max(gamma - 1))
    residual.clamp_min_(0.0)
    use_residual = ~is_full(tau, gamma, lengths) & (residual.sum(dim=1) > RESIDUAL_ZERO_TOL * weights.sum(dim=1))
    return sample_from_weights(torch.where(use_residual[:, None], residual, weights), u)


def deterministic_stop_probs(a: torch.Tensor, surv: torch.Tensor) -> torch.Tensor:
    """float32 [B, γ]: h_1..h_γ for a deterministic draft (q the point mass on each x_i), from a [B, γ] the target's
    probabilities of the drafted tokens and surv [B, γ] = P_1..P_γ: h_i = P_i (1 - a_{i+1}) / (P_i (1 - a_{i+1}) +
    1 - P_i), h_γ = P_γ (module docstring)."""
    gamma = a.shape[1]
    if gamma == 1:
        return surv
    s = surv[:, : gamma - 1] * (1.0 - a[:, 1:])                                     # S_1..S_{γ-1}
    denom = s + (1.0 - surv[:, : gamma - 1])
    h = torch.where(denom > 0, s / denom, 1.0)
    return torch.cat([h, surv[:, gamma - 1:]], dim=1)


def deterministic_residual_draw(draft_tokens: torch.Tensor, p: torch.Tensor, tau: torch.Tensor, u: torch.Tensor,
                                lengths: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [B]: Y for a deterministic draft, drawn with uniforms u [B]: from p(· | x^τ) with x_{τ+1} removed where
    τ < γ (the target row where that residual is rounding noise) and from p(· | x^γ) where τ = γ (each row's own
    length with ``lengths``). draft_tokens int64 [B, γ], p [B, γ+1, V_t], tau int64 [B]."""
    gamma = draft_tokens.shape[1]
    weights = rows_at(p, tau)                                                      # [B, V_t]
    x_next = draft_tokens.gather(1, tau.clamp_max(gamma - 1)[:, None])           # [B, 1]
    residual = weights.scatter(1, x_next, 0.0)
    use_residual = ~is_full(tau, gamma, lengths) & (residual.sum(dim=1) > RESIDUAL_ZERO_TOL * weights.sum(dim=1))
    return sample_from_weights(torch.where(use_residual[:, None], residual, weights), u)


def block_verify_deterministic(draft_tokens: torch.Tensor, p: torch.Tensor, u: torch.Tensor,
                               lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification of a deterministic draft (module docstring). draft_tokens int64 [B, γ] (γ >= 1), p float32
    [B, γ+1, V_t], u float32 [B, γ+1], lengths int64 [B] or None. Returns (accepted τ int64 [B], next token Y int64
    [B]). Reads p at the drafted tokens and one row per batch row; builds nothing of shape [B, γ, V]."""
    a = p[:, : draft_tokens.shape[1]].gather(2, draft_tokens[..., None]).squeeze(2)   # [B, γ]
    surv = survival_probs(a, torch.ones_like(a))                                      # P_1..P_γ
    tau = last_passing(cut_at_lengths(deterministic_stop_probs(a, surv), surv, lengths), u)
    return tau, deterministic_residual_draw(draft_tokens, p, tau, emit_uniform(u, lengths), lengths)


def block_verify(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                 u: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification on probabilities. draft_tokens int64 [B, γ] (γ >= 1), p float32 [B, γ+1, V_t],
    q float32 [B, γ, V_d], u float32 [B, γ+1], lengths int64 [B] or None (per-row draft lengths). Returns
    (accepted τ int64 [B], next token Y int64 [B])."""
    idx = draft_tokens[..., None]
    surv = survival_probs(p[:, : draft_tokens.shape[1]].gather(2, idx).squeeze(2), q.gather(2, idx).squeeze(2))
    tau = last_passing(cut_at_lengths(stop_probs(p, q, surv), surv, lengths), u)
    return tau, residual_draw(p, q, surv, tau, emit_uniform(u, lengths), lengths)


class BlockSampler(Sampler):
    """Block verification: lossless, accepts at least as many draft tokens as `exact` in expectation.

    Cost over `exact`: one more pass over [B, γ-1, V_t] (the S_i). ``temperature=0`` verifies greedily.
    A deterministic draft (``draft_logits=None``): the closed forms of the module docstring, O(B γ) over `exact`.
    """

    name = "block"

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        B, gamma = draft_tokens.shape
        if self.temperature == 0.0 or gamma == 0:  # greedy verify, or a plain draw from the target
            return ExactSampler(self.temperature).verify_checked(draft_tokens, draft_logits, target_logits, generator,
                                                                 lengths)
        inv_t = 1.0 / self.temperature
        p = softmax_fp32(target_logits, inv_t)                                   # [B, γ+1, V_t]
        u = uniforms(B, gamma, draft_tokens.device, generator)
        if draft_logits is None:                                                  # a deterministic draft
            accepted, next_token = block_verify_deterministic(draft_tokens, p, u, lengths)
            draft_ok = torch.ones(B, dtype=torch.bool, device=p.device)
        else:
            q = softmax_fp32(draft_logits, inv_t)                                # [B, γ, V_d]
            accepted, next_token = block_verify(draft_tokens, p, q, u, lengths)
            draft_ok = ~q[:, :, 0].isnan().any(dim=1)
        # as in `exact`: a softmax row that saw NaN, +inf or only -inf is NaN in every entry
        return SamplerResult(
            accepted=accepted,
            tokens=assemble_tokens(draft_tokens, accepted, next_token),
            draft_ok=draft_ok,
            target_ok=~p[:, :, 0].isnan().any(dim=1),
        )
