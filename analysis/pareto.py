"""The Pareto front of points that maximise two objectives (speedup and quality)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pareto_mask(xs: Sequence[float], ys: Sequence[float]) -> list[bool]:
    """True for each point no other point dominates, both objectives maximised.

    (x', y') dominates (x, y) when x' >= x and y' >= y and the two differ. Identical points do not dominate each
    other, so all copies of a front point are on the front. A point with a missing or NaN value is never on it.
    O(n log n): sort by x descending and sweep, keeping the best y among strictly larger x."""
    if len(xs) != len(ys):
        raise ValueError(f"pareto_mask: {len(xs)} x values but {len(ys)} y values")
    valid = [i for i in range(len(xs)) if _finite(xs[i]) and _finite(ys[i])]
    order = sorted(valid, key=lambda i: (-xs[i], -ys[i]))
    mask = [False] * len(xs)
    best_y = -math.inf  # the best y among points with a strictly larger x
    k = 0
    while k < len(order):
        j = k
        while j < len(order) and xs[order[j]] == xs[order[k]]:
            j += 1
        group_top = ys[order[k]]  # sorted by y descending within equal x
        for i in order[k:j]:
            mask[i] = ys[i] == group_top and ys[i] > best_y
        best_y = max(best_y, group_top)
        k = j
    return mask


def front_order(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the front's points sorted by x ascending (the order to draw the front as a line)."""
    mask = pareto_mask(xs, ys)
    return sorted((i for i, m in enumerate(mask) if m), key=lambda i: (xs[i], -ys[i]))


def _finite(v) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
