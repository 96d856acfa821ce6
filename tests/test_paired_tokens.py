"""`python -m pipeline.analysis.paired_tokens`: two settings' tokens per step compared prompt by prompt (docs/trees.md),
on results files written in the real schema with counts chosen so the answer is known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.analysis import paired_tokens
from pipeline.errors import SpecsweepError
from pipeline.result import make_result, write_result


def result(counts: dict[str, tuple[int, int]], seed: int = 0, token_ids: dict[str, list[int]] | None = None) -> dict:
    """A `specsweep run` results file whose samples emitted ``counts[id] = (new tokens, verify steps)`` (and, where
    given, the tokens ``token_ids[id]``)."""
    samples = [{"id": key, "text": "x", "new_tokens": tokens, "verify_steps": steps,
                **({"token_ids": token_ids[key]} if token_ids else {})}
               for key, (tokens, steps) in counts.items()]
    tokens, steps = sum(t for t, _ in counts.values()), sum(s for _, s in counts.values())
    return make_result({"task": "cnn_dailymail", "gamma": 4, "seed": seed}, {"device": "cpu"}, {},
                       {"new_tokens": tokens, "verify_steps": steps, "mean_accepted_tokens": tokens / max(steps, 1)},
                       {}, {}, samples)


def test_the_difference_is_the_mean_over_prompts_with_a_bootstrap_interval_around_it():
    rng = np.random.default_rng(1)
    n = 200
    b_steps = rng.integers(10, 30, n)
    a_extra = rng.normal(0.3, 1.0, n)          # A − B per prompt, in tokens per step
    b = {f"p{i}": (int(2 * s), int(s)) for i, s in enumerate(b_steps)}
    a = {f"p{i}": (int(np.rint((2 + a_extra[i]) * 1000)), 1000) for i in range(n)}
    r = paired_tokens.compare([result(a)], [result(b)])
    truth = np.array([a[k][0] / a[k][1] - 2.0 for k in sorted(a)])
    assert r["prompts"] == n and r["mean_difference"] == pytest.approx(truth.mean())
    half = 1.96 * truth.std(ddof=1) / math.sqrt(n)                   # the normal interval of a mean of 200
    assert r["ci_low"] == pytest.approx(truth.mean() - half, abs=0.2 * half)
    assert r["ci_high"] == pytest.approx(truth.mean() + half, abs=0.2 * half)
    assert r["a_ahead"] + r["a_behind"] + r["equal"] == n and r["a_ahead"] == int((truth > 0).sum())
    assert r["b_tokens_per_step"] == pytest.approx(2.0)
    assert paired_tokens.compare([result(a)], [result(b)]) == r      # seeded: the same interval every time


def test_equal_sides_give_a_point_interval_and_swapped_sides_swap_the_sign():
    b = {"p0": (10, 5), "p1": (30, 10), "p2": (8, 8)}
    a = {"p0": (12, 4), "p1": (35, 10), "p2": (12, 8)}              # +1.0, +0.5, +0.5 tokens per step
    r = paired_tokens.compare([result(a)], [result(b)])
    assert r["mean_difference"] == pytest.approx(2 / 3)
    assert 0.5 <= r["ci_low"] < r["mean_difference"] < r["ci_high"] <= 1.0     # resampled means of 0.5s and 1.0s
    same = paired_tokens.compare([result(b)], [result(b)])
    assert (same["mean_difference"], same["ci_low"], same["ci_high"], same["equal"]) == (0.0, 0.0, 0.0, 3)
    swapped = paired_tokens.compare([result(b)], [result(a)])
    assert swapped["mean_difference"] == pytest.approx(-r["mean_difference"])
    assert (swapped["ci_low"], swapped["ci_high"]) == pytest.approx((-r["ci_high"], -r["ci_low"]))


def test_seeds_are_pooled_per_prompt_or_averaged():
    # prompt p0: seed 0 emits 10 tokens in 10 steps, seed 1 30 in 10 (pooled 2.0, mean of ratios 2.0);
    # prompt p1: seed 0 4 in 2, seed 1 2 in 2 (pooled 1.5, mean of ratios 1.5); make the two ways differ on p2:
    # seed 0 9 in 3, seed 1 1 in 1 (pooled 2.5, mean of ratios 2.0)
    a = [result({"p0": (10, 10), "p1": (4, 2), "p2": (9, 3)}, seed=0),
         result({"p0": (30, 10), "p1": (2, 2), "p2": (1, 1)}, seed=1)]
    b = [result({"p0": (1, 1), "p1": (1, 1), "p2": (1, 1)}, seed=s) for s in (0, 1)]
    pooled = paired_tokens.per_prompt(a, "pooled", "A")
    mean = paired_tokens.per_prompt(a, "mean", "A")
    assert pooled == pytest.approx({"p0": 2.0, "p1": 1.5, "p2": 2.5})
    assert mean == pytest.approx({"p0": 2.0, "p1": 1.5, "p2": 2.0})
    assert paired_tokens.compare(a, b, "pooled")["mean_difference"] == pytest.approx(1.0)
    assert paired_tokens.compare(a, b, "mean")["mean_difference"] == pytest.approx(5.5 / 3 - 1)


def test_unpaired_inputs_are_refused():
    a = result({"p0": (4, 2), "p1": (4, 2)})
    with pytest.raises(SpecsweepError, match="other seeds"):
        paired_tokens.compare([a], [result({"p0": (4, 2), "p1": (4, 2)}, seed=1)])
    with pytest.raises(SpecsweepError, match="other prompts"):
        paired_tokens.compare([a], [result({"p0": (4, 2), "p9": (4, 2)})])
    with pytest.raises(SpecsweepError, match="different prompts"):
        paired_tokens.compare([a, result({"p0": (4, 2)}, seed=1)], [a, result({"p0": (4, 2), "p1": (1, 1)}, seed=1)])
    with pytest.raises(SpecsweepError, match="no verify step"):
        paired_tokens.compare([result({"p0": (4, 0)})], [result({"p0": (4, 2)})])


def test_prompts_with_the_same_tokens_are_counted_under_every_seed():
    counts = {"p0": (4, 2), "p1": (4, 2), "p2": (4, 2)}
    a = [result(counts, 0, {"p0": [1, 2], "p1": [3], "p2": [5]}), result(counts, 1, {"p0": [1], "p1": [3], "p2": [6]})]
    b = [result(counts, 1, {"p0": [1], "p1": [4], "p2": [6]}), result(counts, 0, {"p0": [1, 2], "p1": [3], "p2": [7]})]
    # paired by seed, not by position: p0 is the same under both seeds, p1 differs under seed 1, p2 under both
    assert paired_tokens.compare(a, b)["same_tokens"] == 1
    assert paired_tokens.compare(a, a)["same_tokens"] == 3
    assert paired_tokens.compare([result(counts)], [result(counts)])["same_tokens"] is None     # no token ids


def test_the_command_prints_one_line_and_writes_json(tmp_path, capsys):
    for name, counts in (("a0", {"p0": (6, 2), "p1": (9, 3)}), ("b0", {"p0": (4, 2), "p1": (6, 3)})):
        write_result(tmp_path / f"{name}.json", result(counts))
    out = tmp_path / "pair.json"
    assert paired_tokens.main([str(tmp_path / "a0.json"), str(tmp_path / "b0.json"), "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert line.startswith("A 3.000 tokens per step, B 2.000; A − B per prompt (pooled over seeds [0]): +1.000 "
                           "[+1.000, +1.000]") and line.count("\n") == 1
    written = json.loads(out.read_text())
    assert written["mean_difference"] == 1.0
    # what it is and where it was made, as every published file says
    assert "paired_tokens" in written["published"] and written["date"] and written["version"]
    assert written["machine"]["cores"] >= 1 and "commit" in written
    assert written["sides"]["a"]["files"] == [str(tmp_path / "a0.json")]
    assert written["sides"]["b"]["settings"]["gamma"] == 4 and written["sides"]["b"]["seeds"] == [0]
    (tmp_path / "other.json").write_text("{}")
    assert paired_tokens.main([str(tmp_path / "a0.json"), str(tmp_path / "other.json")]) == 2
    assert "is not a specsweep run results file" in capsys.readouterr().err
