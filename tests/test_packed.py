"""Packed weights (pipeline/decoding/static/packed.py): the products F.linear computes, from one packed copy per
weight.

oneDNN's packed product (every number of rows with cpu.turned_off(), or past bf16_linear's 9 rows): bfloat16 bit for
bit F.linear's, float32 to float32 rounding, and the static Llama forward over it gives the plain forward's logits bit
for bit in bfloat16; with bf16_linear over a few rows (tests/test_cpu_kernels.py holds the kernel to the float32
product), the forward's logits are the plain forward's to bfloat16 rounding;
copies are shared between forwards of one model and remade when a weight changes in place; where packing cannot
run (another device, float16, --no-packed-weights) the plain projections run instead. The forward's agreement with
transformers', packed or not, is tests/test_static_llama.py's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_static_llama import CONFIGS, build

from pipeline.config import RunConfig
from pipeline.decoding.cache import CachedModel
from pipeline.decoding.drafters.lookup import prompt_lookup
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.static import base
from pipeline.decoding.static.base import key_width
from pipeline.decoding.static.packed import PackedLinear, available, few_rows_kernel, packed, row_limit
from pipeline.kernels import cpu
from pipeline.samplers import get_sampler

needs_bf16 = pytest.mark.skipif(not available("cpu", torch.bfloat16),
                                reason="this CPU does not multiply bfloat16 natively (or torch lacks oneDNN)")
# 4 query heads per key/value head: with fewer, torch's CPU attention's output rows depend on how many it computes
# (base.KEY_BLOCK), and a verify forward's would not be the one-token forwards' bit for bit
FOUR_PER_KV = {"num_attention_heads": 8, "num_key_value_heads": 2}
needs_fp32 = pytest.mark.skipif(not available("cpu", torch.float32), reason="torch was built without oneDNN")


def _weights(dtype, g, sizes=(37, 8, 19), k=48):
    ws = [torch.randn(n, k, generator=g).to(dtype) for n in sizes]
    bs = [torch.randn(sizes[0], generator=g).to(dtype), None, torch.randn(sizes[2], generator=g).to(dtype)]
    return ws, bs


def _reference(x, ws, bs):
    return torch.cat([F.linear(x, w, b) for w, b in zip(ws, bs)], dim=-1)


@needs_bf16
@pytest.mark.parametrize("rows", [1, 3, 17, 70])
def test_bfloat16_products_are_f_linear_bit_for_bit_one_weight_or_stacked(rows):
    g = torch.Generator().manual_seed(rows)
    ws, bs = _weights(torch.bfloat16, g)
    x = torch.randn(2, rows, 48, generator=g).to(torch.bfloat16)
    with cpu.turned_off():                                  # oneDNN's product over every number of rows
        stacked, alone, one = PackedLinear(ws, bs), PackedLinear(ws[1:2], bs[1:2]), PackedLinear(ws[:1], bs[:1])
    assert torch.equal(stacked(x), _reference(x, ws, bs))                             # q, k, v stacked, biases mixed
    assert torch.equal(alone(x), F.linear(x, ws[1]))                                  # one weight, no bias
    strided = torch.randn(2, 96, rows, generator=g).to(torch.bfloat16)[:, ::2].transpose(1, 2)   # not contiguous
    assert not strided.is_contiguous()
    # a strided input gives what its contiguous copy gives (F.linear itself rounds a strided bfloat16 input
    # differently, so the forward's claim is about the contiguous inputs it passes)
    assert torch.equal(one(strided), F.linear(strided.contiguous(), ws[0], bs[0]))
    assert torch.equal(one(strided), one(strided.contiguous()))


@needs_fp32
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_float32_products_agree_to_float32_rounding(rows):
    g = torch.Generator().manual_seed(rows)
    ws, bs = _weights(torch.float32, g)
    x = torch.randn(1, rows, 48, generator=g)
    exact = _reference(x.double(), [w.double() for w in ws], [None if b is None else b.double() for b in bs])
    got = PackedLinear(ws, bs)(x)
    assert got.dtype == torch.float32 and got.shape == (1, rows, 64)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)


@needs_fp32
def test_a_copy_is_made_once_per_weight_and_again_after_an_in_place_change():
    g = torch.Generator().manual_seed(0)
    ws, _ = _weights(torch.float32, g)
    first = packed(ws)
    assert packed(ws) is first                              # shared: one copy, however many forwards use it
    assert packed(ws[:1]) is not first                      # another stacking is another copy
    x = torch.randn(3, 48, generator=g)
    with torch.no_grad():
        ws[1].mul_(2.0)                                     # in place: the version moves on
    again = PackedLinear(ws, [None] * 3)(x)
    assert packed(ws) is not first
    torch.testing.assert_close(again, _reference(x, ws, [None] * 3), rtol=1e-5, atol=1e-5)


@needs_bf16
@torch.inference_mode()
@pytest.mark.parametrize("name", ["gqa-3to1-tied", "llama3-rope-biases", "qwen2"])
def test_the_bfloat16_forward_over_onednns_packed_weights_gives_the_plain_forwards_logits_bit_for_bit(
        name, monkeypatch):
    monkeypatch.setattr(base, "KEY_BLOCK", 16)             # so that these few tokens grow the cache on the way
    model = build(**CONFIGS[name]).to(torch.bfloat16)
    with cpu.turned_off():                                  # oneDNN's product over every number of rows
        plain, fast = CachedModel(model, static=True), CachedModel(model, static=True, packed=True)
    assert not plain.static.packed and fast.static.packed
    assert fast.static.layers[0].qkv is not plain.static.layers[0].qkv
    g = torch.Generator().manual_seed(3)
    for m in (plain, fast):
        m.reset(2, torch.device("cpu"), capacity=8)         # small: the cache grows on the way
    for k, keep in ((9, 9), (1, 1), (5, 2), (17, 3), (1, 1)):
        ids = torch.randint(3, 97, (2, k), generator=g)
        a, b = plain.forward(ids), fast.forward(ids)
        assert a.dtype == torch.bfloat16 and torch.equal(a, b)
        for m in (plain, fast):
            m.retain(k, torch.tensor([keep, keep]), keep, keep)
    # the same model's second forward (the autoregressive loop of a run) shares the copies
    again = CachedModel(model, static=True, packed=True)
    assert again.static.head.weight is fast.static.head.weight is packed([model.lm_head.weight])


@pytest.mark.skipif(not cpu.available(), reason=f"bf16_linear: {cpu.unavailable_reason()}")
@torch.inference_mode()
@pytest.mark.parametrize("name", ["llama3-rope-biases", "qwen2"])
def test_the_bfloat16_forward_with_bf16_linear_gives_the_plain_forwards_logits_to_rounding(name):
    model = build(**CONFIGS[name]).to(torch.bfloat16)
    plain, fast = CachedModel(model, static=True), CachedModel(model, static=True, packed=True)
    # ours over a few rows: bf16_linear, or amx_linear where the CPU has AMX (tests/test_cpu_kernels.py)
    assert fast.static.head.few_rows_kernel == few_rows_kernel(torch.bfloat16, model.config.hidden_size) != "onednn"
    g = torch.Generator().manual_seed(3)
    for m in (plain, fast):
        m.reset(2, torch.device("cpu"), capacity=8)
    for k, keep in ((9, 9), (1, 1), (5, 2), (17, 3), (1, 1)):     # rows 18, 2, 10, 34, 2: ours and oneDNN's
        ids = torch.randint(3, 97, (2, k), generator=g)
        a, b = plain.forward(ids).float(), fast.forward(ids).float()
        torch.testing.assert_close(b, a, rtol=0.05, atol=0.05)
        assert (b.argmax(-1) == a.argmax(-1)).float().mean() >= 0.9
        for m in (plain, fast):
            m.retain(k, torch.tensor([keep, keep]), keep, keep)


@torch.inference_mode()
def test_attention_over_whole_blocks_of_keys_does_not_depend_on_how_many_masked_keys_follow():
    """What the static forward's exactness rests on (base.KEY_BLOCK): a query's attention over key_width(end) cached
    keys, those past its position masked, is the same whether its forward ends right after it (a one-token forward)
    or 8 tokens later (a verify forward's). On random data of Qwen2.5-Coder-1.5B's attention (2 key/value heads of 6
    query heads each, D = 128, bfloat16); with blocks of 16 keys, 5 of these 200 differ."""
    g = torch.Generator().manual_seed(0)
    kv_heads, n_rep, D = 2, 6, 128
    differ = 0
    for _ in range(200):
        position = int(torch.randint(20, 1000, (1,), generator=g))
        keys, values = (torch.randn(1, kv_heads, 1100, D, generator=g).bfloat16() for _ in range(2))
        query = (torch.randn(1, kv_heads, n_rep, D, generator=g) * 3).bfloat16()
        outs = []
        for end in (position + 1, position + 9):
            width = key_width(end, torch.device("cpu"))
            attend = (torch.arange(width) <= position).expand(n_rep, width)
            outs.append(F.scaled_dot_product_attention(query, keys[:, :, :width], values[:, :, :width],
                                                       attn_mask=attend))
        differ += not torch.equal(*outs)
    assert differ == 0


@pytest.mark.skipif(not cpu.available(), reason=f"bf16_linear: {cpu.unavailable_reason()}")
@torch.inference_mode()
@pytest.mark.parametrize("name", ["llama3-rope-biases", "qwen2"])
@pytest.mark.parametrize("context", [20, 23, 27, 30])
def test_with_our_few_row_kernel_a_verify_forwards_logits_are_one_token_forwards_bit_for_bit(name, context):
    """Up to the few-row kernel's rows (bf16_linear's 9, amx_linear's 16 where the CPU has AMX) new tokens, a
    forward's logits at each position are those of one-token forwards over the same tokens: its projections are
    row-invariant and so is the attention over them (a verify forward scores what the target alone would compute,
    token for token). With the keys ending at each forward's last token instead of whole blocks (base.KEY_BLOCK),
    six of these eight fail."""
    model = build(**{**CONFIGS[name], "hidden_size": 256, "intermediate_size": 512, **FOUR_PER_KV}).to(torch.bfloat16)
    many, one = CachedModel(model, static=True, packed=True), CachedModel(model, static=True, packed=True)
    rows = row_limit(many.static.head.few_rows_kernel)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, 97, (1, context), generator=g)
    for m in (many, one):
        m.reset(1, torch.device("cpu"), capacity=context + 20)
        m.forward(prompt, last=1)
    ids = torch.randint(3, 97, (1, rows), generator=g)
    together = many.forward(ids, last=rows)
    alone = torch.cat([one.forward(ids[:, i: i + 1], last=1) for i in range(rows)], dim=1)
    assert torch.equal(together, alone)


@pytest.mark.skipif(not cpu.available(), reason=f"bf16_linear: {cpu.unavailable_reason()}")
@torch.inference_mode()
def test_greedy_prompt_lookup_in_bfloat16_emits_the_target_alones_tokens():
    """The engine end to end: prompt lookup at γ 8 verifies up to 9 tokens a forward, the target alone one, and in
    bfloat16 both emit the same tokens (the forward above: not just up to the rounding of near ties). Prompts of a
    few lengths repeat a phrase so that lookup proposes; without whole blocks of keys (base.KEY_BLOCK) it fails."""
    model = build(**{**CONFIGS["qwen2"], "hidden_size": 256, "intermediate_size": 512, **FOUR_PER_KV})
    model = model.to(torch.bfloat16)
    g = torch.Generator().manual_seed(9)
    alone = SpeculativeEngine(model, None, get_sampler("greedy"), gamma=0, device="cpu", eos_token_ids=[])
    lookup = SpeculativeEngine(model, prompt_lookup(1, 3, []), get_sampler("greedy"), gamma=8, device="cpu",
                               eos_token_ids=[])
    assert lookup.target.static.packed
    widths = []
    forward = lookup.target.forward
    lookup.target.forward = lambda ids, *a, **k: widths.append(ids.shape[1]) or forward(ids, *a, **k)
    drafted = 0
    for n in (9, 14, 19, 23, 26):
        phrase = torch.randint(3, 97, (1, n), generator=g)
        ids = torch.cat([phrase, phrase[:, : n // 2], phrase], dim=1)
        mask = torch.ones_like(ids)
        widths.clear()
        ours = lookup.generate(ids, mask, 40)
        assert ours.tokens == alone.generate(ids, mask, 40).tokens, n
        # the prompt but its last token, then forwards of at most γ + 1 tokens from the first step on (its
        # proposals are not read with the prompt, whose forward's rows round with its row count)
        assert widths[0] == ids.shape[1] - 1 and max(widths[1:]) <= 9 and widths[1] > 1
        drafted += sum(s["drafted"] for s in ours.row_stats)
    assert drafted > 0


def test_where_packing_cannot_run_the_plain_projections_do():
    assert not available("meta", torch.float32)
    assert not available("cpu", torch.float16)
    half = build().to(torch.float16)
    assert CachedModel(half, static=True, packed=True).static.packed is False
    assert CachedModel(build(), static=True, packed=False).static.packed is False



@pytest.mark.skipif(not available("cpu", torch.bfloat16), reason="this CPU does not multiply bfloat16 natively")
def test_a_quantised_forward_packs_only_the_dequantised_weights_of_its_prefill():
    """A quantised draft keeps its kernels over a few rows; past quant.KERNEL_ROWS (a prefill) it multiplies a packed
    copy of each dequantised weight: bit for bit the same bfloat16 logits as F.linear over it."""
    model = build(hidden_size=32, intermediate_size=48).to(torch.bfloat16)   # int8: in-features a multiple of 16
    with cpu.turned_off():                                  # oneDNN's packed product (bf16_linear's: to rounding)
        fast = CachedModel(model, static=True, quant="int8", packed=True)
    plain = CachedModel(model, static=True, quant="int8", packed=False)
    assert fast.static.packed is True and plain.static.packed is False
    assert isinstance(fast.static.head.wide, PackedLinear) and not isinstance(plain.static.head.wide, PackedLinear)
    assert type(fast.static.head).__name__ == "Int8Linear"
    g = torch.Generator().manual_seed(3)
    for m in (plain, fast):
        m.reset(1, torch.device("cpu"), capacity=32)
    for k in (9, 1, 2, 7):                                  # the wide path, then the kernel's, then the wide again
        ids = torch.randint(3, 97, (1, k), generator=g)
        assert torch.equal(plain.forward(ids), fast.forward(ids)), k


@pytest.mark.skipif(not cpu.available(), reason=f"bf16_linear: {cpu.unavailable_reason()}")
def test_a_quantised_projections_wide_path_keeps_no_bf16_linear_copy():
    """Its wide path serves only rows past the quantised kernel's: one packed copy (oneDNN's), not two."""
    model = build(hidden_size=128, intermediate_size=256).to(torch.bfloat16)
    fast = CachedModel(model, static=True, quant="int4", packed=True)
    wide = fast.static.head.wide
    assert isinstance(wide, PackedLinear) and wide.few is None and wide.few_rows_kernel == "onednn"
    assert CachedModel(model, static=True, packed=True).static.head.few is not None     # the target's keeps it


def test_packed_weights_is_on_by_default_and_no_packed_weights_turns_it_off():
    assert RunConfig(target="t", data="d").packed_weights is True
    from pipeline.cli import build_parser

    args = build_parser().parse_args(["run", "--target", "t", "--data", "d", "--no-packed-weights"])
    assert args.packed_weights is False
