"""The best token tree for a node budget (pipeline/tree_plan.py) and the per-node counts a run records.

  dp        never below the chain of N, the chain itself when only first children are ever accepted, equal to brute
            force over every tree of up to 6 nodes (per-rank and per-depth rates, with a depth cap), and its value
            is expected_tokens_tree's for the tree it returns
  outcomes  TokenTree.outcomes marks the nodes a verify step tried and accepted, as a walk of the tree does
  profile   a run's node counts -> rates (a rank tried too rarely takes its rate over all depths), best:N through the
            config, and its errors in one line
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.objectives import expected_tokens_tree
from pipeline.tree_plan import add_node_counts, best_tree, node_rates, profile_rates, resolve_tree
from pipeline.tree_shape import TokenTree
from pipeline.tree_tensors import outcomes


def node_rates_of(tree: TokenTree, rows: list[list[float]]) -> list[float]:
    """Per-node acceptance [N] of ``tree`` from rates per depth (the last row below the table) and rank."""
    return [rows[min(d, len(rows)) - 1][k] if k < len(rows[min(d, len(rows)) - 1]) else 0.0
            for d, k in zip(tree.depths, tree.ranks)]


def forests(m: int):
    """Every ordered forest of m nodes, as lists of child lists."""
    if m == 0:
        yield []
        return
    for first in range(1, m + 1):
        for below in forests(first - 1):
            for rest in forests(m - first):
                yield [below, *rest]


def as_tree(forest) -> TokenTree:
    parents, queue = [], [(-1, forest)]
    for parent, kids in queue:
        for kid in kids:
            parents.append(parent)
            queue.append((len(parents) - 1, kid))
    return TokenTree(tuple(parents))


def random_rows(rng: random.Random, depths: int, ranks: int) -> list[list[float]]:
    return [[rng.random() for _ in range(ranks)] for _ in range(depths)]


@pytest.mark.parametrize("seed", range(6))
def test_best_tree_matches_brute_force_and_the_model(seed):
    rng = random.Random(seed)
    rows = random_rows(rng, 1 if seed % 2 else 4, 3)               # per rank only, or per depth and rank
    for n in range(1, 7):
        for cap in (None, 2):
            trees = [as_tree(f) for m in range(1, n + 1) for f in forests(m)]
            trees = [t for t in trees if cap is None or t.depth <= cap]
            brute = max(expected_tokens_tree(t, node_rates_of(t, rows)) for t in trees)
            tree, value = best_tree(rows if len(rows) > 1 else rows[0], n, cap)
            assert value == pytest.approx(brute, abs=1e-12)
            assert value == pytest.approx(expected_tokens_tree(tree, node_rates_of(tree, rows)), abs=1e-12)
            assert tree.n_nodes <= n and (cap is None or tree.depth <= cap)


def test_best_tree_is_never_below_the_chain_and_is_the_chain_when_only_first_children_pass():
    rng = random.Random(7)
    for n in (1, 5, 10, 16):
        rows = random_rows(rng, 12, 4)
        chain = TokenTree.chain(n)
        _, value = best_tree(rows, n)
        assert value >= expected_tokens_tree(chain, node_rates_of(chain, rows)) - 1e-12
        tree, value = best_tree([1.0, 0.0, 0.0], n)
        assert tree == chain and value == n + 1
    # a weak first choice and a useful second: the best tree of 4 branches at once, and beats the chain of 4
    tree, value = best_tree([0.5, 0.5], 4)
    assert tree.max_width == 2 and value > expected_tokens_tree(TokenTree.chain(4), [0.5] * 4)


def test_outcomes_mark_the_nodes_a_walk_tries_and_accepts():
    tree = TokenTree((-1, -1, 0, 0, 1, 2))
    paths = [[-1, -1, -1], [0, -1, -1], [0, 2, 5], [0, 3, -1], [1, 4, -1], [1, -1, -1], [0, 2, -1]]
    tested, accepted = outcomes(tree, torch.tensor(paths))
    for row, path in enumerate(paths):
        on = [n for n in path if n >= 0]
        want_tested = set()
        for position in [0] + [n + 1 for n in on]:          # the root, then each accepted node: its children in
            for kid in tree.children[position]:              # order until the accepted one
                want_tested.add(kid)
                if kid in on:
                    break
        assert set(torch.nonzero(tested[row]).flatten().tolist()) == want_tested
        assert set(torch.nonzero(accepted[row]).flatten().tolist()) == set(on)
    real = torch.ones(len(paths), tree.n_nodes, dtype=torch.bool)
    real[:, 1] = False
    assert not outcomes(tree, torch.tensor(paths), real)[0][:, 1].any()


def test_profile_rates_counts_and_best_through_the_config(tmp_path):
    counts = {"reached": [[100, 3], [80, 40]], "accepted": [[90, 1], [40, 10]]}
    assert add_node_counts(counts, {"reached": [[1]], "accepted": [[1]]})["reached"] == [[101, 3], [80, 40]]
    assert node_rates(counts)["rate"] == [[0.9, 1 / 3], [0.5, 0.25]]
    # depth 1 rank 1 was tried 3 times: it takes rank 1's rate over every depth, 11 / 43
    assert profile_rates(counts) == [[0.9, 11 / 43], [0.5, 0.25]]
    profile = tmp_path / "chain.json"
    run = {"specsweep_results": 1, "config": {"target": "t", "draft": "d", "temperature": 1.0},
           "metrics": {"node_acceptance": node_rates(counts)}}
    profile.write_text(json.dumps(run))
    data = tmp_path / "p.jsonl"
    data.write_text('{"id": "0", "article": "a", "highlights": "b"}\n')
    base = {"target": "t", "draft": "d", "data": str(data), "out": str(tmp_path / "o.json")}
    config = RunConfig.from_dict({**base, "draft_tree": "best:6", "tree_profile": str(profile)}).validate_decoding()
    tree = resolve_tree("best:6", str(profile), "t", "d", 1.0)
    assert config.gamma == tree.n_nodes <= 6
    # no deeper than the profile measured (2 depths), unless best:N:D says
    assert tree == best_tree(profile_rates(counts), 6, 2)[0] and tree.depth == 2
    assert resolve_tree("best:6:4", str(profile)) == best_tree(profile_rates(counts), 6, 4)[0]
    assert resolve_tree("parents:-1,-1,0", None) == TokenTree((-1, -1, 0))
    # a grid's other trees (and its chain) ignore the profile
    widths = RunConfig.from_dict({**base, "draft_tree": "2,2", "tree_profile": str(profile)}).validate_decoding()
    assert widths.gamma == 6
    assert RunConfig.from_dict({**base, "tree_profile": str(profile)}).validate_decoding().draft_tree is None
    for extra, words in [({"draft_tree": "best:6"}, "needs --tree-profile"),
                         ({"draft_tree": "best:x", "tree_profile": str(profile)}, "takes integers"),
                         ({"draft_tree": "best:0", "tree_profile": str(profile)}, "node budget"),
                         ({"draft_tree": "best:6", "tree_profile": str(profile), "draft": "other"}, "same pair"),
                         ({"draft_tree": "parents:-1,x"}, "parents:-1,-1,0"),
                         ({"draft_tree": "parents:-1,1"}, "lists parents before children"),
                         ({"draft_tree": "best:6", "tree_profile": str(profile), "drafter": "prompt-lookup"},
                          "widths per depth")]:
        with pytest.raises(SpecsweepError, match=words) as err:
            RunConfig.from_dict({**base, **extra}).validate_decoding()
        assert "\n" not in str(err.value)
