"""--dtype auto: the CPU's native bfloat16 read from /proc/cpuinfo, the target's size from its safetensors headers,
and the choice recorded in the results."""

from __future__ import annotations

import json

import pytest
from tiny_models import save_pair, write_prompts

from pipeline import dtypes
from pipeline.cli import main
from pipeline.dtypes import cpu_bf16_flags, resolve_dtype
from pipeline.models import parameter_count

X86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx512f avx512_bf16 amx_bf16 amx_tile\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"
OLD_X86 = "flags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"


@pytest.mark.parametrize("cpuinfo, flags", [(X86, ["avx512_bf16"]), (SAPPHIRE_RAPIDS, ["avx512_bf16", "amx_bf16"]),
                                            (ARM, ["bf16"]), (OLD_X86, []), ("", [])])
def test_native_bfloat16_is_read_from_cpuinfo(cpuinfo, flags):
    assert cpu_bf16_flags(cpuinfo) == flags


@pytest.mark.parametrize("flags, parameters, expected", [
    (["avx512_bf16"], 1_500_000_000, "bfloat16"),
    (["avx512_bf16"], None, "bfloat16"),           # size unknown: taken as a real model
    (["avx512_bf16"], 3_000_000, "float32"),       # a toy target: per-operation cost dominates
    ([], 1_500_000_000, "float32"),                # bfloat16 emulated
])
def test_auto_on_a_cpu(monkeypatch, flags, parameters, expected):
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: flags)
    used, why = resolve_dtype("auto", "cpu", parameters)
    assert used == expected and why.startswith("auto: ")
    assert resolve_dtype("float16", "cpu", parameters) == ("float16", None)   # a named dtype is kept


def test_parameter_count_reads_the_safetensors_headers(tmp_path):
    from transformers import AutoModelForCausalLM

    target, _ = save_pair(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(target)
    assert parameter_count(str(target)) == sum(p.numel() for p in model.parameters())   # a tied head once
    assert parameter_count(str(tmp_path)) is None       # a folder without weights


@pytest.mark.parametrize("threshold, expected", [(None, "float32"), (0, "bfloat16")])
def test_a_run_with_dtype_auto_records_what_it_chose_and_why(tmp_path, monkeypatch, threshold, expected):
    """The default --dtype is auto: a tiny target stays in float32; with the threshold at 0 (and the flag present)
    the same run decodes in bfloat16. The results' config holds the dtype used, resolved.dtype_choice why."""
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: ["avx512_bf16"])
    if threshold is not None:
        monkeypatch.setattr(dtypes, "AUTO_BF16_MIN_PARAMETERS", threshold)
    target, draft = save_pair(tmp_path)
    out = tmp_path / "r.json"
    data = write_prompts(tmp_path / "p.jsonl")
    assert main(["run", "--target", str(target), "--draft", str(draft), "--data", str(data), "--device", "cpu",
                 "--max-new-tokens", "6", "--limit", "2", "--temperature", "0", "--repeats", "3", "--no-progress",
                 "--samples-per-repeat", "2",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["dtype"] == expected
    assert result["resolved"]["dtype_choice"].startswith("auto: ")
    # without --baseline a greedy run's tokens are compared with the paired γ = 0 loop's on the timed samples
    agreement = result["metrics"]["greedy_agreement"]
    assert agreement["reference"].startswith("the paired γ = 0 loop") and agreement["samples"] == 2
    if expected == "float32":
        assert agreement["identical"] == 2
