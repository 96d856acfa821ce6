"""Where a decode's time and memory go: named phases timed on the device's clock, and the peak memory probe."""

from __future__ import annotations

import resource
import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Time spent in named phases: CUDA events on a GPU (no syncs until ``totals``), perf_counter on CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = str(device).startswith("cuda")
        self.counts: dict[str, int] = defaultdict(int)
        self._cpu: dict[str, float] = defaultdict(float)
        self._events: dict[str, list] = defaultdict(list)
        self._open: dict[str, object] = {}

    def start(self, name: str) -> None:
        self.counts[name] += 1
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._open[name] = event
        else:
            self._open[name] = time.perf_counter()

    def stop(self, name: str) -> None:
        begun = self._open.pop(name)
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events[name].append((begun, end))
        else:
            self._cpu[name] += time.perf_counter() - begun

    @contextmanager
    def phase(self, name: str):
        self.start(name)
        yield
        self.stop(name)

    def totals(self) -> dict[str, float]:
        """Seconds per phase. On CUDA this synchronises once."""
        if not self.cuda:
            return dict(self._cpu)
        torch.cuda.synchronize()
        return {k: sum(s.elapsed_time(e) for s, e in v) / 1e3 for k, v in self._events.items()}


def reset_peak_memory(device: torch.device) -> None:
    """Start counting peak memory for :func:`peak_memory_mb` (on a GPU; a process's peak RSS cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """MiB: the CUDA allocator's peak since reset_peak_memory on a GPU, else the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
