"""Timing helpers shared by the benchmarks: CUDA events on GPU, perf_counter on CPU, medians over repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


def time_calls(fn: Callable[[int], object], device: str, repeats: int, warmup: int = 3) -> list[float]:
    """Seconds per call of ``fn(i)`` for i in range(repeats), after ``warmup`` calls.

    ``fn`` gets the repetition index so callers can rotate inputs (caches must not flatter a kernel).
    On CUDA each call is bracketed by events on the current stream and the device is synchronised once at
    the end; on CPU each call is timed with perf_counter.
    """
    for i in range(warmup):
        fn(i)
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for i in range(repeats):
            starts[i].record()
            fn(i)
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    out = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width table for the terminal."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
