"""A quantised draft's one-token forward in one kernel call (pipeline/decoding/static/int4_row.py,
kernels/int4_layers.cpp) against llama.py's forward over the same int4 projections, operator by operator.

On a small Qwen2 (q/k/v biases, 8 query heads over 2 key/value heads of 32 dimensions, bfloat16): the first layer's
keys and values are llama.py's bit for bit (norm, projections, biases, RoPE: the same roundings); the logits are
llama.py's to bfloat16 rounding (max difference below 3 % of the largest logit; measured about 0.5 %) and the greedy
token the same in at least 15 of 16 steps; and a cache the one-call forward wrote is read back by llama.py's forward
as its own. The kernel runs where kernels/cpu.py's kernels run (AVX-512 BF16 and a compiler), else the tests skip.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from pipeline.decoding.static import int4_row, llama
from pipeline.kernels import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels: {cpu.unavailable_reason()}")


def _model(**overrides):
    torch.manual_seed(0)
    settings = dict(vocab_size=300, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                    attn_implementation="sdpa", tie_word_embeddings=False)
    config = transformers.Qwen2Config(**{**settings, **overrides})
    model = transformers.Qwen2ForCausalLM(config).eval().to(torch.bfloat16)
    with torch.no_grad():                           # q/k/v biases start at zero: give them values
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


@pytest.fixture(scope="module")
def forward():
    with torch.inference_mode():
        f = llama.LlamaStaticForward(_model(), "int4")
    assert f.row_forward is not None and f.row_kernel == "int4_layers"
    return f


def _step(f, token: int, length: int, one_call: bool) -> torch.Tensor:
    """Logits [1, 1, V] of one token at ``length`` through the one-call forward or llama.py's."""
    saved = f.row_forward
    f.row_forward = saved if one_call else None
    try:
        return f(torch.tensor([[token]]), length, None, None, 1).float()
    finally:
        f.row_forward = saved


def _prefill(f, prompt: torch.Tensor) -> None:
    f.allocate(1, 200, torch.device("cpu"))
    f(prompt, 0, None, None, 1)


def test_the_first_layers_cache_entries_are_llamas_and_the_logits_its_to_rounding(forward):
    prompt = torch.randint(2, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        _prefill(forward, prompt)
        same_token, scale, worst = 0, 0.0, 0.0
        for i, token in enumerate(torch.randint(2, 300, (16,), generator=torch.Generator().manual_seed(2)).tolist()):
            ours = _step(forward, token, 40 + i, one_call=True)
            k_ours, v_ours = forward.keys[0, 0, :, 40 + i].clone(), forward.values[0, 0, :, 40 + i].clone()
            theirs = _step(forward, token, 40 + i, one_call=False)          # rewrites the same position
            torch.testing.assert_close(k_ours, forward.keys[0, 0, :, 40 + i], rtol=0, atol=0)
            torch.testing.assert_close(v_ours, forward.values[0, 0, :, 40 + i], rtol=0, atol=0)
            worst = max(worst, (ours - theirs).abs().max().item())
            scale = max(scale, theirs.abs().max().item())
            same_token += int(ours.argmax() == theirs.argmax())
    assert worst < 0.03 * scale, (worst, scale)
    assert same_token >= 15


def test_llamas_forward_reads_a_cache_the_one_call_forward_wrote(forward):
    prompt = torch.randint(2, 300, (1, 30), generator=torch.Generator().manual_seed(3))
    tokens = torch.randint(2, 300, (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        logits = {}
        for one_call in (True, False):
            _prefill(forward, prompt)
            for i in range(5):                                   # five draft steps, then a forward over three tokens
                _step(forward, tokens[0, i].item(), 30 + i, one_call)
            logits[one_call] = forward(tokens[:, 5:], 35, None, None, 0).float()
    difference = (logits[True] - logits[False]).abs().max().item()
    assert difference < 0.03 * logits[False].abs().max().item()
    assert logits[True].argmax(-1).tolist() == logits[False].argmax(-1).tolist()


def test_every_row_of_a_batch_a_mask_or_positions_take_llamas_forward(forward, monkeypatch):
    calls = []
    monkeypatch.setattr(forward, "row_forward", lambda *a: calls.append(1))
    with torch.inference_mode():
        forward.allocate(2, 64, torch.device("cpu"))
        forward(torch.tensor([[5], [6]]), 0, None, None, 1)                            # two rows
        forward.allocate(1, 64, torch.device("cpu"))
        forward(torch.tensor([[5, 6]]), 0, None, None, 1)                              # two tokens
        forward(torch.tensor([[7]]), 2, torch.ones(1, 1, 1, 3, dtype=torch.bool), None, 1)   # a mask
        forward(torch.tensor([[7]]), 2, None, torch.tensor([[2]]), 1)                  # position ids
        assert calls == []
        forward(torch.tensor([[7]]), 2, None, None, 1)
    assert calls == [1]


@pytest.mark.parametrize("quant,overrides", [("int8", {}), ("none", {}), ("int4", {"hidden_act": "gelu"}),
                                             ("int4", {"head_dim": 16, "num_attention_heads": 16})])
def test_no_one_call_forward_where_the_kernel_does_not_compute_the_model(quant, overrides):
    with torch.inference_mode():
        f = llama.LlamaStaticForward(_model(**overrides), quant)
    assert f.row_forward is None and f.row_kernel is None


def test_no_one_call_forward_where_our_kernels_are_turned_off():
    with torch.inference_mode(), cpu.turned_off():
        f = llama.LlamaStaticForward(_model(), "int4")
    assert f.row_forward is None
    assert int4_row.build(f, f.model) is None


def test_the_kernels_wrapper_refuses_arguments_out_of_range(forward):
    f = forward
    f.allocate(1, 64, torch.device("cpu"))
    row = f.layer_row
    x = torch.zeros(f.embed.shape[1], dtype=torch.bfloat16)
    keys, values = f.keys[:, 0], f.values[:, 0]
    common = dict(heads=f.heads, inter=row.inter, keys=keys, values=values, cos=f.cos[0], sin=f.sin_signed[0],
                  work=row.work, scores=torch.empty(f.heads * f.capacity))
    with pytest.raises(ValueError, match="out of range"):                         # a position past the cache
        cpu.int4_layers(x, row.ptrs, row.floats, pos=f.capacity, **common)
    with pytest.raises(ValueError, match="out of range"):                         # a float32 hidden state
        cpu.int4_layers(x.float(), row.ptrs, row.floats, pos=0, **common)
    with pytest.raises(ValueError, match="out of range"):                         # too little scratch
        cpu.int4_layers(x, row.ptrs, row.floats, pos=0, **{**common, "work": row.work[:-1]})
