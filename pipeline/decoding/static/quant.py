"""Quantised projections of the static forward (``--draft-quant int8|int4[+a8]``, for a draft model), and a model
quantised in place (``--target-quant``, :func:`quantize_model`: the same quantisation, no dense copies).

Why. On a CPU a forward over one or two tokens is bound by the weights it reads: every projection streams its whole
weight matrix from memory for a handful of rows. Stored in fewer bytes (int8: one byte per weight; int4: half a byte)
and multiplied by kernels that read the small weights and widen them in registers (int8: torch's
``torch.ops.aten._weight_int8pack_mm``, as gpt-fast and torchao use it; int4: ours, kernels/int4_linear.cpp, where it
runs, else torch's ``_weight_int4pack_mm_for_cpu``), a draft forward costs less. A quantised draft is lossless: the
verify step compares the draft's proposals with the unchanged target's law, so the output stays exactly the target's;
a coarser draft can only propose worse, which lowers acceptance. A quantised target (:func:`quantize_model`) is another
model: its projections keep the quantised weights alone (QuantizedLinear), speculation reproduces that model exactly,
and quality against an unquantised run measures what quantising cost.

What each projection y = x @ W.T + b (W [N, K], x [..., K]) becomes:

  none  F.linear(x, W, b), as before
  int8  per output row n a scale s_n = max_k |W[n, k]| / 127 and int8 q = round(W / s) in [-127, 127]:
        W ≈ q * s; the kernel computes (x @ q.T) * s in x's dtype (bfloat16 or float32)
  int4  per output row n and group of GROUP inputs a scale s = (max - min) / 15 and the group's minimum: q =
        round((W - min) / s) in [0, 15], W ≈ q * s + min. Ours (Int4Linear) keeps q two to a byte, s and
        min - 128 s in float32, in the layout kernels/int4_linear.cpp gives, and sums in float32 with one rounding to
        bfloat16. torch's stores q in a layout of its own (``_convert_weight_to_int4pack_for_cpu``) and reads
        scales_and_zeros bfloat16 [K / GROUP, N, 2] of (s, z) with W ≈ (q - 8) * s + z, so z = min + 8 s; its
        vectorised path is bfloat16 only, and it needs N a multiple of 16: W gets zero rows up to one, and the
        output is cut back to N columns

The kernels' cost grows with the rows far faster than a bfloat16 matmul's (they widen the weights again for each block
of rows, and spend arithmetic per row that a matmul does not): past KERNEL_ROWS rows (a prompt's prefill, a wide batch)
a projection multiplies the dequantised weight (q * s, or q * s + min), computed once in the model's dtype, with
F.linear or, with ``packed``, from a packed copy of it (packed.py; the copy replaces the dequantised weight): the same
weights at a matmul's speed, for the memory of one more copy of the draft's projections. Measured per shape, rows and
thread count by ``python -m pipeline.benchmarks.quant_linear`` (docs/benchmarks.md).

With ``+a8`` (``int8+a8``, ``int4+a8``) a projection over A8_ROWS rows or more (a prompt's prefill) multiplies
int8 by int8 instead: its input is quantised per row (a scale t_m = max_k |x[m, k]| / 127, p = round(x / t)), and
torch._int_mm computes p @ q8.T in int32 (with AVX-512 VNNI a CPU does twice as many int8 multiply-adds per
instruction as bfloat16 ones); y = that * t_m * s8_n in x's dtype, with q8, s8 the weight's int8 copy (int8: q and s
themselves; int4: the dequantised weight quantised again, per output row). A prefill is bound by arithmetic, not by
memory, so this is where a draft's prefill gets cheaper (per shape and rows: ``python -m
pipeline.benchmarks.quant_linear --rows 64,128,440``, docs/benchmarks.md); the draft's prompt states carry the
activations' rounding too, which can only lower acceptance (on the Qwen2.5-Coder pair enough to cancel the saving:
docs/results.md).

Only the static forward of the Llama family (llama.py) takes quantised projections; the kernels run on a CPU
(:func:`check_supported` refuses the rest in one line).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pipeline.decoding.static.packed import PackedLinear, available
from pipeline.errors import SpecsweepError
from pipeline.kernels import cpu

MODES = ("none", "int8", "int4", "int8+a8", "int4+a8")
GROUP = 128
"""int4: the inputs that share one scale and zero (a divisor of every in-features of the Qwen2.5 drafts: 896, 4864)."""
KERNEL_ROWS = 4
"""A projection over at most this many rows (tokens x batch rows) runs the kernel; over more, F.linear over the
dequantised weight. Both kernels work in blocks of 4 rows: on this project's CPU (2 threads) they beat bfloat16
F.linear at 1 to 4 rows and lose to it at 5 for most of a draft's shapes (docs/benchmarks.md,
results/bench/quant-linear-cpu.json)."""
A8_ROWS = 64
"""With a "+a8" mode, a projection over at least this many rows multiplies int8 by int8 (docstring above); between
KERNEL_ROWS and this, F.linear over the dequantised weight (a few rows of a tree or a batch: the int8 product's
per-call costs, the input's quantisation and the int32 result's rescaling, are not paid back there)."""
INT8_INPUTS = 16
"""int8: torch's kernel (``_weight_int8pack_mm``) reads a row's inputs K in blocks of this many; with K not a multiple
it returns garbage or crashes the process (torch 2.13, K = 8, 24, 136), so such a weight is refused."""
INT4_ROWS = 16
"""int4 pads the output rows N of W to a multiple of this (the kernel's block)."""

Projection = Callable[[torch.Tensor], torch.Tensor]
"""x [..., K] -> y [..., N]: one linear layer of a static forward."""


def check_supported(mode: str, device: torch.device | str, dtype: torch.dtype, role: str = "draft") -> None:
    """Whether ``mode`` can run on ``device`` in ``dtype``: one-line SpecsweepError if not (the CPU kernels only;
    int4's vectorised kernel is bfloat16 only, its float32 path a scalar loop ~10x slower than F.linear). ``role``:
    "draft" or "target", the model the flag (``--draft-quant``, ``--target-quant``) quantises."""
    flag = f"--{role}-quant"
    if mode not in MODES:
        raise SpecsweepError(f"{flag} {mode!r} is not one of {list(MODES)}")
    if mode == "none":
        return
    weights = weight_mode(mode)
    if torch.device(device).type != "cpu":
        raise SpecsweepError(f"{flag} {mode} runs torch's CPU kernels; the {role} is on {device}: drop "
                             f"{flag} (or run on --device cpu)")
    allowed = (torch.bfloat16,) if weights == "int4" else (torch.bfloat16, torch.float32)
    if dtype not in allowed:
        names = " or ".join(str(d).removeprefix("torch.") for d in allowed)
        raise SpecsweepError(f"{flag} {mode} multiplies in {names} (its CPU kernel's fast path); the {role} is "
                             f"{str(dtype).removeprefix('torch.')}: use --dtype bfloat16"
                             + (f", or {flag} {mode.replace('int4', 'int8')}" if weights == "int4" else ""))


def weight_mode(mode: str) -> str:
    """How ``mode`` stores the weights: "int8+a8" -> "int8", "int4+a8" -> "int4", the others themselves."""
    return mode.removesuffix("+a8")


def projection(weight: torch.Tensor, bias: torch.Tensor | None, mode: str = "none", packed: bool = False,
               few_rows: bool = True) -> Projection:
    """The projection x [..., K] -> x @ weight.T + bias [..., N] for weight [N, K], bias [N] or None, with the weight
    stored as ``mode`` says (see the module docstring; "none": F.linear over ``weight`` itself, no copy). ``packed``,
    where packed.py's product runs: "none" multiplies a packed copy of ``weight``; a quantised projection's product
    past KERNEL_ROWS, a packed copy of its dequantised weight (QuantLinear's ``wide``). ``few_rows``: PackedLinear's
    (False: no bf16_linear copy)."""
    if mode == "none":
        if packed and available(weight.device, weight.dtype):
            return PackedLinear([weight], [bias], few_rows)
        return functools.partial(F.linear, weight=weight, bias=bias)
    check_supported(mode, weight.device, weight.dtype)
    a8 = mode.endswith("+a8")
    kind = Int8Linear if weight_mode(mode) == "int8" else Int4Linear
    return kind(weight, bias, a8=a8, packed=packed)


ROWS_AT_ONCE = 4096
"""quantize_int8 works through a weight this many rows at a time: its float32 temporaries stay a few MB where a
whole head's would be a GB (a 151936-row head of 1536 inputs)."""


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (q int8 [N, K], scales [N] in weight's dtype), weight ≈ q * scales[:, None]."""
    q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for start in range(0, weight.shape[0], ROWS_AT_ONCE):
        rows = slice(start, start + ROWS_AT_ONCE)
        w = weight[rows].float()
        scales[rows] = w.abs().amax(dim=1).clamp_min(1e-12) / 127
        q[rows] = torch.round(w / scales[rows, None]).clamp_(-127, 127)
    return q, scales.to(weight.dtype)


def quantize_int4(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] (K a multiple of ``group``) -> (q int32 [N, K] in 0..15, scales float32 [N, K / group],
    minima float32 [N, K / group]), weight[n, k] ≈ q[n, k] * scales[n, k // group] + minima[n, k // group]."""
    N, K = weight.shape
    w = weight.float().view(N, K // group, group)
    lo, hi = w.amin(dim=2), w.amax(dim=2)
    scales = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((w - lo[..., None]) / scales[..., None]).clamp_(0, 15).to(torch.int32)
    return q.view(N, K), scales, lo


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (p int8 [M, K], t float32 [M, 1]), x ≈ p * t: one symmetric scale per row (dynamic quantisation of
    a projection's input; a row of zeros gets p = 0)."""
    t = x.abs().amax(dim=1, keepdim=True).float().div_(127).clamp_min_(1e-12)
    return torch.round(x / t).to(torch.int8), t


def int8_product(x: torch.Tensor, q8: torch.Tensor, s8: torch.Tensor) -> torch.Tensor:
    """x [M, K] (bfloat16 or float32) -> x @ (q8 * s8[:, None]).T [M, N] in x's dtype, int8 by int8: q8 int8 [N, K],
    s8 [N] in x's dtype (see the module docstring, ``+a8``)."""
    p, t = quantize_rows(x)
    return torch._int_mm(p, q8.t()).to(x.dtype).mul_(s8).mul_(t.to(x.dtype))


class QuantLinear:
    """What a quantised projection does with a forward's rows (the module docstring says why): up to KERNEL_ROWS,
    its weight-only kernel; from A8_ROWS on, with an int8 copy (``+a8``), the int8-by-int8 product; otherwise
    F.linear over the dequantised weight. A subclass sets the attributes below and defines ``kernel``.

    n        the output rows N;  bias [N] or None
    wide     x -> x @ dense.T + bias for the dequantised weight dense [N, K] (the model's dtype): F.linear, or with
             ``packed`` where packed.py's product runs, a packed copy of it (the same bfloat16 results, faster)
    q8, s8   int8 [N, K] and [N] (the model's dtype), W ≈ q8 * s8[:, None], with +a8; else None
    kernel_name  which weight-only kernel ``kernel`` runs: "int4_linear" (kernels/int4_linear.cpp) or "torch"
    """

    n: int
    bias: torch.Tensor | None
    wide: Projection
    q8: torch.Tensor | None = None
    s8: torch.Tensor | None = None
    kernel_name = "torch"

    def _wide(self, dense: torch.Tensor | None, packed: bool) -> None:
        """The product past KERNEL_ROWS over ``dense`` (QuantLinear's ``wide``); the dense copy is kept only by it, in
        oneDNN's layout alone (a bf16_linear copy would serve only rows KERNEL_ROWS + 1 .. BF16_ROWS, for the memory
        of the draft's projections once more). ``dense`` None: no copy, and the kernel takes every number of rows
        (a quantised target's projection: :func:`quantize_model` says why)."""
        self.wide = None if dense is None else projection(dense, self.bias, "none", packed, few_rows=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N]."""
        rows = x.numel() // x.shape[-1]
        if rows > KERNEL_ROWS and self.wide is not None and (self.q8 is None or rows < A8_ROWS):
            return self.wide(x)
        flat = x.reshape(rows, -1)
        y = self.kernel(flat) if rows <= KERNEL_ROWS or self.q8 is None else int8_product(flat, self.q8, self.s8)
        y = y.reshape(*x.shape[:-1], self.n)
        return y if self.bias is None else y + self.bias

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        """The weight-only kernel alone, whatever the rows: x [M, K] -> x @ W.T [M, N], no bias."""
        raise NotImplementedError


class Int8Linear(QuantLinear):
    """A projection with an int8 weight (see the module docstring and QuantLinear).

    q       int8 [N, K];  scales [N] (the model's dtype): with +a8 they are q8 and s8 themselves
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, a8: bool = False,
                 packed: bool = False, dense: bool = True) -> None:
        if weight.shape[1] % INT8_INPUTS:
            raise SpecsweepError(f"int8 weights need a projection's inputs in multiples of {INT8_INPUTS} "
                                 f"(torch's kernel reads them so), and one has {weight.shape[1]}: leave this model's "
                                 "weights unquantised (drop --draft-quant / --target-quant)")
        self.q, self.scales = quantize_int8(weight)
        self.n, self.bias = weight.shape[0], bias
        self._wide(self.q.to(weight.dtype) * self.scales[:, None] if dense else None, packed)
        if a8:
            self.q8, self.s8 = self.q, self.scales

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        """The int8 kernel alone, whatever the rows: x [M, K] -> x @ (q * scales).T [M, N], no bias."""
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scales)


class Int4Linear(QuantLinear):
    """A projection with a group-wise int4 weight (see the module docstring and QuantLinear), bfloat16.

    Its kernel is ours, kernels/int4_linear.cpp (``kernel_name`` "int4_linear", 1.6-2.7x torch's over one row)
    where kernels/cpu.py can build and run it (AVX-512 BF16, a C++ compiler), else torch's (``ours``: None, where
    available; False: torch's; True: ours or an error). The weights in the kernel's layout:
      int4_linear  weight  kernels/cpu.py's Int4Weight (N padded to a multiple of 4)
      torch        packed  uint8: q in torch's layout for N' rows (N rounded up to INT4_ROWS; rows past N are zero);
                   scales_and_zeros bfloat16 [K / GROUP, N', 2]: (s, z) with W ≈ (q - 8) * s + z
    The dequantised weight q * s + min [N, K] serves rows past KERNEL_ROWS (``wide``); with +a8, q8 and s8 quantise
    it again per output row.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: int = GROUP, a8: bool = False,
                 packed: bool = False, ours: bool | None = None, dense: bool = True) -> None:
        N, K = weight.shape
        if K % group:
            raise SpecsweepError(f"int4 weights group a projection's inputs by {group}, and one has {K}: quantise "
                                 "this model's weights to int8 instead")
        q, scales, lo = quantize_int4(weight, group)
        self.group, self.n, self.bias = group, N, bias
        full = (q.view(N, K // group, group) * scales[..., None] + lo[..., None]).view(N, K).to(weight.dtype) \
            if dense else None
        if not dense:                          # the kernel takes every number of rows: torch's (ours takes up to 4)
            if ours:
                raise SpecsweepError("int4_linear takes up to 4 rows; a projection without a dense copy needs torch's "
                                     "kernel")
            ours = False
        fits = group == cpu.GROUP and K // group <= cpu.MAX_GROUPS and weight.device.type == "cpu"
        if ours and not (fits and cpu.available()):
            why = cpu.unavailable_reason() or "the weight does not fit"
            raise SpecsweepError(f"int4_linear cannot run here: {why}")
        if ours is None:
            ours = fits and cpu.available()
        if ours:
            self.kernel_name = "int4_linear"
            self.weight = cpu.pack_int4(q, scales, lo)
        else:
            pad = -N % INT4_ROWS
            q = F.pad(q, (0, 0, 0, pad))                                      # rows past N: q, s and z all 0
            pair = torch.stack([scales, lo + 8 * scales], dim=2)              # [N, K / group, 2]
            pair = F.pad(pair, (0, 0, 0, 0, 0, pad))
            self.scales_and_zeros = pair.transpose(0, 1).contiguous().to(torch.bfloat16)
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
        if a8:
            self.q8, self.s8 = quantize_int8(full)
        self._wide(full, packed)

    def kernel(self, x: torch.Tensor) -> torch.Tensor:
        """The int4 kernel alone: x [M, K] -> x @ W.T [M, N], no bias (ours: up to cpu.MAX_ROWS rows; torch's:
        any)."""
        if self.kernel_name == "int4_linear":
            return cpu.int4_linear(x, self.weight)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), self.packed, self.group,
                                                       self.scales_and_zeros)   # a view's rows: contiguous first
        return y[:, : self.n]


class QuantizedLinear(torch.nn.Module):
    """An ``nn.Linear`` whose weight is stored quantised and not kept dense (:func:`quantize_model`): ``forward`` is
    its QuantLinear ``projection``, so transformers' forward and the static forward (llama.py) both run it.

    projection   Int8Linear or Int4Linear without a dense copy (QuantLinear: its kernel over every number of rows)
    in_features, out_features   the nn.Linear's
    weight       a meta tensor [out_features, in_features] of the nn.Linear's dtype: its shape and dtype for code that
                 asks them (``get_output_embeddings().weight.shape``); no data, so a use of it fails loudly
    """

    def __init__(self, projection: QuantLinear, weight: torch.Tensor) -> None:
        super().__init__()
        self.projection = projection
        self.out_features, self.in_features = weight.shape
        self.weight = torch.empty(weight.shape, dtype=weight.dtype, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features]."""
        return self.projection(x)


TARGET_MODES = ("none", "int8", "int4")
"""What ``--target-quant`` takes: the weight-only modes (a target's prefill keeps its activations: no +a8)."""


def quantize_model(model, mode: str) -> int:
    """Replace every ``nn.Linear`` of ``model``'s decoder layers and its LM head by a QuantizedLinear holding its
    weight in ``mode`` (int8 or int4), in place, one layer at a time, and drop the dense weights: the model then holds
    a quarter (int8) or about an eighth (int4) of its projections' float32 bytes. A head tied to the input embedding
    is quantised as a copy (the embedding keeps its weight). Its projections keep no dense copy, so the kernel
    multiplies every number of rows, a prefill's too: on a CPU without native bfloat16 the kernels beat a bfloat16
    F.linear over the dequantised weight at every number of rows measured, 1 to 384 (the llama-cpp profile's ``python
    -m pipeline.benchmarks.quant_linear --ways int8,int4,dequantised``, docs/results.md). Records
    ``mode`` as ``model.quantized``. Returns the weights' bytes before minus after. A Llama, Mistral or Qwen2 model on
    a CPU (``--target-quant``; check_supported first)."""
    if mode not in TARGET_MODES[1:]:
        raise SpecsweepError(f"--target-quant {mode!r} is not one of {list(TARGET_MODES)}")
    done = getattr(model, "quantized", None)
    if done is not None:                     # loaded once, quantised once: a model's weights cannot be re-quantised
        if done != mode:
            raise SpecsweepError(f"this model is already quantised as {done}; load it again to quantise it as {mode}")
        return 0
    before = weight_bytes(model)
    weight_kind = Int8Linear if mode == "int8" else Int4Linear
    linears = [(module, name, child) for layer in model.model.layers for module in layer.children()
               for name, child in module.named_children() if type(child) is torch.nn.Linear]
    for parent, name, linear in [*linears, (model, "lm_head", model.lm_head)]:
        kind = weight_kind(linear.weight.detach(), None if linear.bias is None else linear.bias.detach(),
                           dense=False)
        setattr(parent, name, QuantizedLinear(kind, linear.weight))
    model.quantized = mode
    _give_back_freed_memory()
    return before - weight_bytes(model)


def _give_back_freed_memory() -> None:
    """Return the heap memory the dense weights and the quantisation's temporaries held to the system: glibc keeps
    freed blocks for reuse, so without this the process stays as large as it was before quantising. Elsewhere (no
    glibc) nothing happens."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def weight_bytes(model) -> int:
    """The bytes of the model's parameters, buffers and quantised weights (QuantizedLinear's tensors), each storage
    once."""
    seen, total = set(), 0
    tensors = [*model.parameters(), *model.buffers()]
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            tensors += [v for v in vars(m.projection).values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total
