"""Real shapes without weights (pipeline/models.py ``is_shape``): a folder holding only a config.json loads with random
weights, the same in every process, and runs through `specsweep run`, which records that its weights are random.

The committed shapes in kernels/shapes/ are checked against the parameter counts their models publish (built on the
meta device: nothing is allocated), so a typo in a config cannot pass as a real shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import write_prompts

from pipeline.cli import main
from pipeline.errors import SpecsweepError
from pipeline.models import is_shape, load_causal_lm, load_processor, load_tokenizer

SHAPES = Path(__file__).resolve().parents[1] / "kernels" / "shapes"

# parameters of each shape's published checkpoint (its model card or safetensors header), in millions, rounded; the
# Qwen pair's as this project runs it: its GGUF files store the head apart from the embeddings (docs/models.md), so
# 1,544M + 233M and 494M + 136M (vocabulary x hidden) instead of the tied checkpoints' 1,544M and 494M
PUBLISHED_M = {"qwen2.5-coder-1.5b-shape": 1777, "qwen2.5-coder-0.5b-shape": 630, "llama-3-8b-shape": 8030,
               "llama-3.2-1b-shape": 1236, "llama-68m-shape": 68, "whisper-small.en-shape": 242,
               "distil-small.en-shape": 166}


@pytest.mark.parametrize("name", sorted(PUBLISHED_M))
def test_each_committed_shape_has_its_published_parameter_count(name):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSpeechSeq2Seq

    folder = SHAPES / name
    assert is_shape(str(folder))
    config = AutoConfig.from_pretrained(folder)
    cls = AutoModelForSpeechSeq2Seq if config.is_encoder_decoder else AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(config)
    count = sum(p.numel() for p in model.parameters()) / 1e6     # tied weights are one parameter
    assert count == pytest.approx(PUBLISHED_M[name], rel=0.01), count


def test_the_shape_list_is_the_folder():
    assert sorted(p.name for p in SHAPES.iterdir() if p.is_dir()) == sorted(PUBLISHED_M)


@pytest.fixture(scope="module")
def shape_pair(tmp_path_factory):
    """Two tiny Qwen2 shapes (config.json only) and prompts."""
    from transformers import Qwen2Config

    root = tmp_path_factory.mktemp("shapes")
    for name, layers in (("target", 2), ("draft", 1)):
        Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    architectures=["Qwen2ForCausalLM"]).save_pretrained(root / name)
    return root / "target", root / "draft", write_prompts(root / "prompts.jsonl")


def test_a_shape_loads_the_same_random_weights_and_leaves_the_random_state_alone(shape_pair):
    target, _, _ = shape_pair
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = load_causal_lm(str(target), torch.float32, "cpu")
    assert torch.equal(torch.random.get_rng_state(), before)
    b = load_causal_lm(str(target), torch.bfloat16, "cpu")
    assert a.random_weights and b.dtype == torch.bfloat16
    assert a.config._attn_implementation == "sdpa"
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.to(torch.bfloat16), q, msg=name)
    tok = load_tokenizer(str(target))
    ids = tok("the storm hit the city").input_ids
    assert ids and max(ids) < a.config.vocab_size


def test_a_folder_with_weights_is_not_a_shape(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert is_shape(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert not is_shape(str(tmp_path)) and not is_shape(str(tmp_path / "missing"))


def test_a_speech_shape_says_where_it_runs():
    with pytest.raises(SpecsweepError, match=r"pipeline\.benchmarks\.forward"):
        load_processor(str(SHAPES / "whisper-small.en-shape"))


@pytest.mark.slow
def test_a_compiled_run_of_shapes_records_its_random_weights_and_its_compile(shape_pair, tmp_path):
    """What gpu_validate.sh runs at real shapes, at a tiny one: shapes, compiled steps, through `specsweep run`."""
    target, draft, data = shape_pair
    out = tmp_path / "run.json"
    assert main(["run", "--target", str(target), "--draft", str(draft), "--data", str(data), "--gamma", "3",
                 "--temperature", "0", "--sampler", "greedy", "--max-new-tokens", "8", "--ignore-eos",
                 "--compile", "default", "--batch-size", "1", "--repeats", "3", "--no-progress",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    resolved = result["resolved"]
    assert resolved["random_weights"] == ["target", "draft"]
    assert all(s["new_tokens"] == 8 for s in result["samples"])
    for role in ("target", "draft"):
        assert resolved["compiled"][role]["mode"] == "default" and resolved["compiled"][role]["shapes"] >= 1
        assert resolved["packed_weights"][role] is False
