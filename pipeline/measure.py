"""Statistics of a repeated, paired speed measurement, and the rule that flags a measurement not to trust.

A run times its speculative loop (A) and the autoregressive loop of the same engine (B, γ = 0) on the same
samples, interleaved in R repeats. Per repeat r:

    ratio_r = (A's new tokens / A's seconds) / (B's new tokens / B's seconds)

Its speedup is the median of the R ratios, with a distribution-free confidence interval for that median from
order statistics: [x_(k), x_(R-k+1)] of the sorted ratios covers the true median with probability
1 - 2 P(Bin(R, 1/2) <= k - 1) (no assumption on the ratios' distribution; they need only be independent draws).
The largest k that reaches the wanted confidence is used; with too few repeats for it (R < 6 at 95 %) the
interval is [min, max] and the record says the coverage it actually has.

A measurement is flagged (see :func:`flag_reasons`) when
  - its interval is too wide: (hi - lo) / median > ``max_relative_width`` (the repeats disagree: the machine's
    load changed under it, or a stall landed in some repeats), or
  - measured / predicted speedup lies outside ``plausible``: the prediction comes from the run's own tokens per
    verify step and per-forward costs, as tokens per step / (γc + r) (pipeline/objectives.py: Leviathan et al.'s
    speedup with the measured tokens per step in place of the i.i.d. expectation (1 - α^(γ+1)) / (1 - α), which
    overstates it when outputs end at EOS after a few tokens, and with r, the measured cost of the γ + 1-token
    target forward in target steps, in place of their 1); a measured speedup far from it is more likely a broken
    timing than a discovery. The bounds are wide on purpose: the formula ignores the prompt's prefill, the verify
    step and per-step overheads (a loop that takes fewer steps saves overhead the formula does not see), or
  - the run's own threads spent more than ``max_cpu_wait`` of the time they were ready to run waiting for a CPU
    (the Linux scheduler's run-queue wait, pipeline.env_info.LoadProbe): other processes held the cores it
    needed, so its timings are those of a contended machine. Such contention need not widen the interval (it can
    slow both loops alike for the whole run) yet it shifts the ratio, because the two loops do not use the CPU
    alike: measured beside CPU-burning processes, the tiny test pair's paired speedup moved from 0.62 to 0.72
    with both intervals tight. Where the kernel gives no scheduler statistics this check is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
MAX_RELATIVE_WIDTH = 1.0           # flag when the interval is wider than its median (RunConfig.max_spread)
PLAUSIBLE = (1 / 3, 3.0)           # measured / predicted speedup outside this is flagged
MAX_CPU_WAIT = 0.1                 # flag when the run's threads waited for a CPU > 10 % of their ready time


@dataclass(frozen=True)
class MedianCI:
    """A median and its order-statistic confidence interval.

    median, low, high   float (same unit as the values)
    coverage            float in [0, 1]: the interval's actual coverage (>= the wanted confidence when enough
                        values; 1 - 2^(1-n) for [min, max] otherwise)
    n                   int: number of values
    """

    median: float
    low: float
    high: float
    coverage: float
    n: int

    @property
    def relative_width(self) -> float:
        """(high - low) / median; inf for a median of 0."""
        return (self.high - self.low) / self.median if self.median else math.inf

    def to_dict(self) -> dict:
        return {"median": self.median, "ci_low": self.low, "ci_high": self.high, "ci_coverage": self.coverage,
                "n": self.n, "relative_width": self.relative_width}


def median_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> MedianCI:
    """The median of ``values`` (float [n], n >= 1, all finite) and its order-statistic confidence interval."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    if n == 0 or not np.isfinite(x).all():
        raise ValueError(f"median_ci needs at least one value, all finite; got {list(values)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    # coverage of [x_(k), x_(n-k+1)] for k = 1 .. ceil(n/2): decreasing in k
    ks = np.arange(1, (n + 1) // 2 + 1)
    coverage = 1.0 - 2.0 * np.array([_binomial_half_cdf(int(k) - 1, n) for k in ks])
    ok = ks[coverage >= confidence]
    k = int(ok.max()) if ok.size else 1
    return MedianCI(median=float(np.median(x)), low=float(x[k - 1]), high=float(x[n - k]),
                    coverage=float(coverage[k - 1]), n=int(n))


def _binomial_half_cdf(k: int, n: int) -> float:
    """P(Bin(n, 1/2) <= k), exactly (integer sums; scipy.stats would cost every run ~0.7 s of import time)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def rates(tokens: Sequence[int], seconds: Sequence[float]) -> np.ndarray:
    """Tokens per second of each repeat: int [R] / float [R] -> float64 [R]."""
    t, s = np.asarray(tokens, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if t.shape != s.shape or t.ndim != 1 or (s <= 0).any():
        raise ValueError(f"rates needs equal-length lists of tokens and positive seconds; got {t.shape}, {s.shape}")
    return t / s


def paired_speedup(spec_tokens: Sequence[int], spec_seconds: Sequence[float], ar_tokens: Sequence[int],
                   ar_seconds: Sequence[float], confidence: float = CONFIDENCE) -> tuple[MedianCI, list[float]]:
    """Median of per-repeat ratios of tokens/s (speculative over autoregressive, each [R]) with its interval;
    also returns the R ratios."""
    ratios = rates(spec_tokens, spec_seconds) / rates(ar_tokens, ar_seconds)
    return median_ci(ratios, confidence), ratios.tolist()


def spread(values: Sequence[float]) -> dict:
    """Median, min, max, quartiles and relative IQR ((q75 - q25) / median) of float [n] values."""
    x = np.asarray(values, dtype=np.float64)
    q25, med, q75 = np.percentile(x, [25, 50, 75])
    return {"median": float(med), "min": float(x.min()), "max": float(x.max()), "q25": float(q25),
            "q75": float(q75), "relative_iqr": float((q75 - q25) / med) if med else math.inf}


def plausibility(measured: float | None, predicted: float | None) -> float | None:
    """measured / predicted speedup, or None when either is missing or the prediction is not positive."""
    if measured is None or predicted is None or not predicted > 0 or not math.isfinite(measured):
        return None
    return measured / predicted


def flag_reasons(interval: MedianCI, what: str, predicted: float | None = None,
                 max_relative_width: float = MAX_RELATIVE_WIDTH,
                 plausible: tuple[float, float] | None = None, cpu_wait: float | None = None,
                 max_cpu_wait: float = MAX_CPU_WAIT) -> list[str]:
    """Why a measurement should not be trusted (empty: no reason found).

    interval    the median and interval of the measured figure (a speedup, or tokens/s for γ = 0)
    what        its name in the message ("speedup", "tokens/s")
    predicted   the speedup the run's own tokens per step and forward costs predict (None: no plausibility check)
    plausible   the range of measured / predicted that passes (None: PLAUSIBLE, read when called)
    cpu_wait    the part of its threads' ready time the measurement spent waiting for a CPU, in [0, 1]
                (None: unknown, no contention check)
    """
    plausible = PLAUSIBLE if plausible is None else plausible
    reasons = []
    if interval.relative_width > max_relative_width:
        reasons.append(f"spread: the repeats disagree, {what} {interval.median:.3g} with a "
                       f"{interval.coverage:.0%} interval [{interval.low:.3g}, {interval.high:.3g}] wider than "
                       f"{max_relative_width:.3g} x its median")
    ratio = plausibility(interval.median, predicted)
    if ratio is not None and not plausible[0] <= ratio <= plausible[1]:
        reasons.append(f"implausible: measured {what} {interval.median:.3g}x is {ratio:.2f} times the {predicted:.3g}x "
                       f"that the run's own tokens per step and forward costs predict (plausible: "
                       f"{plausible[0]:.2f} to {plausible[1]:.2f} times)")
    if cpu_wait is not None and cpu_wait > max_cpu_wait:
        reasons.append(f"contended: the run's threads waited for a CPU {cpu_wait:.0%} of the time they were ready to "
                       f"run (more than {max_cpu_wait:.0%}): other processes held the cores it needed, so its "
                       f"{what} is that of a busy machine")
    return reasons
