"""pipeline/objectives.py: the quality objective and ratio, the trade-off, and the acceptance/theory formulas."""

from __future__ import annotations

import json

import pytest

from pipeline.objectives import (
    expected_tokens_iid,
    predicted_speedup,
    quality_ratio,
    quality_value,
    theoretical_speedup,
    tradeoff,
)


def test_quality_value_and_ratio_per_task():
    assert quality_value("cnn_dailymail", {"rougeL": 0.4}) == 0.4
    assert quality_value("librispeech", {"wer": 0.1}) == -0.1
    assert quality_value("prompts", {}) is None
    assert quality_ratio("cnn_dailymail", {"rougeL": 0.3}, {"rougeL": 0.4}) == pytest.approx(0.75)
    assert quality_ratio("librispeech", {"wer": 0.2}, {"wer": 0.1}) == pytest.approx(0.8 / 0.9)


def test_tradeoff_uses_the_baseline_quality_the_run_recorded_even_without_the_file(tmp_path):
    result = {"config": {"task": "cnn_dailymail"}, "metrics": {"speedup": 2.0}, "quality": {"rougeL": 0.3},
              "resolved": {"baseline": str(tmp_path / "gone.json"), "baseline_quality": {"rougeL": 0.4}}}
    assert tradeoff(result) == pytest.approx(2.0 * 0.75)
    # an older result without it: the baseline file is read, and without the file there is no trade-off
    del result["resolved"]["baseline_quality"]
    assert tradeoff(result) is None
    (tmp_path / "gone.json").write_text(json.dumps({"specsweep_results": 1, "quality": {"rougeL": 0.6}}))
    assert tradeoff(result) == pytest.approx(2.0 * 0.5)


def test_theoretical_speedup_is_leviathans_formula():
    assert theoretical_speedup(0.8, 0, 0.1) == 1.0
    assert theoretical_speedup(None, 4, 0.1) is None
    assert theoretical_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8 ** 5) / (1 - 0.8) / 1.4)
    assert theoretical_speedup(1.2, 2, 0.0) == expected_tokens_iid(1.0, 2) == 3.0   # α is clipped to [0, 1]


def test_predicted_speedup_charges_the_measured_verify_forward():
    # 3 tokens per step, γ 4, c 0.1: Leviathan's denominator 1.4; a verify forward costing 1.3 target steps: 1.7
    assert predicted_speedup(3.0, 4, 0.1, 1.0) == pytest.approx(3.0 / 1.4)
    assert predicted_speedup(3.0, 4, 0.1, 1.3) == pytest.approx(3.0 / 1.7)
    assert predicted_speedup(3.0, 0, 0.1, 1.3) is None
    assert predicted_speedup(3.0, 4, None, 1.3) is None and predicted_speedup(3.0, 4, 0.1, None) is None


# ---- the token-tree cost model ---------------------------------------------------------------------------------------

def test_a_chain_tree_is_the_closed_form():
    from pipeline.objectives import expected_tokens_tree, tree_speedup
    from pipeline.tree_shape import TokenTree

    for a in (0.0, 0.3, 0.8, 1.0):
        for gamma in (1, 3, 6):
            chain = TokenTree.chain(gamma)
            assert expected_tokens_tree(chain, [a] * gamma) == pytest.approx(expected_tokens_iid(a, gamma))
            assert tree_speedup(chain, [a] * gamma, 0.1) == pytest.approx(theoretical_speedup(a, gamma, 0.1))
    # per-position rates: 1 + r1 + r1 r2 + ...
    assert expected_tokens_tree(TokenTree.chain(3), [0.9, 0.5, 0.2]) == pytest.approx(1 + 0.9 + 0.45 + 0.09)
    with pytest.raises(ValueError, match="one acceptance per node"):
        expected_tokens_tree(TokenTree.chain(3), [0.5])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_tokens_tree(TokenTree.chain(1), [1.5])


def test_the_tree_model_costs_the_wider_target_forward_and_the_draft_forwards():
    from pipeline.objectives import expected_tokens_tree, rank_acceptance, tree_speedup
    from pipeline.tree_shape import TokenTree

    tree = TokenTree.from_widths((3, 2, 1))                            # 15 nodes, depth 3
    accept = rank_acceptance(tree, [0.6, 0.3, 0.2])
    tokens = expected_tokens_tree(tree, accept)
    # the root's children accept 1 - 0.4 * 0.7 * 0.8 of the time; a wider tree never accepts less than its chain
    assert tokens > expected_tokens_tree(TokenTree.chain(3), [0.6] * 3)
    assert tree_speedup(tree, accept, 0.1, token_cost=0.05) == pytest.approx(tokens / (3 * 0.1 + 1 + 0.05 * 15))
    assert tree_speedup(tree, accept, 0.1, verify_cost_ratio=2.0, draft_forwards=0) == pytest.approx(tokens / 2.0)
    with pytest.raises(ValueError, match="costs must be >= 0"):
        tree_speedup(tree, accept, -1.0)


def test_the_tree_model_predicts_the_verifiers_mean_accepted_tokens():
    """Simulation: the torch tree verifier on a 2,2,1 tree of deterministic children over fixed target
    distributions, 40 000 steps; its mean emitted tokens per step against the model with accept[k] = p(x_k) / (1 -
    Σ_{j<k} p(x_j)) at each node (its children's conditional acceptance), within 4 standard errors. A model that
    ignores the renormalisation (accept[k] = p(x_k)) is off by more (the negative control)."""
    import torch

    from pipeline.objectives import expected_tokens_tree
    from pipeline.samplers.tree import tree_rejection_verify
    from pipeline.tree_shape import TokenTree

    g = torch.Generator().manual_seed(0)
    tree, V, B = TokenTree.from_widths((2, 2, 1)), 6, 40_000
    p = torch.softmax(torch.randn(tree.n_nodes + 1, V, generator=g) * 1.5, -1)        # per position
    tokens = torch.zeros(tree.n_nodes, dtype=torch.int64)
    accept, naive = [0.0] * tree.n_nodes, [0.0] * tree.n_nodes
    for pos, kids in enumerate(tree.children):          # siblings: the parent position's most likely tokens
        used = 0.0
        for n, x in zip(kids, p[pos].topk(max(len(kids), 1)).indices):
            tokens[n] = x
            px = float(p[pos, tokens[n]])
            accept[n], naive[n] = px / (1 - used), px
            used += px
    u = torch.rand(B, tree.n_nodes + 1, generator=g)
    accepted, _, _ = tree_rejection_verify(tree, tokens.expand(B, -1), p.expand(B, -1, -1), None, u)
    emitted = accepted.double() + 1
    mean, se = float(emitted.mean()), float(emitted.std()) / B ** 0.5
    assert abs(mean - expected_tokens_tree(tree, accept)) < 4 * se, (mean, expected_tokens_tree(tree, accept))
    assert abs(mean - expected_tokens_tree(tree, naive)) > 4 * se
