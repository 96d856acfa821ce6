"""The Llama static-cache forward (pipeline/decoding/static/llama.py) computes what transformers' forward computes.

Tiny random configurations cover what SmolLM2, Llama 3, Mistral and Qwen2 checkpoints vary: grouped-query attention
(3:1, as SmolLM2-135M) and plain multi-head attention, tied and untied embeddings, rope_theta, a head_dim that is not
hidden_size / heads, RoPE scaling types, attention and MLP biases. Each is compared with transformers' own forward
(through CachedModel, as the engine drives both) over a prompt and appends, rollbacks and re-appends, a ragged
batch with left padding and holes, dropped rows and a grown buffer; and with a full forward without a cache. A seeded
generation emits the same tokens with and without it, and what it does not implement goes to transformers. The
forward over packed weights (pipeline/decoding/static/packed.py, the engine's default on a CPU) is held to the same
tests.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import PROMPTS, load_saved_pair

from pipeline.decoding.cache import CachedModel
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.static import LlamaStaticForward, static_forward_for
from pipeline.samplers import get_sampler

V = 97
EOS = 1

CONFIGS = {
    "gqa-3to1-tied": dict(family="llama", num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    "mha-untied": dict(family="llama", num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "head-dim-10": dict(family="llama", num_attention_heads=3, num_key_value_heads=1, head_dim=10),
    "llama3-rope-biases": dict(family="llama", num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                               mlp_bias=True, rope_parameters={
                                   "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16}),
    "linear-rope": dict(family="llama", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                         "factor": 2.0}),
    "yarn-rope": dict(family="llama", rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                       "original_max_position_embeddings": 32}),
    "qwen2": dict(family="qwen2", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "mistral": dict(family="mistral", num_attention_heads=4, num_key_value_heads=1, sliding_window=None),
}


def build(family: str = "llama", seed: int = 0, **overrides):
    """A tiny random model of ``family`` in eval mode (sdpa attention, float32)."""
    import transformers

    prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[family]
    config_cls, model_cls = getattr(transformers, f"{prefix}Config"), getattr(transformers, f"{prefix}ForCausalLM")
    settings = dict(vocab_size=V, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, pad_token_id=0,
                    bos_token_id=1, eos_token_id=1, tie_word_embeddings=False)
    settings.update(overrides)
    torch.manual_seed(seed)
    return model_cls(config_cls(**settings)).eval()


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request):
    return build(**CONFIGS[request.param])


@pytest.fixture(params=[False, True], ids=["plain", "packed"])
def packed(request):
    return request.param


def _both(model, packed: bool = False):
    static, dynamic = CachedModel(model, static=True, packed=packed), CachedModel(model, static=False)
    assert isinstance(static.static, LlamaStaticForward) and dynamic.static is None
    assert static.static.packed is packed       # float32 on a CPU: packed wherever torch has oneDNN
    return static, dynamic


def _agree(models, *args, **kwargs):
    out = [m.forward(*args, **kwargs) for m in models]
    torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-5)
    return out[0]


@torch.inference_mode()
def test_a_prompt_appends_rollbacks_and_re_appends_agree(model, packed):
    models = _both(model, packed)
    g = torch.Generator().manual_seed(0)
    for m in models:
        m.reset(1, torch.device("cpu"), capacity=64)
    prompt = torch.randint(3, V, (1, 9), generator=g)
    _agree(models, prompt)
    sequence = prompt
    for k, keep in ((1, 1), (3, 1), (4, 0), (1, 1), (5, 2), (2, 2)):
        ids = torch.randint(3, V, (1, k), generator=g)
        _agree(models, ids, last=1)
        for m in models:                 # roll back all but ``keep`` of the k tokens: the static cache moves its length
            m.retain(k, torch.tensor([keep]), keep, keep)
        sequence = torch.cat([sequence, ids[:, :keep]], dim=1)
    assert models[0].length == models[1].length == sequence.shape[1]
    # the cached state is the sequence's: appending one more token gives the full forward's last logits
    ids = torch.randint(3, V, (1, 1), generator=g)
    full = model(torch.cat([sequence, ids], dim=1)).logits[:, -1:]
    torch.testing.assert_close(_agree(models, ids), full, rtol=1e-5, atol=1e-5)
    assert models[0].static.capacity == 64


@torch.inference_mode()
def test_a_ragged_batch_with_padding_holes_dropped_rows_and_growth_agrees(model, packed):
    models = _both(model, packed)
    g = torch.Generator().manual_seed(1)
    B, L = 4, 7
    prompt = torch.randint(3, V, (B, L), generator=g)
    valid = torch.arange(L) >= torch.tensor([0, 3, 1, 5])[:, None]          # left padding
    for m in models:
        m.reset(B, torch.device("cpu"), capacity=L + 2)                   # small: the static buffer must grow
    _agree(models, prompt, valid, last=1, holes=True)
    for step in range(6):
        k = 1 + step % 3
        _agree(models, torch.randint(3, V, (models[0].batch, k), generator=g))
        keep = torch.randint(0, k + 1, (models[0].batch,), generator=g)        # uneven rollbacks leave holes
        for m in models:
            m.retain(k, keep, int(keep.max()), int(keep.min()))
        if step == 3:                    # rows finish and leave the cache
            for m in models:
                m.select(torch.tensor([0, 2, 3]))
    _agree(models, torch.randint(3, V, (3, 2), generator=g), torch.tensor([[True, False]] * 3), holes=True)
    assert models[0].static.capacity > L + 2
    assert models[0].length == models[1].length
    torch.testing.assert_close(models[0].mask, models[1].mask)


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    return load_saved_pair(tmp_path_factory.mktemp("llama"), kind="llama")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("gamma", [0, 3])
def test_a_seeded_generation_emits_the_same_tokens_with_and_without_it(llama_pair, gamma, temperature):
    """transformers' forward, ours over the model's weights, ours over packed copies (the engine's default)."""
    target, draft, tok = llama_pair
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    results = []
    for static, packed in ((False, False), (True, False), (True, True)):
        engine = SpeculativeEngine(target, draft, get_sampler("exact", temperature=temperature), gamma=gamma,
                                   device="cpu", eos_token_ids=[EOS], pad_token_id=0, static_cache=static,
                                   packed_weights=packed)
        assert isinstance(engine.target.static, LlamaStaticForward) is static
        assert static is False or engine.target.static.packed is packed
        results.append(engine.generate(enc.input_ids, enc.attention_mask, 24,
                                       generator=torch.Generator().manual_seed(7)))
    assert results[0].tokens == results[1].tokens == results[2].tokens
    assert ([r["accepted"] for r in results[0].row_stats] == [r["accepted"] for r in results[1].row_stats]
            == [r["accepted"] for r in results[2].row_stats])


def test_what_it_does_not_implement_goes_to_transformers():
    assert static_forward_for(build()) is not None
    refused = {
        "eager attention": build(attn_implementation="eager"),
        "dynamic rope": build(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        "longrope": build(max_position_embeddings=64, rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 3, "long_factor": [2.0] * 3,
            "original_max_position_embeddings": 32}),
        "mistral sliding window": build("mistral", sliding_window=16),
        "qwen2 sliding window": build("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1),
    }
    for why, m in refused.items():
        assert static_forward_for(m) is None, why
        assert CachedModel(m, static=True).static is None, why
    m = build()
    m.train()
    assert static_forward_for(m) is None                 # dropout is active in training mode
    m.eval()
    m.hf_device_map = {"model.layers.0": 0, "lm_head": 1}    # spread over two GPUs by accelerate
    assert static_forward_for(m) is None
    del m.hf_device_map

    class Wrapped(torch.nn.Linear):                         # e.g. a quantised or LoRA linear
        pass

    proj = m.model.layers[1].mlp.up_proj
    m.model.layers[1].mlp.up_proj = Wrapped(proj.in_features, proj.out_features, bias=False)
    assert static_forward_for(m) is None


def test_bench_forward_on_a_model_folder_pairs_both_forwards_and_writes_json(tmp_path):
    """`python -m pipeline.benchmarks.forward --model PATH`, tiny: a folder with only a config.json (random weights)."""
    import json

    from pipeline.benchmarks.forward import main

    build(num_attention_heads=6, num_key_value_heads=2).config.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "f.json"
    threads = torch.get_num_threads()
    assert main(["--model", str(tmp_path / "tiny"), "--context", "16", "--new-tokens", "1,3", "--rounds", "3",
                 "--calls", "2", "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads
    result = json.loads(out.read_text())
    assert [r["new_tokens"] for r in result["results"]] == [1, 3]
    for r in result["results"]:
        assert len(r["ratios"]) == 3 and r["speedup"]["ci_low"] <= r["speedup"]["median"] <= r["speedup"]["ci_high"]
        assert r["transformers_ms"] > 0 and r["static_ms"] > 0 and r["max_abs_logit_diff"] < 1e-4


def test_bench_forward_times_each_dtype_in_the_same_rounds(tmp_path):
    """`--dtypes float32,bfloat16`: a row per (dtype, new tokens) with the verify cost r = ms(q) / ms(1), and a row per
    new tokens pairing the two dtypes' static forwards."""
    import json

    from pipeline.benchmarks.forward import main

    build(num_attention_heads=6, num_key_value_heads=2).config.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "f.json"
    assert main(["--model", str(tmp_path / "tiny"), "--context", "16", "--new-tokens", "1,3", "--rounds", "3",
                 "--calls", "2", "--dtypes", "float32,bfloat16", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["dtype"], r["new_tokens"]) for r in result["results"]] == [
        ("float32", 1), ("float32", 3), ("bfloat16", 1), ("bfloat16", 3)]
    for r in result["results"]:
        assert len(r["rounds_ms"]["static"]) == 3 and r["verify_cost"]["ci_low"] <= r["verify_cost"]["median"]
    assert [r["verify_cost"]["median"] for r in result["results"] if r["new_tokens"] == 1] == [1.0, 1.0]
    assert [(r["over"], r["dtype"], r["new_tokens"]) for r in result["dtypes"]] == [
        ("float32", "bfloat16", 1), ("float32", "bfloat16", 3)]
    assert all(r["max_abs_logit_diff"] < 0.05 for r in result["results"])  # ours computes transformers' operations
    # where our forward packs its weights, ours over the model's own is timed in the same rounds and compared (to
    # float32 rounding in float32; in bfloat16 bit for bit with oneDNN's packed product, to bfloat16 rounding with
    # bf16_linear's over these few rows); where bf16_linear runs them, oneDNN's over every row count is timed too
    from pipeline.decoding.static.packed import available, few_rows_kernel

    for r in result["results"]:
        dtype = getattr(torch, r["dtype"])
        if not available("cpu", dtype):
            assert "plain_ms" not in r and "onednn_ms" not in r
            continue
        assert len(r["rounds_ms"]["plain"]) == 3 and r["plain_ms"] > 0
        assert r["packed_speedup"]["ci_low"] <= r["packed_speedup"]["median"] <= r["packed_speedup"]["ci_high"]
        ours = few_rows_kernel(dtype) != "onednn"
        assert ("onednn_ms" in r) == ours
        # where amx_linear runs the few rows (a CPU with AMX), bf16_linear's are timed against it too
        assert ("bf16_linear_ms" in r) == (few_rows_kernel(dtype) == "amx_linear")
        if "bf16_linear_ms" in r:
            assert len(r["rounds_ms"]["bf16_linear"]) == 3 and r["amx_speedup"]["median"] > 0
            assert r["bf16_linear_max_abs_logit_diff"] <= 0.05
        if ours:
            assert len(r["rounds_ms"]["onednn"]) == 3 and r["few_rows_speedup"]["median"] > 0
            assert r["onednn_max_abs_logit_diff"] <= 0.05 and r["plain_max_abs_logit_diff"] <= 0.05
            assert r["onednn_verify_cost"]["median"] > 0
        else:
            assert r["plain_max_abs_logit_diff"] <= (0.0 if r["dtype"] == "bfloat16" else 1e-4)
