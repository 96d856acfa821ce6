"""The benchmarks' own logic (goals, paired ratios) and a smoke run; speed itself is never asserted in tests."""

from __future__ import annotations

import json

import pytest

from pipeline.benchmarks.engine import _goals, _paired_ratio
from pipeline.benchmarks.samplers import _goal
from pipeline.cli import main


def test_paired_ratio_cancels_load_changes_between_repeats():
    # repeat 2 ran on a loaded machine: both loops slowed 3x; the ratio stays 2
    assert _paired_ratio({"seconds": [1.0, 3.0, 1.1]}, {"seconds": [2.0, 6.0, 2.2]}) == 2.0


def test_engine_goals_compare_the_right_loops():
    def row(loop, seconds, forward_seconds=None):
        return {"loop": loop, "temperature": 1.0, "seconds": seconds, "tokens_per_second": 1.0,
                "model_forward_seconds": forward_seconds}

    rows = [row("ours_speculative", [1.0], [0.8]), row("hf_assisted", [2.0], [0.9]),
            row("ours_autoregressive", [1.0]), row("hf_plain", [0.9]),
            row("ours_speculative_hf_forward", [3.0]), row("ours_autoregressive_hf_forward", [1.5])]
    goal = _goals(rows)["T=1.0"]
    assert goal["speculative_over_hf_assisted"] == 2.0 and goal["speculative_goal_1.5x_met"]
    assert goal["autoregressive_over_hf_plain"] == 0.9 and not goal["autoregressive_goal_1x_met"]
    assert goal["speculative_ceiling_over_hf_assisted"] == 2.5  # HF's 2 s over our 0.8 s of forwards
    assert goal["static_cache_speculative_speedup"] == 3.0 and goal["static_cache_autoregressive_speedup"] == 1.5
    assert goal["ours_speculative_over_autoregressive"] == 1.0 and goal["hf_assisted_over_plain"] == 0.45


def test_engine_goals_pair_ours_with_hfs_out_of_the_box_loop_with_an_interval():
    def row(loop, seconds):
        return {"loop": loop, "temperature": 0.0, "seconds": seconds, "model_forward_seconds": None}

    rows = [row("ours_speculative", [1.0, 1.0, 1.0]), row("hf_assisted", [1.2, 0.9, 1.1]),
            row("hf_assisted_default", [3.0, 1.5, 2.0]), row("ours_autoregressive", [1.0] * 3),
            row("hf_plain", [1.0] * 3)]
    goal = _goals(rows, equal_gamma=False)["T=0.0"]
    ci = goal["intervals"]["speculative_over_hf_assisted_default"]
    assert goal["speculative_over_hf_assisted_default"] == 2.0 and goal["speculative_over_hf_default_goal_1.5x_met"]
    assert (ci["ci_low"], ci["median"], ci["ci_high"], ci["n"]) == (1.5, 2.0, 3.0, 3) and ci["ci_coverage"] == 0.75
    assert goal["speculative_at_least_hf_assisted_met"] is None       # our draft length was adaptive: not equal γ
    assert _goals(rows)["T=0.0"]["speculative_at_least_hf_assisted_met"] is True
    assert "static_cache_speculative_speedup" not in goal                # its loops did not run


@pytest.mark.slow
def test_bench_engine_smoke_both_loops_draft_gamma_per_step(tmp_path, capsys):
    """A tiny run of `specsweep bench engine`: at T = 0 both speculative loops emit the same tokens, and both
    draft γ tokens per step (HF's schedule really is set: transformers 5 ignores it as a generate kwarg)."""
    out = tmp_path / "e.json"
    assert main(["bench", "engine", "--device", "cpu", "--repeats", "1", "--max-new-tokens", "24", "--gamma", "3",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    by = {(r["loop"], r["temperature"]): r for r in result["results"]}
    assert by[("ours_speculative", 0.0)]["identical_to_hf_assisted"]
    assert by[("ours_autoregressive", 0.0)]["identical_to_hf_plain"]
    for temperature in (0.0, 1.0):       # the static-cache forward emits what transformers' forward emits
        assert by[("ours_speculative", temperature)]["identical_to_hf_forward"]
        assert by[("ours_autoregressive", temperature)]["identical_to_hf_forward"]
        for loop in ("ours_speculative", "hf_assisted", "ours_speculative_hf_forward"):
            r = by[(loop, temperature)]
            # 3 per step but the last few (cut at max_new_tokens)
            assert 2.5 <= r["drafted_per_step"] <= 3.0, (loop, temperature, r["drafted_per_step"])
            assert 0 < r["model_forward_seconds"][0] < r["seconds"][0]
            if temperature > 0:  # full-γ steps are counted alike in both loops
                assert sum(r["full_step_histogram"]) > 0 and 0 <= r["full_step_acceptance"] <= 1
    assert "ours/HF assisted at equal γ 3" in capsys.readouterr().out


def test_sampler_goal_needs_every_v_faster_than_hf():
    def row(sampler, V, median):
        return {"sampler": sampler, "backend": "torch", "B": 1, "gamma": 4, "V": V, "dtype": "float32",
                "median_s": median}

    faster = [row("hf", 1000, 2.0), row("exact", 1000, 1.0), row("hf", 2000, 2.0), row("exact", 2000, 1.5)]
    assert _goal(faster)["met"]
    assert not _goal([*faster[:2], row("hf", 2000, 1.0), row("exact", 2000, 1.5)])["met"]


def test_bench_samplers_quick_writes_a_row_per_sampler_and_hf(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["bench", "samplers", "--quick", "--repeats", "2", "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    names = {(r["sampler"], r["backend"]) for r in result["results"]}
    assert {("exact", "torch"), ("sigmoid", "torch"), ("greedy", "torch"), ("hf", "transformers")} <= names
    assert all(len(r["times_s"]) == 2 and r["median_s"] > 0 for r in result["results"])
    assert result["provenance"]["device"]["device"] == "cpu" and "HF / this" in capsys.readouterr().out
    det = {(r["sampler"], r["backend"]): r for r in result["deterministic"]}
    assert {("exact", "torch"), ("block", "torch"), ("greedy", "torch")} <= set(det)
    for r in det.values():
        ratio = r["one_hot_over_deterministic"]
        assert len(r["deterministic_times_s"]) == len(r["one_hot_times_s"]) == 2
        assert ratio["ci_low"] <= ratio["median"] <= ratio["ci_high"] and ratio["n"] == 2


def test_bench_samplers_deterministic_only_times_only_that_comparison(tmp_path, capsys):
    out = tmp_path / "d.json"
    assert main(["bench", "samplers", "--quick", "--deterministic-only", "--repeats", "3", "--device", "cpu",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] == "samplers-deterministic" and result["results"] == []
    assert {r["sampler"] for r in result["deterministic"]} == {"exact", "block", "greedy"}
    assert "one-hot / deterministic" in capsys.readouterr().out


def test_bench_forward_smoke_times_both_forwards_and_writes_json(tmp_path):
    """A tiny run of `python -m pipeline.benchmarks.forward` without torch.compile (its compile takes 20 s)."""
    import torch

    from pipeline.benchmarks.forward import run

    out = tmp_path / "f.json"
    threads = torch.get_num_threads()
    result = run(context=16, rounds=2, calls=3, compile=False, out=out)
    assert torch.get_num_threads() == threads
    assert json.loads(out.read_text())["results"] == result["results"]
    assert [r["forward"] for r in result["results"]] == ["transformers", "static"]
    for r in result["results"]:
        assert len(r["rounds_ms"]) == 2 and 0 < r["min_round_ms"] <= r["median_ms"] <= r["max_round_ms"]
    assert result["compile_seconds"] is None


def test_bench_drafters_smoke_every_loop_emits_the_targets_tokens(tmp_path, capsys):
    """`specsweep bench drafters` on a tiny target and articles that repeat themselves: our prompt lookup and suffix
    decoding and transformers' prompt lookup all emit the target's greedy tokens, and every ratio has an
    interval."""
    from tiny_models import save_pair, write_articles

    target, _ = save_pair(tmp_path / "pair", kind="gpt2")
    data = write_articles(tmp_path / "articles.jsonl", 3, repeat=3)
    out = tmp_path / "drafters.json"
    assert main(["bench", "drafters", "--target", str(target), "--data", str(data), "--no-chat-template",
                 "--limit", "2", "--max-new-tokens", "12", "--lookup-tokens", "2,4", "--repeats", "3",
                 "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["goals"]["all_identical"], {k: v["identical_to_target"] for k, v in result["loops"].items()}
    assert set(result["loops"]) == {"ours_ar", "hf_plain", "ours_lookup_2", "hf_lookup_2", "ours_suffix_2",
                                    "ours_lookup_4", "hf_lookup_4", "ours_suffix_4"}
    ratio = result["ratios"]["ours_lookup_4_over_hf_lookup_4"]
    assert ratio["ci_low"] <= ratio["median"] <= ratio["ci_high"] and len(ratio["ratios"]) == 3
    assert result["loops"]["ours_lookup_4"]["mean_accepted_tokens"] > 1          # the repeats were found
    assert "lookup" in result["loops"]["ours_lookup_4"]["phase_seconds"]
    assert "ours_lookup_4_over_hf_lookup_4" in capsys.readouterr().out
    assert main(["bench", "drafters", "--target", str(target), "--data", str(data), "--repeats", "2"]) == 2


def test_bench_quant_linear_smoke_times_every_way_that_runs_and_writes_json(tmp_path, capsys):
    """Every (shape, rows) timed bfloat16, packed (oneDNN's, where bfloat16 packs), bf16_linear (ours, up to 9 rows,
    where it runs), int8, int4, int4_linear (ours, up to 4 rows, where it runs), a8 (int8 by int8) and dequantised
    (F.linear over the int8 weight dequantised for the call), each way's error
    against the float32 product within its quantisation's, the table printed and the JSON written; --ways picks."""
    import torch

    from pipeline.benchmarks.quant_linear import WAYS
    from pipeline.benchmarks.quant_linear import main as quant_linear
    from pipeline.decoding.static.packed import available
    from pipeline.kernels import cpu

    out = tmp_path / "quant.json"
    quant_linear(["--shapes", "64x128", "--rows", "1,64", "--rounds", "1", "--calls", "1", "--threads", "1",
                  "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["rows"] for r in result["results"]] == [1, 64] and WAYS[-2:] == ("a8", "dequantised")
    for row in result["results"]:
        expected = {"bfloat16", "int8", "int4", "a8", "dequantised"}
        expected |= {"packed"} if available("cpu", torch.bfloat16) else set()
        expected |= {"int4_linear"} if cpu.available() and row["rows"] <= cpu.MAX_ROWS else set()
        expected |= {"bf16_linear"} if cpu.available() and row["rows"] <= cpu.BF16_ROWS else set()
        assert {w for w in WAYS if f"{w}_us" in row} == expected
        assert all(row[f"{w}_us"] > 0 for w in expected) and all(f"{w}_speedup" in row for w in expected - {"bfloat16"})
        assert row["bfloat16_error"] < 0.01 and row["int8_error"] < 0.02 and row["a8_error"] < 0.03
        assert row["dequantised_error"] < 0.02
        assert row["int4_error"] < 0.15 and row.get("int4_linear_error", 0) < 0.15
        # the same bfloat16 product, where this CPU packs bfloat16 weights at all
        assert "packed" not in expected or row["packed_error"] == row["bfloat16_error"]
        assert ("int4_linear_over_int4" in row) == ("int4_linear" in expected)
        assert ("bf16_linear_over_packed" in row) == ("bf16_linear" in expected and "packed" in expected)
        assert row.get("bf16_linear_error", 0) < 0.01                          # bfloat16's rounding, summed otherwise
    assert "ours / torch int4" in capsys.readouterr().out
    quant_linear(["--shapes", "64x128", "--rows", "1", "--rounds", "1", "--calls", "1", "--threads", "1",
                  "--ways", "int4", "--out", str(out)])
    row = json.loads(out.read_text())["results"][0]
    assert {w for w in WAYS if f"{w}_us" in row} == {"bfloat16", "int4"}
    with pytest.raises(SystemExit) as bad:
        quant_linear(["--ways", "int5", "--out", str(out)])
    assert bad.value.code == 2 and "--ways: unknown way 'int5'" in capsys.readouterr().err


def test_bench_quant_forward_times_a_whole_draft_forward_three_ways(tmp_path, capsys):
    """--model: a Llama-family model's whole forward in bfloat16 (packed), int4 with torch's kernel and int4 with ours
    (where it runs), paired by round; the two int4 kernels' logits closer to each other than to bfloat16's (the same
    quantised weights, scales rounded differently)."""
    from pipeline.benchmarks.quant_linear import main as quant_linear
    from pipeline.kernels import cpu
    from pipeline.synthetic import save_pair

    _, draft = save_pair(tmp_path / "pair", kind="llama", width=128)
    out = tmp_path / "forward.json"
    quant_linear(["--model", str(draft), "--context", "24", "--new-tokens", "1,2", "--rounds", "2", "--calls", "2",
                  "--threads", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["benchmark"] == "quant_forward" and [r["new_tokens"] for r in result["results"]] == [1, 2]
    ours = cpu.available()
    for row in result["results"]:
        assert row["bfloat16_ms"] > 0 and row["int4_ms"] > 0 and row["int4_over_bfloat16"] > 0
        assert ("int4_linear_over_int4" in row) == ours
        if ours:
            low, high = row["int4_linear_over_int4_ci"]
            assert low <= row["int4_linear_over_int4"] <= high
            # the kernels differ from each other by less than the quantisation differs from bfloat16
            assert 0 <= row["kernels_max_abs_logit_diff"] < row["int4_max_abs_logit_diff"]
    assert "int4 over bfloat16" in capsys.readouterr().out
