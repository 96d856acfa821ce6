"""A draft model proposing a token tree: several children per node, one draft forward per level.

The tree's shape is widths per depth (pipeline/tree_shape.py, ``--draft-tree 2,2,1``). From the draft's
distribution at the root (the step's first logits, as for a chain) it picks the root's children, reads them in one
forward in which each attends to the context and itself, picks their children from the logits that forward gives,
and so on: depth D costs D draft forwards, as a chain of D tokens does, and the target scores all N nodes in one
forward (pipeline/decoding/cache.py, a :class:`~pipeline.tree_shape.TreeSpan`).

Children of a node (``children``):
  without-replacement  sampled one after another, each from the draft's distribution with the earlier siblings
                       removed (the first is an ordinary draw); one uniform per node
  with-replacement     sampled independently (siblings may repeat)
  top-k                the k most probable, deterministic (the verify step then gets no draft logits)
At draft temperature 0 the children are the top-k whatever ``children`` says. The verify step
(pipeline/samplers/tree.py) is told which rule the siblings follow: exactness depends on it.

Near the end of a row (a step asked for fewer tokens than the tree has, or for per-row limits) it proposes a chain,
as :class:`ModelDrafter` does.
"""

from __future__ import annotations

import torch

from pipeline.decoding.drafters.base import DraftAsk, DraftSetup, Proposal, StepOutcome
from pipeline.decoding.drafters.model import ModelDrafter
from pipeline.samplers.contract import sample_from_weights
from pipeline.tree_shape import TREE_CHILDREN, TokenTree, TreeSpan


class TreeDrafter(ModelDrafter):
    """A :class:`ModelDrafter` whose full steps propose ``tree`` (a :class:`TokenTree` of uniform widths per
    depth) with children chosen by ``children`` (one of TREE_CHILDREN)."""

    def __init__(self, model, tree: TokenTree, children: str = "without-replacement") -> None:
        super().__init__(model)
        if children not in TREE_CHILDREN:
            raise ValueError(f"children must be one of {TREE_CHILDREN}; got {children!r}")
        self.tree, self.children = tree, children
        self.settings = {"drafter": "model", "draft_tree": list(self.widths()), "tree_children": children}

    def widths(self) -> tuple[int, ...]:
        """Children per node at each depth (the tree is built from widths: every node of a depth has as many)."""
        return tuple(self._width_at(depth) for depth in range(self.tree.depth))

    def _width_at(self, depth: int) -> int:
        """Children of the first node at ``depth`` (0: the root)."""
        position = 0 if depth == 0 else self.tree.depths.index(depth) + 1
        return len(self.tree.children[position])

    def bind(self, setup: DraftSetup) -> None:
        super().bind(setup)
        self.target_span = TreeSpan.whole(self.tree, setup.device)
        self.level_spans = [TreeSpan.level(self.tree, d, setup.device) for d in range(1, self.tree.depth)]
        self.deterministic = self.children == "top-k" or self.temperature == 0.0

    def propose(self, ask: DraftAsk) -> Proposal:
        """The tree where every row may still emit its depth + 1 tokens, else a chain. Near the end of a row the
        step draws fewer uniforms than the tree has nodes (for the batch, or with per-row generators for that row,
        whose later columns are then zeros): the children are then the draft's top-k (deterministic, verified as
        exactly)."""
        depth, n = self.tree.depth, self.tree.n_nodes
        if ask.gamma < depth or min(ask.wants or [depth]) < depth or ask.confidence is not None:
            return super().propose(ask)
        deterministic = self.deterministic or ask.u.shape[1] < n or min(ask.wants or [n]) < n
        logits = self.first_logits()[:, None]                                  # [b, 1, V_d]: the root's
        b = logits.shape[0]
        tokens, node_logits, start = [], [], 0
        for depth, width in enumerate(self.widths()):
            if self.mask_logits is not None:
                logits = self.mask_logits(logits, first_position=False)
                if ask.first_step and depth == 0:
                    self.mask_logits(logits, first_position=True)
            parents = logits.shape[1]
            u = None if deterministic else ask.u[:, start: start + parents * width].reshape(b * parents, width)
            kids = self.pick(logits.reshape(b * parents, -1), width, u, deterministic).reshape(b, parents * width)
            tokens.append(kids)
            if not deterministic:
                node_logits.append(logits[:, :, None].expand(-1, -1, width, -1).reshape(b, parents * width, -1))
            start += parents * width
            if depth + 1 < self.tree.depth:          # the deepest level is never read by the draft
                logits = self.model.forward(self._readable(kids), span=self.level_spans[depth])
                self.forwards += 1
        return Proposal(torch.cat(tokens, 1), None if deterministic else torch.cat(node_logits, 1),
                        tree=self.tree, replacement=self.children == "with-replacement", span=self.target_span)

    def pick(self, logits: torch.Tensor, width: int, u: torch.Tensor | None, deterministic: bool) -> torch.Tensor:
        """``width`` children for each row of logits [n, V_d] with uniforms u float32 [n, width] (the top-k where
        ``deterministic``: u None) -> int64 [n, width]."""
        if deterministic:
            return logits.topk(width, dim=-1).indices
        scaled = logits if self.temperature == 1.0 else logits.float() / self.temperature
        weights = torch.softmax(scaled, dim=-1, dtype=torch.float32)
        kids = []
        for i in range(width):
            kids.append(sample_from_weights(weights, u[:, i]))
            if self.children == "without-replacement" and i + 1 < width:
                weights = weights.scatter(1, kids[-1][:, None], 0.0)
        return torch.stack(kids, dim=1)

    def commit(self, outcome: StepOutcome) -> None:
        """A tree step: the accepted path's entries first among the nodes the draft read (depths 1..D-1), the rest
        dropped; then the backlog as after a chain of D tokens. A chain step: as :class:`ModelDrafter`."""
        if outcome.proposal.tree is None:
            return super().commit(outcome)
        depth = self.tree.depth
        read = sum(1 for d in self.tree.depths if d < depth)                   # nodes in the draft's cache
        kept = depth - 1
        max_acc, min_acc = max(outcome.accepted_host), min(outcome.accepted_host)
        self.model.retain(read, outcome.accepted.clamp_max(kept), min(max_acc, kept), min(min_acc, kept),
                          outcome.path[:, :kept], read)
        leaf = outcome.proposal.tokens.gather(1, outcome.path[:, -1:].clamp_min(0)).squeeze(1)
        self.queue(outcome, depth, leaf)
