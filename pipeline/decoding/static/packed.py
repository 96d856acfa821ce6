"""Packed weights for the static forward's projections on a CPU (on by default; ``--no-packed-weights`` turns them
off).

Why. On a CPU, F.linear over a weight W [N, K] as a model stores it (row-major) hands oneDNN (bfloat16) or MKL
(float32) a plain matrix on every call, and over the few rows of a decode or verify forward neither reaches the
machine's memory bandwidth: on the project's 2-core CPU the Qwen2.5-Coder-1.5B target's projections stream their
weights at about 30 GB/s in bfloat16, and MKL's float32 path costs twice as much over 2-17 rows as over one (the
"float32 doubles a verify forward" of the docs' history). Reordered once into oneDNN's blocked layout, the same
products read the weights at 40-45 GB/s in either dtype, and a multi-row forward costs little more than a one-row
one (``python -m pipeline.benchmarks.forward --model ...``, docs/benchmarks.md, "packed" columns).

What. ``torch.ops.mkldnn._reorder_linear_weight(W)`` makes the packed copy once;
``torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")`` computes x @ W.T + b from it: the pair of
operators torch's own compiler (inductor's CPU weight prepacking) emits for a frozen nn.Linear. What comes out:
  bfloat16  bit for bit F.linear's result over a contiguous input (both are oneDNN's bfloat16 kernel, reading the
            weight in two layouts), over any number of rows and with q, k, v (or gate, up) stacked into one weight:
            tests/test_packed.py. Every input the Llama forward passes is contiguous; a strided one gives its
            contiguous copy's result here, where F.linear itself rounds it differently
  float32   float32 arithmetic summed in another order than MKL's (Qwen2.5-Coder-1.5B's logits within 1.3e-4 of the
            plain forward's, as two BLAS libraries differ): greedy tokens equal transformers' except at near ties

A few rows in bfloat16: bf16_linear. oneDNN's packed product does not overlap its arithmetic with its stream of the
weights: each row past the first adds its own arithmetic time (the 1.5B target's whole forward over 7 tokens cost
1.25 one-token forwards with it, over 13 tokens 1.41: docs/benchmarks.md). Where kernels/cpu.py's kernels run
(AVX-512 BF16 and a C++ compiler), a bfloat16 projection also keeps a copy in bf16_linear's layout
(kernels/bf16_linear.cpp) and multiplies up to cpu.BF16_ROWS (9) rows with it: each load of W feeds every row's
vdpbf16ps, so up to about 9 rows the product costs little more than one (``python -m
pipeline.benchmarks.quant_linear --ways packed,bf16_linear``, ``python -m pipeline.benchmarks.forward``'s "onednn"
columns: docs/benchmarks.md). Its results are the float32 product rounded to bfloat16 once, summed in another order
than oneDNN's (so the logits are the plain forward's to bfloat16 rounding, not bit for bit), and a row's product
does not depend on the other rows of the call (a token's projections are the same whether the target reads it alone
or in a verify forward of up to 9). Past 9 rows (a prefill) oneDNN's product runs, as before; ``cpu.turned_off()``
at construction, or ``SPECSWEEP_CPU_KERNELS=0``, keeps oneDNN's for every row count. ``few_rows_kernel`` (recorded
by a run as ``resolved.few_rows_kernel``) says which runs the few rows.

On a CPU with AMX: amx_linear. There bf16_linear's arithmetic bounds it past 3-5 rows (the 1.5B's forward over 9
tokens: 1.5 one-token forwards on the project's Xeon), and kernels/amx_linear.cpp multiplies up to cpu.AMX_ROWS (16)
rows with tile products from the same copy (bf16_linear's layout is its operand's), for the cost of reading the
weight: the same properties (the float32 product rounded once, a row's product independent of the others), so a
verify forward of up to 16 tokens gives the one-token forwards' logits bit for bit. A projection whose K is not a
multiple of 32 keeps bf16_linear's; ``cpu.turned_off(amx_only=True)`` at construction, or ``SPECSWEEP_AMX=0``, keeps
bf16_linear's for all (docs/benchmarks.md, "A few rows on an AMX CPU").

Cost. A copy of every packed projection's weight (the model's own weights stay in place for transformers'
forward and everything else that reads them): a static forward's projections in twice their memory, three times
with bf16_linear's copy (the 1.5B target: 3.1 GB more). A packed copy
is made once per weight tensor and kept while the tensor lives (:func:`packed`), so the speculative and the
autoregressive engines of one run, and every trial of a study, share it; a weight changed in place (its version
moves on) is packed again (not an inference tensor's, which keeps no version: a model loaded under
``torch.inference_mode`` is taken as fixed).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.weak import WeakIdKeyDictionary

from pipeline.kernels import cpu

PACKED_DTYPES = (torch.float32, torch.bfloat16)
"""The dtypes oneDNN's packed product takes here (bfloat16 where the CPU multiplies it natively: :func:`available`)."""

_COPIES: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""first weight -> {(layout, ids of the stacked weights): (their versions, packed copy)}; dropped with the weight."""


def available(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether projections on ``device`` in ``dtype`` can be packed: a CPU, torch built with oneDNN (and its packing
    operators), and for bfloat16 a CPU that oneDNN multiplies bfloat16 on natively (AVX-512 BF16 or AMX)."""
    return not unavailable_reason(device, dtype)


def unavailable_reason(device: torch.device | str, dtype: torch.dtype) -> str:
    """Why projections on ``device`` in ``dtype`` cannot be packed, in one line ("" where they can)."""
    if torch.device(device).type != "cpu":
        return "packed weights are for a CPU"
    if dtype not in PACKED_DTYPES:
        return f"packed weights take {', '.join(map(str, PACKED_DTYPES))}, not {dtype}"
    if not torch.backends.mkldnn.is_available() or not (hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                                                        and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return "this torch build lacks oneDNN's packing operators"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU does not multiply bfloat16 natively (no AVX-512 BF16 or AMX)"
    return ""


def _reordered(stacked: torch.Tensor, layout: str):
    """``stacked`` [N, K] in ``layout``: "onednn" (oneDNN's blocked layout) or "bf16_linear" (kernels/cpu.py)."""
    if layout == "bf16_linear":
        return cpu.pack_bf16(stacked)
    return torch.ops.mkldnn._reorder_linear_weight(stacked, None)


def packed(weights: Sequence[torch.Tensor], layout: str = "onednn"):
    """The packed copy of ``weights`` [N_i, K] stacked along their rows ([sum N_i, K]) in ``layout`` ("onednn": a
    tensor for ``_linear_pointwise``; "bf16_linear": a cpu.Bf16Weight), made once and kept while the first of them
    lives (see the module docstring)."""
    key = (layout, *(id(w) for w in weights))
    versions = tuple(-1 if w.is_inference() else w._version for w in weights)   # inference tensors keep no version
    held = _COPIES.setdefault(weights[0], {})
    if key not in held or held[key][0] != versions:
        with torch.no_grad():
            stacked = torch.cat(list(weights)) if len(weights) > 1 else weights[0]
            held[key] = (versions, _reordered(stacked.detach(), layout))
    return held[key][1]


def stack_biases(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """The ``biases`` [N_i] of ``weights`` [N_i, K] stacked as the weights are ([sum N_i], zeros for a None), or None
    where none has one."""
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)]).detach()


def few_rows_kernel(dtype: torch.dtype, k: int | None = None) -> str:
    """The kernel a packed projection in ``dtype`` over ``k`` inputs runs over a few rows (:func:`row_limit`):
    "amx_linear" (ours, in bfloat16 where the CPU has AMX and k is a multiple of cpu.AMX_K), "bf16_linear" (ours, in
    bfloat16 where kernels/cpu.py's kernels run) or "onednn". ``k`` None: the kernel of a k that AMX takes."""
    if dtype != torch.bfloat16 or not cpu.available():
        return "onednn"
    return "amx_linear" if cpu.amx_available() and (k is None or k % cpu.AMX_K == 0) else "bf16_linear"


def row_limit(kernel: str) -> int:
    """The most rows ``kernel`` (of :func:`few_rows_kernel`) multiplies: cpu.AMX_ROWS (16) for amx_linear,
    cpu.BF16_ROWS (9) for bf16_linear; oneDNN's runs every row count (0 few rows of its own)."""
    return {"amx_linear": cpu.AMX_ROWS, "bf16_linear": cpu.BF16_ROWS}.get(kernel, 0)


class PackedLinear:
    """x [..., K] -> x @ W.T + b [..., sum N_i] for W the ``weights`` [N_i, K] stacked along their rows and b their
    ``biases`` [N_i] (None: zeros; all None: no bias), from packed copies (:func:`packed`): oneDNN's (held as
    ``weight``) for any number of rows, and in bfloat16 where kernels/cpu.py's kernels run, bf16_linear's (``few``)
    for up to cpu.BF16_ROWS rows (``few_rows_kernel`` says which runs those). ``few_rows=False``: oneDNN's alone, no
    second copy (a quantised projection's wide path, which serves only rows past its own kernel's)."""

    def __init__(self, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None],
                 few_rows: bool = True) -> None:
        self.weight = packed(weights)
        self.bias = stack_biases(weights, biases)
        self.few_rows_kernel = few_rows_kernel(weights[0].dtype, weights[0].shape[1]) if few_rows else "onednn"
        self.rows = row_limit(self.few_rows_kernel)
        # amx_linear reads bf16_linear's layout: one copy serves either
        self.few = packed(weights, "bf16_linear") if self.rows else None
        self.few_bias = None if self.bias is None or self.few is None else self.bias.float()
        self._few_call = cpu.amx_linear if self.few_rows_kernel == "amx_linear" else cpu.bf16_linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if 0 < rows <= self.rows:
            y = self._few_call(x.reshape(rows, x.shape[-1]), self.few, self.few_bias)
            return y.view(*x.shape[:-1], self.few.n)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
