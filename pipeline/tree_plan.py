"""The best token tree for a node budget, from measured per-rank acceptance (Sequoia, Chen et al. 2024).

Under the positional acceptance assumption of :func:`pipeline.objectives.expected_tokens_tree` (a node's test
depends only on its depth and its rank among its siblings, once its parent is reached and its earlier siblings were
rejected), the expected tokens per step of a tree is 1 + Σ_n P(reach n), and the tree with at most N nodes (and at
most depth L) that maximises it is found by dynamic programming over subtree sizes:

    g(d, m)     the most a node at depth d (the root at 0) adds below itself with m nodes, given it is reached
    h(d, k, m)  the same from its children of rank k, k + 1, ... (the earlier ones rejected)
    h(d, k, m) = max(0, max_{s < m} a(d+1, k) (1 + g(d+1, s)) + (1 - a(d+1, k)) h(d, k+1, m-1-s))
    g(d, m) = h(d, 0, m),   g(L, m) = 0,   E[tokens] = 1 + g(0, N)

a(d, k) the acceptance of the rank-k child at depth d. O(L K N²) for K ranks. The answer is a parents list in
breadth-first order, each node's children contiguous and first child first (what :class:`TokenTree` takes). A
chain is one of the trees searched, so the best tree of N nodes is never below the chain of N under the same
rates. ``--draft-tree best:N --tree-profile RUN.json`` runs it with the rates a previous run measured
(:func:`profile_rates`, the run's ``metrics.node_acceptance``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from pipeline.errors import SpecsweepError
from pipeline.result import read_result
from pipeline.tree_shape import MAX_TREE_NODES, TokenTree

BEST = "best:"          # --draft-tree best:N
MIN_REACHED = 20        # a (depth, rank) tried fewer times than this takes its rank's rate over all depths
_TIE = 1e-12            # a larger tree must gain more than this (ties keep the smaller one)


def rate_table(accept) -> list[list[float]]:
    """Per-rank acceptance (floats, one per sibling rank, any depth) or per depth (a list of such lists, depth 1
    first) -> [[rate per rank] per depth]; each rate in [0, 1]. Bad input raises SpecsweepError (one line)."""
    rows = [list(accept)] if accept and not isinstance(accept[0], Sequence) else [list(r) for r in accept]
    if not rows or not all(rows) or any(not 0.0 <= float(a) <= 1.0 for row in rows for a in row):
        raise SpecsweepError(f"tree acceptance rates must be non-empty lists of numbers in [0, 1]; got {accept!r}")
    return [[float(a) for a in row] for row in rows]


def _rate(rows: list[list[float]], depth: int, rank: int) -> float:
    """a(depth, rank): the row of ``depth`` (depth 1 first; deeper than the table: its last row), 0 past its ranks."""
    row = rows[min(depth, len(rows)) - 1]
    return row[rank] if rank < len(row) else 0.0


def best_tree(accept, n_nodes: int, max_depth: int | None = None) -> tuple[TokenTree, float]:
    """The tree of at most ``n_nodes`` nodes (and at most ``max_depth`` deep; default n_nodes) with the most expected
    tokens per step (the emitted token included) under acceptance ``accept`` (see :func:`rate_table`: per rank, or
    per depth and rank) -> (the tree, its expected tokens per step). Of equally good trees the one with fewer
    nodes. Host-side planning, O(L K N²)."""
    rows = rate_table(accept)
    if not 1 <= n_nodes <= MAX_TREE_NODES:
        raise SpecsweepError(f"a best tree needs a node budget in 1..{MAX_TREE_NODES}; got {n_nodes}")
    depth_cap = n_nodes if max_depth is None else min(max_depth, n_nodes)
    if depth_cap < 1:
        raise SpecsweepError(f"a best tree needs a max depth >= 1; got {max_depth}")
    ranks = min(max(len(r) for r in rows), n_nodes)
    # g[d][m], and per (d, k, m) the choice: s (the rank-k child's subtree size) or -1 (no more children)
    g = [[0.0] * (n_nodes + 1) for _ in range(depth_cap + 1)]
    choice: dict[tuple[int, int, int], int] = {}
    for d in range(depth_cap - 1, -1, -1):
        h = [0.0] * (n_nodes + 1)                                   # h(d, ranks, m) = 0: no child of that rank
        for k in range(ranks - 1, -1, -1):
            a = _rate(rows, d + 1, k)
            new = [0.0] * (n_nodes + 1)
            for m in range(1, n_nodes + 1):
                best, pick = 0.0, -1
                for s in range(m):
                    value = a * (1.0 + g[d + 1][s]) + (1.0 - a) * h[m - 1 - s]
                    if value > best + _TIE:
                        best, pick = value, s
                new[m], choice[d, k, m] = best, pick
            h = new
        g[d] = h
    m_best = next(m for m in range(n_nodes + 1) if g[0][m] >= g[0][n_nodes] - _TIE)

    def children(d: int, m: int) -> list:
        """The subtrees below a node at depth d with m nodes: a list of child subtrees (each such a list)."""
        out, k = [], 0
        while k < ranks and m > 0 and d < depth_cap:
            s = choice[d, k, m]
            if s < 0:
                break
            out.append(children(d + 1, s))
            m, k = m - 1 - s, k + 1
        return out

    return _breadth_first(children(0, m_best)), 1.0 + g[0][m_best]


def _breadth_first(root_children: list) -> TokenTree:
    """Nested child lists (the root's) -> a TokenTree: breadth-first, each node's children contiguous in order."""
    parents: list[int] = []
    queue = [(-1, root_children)]
    for parent, kids in queue:
        for kid in kids:
            parents.append(parent)
            queue.append((len(parents) - 1, kid))
    return TokenTree(tuple(parents))


def add_node_counts(total: dict | None, more: dict) -> dict:
    """Per-node counts {"reached", "accepted": [[int per sibling rank] per depth]} (the engine's
    ``node_acceptance``) summed, the shorter padded with zeros."""
    if not total:
        return {key: [list(row) for row in more[key]] for key in ("reached", "accepted")}
    depths = max(len(total["reached"]), len(more["reached"]))
    ranks = max((len(row) for table in (total, more) for row in table["reached"]), default=0)

    def padded(rows: list[list[int]]) -> list[list[int]]:
        return [list(r) + [0] * (ranks - len(r)) for r in rows] + [[0] * ranks] * (depths - len(rows))
    return {key: [[a + b for a, b in zip(x, y)] for x, y in zip(padded(total[key]), padded(more[key]))]
            for key in ("reached", "accepted")}


def node_rates(counts: dict | None) -> dict | None:
    """The counts of :func:`add_node_counts` with "rate": accepted / reached per depth and rank (None where never
    reached): the per-node acceptance of :func:`~pipeline.objectives.expected_tokens_tree` there, measured."""
    if not counts:
        return None
    rate = [[a / r if r else None for a, r in zip(acc, reach)]
            for acc, reach in zip(counts["accepted"], counts["reached"])]
    return {"reached": counts["reached"], "accepted": counts["accepted"], "rate": rate}


def profile_rates(counts: dict, min_reached: int = MIN_REACHED) -> list[list[float]]:
    """A run's ``metrics.node_acceptance`` (reached / accepted per depth and sibling rank) -> [[rate per rank] per
    depth] for :func:`best_tree`: accepted / reached where the node was tried at least ``min_reached`` times, else
    the rank's rate over every depth (Sequoia's positional vector) where that was, else 0 (a rank never measured
    is never worth a node)."""
    reached, accepted = counts["reached"], counts["accepted"]
    ranks = max((len(r) for r in reached), default=0)
    pooled = []
    for k in range(ranks):
        n = sum(row[k] for row in reached if k < len(row))
        a = sum(row[k] for row in accepted if k < len(row))
        pooled.append(a / n if n >= min_reached else 0.0)
    return [[acc[k] / reach[k] if k < len(reach) and reach[k] >= min_reached else pooled[k] for k in range(ranks)]
            for reach, acc in zip(reached, accepted)] or [[0.0]]


def read_profile(paths: Sequence[str], target: str | None = None, draft: str | None = None,
                 temperature: float | None = None) -> dict:
    """The per-node counts of previous runs (``--tree-profile A.json[,B.json]``), summed: runs of the same pair at
    the same temperature (one-line SpecsweepError if one is not, or recorded no per-node acceptance)."""
    total = None
    for path in paths:
        result = read_result(path)
        cfg, counts = result.get("config", {}), (result.get("metrics") or {}).get("node_acceptance")
        if not counts:
            raise SpecsweepError(f"--tree-profile {path} records no per-node acceptance (a run with γ > 0 by this "
                                 "specsweep writes metrics.node_acceptance)")
        for key, want in (("target", target), ("draft", draft), ("temperature", temperature)):
            if want is not None and cfg.get(key) != want:
                raise SpecsweepError(f"--tree-profile {path} ran {key} {cfg.get(key)!r}, this run {want!r}: "
                                     "profile the same pair at the same temperature")
        total = add_node_counts(total, counts)
    if total is None:
        raise SpecsweepError("--draft-tree best:N needs --tree-profile RUN.json (a previous run of the same pair)")
    return total


PARENTS = "parents:"    # --draft-tree parents:-1,-1,0,0,1: a tree given by its parents list


def is_widths(spec: str) -> bool:
    """Whether a --draft-tree value is widths per depth (not ``best:N`` or ``parents:...``)."""
    return not str(spec).strip().startswith((BEST, PARENTS))


@functools.lru_cache(maxsize=64)
def resolve_tree(spec: str, profile: str | None = None, target: str | None = None, draft: str | None = None,
                 temperature: float | None = None) -> TokenTree:
    """The tree a --draft-tree value names: widths per depth ('2,2,1'), a parents list ('parents:-1,-1,0'), or
    the best tree of N nodes for the acceptance a previous run measured ('best:N', or 'best:N:D' at most D deep;
    by default no deeper than the profile measured, as rates below that are unknown; with ``profile``:
    --tree-profile's comma-separated results files of the same pair, their counts summed; other trees ignore it,
    so that one grid may list chain/2,2,1/best:10).
    Bad input raises SpecsweepError (one line)."""
    spec = str(spec).strip()
    if spec.startswith(PARENTS):
        text = spec[len(PARENTS):]
        try:
            parents = tuple(int(p) for p in text.split(","))
        except ValueError:
            raise SpecsweepError(f"--draft-tree parents: takes node parents such as parents:-1,-1,0 (-1: the root); "
                                 f"got {spec!r}") from None
        return TokenTree(parents)
    if spec.startswith(BEST):
        n, _, depth = spec.partition(":")[2].partition(":")
        if not n.isdigit() or (depth and not depth.isdigit()):
            raise SpecsweepError(f"--draft-tree best:N (or best:N:D, at most D deep) takes integers; got {spec!r}")
        if profile is None:
            raise SpecsweepError("--draft-tree best:N needs --tree-profile RUN.json (a previous run of the same pair)")
        counts = read_profile([p for p in profile.split(",") if p], target, draft, temperature)
        return best_tree(profile_rates(counts), int(n), int(depth) if depth else len(counts["reached"]))[0]
    return TokenTree.from_widths(spec)
