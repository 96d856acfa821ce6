"""The ``cupy`` backend: the CUDA verify kernels of kernels/verify.cu behind the sampler contract.

Same samplers, parameters and validation as the torch reference (:mod:`pipeline.samplers.torch_ref`), which
defines what they compute; the same uniforms (``contract.uniforms``: torch's CUDA Philox generator, seeded,
reproducible and CUDA-graph capturable). Inputs are CUDA tensors; the kernels read them in place
(``data_ptr``, any batch/position strides, unit vocabulary stride) and write the result tensors directly.
Launches go to torch's current stream; nothing waits for the device.

The host path: a sampler keeps a :class:`Plan` per input signature (:class:`Plans`). Its first call with a signature
checks the inputs and makes the plan: the argument packs (loader.ArgPack, laid out as cuLaunchKernel reads them), the
output tensors and the uniforms' buffer. Later calls rewrite the inputs' addresses in the packs, draw the uniforms
in place and launch: one torch dispatch per call (``uniform_``; none for greedy), no allocation, no check beyond a
dictionary lookup (tests/test_kernel_host_path.py). The result's tensors are the plan's own and the next call with
the same signature rewrites them. The step functions below (greedy_step, exact_step, sigmoid_step, tree_verify)
make a plan of their own on every call: fresh result tensors, for tests and CUDA-graph capture.

    exact    2 launches: exact_partials (normalisers, decisions) then sample_exact (residual/bonus draw)
    sigmoid  1 launch:   sample_sigmoid
    greedy   1 launch:   greedy_verify (also exact/sigmoid at temperature 0)
    tree     2 launches: tree_verify_partials (row normalisers, or the argmax at temperature 0), then tree_verify
             (one block per row walks the token tree): :func:`tree_verify`, what pipeline/samplers/tree.py's
             TreeVerifier computes, rows with smaller trees (``real``) included; the exact and greedy samplers hand
             it out (``tree_verifier``), and TreeSampler uses it for a kernel sampler

Per-row draft lengths (the contract's ``lengths``, int64 [B] on the step's device, or None) go to every kernel as
a pointer (a null pointer for None); the kernels clamp them into [0, γ] and never hand them to the host.

Deterministic drafts (the contract's ``draft_logits=None``) go to the kernels as a null draft pointer (V_d = V_t):
exact_partials then reduces the γ+1 target rows only (grid (S1, γ+1, B)) and accepts x with probability p(x), and
sample_exact removes x_n from target row n instead of subtracting a draft row; greedy_verify skips the draft's
finiteness check. Nothing of shape [B, γ, V] is read or written. sigmoid refuses them at T > 0 (pipeline/rules.py).

Limits: γ <= 16 (a tree: N <= 256 nodes), V_t <= 262,144 (one inverse-CDF chunk level of 1024 entries x 256
chunks). Draft and target logits of different dtypes are both read as fp32 (an upcast copy, exact). A draft token
outside [0, V_d) is rejected and flags ``draft_ok`` False (the reference would raise a device-side assert).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from pipeline.dtypes import dtype_name
from pipeline.errors import SamplerInputError
from pipeline.kernels.loader import (
    CHUNK,
    MAX_CHUNKS,
    MAX_GAMMA,
    MAX_TREE_NODES,
    MAX_VOCAB,
    ArgPack,
    f32,
    function,
    i32,
    i64,
    launch,
    module,
    ptr,
)
from pipeline.samplers import torch_ref, tree
from pipeline.samplers.contract import SamplerResult, uniforms, validate_inputs, validate_lengths
from pipeline.tree_shape import TokenTree

# Blocks per SM the launch geometry aims for (kernels are capped at 64 registers: 4 blocks of 256 fit).
_BLOCKS_PER_SM = 4

# A null kernel pointer (``lengths`` None): the same type and size as loader.ptr's addresses.
_NULL = np.uint64(0)


def _cupy_error() -> str | None:
    try:
        import cupy  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising something else
        return f"CuPy cannot be imported ({type(e).__name__}: {e}): install it with pip install -e '.[dev]'"
    return None


def available() -> bool:
    """True where CuPy imports and torch sees a CUDA GPU."""
    return _cupy_error() is None and torch.cuda.is_available()


def unavailable_reason() -> str:
    """One sentence: what is missing and what to do."""
    error = _cupy_error()
    if error is not None:
        return error
    if not torch.cuda.is_available():
        return ("torch sees no CUDA GPU (CPU-only torch build, or no driver/device): run on a GPU machine with a "
                "CUDA build of torch, or use backend='torch'")
    return "available"


# ---- where the kernels run ----------------------------------------------------------------------------------

class Launcher:
    """Runs the kernels of verify.cu for the samplers below: geometry, workspace and arguments are the samplers'
    own, so every launcher is driven by exactly the same code.

    The production launcher is :class:`CupyLauncher` (CUDA through CuPy's driver bindings). The test suite injects a
    CPU runtime for CUDA kernels (tests/cuda_on_cpu) through :func:`bind`, so the kernels also execute where CI runs.
    A launcher owns one workspace per (device, stream).
    """

    name = "?"
    device_type = "cuda"             # the torch device type the kernels read and write

    def __init__(self) -> None:
        self._workspaces: dict[object, _Workspace] = {}

    def prepare(self, device: torch.device) -> None:
        """Compile and load the kernels for ``device`` (before the first step, and before any graph capture)."""

    def sm_count(self, device: torch.device) -> int:
        raise NotImplementedError

    def stream(self, device: torch.device) -> object:
        """The stream a step on ``device`` launches on now (torch's current stream), as :meth:`launch` takes it.
        Steps on one stream run one after another, so they may share a workspace. Called on every step: cheap, and
        it must not fail on a device of another type (the step's checks then say what is wrong)."""
        raise NotImplementedError

    def kernel(self, kernel: str, dtype: str, device: torch.device) -> object:
        """``kernel<dtype>`` on ``device``, as :meth:`launch` takes it (looked up once per step shape)."""
        raise NotImplementedError

    def launch(self, kernel: object, grid: tuple[int, int, int], args: ArgPack, stream: object) -> None:
        """Launch ``kernel`` (from :meth:`kernel`) over ``grid`` with ``THREADS`` threads per block on ``stream``
        (from :meth:`stream`); ``args``: its arguments as the kernel takes them (pointers, then int32 / int64 /
        float32 scalars)."""
        raise NotImplementedError

    def workspace(self, device: torch.device, stream: object = None) -> _Workspace:
        """The workspace of ``stream`` on ``device`` (None: the current stream)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:        # "cuda" is the current device, as tensors say
            device = torch.device("cuda", torch.cuda.current_device())
        key = (str(device), self.stream(device) if stream is None else stream)
        ws = self._workspaces.get(key)
        if ws is None:
            ws = self._workspaces[key] = _Workspace(device)
        return ws


class CupyLauncher(Launcher):
    """The CUDA kernels on a GPU, compiled by NVRTC through CuPy and launched through the driver (cuLaunchKernel) on
    torch's current stream."""

    name = "cupy"
    device_type = "cuda"

    @staticmethod
    def _index(device: torch.device) -> int:
        return device.index if device.index is not None else torch.cuda.current_device()

    def prepare(self, device: torch.device) -> None:

        module(self._index(device))

    def sm_count(self, device: torch.device) -> int:
        return _sm_count(self._index(device))

    def stream(self, device: torch.device) -> object:
        if device.type != "cuda":
            return None
        return torch.cuda.current_stream(device).cuda_stream

    def kernel(self, kernel: str, dtype: str, device: torch.device) -> object:
        index = self._index(device)
        return function(index, kernel, dtype), index

    def launch(self, kernel, grid, args, stream) -> None:
        fn, index = kernel
        launch(fn, grid, args, stream, index)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _split(n_chunks: int, blocks_per_unit: float, min_chunks: int = 1) -> tuple[int, int]:
    """Cut n_chunks chunks into about ``blocks_per_unit`` slices of whole chunks -> (slices, chunks per slice)."""
    slices = max(1, min(n_chunks, int(blocks_per_unit + 0.999)))
    per = max(min_chunks, -(-n_chunks // slices))
    return -(-n_chunks // per), per


class _Workspace:
    """Per (device, stream) scratch memory: slice partials, decisions, chunk sums and arrival counters.

    Counters start at zero and every kernel's arrivals wrap them back to zero (atomicInc), so no memset runs per
    step and nothing has to reset them. Buffers grow (doubling) when a larger step comes; the buffers they replace
    are kept, never freed, because a CUDA graph captured earlier, and a step plan made earlier (:class:`Plans`),
    still refer to them. One stream never runs two steps at once, so one workspace per stream is safe.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.batch = 0
        self.part = torch.empty(0, dtype=torch.float32, device=device)
        self._retired: list[torch.Tensor] = []

    def ensure(self, batch: int, part_floats: int) -> _Workspace:

        d = self.device
        if batch > self.batch:
            if self.batch:
                self._retired += [self.count, self.flags, self.dec, self.nacc, self.csum]
            self.batch = max(batch, 2 * self.batch)
            self.count = torch.zeros(self.batch, dtype=torch.int32, device=d)
            self.flags = torch.zeros(self.batch, dtype=torch.int32, device=d)
            self.dec = torch.empty((self.batch, 4), dtype=torch.float32, device=d)
            self.nacc = torch.empty(self.batch, dtype=torch.int32, device=d)
            self.csum = torch.empty((self.batch, MAX_CHUNKS, 2), dtype=torch.float32, device=d)
        if part_floats > self.part.numel():
            self._retired.append(self.part)
            self.part = torch.empty(max(part_floats, 2 * self.part.numel()), dtype=torch.float32, device=d)
        return self


# ---- one step's plan: what depends only on its shape, made once -----------------------------------------------

# The addresses a call hands its plan, in this order (Plan.run): the inputs, which change from call to call.
TOKENS, LENGTHS, TARGET, DRAFT, U, REAL = range(6)


class _In:
    """In a kernel's argument list: the call's address number ``index`` (TOKENS ... REAL) goes here."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _readable(draft_tokens, draft_logits, target_logits, lengths=None, real=None) -> tuple:
    """The inputs as the kernels read them (the same tensors where nothing needs changing): tokens, lengths and the
    real flags contiguous along their last dimension; draft and target logits of one dtype (both read as fp32 where
    they differ: an exact upcast) with unit stride along V; an empty draft made contiguous."""
    if draft_logits is not None and draft_logits.dtype != target_logits.dtype:
        draft_logits, target_logits = draft_logits.float(), target_logits.float()
    if target_logits.stride(2) != 1:
        target_logits = target_logits.contiguous()
    if draft_logits is not None and (draft_logits.stride(2) != 1 or draft_logits.numel() == 0):
        draft_logits = draft_logits.contiguous()
    if lengths is not None:
        lengths = lengths.contiguous()
    if real is not None and real.stride(1) != 1:
        real = real.contiguous()
    return draft_tokens.contiguous(), draft_logits, target_logits, lengths, real


class _Layout:
    """The checked layout of one step's inputs, as the kernels read them (after :func:`_readable`).

    draft_tokens int64 [B, γ] (γ at most ``max_gamma``); draft/target logits of one dtype, unit stride along V (draft
    None: a deterministic draft, V_d = V_t); lengths int64 [B] or None; real bool [B, γ] or None (trees). Bad input
    raises SamplerInputError (one line).
    """

    def __init__(self, launcher: Launcher, draft_tokens, draft_logits, target_logits, lengths=None, real=None,
                 max_gamma: int = MAX_GAMMA) -> None:
        if draft_tokens.device.type != launcher.device_type:
            raise SamplerInputError(
                f"the {launcher.name} backend needs {launcher.device_type.upper()} tensors; got {draft_tokens.device}: "
                "move them there or use backend='torch'")
        B, gamma = draft_tokens.shape
        vt = target_logits.shape[2]
        if gamma > max_gamma:
            raise SamplerInputError(f"the {launcher.name} backend verifies at most γ = {max_gamma} tokens; "
                                    f"got γ = {gamma}")
        if vt > MAX_VOCAB or vt == 0:
            raise SamplerInputError(f"the {launcher.name} backend needs 1 <= V_t <= {MAX_VOCAB}; got V_t = {vt}")
        if B == 0 or B > 65_535:
            raise SamplerInputError(f"the {launcher.name} backend needs 1 <= B <= 65535; got B = {B}")
        validate_lengths(lengths, draft_tokens)   # metadata only: the values stay on the device, the kernels clamp
        readable = _readable(draft_tokens, draft_logits, target_logits, lengths, real)
        self.converts = any(a is not b for a, b in zip(readable, (draft_tokens, draft_logits, target_logits, lengths,
                                                                    real)))
        _, draft, target, lengths, real = readable
        self.B, self.gamma, self.vt = B, gamma, vt
        self.vd = vt if draft is None else draft.shape[2]
        self.deterministic = draft is None         # the kernels get a null draft pointer
        self.has_lengths, self.has_real = lengths is not None, real is not None
        self.target_strides = target.stride(0), target.stride(1)
        self.draft_strides = (0, 0) if draft is None else (draft.stride(0), draft.stride(1))
        self.real_stride = 0 if real is None else real.stride(0)
        self.dtype = dtype_name(target.dtype)
        self.device = draft_tokens.device
        self.n_chunks = -(-vt // CHUNK)

    def common_args(self) -> tuple:
        """(tokens, lengths, target, draft, γ, V_t, V_d, strides): lengths is a null pointer where there are none,
        and so is draft for a deterministic draft (its strides 0)."""
        return (_In(TOKENS), _In(LENGTHS) if self.has_lengths else _NULL, _In(TARGET),
                _NULL if self.deterministic else _In(DRAFT), i32(self.gamma), i32(self.vt), i32(self.vd),
                i64(self.target_strides[0]), i64(self.target_strides[1]), i64(self.draft_strides[0]),
                i64(self.draft_strides[1]))


def _with_u(args: tuple) -> tuple:
    """Insert the uniforms' address after (tokens, lengths, target, draft), as the kernels take it."""
    return (*args[:4], _In(U), *args[4:])


class Plan:
    """One step shape's launches, made once (:class:`Plans` keeps one per input signature): the argument packs, the
    output tensors, and the uniforms' buffer. :meth:`run` rewrites the inputs' addresses, draws the uniforms, launches
    and returns ``result``: the same tensors on every call.

    launches  (kernel, grid, ArgPack, ((slot, address number), ...)) per launch, in order
    u         float32 [B, γ+1], the uniforms' buffer (None: the step draws none)
    keep      other tensors the kernels read (a tree's table): kept alive with the plan
    """

    def __init__(self, launcher: Launcher, layout: _Layout, stream: object, result: SamplerResult,
                 u: torch.Tensor | None, launches: list[tuple], keep: tuple = ()) -> None:
        self.launcher, self.layout, self.stream = launcher, layout, stream
        self.result, self.u, self.keep = result, u, keep
        self.launches = [(launcher.kernel(kernel, layout.dtype, layout.device), grid, *_pack(args))
                         for kernel, grid, args in launches]

    def run(self, draft_tokens, draft_logits, target_logits, lengths=None, real=None, generator=None,
            u: torch.Tensor | None = None) -> SamplerResult:
        """One step on inputs of this plan's signature. ``u``: float32 [B, γ+1] uniforms (tests, graphs), else drawn
        from ``generator`` as the reference draws them (into the plan's buffer, or a per-row draw's own tensor)."""
        if self.layout.converts:
            draft_tokens, draft_logits, target_logits, lengths, real = _readable(
                draft_tokens, draft_logits, target_logits, lengths, real)
        if u is None and self.u is not None:
            u = self._draw(generator)
        addresses = (draft_tokens.data_ptr(), 0 if lengths is None else lengths.data_ptr(), target_logits.data_ptr(),
                     0 if draft_logits is None else draft_logits.data_ptr(), 0 if u is None else u.data_ptr(),
                     0 if real is None else real.data_ptr())
        for kernel, grid, pack, slots in self.launches:
            for slot, number in slots:
                pack.set(slot, addresses[number])
            self.launcher.launch(kernel, grid, pack, self.stream)
        return self.result

    def _draw(self, generator) -> torch.Tensor:
        """float32 [B, γ+1] uniforms, as contract.uniforms draws them: into the plan's buffer (``uniform_`` draws what
        ``torch.rand`` of that shape would), or a per-row draw (pipeline.rng.RowGenerators) of its own."""
        if generator is None or isinstance(generator, torch.Generator):
            return self.u.uniform_(generator=generator)
        return uniforms(self.layout.B, self.layout.gamma, self.layout.device, generator)


def _pack(args: tuple) -> tuple[ArgPack, tuple[tuple[int, int], ...]]:
    """An ArgPack of ``args`` with 0 where a call's address goes (an _In), and those (slot, address number) pairs."""
    slots = tuple((i, a.index) for i, a in enumerate(args) if isinstance(a, _In))
    return ArgPack(tuple(_NULL if isinstance(a, _In) else a for a in args)), slots


def _outputs(layout: _Layout, cols: int, draws: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A plan's own tensors: out int64 [B, cols], ok bool [2, B] (draft_ok, target_ok) and, where the step ``draws``,
    the uniforms' buffer float32 [B, γ+1]. Made outside inference mode, so a plan made inside it (the decoding loop)
    still draws in place when called outside it."""
    B, device = layout.B, layout.device
    with torch.inference_mode(False):
        out = torch.empty((B, cols), dtype=torch.int64, device=device)
        ok = torch.empty((2, B), dtype=torch.bool, device=device)
        u = torch.empty((B, layout.gamma + 1), dtype=torch.float32, device=device) if draws else None
    return out, ok, u


def _chain_plan(launcher: Launcher, layout: _Layout, stream: object, mode: tuple) -> Plan:
    """The plan of a chain step: ``mode`` ("greedy",), ("exact", temperature) or ("sigmoid", scale, beta)."""
    out, ok, u = _outputs(layout, layout.gamma + 2, draws=mode[0] != "greedy")
    with torch.inference_mode(False):
        result = SamplerResult(accepted=out[:, layout.gamma + 1], tokens=out[:, : layout.gamma + 1],
                               draft_ok=ok[0], target_ok=ok[1])
    outs = (ptr(out), i64(layout.gamma + 2), ptr(out[:, layout.gamma + 1]), i64(layout.gamma + 2), ptr(ok[0]),
            ptr(ok[1]))
    sms = launcher.sm_count(layout.device)
    B, common = layout.B, layout.common_args()
    if mode[0] == "greedy":
        rows = layout.gamma + 1
        slices, per = _split(layout.n_chunks, _BLOCKS_PER_SM * sms / (rows * B))
        ws = launcher.workspace(layout.device, stream).ensure(B, 2 * B * rows * slices)
        launches = [("greedy_verify", (slices, rows, B),
                     (*common, i32(per * CHUNK), ptr(ws.part), ptr(ws.count), *outs))]
    elif mode[0] == "exact":
        inv_t = f32(1.0 / mode[1])
        rows = layout.gamma + 1 if layout.deterministic else 2 * layout.gamma + 1
        slices, per = _split(layout.n_chunks, _BLOCKS_PER_SM * sms / (rows * B))
        ws = launcher.workspace(layout.device, stream).ensure(B, 2 * B * rows * slices)
        blocks, cpb = _split(layout.n_chunks, _BLOCKS_PER_SM * sms / B, _min_chunks(layout.dtype))
        launches = [("exact_partials", (slices, rows, B),
                     (*_with_u(common), inv_t, i32(per * CHUNK), ptr(ws.part), ptr(ws.dec), ptr(ws.nacc),
                      ptr(ws.count), *outs)),
                    ("sample_exact", (blocks, B, 1),
                     (*_with_u(common), inv_t, i32(cpb), ptr(ws.dec), ptr(ws.nacc), ptr(ws.csum), ptr(ws.count),
                      ptr(out), i64(layout.gamma + 2)))]
    else:
        blocks, cpb = _split(layout.n_chunks, _BLOCKS_PER_SM * sms / B, _min_chunks(layout.dtype))
        ws = launcher.workspace(layout.device, stream).ensure(B, 0)
        launches = [("sample_sigmoid", (blocks, B, 1),
                     (*_with_u(common), f32(mode[1]), f32(mode[2]), i32(cpb), ptr(ws.csum), ptr(ws.count),
                      ptr(ws.flags), *outs))]
    return Plan(launcher, layout, stream, result, u, launches)


def _tree_plan(launcher: Launcher, layout: _Layout, stream: object, shape: TokenTree, temperature: float,
               replacement: bool) -> Plan:
    """The plan of a token-tree step (tree_verify_partials, then tree_verify): see :func:`tree_verify`."""
    depth, greedy = shape.depth, temperature == 0.0
    out, ok, u = _outputs(layout, 2 * depth + 2, draws=not greedy)
    with torch.inference_mode(False):
        result = SamplerResult(accepted=out[:, depth + 1], tokens=out[:, : depth + 1], draft_ok=ok[0],
                               target_ok=ok[1], path=out[:, depth + 2:])
    table = _tree_table(shape, str(layout.device))
    tokens, _, target, draft, n, vt, vd, tsb, tsr, dsb, dsr = layout.common_args()
    real_args = (_In(REAL), i64(layout.real_stride)) if layout.has_real else (_NULL, i64(0))
    inv_t = f32(1.0 if greedy else 1.0 / temperature)
    B = layout.B
    rows = layout.gamma + 1 if greedy or layout.deterministic else 2 * layout.gamma + 1
    slices, per = _split(layout.n_chunks, _BLOCKS_PER_SM * launcher.sm_count(layout.device) / (rows * B))
    ws = launcher.workspace(layout.device, stream).ensure(B, 2 * B * rows * slices)
    ld = i64(2 * depth + 2)
    launches = [("tree_verify_partials", (slices, rows, B),
                 (target, draft, n, vt, vd, tsb, tsr, dsb, dsr, inv_t, i32(greedy), i32(per * CHUNK), ptr(ws.part))),
                ("tree_verify", (1, B, 1),
                 (tokens, ptr(table), target, draft, _NULL if greedy else _In(U), *real_args, n, i32(depth), vt,
                  vd, tsb, tsr, dsb, dsr, inv_t, i32(greedy), i32(replacement), i32(slices), ptr(ws.part), ptr(out),
                  ld, ptr(out[:, depth + 1]), ld, ptr(out[:, depth + 2:]), ld, ptr(ok[0]), ptr(ok[1])))]
    return Plan(launcher, layout, stream, result, u, launches, keep=(table,))


def make_plan(launcher: Launcher, mode: tuple, draft_tokens, draft_logits, target_logits, lengths=None,
              real=None) -> Plan:
    """A checked plan for steps like this one (its inputs' signature, on torch's current stream). ``mode``:
    ("greedy",), ("exact", temperature), ("sigmoid", scale, beta) or ("tree", TokenTree, temperature, replacement).
    Bad input raises SamplerInputError (one line)."""
    tree_step = mode[0] == "tree"
    layout = _Layout(launcher, draft_tokens, draft_logits, target_logits, lengths, real,
                     max_gamma=MAX_TREE_NODES if tree_step else MAX_GAMMA)
    launcher.prepare(layout.device)
    stream = launcher.stream(layout.device)
    if tree_step:
        return _tree_plan(launcher, layout, stream, *mode[1:])
    return _chain_plan(launcher, layout, stream, mode)


def _signature(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.dtype, t.shape, t.stride(), t.device)


class Plans:
    """One caller's step plans (a sampler's, a tree verifier's), one per input signature: the mode, the stream, and
    each input's dtype, shape, strides and device. The first call with a signature checks its inputs and makes its
    plan; later calls look it up and only launch, so what they check costs a dictionary lookup.

    A plan's result tensors are its own and are rewritten by the next call with the same signature: read them (or
    ``.clone()``) before that call. Plans are kept for the owner's life (a CUDA graph may hold their buffers).
    """

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self._plans: dict[tuple, Plan] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def key(self, mode: tuple, draft_tokens, draft_logits, target_logits, lengths=None, real=None) -> tuple | None:
        """The call's signature (None where an input is no tensor: the checks then say what is wrong)."""
        try:
            return (mode, self.launcher.stream(draft_tokens.device), _signature(draft_tokens),
                    _signature(draft_logits), _signature(target_logits), _signature(lengths), _signature(real))
        except AttributeError:
            return None

    def get(self, key: tuple | None) -> Plan | None:
        return None if key is None else self._plans.get(key)

    def add(self, key: tuple | None, plan: Plan) -> Plan:
        if key is not None:
            self._plans[key] = plan
        return plan


# ---- the steps -------------------------------------------------------------------------------------------------

def greedy_step(launcher: Launcher, draft_tokens, draft_logits, target_logits,
                lengths: torch.Tensor | None = None) -> SamplerResult:
    """One launch: greedy_verify. ``lengths``: per-row draft lengths, int64 [B] on the step's device, or None.
    A plan of its own (fresh result tensors); the samplers reuse theirs (:class:`Plans`)."""
    return make_plan(launcher, ("greedy",), draft_tokens, draft_logits, target_logits, lengths).run(
        draft_tokens, draft_logits, target_logits, lengths)


def exact_step(launcher: Launcher, draft_tokens, draft_logits, target_logits, temperature: float,
               generator: torch.Generator | None = None, u: torch.Tensor | None = None,
               lengths: torch.Tensor | None = None) -> SamplerResult:
    """Two launches: exact_partials (normalisers, decisions), then sample_exact. Uniforms: ``u`` float32 [B, γ+1]
    when given (tests), else drawn from ``generator`` as the reference draws them. ``lengths``: per-row draft
    lengths, int64 [B] on the step's device, or None. ``draft_logits`` None: a deterministic draft (γ+1 rows
    reduced, the target's only). A plan of its own, as greedy_step."""
    return make_plan(launcher, ("exact", temperature), draft_tokens, draft_logits, target_logits, lengths).run(
        draft_tokens, draft_logits, target_logits, lengths, generator=generator, u=u)


def sigmoid_step(launcher: Launcher, draft_tokens, draft_logits, target_logits, scale: float, beta: float,
                 generator: torch.Generator | None = None, u: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None) -> SamplerResult:
    """One launch: sample_sigmoid with weights sigmoid(scale * z + beta). Uniforms and lengths as for exact_step.
    Needs draft logits (a deterministic draft is refused: pipeline/rules.py). A plan of its own, as greedy_step."""

    if draft_logits is None:
        raise SamplerInputError("sample_sigmoid needs draft logits: the sigmoid rule takes no deterministic draft at "
                                "T > 0; use the exact rule")
    return make_plan(launcher, ("sigmoid", scale, beta), draft_tokens, draft_logits, target_logits, lengths).run(
        draft_tokens, draft_logits, target_logits, lengths, generator=generator, u=u)


# ---- token trees ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _tree_table(shape: TokenTree, device: str) -> torch.Tensor:
    """int32 [2, N+1]: per position (0: the root, n + 1: node n) its first child's node index, then its child count
    (the kernel's ``tree``). Made once per tree and device (copied to the device then, never read back)."""
    first = [kids[0] if kids else 0 for kids in shape.children]
    with torch.inference_mode(False):
        return torch.tensor([first, [len(kids) for kids in shape.children]], dtype=torch.int32, device=device)


def tree_verify(launcher: Launcher, shape: TokenTree, draft_tokens, draft_logits, target_logits, temperature: float,
                replacement: bool = True, generator: torch.Generator | None = None,
                u: torch.Tensor | None = None, real: torch.Tensor | None = None) -> SamplerResult:
    """Exact verification of a token tree (pipeline/samplers/tree.py), two launches: tree_verify_partials (the
    normalisers of the N+1 target and N draft rows, or the target rows' argmax at T = 0), then tree_verify (one block
    per row walks the tree).

    draft_tokens int64 [B, N], draft_logits [B, N, V_d] or None (deterministic children), target_logits
    [B, N+1, V_t]; uniforms ``u`` float32 [B, N+1] where given (tests), else drawn from ``generator`` as the
    reference draws them (none at T = 0); ``real`` bool [B, N] on draft_tokens' device, the nodes each row proposed
    (the others are never tested), or None: every node (a null pointer); the kernel reads the flags in place.
    Returns the SamplerResult over the accepted path: tokens int64 [B, D+1], accepted [B], path int64 [B, D] (node
    indices, -1 after accepted), draft_ok / target_ok [B]. A plan of its own, as greedy_step.
    """
    mode = ("tree", shape, float(temperature), bool(replacement))
    return make_plan(launcher, mode, draft_tokens, draft_logits, target_logits, real=real).run(
        draft_tokens, draft_logits, target_logits, real=real, generator=generator, u=u)


class TreeVerifier(tree.TreeVerifier):
    """tree_verify behind the reference verifier's call (pipeline.samplers.tree.TreeVerifier): the same checks,
    uniforms and result, computed by the kernels of ``launcher``, with a plan per input signature (:class:`Plans`:
    the result tensors are rewritten by the next call with the same signature)."""

    def __init__(self, launcher: Launcher, temperature: float = 1.0, replacement: bool = True) -> None:
        super().__init__(temperature, replacement)
        self.launcher = launcher
        self.plans = Plans(launcher)

    def __call__(self, shape: TokenTree, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
                 target_logits: torch.Tensor, generator=None, real: torch.Tensor | None = None) -> SamplerResult:
        mode = ("tree", shape, self.temperature, self.replacement)
        key = self.plans.key(mode, draft_tokens, draft_logits, target_logits, real=real)
        plan = self.plans.get(key)
        if plan is None:
            tree.check_tree_inputs(shape, draft_tokens, draft_logits, target_logits, real)
            plan = self.plans.add(key, make_plan(self.launcher, mode, draft_tokens, draft_logits, target_logits,
                                                 real=real))
        return plan.run(draft_tokens, draft_logits, target_logits, real=real, generator=generator)


def _min_chunks(dtype: str) -> int:
    """A block step covers 256 threads x 16 bytes: 1 chunk of fp32, 2 chunks of fp16/bf16."""
    return 1 if dtype == "float32" else 2


# ---- the samplers ------------------------------------------------------------------------------------------

class _KernelSampler:
    """What the kernel samplers share: the sampler contract's call through per-signature plans (:class:`Plans`).

    The first call with a signature checks it as the reference does (pipeline.samplers.contract.validate_inputs,
    lengths, a deterministic draft against the rule) and makes its plan; later calls only launch. Per-row lengths go
    to the kernels unclamped (they clamp them on the device). The result's tensors are the plan's own: the next call
    with the same signature rewrites them (read them, or ``.clone()``, first).
    """

    launcher: Launcher

    # No __init__ here: the reference's (the rule's parameters) is the one get_sampler reads and checks against, so
    # what a kernel sampler keeps is made on first use.
    @functools.cached_property
    def plans(self) -> Plans:
        """This sampler's step plans, one per input signature."""
        return Plans(self.launcher)

    @functools.cached_property
    def _tree_verifiers(self) -> dict[tuple, TreeVerifier]:
        return {}

    def prepare(self, device: torch.device) -> None:
        """Compile and load the kernels now: call before capturing a step in a CUDA graph."""
        self.launcher.prepare(torch.device(device))

    def mode(self) -> tuple:
        """The step this sampler runs at its temperature: ("greedy",), ("exact", T) or ("sigmoid", scale, beta)."""
        raise NotImplementedError

    def __call__(self, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None, target_logits: torch.Tensor,
                 generator: torch.Generator | None = None, lengths: torch.Tensor | None = None) -> SamplerResult:
        mode = self.mode()
        key = self.plans.key(mode, draft_tokens, draft_logits, target_logits, lengths)
        plan = self.plans.get(key)
        if plan is None:
            validate_inputs(draft_tokens, draft_logits, target_logits)
            validate_lengths(lengths, draft_tokens)
            if draft_logits is None:
                torch_ref.check_deterministic(self)
            plan = self.plans.add(key, make_plan(self.launcher, mode, draft_tokens, draft_logits, target_logits,
                                                 lengths))
        return plan.run(draft_tokens, draft_logits, target_logits, lengths, generator=generator)

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None) -> SamplerResult:
        """The reference's hook runs the kernels too (what a call runs), never the torch code this class inherits."""
        return self(draft_tokens, draft_logits, target_logits, generator=generator, lengths=lengths)

    def tree_verifier(self, temperature: float, replacement: bool) -> TreeVerifier:
        """The token-tree verifier on this sampler's kernels (pipeline.samplers.tree.TreeSampler asks for it): one
        per (temperature, sibling rule), kept, so its plans are too."""
        key = (float(temperature), bool(replacement))
        verifier = self._tree_verifiers.get(key)
        if verifier is None:
            verifier = self._tree_verifiers[key] = TreeVerifier(self.launcher, *key)
        return verifier


class ExactSampler(_KernelSampler, torch_ref.ExactSampler):
    """Modified rejection sampling (lossless), CUDA kernels. See torch_ref.ExactSampler."""

    backend = "cupy"
    launcher: Launcher = CupyLauncher()

    def mode(self) -> tuple:
        return ("greedy",) if self.temperature == 0.0 else ("exact", self.temperature)


class SigmoidSampler(_KernelSampler, torch_ref.SigmoidSampler):
    """The sigmoid approximation (not lossless), CUDA kernel. See torch_ref.SigmoidSampler."""

    backend = "cupy"
    launcher: Launcher = ExactSampler.launcher

    def mode(self) -> tuple:
        return ("greedy",) if self.temperature == 0.0 else ("sigmoid", self.alpha / self.temperature, self.beta)


class GreedySampler(_KernelSampler, torch_ref.GreedySampler):
    """Argmax matching, CUDA kernel. See torch_ref.GreedySampler."""

    backend = "cupy"
    launcher: Launcher = ExactSampler.launcher

    def mode(self) -> tuple:
        return ("greedy",)


SAMPLERS = {"exact": ExactSampler, "sigmoid": SigmoidSampler, "greedy": GreedySampler}


def bind(launcher: Launcher) -> dict[str, type]:
    """The three kernel samplers driven by another launcher (backend name = ``launcher.name``)."""
    return {name: type(cls.__name__, (cls,), {"launcher": launcher, "backend": launcher.name})
            for name, cls in SAMPLERS.items()}
