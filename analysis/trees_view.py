"""The report's comparison of token trees with chains (docs/trees.md).

Per task, target, draft, rule and temperature that ran a tree (``--draft-tree``): each tree next to the chain that
scores as many tokens per target forward (γ = the tree's node count) and the chain of the tree's depth (the chain
its first-child path is), with tokens per verify step and the paired speedup over the target alone. A chain the
results do not hold is left out, not guessed. Flagged speed measurements are marked; their tokens per step stand.
"""

from __future__ import annotations

from pipeline.tree_plan import is_widths
from pipeline.tree_shape import TokenTree

from .document import Heading, Para, Table
from .recommend import CANDIDATE_KINDS, flagged, to_number

GROUP = ["task", "target", "draft", "sampler", "temperature"]


def section(table) -> list:
    """The section's blocks; empty when no run or trial used a tree."""
    need = {"kind", "draft_tree", "gamma", "mean_accepted_tokens", *GROUP}
    if table.empty or not need <= set(table.columns):
        return []
    runs = table[table["kind"].isin(CANDIDATE_KINDS)].copy()
    runs["flagged_speed"] = flagged(runs)
    if runs["draft_tree"].isna().all():
        return []
    blocks = [Heading(2, "Token trees"),
              Para("Each tree against the chain that scores as many tokens per target forward (γ = the tree's "
                   "nodes) and the chain of its depth. A tree scores its nodes in one forward with a tree mask and "
                   "drafts one level per draft forward; it accepts at least as much as the chain of its depth (its "
                   "first children are that chain), and more than the chain of its cost only where the draft's first "
                   "choice is often wrong.")]
    for key, group in runs.groupby(GROUP, sort=True, dropna=False):
        trees = group[group["draft_tree"].notna()]
        if trees.empty:
            continue
        chains = group[group["draft_tree"].isna()]
        rows = []
        for _, tree_row in trees.iterrows():
            parents = tree_row.get("tree_parents")
            if isinstance(parents, str) and parents:         # as it ran: any shape (best:N, parents:...)
                tree = TokenTree(tuple(int(p) for p in parents.split(",")))
            elif is_widths(tree_row["draft_tree"]):
                tree = TokenTree.from_widths(tree_row["draft_tree"])
            else:                                            # best:N from a file older than tree_parents: unknown
                continue
            rows.append(_row(tree_row, f"tree {tree_row['draft_tree']}", tree.depth))
            for gamma, why in ((tree.n_nodes, "as many tokens scored"), (tree.depth, "the tree's depth")):
                match = chains[[to_number(g) == gamma for g in chains["gamma"]]]
                if not match.empty:
                    rows.append(_row(match.iloc[0], f"chain ({why})", gamma))
        task, target, draft, sampler, temperature = key
        blocks += [Heading(3, f"{task}: {target} with {draft}, {sampler} at T = {temperature}"),
                   Table(["drafts", "tokens scored per step", "depth", "tokens/step", "speedup [interval]", "run"],
                         rows)]
    return blocks


def _row(r, label: str, depth: int) -> list:
    ci = f" [{_num(r.get('speedup_ci_low'))}, {_num(r.get('speedup_ci_high'))}]"
    speed = f"{_num(r.get('speedup'))}x{ci}" + (" (flagged)" if r["flagged_speed"] else "")
    return [label, int(to_number(r["gamma"])), depth, _num(r.get("mean_accepted_tokens")), speed, r.get("run")]


def _num(v) -> str:
    v = to_number(v)
    return "-" if v is None else f"{v:.2f}"
