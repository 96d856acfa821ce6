"""The ``cupy`` backend: the CUDA verify kernels of kernels/verify.cu behind the sampler contract.

Same samplers, parameters and validation as the torch reference (:mod:`pipeline.samplers.torch_ref`), which
defines what they compute; the same uniforms (``contract.uniforms``: torch's CUDA Philox generator, seeded,
reproducible and CUDA-graph capturable). Inputs are CUDA tensors; the kernels read them in place
(``data_ptr``, any batch/position strides, unit vocabulary stride) and write the result tensors directly.
Launches go to torch's current stream; nothing waits for the device.

    exact    2 launches: exact_partials (normalisers, decisions) then sample_exact (residual/bonus draw)
    sigmoid  1 launch:   sample_sigmoid
    greedy   1 launch:   greedy_verify (also exact/sigmoid at temperature 0)

Limits: γ <= 16, V_t <= 262,144 (one inverse-CDF chunk level of 1024 entries x 256 chunks). Draft and target
logits of different dtypes are both read as fp32 (an upcast copy, exact). A draft token outside [0, V_d)
is rejected and flags ``draft_ok`` False (the reference would raise a device-side assert).
"""

from __future__ import annotations

import functools

import torch

from pipeline.errors import SamplerInputError
from pipeline.samplers import torch_ref
from pipeline.samplers.contract import SamplerResult, uniforms

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# Blocks per SM the launch geometry aims for (kernels are capped at 64 registers: 4 blocks of 256 fit).
_BLOCKS_PER_SM = 4


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


# ---- launch geometry and workspace -------------------------------------------------------------------------

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

    Counters start at zero and each kernel's last block resets its own, so no memset runs per step. Buffers
    grow when a larger step comes; one stream never runs two steps at once, so one workspace per stream is safe.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.batch = 0
        self.part = torch.empty(0, dtype=torch.float32, device=device)

    def ensure(self, batch: int, part_floats: int) -> _Workspace:
        if batch > self.batch:
            d = self.device
            self.batch = batch
            self.count = torch.zeros(batch, dtype=torch.int32, device=d)
            self.flags = torch.zeros(batch, dtype=torch.int32, device=d)
            self.dec = torch.empty((batch, 4), dtype=torch.float32, device=d)
            self.nacc = torch.empty(batch, dtype=torch.int32, device=d)
            from pipeline.kernels.loader import MAX_CHUNKS

            self.csum = torch.empty((batch, MAX_CHUNKS, 2), dtype=torch.float32, device=d)
        if part_floats > self.part.numel():
            self.part = torch.empty(part_floats, dtype=torch.float32, device=self.device)
        return self


_WORKSPACES: dict[tuple[int, int], _Workspace] = {}


def _workspace(device: torch.device) -> _Workspace:
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES[key] = _Workspace(device)
    return ws


# ---- inputs and outputs ------------------------------------------------------------------------------------

class _Step:
    """Checked kernel inputs of one verify step, and its result tensors.

    draft_tokens int64 [B, γ] (contiguous); draft/target logits of one dtype, unit stride along V.
    out int64 [B, γ+2]: tokens in columns 0..γ, accepted in column γ+1. ok bool [2, B]: draft_ok, target_ok.
    """

    def __init__(self, draft_tokens: torch.Tensor, draft_logits: torch.Tensor, target_logits: torch.Tensor) -> None:
        from pipeline.kernels.loader import MAX_GAMMA, MAX_VOCAB

        if draft_tokens.device.type != "cuda":
            raise SamplerInputError(
                f"the cupy backend needs CUDA tensors; got {draft_tokens.device}: move them with .cuda() or use "
                "backend='torch'")
        B, gamma = draft_tokens.shape
        vt, vd = target_logits.shape[2], draft_logits.shape[2]
        if gamma > MAX_GAMMA:
            raise SamplerInputError(f"the cupy backend verifies at most γ = {MAX_GAMMA} tokens; got γ = {gamma}")
        if vt > MAX_VOCAB or vt == 0:
            raise SamplerInputError(f"the cupy backend needs 1 <= V_t <= {MAX_VOCAB}; got V_t = {vt}")
        if B == 0 or B > 65_535:
            raise SamplerInputError(f"the cupy backend needs 1 <= B <= 65535; got B = {B}")
        if draft_logits.dtype != target_logits.dtype:  # one kernel dtype: read both as fp32 (exact upcast)
            draft_logits, target_logits = draft_logits.float(), target_logits.float()
        if target_logits.stride(2) != 1:
            target_logits = target_logits.contiguous()
        if draft_logits.stride(2) != 1 or draft_logits.numel() == 0:
            draft_logits = draft_logits.contiguous()
        self.tokens_in = draft_tokens.contiguous()
        self.draft, self.target = draft_logits, target_logits
        self.B, self.gamma, self.vt, self.vd = B, gamma, vt, vd
        self.dtype = _DTYPE_NAMES[target_logits.dtype]
        self.device = draft_tokens.device
        self.device_index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.n_chunks = -(-vt // 1024)
        self.out = torch.empty((B, gamma + 2), dtype=torch.int64, device=self.device)
        self.ok = torch.empty((2, B), dtype=torch.bool, device=self.device)

    def common_args(self) -> tuple:
        from pipeline.kernels.loader import i32, i64, ptr

        return (ptr(self.tokens_in), ptr(self.target), ptr(self.draft), i32(self.gamma), i32(self.vt),
                i32(self.vd), i64(self.target.stride(0)), i64(self.target.stride(1)), i64(self.draft.stride(0)),
                i64(self.draft.stride(1)))

    def out_args(self) -> tuple:
        from pipeline.kernels.loader import i64, ptr

        return (ptr(self.out), i64(self.gamma + 2), ptr(self.out[:, self.gamma + 1]), i64(self.gamma + 2),
                ptr(self.ok[0]), ptr(self.ok[1]))

    def result(self) -> SamplerResult:
        return SamplerResult(accepted=self.out[:, self.gamma + 1], tokens=self.out[:, : self.gamma + 1],
                             draft_ok=self.ok[0], target_ok=self.ok[1])


def _with_u(args: tuple, u: torch.Tensor) -> tuple:
    """Insert the uniforms pointer after (tokens, target, draft), as the kernels take it."""
    from pipeline.kernels.loader import ptr

    return (*args[:3], ptr(u), *args[3:])


def _greedy(draft_tokens, draft_logits, target_logits) -> SamplerResult:
    from pipeline.kernels.loader import CHUNK, i32, launch, ptr

    step = _Step(draft_tokens, draft_logits, target_logits)
    rows = step.gamma + 1
    slices, per = _split(step.n_chunks, _BLOCKS_PER_SM * _sm_count(step.device_index) / (rows * step.B))
    ws = _workspace(step.device).ensure(step.B, 2 * step.B * rows * slices)
    args = (*step.common_args(), i32(per * CHUNK), ptr(ws.part), ptr(ws.count), *step.out_args())
    launch("greedy_verify", step.dtype, (slices, rows, step.B), args, step.device_index)
    return step.result()


def _exact(draft_tokens, draft_logits, target_logits, temperature: float, generator) -> SamplerResult:
    from pipeline.kernels.loader import CHUNK, f32, i32, i64, launch, ptr

    step = _Step(draft_tokens, draft_logits, target_logits)
    u = uniforms(step.B, step.gamma, step.device, generator)
    inv_t = f32(1.0 / temperature)
    sms = _sm_count(step.device_index)
    rows = 2 * step.gamma + 1
    slices, per = _split(step.n_chunks, _BLOCKS_PER_SM * sms / (rows * step.B))
    ws = _workspace(step.device).ensure(step.B, 2 * step.B * rows * slices)
    common = _with_u(step.common_args(), u)
    launch("exact_partials", step.dtype, (slices, rows, step.B),
           (*common, inv_t, i32(per * CHUNK), ptr(ws.part), ptr(ws.dec), ptr(ws.nacc), ptr(ws.count),
            *step.out_args()), step.device_index)
    blocks, cpb = _split(step.n_chunks, _BLOCKS_PER_SM * sms / step.B, _min_chunks(step.dtype))
    launch("sample_exact", step.dtype, (blocks, step.B, 1),
           (*common, inv_t, i32(cpb), ptr(ws.dec), ptr(ws.nacc), ptr(ws.csum), ptr(ws.count), ptr(step.out),
            i64(step.gamma + 2)), step.device_index)
    return step.result()


def _sigmoid(draft_tokens, draft_logits, target_logits, scale: float, beta: float, generator) -> SamplerResult:
    from pipeline.kernels.loader import f32, i32, launch, ptr

    step = _Step(draft_tokens, draft_logits, target_logits)
    u = uniforms(step.B, step.gamma, step.device, generator)
    blocks, cpb = _split(step.n_chunks, _BLOCKS_PER_SM * _sm_count(step.device_index) / step.B,
                         _min_chunks(step.dtype))
    ws = _workspace(step.device).ensure(step.B, 0)
    launch("sample_sigmoid", step.dtype, (blocks, step.B, 1),
           (*_with_u(step.common_args(), u), f32(scale), f32(beta), i32(cpb), ptr(ws.csum), ptr(ws.count),
            ptr(ws.flags), *step.out_args()), step.device_index)
    return step.result()


def _min_chunks(dtype: str) -> int:
    """A block step covers 256 threads x 16 bytes: 1 chunk of fp32, 2 chunks of fp16/bf16."""
    return 1 if dtype == "float32" else 2


# ---- the samplers ------------------------------------------------------------------------------------------

class ExactSampler(torch_ref.ExactSampler):
    """Modified rejection sampling (lossless), CUDA kernels. See torch_ref.ExactSampler."""

    backend = "cupy"

    def _verify(self, draft_tokens, draft_logits, target_logits, generator):
        if self.temperature == 0.0:
            return _greedy(draft_tokens, draft_logits, target_logits)
        return _exact(draft_tokens, draft_logits, target_logits, self.temperature, generator)


class SigmoidSampler(torch_ref.SigmoidSampler):
    """The sigmoid approximation (not lossless), CUDA kernel. See torch_ref.SigmoidSampler."""

    backend = "cupy"

    def _verify(self, draft_tokens, draft_logits, target_logits, generator):
        if self.temperature == 0.0:
            return _greedy(draft_tokens, draft_logits, target_logits)
        return _sigmoid(draft_tokens, draft_logits, target_logits, self.alpha / self.temperature, self.beta,
                        generator)


class GreedySampler(torch_ref.GreedySampler):
    """Argmax matching, CUDA kernel. See torch_ref.GreedySampler."""

    backend = "cupy"

    def _verify(self, draft_tokens, draft_logits, target_logits, generator):
        return _greedy(draft_tokens, draft_logits, target_logits)


SAMPLERS = {"exact": ExactSampler, "sigmoid": SigmoidSampler, "greedy": GreedySampler}
