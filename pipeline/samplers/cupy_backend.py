"""The ``cupy`` backend: the CUDA verify kernels of kernels/verify.cu behind the sampler contract.

Same samplers, parameters and validation as the torch reference (:mod:`pipeline.samplers.torch_ref`), which
defines what they compute; the same uniforms (``contract.uniforms``: torch's CUDA Philox generator, seeded,
reproducible and CUDA-graph capturable). Inputs are CUDA tensors; the kernels read them in place
(``data_ptr``, any batch/position strides, unit vocabulary stride) and write the result tensors directly.
Launches go to torch's current stream; nothing waits for the device.

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
    f32,
    i32,
    i64,
    launch,
    module,
    ptr,
)
from pipeline.samplers import torch_ref, tree
from pipeline.samplers.contract import SamplerResult, uniforms, validate_lengths
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

    The production launcher is :class:`CupyLauncher` (CUDA through CuPy). The test suite injects a CPU runtime
    for CUDA kernels (tests/cuda_on_cpu) through :func:`bind`, so the kernels also execute where CI runs.
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

    def stream_key(self, device: torch.device) -> object:
        """Steps with the same key run one after another (one stream): they may share a workspace."""
        raise NotImplementedError

    def launch(self, kernel: str, dtype: str, grid: tuple[int, int, int], args: tuple, device: torch.device) -> None:
        """Launch ``kernel<dtype>`` over ``grid`` with ``THREADS`` threads per block; ``args`` as the kernel takes
        them (pointers as np.uint64, then np.int32 / np.int64 / np.float32 scalars)."""
        raise NotImplementedError

    def workspace(self, device: torch.device) -> _Workspace:
        key = self.stream_key(device)
        ws = self._workspaces.get(key)
        if ws is None:
            ws = self._workspaces[key] = _Workspace(device)
        return ws


class CupyLauncher(Launcher):
    """The CUDA kernels on a GPU, compiled by NVRTC and launched by CuPy on torch's current stream."""

    name = "cupy"
    device_type = "cuda"

    @staticmethod
    def _index(device: torch.device) -> int:
        return device.index if device.index is not None else torch.cuda.current_device()

    def prepare(self, device: torch.device) -> None:

        module(self._index(device))

    def sm_count(self, device: torch.device) -> int:
        return _sm_count(self._index(device))

    def stream_key(self, device: torch.device) -> object:
        return self._index(device), torch.cuda.current_stream(device).cuda_stream

    def launch(self, kernel, dtype, grid, args, device) -> None:

        launch(kernel, dtype, grid, args, self._index(device))


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
    are kept, never freed, because a CUDA graph captured earlier still refers to them. One stream never runs two
    steps at once, so one workspace per stream is safe.
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


# ---- inputs and outputs ------------------------------------------------------------------------------------

class _Step:
    """Checked kernel inputs of one verify step, and its result tensors.

    draft_tokens int64 [B, γ] (contiguous; γ at most ``max_gamma``); draft/target logits of one dtype, unit stride
    along V (draft None: a deterministic draft, V_d = V_t, a null pointer for the kernels); lengths int64 [B]
    (contiguous) or None. out int64 [B, γ+2] (``out_cols`` columns where given): tokens in columns 0..γ, accepted in
    column γ+1. ok bool [2, B]: draft_ok, target_ok.
    """

    def __init__(self, launcher: Launcher, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
                 target_logits: torch.Tensor, lengths: torch.Tensor | None = None, max_gamma: int = MAX_GAMMA,
                 out_cols: int | None = None) -> None:

        if draft_tokens.device.type != launcher.device_type:
            raise SamplerInputError(
                f"the {launcher.name} backend needs {launcher.device_type.upper()} tensors; got {draft_tokens.device}: "
                "move them there or use backend='torch'")
        B, gamma = draft_tokens.shape
        vt = target_logits.shape[2]
        vd = vt if draft_logits is None else draft_logits.shape[2]
        if gamma > max_gamma:
            raise SamplerInputError(f"the {launcher.name} backend verifies at most γ = {max_gamma} tokens; "
                                    f"got γ = {gamma}")
        if vt > MAX_VOCAB or vt == 0:
            raise SamplerInputError(f"the {launcher.name} backend needs 1 <= V_t <= {MAX_VOCAB}; got V_t = {vt}")
        if B == 0 or B > 65_535:
            raise SamplerInputError(f"the {launcher.name} backend needs 1 <= B <= 65535; got B = {B}")
        validate_lengths(lengths, draft_tokens)   # metadata only: the values stay on the device, the kernels clamp
        if lengths is not None:
            lengths = lengths.contiguous()
        if draft_logits is not None and draft_logits.dtype != target_logits.dtype:  # one kernel dtype: read both
            draft_logits, target_logits = draft_logits.float(), target_logits.float()   # as fp32 (exact upcast)
        if target_logits.stride(2) != 1:
            target_logits = target_logits.contiguous()
        if draft_logits is not None and (draft_logits.stride(2) != 1 or draft_logits.numel() == 0):
            draft_logits = draft_logits.contiguous()
        self.launcher = launcher
        self.tokens_in = draft_tokens.contiguous()
        self.lengths = lengths
        self.draft, self.target = draft_logits, target_logits
        self.B, self.gamma, self.vt, self.vd = B, gamma, vt, vd
        self.dtype = dtype_name(target_logits.dtype)
        self.device = draft_tokens.device
        launcher.prepare(self.device)
        self.sms = launcher.sm_count(self.device)
        self.n_chunks = -(-vt // 1024)
        self.out = torch.empty((B, gamma + 2 if out_cols is None else out_cols), dtype=torch.int64, device=self.device)
        self.ok = torch.empty((2, B), dtype=torch.bool, device=self.device)

    def uniforms(self, generator: torch.Generator | None) -> torch.Tensor:
        return uniforms(self.B, self.gamma, self.device, generator)

    def workspace(self, part_floats: int) -> _Workspace:
        return self.launcher.workspace(self.device).ensure(self.B, part_floats)

    def launch(self, kernel: str, grid: tuple[int, int, int], args: tuple) -> None:
        self.launcher.launch(kernel, self.dtype, grid, args, self.device)

    @property
    def deterministic(self) -> bool:
        """A deterministic draft (draft_logits None): the kernels get a null draft pointer."""
        return self.draft is None

    def common_args(self) -> tuple:
        """(tokens, lengths, target, draft, γ, V_t, V_d, strides): lengths is a null pointer where it is None, and so
        is draft for a deterministic draft (its strides 0)."""

        lengths = ptr(self.lengths) if self.lengths is not None else _NULL
        if self.draft is None:
            draft, dsb, dsr = _NULL, i64(0), i64(0)
        else:
            draft, dsb, dsr = ptr(self.draft), i64(self.draft.stride(0)), i64(self.draft.stride(1))
        return (ptr(self.tokens_in), lengths, ptr(self.target), draft, i32(self.gamma), i32(self.vt),
                i32(self.vd), i64(self.target.stride(0)), i64(self.target.stride(1)), dsb, dsr)

    def out_args(self) -> tuple:

        return (ptr(self.out), i64(self.gamma + 2), ptr(self.out[:, self.gamma + 1]), i64(self.gamma + 2),
                ptr(self.ok[0]), ptr(self.ok[1]))

    def result(self) -> SamplerResult:
        return SamplerResult(accepted=self.out[:, self.gamma + 1], tokens=self.out[:, : self.gamma + 1],
                             draft_ok=self.ok[0], target_ok=self.ok[1])


def _with_u(args: tuple, u: torch.Tensor) -> tuple:
    """Insert the uniforms pointer after (tokens, lengths, target, draft), as the kernels take it."""

    return (*args[:4], ptr(u), *args[4:])


def greedy_step(launcher: Launcher, draft_tokens, draft_logits, target_logits,
                lengths: torch.Tensor | None = None) -> SamplerResult:
    """One launch: greedy_verify. ``lengths``: per-row draft lengths, int64 [B] on the step's device, or None."""

    step = _Step(launcher, draft_tokens, draft_logits, target_logits, lengths)
    rows = step.gamma + 1
    slices, per = _split(step.n_chunks, _BLOCKS_PER_SM * step.sms / (rows * step.B))
    ws = step.workspace(2 * step.B * rows * slices)
    args = (*step.common_args(), i32(per * CHUNK), ptr(ws.part), ptr(ws.count), *step.out_args())
    step.launch("greedy_verify", (slices, rows, step.B), args)
    return step.result()


def exact_step(launcher: Launcher, draft_tokens, draft_logits, target_logits, temperature: float,
               generator: torch.Generator | None = None, u: torch.Tensor | None = None,
               lengths: torch.Tensor | None = None) -> SamplerResult:
    """Two launches: exact_partials (normalisers, decisions), then sample_exact. Uniforms: ``u`` float32 [B, γ+1]
    when given (tests), else drawn from ``generator`` as the reference draws them. ``lengths``: per-row draft
    lengths, int64 [B] on the step's device, or None. ``draft_logits`` None: a deterministic draft (γ+1 rows
    reduced, the target's only)."""

    step = _Step(launcher, draft_tokens, draft_logits, target_logits, lengths)
    u = step.uniforms(generator) if u is None else u
    inv_t = f32(1.0 / temperature)
    rows = step.gamma + 1 if step.deterministic else 2 * step.gamma + 1
    slices, per = _split(step.n_chunks, _BLOCKS_PER_SM * step.sms / (rows * step.B))
    ws = step.workspace(2 * step.B * rows * slices)
    common = _with_u(step.common_args(), u)
    step.launch("exact_partials", (slices, rows, step.B),
                (*common, inv_t, i32(per * CHUNK), ptr(ws.part), ptr(ws.dec), ptr(ws.nacc), ptr(ws.count),
                 *step.out_args()))
    blocks, cpb = _split(step.n_chunks, _BLOCKS_PER_SM * step.sms / step.B, _min_chunks(step.dtype))
    step.launch("sample_exact", (blocks, step.B, 1),
                (*common, inv_t, i32(cpb), ptr(ws.dec), ptr(ws.nacc), ptr(ws.csum), ptr(ws.count), ptr(step.out),
                 i64(step.gamma + 2)))
    return step.result()


def sigmoid_step(launcher: Launcher, draft_tokens, draft_logits, target_logits, scale: float, beta: float,
                 generator: torch.Generator | None = None, u: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None) -> SamplerResult:
    """One launch: sample_sigmoid with weights sigmoid(scale * z + beta). Uniforms and lengths as for exact_step.
    Needs draft logits (a deterministic draft is refused: pipeline/rules.py)."""

    if draft_logits is None:
        raise SamplerInputError("sample_sigmoid needs draft logits: the sigmoid rule takes no deterministic draft at "
                                "T > 0; use the exact rule")
    step = _Step(launcher, draft_tokens, draft_logits, target_logits, lengths)
    u = step.uniforms(generator) if u is None else u
    blocks, cpb = _split(step.n_chunks, _BLOCKS_PER_SM * step.sms / step.B, _min_chunks(step.dtype))
    ws = step.workspace(0)
    step.launch("sample_sigmoid", (blocks, step.B, 1),
                (*_with_u(step.common_args(), u), f32(scale), f32(beta), i32(cpb), ptr(ws.csum), ptr(ws.count),
                 ptr(ws.flags), *step.out_args()))
    return step.result()


# ---- token trees ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _tree_table(shape: TokenTree, device: str) -> torch.Tensor:
    """int32 [2, N+1]: per position (0: the root, n + 1: node n) its first child's node index, then its child count
    (the kernel's ``tree``). Made once per tree and device (copied to the device then, never read back)."""
    first = [kids[0] if kids else 0 for kids in shape.children]
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
    indices, -1 after accepted), draft_ok / target_ok [B].
    """
    depth = shape.depth
    step = _Step(launcher, draft_tokens, draft_logits, target_logits, max_gamma=MAX_TREE_NODES,
                 out_cols=2 * depth + 2)
    greedy = temperature == 0.0
    if not greedy and u is None:
        u = step.uniforms(generator)
    tokens, _, target, draft, n, vt, vd, tsb, tsr, dsb, dsr = step.common_args()
    if real is not None and real.stride(1) != 1:
        real = real.contiguous()
    real_args = (_NULL, i64(0)) if real is None else (ptr(real), i64(real.stride(0)))
    inv_t = f32(1.0 if greedy else 1.0 / temperature)
    rows = step.gamma + 1 if greedy or step.deterministic else 2 * step.gamma + 1
    slices, per = _split(step.n_chunks, _BLOCKS_PER_SM * step.sms / (rows * step.B))
    ws = step.workspace(2 * step.B * rows * slices)
    step.launch("tree_verify_partials", (slices, rows, step.B),
                (target, draft, n, vt, vd, tsb, tsr, dsb, dsr, inv_t, i32(greedy), i32(per * CHUNK), ptr(ws.part)))
    ld = i64(2 * depth + 2)
    out = step.out
    step.launch("tree_verify", (1, step.B, 1),
                (tokens, ptr(_tree_table(shape, str(step.device))), target, draft, _NULL if greedy else ptr(u),
                 *real_args, n, i32(depth), vt, vd, tsb, tsr, dsb, dsr, inv_t, i32(greedy), i32(replacement),
                 i32(slices), ptr(ws.part), ptr(out), ld, ptr(out[:, depth + 1]), ld, ptr(out[:, depth + 2:]), ld,
                 ptr(step.ok[0]), ptr(step.ok[1])))
    return SamplerResult(accepted=out[:, depth + 1], tokens=out[:, : depth + 1], draft_ok=step.ok[0],
                         target_ok=step.ok[1], path=out[:, depth + 2:])


class TreeVerifier(tree.TreeVerifier):
    """tree_verify behind the reference verifier's call (pipeline.samplers.tree.TreeVerifier): the same checks,
    uniforms and result, computed by the kernels of ``launcher``."""

    def __init__(self, launcher: Launcher, temperature: float = 1.0, replacement: bool = True) -> None:
        super().__init__(temperature, replacement)
        self.launcher = launcher

    def __call__(self, shape: TokenTree, draft_tokens: torch.Tensor, draft_logits: torch.Tensor | None,
                 target_logits: torch.Tensor, generator=None, real: torch.Tensor | None = None) -> SamplerResult:
        tree.check_tree_inputs(shape, draft_tokens, draft_logits, target_logits, real)
        return tree_verify(self.launcher, shape, draft_tokens, draft_logits, target_logits, self.temperature,
                           self.replacement, generator, real=real)


def _min_chunks(dtype: str) -> int:
    """A block step covers 256 threads x 16 bytes: 1 chunk of fp32, 2 chunks of fp16/bf16."""
    return 1 if dtype == "float32" else 2


# ---- the samplers ------------------------------------------------------------------------------------------

class ExactSampler(torch_ref.ExactSampler):
    """Modified rejection sampling (lossless), CUDA kernels. See torch_ref.ExactSampler."""

    backend = "cupy"
    launcher: Launcher = CupyLauncher()

    def prepare(self, device: torch.device) -> None:
        """Compile and load the kernels now: call before capturing a step in a CUDA graph."""
        self.launcher.prepare(torch.device(device))

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        if self.temperature == 0.0:
            return greedy_step(self.launcher, draft_tokens, draft_logits, target_logits, lengths)
        return exact_step(self.launcher, draft_tokens, draft_logits, target_logits, self.temperature, generator,
                          lengths=lengths)

    def tree_verifier(self, temperature: float, replacement: bool) -> TreeVerifier:
        """The token-tree verifier on this sampler's kernels (pipeline.samplers.tree.TreeSampler asks for it)."""
        return TreeVerifier(self.launcher, temperature, replacement)


class SigmoidSampler(torch_ref.SigmoidSampler):
    """The sigmoid approximation (not lossless), CUDA kernel. See torch_ref.SigmoidSampler."""

    backend = "cupy"
    launcher: Launcher = ExactSampler.launcher
    prepare = ExactSampler.prepare

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        if self.temperature == 0.0:
            return greedy_step(self.launcher, draft_tokens, draft_logits, target_logits, lengths)
        return sigmoid_step(self.launcher, draft_tokens, draft_logits, target_logits, self.alpha / self.temperature,
                            self.beta, generator, lengths=lengths)


class GreedySampler(torch_ref.GreedySampler):
    """Argmax matching, CUDA kernel. See torch_ref.GreedySampler."""

    backend = "cupy"
    launcher: Launcher = ExactSampler.launcher
    prepare = ExactSampler.prepare
    tree_verifier = ExactSampler.tree_verifier

    def verify_checked(self, draft_tokens, draft_logits, target_logits, generator, lengths=None):
        return greedy_step(self.launcher, draft_tokens, draft_logits, target_logits, lengths)


SAMPLERS = {"exact": ExactSampler, "sigmoid": SigmoidSampler, "greedy": GreedySampler}


def bind(launcher: Launcher) -> dict[str, type]:
    """The three kernel samplers driven by another launcher (backend name = ``launcher.name``)."""
    return {name: type(cls.__name__, (cls,), {"launcher": launcher, "backend": launcher.name})
            for name, cls in SAMPLERS.items()}
