"""The static-cache forward (pipeline/decoding/static/) computes what transformers' forward computes.

Logits agree with transformers' over a ragged batch (left padding, holes from uneven rollbacks, rows dropped,
the buffer grown past its first capacity); a seeded generation emits the same tokens, step for step, with and
without it; models it does not cover fall back to transformers' forward.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import PROMPTS, build_model, build_tokenizer, load_saved_pair

from pipeline.decoding.cache import CachedModel
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.static import GPT2StaticForward, static_forward_for
from pipeline.samplers import get_sampler

EOS = 1


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    return load_saved_pair(tmp_path_factory.mktemp("gpt2"), kind="gpt2")


def _both(model):
    static, dynamic = CachedModel(model, static=True), CachedModel(model, static=False)
    assert isinstance(static.static, GPT2StaticForward) and dynamic.static is None
    return static, dynamic


def test_logits_agree_through_padding_holes_rollback_row_drops_and_growth(gpt2_pair):
    target, _, tok = gpt2_pair
    enc = tok(PROMPTS[:4], return_tensors="pt", padding=True)
    models = _both(target)
    g = torch.Generator().manual_seed(0)
    V = len(tok)

    def both(ids, valid=None, last=0, holes=False):
        out = [m.forward(ids, valid, last, holes) for m in models]
        torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-5)
        return out[0]

    for m in models:
        m.reset(4, torch.device("cpu"), capacity=enc.input_ids.shape[1] + 2)   # small: the static one must grow
    both(enc.input_ids, enc.attention_mask.bool(), last=1, holes=True)
    for step in range(6):
        ids = torch.randint(3, V, (models[0].batch, 4), generator=g)
        both(ids)
        keep = torch.randint(0, 5, (models[0].batch,), generator=g)
        for m in models:
            m.retain(4, keep, int(keep.max()), int(keep.min()))
        if step == 3:                    # rows finish and leave the cache
            rows = torch.tensor([0, 2])
            for m in models:
                m.select(rows)
    assert models[0].static.capacity > enc.input_ids.shape[1] + 2
    assert models[0].length == models[1].length
    torch.testing.assert_close(models[0].mask, models[1].mask)


def test_logits_agree_at_batch_one_without_holes(gpt2_pair):
    target, _, tok = gpt2_pair
    models = _both(target)
    ids = tok(PROMPTS[3], return_tensors="pt").input_ids
    for m in models:
        m.reset(1, torch.device("cpu"), capacity=64)
    outs = [m.forward(ids) for m in models]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    for k in (1, 3, 1):
        nxt = outs[0][:, -k:].argmax(-1)
        outs = [m.forward(nxt, last=1) for m in models]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
        for m in models:                 # roll one token back: the static cache only moves its length
            m.retain(k, torch.tensor([k - 1]), k - 1, k - 1)
    assert models[0].static.keys.shape[3] == 64


@pytest.mark.parametrize("gamma", [0, 3])
@pytest.mark.parametrize("sampler", ["exact", "sigmoid"])
def test_a_seeded_generation_emits_the_same_tokens_with_and_without_it(gpt2_pair, gamma, sampler):
    target, draft, tok = gpt2_pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    results = []
    for static in (True, False):
        engine = SpeculativeEngine(target, draft, get_sampler(sampler, temperature=1.0), gamma=gamma, device="cpu",
                                   eos_token_ids=[EOS], pad_token_id=0, static_cache=static)
        assert (engine.target.static is not None) is static
        results.append(engine.generate(enc.input_ids, enc.attention_mask, 24,
                                       generator=torch.Generator().manual_seed(7)))
    assert results[0].tokens == results[1].tokens
    assert [r["accepted"] for r in results[0].row_stats] == [r["accepted"] for r in results[1].row_stats]
    assert results[0].verify_steps == results[1].verify_steps


def test_models_without_a_static_forward_use_transformers():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    V = len(build_tokenizer()) + 3
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=4, intermediate_size=64)).eval()
    assert static_forward_for(neox) is None          # a family without a static forward
    assert CachedModel(neox, static=True).static is None
    gpt2 = build_model("gpt2", V, layers=1, width=32, seed=0).eval()
    assert static_forward_for(gpt2) is not None
    gpt2.config._attn_implementation = "eager"          # eager attention rounds differently from sdpa
    assert static_forward_for(gpt2) is None
    gpt2.config._attn_implementation = "sdpa"
    gpt2.hf_device_map = {"transformer.h.0": 0, "lm_head": 1}   # spread over two GPUs by accelerate
    assert static_forward_for(gpt2) is None
    del gpt2.hf_device_map
    gpt2.train()
    assert static_forward_for(gpt2) is None             # dropout is active in training mode
