"""A quantised draft's one-token forward in one kernel call: the decoder layers of the Llama family's static forward
(llama.py) with ``--draft-quant int4`` projections, run by kernels/int4_layers.cpp.

Why. A draft proposes one token per forward, γ forwards a step, so its one-token forward is what c measures. In
Python that forward dispatches about 55 torch operators a layer (norms, RoPE, the cache writes, attention's
reshapes, the residual adds), 3-5 µs each on a 2-core CPU. The kernel runs the layers in C++ and calls int4_linear
for the projections directly: Qwen2.5-Coder-0.5B's one-token forward in int4 1.35x faster, 10.35 against 7.43 ms
(``python -m pipeline.benchmarks.quant_linear --model qwen2.5-coder-0.5b-instruct``, docs/benchmarks.md).

What. Llama's layer as llama.py computes it over one token, with the same roundings to bfloat16 except the mean in
RMSNorm and attention, whose sums are in another order (int4_layers.cpp); attention reads positions 0 .. the new
token's, not whole blocks of keys (base.KEY_BLOCK): a draft's proposals need not be bit for bit the same in a
one-token and a multi-token forward, only the target's verify forward must (the verify step keeps the output the
target's). Then the final norm and the head, as llama.py. Its logits are llama.py's to bfloat16 rounding
(tests/test_int4_row.py).

When. StaticForward.__call__ takes this path for a forward of one token in one batch row, with no mask and no
position ids (a chain's draft step), where :func:`build` gives one: the forward's quant is int4 (or int4+a8) with
our kernel (kernels/cpu.py available) for every projection, the activation is SiLU, the head dimension a multiple of
32 and the dtype bfloat16. Everything else (a prefill, a tree, a padded batch) runs llama.py's forward as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.decoding.static.quant import Int4Linear
from pipeline.kernels import cpu


def _int4(projection) -> Int4Linear | None:
    """The Int4Linear behind a layer's projection (llama.py's _Split or the projection itself) where our kernel runs
    it with a bfloat16 bias or none, else None."""
    p = getattr(projection, "projection", projection)
    if not isinstance(p, Int4Linear) or p.kernel_name != "int4_linear":
        return None
    if p.bias is not None and (p.bias.dtype != torch.bfloat16 or not p.bias.is_contiguous()):
        return None
    return p


class Int4RowForward:
    """input_ids int64 [1, 1] at cache position ``length`` -> the last layer's hidden state bfloat16 [1, 1, d] (the
    final norm and the head are llama.py's), for a LlamaStaticForward ``forward`` whose layers :func:`build` found
    runnable (see the module docstring). Holds the per-layer table of pointers the kernel reads and its scratch;
    reads the forward's cache and RoPE tables at each call (a cache that grows is a new buffer)."""

    def __init__(self, forward, inter: int, layers: list[tuple]) -> None:
        self.forward = forward
        self.inter = inter
        ptrs, floats = [], []
        for norm_in, qkv, o, norm_post, gate_up, down, scaling in layers:
            row = [norm_in[0].data_ptr()]
            for p in (qkv, o):
                row += [p.weight.packed.data_ptr(), p.weight.scales.data_ptr(), p.weight.zeros.data_ptr(),
                        0 if p.bias is None else p.bias.data_ptr()]
            row.append(norm_post[0].data_ptr())
            for p in (gate_up, down):
                row += [p.weight.packed.data_ptr(), p.weight.scales.data_ptr(), p.weight.zeros.data_ptr(),
                        0 if p.bias is None else p.bias.data_ptr()]
            ptrs.append(row)
            floats.append([norm_in[1], norm_post[1], scaling])
        self.ptrs = torch.tensor(ptrs, dtype=torch.int64)
        self.floats = torch.tensor(floats, dtype=torch.float32)
        d, heads, kv, D = forward.embed.shape[1], forward.heads, forward.kv_heads, forward.head_dim
        self.work = torch.empty(2 * d + (2 * heads + 2 * kv) * D + 3 * inter, dtype=torch.bfloat16)
        self.scores = torch.empty(0, dtype=torch.float32)

    def __call__(self, input_ids: torch.Tensor, length: int) -> torch.Tensor:
        f = self.forward
        x = F.embedding(input_ids, f.embed)                                     # [1, 1, d], a new tensor
        if self.scores.numel() < f.heads * (length + 1):
            self.scores = torch.empty(f.heads * f.capacity, dtype=torch.float32)
        cpu.int4_layers(x.view(-1), self.ptrs, self.floats, heads=f.heads, inter=self.inter, keys=f.keys[:, 0],
                        values=f.values[:, 0], pos=length, cos=f.cos[length], sin=f.sin_signed[length],
                        work=self.work, scores=self.scores)
        return x


def build(forward, model) -> Int4RowForward | None:
    """The one-call forward for LlamaStaticForward ``forward`` (over ``model``), or None where it cannot run (the
    module docstring says when it can)."""
    config = model.config
    if (forward.dtype != torch.bfloat16 or forward.head_dim % 32 or forward.heads % forward.kv_heads
            or getattr(config, "hidden_act", None) != "silu" or not cpu.available()
            or forward.embed.device.type != "cpu"):
        return None
    d, inter = forward.embed.shape[1], config.intermediate_size
    shapes = ((forward.heads + 2 * forward.kv_heads) * forward.head_dim, d), (d, forward.heads * forward.head_dim), \
        (2 * inter, d), (d, inter)                  # (N, K) of q/k/v stacked, o, gate/up stacked, down
    layers = []
    for layer in forward.layers:
        qkv, o, gate_up, down = map(_int4, (layer.qkv, layer.o_proj, layer.gate_up, layer.down_proj))
        if None in (qkv, o, gate_up, down):
            return None
        norms = (layer.input_norm[0], layer.post_norm[0])
        if any(w.dtype != torch.bfloat16 or not w.is_contiguous() for w in norms):
            return None
        if any((p.weight.n, p.weight.k) != shape for p, shape in zip((qkv, o, gate_up, down), shapes)):
            return None
        layers.append((layer.input_norm, qkv, o, layer.post_norm, gate_up, down, layer.scaling))
    return Int4RowForward(forward, inter, layers)
