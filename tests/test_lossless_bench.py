"""`specsweep bench lossless` on tiny synthetic pairs: the lossless rules pass in float32, a lossy rule passed with
--rules is caught (so the check can fail), the report shows the results or says the benchmark has not been run,
and bad input is one line with exit code 2."""

from __future__ import annotations

import json

import pytest
from tiny_models import save_pair, write_prompts

from pipeline.benchmarks.lossless import first_divergence, homogeneity
from pipeline.cli import main
from pipeline.rules import RULES

FAST = ["--device", "cpu", "--dtypes", "float32", "--greedy-tokens", "8", "--max-new-tokens", "3"]


def bench(tmp_path, pair, *args) -> dict:
    out = tmp_path / "bench" / "lossless-cpu.json"
    target, draft = pair
    assert main(["bench", "lossless", "--target", str(target), "--draft", str(draft), "--data",
                 str(write_prompts(tmp_path / "prompts.jsonl")), *FAST, *args, "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def close_pair(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("close"))                 # the draft: a noisy copy (5 %)


@pytest.fixture(scope="module")
def far_pair(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("far"), noise=1.0)        # a draft far from its target


def test_every_lossless_rule_of_the_registry_matches_in_float32(tmp_path, close_pair, capsys):
    result = bench(tmp_path, close_pair, "--samples", "60")   # hf draws one per call: slow
    lossless = [name for name, rule in RULES.items() if rule.lossless == "always"]
    assert [r["rule"] for r in result["results"]] == lossless          # read from the registry, in its order
    assert result["benchmark"] == "lossless" and "versions" in result["provenance"]
    exact = next(r for r in result["results"] if r["rule"] == "exact")
    assert exact["dtype"] == "float32" and exact["greedy"]["match_rate"] == 1.0
    assert exact["greedy"]["prompts"] == 5 and all(p["identical"] for p in exact["greedy"]["per_prompt"])
    for r in result["results"]:
        s = r["sampled"]
        for p in s["per_prompt"]:
            for test in (p["first_token"], p["first_two_tokens"]):
                assert 0.0 <= test["p_value"] <= 1.0
        assert s["verdict"] == "same" and s["threshold"] == pytest.approx(0.01 / 2)
        if RULES[r["rule"]].needs_sampling:                             # hf: T > 0 only, said so
            assert r["greedy"] is None and "greedy part skipped" in r["greedy_skipped"]
            assert any(skip["rule"] == r["rule"] for skip in result["skipped"])
        else:
            assert r["greedy"]["match_rate"] == 1.0
    out = capsys.readouterr().out
    assert "verdict" in out and "wrote" in out


def test_a_lossy_rule_is_caught_by_both_checks(tmp_path, far_pair):
    result = bench(tmp_path, far_pair, "--rules", "exact,accept_all,sigmoid:paper", "--samples", "400")
    by = {r["label"]: r for r in result["results"]}
    assert list(by) == ["exact", "accept_all", "sigmoid:paper"]
    assert by["exact"]["greedy"]["match_rate"] == 1.0 and by["exact"]["sampled"]["verdict"] == "same"
    # every draft token accepted: the draft's greedy output, not the target's
    greedy = by["accept_all"]["greedy"]
    assert greedy["match_rate"] < 1.0
    bad = next(p for p in greedy["per_prompt"] if not p["identical"])
    d = bad["first_divergence"]
    assert d["target_token"] != d["rule_token"] and d["position"] >= 0
    # the paper's sigmoid accepts nearly every draft token: the draft's distribution, caught at 400 samples
    for label in ("accept_all", "sigmoid:paper"):
        assert by[label]["sampled"]["verdict"] == "differs", label
        assert by[label]["sampled"]["min_p_value"] < by[label]["sampled"]["threshold"]


def test_report_shows_the_benchmark_or_says_it_has_not_been_run(tmp_path, close_pair):
    (tmp_path / "runs").mkdir()
    out = tmp_path / "reports"
    args = ["report", "--runs", str(tmp_path / "runs"), "--bench", str(tmp_path / "bench"), "--out", str(out)]
    assert main(args) == 0
    heading = "Losslessness per dtype (`specsweep bench lossless`)"
    md = (out / "report.md").read_text()
    assert heading in md and "has not been run" in md[md.index(heading):]
    bench(tmp_path, close_pair, "--rules", "exact", "--samples", "50")
    assert main(args) == 0
    md = (out / "report.md").read_text()
    section = md[md.index(heading):]
    section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else None]   # up to the next section
    assert "has not been run" not in section
    for text in ("lossless-cpu.json", "exact", "float32", "100% (5/5)", "same"):
        assert text in section, text
    assert heading.split(" (")[0] in (out / "report.html").read_text()


@pytest.mark.parametrize("args, message", [
    (["--rules", "nope"], "unknown rule 'nope'"),
    (["--rules", "sigmoid:fast"], "has no preset 'fast'"),
    (["--dtypes", "float64"], "--dtypes must name"),
    (["--samples", "5"], "--samples >= 10"),
    (["--max-new-tokens", "1"], "--max-new-tokens >= 2"),
    (["--alpha", "0"], "--alpha must be in (0, 1)"),
    (["--target", "models/x"], "give both --target and --draft"),
    (["--data", "/nonexistent.jsonl"], "--data /nonexistent.jsonl does not exist"),
    (["--synthetic", "--data", "p.jsonl"], "--synthetic builds its own pair"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    assert main(["bench", "lossless", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_homogeneity_pools_rare_cells_and_first_divergence():
    same = homogeneity([1] * 50 + [2] * 50 + [3], [1] * 50 + [2] * 50 + [4])
    assert same["categories"] == 4 and same["columns_tested"] == 2 and same["p_value"] == pytest.approx(1.0)
    assert homogeneity([1] * 100, [2] * 100)["p_value"] < 1e-20
    assert homogeneity([7] * 30, [7] * 30)["p_value"] == 1.0           # one category: nothing to tell apart
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2                    # one ended early (EOS)
