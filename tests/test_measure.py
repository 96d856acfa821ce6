"""The statistics of a paired speed measurement (pipeline/measure.py): the median's order-statistic interval, the
paired ratios, and the rule that flags a measurement."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pipeline import measure


def test_interval_is_the_order_statistics_with_the_binomial_coverage():
    # n = 6: only [min, max] reaches 95 % (coverage 1 - 2 / 64); k = 2 would give 1 - 2 * 7 / 64 = 78 %
    ci = measure.median_ci([5.0, 1.0, 3.0, 2.0, 6.0, 4.0])
    assert (ci.median, ci.low, ci.high, ci.n) == (3.5, 1.0, 6.0, 6)
    assert ci.coverage == pytest.approx(1 - 2 / 64)
    # n = 20: the largest k with 1 - 2 P(Bin(20, 1/2) <= k - 1) >= 0.95 is k = 6 (coverage 95.9 %)
    values = np.arange(1.0, 21.0)[::-1]
    ci = measure.median_ci(values)
    assert (ci.low, ci.high) == (6.0, 15.0)
    assert ci.coverage == pytest.approx(1 - 2 * stats.binom.cdf(5, 20, 0.5)) and ci.coverage >= 0.95
    assert 1 - 2 * stats.binom.cdf(6, 20, 0.5) < 0.95  # k = 7 would not reach it


def test_too_few_values_give_min_max_with_the_coverage_they_really_have():
    ci = measure.median_ci([2.0, 1.0, 3.0])
    assert (ci.low, ci.high) == (1.0, 3.0) and ci.coverage == pytest.approx(0.75)
    one = measure.median_ci([4.0])
    assert (one.low, one.median, one.high, one.coverage) == (4.0, 4.0, 4.0, 0.0)
    with pytest.raises(ValueError):
        measure.median_ci([])
    with pytest.raises(ValueError):
        measure.median_ci([1.0, float("nan")])


def test_interval_covers_the_true_median_at_least_as_often_as_it_claims():
    rng = np.random.default_rng(0)
    true_median = np.log(2.0)  # of an exponential with rate 1
    for n in (6, 11, 30):
        hits, coverage = 0, None
        for _ in range(2000):
            ci = measure.median_ci(rng.exponential(size=n))
            hits += ci.low <= true_median <= ci.high
            coverage = ci.coverage
        # 2000 draws: the hit rate's standard error is about 0.5 %; allow 3 of them below the claim
        assert hits / 2000 >= coverage - 0.015, (n, hits / 2000, coverage)


def test_paired_speedup_is_the_median_of_per_repeat_ratios():
    # repeat 2 is slowed 5x for both loops (a stall between repeats): the ratio is unchanged
    spec_s, ar_s = [1.0, 5.0, 1.0, 1.0, 1.0, 1.0], [2.0, 10.0, 2.0, 2.0, 2.2, 1.8]
    ci, ratios = measure.paired_speedup([100] * 6, spec_s, [100] * 6, ar_s)
    assert ratios == pytest.approx([2.0, 2.0, 2.0, 2.0, 2.2, 1.8])
    assert ci.median == pytest.approx(2.0) and (ci.low, ci.high) == pytest.approx((1.8, 2.2))
    # different token counts: ratios of tokens/s, not of seconds
    _, ratios = measure.paired_speedup([120], [1.0], [60], [1.0])
    assert ratios == [2.0]
    with pytest.raises(ValueError):
        measure.paired_speedup([1, 2], [1.0], [1], [1.0])


def test_flags_a_wide_interval_and_an_implausible_speedup():
    tight = measure.median_ci([1.9, 2.0, 2.0, 2.1, 2.0, 2.05])
    assert measure.flag_reasons(tight, "speedup", predicted=2.2) == []
    wide = measure.median_ci([0.5, 2.0, 2.0, 2.1, 2.0, 3.0])          # one stalled repeat each way
    reasons = measure.flag_reasons(wide, "speedup", predicted=2.2)
    assert len(reasons) == 1 and reasons[0].startswith("spread:")
    # the issue's run: 9.31x measured against a theoretical 0.94x
    issue = measure.median_ci([9.2, 9.3, 9.31, 9.4, 9.35, 9.3])
    reasons = measure.flag_reasons(issue, "speedup", predicted=0.94)
    assert len(reasons) == 1 and reasons[0].startswith("implausible:") and "0.94" in reasons[0]
    low = measure.median_ci([0.45] * 6)                               # and its 0.45x against 2.19x
    assert measure.flag_reasons(low, "speedup", predicted=2.19)[0].startswith("implausible:")


def test_plausibility_bounds_are_inclusive_and_need_a_positive_theory():
    lo, hi = measure.PLAUSIBLE
    at_edges = [measure.median_ci([lo * 2.0] * 3), measure.median_ci([hi * 2.0] * 3)]
    assert all(measure.flag_reasons(ci, "speedup", predicted=2.0) == [] for ci in at_edges)
    assert measure.flag_reasons(measure.median_ci([hi * 2.0 * 1.01] * 3), "speedup", predicted=2.0)
    assert measure.plausibility(2.0, None) is None and measure.plausibility(2.0, 0.0) is None
    assert measure.flag_reasons(measure.median_ci([50.0] * 3), "tokens/s") == []  # no theory: no check


def test_a_measurement_whose_threads_waited_for_a_cpu_is_flagged_as_contended_even_when_tight():
    tight = measure.median_ci([0.70, 0.72, 0.72, 0.73, 0.71, 0.72])     # the contended run of tests/test_paired.py
    assert measure.flag_reasons(tight, "speedup", predicted=0.8, cpu_wait=measure.MAX_CPU_WAIT) == []
    assert measure.flag_reasons(tight, "speedup", predicted=0.8, cpu_wait=None) == []   # unknown: not checked
    reasons = measure.flag_reasons(tight, "speedup", predicted=0.8, cpu_wait=0.37)
    assert len(reasons) == 1 and reasons[0].startswith("contended:") and "37%" in reasons[0]
    assert measure.flag_reasons(tight, "tokens/s", cpu_wait=0.37, max_cpu_wait=0.5) == []


def test_spread_reports_quartiles_and_relative_iqr():
    s = measure.spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s["median"], s["min"], s["max"], s["q25"], s["q75"]) == (3.0, 1.0, 5.0, 2.0, 4.0)
    assert s["relative_iqr"] == pytest.approx(2 / 3)
