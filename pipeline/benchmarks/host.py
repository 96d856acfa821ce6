"""`specsweep bench host`: the host side of one verify call of every kernel sampler (exact, sigmoid, greedy, tree).

What one eager call of a kernel sampler (pipeline/samplers/cupy_backend.py) costs the Python thread that makes it:
checks, buffers, uniforms, argument packing and the launches, until the call returns (the kernels themselves run
asynchronously on a GPU and are not waited for). Per (B, γ, V, dtype) and sampler:

  host_us        µs per call: ``calls`` calls back to back per block, the block's perf_counter time / calls, in
                 ``repeats`` blocks; the samplers take turns block by block (the order rotating every repeat), so a
                 load that drifts falls on all of them; the median over the blocks with its order-statistic interval
                 (pipeline.measure.median_ci, as docs/measurement.md reports intervals)
  dispatches     torch operator dispatches per call (aten ops, counted by a TorchDispatchMode on one warm call), and
                 which ops they are; the same count on any device
  python_bytes   Python-level memory per call (tracemalloc, its own pass, never during timing): ``peak``, the most
                 the call held above what was held before it, and ``retained``, the growth per call over
                 ``calls`` calls (what stays allocated: a cache that grows every call shows here)
  launches       kernel launches per call (where the launcher records them)

Where the kernels run:
  cpu   a launcher that records each launch and skips it (:class:`SkipLauncher`), on CPU tensors, with the grid
        geometry of a 132-SM GPU: every line of the samplers' host path runs except the launch itself. These are
        CPU-side Python costs on this machine, not GPU launch times.
  cuda  the production launcher (CUDA through CuPy): the real launches, whose host cost is included; the device is
        synchronised before each block (outside the timed region), so no block waits for earlier work.
Calls run under torch.inference_mode, as the decoding loop runs them; uniforms come from a seeded generator.
The JSON records the machine's load around the timing (pipeline.env_info.LoadProbe): the figures are those of a
machine that may have been busy, with their intervals.
"""

from __future__ import annotations

import collections
import gc
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.benchmarks.timing import format_table
from pipeline.dtypes import torch_dtype
from pipeline.env_info import LoadProbe, code_commit, provenance
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.measure import median_ci
from pipeline.samplers import cupy_backend
from pipeline.samplers.tree import TreeSampler
from pipeline.tree_shape import TokenTree

# (B, γ, V, dtype): the goal shape first, then a larger batch, a small vocabulary in fp32 and a large batch in fp16
GOAL = (1, 5, 128_256, "bfloat16")
FULL = (GOAL, (16, 5, 128_256, "bfloat16"), (1, 8, 32_000, "float32"), (64, 4, 32_000, "float16"))
QUICK = (GOAL,)
TREE = "2,2,1"                      # the tree sampler's tree (10 nodes)
SAMPLERS = ("exact", "sigmoid", "greedy", "tree")
SM_COUNT = 132                      # the skip launcher's grid geometry: an H100 SXM's SMs
TEMPERATURE = 1.0                   # exact, sigmoid and tree; greedy runs at 0


class SkipLauncher(cupy_backend.Launcher):
    """A kernel launcher that records each launch (kernel<dtype> name -> count) and skips it: the samplers' host path
    on CPU tensors, every line of it but the launch. Grids are sized for ``sm_count`` SMs."""

    name = "skip"
    device_type = "cpu"

    def __init__(self, sm_count: int = SM_COUNT) -> None:
        super().__init__()
        self.sms = sm_count
        self.launches: collections.Counter = collections.Counter()

    def sm_count(self, device) -> int:
        return self.sms

    def stream(self, device) -> object:
        return "cpu"

    def kernel(self, kernel, dtype, device) -> object:
        return kernel

    def launch(self, kernel, grid, args, stream) -> None:
        self.launches[kernel] += 1


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def count_dispatches(fn: Callable[[], object], warmup: int = 2) -> collections.Counter:
    """The torch operator dispatches (aten op name -> count) of one call of ``fn`` after ``warmup`` calls (what a
    shape's first call makes once is not counted), under torch.inference_mode."""
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
    with torch.inference_mode(), _Counter() as counter:
        fn()
    return counter.ops


def python_bytes(fn: Callable[[], object], calls: int) -> dict:
    """Python-level memory of ``fn`` (tracemalloc): ``peak``, the most one call held above what was held before it,
    and ``retained``, the growth of what stays allocated per call over ``calls`` calls (after a full collection);
    bytes."""
    with torch.inference_mode():
        fn()
        gc.collect()
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            fn()
            _, peak = tracemalloc.get_traced_memory()
            gc.collect()                     # a full collection also empties the interpreter's free lists
            start, _ = tracemalloc.get_traced_memory()
            for _ in range(calls):
                fn()
            gc.collect()
            end, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return {"peak": peak - before, "retained": (end - start) / calls}


def _block_seconds(fn: Callable[[], object], calls: int, cuda: bool) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn`` (the device drained first, outside the timing)."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int, calls: int, cuda: bool,
                     warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per call of each of ``fns``, one value per block of ``calls`` calls, ``repeats`` blocks each; the
    functions take turns block by block, their order rotating every repeat. name -> float [repeats]."""
    names = list(fns)
    out: dict[str, list[float]] = {name: [] for name in names}
    with torch.inference_mode():
        for _ in range(warmup):
            for name in names:
                _block_seconds(fns[name], calls, cuda)
        for r in range(repeats):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                out[name].append(_block_seconds(fns[name], calls, cuda))
    return out


# ---- the calls -------------------------------------------------------------------------------------------------

def _inputs(B: int, gamma: int, V: int, dtype: str, device: torch.device, seed: int):
    """draft_tokens int64 [B, γ], draft_logits [B, γ, V] and target_logits [B, γ+1, V] of ``dtype`` on ``device``."""
    g = torch.Generator().manual_seed(seed)
    tl = (torch.randn(B, gamma + 1, V, generator=g) * 3).to(device=device, dtype=torch_dtype(dtype))
    dl = (torch.randn(B, gamma, V, generator=g) * 3).to(device=device, dtype=torch_dtype(dtype))
    dt = torch.randint(0, V, (B, gamma), generator=g).to(device)
    return dt, dl, tl


def sampler_calls(samplers: dict[str, type], config: tuple, device: torch.device,
                  seed: int = 0) -> dict[str, Callable[[], object]]:
    """name -> a call of one verify step of that kernel sampler at ``config`` (B, γ, V, dtype): exact and sigmoid at
    T = 1, greedy, and the tree sampler (exact, T = 1) on the tree TREE with as many nodes; each with its own seeded
    generator and its own sampler object, built once."""
    B, gamma, V, dtype = config
    tree = TokenTree.from_widths(TREE)
    chain = _inputs(B, gamma, V, dtype, device, seed)
    nodes = _inputs(B, tree.n_nodes, V, dtype, device, seed + 1)
    calls = {}
    for name in SAMPLERS:
        gen = torch.Generator(device=device).manual_seed(seed)
        if name == "tree":
            sampler = TreeSampler(samplers["exact"](temperature=TEMPERATURE))
            calls[name] = lambda s=sampler, g=gen: s(*nodes, generator=g, tree=tree)
        else:
            sampler = samplers[name](temperature=0.0 if name == "greedy" else TEMPERATURE)
            calls[name] = lambda s=sampler, g=gen: s(*chain, generator=g)
    return calls


def _commit() -> str | None:
    """The code's commit (env_info.code_commit) as a short hash, '+' where its code differs from it; None outside a
    git checkout."""
    code = code_commit()
    return None if not code or not code["commit"] else code["commit"][:7] + ("+" if code["dirty"] else "")


def require_kernels() -> None:
    """On CUDA the production launcher runs: refuse in one line where it cannot (no CuPy, no GPU)."""
    if not cupy_backend.available():
        raise SpecsweepError(f"bench host on CUDA needs the cupy backend: {cupy_backend.unavailable_reason()}; "
                             "--device cpu times the host path with launches skipped")


def _launcher(device: str) -> tuple[dict[str, type], cupy_backend.Launcher | None, str]:
    """(the kernel samplers, the launcher if it records launches, its description) for ``device``."""
    if device.startswith("cuda"):
        return cupy_backend.SAMPLERS, None, "cupy: the production launcher (CUDA through CuPy), launches included"
    launcher = SkipLauncher()
    return (cupy_backend.bind(launcher), launcher,
            f"skip: records and skips each launch (CPU tensors, grids for {SM_COUNT} SMs); not GPU launch times")


def _config_rows(config: tuple, samplers: dict, recorder, device: str, repeats: int, calls: int,
                 seed: int) -> list[dict]:
    """One row per sampler at ``config``: host µs with its interval, dispatches, Python bytes, launches."""
    fns = sampler_calls(samplers, config, torch.device(device), seed)
    rows = []
    for name, fn in fns.items():
        ops = count_dispatches(fn)
        launches = None
        if recorder is not None:
            recorder.launches.clear()
            fn()
            launches = sum(recorder.launches.values())
        rows.append({"sampler": name, "dispatches": sum(ops.values()), "dispatch_ops": dict(sorted(ops.items())),
                     "python_bytes": python_bytes(fn, calls), "launches": launches})
    times = time_interleaved(fns, repeats, calls, device.startswith("cuda"))
    B, gamma, V, dtype = config
    for row in rows:
        us = [t * 1e6 for t in times[row["sampler"]]]
        shape = {"B": B, "gamma": gamma, "V": V, "dtype": dtype}
        if row["sampler"] == "tree":
            shape.update(gamma=TokenTree.from_widths(TREE).n_nodes, tree=TREE)
        row.update(shape, host_us=median_ci(us).to_dict(), times_us=us)
    return [{k: row[k] for k in ("B", "gamma", "V", "dtype", "sampler", *(("tree",) if "tree" in row else ()),
                                 "host_us", "dispatches", "dispatch_ops", "python_bytes", "launches", "times_us")}
            for row in rows]


def run(device: str = "cpu", configs=FULL, repeats: int = 21, calls: int = 200, out: Path | None = None,
        seed: int = 0, progress: Callable[[str], None] = print) -> dict:
    """Every kernel sampler at every configuration (B, γ, V, dtype): rows as the module docstring says; the JSON is
    written (atomically) after every configuration."""
    samplers, recorder, description = _launcher(device)
    rows: list[dict] = []
    probe = LoadProbe(device)
    result = {"benchmark": "host", "provenance": provenance(device), "commit": _commit(),
              "settings": {"repeats": repeats, "calls_per_block": calls, "launcher": description,
                           "temperature": TEMPERATURE, "tree": TREE, "configs": [list(c) for c in configs],
                           "timing": "host_us: perf_counter around blocks of calls_per_block calls, per call; samplers "
                                     "interleaved block by block; median over the blocks with its order-statistic "
                                     "interval; the machine may have been busy (load)",
                           "python_bytes": "tracemalloc, its own pass: peak above the level before one call, and "
                                           "growth per call over calls_per_block calls"},
              "results": rows, "complete": False}
    for i, config in enumerate(configs):
        rows += _config_rows(tuple(config), samplers, recorder, device, repeats, calls, seed + i)
        result["complete"] = i + 1 == len(configs)
        result["load"] = probe.finish() if result["complete"] else None
        if out is not None:
            write_json_atomic(out, result)
        progress(f"[{i + 1}/{len(configs)}] B={config[0]} γ={config[1]} V={config[2]} {config[3]}")
    return result


def table(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(table rows, columns): one line per (configuration, sampler)."""
    out = []
    for r in rows:
        ci = r["host_us"]
        out.append({"B": r["B"], "γ": r["gamma"], "V": r["V"], "dtype": r["dtype"],
                    "sampler": r["sampler"] + (f" {r['tree']}" if "tree" in r else ""),
                    "host µs [95 %]": f"{ci['median']:.1f} [{ci['ci_low']:.1f}, {ci['ci_high']:.1f}]",
                    "dispatches": r["dispatches"], "launches": "-" if r["launches"] is None else r["launches"],
                    "py peak B": f"{r['python_bytes']['peak']:.0f}",
                    "py kept B/call": f"{r['python_bytes']['retained']:.1f}"})
    return out, ["B", "γ", "V", "dtype", "sampler", "host µs [95 %]", "dispatches", "launches", "py peak B",
                 "py kept B/call"]


def print_table(result: dict) -> None:
    print(f"host side of one verify call; launcher: {result['settings']['launcher']}")
    lines, columns = table(result["results"])
    print(format_table(lines, columns))
    load = result.get("load") or {}
    busy, wait = load.get("others_busy_cores"), (load.get("runqueue_wait") or {}).get("wait_fraction")
    print(f"load while timing: {'-' if busy is None else f'{busy:.2f}'} cores busy with other processes, this "
          f"process waited for a CPU {'-' if wait is None else f'{wait:.1%}'} of its ready time")
