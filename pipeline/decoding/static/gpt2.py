"""The static-cache forward of GPT-2 (and its kin): the package docstring says what a static forward is."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pipeline.decoding.static.base import StaticForward


class _GPT2Block(NamedTuple):
    ln_1: tuple            # (weight, bias, eps)
    c_attn: tuple          # (bias, weight [d, 3d]): Conv1D is x @ weight + bias
    scaling: float
    c_proj: tuple
    ln_2: tuple
    c_fc: tuple
    act: Callable          # the model's own activation (gelu_new for GPT-2)
    mlp_proj: tuple


class GPT2StaticForward(StaticForward):
    """GPT-2 (``GPT2LMHeadModel``: gpt2, distilgpt2, gpt2-medium ... and the toy text pair) over a static cache.

    model    a ``GPT2LMHeadModel`` in eval mode; its parameters are used in place
    """

    def __init__(self, model) -> None:
        t = model.transformer
        self.model = model
        self.wte, self.wpe = t.wte.weight, t.wpe.weight
        self.head = model.lm_head.weight
        # per block, the tensors and callables its forward reads, looked up once: nn.Module attribute access
        # costs about a microsecond each, and a block reads sixteen of them per token
        self.blocks = [_GPT2Block(
            ln_1=(b.ln_1.weight, b.ln_1.bias, b.ln_1.eps), c_attn=(b.attn.c_attn.bias, b.attn.c_attn.weight),
            scaling=b.attn.scaling, c_proj=(b.attn.c_proj.bias, b.attn.c_proj.weight),
            ln_2=(b.ln_2.weight, b.ln_2.bias, b.ln_2.eps), c_fc=(b.mlp.c_fc.bias, b.mlp.c_fc.weight),
            act=b.mlp.act.forward, mlp_proj=(b.mlp.c_proj.bias, b.mlp.c_proj.weight)) for b in t.h]
        self.ln_f = (t.ln_f.weight, t.ln_f.bias, t.ln_f.eps)
        self.n_layer = len(self.blocks)
        self.heads = self.kv_heads = model.config.n_head
        self.d_model = model.config.n_embd
        self.head_dim = self.d_model // self.heads
        self.dtype = self.wte.dtype

    @classmethod
    def supports(cls, model) -> bool:
        """GPT-2 in eval mode with sdpa attention (what this forward reproduces), on one device: a model that
        accelerate spread over several GPUs (``hf_device_map``) moves activations between them in hooks that a
        forward of its own would bypass."""
        config = model.config
        return (type(model).__name__ == "GPT2LMHeadModel" and not getattr(config, "add_cross_attention", False)
                and getattr(config, "_attn_implementation", None) == "sdpa"
                and not getattr(model, "hf_device_map", None) and not model.training)

    def forward(self, input_ids: torch.Tensor, length: int, attend: torch.Tensor | None,
                positions: torch.Tensor | None, last: int) -> torch.Tensor:
        """input_ids int64 [B, q] -> logits [B, q or last, V] (StaticForward.__call__ says the rest)."""
        B, q = input_ids.shape
        end = length + q
        width = end if attend is None else attend.shape[-1]     # the keys it attends over (base.key_width)
        pos = self.wpe[length:end] if positions is None else F.embedding(positions, self.wpe)
        x = F.embedding(input_ids, self.wte) + pos
        d = self.d_model
        shape = (B, q, self.heads, self.head_dim)
        for i, blk in enumerate(self.blocks):
            h = torch.layer_norm(x, (d,), *blk.ln_1)
            qkv = torch.addmm(blk.c_attn[0], h.view(-1, d), blk.c_attn[1]).view(B, q, -1)   # GPT-2's Conv1D
            query, key, value = qkv.split(d, dim=2)
            self.keys[i, :, :, length:end] = key.view(shape).transpose(1, 2)
            self.values[i, :, :, length:end] = value.view(shape).transpose(1, 2)
            a = F.scaled_dot_product_attention(query.view(shape).transpose(1, 2), self.keys[i, :, :, :width],
                                               self.values[i, :, :, :width], attn_mask=attend, scale=blk.scaling)
            x = torch.addmm(blk.c_proj[0], a.transpose(1, 2).reshape(B * q, d), blk.c_proj[1]).view(B, q, d) + x
            h = torch.layer_norm(x, (d,), *blk.ln_2)
            h = blk.act(torch.addmm(blk.c_fc[0], h.view(-1, d), blk.c_fc[1]))
            x = x + torch.addmm(blk.mlp_proj[0], h, blk.mlp_proj[1]).view(B, q, d)
        if last:
            x = x[:, -last:]
        return F.linear(torch.layer_norm(x, (d,), *self.ln_f), self.head)
