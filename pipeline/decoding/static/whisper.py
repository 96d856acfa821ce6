"""The static-cache forward of Whisper's decoder: the package docstring says what a static forward is.

It drives the decoder of ``WhisperForConditionalGeneration`` (a Whisper target, or a Whisper draft with its own
encoder) and of ``WhisperForCausalLM`` (a draft decoder that reads its target's encoder output,
pipeline/distill/whisper.py). What it reproduces, from transformers' modeling_whisper with sdpa attention:

  - token embedding plus learned position embedding (no embedding scale: ``scale_embedding`` is False in every
    Whisper checkpoint; a model with it set has no static forward)
  - per layer, pre-norm: self-attention over the cache, cross-attention over the encoder output, the MLP
    fc2(act(fc1(h))) with the model's own activation; LayerNorm with the model's epsilon
  - the query scaled before the product, (q_proj(h) · head_dim^-0.5), and the attention itself unscaled, as
    transformers orders it for Whisper; k_proj without a bias
  - the final LayerNorm and proj_out (tied to the token embedding)

Cross-attention keys and values depend only on the encoder output: :meth:`WhisperStaticForward.set_encoder`
computes them once per generate call, [n_layer, B, H, S, D] each, and every decoder forward reads them; transformers
also computes them once (its EncoderDecoderCache), but pays its cache and mask machinery on every forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pipeline.decoding.static.base import StaticForward

FAMILIES = ("WhisperForConditionalGeneration", "WhisperForCausalLM")


class _WhisperLayer(NamedTuple):
    self_norm: tuple       # (weight [d], bias [d], eps)
    q_proj: tuple          # (weight [d, d], bias [d]): F.linear's arguments
    k_proj: tuple          # (weight [d, d], None)
    v_proj: tuple
    o_proj: tuple
    cross_norm: tuple
    cross_q: tuple
    cross_k: tuple
    cross_v: tuple
    cross_o: tuple
    final_norm: tuple
    fc1: tuple             # (weight [I, d], bias [I])
    fc2: tuple             # (weight [d, I], bias [d])
    act: Callable          # the model's own activation (GELU for Whisper)
    scaling: float         # head_dim ** -0.5


def _linear(module) -> tuple:
    return module.weight, module.bias


def _norm(module) -> tuple:
    return module.weight, module.bias, module.eps


class WhisperStaticForward(StaticForward):
    """Whisper's decoder over a static cache, with the cross-attention keys and values of one encoder output.

    model    a ``WhisperForConditionalGeneration`` or ``WhisperForCausalLM`` in eval mode; its parameters are used
             in place
    """

    cross_keys: torch.Tensor | None = None     # [n_layer, B, H, S, D]
    cross_values: torch.Tensor | None = None

    def __init__(self, model) -> None:
        decoder = model.model.decoder
        self.model = model
        self.embed, self.positions = decoder.embed_tokens.weight, decoder.embed_positions.weight
        self.head = model.proj_out.weight
        self.layers = []
        for layer in decoder.layers:
            sa, ca = layer.self_attn, layer.encoder_attn
            self.layers.append(_WhisperLayer(
                self_norm=_norm(layer.self_attn_layer_norm), q_proj=_linear(sa.q_proj), k_proj=_linear(sa.k_proj),
                v_proj=_linear(sa.v_proj), o_proj=_linear(sa.out_proj), cross_norm=_norm(layer.encoder_attn_layer_norm),
                cross_q=_linear(ca.q_proj), cross_k=_linear(ca.k_proj), cross_v=_linear(ca.v_proj),
                cross_o=_linear(ca.out_proj), final_norm=_norm(layer.final_layer_norm), fc1=_linear(layer.fc1),
                fc2=_linear(layer.fc2), act=layer.activation_fn.forward, scaling=sa.scaling))
        self.final = _norm(decoder.layer_norm)
        config = model.config
        self.n_layer = len(self.layers)
        self.heads = self.kv_heads = config.decoder_attention_heads
        self.d_model = config.d_model
        self.head_dim = self.d_model // self.heads
        self.dtype = self.embed.dtype

    @classmethod
    def supports(cls, model) -> bool:
        """Whisper in eval mode with sdpa attention, no embedding scale, on one device (see GPT2StaticForward)."""
        config = model.config
        return (type(model).__name__ in FAMILIES and not getattr(config, "scale_embedding", False)
                and getattr(config, "_attn_implementation", None) == "sdpa"
                and not getattr(model, "hf_device_map", None) and not model.training)

    def set_encoder(self, hidden: torch.Tensor) -> None:
        """The encoder output hidden [B, S, d] the decoder attends to: each layer's cross-attention keys and values,
        computed once."""
        B, S, _ = hidden.shape
        shape = (B, S, self.heads, self.head_dim)
        keys = [F.linear(hidden, *lyr.cross_k).view(shape).transpose(1, 2) for lyr in self.layers]
        values = [F.linear(hidden, *lyr.cross_v).view(shape).transpose(1, 2) for lyr in self.layers]
        self.cross_keys, self.cross_values = torch.stack(keys), torch.stack(values)

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self.cross_keys, self.cross_values = self.cross_keys[:, rows], self.cross_values[:, rows]

    def forward(self, input_ids: torch.Tensor, length: int, attend: torch.Tensor | None,
                positions: torch.Tensor | None, last: int) -> torch.Tensor:
        """input_ids int64 [B, q] -> logits [B, q or last, V] (StaticForward.__call__ says the rest)."""
        B, q = input_ids.shape
        end = length + q
        width = end if attend is None else attend.shape[-1]     # the keys it attends over (base.key_width)
        pos = self.positions[length:end] if positions is None else F.embedding(positions, self.positions)
        x = F.embedding(input_ids, self.embed) + pos
        d = self.d_model
        shape = (B, q, self.heads, self.head_dim)
        for i, lyr in enumerate(self.layers):
            h = F.layer_norm(x, (d,), *lyr.self_norm)
            query = (F.linear(h, *lyr.q_proj) * lyr.scaling).view(shape).transpose(1, 2)
            self.keys[i, :, :, length:end] = F.linear(h, *lyr.k_proj).view(shape).transpose(1, 2)
            self.values[i, :, :, length:end] = F.linear(h, *lyr.v_proj).view(shape).transpose(1, 2)
            a = F.scaled_dot_product_attention(query, self.keys[i, :, :, :width], self.values[i, :, :, :width],
                                               attn_mask=attend, scale=1.0)
            x = x + F.linear(a.transpose(1, 2).reshape(B, q, d), *lyr.o_proj)
            h = F.layer_norm(x, (d,), *lyr.cross_norm)
            query = (F.linear(h, *lyr.cross_q) * lyr.scaling).view(shape).transpose(1, 2)
            a = F.scaled_dot_product_attention(query, self.cross_keys[i], self.cross_values[i], scale=1.0)
            x = x + F.linear(a.transpose(1, 2).reshape(B, q, d), *lyr.cross_o)
            h = F.layer_norm(x, (d,), *lyr.final_norm)
            x = x + F.linear(lyr.act(F.linear(h, *lyr.fc1)), *lyr.fc2)
        if last:
            x = x[:, -last:]
        return F.linear(F.layer_norm(x, (d,), *self.final), self.head)
