"""The roofline's analytic counts against hand-computed values for tiny configs, a run's per-phase figures against an
injected peak (never the machine's speed), and the CPU probe's cache."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, WhisperConfig

from pipeline import roofline
from pipeline.roofline import Cost, ModelShape, forward_cost, run_roofline, verify_cost
from pipeline.toy.cost import matrix_params

# GPT-2: d = 8, 2 layers, 2 heads, d_ff = 4d = 32, V = 10
GPT2 = dict(vocab_size=10, n_embd=8, n_layer=2, n_head=2, n_positions=32)
# one layer: q, k, v, o = 4 x 8 x 8 = 256; MLP 2 x 8 x 32 = 512 -> 768. Two layers 1536, output projection 8 x 10 = 80
LAYER, HEAD = 768, 80


def test_a_gpt2_config_gives_its_matrices():
    shape = ModelShape.from_config(GPT2Config(**GPT2))
    assert shape == ModelShape(layers=2, d_model=8, d_attn=8, d_kv=8, d_ff=32, vocab=10, gated=False)
    assert (shape.layer_params, shape.head_params, shape.matrix_params) == (LAYER, HEAD, 2 * LAYER + HEAD)
    # against the model itself: every non-embedding parameter (plus the tied head) minus what is not counted, the
    # biases and layer norms: per layer c_attn 3 x 8, attn c_proj 8, c_fc 32, mlp c_proj 8, ln_1 and ln_2 2 x 16;
    # ln_f 16
    not_counted = 2 * (24 + 8 + 32 + 8 + 32) + 16
    assert matrix_params(GPT2LMHeadModel(GPT2Config(**GPT2))) == shape.matrix_params + not_counted


def test_a_llama_config_with_grouped_query_attention_and_a_gated_mlp():
    config = LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    shape = ModelShape.from_config(config)
    # head dim 4: q and o 16 x 16, k and v 16 x 8; gate, up, down 16 x 32 each
    assert (shape.d_attn, shape.d_kv, shape.gated) == (16, 8, True)
    assert shape.layer_params == 2 * 256 + 2 * 128 + 3 * 512 == 2304
    model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert shape.matrix_params == linear == 2304 + 16 * 20


def test_an_encoder_decoder_counts_its_decoder_and_cross_attention():
    config = WhisperConfig(vocab_size=12, d_model=8, decoder_layers=1, decoder_attention_heads=2,
                           decoder_ffn_dim=16, encoder_layers=3, encoder_attention_heads=2, encoder_ffn_dim=16,
                           max_source_positions=6)
    shape = ModelShape.from_config(config)
    assert (shape.layers, shape.d_ff, shape.cross_positions) == (1, 16, 6)
    # self-attention q, k, v, o 4 x 64, cross-attention's q and o 2 x 64, MLP 2 x 8 x 16
    assert shape.layer_params == 256 + 128 + 256
    cost = forward_cost(shape, rows=1, new=1, context=3, logits=1, weight_bytes=2)
    # pairs: 1 x 3 cached + 1 new + 6 encoder positions = 10; FLOPs 2 x 640 + 2 x 96 + 4 x 1 x 8 x 10
    assert cost.flops == 2 * 640 + 2 * 96 + 4 * 8 * 10
    # weights (640 + 96) x 2; self K/V 2 x 1 x 8 x 4 positions, cross K/V 2 x 1 x 8 x 6, both x 2 bytes; logits 12 x 2
    assert cost.bytes == 736 * 2 + (64 + 96) * 2 + 24


def test_forward_and_verify_costs_by_hand():
    shape = ModelShape.from_config(GPT2Config(**GPT2))
    cost = forward_cost(shape, rows=2, new=3, context=5, logits=3, weight_bytes=4)
    # (query, key) pairs per row: 3 x 5 cached + 1 + 2 + 3 causal = 21
    # FLOPs per row: 2 x 1536 x 3 (layers) + 2 x 80 x 3 (head) + 4 x 2 layers x 8 x 21 (attention) = 11040
    assert cost.flops == 2 * 11040
    # bytes: weights once (1616 x 4 = 6464) + per row K/V 2 x 2 x 8 x (5 + 3) x 4 = 1024 and logits 3 x 10 x 4 = 120
    assert cost.bytes == 6464 + 2 * (1024 + 120)
    # verify, γ = 3: softmax over 2γ + 1 = 7 rows (4 FLOPs a logit) + residual over γ rows (3 a logit), V = 10
    v = verify_cost(10, 3, rows=2, logit_bytes=4)
    assert (v.flops, v.bytes) == (2 * 10 * (4 * 7 + 3 * 3), 2 * 7 * 10 * 4)
    assert verify_cost(10, 0, rows=1, logit_bytes=2) == Cost(40, 20)      # γ = 0: one softmax to sample from
    assert Cost(1, 2) + Cost(3, 4) == Cost(4, 6) and 2 * Cost(1, 2) == Cost(2, 4)


PEAK = {"flops_per_s": 1e6, "bytes_per_s": 1e5, "source": "injected"}


def test_a_runs_phases_against_an_injected_peak():
    target = ModelShape.from_config(GPT2Config(**GPT2))
    draft = ModelShape.from_config(GPT2Config(**{**GPT2, "n_layer": 1}))              # 768 + 80 = 848 matrices
    # two samples of 6 tokens, batch 1: steps of 4 then 2 tokens after a prompt of 4 -> contexts 4 and 8
    samples = [{"prompt_tokens": 4, "new_tokens": 6, "verify_steps": 2, "origin_steps": [4, 2]}] * 2
    roof = run_roofline(target, draft, 3, 4, samples, {"draft": 0.5, "target": 0.25, "verify": 0.25},
                        {"target": 2, "verify": 4, "prefill": 4}, 12, PEAK)
    assert roof["mean_context"] == 6 and roof["rows_per_call"] == 1 and roof["bounding_phase"] == "draft"
    d = roof["phases"]["draft"]
    # one draft forward: pairs 6 + 1 = 7; FLOPs 2 x 768 + 2 x 80 + 4 x 1 x 8 x 7 = 1920;
    # bytes 848 x 4 + K/V 2 x 1 x 8 x 7 x 4 + logits 10 x 4 = 3880; 12 forwards
    assert (d["calls"], d["flops"], d["bytes"]) == (12, 12 * 1920, 12 * 3880)
    assert d["flops_per_token"] == 12 * 1920 / 12 and d["time_share"] == 0.5
    assert d["flops_per_s"] == 12 * 1920 / 0.5 and d["bytes_per_s"] == 12 * 3880 / 0.5
    intensity = 1920 / 3880
    assert d["intensity"] == pytest.approx(intensity)
    assert d["attainable_flops_per_s"] == pytest.approx(intensity * 1e5)                 # left of the ridge (10)
    assert d["roofline_fraction"] == pytest.approx(d["flops_per_s"] / (intensity * 1e5))
    assert d["roofline_fraction"] == pytest.approx(d["bandwidth_fraction"]) and d["bound"] == "memory"
    t = roof["phases"]["target"]
    assert t["flops"] == 2 * forward_cost(target, 1, 4, 6, 4, 4).flops                   # 2 forwards of γ + 1 = 4
    assert roof["phases"]["verify"]["bytes"] == 4 * 7 * 10 * 4
    assert sum(p["time_share"] for p in roof["phases"].values()) == pytest.approx(1.0)
    lines = roofline.describe(roof)
    assert len(lines) == 5 and "draft phase bounds the speedup" in lines[-1] and "memory-bound" in lines[1]


def test_context_without_step_lengths_and_runs_without_a_draft_or_tokens():
    samples = [{"prompt_tokens": 10, "new_tokens": 8, "verify_steps": 4}]               # prompt + half the tokens
    assert roofline.mean_context(samples) == 14
    target = ModelShape.from_config(GPT2Config(**GPT2))
    roof = run_roofline(target, None, 0, 4, samples, {"target": 1.0, "verify": 1.0}, {"target": 3, "verify": 4},
                        0, PEAK)
    assert set(roof["phases"]) == {"target", "verify"} and roof["rows_per_call"] == 1
    assert run_roofline(target, None, 0, 4, [], {}, {}, 0, PEAK) is None


def test_attainment_on_the_compute_roof_and_without_a_peak():
    out = roofline.attainment(5e5, 1e4, 50.0, PEAK)                  # intensity 50 > ridge 10: compute-bound
    assert out["attainable_flops_per_s"] == 1e6 and out["roofline_fraction"] == 0.5 and out["bound"] == "compute"
    assert roofline.attainment(5e5, 1e4, 50.0, {})["roofline_fraction"] is None


def test_the_cpu_peak_is_probed_once_per_machine_and_cached(tmp_path, monkeypatch):
    probes = []

    def fake(dtype_name, threads, timeout_s=120):
        probes.append((dtype_name, threads))
        return {"flops_per_s": 2e9, "bytes_per_s": 3e9, "matmul_n": 16}

    monkeypatch.setattr(roofline, "probe_in_child", fake)
    first = roofline.machine_peak("cpu", torch.float32, cache=tmp_path)
    again = roofline.machine_peak("cpu", torch.float32, cache=tmp_path)
    assert probes == [("float32", torch.get_num_threads())] and first == again
    assert first["flops_per_s"] == 2e9 and first["threads"] == torch.get_num_threads() and first["source"] == "probe"
    roofline.machine_peak("cpu", torch.bfloat16, cache=tmp_path)          # another dtype: probed too
    assert [d for d, _ in probes] == ["float32", "bfloat16"]
    assert len(json.loads((tmp_path / "peak.json").read_text())) == 2
    monkeypatch.setenv("SPECSWEEP_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert roofline.cache_dir() == tmp_path / "elsewhere"


def test_a_failed_probe_warns_caches_nothing_and_leaves_the_roofline_without_fractions(tmp_path, monkeypatch, capsys):
    def broken(dtype_name, threads, timeout_s=120):
        raise RuntimeError("the probe process failed: boom")

    monkeypatch.setattr(roofline, "probe_in_child", broken)
    peak = roofline.machine_peak("cpu", torch.float32, cache=tmp_path)
    assert peak["source"] == "unavailable" and "flops_per_s" not in peak
    assert "could not be probed (the probe process failed: boom)" in capsys.readouterr().err
    assert not (tmp_path / "peak.json").exists()
    target = ModelShape.from_config(GPT2Config(**GPT2))
    samples = [{"prompt_tokens": 4, "new_tokens": 4, "verify_steps": 4}]
    roof = run_roofline(target, None, 0, 4, samples, {"target": 1.0, "verify": 1.0}, {"target": 3, "verify": 4}, 0,
                        peak)
    assert roof["phases"]["target"]["flops_per_s"] > 0 and roof["phases"]["target"]["roofline_fraction"] is None


@pytest.mark.slow
def test_the_cpu_probe_measures_finite_positive_peaks_in_a_child_process():
    """The real probe (about a second, plus starting a Python process): finite, positive figures; what they are
    depends on the machine."""
    peak = roofline.probe_in_child("float32", 1)
    assert all(math.isfinite(peak[k]) and peak[k] > 0 for k in ("flops_per_s", "bytes_per_s"))
    assert peak["matmul_n"] in (512, 1024)
