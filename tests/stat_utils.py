"""Statistics helpers for the sampler tests: chi-square goodness of fit with pooled sparse cells.

Every chi-square test in the suite uses ``assert_fits``, which applies one Bonferroni-corrected threshold:
a family-wise false-alarm rate of FAMILY_ALPHA spread over at most MAX_TESTS tests. Seeds are fixed, so a
pass or a fail is deterministic; the negative controls in test_sampler_exactness.py show the same test
rejects wrong samplers. A chi-square needs two cells after pooling: with one it raises (TooFewCells) rather
than pass, and ``assert_fits`` then tests a law with all but a sliver of its mass in one cell exactly, on the
samples outside that cell (tests/test_stat_utils.py).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

FAMILY_ALPHA = 0.01
MAX_TESTS = 200
THRESHOLD = FAMILY_ALPHA / MAX_TESTS
MIN_EXPECTED = 5.0


def pooled(observed: np.ndarray, expected_prob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool cells with expected count < MIN_EXPECTED into one cell (merged into the smallest remaining cell
    if the pool itself is still too small). Returns (observed, expected) counts with equal totals."""
    observed = np.asarray(observed, dtype=np.float64).ravel()
    expected = np.asarray(expected_prob, dtype=np.float64).ravel() * observed.sum()
    small = expected < MIN_EXPECTED
    if observed[expected == 0].sum() > 0:
        bad = np.flatnonzero((expected == 0) & (observed > 0))
        raise AssertionError(f"observed samples in zero-probability cells {bad[:10].tolist()}")
    obs, exp = list(observed[~small]), list(expected[~small])
    if small.any():
        pool_obs, pool_exp = observed[small].sum(), expected[small].sum()
        if pool_exp >= MIN_EXPECTED or not exp:
            obs.append(pool_obs)
            exp.append(pool_exp)
        else:
            i = int(np.argmin(exp))
            obs[i] += pool_obs
            exp[i] += pool_exp
    return np.array(obs), np.array(exp)


class TooFewCells(AssertionError):
    """Pooling left fewer than 2 cells: a chi-square of one cell tests nothing."""


def chisquare_pvalue(observed: np.ndarray, expected_prob: np.ndarray) -> float:
    """The chi-square p-value of ``observed`` counts against the law ``expected_prob`` (cells pooled as
    :func:`pooled` does). Raises :class:`TooFewCells` where pooling leaves fewer than 2 cells."""
    obs, exp = pooled(observed, expected_prob)
    if len(obs) < 2:
        n, cells = int(obs.sum()), int((np.asarray(expected_prob).ravel() > 0).sum())
        raise TooFewCells(f"chi-square undefined: pooling cells of expected count < {MIN_EXPECTED:g} left "
                          f"{len(obs)} cell of {n} samples over {cells} cells of positive probability: draw more "
                          "samples, or test a law with all but a sliver of its mass in one cell with assert_fits")
    exp = exp * (obs.sum() / exp.sum())  # exact totals despite float rounding
    return float(stats.chisquare(obs, exp).pvalue)


def outside_pvalue(observed: np.ndarray, expected_prob: np.ndarray) -> float:
    """The two-sided exact binomial p-value of the samples outside the law's largest cell: what counts can test of a
    law with all but a sliver of its mass in one cell (e.g. the accepted count where draft = target, or where their
    supports are disjoint); 0 or 1 where the law is a point mass."""
    obs = np.asarray(observed, dtype=np.float64).ravel()
    law = np.asarray(expected_prob, dtype=np.float64).ravel()
    main = int(law.argmax())
    n, outside = int(obs.sum()), int(obs.sum() - obs[main])
    rest = float(1.0 - law[main] / law.sum())
    if rest <= 0.0:
        return float(outside == 0)
    return float(stats.binomtest(outside, n, rest).pvalue)


def assert_fits(observed: np.ndarray, expected_prob: np.ndarray, what: str) -> float:
    """Fail unless ``observed`` counts fit the law ``expected_prob``: the chi-square test, or where pooling leaves
    one cell because one cell holds all but less than MIN_EXPECTED samples' worth of mass, the exact test of the
    samples outside it (:func:`outside_pvalue`). Too few samples for either raises :class:`TooFewCells`."""
    try:
        p, test = chisquare_pvalue(observed, expected_prob), "chi-square"
    except TooFewCells:
        law = np.asarray(expected_prob, dtype=np.float64).ravel()
        if law.max() / law.sum() * np.sum(observed) < MIN_EXPECTED:
            raise
        p, test = outside_pvalue(observed, expected_prob), "exact test of the samples outside its main cell"
    assert p > THRESHOLD, f"{what}: {test} p = {p:.3g} <= {THRESHOLD:.3g}; the sampler's distribution is wrong"
    return p


def counts(values: np.ndarray, n_cells: int) -> np.ndarray:
    return np.bincount(np.asarray(values).ravel(), minlength=n_cells)[:n_cells]


def target_laws(target, prompt, temperature: float, n: int):
    """The target's law of its first ``n`` (2 or 3) sampled tokens after ``prompt`` int64 [1, L], by enumeration:
    (marginals, each float64 [V], and the joint of the first two, float64 [V, V])."""
    import torch

    V = target.config.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(target(prompt).logits[0, -1].double() / temperature, -1)
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = torch.softmax(target(seqs).logits[:, -1].double() / temperature, -1)              # [V, V]: t1 -> t2
        joint = p1[:, None] * p2
        out = [p1, joint.sum(0)]
        if n > 2:
            pairs = torch.cat([seqs.repeat_interleave(V, 0), torch.arange(V).repeat(V)[:, None]], 1)
            p3 = torch.cat([torch.softmax(target(chunk).logits[:, -1].double() / temperature, -1)
                            for chunk in pairs.split(2048)])                                  # [V*V, V]
            out.append((joint.reshape(-1, 1) * p3).sum(0))
    return [p.numpy() for p in out], joint.numpy()


def target_marginals(target, prompt, temperature: float, n: int):
    """The target's marginal law of its first ``n`` (<= 3) sampled tokens after ``prompt``, each float64 [V]."""
    return target_laws(target, prompt, temperature, n)[0]
