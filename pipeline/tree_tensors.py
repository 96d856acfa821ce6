"""A token tree's tensors, made from its shape (:class:`pipeline.tree_shape.TokenTree`, N draft nodes below a root):
the children table a verify step walks, the ancestor mask, what a verify step did at each node, and
:class:`TreeSpan`, how a tree's tokens attend within a forward. Each table is made once per tree and device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from pipeline.tree_shape import TokenTree


@functools.lru_cache(maxsize=64)
def _children_table(tree: TokenTree, device: str) -> torch.Tensor:
    K = max(tree.max_width, 1)
    rows = [list(c) + [-1] * (K - len(c)) for c in tree.children]
    return torch.tensor(rows, dtype=torch.int64, device=device)


def children_table(tree: TokenTree, device) -> torch.Tensor:
    """int64 [N+1, K]: per position, its children's node indices in order, -1 after (K the widest node). Made once
    per tree and device (a verify step reads it every step)."""
    return _children_table(tree, str(device))


def ancestor_mask(tree: TokenTree, device) -> torch.Tensor:
    """bool [N, N]: [i, j] True where node j is node i or one of its ancestors (what node i attends to among the
    draft nodes; every node also attends to the root and the context before it)."""
    mask = torch.eye(tree.n_nodes, dtype=torch.bool)
    for n, parent in enumerate(tree.parents):
        if parent >= 0:
            mask[n] |= mask[parent]
    return mask.to(device)


@functools.lru_cache(maxsize=256)
def _outcome_tables(tree: TokenTree, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For :func:`outcomes`: int64 [N] each node's depth - 1 (its path column), int64 [N] its parent's position (0:
    the root), float32 [N, N] [s, n] = 1 where s is an earlier sibling of n."""
    earlier = torch.zeros(tree.n_nodes, tree.n_nodes)
    for kids in tree.children:
        for k, n in enumerate(kids):
            earlier[list(kids[:k]), n] = 1.0
    depth_col = torch.tensor([d - 1 for d in tree.depths], dtype=torch.int64)
    parent_pos = torch.tensor([p + 1 for p in tree.parents], dtype=torch.int64)
    return depth_col.to(device), parent_pos.to(device), earlier.to(device)


def outcomes(tree: TokenTree, path: torch.Tensor, real: torch.Tensor | None = None) \
        -> tuple[torch.Tensor, torch.Tensor]:
    """What a verify step did at each node of ``tree``, from its accepted path int64 [b, D] (node indices, -1 after
    the accepted count; D >= the tree's depth) and the rows' own nodes ``real`` bool [b, N] (None: every node) ->
    (tested, accepted) bool [b, N]: tested where the verify step tried the node (its parent accepted, or the root,
    and its earlier siblings rejected; a node a row did not propose is never tried), accepted where it is on the
    accepted path. Tensor ops on path's device, no host sync."""
    depth_col, parent_pos, earlier = _outcome_tables(tree, str(path.device))
    nodes = torch.arange(tree.n_nodes, device=path.device)
    accepted = path[:, depth_col] == nodes                                            # [b, N]
    reached = torch.cat([torch.ones_like(accepted[:, :1]), accepted], dim=1)[:, parent_pos]
    sibling_taken = (accepted.float() @ earlier) > 0      # an earlier sibling accepted: this one never tried
    tested = reached & ~sibling_taken
    return (tested if real is None else tested & real), accepted


@dataclass(frozen=True)
class TreeSpan:
    """How the last ``rows`` tokens of a forward attend within the last S cache positions (the root first, then
    tree nodes; every position before the span is attended as in a chain), and their position ids.

    attend  bool  [rows, S]  True where the token attends that span position (the root, its ancestors, itself)
    depth   int64 [rows]     its position id minus the root's
    """

    attend: torch.Tensor
    depth: torch.Tensor

    @classmethod
    def whole(cls, tree: TokenTree, device) -> TreeSpan:
        """The root and all N nodes in one forward (the target scoring a tree): rows = S = N + 1."""
        n = tree.n_nodes
        attend = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        attend[:, 0] = True
        attend[1:, 1:] = ancestor_mask(tree, "cpu")
        attend[0, 0] = True
        return cls(attend.to(device), torch.tensor((0, *tree.depths), dtype=torch.int64, device=device))

    @classmethod
    def level(cls, tree: TokenTree, depth: int, device) -> TreeSpan:
        """The nodes of one depth, appended after the root and the shallower nodes (a draft growing a tree one
        level per forward): rows = the level's nodes, S = 1 + the nodes down to this depth."""
        nodes = [n for n, d in enumerate(tree.depths) if d == depth]
        end = nodes[-1] + 1
        attend = torch.zeros(len(nodes), end + 1, dtype=torch.bool)
        attend[:, 0] = True
        attend[:, 1:] = ancestor_mask(tree, "cpu")[nodes[0]:end, :end]
        return cls(attend.to(device), torch.full((len(nodes),), depth, dtype=torch.int64, device=device))

    @property
    def rows(self) -> int:
        return self.attend.shape[0]

    @property
    def size(self) -> int:
        return self.attend.shape[1]


@functools.lru_cache(maxsize=1024)
def _whole_span(tree: TokenTree, device: str) -> TreeSpan:
    return TreeSpan.whole(tree, device)


def whole_span(tree: TokenTree, device) -> TreeSpan:
    """:meth:`TreeSpan.whole` of ``tree``, made once per tree and device (a drafter whose tree changes from step to
    step reuses the spans it met before)."""
    return _whole_span(tree, str(device))
