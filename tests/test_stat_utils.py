"""tests/stat_utils.py, the chi-square test every sampler test uses: where pooling leaves one cell it never passes
silently. A law with all but a sliver of its mass in one cell is tested exactly on the samples outside that cell;
too few samples for any test is an error that says so."""

from __future__ import annotations

import numpy as np
import pytest
from stat_utils import TooFewCells, assert_fits, chisquare_pvalue, outside_pvalue


def test_one_cell_after_pooling_is_an_error_not_p_1():
    law = np.full(100, 0.01)                     # 20 samples over 100 cells: every expected count 0.2
    observed = np.zeros(100)
    observed[:20] = 1
    with pytest.raises(TooFewCells, match="pooling cells of expected count < 5 left 1 cell of 20 samples"):
        chisquare_pvalue(observed, law)
    with pytest.raises(TooFewCells, match="draw more samples"):
        assert_fits(observed, law, "too few samples")


def test_a_point_mass_is_tested_exactly():
    law = np.array([0.0, 0.0, 1.0])
    assert assert_fits(np.array([0, 0, 20_000]), law, "all accepted") == 1.0
    with pytest.raises(AssertionError, match="observed samples in zero-probability cells"):
        assert_fits(np.array([0, 1, 19_999]), law, "one rejected")


def test_a_sliver_outside_the_main_cell_is_tested_on_its_samples():
    law = np.array([1.6e-4, 0.0, 1 - 1.6e-4])   # 3.2 samples expected outside the main cell in 20000
    with pytest.raises(TooFewCells):
        chisquare_pvalue(np.array([3, 0, 19_997]), law)
    assert assert_fits(np.array([3, 0, 19_997]), law, "as expected") > 0.5
    assert assert_fits(np.array([0, 0, 20_000]), law, "none outside, by chance") > 0.01
    with pytest.raises(AssertionError, match="exact test of the samples outside its main cell p = "):
        assert_fits(np.array([40, 0, 19_960]), law, "twelve times too many outside")
    assert outside_pvalue(np.array([40, 0, 19_960]), law) < 1e-15


def test_rounding_below_a_sample_keeps_a_point_mass_a_point_mass():
    law = np.array([2e-8, 2e-8, 1 - 4e-8])      # float32 closed forms of draft = target: 1 - 4e-8, not 1
    assert assert_fits(np.array([0, 0, 20_000]), law, "draft = target") > 0.99
    with pytest.raises(AssertionError, match="the sampler's distribution is wrong"):
        assert_fits(np.array([5, 0, 19_995]), law, "draft = target, 5 rejected")
