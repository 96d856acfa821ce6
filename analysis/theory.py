"""Expected tokens per verify step from acceptance rates (the corrected or bonus token included).

With draft position i accepted at rate r_i once reached (``metrics.position_acceptance``: P(accepted > i |
accepted >= i)), a step with γ drafts emits 1 + Σ_{k=1..γ} Π_{i<k} r_i tokens on average. With one rate a for
every position (i.i.d., Leviathan et al. 2023) that is (1 - a^(γ+1)) / (1 - a).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence


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


def parse_rates(value) -> list[float | None] | None:
    """``position_acceptance`` as the table stores it (JSON text, a list, or missing) -> a list or None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        value = json.loads(value)
    return list(value) if value else None
