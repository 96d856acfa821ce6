"""A draft model proposing a token tree: several children per node, one draft forward per level.

The tree's shape is any :class:`~pipeline.tree_shape.TokenTree`: widths per depth (``--draft-tree 2,2,1``), a
parents list, or the best tree for a node budget (pipeline/tree_plan.py, ``best:N``). From the draft's
distribution at the root (the step's first logits, as for a chain) it picks the root's children, reads them in one
forward in which each attends to the context and itself, picks their children from the logits that forward gives,
and so on: depth D costs D draft forwards, as a chain of D tokens does, and the target scores all N nodes in one
forward (pipeline/decoding/cache.py, a :class:`~pipeline.tree_tensors.TreeSpan`).

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
from pipeline.tree_shape import TREE_CHILDREN, TokenTree
from pipeline.tree_tensors import TreeSpan


class TreeDrafter(ModelDrafter):
    """A :class:`ModelDrafter` whose full steps propose ``tree`` (any :class:`TokenTree`: the nodes of a depth may
    have different numbers of children, some none) with children chosen by ``children`` (one of TREE_CHILDREN)."""

    def __init__(self, model, tree: TokenTree, children: str = "without-replacement") -> None:
        super().__init__(model)
        if children not in TREE_CHILDREN:
            raise ValueError(f"children must be one of {TREE_CHILDREN}; got {children!r}")
        self.tree, self.children = tree, children
        self.levels = _levels(tree)
        widths = self.widths()
        self.settings = {"drafter": "model", "draft_tree": None if widths is None else list(widths),
                         "tree_parents": list(tree.parents), "tree_children": children}

    def widths(self) -> tuple[int, ...] | None:
        """Children per node at each depth where every node of a depth has as many (a tree of widths), else None."""
        out = []
        for depth in range(self.tree.depth):
            positions = [0] if depth == 0 else [n + 1 for n, d in enumerate(self.tree.depths) if d == depth]
            counts = {len(self.tree.children[p]) for p in positions}
            if len(counts) != 1:
                return None
            out.append(counts.pop())
        return tuple(out)

    def bind(self, setup: DraftSetup) -> None:
        super().bind(setup)
        self.target_span = TreeSpan.whole(self.tree, setup.device)
        self.level_spans = [TreeSpan.level(self.tree, d, setup.device) for d in range(1, self.tree.depth)]
        self.level_index = [(torch.tensor(parent, device=setup.device), torch.tensor(slot, device=setup.device))
                            for parent, slot, _ in self.levels]
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
        for depth, ((parent, slot), (_, _, width)) in enumerate(zip(self.level_index, self.levels)):
            if self.mask_logits is not None:
                logits = self.mask_logits(logits, first_position=False)
                if ask.first_step and depth == 0:
                    self.mask_logits(logits, first_position=True)
            parents, count = logits.shape[1], parent.shape[0]        # the level's positions; its children
            u = None
            if not deterministic:       # node n draws with column n; slots no child takes draw a discarded token
                u = ask.u.new_full((b, parents * width), 0.5).index_copy(1, slot, ask.u[:, start: start + count])
                u = u.reshape(b * parents, width)
            kids = self.pick(logits.reshape(b * parents, -1), width, u, deterministic).reshape(b, parents * width)
            kids = kids if count == parents * width else kids[:, slot]                  # [b, count]
            tokens.append(kids)
            if not deterministic:
                node_logits.append(logits[:, parent])                                    # [b, count, V_d]
            start += count
            if depth + 1 < self.tree.depth:          # the deepest level is never read by the draft
                logits = self.model.forward(self.readable(kids), span=self.level_spans[depth])
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


def _levels(tree: TokenTree) -> list[tuple[list[int], list[int], int]]:
    """Per depth d = 0 .. D-1 (0: the root), how its positions' children (the nodes of depth d + 1, in order) are
    drawn: each child's parent among the level's positions, its slot parent · K + rank in a [positions, K] draw,
    and K, the most children of any position of the level."""
    out = []
    for depth in range(tree.depth):
        positions = [0] if depth == 0 else [n + 1 for n, d in enumerate(tree.depths) if d == depth]
        width = max(len(tree.children[p]) for p in positions)
        parent, slot = [], []
        for i, p in enumerate(positions):
            for k, _ in enumerate(tree.children[p]):
                parent.append(i)
                slot.append(i * width + k)
        out.append((parent, slot, width))
    return out
