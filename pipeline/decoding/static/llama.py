"""The static-cache forward of Llama (and Mistral and Qwen2 where they compute what Llama does): the package
docstring says what a static forward is.

What it reproduces, from transformers' modeling_llama with sdpa attention:
  - RMSNorm in float32: x * rsqrt(mean(x²) + eps), cast back to the input dtype, times the weight
  - RoPE in rotate-half form, q * cos + rotate_half(q) * sin (computed as _rope says), with cos and sin of
    position · inv_freq (float32), times the rotary embedding's attention scaling, cast to the model's dtype.
    inv_freq and the scaling are the model's own (``model.model.rotary_emb``), so every RoPE type whose
    frequencies do not change with the sequence length is exact: default, linear, llama3, yarn
  - grouped-query attention over num_key_value_heads heads, scaled by the layer's own ``scaling``
  - the MLP down(act(gate(h)) * up(h)) with the model's own activation; every projection with its own bias or
    none (Llama's attention_bias / mlp_bias, Qwen2's q/k/v biases), tied or untied LM head

A model quantised in place (quant.quantize_model, ``--target-quant``) runs its QuantizedLinear projections as
they are, each with its own kernel and no dense copy. With ``quant`` int8 or int4 (``--draft-quant``, for a draft)
the projections and the head multiply quantised
copies of their weights (quant.py), and the forward computes that quantised model instead. With int4 and our kernel,
a one-token forward (a chain's draft step) runs its decoder layers in one C++ call instead (int4_row.py,
StaticForward.row_forward): the same model to bfloat16 rounding. The copies are made
anyway, so q, k and v share one weight [(H + 2 H_kv) D, d], and gate and up one [2 I, d], as gpt-fast fuses them:
three kernel calls a layer instead of five, each reading a longer weight. Both quantisations work per output row
(and int4 per group of inputs along a row), so a fused weight's rows are quantised as each projection's own would
be. Without ``quant`` each projection keeps the model's own weight, in place (fusing would copy them), unless
``packed``: then every projection and the head multiply a packed copy (packed.py), q, k and v (and gate and up)
stacked into one as above, since the copy is made anyway; with ``quant`` and ``packed``, the dequantised weights
that a prefill multiplies are packed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pipeline.decoding.static import int4_row
from pipeline.decoding.static.base import StaticForward
from pipeline.decoding.static.compiled import mark_static
from pipeline.decoding.static.packed import PackedLinear, available, stack_biases
from pipeline.decoding.static.quant import Projection, QuantizedLinear, projection, weight_mode

# models whose forward is Llama's, given the checks of LlamaStaticForward.supports
FAMILIES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# RoPE types with fixed frequencies; "dynamic" and "longrope" recompute them from the longest position in each
# forward (a host sync, and a table that changes as the sequence grows)
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class _LlamaLayer(NamedTuple):
    input_norm: tuple      # (weight [d], eps)
    qkv: Callable          # h [B, q, d] -> (query [B, q, H * D], key [B, q, H_kv * D], value [B, q, H_kv * D])
    o_proj: Projection     # [B, q, H * D] -> [B, q, d] (quant.py: F.linear, or a quantised weight's kernel)
    post_norm: tuple
    gate_up: Callable      # [B, q, d] -> (gate [B, q, I], up [B, q, I])
    down_proj: Projection  # [B, q, I] -> [B, q, d]
    act: Callable          # the model's own activation (SiLU for Llama)
    scaling: float


def _separate(*projections: Projection) -> Callable:
    """h -> (p(h) for p in projections): each with its own weight."""
    return lambda h: tuple(p(h) for p in projections)


class _Split:
    """h -> ``projection(h)`` split into ``sizes`` along its last dimension."""

    def __init__(self, projection: Projection, sizes: list[int]) -> None:
        self.projection, self.sizes = projection, sizes

    def __call__(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.projection(h).split(self.sizes, dim=-1)


def _stacked(modules, quant: str, packed: bool) -> _Split:
    """h -> the outputs of ``modules`` (nn.Linear), from one projection over their weights stacked along the output
    rows (and their biases, where any has one: zeros for the others): a packed copy (packed.py) or a quantised one."""
    weights, biases = [m.weight for m in modules], [m.bias for m in modules]
    if packed and quant == "none":
        both = PackedLinear(weights, biases)
    else:
        both = projection(torch.cat(weights), stack_biases(weights, biases), quant, packed)
    return _Split(both, [m.out_features for m in modules])


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, operation for operation."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, transformers' RoPE, bit for bit: rotate_half(x) * sin = (-x2 * s1, x1 * s2) is
    x rolled by half its width, (x2, x1), times sin with its first half negated, (-s1, s2) (a sign flip is exact).
    Fewer operations than slicing, negating and concatenating: a small draft's forward on a CPU pays a few
    microseconds for each."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


class LlamaStaticForward(StaticForward):
    """A Llama-style causal LM (``LlamaForCausalLM``, and Mistral / Qwen2 without sliding windows) over a static
    cache. Keys and values are cached after RoPE, per key/value head (not repeated for the query heads).

    model    a model of FAMILIES in eval mode (see :meth:`supports`); its parameters are used in place
    quant    how the projections and the head store their weights (quant.py): "none" (the model's own, in place),
             "int8" or "int4" (quantised copies; the model is left as it is)
    packed   multiply packed copies of the weights where the model's device and dtype allow (packed.py;
             ``self.packed`` says whether they do): with quant "none" every projection and the head; quantised, the
             dequantised weights that rows past quant.KERNEL_ROWS multiply (a prompt's prefill)
    """

    def __init__(self, model, quant: str = "none", packed: bool = False) -> None:
        config = model.config
        base = model.model
        attn = base.layers[0].self_attn
        weight = base.embed_tokens.weight
        self.packed = packed and available(weight.device, weight.dtype)

        def linear(module) -> Projection:
            if isinstance(module, QuantizedLinear):         # a quantised model's (--target-quant): its own kernel
                return module.projection
            return projection(module.weight, module.bias, quant, self.packed)

        def group(*modules) -> Callable:
            if (quant == "none" and not self.packed) or isinstance(modules[0], QuantizedLinear):
                return _separate(*map(linear, modules))
            return _stacked(modules, quant, self.packed)

        self.model = model
        self.quant = getattr(model, "quantized", quant)
        self.embed = base.embed_tokens.weight
        self.head = linear(model.lm_head)
        self.norm = (base.norm.weight, base.norm.variance_epsilon)
        # what each layer reads, looked up once (nn.Module attribute access costs about a microsecond)
        self.layers = [_LlamaLayer(
            input_norm=(b.input_layernorm.weight, b.input_layernorm.variance_epsilon),
            qkv=group(b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj), o_proj=linear(b.self_attn.o_proj),
            post_norm=(b.post_attention_layernorm.weight, b.post_attention_layernorm.variance_epsilon),
            gate_up=group(b.mlp.gate_proj, b.mlp.up_proj), down_proj=linear(b.mlp.down_proj),
            act=b.mlp.act_fn.forward, scaling=b.self_attn.scaling) for b in base.layers[: config.num_hidden_layers]]
        self.n_layer = len(self.layers)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.dtype = self.embed.dtype
        self.inv_freq = base.rotary_emb.inv_freq                     # float32 [D / 2]
        self.rope_scaling = base.rotary_emb.attention_scaling
        self.cos: torch.Tensor | None = None       # [capacity, D]: cos of position p in row p (model dtype)
        self.sin_signed: torch.Tensor | None = None   # [capacity, D]: sin, its first half negated (_rope)
        self.layer_row = int4_row.build(self, model) if weight_mode(quant) == "int4" else None
        if self.layer_row is not None:              # a draft step's one-token forward in one kernel call
            self.row_forward, self.row_kernel = self._row_forward, "int4_layers"

    def _row_forward(self, input_ids: torch.Tensor, length: int) -> torch.Tensor:
        """input_ids int64 [1, 1] at position ``length`` -> logits [1, 1, V]: the layers in one call (int4_row.py), then
        the final norm and the head (StaticForward.row_forward)."""
        return self.head(_rms_norm(self.layer_row(input_ids, length), *self.norm))

    @classmethod
    def supports(cls, model) -> bool:
        """A model of FAMILIES in eval mode with sdpa attention, every layer full attention (no sliding window),
        RoPE of a type in ROPE_TYPES, plain ``nn.Linear`` projections or quant.py's QuantizedLinear (not other
        quantised or wrapped ones), on one
        device (a model spread by accelerate moves activations in hooks that this forward would bypass)."""
        if type(model).__name__ not in FAMILIES or model.training or getattr(model, "hf_device_map", None):
            return False
        config = model.config
        rope = getattr(config, "rope_parameters", None) or {}
        layers = model.model.layers
        linears = [layer.get_submodule(name) for layer in layers for name in
                   ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")] + [model.lm_head]
        return (getattr(config, "_attn_implementation", None) == "sdpa"
                and rope.get("rope_type") in ROPE_TYPES
                and getattr(config, "sliding_window", None) is None
                and set(getattr(config, "layer_types", None) or ()) <= {"full_attention"}
                and all(type(m) in (torch.nn.Linear, QuantizedLinear) for m in linears))

    def allocate(self, batch: int, capacity: int, device: torch.device) -> None:
        super().allocate(batch, capacity, device)
        self._rope_table(self.capacity, device)     # perhaps rounded up: base.KEY_BLOCK

    def grow(self, capacity: int) -> None:
        if capacity > self.capacity:
            super().grow(capacity)
            self._rope_table(self.capacity, self.keys.device)

    def _rope_table(self, capacity: int, device: torch.device) -> None:
        """cos and sin [capacity, D] of positions 0 .. capacity - 1 as LlamaRotaryEmbedding computes them, sin with its
        first half negated as _rope takes it (a table lookup costs less per forward than computing them: 5-10 % of
        a tiny model's forward on the CPU)."""
        if self.cos is not None and self.cos.shape[0] == capacity and self.cos.device == torch.device(device):
            return      # the same table (and, for compiled steps, the same tensors: compiled.py)
        freqs = torch.arange(capacity, device=device).float()[:, None] * self.inv_freq.to(device)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * self.rope_scaling).to(self.dtype)
        sin = (emb.sin() * self.rope_scaling).to(self.dtype)
        half = sin.shape[-1] // 2
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        if self.compiled is not None:
            mark_static(self.cos, self.sin_signed)

    def forward(self, input_ids: torch.Tensor, length: int, attend: torch.Tensor | None,
                positions: torch.Tensor | None, last: int) -> torch.Tensor:
        """input_ids int64 [B, q] -> logits [B, q or last, V] (StaticForward.__call__ says the rest)."""
        end = length + input_ids.shape[1]
        width = end if attend is None else attend.shape[-1]     # the keys it attends over (base.key_width)
        if positions is None:                                   # [q, 1, D], broadcast over rows and heads
            cos, sin = self.cos[length:end, None], self.sin_signed[length:end, None]
        else:                                                   # [B, q, 1, D]
            cos = F.embedding(positions, self.cos)[:, :, None]
            sin = F.embedding(positions, self.sin_signed)[:, :, None]
        return self._decode(input_ids, slice(length, end), width, attend, cos, sin, last)

    def forward_at(self, input_ids: torch.Tensor, at: torch.Tensor, last: int) -> torch.Tensor:
        """input_ids int64 [B, q] at the consecutive cache positions ``at`` int64 [q] -> logits [B, q or last, V],
        attending over the whole cache with the positions after each query masked: :meth:`forward`'s causal step at
        shapes that do not change as the sequence grows, which compiled.py compiles."""
        capacity = self.keys.shape[3]
        attend = torch.arange(capacity, device=at.device) <= at[:, None]           # [q, capacity]
        cos, sin = self.cos[at][:, None], self.sin_signed[at][:, None]             # [q, 1, D]
        return self._decode(input_ids, at, capacity, attend, cos, sin, last)

    def _decode(self, input_ids: torch.Tensor, at: slice | torch.Tensor, width: int, attend: torch.Tensor | None,
                cos: torch.Tensor, sin: torch.Tensor, last: int) -> torch.Tensor:
        """The layers, the final norm and the head: input_ids int64 [B, q] written at cache positions ``at`` (a slice,
        or int64 [q] indices), attending over the first ``width`` cache positions as ``attend`` says (bool [B, 1, q,
        width] or [q, width]; None: all of them), RoPE'd with cos and sin [q, 1, D] or [B, q, 1, D]."""
        B, q = input_ids.shape
        # Grouped-query attention without repeating keys and values: the n_rep query heads that share a key/value
        # head are laid out as n_rep * q queries of that head, query (r, i) attending as query i does. Measured
        # against sdpa's enable_gqa and against repeating keys and values: docs/engine.md
        n_rep = self.heads // self.kv_heads
        if attend is not None and n_rep > 1:
            attend = attend.repeat(*(1,) * (attend.dim() - 2), n_rep, 1)        # [(B, 1,) n_rep * q, width]
        x = F.embedding(input_ids, self.embed)                                  # [B, q, d]
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, *layer.input_norm)
            query, key, value = layer.qkv(h)
            query = query.reshape(B, q, self.heads, self.head_dim)
            key = key.reshape(B, q, self.kv_heads, self.head_dim)
            value = value.reshape(B, q, self.kv_heads, self.head_dim)
            query = _rope(query, cos, sin)
            key = _rope(key, cos, sin)
            if isinstance(at, slice):
                self.keys[i, :, :, at] = key.transpose(1, 2)
                self.values[i, :, :, at] = value.transpose(1, 2)
            else:                       # in place at tensor positions: the cache keeps its address (compiled.py)
                self.keys[i].index_copy_(2, at, key.transpose(1, 2))
                self.values[i].index_copy_(2, at, value.transpose(1, 2))
            query = query.view(B, q, self.kv_heads, n_rep, self.head_dim).permute(0, 2, 3, 1, 4)
            a = F.scaled_dot_product_attention(query.reshape(B, self.kv_heads, n_rep * q, self.head_dim),
                                               self.keys[i, :, :, :width], self.values[i, :, :, :width],
                                               attn_mask=attend, scale=layer.scaling)   # [B, H_kv, n_rep * q, D]
            a = a.view(B, self.kv_heads, n_rep, q, self.head_dim).permute(0, 3, 1, 2, 4).reshape(B, q, -1)
            x = x + layer.o_proj(a)
            h = _rms_norm(x, *layer.post_norm)
            gate, up = layer.gate_up(h)
            x = x + layer.down_proj(layer.act(gate) * up)
        if last:
            x = x[:, -last:]
        return self.head(_rms_norm(x, *self.norm))
