"""What a run is scored by, and what theory predicts for it. One definition each, read by the runner
(pipeline/runner.py), the Optuna study (pipeline/tuning/), W&B logging (pipeline/tracking.py), the runs table
(pipeline/results_table.py) and the report (analysis/):

- quality: the quality objective (the task's metric, pipeline/tasks/: ROUGE-L, or -WER), its ratio to the AR
  baseline's, and the speed/quality ``tradeoff``;
- acceptance: the i.i.d. per-token acceptance α (Leviathan et al. 2023) from a histogram of accepted counts,
  and the per-position acceptance rates;
- theory: expected tokens per verify step (the corrected or bonus token included). With draft position i
  accepted at rate r_i once reached (P(accepted > i | accepted >= i)), a step with γ drafts emits
  1 + Σ_{k=1..γ} Π_{i<k} r_i tokens on average; with one rate a for every position (i.i.d.) that is
  (1 - a^(γ+1)) / (1 - a); the theoretical speedup divides it by γc + 1 for Leviathan et al.'s cost coefficient
  c (one draft forward over one target forward, each decoding one token), which assumes the target scores γ + 1
  tokens in the time of one; the predicted speedup divides the measured tokens per step by γc + r instead, with
  r the measured cost of that γ + 1-token forward in target steps (pipeline/paired.py: forward_costs).
- token trees (:func:`expected_tokens_tree`, :func:`tree_speedup`, docs/trees.md): from per-node acceptance (each
  node's probability of being accepted once its parent is reached and its earlier siblings were rejected), a
  step emits 1 + Σ_n P(n on the accepted path) tokens; it costs D draft forwards (depth D: one per level) and one
  target forward over the root and N nodes, r(N + 1) target steps, modelled as 1 + β N (β = 0: Leviathan's free
  extra tokens) or measured. A chain is the tree of widths 1, ..., 1, and the model is then the formula above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipeline.errors import SpecsweepError
from pipeline.result import read_result
from pipeline.tasks import TASK_NAMES, quality_metric

# task -> (score key, sign) for the tasks with a quality metric, read from the task registry
QUALITY = {name: (m.key, m.sign) for name in TASK_NAMES if (m := quality_metric(name)) is not None}


def quality_value(task: str, quality: dict) -> float | None:
    """The quality objective of a run (higher is better): ROUGE-L, or -WER; None for a task without one."""
    if task not in QUALITY:
        return None
    key, sign = QUALITY[task]
    value = quality.get(key)
    return None if value is None else sign * float(value)


def quality_ratio(task: str, quality: dict, baseline_quality: dict) -> float | None:
    """Quality relative to the AR baseline (exact sampling from the target): ROUGE-L / baseline ROUGE-L, or for
    an error rate the accuracy (1 - WER, floored at 0) / the baseline's. 1.0 = as good as the target alone."""
    metric = quality_metric(task)
    if metric is None:
        return None
    ours, base = quality.get(metric.key), baseline_quality.get(metric.key)
    if ours is None or base is None:
        return None
    if metric.error_rate:
        ours, base = max(0.0, 1.0 - ours), max(0.0, 1.0 - base)
    return ours / base if base > 0 else None


def tradeoff(result: dict) -> float | None:
    """The single speed/quality metric the W&B Bayesian sweep maximises: speedup x quality ratio vs the AR
    baseline (see :func:`quality_ratio`). A task without a quality metric scores its speedup. None without a
    baseline. The baseline's quality is the one the run recorded (``resolved.baseline_quality``) when it read its
    ``--baseline``; results written before it recorded one fall back to reading the baseline file."""
    speedup = result.get("metrics", {}).get("speedup")
    if speedup is None:
        return None
    task = result.get("config", {}).get("task")
    if task not in QUALITY:
        return float(speedup)
    resolved = result.get("resolved", {})
    baseline_quality = resolved.get("baseline_quality")
    if baseline_quality is None:
        try:
            baseline_quality = (read_result(resolved.get("baseline")) or {}).get("quality")
        except (SpecsweepError, TypeError):
            return None
    ratio = quality_ratio(task, result.get("quality", {}), baseline_quality or {})
    return None if ratio is None else float(speedup) * ratio


# ---------------------------------------------------------------------------------------------- acceptance and theory

def expected_tokens_iid(a: float, gamma: int) -> float:
    """(1 - a^(γ+1)) / (1 - a): tokens per step when every draft token is accepted with probability a."""
    if not 0.0 <= a <= 1.0 or gamma < 0:
        raise ValueError(f"need 0 <= a <= 1 and γ >= 0; got a={a}, γ={gamma}")
    return float(gamma + 1) if a == 1.0 else (1.0 - a ** (gamma + 1)) / (1.0 - a)


def expected_tokens_positions(rates: Sequence[float | None], gamma: int) -> float | None:
    """Tokens per step for γ <= len(rates) drafts from per-position rates; None if a needed rate is unknown."""
    if gamma > len(rates):
        return None
    total, reach = 1.0, 1.0
    for r in rates[:gamma]:
        if r is None or not math.isfinite(r):
            return None
        reach *= r
        total += reach
    return total


def theoretical_speedup(acceptance: float | None, gamma: int, cost_ratio: float | None) -> float | None:
    """Expected speedup over autoregressive decoding for i.i.d. acceptance ``acceptance`` (Leviathan et al.)."""
    if gamma == 0:
        return 1.0
    if acceptance is None or cost_ratio is None:
        return None
    return expected_tokens_iid(min(max(acceptance, 0.0), 1.0), gamma) / (gamma * cost_ratio + 1)


def predicted_speedup(tokens_per_step: float | None, gamma: int, cost_ratio: float | None,
                      verify_cost_ratio: float | None) -> float | None:
    """tokens per step / (γc + r): the speedup the run's own measured tokens per step and per-forward costs predict
    (c: draft forward / target forward; r: the speculative target forward of γ + 1 tokens / one target forward),
    leaving out only what both loops share or neither model's forward costs (prefill, verify step, bookkeeping).
    None at γ = 0 or when a figure is missing."""
    if not gamma or tokens_per_step is None or cost_ratio is None or verify_cost_ratio is None:
        return None
    return tokens_per_step / (gamma * cost_ratio + verify_cost_ratio)


def expected_tokens_tree(tree, accept: Sequence[float]) -> float:
    """Expected tokens per step (the emitted token included) of a token tree ``tree`` (a
    :class:`~pipeline.tree_shape.TokenTree` of N nodes) under per-node acceptance ``accept`` (N floats in [0, 1]).

    The model. accept[n] is the probability that the verify step accepts node n given that it tests it: its parent
    was reached (accepted, or the root) and its earlier siblings were rejected; the verify step tries a node's
    children in order and follows the first it accepts (pipeline/samplers/tree.py). Assumptions: these conditional
    probabilities are fixed numbers per node (they depend on the node's place in the tree, not on the text: the
    mean over steps, as Sequoia's positional acceptance vector takes them), and a node's test depends on the path
    only through reaching it. Then

        P(reach n) = P(reach parent(n)) * Π_{s earlier sibling of n} (1 - accept[s]) * accept[n]  (P(root) = 1)
        E[tokens per step] = 1 + Σ_n P(reach n)

    For a chain of γ nodes each accepted with probability a this is (1 - a^(γ+1)) / (1 - a)
    (:func:`expected_tokens_iid`). With deterministic children x_1, x_2, ... of a node where the target's
    distribution is p, accept[k] = p(x_k) / (1 - Σ_{j<k} p(x_j)) (the verify step renormalises p after each
    rejection), so the node's children are accepted with total probability Σ_k p(x_k). O(N)."""
    if len(accept) != tree.n_nodes:
        raise ValueError(f"need one acceptance per node: {len(accept)} for a tree of {tree.n_nodes}")
    if any(not 0.0 <= a <= 1.0 for a in accept):
        raise ValueError(f"per-node acceptance must lie in [0, 1]; got {list(accept)}")
    reach = [0.0] * tree.n_nodes
    for position, kids in enumerate(tree.children):
        left = 1.0 if position == 0 else reach[position - 1]      # P(this position reached, no child accepted yet)
        for n in kids:
            reach[n] = left * accept[n]
            left *= 1.0 - accept[n]
    return 1.0 + sum(reach)


def rank_acceptance(tree, by_rank: Sequence[float]) -> list[float]:
    """Per-node acceptance [N] for :func:`expected_tokens_tree` from per-rank rates: by_rank[k] is the (k+1)-th
    child's acceptance once its earlier siblings were rejected, at any depth (Sequoia's positional acceptance
    vector); a rank past ``by_rank`` is never accepted."""
    rank = [0] * tree.n_nodes
    for kids in tree.children:
        for k, n in enumerate(kids):
            rank[n] = k
    return [float(by_rank[k]) if k < len(by_rank) else 0.0 for k in rank]


def tree_speedup(tree, accept: Sequence[float], cost_ratio: float, verify_cost_ratio: float | None = None,
                 token_cost: float = 0.0, draft_forwards: int | None = None) -> float:
    """Predicted speedup over autoregressive decoding of a token tree: :func:`expected_tokens_tree` over the cost
    of a step in target forwards of one token,

        E[tokens per step] / (F c + r)   F = draft_forwards (default the tree's depth D: a draft model reads one
                                         level per forward; 0 for a drafter without a model), c = cost_ratio
                                         r = verify_cost_ratio, the target forward over the root and N nodes in
                                         target steps (measured: pipeline/paired.py), else 1 + token_cost * N

    token_cost β is what one more scored token adds to a target forward (0: the forward is bound by reading the
    weights, Leviathan et al.'s assumption; a CPU or a large batch makes it positive). Besides the model of
    :func:`expected_tokens_tree` it leaves out what both loops share (prefill, the verify step's own time,
    bookkeeping) and a drafter's host work. For a chain with β = 0 and F = γ it is :func:`theoretical_speedup`."""
    forwards = tree.depth if draft_forwards is None else draft_forwards
    if cost_ratio < 0 or token_cost < 0 or forwards < 0:
        raise ValueError(f"costs must be >= 0; got c={cost_ratio}, β={token_cost}, F={forwards}")
    r = 1.0 + token_cost * tree.n_nodes if verify_cost_ratio is None else verify_cost_ratio
    return expected_tokens_tree(tree, accept) / (forwards * cost_ratio + r)


def iid_alpha(histogram: list[int] | None) -> float | None:
    """Per-token acceptance probability α of Leviathan et al.'s i.i.d. model, estimated by maximum likelihood
    from the histogram of accepted counts of full-γ steps: each step gives k accepted tokens and, if k < γ, one
    rejection, so α = accepted / (accepted + rejections). (accepted / drafted is not α: it undercounts, since
    positions after a rejection are never tried.)"""
    if not histogram:
        return None
    accepted = sum(k * n for k, n in enumerate(histogram))
    rejections = sum(histogram[:-1])
    return accepted / (accepted + rejections) if accepted + rejections else None


def position_acceptance(histogram: list[int] | None) -> list[float | None] | None:
    """[γ+1] counts of steps accepting k tokens -> [γ] rates P(accepted > i | accepted >= i) (None: never reached)."""
    if not histogram:
        return None
    rates = []
    for i in range(len(histogram) - 1):
        reached = sum(histogram[i:])
        rates.append(sum(histogram[i + 1:]) / reached if reached else None)
    return rates
