"""The shape of a token tree: which draft node hangs below which, the same for every row of a step.

A tree of N draft nodes below a root (the last token the target has not read yet, or the prompt's last token) is
given by its parent indices, in breadth-first order with each node's children contiguous and in the order the verify
step tries them (their rank: the draft's first choice first)::

    TokenTree.from_widths([3, 2, 1])    # `--draft-tree 3,2,1`: 3 children of the root, 2 below each, 1 below those
    tree.parents    # (-1, -1, -1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8): -1 is the root
    tree.n_nodes    # 15 = 3 + 3*2 + 3*2*1 (tokens the target scores per step, besides the root)

A chain of γ tokens is the tree of widths (1, ..., 1). Positions are counted from the root: position 0 is the root,
position n + 1 is draft node n (the target's logits [B, N+1, V] and the uniforms [B, N+1] follow that order).

The shape is plain Python (RunConfig and the search space read it, and `specsweep --help` loads no torch); the tensors
made from it (the children table, the ancestor mask, the verify step's outcomes, the attention span) are
pipeline/tree_tensors.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

from pipeline.errors import SpecsweepError

# how a drafter chooses a node's children (pipeline/decoding/drafters/tree.py)
TREE_CHILDREN = ("without-replacement", "with-replacement", "top-k")
# the acceptance rules that verify a tree (pipeline/samplers/tree.py: exact, and greedy at any temperature)
TREE_RULES = ("exact", "greedy")
# the sampler backends that verify a tree: the torch reference, and the CUDA kernel tree_verify (kernels/verify.cu)
TREE_BACKENDS = ("torch", "cupy")
# a grid's or a search space's name for "no tree" (a chain of γ tokens)
CHAIN = "chain"
MAX_TREE_NODES = 256     # tokens scored per step: beyond this a tree costs more than any step it could save


def parse_widths(text: str) -> tuple[int, ...]:
    """'3,2,1' -> (3, 2, 1): children per node at each depth. Bad input raises SpecsweepError (one line)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise SpecsweepError(f"--draft-tree takes widths per depth such as 3,2,1 (positive integers); got {text!r}")
    widths = tuple(int(p) for p in parts)
    if min(widths) < 1:
        raise SpecsweepError(f"--draft-tree widths must be >= 1 (each depth has children); got {text!r}")
    return widths


@dataclass(frozen=True)
class TokenTree:
    """parents: int per draft node, its parent's node index (-1: the root); breadth-first, siblings contiguous."""

    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        for n, parent in enumerate(self.parents):
            if not -1 <= parent < n or (n and parent < self.parents[n - 1]):
                raise SpecsweepError(f"a token tree lists parents before children, siblings together; node {n} has "
                                     f"parent {parent} in {list(self.parents)}")
        if len(self.parents) > MAX_TREE_NODES:
            raise SpecsweepError(f"a token tree of {len(self.parents)} nodes scores more than {MAX_TREE_NODES} tokens "
                                 "per step: choose smaller widths")

    @classmethod
    def from_widths(cls, widths) -> TokenTree:
        """Every node at depth d (the root at 0) has widths[d] children."""
        widths = parse_widths(widths) if isinstance(widths, str) else tuple(int(w) for w in widths)
        if not widths or min(widths) < 1:
            raise SpecsweepError(f"a token tree needs widths >= 1 per depth; got {list(widths)}")
        parents, level = [], [-1]
        for width in widths:
            start = len(parents)
            parents += [p for p in level for _ in range(width)]
            level = list(range(start, len(parents)))
        return cls(tuple(parents))

    @classmethod
    def chain(cls, gamma: int) -> TokenTree:
        """γ nodes, each the only child of the one before (an ordinary draft)."""
        return cls(tuple(range(-1, gamma - 1)))

    @property
    def n_nodes(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Per node, its depth (1 for a child of the root)."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return tuple(out)

    @property
    def depth(self) -> int:
        """The longest path's node count: the most draft tokens a step accepts."""
        return max(self.depths, default=0)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Per position (0: the root, n + 1: node n), its children's node indices in order."""
        out: list[list[int]] = [[] for _ in range(self.n_nodes + 1)]
        for n, parent in enumerate(self.parents):
            out[parent + 1].append(n)
        return tuple(tuple(c) for c in out)

    @property
    def max_width(self) -> int:
        return max((len(c) for c in self.children), default=0)

    def subtree(self, nodes) -> TokenTree:
        """The tree of ``nodes`` (node indices, each one's parent among them, each node's earlier siblings too), in
        this tree's order: a smaller tree that keeps each node's place among its siblings."""
        return _subtree(self, tuple(sorted(nodes)))

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """Per node, its place among its siblings (0: its parent's first child, the one the verify step tries
        first)."""
        out = [0] * self.n_nodes
        for kids in self.children:
            for k, n in enumerate(kids):
                out[n] = k
        return tuple(out)

@functools.lru_cache(maxsize=1024)
def _subtree(tree: TokenTree, nodes: tuple[int, ...]) -> TokenTree:
    index = {n: i for i, n in enumerate(nodes)}
    try:
        return TokenTree(tuple(-1 if tree.parents[n] < 0 else index[tree.parents[n]] for n in nodes))
    except KeyError:
        raise SpecsweepError(f"nodes {list(nodes)} of a token tree leave out a parent") from None


def place_paths(paths, widths: tuple[int, ...], max_depth: int) -> dict[int, int]:
    """Candidate continuations (token lists, the best first) merged into a trie that fits the tree of ``widths``:
    paths with a common prefix share its nodes, a node keeps its first ``widths[d]`` distinct children in the
    order the paths brought them (so the first path is the first child all the way down), the rest of a path that
    finds no room is dropped, and nothing deeper than ``max_depth`` is kept. Returns {node index in
    ``TokenTree.from_widths(widths)``: token}; its nodes are closed under parents and earlier siblings. O(total
    path length)."""
    depth = min(len(widths), max_depth)
    starts = [0]
    for d in range(depth):                       # where each level starts in from_widths's breadth-first order
        starts.append(starts[-1] + (widths[0] if d == 0 else (starts[-1] - starts[-2]) * widths[d]))
    placed: dict[int, int] = {}
    kids: dict[int, dict[int, int]] = {}        # level index (-1: the root) -> token -> the child's level index
    for path in paths:
        parent = -1
        for d, token in enumerate(path[:depth]):
            row = kids.setdefault((d, parent), {})
            child = row.get(token)
            if child is None:
                if len(row) == widths[d]:
                    break
                child = max(parent, 0) * widths[d] + len(row)
                row[token] = child
                placed[starts[d] + child] = token
            parent = child
    return placed
