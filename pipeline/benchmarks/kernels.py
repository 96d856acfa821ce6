"""`specsweep bench kernels`: the cupy verify kernels against HF, the torch reference, FlashInfer and the floor.

Every implementation is timed two ways, per verify call, after warm-up, with inputs rotated over several sets
(as many as fit in ROTATE_BYTES, at most MAX_SETS; the largest configurations get two sets, the smallest fit in
L2 whatever the rotation):
  eager  (``median_s``, ``times_s``)  CUDA events around each call on the current stream, median over the calls.
         What a user who calls the function from Python pays: launch and host overhead included.
  graph  (``graph_s``, ``graph_times_s``)  ``graph_calls`` calls (rotating over the sets) captured into one CUDA
         graph after warm-up on the capture stream, then ``graph_replays`` replays, each bracketed by CUDA events
         and divided by ``graph_calls``; median over the replays. Device time, as FlashInfer's own
         benchmarks/bench_chain_speculative.py measures it. Under capture the samplers draw their uniforms from
         torch's default CUDA generator (generator=None; a custom torch.Generator cannot be captured) and
         FlashInfer gets seed/offset tensors. Where capture fails, ``graph_s`` is null and ``graph_error`` says
         why; HF's function syncs with the host and is never captured.
Competitors:
  hf           transformers' _speculative_sampling (B = 1), fp32 logits already divided by T, prepared outside
               the timed region (as HF's loop hands them over); eager only
  torch        the torch reference sampler (pipeline.samplers.torch_ref)
  flashinfer   FlashInfer's whole verify: its softmax of the draft and of the target logits, then
               flashinfer.sampling.chain_speculative_sampling. The softmax is flashinfer.sampling.softmax (an online
               softmax that splits the vocabulary across blocks for small batches) where the installed version has
               it, else torch.softmax; the JSON says which (``flashinfer.softmax_impl``). Only where flashinfer
               imports; API errors are recorded in ``flashinfer.errors``
  floor        max(empty-kernel launch through the same CuPy launch path, bytes the sampler must read / measured
               device-to-device copy bandwidth); the launch part measured eagerly (``floor_s``) and under graph
               replay (``floor_graph_s``)
Token trees (``tree_verify``, kernels/verify.cu; :func:`run`'s ``trees``): the cupy kernel with each sibling rule
(with and without replacement) and the torch reference (pipeline/samplers/tree.py) on tree steps of the shapes given,
at bf16 and V = 128256 (TREE_VOCAB, TREE_DTYPE), timed as above; they run after the goal configuration and before
the grid, so a run cut short by its time budget still has them. Rows carry ``tree`` and ``rule``; no goal judges
them.
Goals (booleans in the JSON): at B = 1, V = 128256, γ = 5, bf16, exact is >= 20x faster than HF and within 2x
of its floor; exact is faster than FlashInfer + softmax at every B measured; sigmoid is at least as fast as
exact in every configuration. Each comparison uses graph-replay times where both sides have one, else eager
times for both (HF: always eager); ``goals.basis`` says which, and ``goals.eager`` judges all of them on eager
times.
"""

from __future__ import annotations

import collections
import importlib
import importlib.metadata as md
import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.benchmarks.timing import format_table, median, time_calls
from pipeline.dtypes import torch_dtype
from pipeline.env_info import provenance
from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.kernels.loader import THREADS, cupy_stream
from pipeline.samplers import cupy_backend, torch_ref
from pipeline.samplers.hf import hf_speculative_sampling
from pipeline.samplers.tree import TreeVerifier
from pipeline.tree_shape import TokenTree

GOAL_CONFIG = {"B": 1, "gamma": 5, "V": 128_256, "dtype": "bfloat16"}
_GOAL = (GOAL_CONFIG["B"], GOAL_CONFIG["gamma"], GOAL_CONFIG["V"], GOAL_CONFIG["dtype"])
# The grid (FlashInfer's bench_chain_speculative.py shapes); dtypes run one after another, bf16 first, so
# a run cut short keeps whole dtypes. The goal configuration runs first.
FULL = {"batches": (1, 8, 32, 128), "gammas": (1, 3, 5, 8), "vocabs": (32_000, 128_256),
        "dtypes": ("bfloat16", "float32", "float16"), "extra": (_GOAL,)}
QUICK = {"batches": (1, 16), "gammas": (5,), "vocabs": (128_256,), "dtypes": ("bfloat16",), "extra": ()}
# Token trees: shapes and batch sizes (run's ``trees`` and ``tree_batches``), at one vocabulary and dtype
TREE_FULL = {"trees": ("2,2,1", "3,2,1"), "tree_batches": (1, 8, 32)}
TREE_QUICK = {"trees": ("2,2,1",), "tree_batches": (1,)}
TREE_VOCAB, TREE_DTYPE = 128_256, "bfloat16"
TREE_RULES = {"with-replacement": True, "without-replacement": False}
ROTATE_BYTES = 256 * 2**20      # rotated input sets span at least this much (H100/H200 L2: 50/60 MB)
GRAPH_CALLS = 16                # calls captured per CUDA graph (rotating over the input sets)
GRAPH_REPLAYS = 10              # timed replays of that graph
GRAPH_WARMUP = 3                # eager calls on the capture stream before capture
MAX_SETS = GRAPH_CALLS          # more sets than captured calls would never be read in a replay
EAGER_WARMUP = 5
HF_NO_GRAPH = ("not captured: transformers' _speculative_sampling syncs with the host (Python branches on tensor "
               "values), which CUDA stream capture forbids; HF users call it eagerly")
GOALS_TIMING = ("each comparison on CUDA-graph replay times per call where both sides have one, else on eager "
                "times for both (HF is eager only); basis says which; eager judges every goal on eager times")


def _require_gpu() -> None:

    if not cupy_backend.available():
        raise SpecsweepError(f"bench kernels needs the cupy backend: {cupy_backend.unavailable_reason()}")


def _prepare_kernels() -> None:
    """Compile/load the verify kernels now, before any timing and any graph capture."""

    cupy_backend.SAMPLERS["exact"]().prepare(torch.device("cuda"))


def configurations(batches, gammas, vocabs, dtypes, extra=()) -> list[tuple[int, int, int, str]]:
    """(B, γ, V, dtype) in run order: ``extra`` first (the goal configuration), then the grid with the dtype
    outermost in the order given, each configuration once."""
    grid = [(B, g, V, d) for d in dtypes for B in batches for g in gammas for V in vocabs]
    return list(dict.fromkeys([*(tuple(c) for c in extra), *grid]))


def _set_count(B, gamma, V, dtype) -> int:
    """How many input sets of (2γ+1) rows of [B, V] logits span ROTATE_BYTES: at least 2, at most MAX_SETS."""
    per_set = B * (2 * gamma + 1) * V * torch.finfo(torch_dtype(dtype)).bits // 8
    return max(2, min(MAX_SETS, math.ceil(ROTATE_BYTES / per_set)))


def _sets(B, gamma, V, dtype, seed):
    """Input sets (draft_tokens int64 [B, γ], draft_logits [B, γ, V], target_logits [B, γ+1, V], all of
    ``dtype``) on the GPU: enough of them to span ROTATE_BYTES, at least 2, at most MAX_SETS."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(_set_count(B, gamma, V, dtype)):
        tl = (torch.randn(B, gamma + 1, V, generator=g, device="cuda") * 3).to(torch_dtype(dtype))
        dl = (tl[:, :gamma].float() + torch.randn(B, gamma, V, generator=g, device="cuda")).to(torch_dtype(dtype))
        dt = torch.randint(0, V, (B, gamma), generator=g, device="cuda")
        out.append((dt, dl, tl))
    return out


def _tree_sets(tree: TokenTree, B, V, dtype, seed):
    """Input sets of a tree step (draft_tokens int64 [B, N], draft_logits [B, N, V], target_logits [B, N+1, V]) on
    the GPU, as many as _sets would make for γ = N: the draft's logits at each position are the target's plus noise,
    each node's draft row is its parent position's, and a position's children are that row's top-k, so that steps
    accept at several depths and reject siblings on the way (what the kernel's passes cost depends on the path)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    parents = torch.tensor(tree.parents, device="cuda") + 1
    out = []
    for _ in range(_set_count(B, tree.n_nodes, V, dtype)):
        tl = torch.randn(B, tree.n_nodes + 1, V, generator=g, device="cuda") * 3
        dpos = tl + torch.randn(B, tree.n_nodes + 1, V, generator=g, device="cuda")
        dt = torch.zeros(B, tree.n_nodes, dtype=torch.int64, device="cuda")
        for position, kids in enumerate(tree.children):
            if kids:
                dt[:, kids[0]: kids[0] + len(kids)] = dpos[:, position].topk(len(kids), dim=1).indices
        out.append((dt, dpos[:, parents].to(torch_dtype(dtype)), tl.to(torch_dtype(dtype))))
    return out


def _bytes_read(name, B, gamma, V, dtype) -> int:
    """Bytes of logits a sampler cannot avoid reading: exact every row, greedy the target rows, sigmoid 2 rows."""
    es = torch.finfo(torch_dtype(dtype)).bits // 8
    rows = {"exact": 2 * gamma + 1, "greedy": gamma + 1, "sigmoid": 2}[name]
    return B * rows * V * es


# ---- timing ---------------------------------------------------------------------------------------------------

def graph_times(fn: Callable[[int], object], calls: int, replays: int, warmup: int = GRAPH_WARMUP,
                cuda=torch.cuda) -> list[float]:
    """Seconds per call of ``fn(i)`` under CUDA graph replay, one value per timed replay.

    ``warmup`` eager calls run on a side stream (allocations, workspaces and caches are made there, outside the
    capture), then ``fn(0) .. fn(calls - 1)`` are captured on that stream into one graph (``i`` lets callers
    rotate inputs), replayed once untimed, then ``replays`` times on the current stream, each replay between two
    CUDA events; the device is synchronised once at the end. Raises whatever capture raises; the caller's
    current stream is restored either way (torch.cuda.graph leaves the capture stream current when capture
    fails). ``cuda`` is torch.cuda (tests pass a stand-in).
    """
    caller = cuda.current_stream()
    side = cuda.Stream()
    side.wait_stream(caller)
    with cuda.stream(side):
        for i in range(warmup):
            fn(i)
    caller.wait_stream(side)
    cuda.synchronize()
    graph = cuda.CUDAGraph()
    try:
        with cuda.graph(graph, stream=side):
            for i in range(calls):
                fn(i)
    finally:
        cuda.set_stream(caller)
    graph.replay()
    starts = [cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends):
        start.record()
        graph.replay()
        end.record()
    cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 / calls for start, end in zip(starts, ends)]


def _reason(e: BaseException) -> str:
    """One line naming an exception and, where another replaced it (capture_end after a failed capture), the
    one that came first."""
    parts = [f"{type(e).__name__}: {e}"]
    if e.__context__ is not None:
        parts.append(f"after {type(e.__context__).__name__}: {e.__context__}")
    return " | ".join(" ".join(p.split()) for p in parts)[:500]


@dataclass(frozen=True)
class Timing:
    """How every implementation is timed: eager calls, then CUDA-graph replay (see the module docstring)."""

    repeats: int                        # eager timed calls
    graph_calls: int = GRAPH_CALLS
    graph_replays: int = GRAPH_REPLAYS
    cuda: Any = torch.cuda              # tests pass a stand-in

    def measure(self, eager_fn: Callable[[int], object], graph_fn: Callable[[int], object] | None,
                repeats: int | None = None, no_graph: str | None = None) -> dict:
        """Row fields of one implementation: median_s and times_s (eager), graph_s and graph_times_s (None
        with graph_error where ``graph_fn`` is None, giving ``no_graph`` as the reason, or where capture
        failed). Eager errors propagate."""
        times = time_calls(eager_fn, "cuda", repeats or self.repeats, warmup=EAGER_WARMUP)
        row = {"median_s": median(times), "times_s": times, "graph_s": None, "graph_times_s": None}
        if graph_fn is None:
            return {**row, "graph_error": no_graph}
        try:
            per_call = graph_times(graph_fn, self.graph_calls, self.graph_replays, cuda=self.cuda)
        except Exception as e:  # a host sync or an uncapturable call inside: recorded, the run goes on
            self.cuda.synchronize()  # a sticky CUDA error would surface here and end the run
            return {**row, "graph_error": _reason(e)}
        return {**row, "graph_s": median(per_call), "graph_times_s": per_call}


def _empty_launch() -> Callable[[int], None]:
    """fn(i) launching an empty kernel through CuPy on torch's current stream, the way the samplers launch."""
    import cupy


    kernel = cupy.RawKernel('extern "C" __global__ void specsweep_empty() {}', "specsweep_empty")

    def launch(_):
        with cupy_stream(torch.cuda.current_device()):
            kernel((1,), (THREADS,), ())

    return launch


def measure_bandwidth(repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write of a 1 GiB buffer)."""
    src = torch.empty(2**28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    t = median(time_calls(lambda _: dst.copy_(src), "cuda", repeats))
    return 2 * src.numel() * 4 / t


def measure_floor(timing: Timing) -> dict:
    """The floor's parts: empty-kernel launch, eager (``empty_launch_s``, 4x the repeats) and under graph
    replay (``empty_launch_graph_s``, None with ``empty_launch_graph_error`` if capture failed), and copy
    bandwidth."""
    launch = _empty_launch()
    measured = timing.measure(launch, launch, repeats=4 * timing.repeats)
    floor = {"empty_launch_s": measured["median_s"], "empty_launch_graph_s": measured["graph_s"],
             "d2d_bandwidth_bytes_per_s": measure_bandwidth()}
    if measured.get("graph_error"):
        floor["empty_launch_graph_error"] = measured["graph_error"]
    return floor


def _floors(name: str, B: int, gamma: int, V: int, dtype: str, floor: dict) -> dict:
    """floor_s (eager launch) and floor_graph_s (graph launch; None where not measured) of one cupy sampler."""
    memory = _bytes_read(name, B, gamma, V, dtype) / floor["d2d_bandwidth_bytes_per_s"]
    graph_launch = floor.get("empty_launch_graph_s")
    return {"floor_s": max(floor["empty_launch_s"], memory),
            "floor_graph_s": None if graph_launch is None else max(graph_launch, memory)}


# ---- FlashInfer -----------------------------------------------------------------------------------------------

def _params(fn) -> tuple[str, ...] | None:
    """Parameter names of ``fn`` (None where it cannot be inspected)."""
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class FlashInfer:
    """The installed FlashInfer's verify pieces: chain_speculative_sampling, and its softmax where it has one."""

    chain: Callable
    softmax: Callable | None            # flashinfer.sampling.softmax; None: torch.softmax is used
    chain_params: tuple[str, ...] | None

    @property
    def softmax_impl(self) -> str:
        return "flashinfer.sampling.softmax" if self.softmax is not None else "torch.softmax"

    def takes(self, *names: str) -> bool:
        """True where chain_speculative_sampling has every parameter named."""
        return self.chain_params is not None and all(n in self.chain_params for n in names)


def flashinfer_api() -> tuple[FlashInfer | None, dict]:
    """(FlashInfer or None, how it is installed and which of its functions the benchmark calls). Its softmax is
    used where ``flashinfer.sampling.softmax`` exists and takes ``temperature``."""
    try:
        flashinfer = importlib.import_module("flashinfer")
        sampling = importlib.import_module("flashinfer.sampling")
        chain = sampling.chain_speculative_sampling
    except Exception as e:  # absent, or present but broken for this torch/CUDA
        return None, {"available": False, "reason": f"{type(e).__name__}: {e}"[:300]}
    softmax = getattr(sampling, "softmax", None)
    softmax_params = _params(softmax) if callable(softmax) else None
    if not callable(softmax) or (softmax_params is not None and "temperature" not in softmax_params):
        softmax = None
    api = FlashInfer(chain=chain, softmax=softmax, chain_params=_params(chain))
    info = {"available": True, "module": getattr(flashinfer, "__file__", None),
            "version": getattr(flashinfer, "__version__", None), "softmax_impl": api.softmax_impl,
            "softmax_params": list(softmax_params) if softmax_params else None,
            "chain_params": list(api.chain_params) if api.chain_params else None,
            "graph_rng": ("seed/offset int64 tensors (graph-capturable)" if api.takes("seed", "offset") else
                          "none: chain_speculative_sampling takes no seed/offset tensors, capture may fail")}
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            info["distribution"] = f"{dist}=={md.version(dist)}"
            break
        except md.PackageNotFoundError:
            continue
    return api, info


def _probs(softmax: Callable | None, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 softmax(logits / T) over the last axis, same shape as ``logits`` [B, P, V] (contiguous):
    ``softmax`` (FlashInfer's, which takes 2-d logits) on the [B*P, V] view, else torch.softmax."""
    if softmax is not None:
        return softmax(logits.reshape(-1, logits.shape[-1]), temperature=temperature).view(logits.shape)
    if temperature != 1.0:
        logits = logits.float() / temperature
    return torch.softmax(logits, dim=-1, dtype=torch.float32)


def flashinfer_verify(api: FlashInfer, draft_tokens: torch.Tensor, draft_logits: torch.Tensor,
                      target_logits: torch.Tensor, temperature: float, counters=None, rng=None):
    """FlashInfer's whole verify step: probabilities of both logit tensors, then chain_speculative_sampling.

    draft_tokens int32 [B, γ]; draft_logits [B, γ, V] and target_logits [B, γ+1, V], contiguous fp32/fp16/bf16.
    counters: (accepted, emitted) int32 [B] that FlashInfer adds its counts to (None: it allocates them).
    rng: (seed, offset) int64 [1] tensors, as CUDA graph capture needs (None: FlashInfer takes a seed and offset
    from torch's default CUDA generator on the host). Returns chain_speculative_sampling's result.
    """
    q = _probs(api.softmax, draft_logits, temperature)
    p = _probs(api.softmax, target_logits, temperature)
    kwargs = {}
    if counters is not None:
        kwargs.update(maybe_output_accepted_token_num=counters[0], maybe_output_emitted_draft_token_num=counters[1])
    if rng is not None:
        kwargs.update(seed=rng[0], offset=rng[1])
    return api.chain(q, draft_tokens, p, **kwargs)


# ---- the run --------------------------------------------------------------------------------------------------

def _cupy_info() -> dict:
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    return {"version": cupy.__version__, "nvrtc": list(nvrtc.getVersion())}


def run(*, batches=FULL["batches"], gammas=FULL["gammas"], vocabs=FULL["vocabs"], dtypes=FULL["dtypes"],
        extra=FULL["extra"], repeats: int = 50, graph_calls: int = GRAPH_CALLS, graph_replays: int = GRAPH_REPLAYS,
        temperature: float = 1.0, out: Path | None = None, max_seconds: float | None = None, progress=print,
        clock=time.monotonic, trees=(), tree_batches=TREE_FULL["tree_batches"]) -> dict:
    """Benchmark every configuration (see :func:`configurations`) and every tree shape in ``trees`` at each batch
    size in ``tree_batches`` (after the first configuration, before the others) and return the result; with ``out``,
    write it after every configuration. With ``max_seconds``, no configuration but the first starts once that many
    seconds have passed since the start; ``stopped`` then lists those not run (trees under ``trees_not_run``)."""
    _require_gpu()
    start = clock()

    hf_fn = hf_speculative_sampling()
    fi_api, fi_info = flashinfer_api()
    _prepare_kernels()
    timing = Timing(repeats, graph_calls, graph_replays)
    floor = measure_floor(timing)
    configs = configurations(batches, gammas, vocabs, dtypes, extra)
    jobs = [*configs[:1], *((B, shape) for shape in trees for B in tree_batches), *configs[1:]]
    rows: list[dict] = []
    result = {"benchmark": "kernels", "provenance": provenance("cuda"),
              "settings": {"repeats": repeats, "graph_calls": graph_calls, "graph_replays": graph_replays,
                           "temperature": temperature, "rotate_bytes": ROTATE_BYTES, "max_seconds": max_seconds,
                           "timing": {"eager": "median_s: CUDA events around each call on the current stream, "
                                               "median over the calls",
                                      "graph": "graph_s: graph_calls calls in one CUDA graph, events around each "
                                               "replay, / graph_calls, median over the replays"},
                           "goals_timing": GOALS_TIMING,
                           "hf_note": "HF timed on fp32 logits divided by T outside the timed region",
                           "trees": {"shapes": list(trees), "batches": list(tree_batches), "V": TREE_VOCAB,
                                     "dtype": TREE_DTYPE}},
              "cupy": _cupy_info(), "flashinfer": fi_info, "floor": floor,
              "complete": False, "results": rows, "goals": {}}
    for idx, job in enumerate(jobs):
        if idx and max_seconds and clock() - start > max_seconds:  # the first (goal) configuration always runs
            left = jobs[idx:]
            result["stopped"] = {"reason": f"time budget of {max_seconds:g} s spent",
                                 "configs_not_run": [list(c) for c in left if len(c) == 4],
                                 "trees_not_run": [list(c) for c in left if len(c) == 2]}
            progress(f"stopped: {result['stopped']['reason']}; {len(left)} configurations not run")
            break
        if len(job) == 2:                            # (B, tree shape)
            rows += _bench_tree(*job, idx, timing, temperature)
            label = f"B={job[0]} tree {job[1]} V={TREE_VOCAB} {TREE_DTYPE}"
        else:
            B, gamma, V, dtype = job
            rows += _bench_config(B, gamma, V, dtype, seed=idx, timing=timing, temperature=temperature, floor=floor,
                                  hf_fn=hf_fn, fi_api=fi_api, fi_info=fi_info)
            label = f"B={B} γ={gamma} V={V} {dtype}"
        result["complete"] = idx + 1 == len(jobs)
        result["goals"] = goals(rows)
        if out is not None:  # after every configuration, so a run cut short still leaves its numbers
            write_json_atomic(out, result)
        progress(f"[{idx + 1}/{len(jobs)}] {label}")
    if out is not None and "stopped" in result:
        write_json_atomic(out, result)
    return result


def _bench_tree(B: int, shape: str, seed: int, timing: Timing, temperature: float) -> list[dict]:
    """Timing rows of one tree step (B rows, tree ``shape``, TREE_VOCAB, TREE_DTYPE): cupy tree_verify with each
    sibling rule, and the torch reference (with replacement)."""
    tree = TokenTree.from_widths(shape)
    sets = _tree_sets(tree, B, TREE_VOCAB, TREE_DTYPE, seed)
    base = {"B": B, "gamma": tree.n_nodes, "V": TREE_VOCAB, "dtype": TREE_DTYPE, "tree": shape,
            "input_sets": len(sets)}
    rows = []
    for rule, replacement in TREE_RULES.items():
        verifier = cupy_backend.ExactSampler(temperature=temperature).tree_verifier(temperature, replacement)
        measured = timing.measure(*_tree_calls(verifier, tree, sets))
        rows.append({**base, "impl": "cupy", "sampler": "tree_verify", "rule": rule, **measured})
    measured = timing.measure(*_tree_calls(TreeVerifier(temperature), tree, sets),
                              repeats=max(5, timing.repeats // 5))
    rows.append({**base, "impl": "torch", "sampler": "tree_verify", "rule": "with-replacement", **measured})
    return rows


def _tree_calls(verifier, tree: TokenTree, sets) -> tuple[Callable, Callable]:
    """(eager fn(i), graph fn(i)) verifying set i mod len(sets) with ``tree``, as :func:`_sampler_calls`."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = len(sets)
    return (lambda i: verifier(tree, *sets[i % k], generator=gen)), (lambda i: verifier(tree, *sets[i % k]))


def _bench_config(B, gamma, V, dtype, *, seed, timing, temperature, floor, hf_fn, fi_api, fi_info) -> list[dict]:
    """Timing rows of one (B, γ, V, dtype): the three cupy samplers, torch, HF (B = 1), FlashInfer."""
    sets = _sets(B, gamma, V, dtype, seed)
    base = {"B": B, "gamma": gamma, "V": V, "dtype": dtype, "input_sets": len(sets)}
    rows = _sampler_rows(sets, base, timing, temperature, floor)
    if B == 1:
        rows.append(_hf_row(hf_fn, sets, base, timing, temperature))
    if fi_api is not None:
        rows += _flashinfer_rows(fi_api, fi_info, sets, base, timing, temperature)
    return rows


def _sampler_calls(sampler, sets) -> tuple[Callable, Callable]:
    """(eager fn(i), graph fn(i)) calling ``sampler`` on set i mod len(sets): eager with a seeded generator,
    under capture with generator=None (torch's default CUDA generator: a custom one cannot be captured)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = len(sets)
    return (lambda i: sampler(*sets[i % k], generator=gen)), (lambda i: sampler(*sets[i % k]))


def _sampler_rows(sets, base, timing, temperature, floor) -> list[dict]:
    """Rows of the cupy exact, sigmoid and greedy samplers (with their floors) and of the torch reference."""

    rows = []
    for name in ("exact", "sigmoid", "greedy"):
        sampler = cupy_backend.SAMPLERS[name](temperature=0.0 if name == "greedy" else temperature)
        measured = timing.measure(*_sampler_calls(sampler, sets))
        rows.append({**base, "impl": "cupy", "sampler": name, **measured,
                     **_floors(name, base["B"], base["gamma"], base["V"], base["dtype"], floor)})
    ref = torch_ref.ExactSampler(temperature=temperature)
    measured = timing.measure(*_sampler_calls(ref, sets), repeats=max(5, timing.repeats // 5))
    rows.append({**base, "impl": "torch", "sampler": "exact", **measured})
    return rows


def _hf_row(hf_fn, sets, base, timing, temperature) -> dict:
    """HF's _speculative_sampling (B = 1) on fp32 logits / T made outside the timed region; eager only."""
    gamma, k = base["gamma"], len(sets)
    hf_sets = [(dt, dl.float() / temperature, tl.float() / temperature) for dt, dl, tl in sets]

    def call(i):
        dt, dl, tl = hf_sets[i % k]
        return hf_fn(dt, dl, gamma, tl)

    measured = timing.measure(call, None, repeats=max(5, timing.repeats // 5), no_graph=HF_NO_GRAPH)
    return {**base, "impl": "hf", "sampler": "exact", **measured}


def _flashinfer_rows(api: FlashInfer, info: dict, sets, base, timing, temperature) -> list[dict]:
    """The FlashInfer row (none if its API refuses the call: the error goes to ``info['errors']``). Token ids
    as int32 and the accepted/emitted counters (where the API takes them) are made outside the timed region;
    under capture seed/offset tensors are passed where the API takes them."""
    B, k = base["B"], len(sets)
    fi_sets = [(dt.to(torch.int32), dl, tl) for dt, dl, tl in sets]
    counters = None
    if api.takes("maybe_output_accepted_token_num", "maybe_output_emitted_draft_token_num"):
        counters = tuple(torch.zeros(B, dtype=torch.int32, device="cuda") for _ in range(2))
    rng = None
    if api.takes("seed", "offset"):
        rng = (torch.full((1,), 12345, dtype=torch.int64, device="cuda"),
               torch.zeros(1, dtype=torch.int64, device="cuda"))

    def call(i, seed_offset=None):
        return flashinfer_verify(api, *fi_sets[i % k], temperature, counters, seed_offset)

    try:
        measured = timing.measure(call, lambda i: call(i, rng))
    except Exception as e:  # an API this code does not know: recorded, not guessed around
        cfg = f"B={B} γ={base['gamma']} V={base['V']} {base['dtype']}"
        info.setdefault("errors", []).append(f"{cfg}: {type(e).__name__}: {e}"[:300])
        return []
    return [{**base, "impl": "flashinfer+softmax", "sampler": "exact", "softmax": api.softmax_impl, **measured}]


# ---- goals and the table --------------------------------------------------------------------------------------

def _key(row: dict) -> tuple:
    return row["B"], row["gamma"], row["V"], row["dtype"]


def _compare(a: tuple, b: tuple, prefer_graph: bool) -> tuple[float, float, str]:
    """a, b: (eager, graph or None) times of two things -> (a, b, basis): the graph times where preferred and
    both exist, else the eager ones."""
    if prefer_graph and a[1] is not None and b[1] is not None:
        return a[1], b[1], "graph"
    return a[0], b[0], "eager"


def _times(row: dict) -> tuple:
    return row["median_s"], row.get("graph_s")


def _floor_times(row: dict) -> tuple:
    return row["floor_s"], row.get("floor_graph_s")


def _judge(rows: list[dict], prefer_graph: bool) -> dict:
    """The issue's goals as booleans (None where the inputs to judge one were not measured), each comparison on
    the basis :func:`_compare` picks; ``basis`` records it."""
    by: dict[str, dict] = {}
    for r in rows:
        by.setdefault(f"{r['impl']}:{r['sampler']}", {})[_key(r)] = r
    exact, hf, fi, sig = (by.get(n, {}) for n in ("cupy:exact", "hf:exact", "flashinfer+softmax:exact",
                                                  "cupy:sigmoid"))
    out: dict = {}
    basis: dict = {}
    goal_exact, goal_hf = exact.get(_GOAL), hf.get(_GOAL)
    out["b1_20x_faster_than_hf"] = None
    if goal_exact and goal_hf:
        ours, theirs, basis["b1_hf"] = _compare(_times(goal_exact), _times(goal_hf), prefer_graph)
        out["b1_speedup_over_hf"] = round(theirs / ours, 2)
        out["b1_20x_faster_than_hf"] = theirs / ours >= 20
    out["b1_within_2x_of_floor"] = None
    if goal_exact:
        t, floor, basis["b1_floor"] = _compare(_times(goal_exact), _floor_times(goal_exact), prefer_graph)
        out["b1_over_floor"] = round(t / floor, 2)
        out["b1_within_2x_of_floor"] = t <= 2 * floor
    vs_fi = {c: _compare(_times(exact[c]), _times(fi[c]), prefer_graph) for c in exact if c in fi}
    out["faster_than_flashinfer_every_b"] = all(a < b for a, b, _ in vs_fi.values()) if vs_fi else None
    out["flashinfer_losses"] = [list(c) for c, (a, b, _) in vs_fi.items() if a >= b]
    basis["flashinfer"] = dict(collections.Counter(v[2] for v in vs_fi.values()))
    vs_exact = {c: _compare(_times(sig[c]), _times(exact[c]), prefer_graph) for c in exact if c in sig}
    out["sigmoid_at_least_as_fast_as_exact"] = all(a <= b for a, b, _ in vs_exact.values()) if vs_exact else None
    out["sigmoid_slower_configs"] = [list(c) for c, (a, b, _) in vs_exact.items() if a > b]
    basis["sigmoid"] = dict(collections.Counter(v[2] for v in vs_exact.values()))
    return {**out, "basis": basis}


def goals(rows: list[dict]) -> dict:
    """The goals judged on graph-replay times where both sides have one (see GOALS_TIMING), and under ``eager``
    the same goals on eager times."""
    return {"config": GOAL_CONFIG, "timing": GOALS_TIMING, **_judge(rows, prefer_graph=True),
            "eager": _judge(rows, prefer_graph=False)}


TABLE_IMPLS = (("exact", "cupy:exact"), ("sigmoid", "cupy:sigmoid"), ("greedy", "cupy:greedy"),
               ("torch", "torch:exact"), ("hf", "hf:exact"), ("flashinfer", "flashinfer+softmax:exact"))


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def table(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(table rows, columns): one line per configuration, µs per call of every implementation under graph
    replay (``g``) and eager (``e``), and the exact kernel's floor for both."""
    by: dict[tuple, dict] = {}
    for r in rows:
        if "tree" not in r:
            by.setdefault(_key(r), {})[f"{r['impl']}:{r['sampler']}"] = r
    out = []
    for (B, g, V, d), cell in by.items():
        line = {"B": B, "γ": g, "V": V, "dtype": d}
        for label, name in TABLE_IMPLS:
            r = cell.get(name, {})
            line[f"{label} g"], line[f"{label} e"] = _us(r.get("graph_s")), _us(r.get("median_s"))
            if label == "greedy":
                ex = cell.get("cupy:exact", {})
                line["floor g"], line["floor e"] = _us(ex.get("floor_graph_s")), _us(ex.get("floor_s"))
        out.append(line)
    columns = ["B", "γ", "V", "dtype", *(f"{label} {m}" for label, _ in TABLE_IMPLS[:3] for m in "ge"),
               "floor g", "floor e", *(f"{label} {m}" for label, _ in TABLE_IMPLS[3:] for m in "ge")]
    return out, columns


def tree_table(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(table rows, columns) of the tree rows: one line per (B, tree), µs per call of tree_verify with each sibling
    rule and of the torch reference, under graph replay (``g``) and eager (``e``)."""
    by: dict[tuple, dict] = {}
    for r in rows:
        if "tree" in r:
            by.setdefault((r["B"], r["tree"], r["gamma"], r["V"], r["dtype"]), {})[f"{r['impl']}:{r['rule']}"] = r
    labels = (("with", "cupy:with-replacement"), ("without", "cupy:without-replacement"),
              ("torch", "torch:with-replacement"))
    out = []
    for (B, shape, n, V, d), cell in by.items():
        line = {"B": B, "tree": shape, "N": n, "V": V, "dtype": d}
        for label, name in labels:
            r = cell.get(name, {})
            line[f"{label} g"], line[f"{label} e"] = _us(r.get("graph_s")), _us(r.get("median_s"))
        out.append(line)
    return out, ["B", "tree", "N", "V", "dtype", *(f"{label} {m}" for label, _ in labels for m in "ge")]


def print_table(result: dict) -> None:
    lines, columns = table(result["results"])
    print("µs per verify call; g: CUDA-graph replay (device time per call), e: eager (CUDA events around each "
          f"call); FlashInfer's softmax: {result.get('flashinfer', {}).get('softmax_impl', '-')}")
    print(format_table(lines, columns))
    tree_lines, tree_columns = tree_table(result["results"])
    if tree_lines:
        print("\ntoken trees (tree_verify; with / without: the sibling rule; torch: the reference)")
        print(format_table(tree_lines, tree_columns))
    scalars = {k: v for k, v in result["goals"].items() if not isinstance(v, (list, dict, str))}
    eager = {k: v for k, v in result["goals"].get("eager", {}).items() if not isinstance(v, (list, dict))}
    print("\ngoals (graph replay where both sides have it):", scalars, "basis:", result["goals"].get("basis"))
    print("goals on eager times:", eager)
    if result.get("stopped"):
        print(f"stopped early: {result['stopped']['reason']} ({len(result['stopped']['configs_not_run'])} "
              "configurations not run)")
