"""How the report reads per-position acceptance back from the runs table. The formulas themselves (expected
tokens per step, i.i.d. or per position; theoretical speedup) live in pipeline/objectives.py.
"""

from __future__ import annotations

import json
import math


def parse_rates(value) -> list[float | None] | None:
    """``position_acceptance`` as the table stores it (JSON text, a list, or missing) -> a list or None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        value = json.loads(value)
    return list(value) if value else None
