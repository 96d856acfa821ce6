"""The divergences a draft minimises against its target's next-token law (DistillSpec, Zhou et al. 2023), on the
target's top k tokens.

The target's law is kept as its k most probable tokens (:mod:`pipeline.distill.teacher`). Both laws are compared
after coarse-graining to the same bins: each of those k tokens that the draft can propose is a bin, and everything
else (the target's tail, and top tokens outside a reduced draft vocabulary) is one "other" bin. Every divergence
here is an f-divergence, so by the data-processing inequality the coarse value is a lower bound of the full one,
tight where the top k carry nearly all of the target's mass (and it stays finite for forward KL when the draft
cannot propose a token the target likes).

  fkl  forward KL, KL(p || q): mass-covering; what distillation usually minimises
  rkl  reverse KL, KL(q || p): mode-seeking
  tv   total variation, ½ Σ |p - q| = 1 - Σ min(p, q): one minus the probability that the verify step accepts a
       token drawn from q (Leviathan et al.), i.e. exactly what acceptance rewards at T = 1

    loss = divergence("tv", draft_logits, top_ids, top_logp, t2d)          # float32 [N], one value per position
"""

from __future__ import annotations

import torch

EPS = 1e-8


def binned(draft_logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor, t2d: torch.Tensor):
    """The two laws on the bins (see the module docstring).

    draft_logits  float [N, K_d]: the draft's logits over its own vocabulary (K_d rows)
    top_ids       int64 [N, k]: the target's k most probable tokens (target ids)
    top_logp      float32 [N, k]: their log-probabilities
    t2d           int64 [V_t]: each target id's row in the draft's vocabulary, -1 where it has none
    -> (p float32 [N, k + 1], q float32 [N, k + 1], log q float32 [N, k + 1]): the last column is "other"; a top token
       the draft cannot propose has p = q = 0 in its own column (its mass is in "other").
    """
    log_q = torch.log_softmax(draft_logits.float(), dim=-1)
    rows = t2d[top_ids]                                                     # [N, k]
    inside = rows >= 0
    log_q_top = log_q.gather(-1, rows.clamp_min(0)).masked_fill(~inside, float("-inf"))
    q_top = log_q_top.exp()
    p_top = top_logp.float().exp() * inside
    p_other = (1 - p_top.sum(-1, keepdim=True)).clamp_min(0)
    q_other = (1 - q_top.sum(-1, keepdim=True)).clamp_min(EPS)
    p = torch.cat([p_top, p_other], dim=-1)
    q = torch.cat([q_top, q_other], dim=-1)
    log_q_all = torch.cat([log_q_top, q_other.log()], dim=-1)
    return p, q, log_q_all


def divergence(name: str, draft_logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor,
               t2d: torch.Tensor) -> torch.Tensor:
    """float32 [N]: the divergence ``name`` (fkl, rkl or tv) between the target's and the draft's binned laws at
    each position (arguments as :func:`binned`'s). Differentiable in ``draft_logits``."""
    p, q, log_q = binned(draft_logits, top_ids, top_logp, t2d)
    if name == "tv":
        return 0.5 * (p - q).abs().sum(-1)
    log_p = p.clamp_min(EPS).log()
    if name == "fkl":
        return torch.where(p > 0, p * (log_p - log_q.clamp_min(-1e4)), torch.zeros_like(p)).sum(-1)
    if name == "rkl":
        return torch.where(q > 0, q * (log_q.clamp_min(-1e4) - log_p), torch.zeros_like(q)).sum(-1)
    raise ValueError(f"unknown divergence {name!r}")


@torch.no_grad()
def agreement(draft_logits: torch.Tensor, top_ids: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """bool [N]: the draft's most probable token (its row mapped by d2t int64 [K_d] to a target id) is the target's
    (top_ids[:, 0]): the probability that a T = 0 step accepts the draft's token at that position, given the
    prefix."""
    return d2t[draft_logits.argmax(dim=-1)] == top_ids[:, 0]


@torch.no_grad()
def acceptance(draft_logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor,
               t2d: torch.Tensor) -> torch.Tensor:
    """float32 [N]: Σ min(p, q) over the target's top tokens, a lower bound of the probability that a T = 1 step
    accepts a token drawn from the draft."""
    p, q, _ = binned(draft_logits, top_ids, top_logp, t2d)
    return torch.minimum(p, q)[:, :-1].sum(-1)
