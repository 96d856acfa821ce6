"""A static forward's decoding steps through torch.compile: on CUDA under CUDA graphs, so a step launches from graphs.

Why. On a GPU the engine's eager forward is launch-bound: a one-token forward of the Qwen2.5-Coder 1.5B shape reached
a few percent of its memory roofline (docs/gpu.md), because each of its hundreds of small kernels is launched from
Python. gpt-fast answers with ``torch.compile(mode="reduce-overhead")``: inductor fuses the small operations and
CUDA graphs replay the whole forward in one launch. This module does the same for the static forwards that have a
fixed-shape form (``forward_at``: the Llama family, llama.py).

What it compiles. Only decoding steps of at most :data:`MAX_WIDTH` new tokens in a batch without holes: a draft's
one-token steps and a chain's γ + 1-token verify steps, the shapes that repeat. A prompt's prefill (the first forward
of a generation), rows with padding or holes and token trees run the eager forward, on the same cache. A compiled step:

  - attends over the whole cache, positions after each query masked, so its shapes do not change as the sequence
    grows (one graph per batch size, width and cache capacity; capacities are whole blocks of 512 positions);
  - takes its positions as a slice of a device table of 0 .. capacity - 1 (no host-to-device copy, no sync);
  - writes its keys and values with ``index_copy_`` into the cache buffers, which keep their address across
    generations (base.StaticForward.allocate reuses them) and are marked static for CUDA graphs.

On a CPU the same code runs through inductor (no graphs) and gives the eager forward's tokens
(tests/test_compiled_forward.py). The time spent compiling is recorded (``compile_s``, by the run's
``resolved.compiled``), apart from the timed repeats, which start after warm-up.
"""

from __future__ import annotations

import time

import torch

MAX_WIDTH = 16
"""The widest step that runs compiled (tokens per row); wider ones (a prompt's prefill) run eagerly."""
RECOMPILE_LIMIT = 64
"""Graphs dynamo keeps per compiled function (its default, 8, is too few for a pair: see CompiledSteps)."""


class CompiledSteps:
    """``forward``'s fixed-shape steps (``forward.forward_at``) through ``torch.compile(mode=mode)``.

    forward  a StaticForward whose family has ``forward_at(input_ids [B, q], at int64 [q], last) -> logits``
    mode     torch.compile's mode: one of pipeline/config.py's COMPILE_MODES but "off"
    """

    def __init__(self, forward, mode: str) -> None:
        # one compiled graph per (model, batch, width, capacity, last): a pair with its γ = 0 loop needs more than
        # dynamo's default of 8 per function (the target's and the draft's steps share forward_at's code)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                               4 * RECOMPILE_LIMIT)
        self.forward = forward
        self.mode = mode
        self._graphs = mode in ("reduce-overhead", "max-autotune")     # CUDA graphs, where the device is a GPU
        model = getattr(forward, "model", None)
        if model is not None:       # the weights keep their address: graphs read them in place (no copy per replay)
            mark_static(*model.parameters(), *model.buffers())
        self._step = torch.compile(forward.forward_at, mode=None if mode == "default" else mode, fullgraph=True,
                                   dynamic=False)
        self._positions: torch.Tensor | None = None   # int64 [capacity]: 0 .. capacity - 1 on the cache's device
        self._seen: set[tuple] = set()
        self.compile_s = 0.0
        """Seconds spent in steps of a shape not seen before (its compile, or its graph's capture, and one run)."""

    def takes(self, length: int, q: int, attend, positions) -> bool:
        """Whether a step of ``q`` new tokens after ``length`` cached ones, with this attention and these position ids,
        runs compiled: a decoding step, not a prompt's prefill (``length`` 0: every prompt length would be a graph)."""
        return length > 0 and q <= MAX_WIDTH and attend is None and positions is None

    def __call__(self, input_ids: torch.Tensor, length: int, last: int) -> torch.Tensor:
        """input_ids int64 [B, q] at cache positions [length, length + q) -> logits [B, q or last, V]."""
        keys = self.forward.keys
        if self._positions is None or self._positions.shape[0] != keys.shape[3] \
                or self._positions.device != keys.device:
            self._positions = torch.arange(keys.shape[3], device=keys.device)
        at = self._positions[length: length + input_ids.shape[1]]
        shape = (*input_ids.shape, keys.shape[3], last, keys.data_ptr())
        if shape in self._seen:
            return self._own(self._step(input_ids, at, last))
        start = time.perf_counter()
        logits = self._step(input_ids, at, last)
        if logits.is_cuda:
            torch.cuda.synchronize(logits.device)    # once per new shape: the compile's cost, not a step's
        self.compile_s += time.perf_counter() - start
        self._seen.add(shape)
        return self._own(logits)

    def _own(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits the caller may keep: a graph's output is overwritten by its next replay (a draft's γ one-token steps
        replay one graph), so under CUDA graphs it is copied out, as gpt-fast copies its tokens (a device copy)."""
        return logits.clone() if self._graphs and logits.is_cuda else logits

    def record(self) -> dict:
        """What a run records of it: the mode, the seconds spent compiling, the shapes compiled."""
        return {"mode": self.mode, "compile_s": round(self.compile_s, 3), "shapes": len(self._seen)}


def mark_static(*buffers: torch.Tensor) -> None:
    """Tell torch.compile these tensors keep their address (a cache, a RoPE table): CUDA graphs read them in place
    instead of copying them into the graph's own inputs before every replay."""
    for buffer in buffers:
        torch._dynamo.mark_static_address(buffer)
