"""A quantised target (pipeline/decoding/static/quant.py ``quantize_model``, ``--target-quant``).

The model's projections and head are replaced in place by QuantizedLinear modules holding int8 or int4 weights and no
dense copy, so the model holds a fraction of its bytes; transformers' forward and the static forward both run them.
Having no dense copy, a projection runs its kernel over every number of rows, a prefill's too. The target is then the
quantised model: greedy speculative decoding around it emits exactly what it emits alone, and a run records the
setting and the kernel. Bad settings are one-line errors with exit code 2.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import PROMPTS, cli_run_args, load_saved_pair, save_pair, saved_cli_pair, write_prompts

from pipeline.cli import main
from pipeline.decoding.engine import SpeculativeEngine
from pipeline.decoding.static import quant
from pipeline.decoding.static.quant import Int4Linear, Int8Linear, QuantizedLinear, quantize_model, weight_bytes
from pipeline.errors import SpecsweepError
from pipeline.samplers import get_sampler

EOS = 1


def test_the_settings_name_the_modes_the_module_takes():
    from pipeline.config import TARGET_QUANTS

    assert TARGET_QUANTS == quant.TARGET_MODES


@pytest.mark.parametrize("kind,dtype", [(Int8Linear, torch.float32), (Int8Linear, torch.bfloat16),
                                        (Int4Linear, torch.bfloat16)])
def test_a_projection_without_a_dense_copy_runs_its_kernel_over_every_number_of_rows(kind, dtype, monkeypatch):
    """No dense copy, so a prefill's rows go through the kernel too; its product is the dense-copy projection's kernel
    product, and within the quantisation's error of the float product at any rows."""
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(48, 256, generator=g) * 0.05).to(dtype)
    bias = (torch.randn(48, generator=g) * 0.05).to(dtype)
    extra = {"ours": False} if kind is Int4Linear else {}
    lean, kept = kind(weight, bias, dense=False, **extra), kind(weight, bias, **extra)
    assert lean.wide is None and kept.wide is not None
    tolerance = {Int8Linear: 0.02, Int4Linear: 0.15}[kind]
    for rows in (1, quant.KERNEL_ROWS + 1, 40):
        x = torch.randn(rows, 256, generator=g).to(dtype)
        y = lean(x)
        assert y.shape == (rows, 48) and y.dtype == dtype
        torch.testing.assert_close(y, kept.kernel(x) + bias, rtol=0, atol=0)
        reference = x.float() @ weight.float().T + bias.float()
        assert float((y.float() - reference).norm() / reference.norm()) < tolerance, rows
    calls = []
    monkeypatch.setattr(lean, "kernel", lambda x: calls.append(x.shape[0]) or torch.zeros(x.shape[0], 48, dtype=dtype))
    lean(torch.zeros(3, 100, 256, dtype=dtype))
    assert calls == [300]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Llama target and draft in float32 (widths multiples of 128 for int4), and their tokenizer."""
    return load_saved_pair(tmp_path_factory.mktemp("target-quant"), kind="llama", width=128)


def _dequantised(model, mode: str):
    """A copy of ``model`` whose projections and head (untied) hold their weights quantised and dequantised again
    (quant.quantize_int8 / quantize_int4): the model the quantised one computes, multiplied densely."""
    import copy

    model = copy.deepcopy(model)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    for linear in linears:
        w = linear.weight.detach()
        if mode == "int8":
            q, scales = quant.quantize_int8(w)
            dense = q.to(w.dtype) * scales[:, None]
        else:
            q, scales, lo = quant.quantize_int4(w)
            n, k = w.shape
            dense = (q.view(n, k // quant.GROUP, quant.GROUP) * scales[..., None] + lo[..., None]).view(n, k)
        linear.weight = torch.nn.Parameter(dense.to(w.dtype), requires_grad=False)
    return model


def _greedy(target, draft, tok, gamma: int):
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    sampler = get_sampler("greedy") if gamma == 0 else get_sampler("exact", temperature=0.0)
    engine = SpeculativeEngine(target, draft, sampler, gamma=gamma, device="cpu", eos_token_ids=[EOS], pad_token_id=0)
    return engine, engine.generate(enc.input_ids, enc.attention_mask, 20)


@pytest.mark.parametrize("mode,dtype", [("int8", torch.float32), ("int4", torch.bfloat16)])
def test_speculation_on_a_quantised_target_emits_its_own_tokens(pair, mode, dtype):
    """The model keeps no dense projection (its bytes fall by most of them), its logits stay near the dense model's,
    both forwards run the quantised weights, and greedy speculative decoding gives the quantised target's own
    tokens."""
    import copy

    target, draft, tok = pair
    target, draft = copy.deepcopy(target).to(dtype), copy.deepcopy(draft).to(dtype)
    tied = target.lm_head.weight is target.model.embed_tokens.weight
    dense = copy.deepcopy(target)
    ids = tok(PROMPTS[:1], return_tensors="pt").input_ids
    before = weight_bytes(target)
    saved = quantize_model(target, mode)
    assert target.quantized == mode and saved == before - weight_bytes(target)
    assert quantize_model(target, mode) == 0                                # once: a second call changes nothing
    with pytest.raises(SpecsweepError, match="already quantised"):
        quantize_model(target, "int8" if mode == "int4" else "int4")
    linears = [m for m in target.modules() if type(m) is torch.nn.Linear]
    assert linears == [] and isinstance(target.lm_head, QuantizedLinear)
    assert target.get_output_embeddings().weight.shape == dense.lm_head.weight.shape       # shape only (meta)
    assert target.lm_head.weight.device.type == "meta"
    assert torch.equal(target.model.embed_tokens.weight, dense.model.embed_tokens.weight)  # kept, tied or not
    projections = sum(m.weight.numel() for m in dense.modules() if type(m) is torch.nn.Linear
                      and not (tied and m is dense.lm_head))
    per_weight = {"int8": 1.0, "int4": 0.5}[mode]          # and a scale (and zero) per row or group
    assert saved > projections * (dense.dtype.itemsize - per_weight) * 0.85, (saved, projections)
    with torch.inference_mode():              # the dense model with its weights dequantised, computed by the kernels
        ours, theirs = target(ids).logits.float(), _dequantised(dense, mode)(ids).logits.float()
    assert float((ours - theirs).norm() / theirs.norm()) < {torch.float32: 1e-4, torch.bfloat16: 0.03}[dtype]
    _, alone = _greedy(target, None, tok, 0)
    engine, spec = _greedy(target, draft, tok, 3)
    assert engine.target.static is not None and engine.target.static.quant == mode
    assert isinstance(engine.target.static.head, quant.QuantLinear)
    assert spec.tokens == alone.tokens
    assert sum(s["drafted"] for s in spec.row_stats) > 0
    without_static = SpeculativeEngine(target, None, get_sampler("greedy"), gamma=0, device="cpu",
                                       eos_token_ids=[EOS], pad_token_id=0, static_cache=False)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    hf = without_static.generate(enc.input_ids, enc.attention_mask, 20).tokens      # transformers' forward
    agree = sum(a == b for a, b in zip(hf, alone.tokens))
    assert agree >= len(PROMPTS) - 1, (agree, len(PROMPTS))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return saved_cli_pair(tmp_path_factory.mktemp("target-quant-cli"))


_args = cli_run_args


@pytest.mark.parametrize("mode,dtype", [("int8", "float32"), ("int4", "bfloat16")])
def test_a_run_with_a_quantised_target_records_it_and_its_own_tokens(saved, mode, dtype):
    out = saved[0] / f"{mode}.json"
    assert main(_args(saved, out, "--dtype", dtype, "--target-quant", mode, "--gamma", "3")) == 0
    result = json.loads(out.read_text())
    assert result["config"]["target_quant"] == mode and result["config"]["draft_quant"] == "none"
    assert result["resolved"]["quant_kernel"]["target"] == "torch"
    assert "target" not in result["resolved"]["fallbacks"]     # torch's kernels by design, on every CPU: no fallback
    from pipeline.models import load_causal_lm

    dense = weight_bytes(load_causal_lm(str(saved[1]), getattr(torch, dtype), "cpu"))
    assert 0 < result["resolved"]["model_bytes"]["target"] < dense          # the quantised target as run
    agreement = result["metrics"]["greedy_agreement"]           # against its own paired γ = 0 loop
    assert agreement["samples"] == 2 and agreement["identical"] == 2


@pytest.mark.parametrize("extra,message", [
    (["--dtype", "float32", "--target-quant", "int4"], "use --dtype bfloat16, or --target-quant int8"),
    (["--target-quant", "int8", "--compile", "default"], "--target-quant int8 quantises a transformers target"),
])
def test_bad_settings_are_one_line_errors_with_exit_code_2(saved, capsys, extra, message):
    assert main(_args(saved, saved[0] / "bad.json", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("mode", ["int3", "int8+a8"])
def test_a_mode_it_does_not_take_is_refused_by_the_parser(saved, capsys, mode):
    with pytest.raises(SystemExit) as e:
        main(_args(saved, saved[0] / "bad.json", "--target-quant", mode))
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert f"invalid choice: '{mode}' (choose from 'none', 'int8', 'int4')" in err and len(err.splitlines()) == 1


def test_a_target_of_another_family_is_refused_in_one_line(tmp_path, capsys):
    tp, _ = save_pair(tmp_path, kind="gpt2")
    data = write_prompts(tmp_path / "prompts.jsonl")
    capsys.readouterr()                                           # the save's progress bar, not the run's error
    assert main(["run", "--target", str(tp), "--data", str(data), "--device", "cpu", "--limit", "1",
                 "--max-new-tokens", "4", "--gamma", "0", "--target-quant", "int8", "--no-progress",
                 "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "quantises a Llama, Mistral or Qwen2 target" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out.json").exists()


def test_the_forward_benchmark_reads_a_quantisation_after_a_dtype():
    from pipeline.benchmarks.forward import parse_dtypes

    assert parse_dtypes("float32,bfloat16+int4,float32+int8", "cpu") == ("float32", "bfloat16+int4", "float32+int8")
    with pytest.raises(SpecsweepError, match="is not a dtype"):
        parse_dtypes("bfloat16+int3", "cpu")
    with pytest.raises(SpecsweepError, match="use --dtype bfloat16"):
        parse_dtypes("float32+int4", "cpu")


def test_int8_quantisation_in_blocks_of_rows_is_the_whole_matrixs(monkeypatch):
    """quantize_int8 works through a weight ROWS_AT_ONCE rows at a time (bounded temporaries while a model loads):
    the same q and scales, bit for bit, as one pass over every row, with a last block shorter than the others."""
    g = torch.Generator().manual_seed(2)
    weight = (torch.randn(37, 64, generator=g) * 0.05).to(torch.bfloat16)
    whole = quant.quantize_int8(weight)
    monkeypatch.setattr(quant, "ROWS_AT_ONCE", 8)
    blocks = quant.quantize_int8(weight)
    assert torch.equal(whole[0], blocks[0]) and torch.equal(whole[1], blocks[1])
    w = weight.float()                                      # the formula, written out once
    scales = w.abs().amax(dim=1).clamp_min(1e-12) / 127
    assert torch.equal(blocks[0], torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8))
    assert torch.equal(blocks[1], scales.to(torch.bfloat16))
