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
