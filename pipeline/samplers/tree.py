"""Exact verification of a token tree: recursive rejection sampling, node by node (the torch reference).

A step's draft is a tree (:class:`pipeline.tree_shape.TokenTree`): several candidates per position, each with its
own subtree. The target scores every node in one forward (a tree attention mask), giving p at the root and at each
node; the draft's q at a node is the distribution its children were drawn from. Starting at the root, with p the
target's distribution there:

    for each child x of the current node, in order (the first that is accepted wins):
        accept x with probability min(1, p(x) / q(x))               (never where q(x) = 0)
        on rejection:  p <- norm(max(0, p - q))
                       without replacement, also q <- norm(q with x removed)
    a child accepted: move to it (p, q become the target's and the draft's distributions at that node), go on
    none accepted:    emit a token drawn from what is left of p (the corrected token); stop
    a leaf reached:   emit a token drawn from p there (the bonus token); stop

This is SpecInfer's multi-step speculative sampling (Miao et al., 2024) and multi-draft speculative sampling with
and without replacement (Yang et al., 2024). Why it is exact at one node: the test of child x against (p, q) is
ordinary rejection sampling, so P(emit y) = min(p(y), q(y)) + P(reject) * r(y) with r = norm(max(0, p - q)), and
that is p(y) provided the rest of the procedure, started at (r, q'), emits r. It does, by induction over the
remaining children, because r does not depend on which x was rejected and the next child is drawn from q' given
the rejected ones: q' = q where siblings are drawn independently (with replacement), q' = q with x removed where
they are drawn without replacement. So each emitted token follows p at its node, and the path, by the chain rule,
follows the target. Using the other rule than the one the siblings were drawn with is not exact (the tests show it).

Deterministic children (``draft_logits=None``: the draft's top-k, several n-gram matches): q is the point mass on
x, so x is accepted with probability p(x) and on rejection p loses x (p <- norm(p with x zeroed)); with or without
replacement is the same thing. At T = 0 the step follows the first child equal to the target's argmax at each
node and emits the argmax where none is: the target's own greedy path.

Randomness: uniforms u float32 [B, N+1] (:func:`pipeline.samplers.contract.uniforms` with γ = N): column n is
node n's acceptance test, column N the emitted token's draw. A chain (widths 1, ..., 1) then reads the uniforms
the chain samplers read and accepts exactly what ``exact`` accepts.

Rows with smaller trees (``real`` bool [B, N]: a drafter without a model found fewer matches in some rows than the
step's tree has nodes): a node that is not real is never tested, so it is neither accepted nor taken out of p, and
its row is verified exactly as its own smaller tree would be (the nodes a row lacks are its last siblings, or whole
subtrees); the verify step reads one more bool per node, nothing else changes.

Batched over B rows with tensor ops; the loops run over depth and sibling rank (the tree's static shape), never
over tensor values; no host sync.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.errors import SamplerInputError
from pipeline.samplers.contract import (
    RESIDUAL_ZERO_TOL,
    SamplerResult,
    assemble_tokens,
    sample_from_weights,
    uniforms,
    validate_inputs,
)
from pipeline.samplers.torch_ref import drafted_ok, finite_max_ok, softmax_fp32
from pipeline.tree_shape import TokenTree
from pipeline.tree_tensors import children_table


def normalised(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """weights float32 [B, V] scaled to sum 1; rows whose mass is rounding noise (at most RESIDUAL_ZERO_TOL) take
    ``fallback`` [B, V] instead (a residual of p = q is reached only by a rounding-noise rejection)."""
    mass = weights.sum(dim=1, keepdim=True)
    return torch.where(mass > RESIDUAL_ZERO_TOL, weights / mass.clamp_min(RESIDUAL_ZERO_TOL), fallback)


def residual(p: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """What is left of p [B, V_t] after rejecting x int64 [B] drawn from q [B, V_d]: norm(max(0, p - q)) (V_d
    entries past V_d count as 0); q None is the point mass on x: p with x zeroed, renormalised."""
    if q is None:
        left = p.scatter(1, x[:, None], 0.0)
    else:
        left = p.clone()
        left[:, : q.shape[1]] -= q
        left.clamp_min_(0.0)
    return normalised(left, p)


def without(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """q [B, V_d] with x int64 [B] removed, renormalised (a row left without mass stays all zeros: every later
    sibling then has q(x) = 0 and is rejected outright, and the residual is p itself)."""
    left = q.scatter(1, x.clamp_max(q.shape[1] - 1)[:, None], 0.0)
    return normalised(left, torch.zeros_like(left))


def at(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """q [B, V] at x int64 [B] -> float32 [B]; 0 where x >= V (a draft vocabulary smaller than the target's)."""
    V = q.shape[1]
    return torch.where(x < V, q.gather(1, x.clamp_max(V - 1)[:, None]).squeeze(1), 0.0)


@dataclass
class _Walk:
    """Per-row state of a walk down the tree: cur int64 [B] (the current position, 0 the root), done bool [B],
    accepted int64 [B], path int64 [B, D]."""

    cur: torch.Tensor
    done: torch.Tensor
    accepted: torch.Tensor
    path: torch.Tensor

    @classmethod
    def start(cls, B: int, depth: int, device) -> _Walk:
        zeros = torch.zeros(B, dtype=torch.int64, device=device)
        return cls(zeros, torch.zeros(B, dtype=torch.bool, device=device), zeros.clone(),
                   torch.full((B, depth), -1, dtype=torch.int64, device=device))

    def advance(self, d: int, found: torch.Tensor, chosen: torch.Tensor) -> None:
        """After depth d's siblings: rows that accepted a child (found bool [B]) move to it (chosen int64 [B],
        a node index), the others stop."""
        found = found & ~self.done
        self.path[:, d] = torch.where(found, chosen, -1)
        self.accepted += found.long()
        self.cur = torch.where(found, chosen + 1, self.cur)
        self.done |= ~found


def tree_rejection_verify(tree: TokenTree, draft_tokens: torch.Tensor, p_all: torch.Tensor,
                          q_all: torch.Tensor | None, u: torch.Tensor, replacement: bool = True,
                          residual_fn: Callable = residual, real: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling over ``tree`` (module docstring).

    draft_tokens  int64   [B, N]      each node's token
    p_all         float32 [B, N+1, V_t]  the target's distribution at each position (0: the root, n + 1: node n)
    q_all         float32 [B, N, V_d] the draft's distribution each node was drawn from (its parent's, before any
                  sibling was removed); None: deterministic children
    u             float32 [B, N+1]   uniforms: column n tests node n, column N draws the emitted token
    replacement   siblings were drawn independently (True) or without replacement (False)
    residual_fn   (p, q or None, x) -> p after rejecting x (the tests swap it for wrong variants)
    real          bool [B, N]: the nodes each row proposed (the others are never tested); None: all
    returns       (accepted int64 [B], path int64 [B, D], next_token int64 [B])
    """
    B, dev = draft_tokens.shape[0], draft_tokens.device
    rows = torch.arange(B, device=dev)
    children = children_table(tree, dev)
    walk = _Walk.start(B, tree.depth, dev)
    p = p_all[:, 0]
    for d in range(tree.depth):
        found = torch.zeros(B, dtype=torch.bool, device=dev)
        chosen = torch.zeros(B, dtype=torch.int64, device=dev)
        q = None
        for i in range(children.shape[1]):
            child = children[walk.cur, i]                                          # [B], -1: no such child
            node = child.clamp_min(0)
            live = (child >= 0) & ~walk.done & ~found
            if real is not None:
                live &= real[rows, node]
            x = draft_tokens[rows, node]
            if q_all is not None and (q is None or replacement):
                q = q_all[rows, node]                                              # [B, V_d]
            q_x = torch.ones_like(u[:, 0]) if q is None else at(q, x)
            accept = live & (q_x > 0) & (u[rows, node] * q_x < at(p, x))
            reject = live & ~accept
            p = torch.where(reject[:, None], residual_fn(p, q, x), p)
            if q is not None and not replacement:
                q = torch.where(reject[:, None], without(q, x), q)
            found |= accept
            chosen = torch.where(accept, node, chosen)
        walk.advance(d, found, chosen)
        p = torch.where(found[:, None], p_all[rows, walk.cur], p)
    return walk.accepted, walk.path, sample_from_weights(p.contiguous(), u[:, -1])


def tree_greedy_verify(tree: TokenTree, draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                       real: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """T = 0: follow the first child equal to the target's argmax at each node; emit the argmax where none is.
    draft_tokens int64 [B, N], target_logits [B, N+1, V_t], real bool [B, N] or None (as in
    :func:`tree_rejection_verify`) -> (accepted [B], path [B, D], next_token [B])."""
    B, dev = draft_tokens.shape[0], draft_tokens.device
    rows = torch.arange(B, device=dev)
    children = children_table(tree, dev)
    best = target_logits.argmax(dim=-1)                                            # [B, N+1]
    walk = _Walk.start(B, tree.depth, dev)
    for d in range(tree.depth):
        found = torch.zeros(B, dtype=torch.bool, device=dev)
        chosen = torch.zeros(B, dtype=torch.int64, device=dev)
        for i in range(children.shape[1]):
            child = children[walk.cur, i]
            node = child.clamp_min(0)
            accept = (child >= 0) & ~walk.done & ~found & (draft_tokens[rows, node] == best[rows, walk.cur])
            if real is not None:
                accept &= real[rows, node]
            found |= accept
            chosen = torch.where(accept, node, chosen)
        walk.advance(d, found, chosen)
    return walk.accepted, walk.path, best[rows, walk.cur]


def check_tree_inputs(tree: TokenTree, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
                      target_logits: torch.Tensor, real: torch.Tensor | None = None) -> None:
    """Shapes, dtypes and devices as the chain samplers check them (γ = N), plus N against the tree: draft_tokens
    int64 [B, N], draft_logits [B, N, V_d] or None, target_logits [B, N+1, V_t], real bool [B, N] (on draft_tokens'
    device) or None. SamplerInputError (one line)."""
    validate_inputs(draft_tokens, draft_logits, target_logits)
    if real is not None and (real.shape != draft_tokens.shape or real.dtype != torch.bool
                             or real.device != draft_tokens.device):
        raise SamplerInputError(f"real must be bool {list(draft_tokens.shape)} on {draft_tokens.device} (one flag per "
                                f"row and node); got {real.dtype} {list(real.shape)} on {real.device}")
    if draft_tokens.shape[1] != tree.n_nodes:
        raise SamplerInputError(f"draft_tokens has {draft_tokens.shape[1]} nodes but the tree has "
                                f"{tree.n_nodes}: pass one token per tree node")


class TreeVerifier:
    """Exact verification of a token tree under the sampler contract's conventions (module docstring).

    temperature  the decoding temperature (0: the target's greedy path)
    replacement  how the stochastic children of a node were drawn: independently (True) or without replacement

    ``verifier(tree, draft_tokens [B, N], draft_logits [B, N, V_d] or None, target_logits [B, N+1, V_t],
    generator, real=None)`` (real bool [B, N]: the nodes each row proposed) -> :class:`SamplerResult` over the
    accepted path (tokens int64 [B, D+1], D the depth) with ``path`` int64 [B, D], its node indices (-1 after
    ``accepted``). Shapes, dtypes and devices are checked as the chain samplers check them
    (γ = N), plus N against the tree; a bad call raises SamplerInputError (one line).
    """

    def __init__(self, temperature: float = 1.0, replacement: bool = True,
                 residual_fn: Callable = residual) -> None:
        temperature = float(temperature)
        if not temperature >= 0.0:
            raise SamplerInputError(f"temperature must be >= 0 (0 means greedy verify); got {temperature}")
        self.temperature, self.replacement, self.residual_fn = temperature, bool(replacement), residual_fn

    def __call__(self, tree: TokenTree, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
                 target_logits: torch.Tensor, generator=None, real: torch.Tensor | None = None) -> SamplerResult:
        check_tree_inputs(tree, draft_tokens, draft_logits, target_logits, real)
        B = draft_tokens.shape[0]
        if self.temperature == 0.0:
            accepted, path, nxt = tree_greedy_verify(tree, draft_tokens, target_logits, real)
            target_ok = finite_max_ok(target_logits.amax(dim=-1))
            draft_ok = drafted_ok(draft_tokens, draft_logits)
        else:
            inv_t = 1.0 / self.temperature
            p = softmax_fp32(target_logits, inv_t)                                  # [B, N+1, V_t]
            q = None if draft_logits is None else softmax_fp32(draft_logits, inv_t)  # [B, N, V_d]
            u = uniforms(B, tree.n_nodes, draft_tokens.device, generator)
            accepted, path, nxt = tree_rejection_verify(tree, draft_tokens, p, q, u, self.replacement,
                                                        self.residual_fn, real)
            target_ok = ~p[:, :, 0].isnan().any(dim=1)
            draft_ok = torch.ones_like(target_ok) if q is None else ~q[:, :, 0].isnan().any(dim=1)
        path_tokens = draft_tokens.gather(1, path.clamp_min(0))
        return SamplerResult(accepted=accepted, tokens=assemble_tokens(path_tokens, accepted, nxt),
                          draft_ok=draft_ok, target_ok=target_ok, path=path)


class TreeSampler:
    """A chain sampler that also verifies token trees: the engine's sampler where a drafter proposes trees.

    A call without ``tree`` is the chain sampler's (a drafter falls back to a chain near the end of a row); with
    ``tree`` (a :class:`pipeline.tree_shape.TokenTree`) and ``replacement`` (how its stochastic children were
    drawn) it is :class:`TreeVerifier` at the chain rule's temperature (0 where the rule verifies by argmax), with
    ``real`` (bool [B, N]) where rows proposed smaller trees than the step's, or, for a kernel sampler
    (``backend="cupy"``), the kernels' verifier it makes (``tree_verifier``: tree_verify in kernels/verify.cu, which
    computes what TreeVerifier computes, ``real`` included).
    Every other attribute is the chain sampler's.
    """

    def __init__(self, sampler) -> None:
        self.inner = sampler

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __call__(self, draft_tokens, draft_logits, target_logits, generator=None, lengths=None, tree=None,
                 replacement: bool = True, real=None) -> SamplerResult:
        if tree is None:
            extra = {} if lengths is None else {"lengths": lengths}
            return self.inner(draft_tokens, draft_logits, target_logits, generator=generator, **extra)
        temperature = 0.0 if self.inner.verifies_by_argmax else self.inner.temperature
        kernels = getattr(self.inner, "tree_verifier", None)     # a kernel sampler (backend="cupy"): tree_verify
        verifier = TreeVerifier if kernels is None else kernels
        return verifier(temperature, replacement)(tree, draft_tokens, draft_logits, target_logits, generator, real)
