"""The report ranks one task and target's runs of several dtypes against one reference, the target alone in its
fastest measured dtype (analysis/speed_reference.py): the recommendation, the Pareto front, the rules' order and
runs.csv. A speedup is over the target alone in the run's own dtype, so a dtype can win on speedup and lose on
speed: here bfloat16 reaches 1.89x over its own target alone (249 tok/s) and float32 1.39x over its own (435 tok/s),
yet bfloat16 emits 471 tokens/s against float32's 605. With one dtype nothing changes."""

from __future__ import annotations

import json

import pytest
from test_report import make_study, result, table_rows, write

from pipeline.analysis.recommend import recommend
from pipeline.analysis.tables import load_all
from pipeline.cli import main
from pipeline.results_table import load_runs

F32_ALONE, BF16_ALONE = 435.0, 249.0      # the target alone's tokens/s in each dtype


def run(dtype: str, speedup: float, ci: tuple[float, float], alone: float, baseline=None, draft="d", **kw) -> dict:
    """An exact γ 4 run in ``dtype``: its paired speedup and interval, its tokens/s (speedup x the target alone's
    ``alone``) and its own paired γ = 0 loop's tokens/s."""
    r = result(gamma=4, speedup=speedup, score=0.40, dtype=dtype, baseline=baseline, draft=draft, **kw)
    r["metrics"].update(speedup_ci_low=ci[0], speedup_ci_high=ci[1], tokens_per_second=speedup * alone,
                        ar_tokens_per_second=alone)
    return r


def alone(dtype: str, tokens_per_second: float) -> dict:
    r = result(gamma=0, speedup=None, score=0.40, dtype=dtype)
    r["metrics"]["tokens_per_second"] = tokens_per_second
    return r


@pytest.fixture
def two_dtypes(tmp_path):
    """One pair in float32 and bfloat16: an AR baseline and an exact run in each, and a study with a dtype axis: a
    float32 trial with its results file, a bfloat16 one (1.7x over its own target alone) known from the study
    alone."""
    runs = tmp_path / "runs"
    f32 = str(write(runs / "ar-float32.json", alone("float32", F32_ALONE)))
    bf16 = str(write(runs / "ar-bfloat16.json", alone("bfloat16", BF16_ALONE)))
    write(runs / "f32.json", run("float32", 1.39, (1.33, 1.45), F32_ALONE, f32))
    write(runs / "bf16.json", run("bfloat16", 1.89, (1.80, 1.95), BF16_ALONE, bf16))
    tune = tmp_path / "tune"
    t0 = write(tune / "text" / "trials" / "00000.json", run("float32", 1.2, (1.1, 1.3), F32_ALONE, f32))
    make_study(tune, "text", [({"gamma": 4, "sampler": "exact", "dtype": "float32"}, (1.2, 0.40), t0),
                              ({"gamma": 4, "sampler": "exact", "dtype": "bfloat16"}, (1.7, 0.40), None)])
    return tmp_path


def test_the_recommendation_ranks_two_dtypes_against_the_target_alone_in_its_fastest_dtype(two_dtypes, capsys):
    table = load_all(load_runs(two_dtypes / "runs"), tune=two_dtypes / "tune")
    rec = recommend(table, 0.01).set_index("choice")
    for choice in ("fastest within 1.0% quality loss", "best lossless"):
        best = rec.loc[choice]        # by its own speedup bfloat16 (1.89x) would win; by tokens/s float32 does
        assert (best["run"], best["dtype"], best["speed_reference_dtype"]) == ("f32", "float32", "float32")
        assert (best["speedup_vs_reference"], best["speedup_vs_reference_ci_low"],
                best["speedup_vs_reference_ci_high"]) == (1.39, 1.33, 1.45)     # the reference's own: paired

    out = two_dtypes / "reports"
    assert main(["report", "--runs", str(two_dtypes / "runs"), "--tune", str(two_dtypes / "tune"),
                 "--out", str(out)]) == 0
    capsys.readouterr()
    md = (out / "report.md").read_text()
    recommendation = md.split("## Recommendation")[1].split("\n## ")[0]
    assert ("cnn_dailymail, t: ranked against the target alone in float32, its fastest measured dtype (435 tok/s, "
            "1 AR baseline(s); bfloat16: 249 tok/s (1 AR baseline(s))).") in recommendation
    assert "not paired, so it has no interval" in recommendation
    assert "The Optuna study's own objective (and its front) is the per-dtype speedup" in recommendation
    rows = table_rows(md, "## Recommendation")
    speed = rows[0].index("speedup vs reference")
    assert [r[speed] for r in rows[1:]] == ["1.39x [1.33, 1.45]"] * 2

    pair = md.split("## cnn_dailymail: t ← d")[1].split("\n## ")[0]
    assert "ranked against the target alone in float32" in pair
    front = table_rows(pair, "Pareto front (")
    assert [r[0] for r in front[1:]] == ["f32"]          # bf16 (1.89x own, 1.08x against float32) is dominated
    rules = table_rows(pair, "### Acceptance rules side by side")
    assert [r[-1] for r in rules[1:]] == ["f32", "bf16"]
    assert [r[-2] for r in rules[1:]] == ["1.39x [1.33, 1.45]", f"{1.89 * BF16_ALONE / F32_ALONE:.2f}x (unpaired)"]


def test_runs_csv_carries_the_speedup_against_the_reference(two_dtypes, capsys):
    import pandas as pd

    out = two_dtypes / "reports"
    assert main(["report", "--runs", str(two_dtypes / "runs"), "--out", str(out), "--table-only"]) == 0
    capsys.readouterr()
    runs = pd.read_csv(out / "runs.csv").set_index("run")
    assert runs.loc["f32", "speedup_vs_reference"] == 1.39
    assert (runs.loc["f32", "speedup_vs_reference_ci_low"], runs.loc["f32", "speedup_vs_reference_ci_high"]) == \
        (1.33, 1.45)
    # bfloat16: its speedup x its target alone's tokens/s over float32's = its tokens/s over float32's target alone
    assert runs.loc["bf16", "speedup_vs_reference"] == pytest.approx(471.0 / F32_ALONE, rel=1e-3)
    assert runs.loc["bf16", ["speedup_vs_reference_ci_low", "speedup_vs_reference_ci_high"]].isna().all()
    assert set(runs["speed_reference_dtype"]) == {"float32"}
    assert set(runs["speed_reference_tokens_per_second"]) == {F32_ALONE}
    assert runs.loc["bf16", "target_alone_tokens_per_second"] == BF16_ALONE
    assert runs.loc[["ar-float32", "ar-bfloat16"], "speedup_vs_reference"].isna().all()   # baselines have none
    summary = (out / "summary.md").read_text()
    assert summary.index("| f32 |") < summary.index("| bf16 |")     # best against the reference first


def test_with_one_dtype_the_speedup_against_the_reference_is_the_paired_speedup(two_dtypes, capsys):
    runs = two_dtypes / "runs"
    (runs / "ar-bfloat16.json").unlink()
    (runs / "bf16.json").unlink()
    write(runs / "f32-g2.json", run("float32", 1.2, (1.1, 1.3), F32_ALONE, str(runs / "ar-float32.json")))
    table = load_runs(runs)
    out = two_dtypes / "reports"
    assert main(["report", "--runs", str(runs), "--out", str(out)]) == 0
    capsys.readouterr()
    import pandas as pd

    csv = pd.read_csv(out / "runs.csv").set_index("run")
    speedy = csv[csv["kind"] == "run"]
    for col in ("", "_ci_low", "_ci_high"):
        assert (speedy[f"speedup_vs_reference{col}"] == speedy[f"speedup{col}"]).all()
    md = (out / "report.md").read_text()
    assert "speedup vs reference" not in md and "Speed reference" not in md and "fastest measured dtype" not in md
    assert recommend(table, 0.01).set_index("choice").loc["best lossless", "run"] == "f32"
    # one dtype and no measurement of the target alone at all (no baseline, no paired loop's tokens/s): still the
    # paired speedup, not left out
    (runs / "ar-float32.json").unlink()
    for name in ("f32.json", "f32-g2.json"):
        old = json.loads((runs / name).read_text())
        del old["metrics"]["ar_tokens_per_second"]
        write(runs / name, old)
    rec = recommend(load_runs(runs), 0.01).set_index("choice")
    assert (rec.loc["best lossless", "run"], rec.loc["best lossless", "speedup_vs_reference"]) == ("f32", 1.39)


def test_without_baselines_the_paired_loops_give_the_target_alones_speed(tmp_path, capsys):
    """No γ = 0 results file: each dtype's target alone is its runs' paired γ = 0 loop. A dtype with neither is left
    out of the recommendation, and the report says so; a draft whose best is slower than float32's target alone
    says so, naming the dtype."""
    runs = tmp_path / "runs"
    write(runs / "f32.json", run("float32", 1.39, (1.33, 1.45), F32_ALONE))
    write(runs / "bf16.json", run("bfloat16", 1.89, (1.80, 1.95), BF16_ALONE))
    write(runs / "d2-bf16.json", run("bfloat16", 1.5, (1.4, 1.6), BF16_ALONE, draft="d2"))
    fp16 = run("float16", 3.0, (2.9, 3.1), 100.0, draft="d3")
    del fp16["metrics"]["ar_tokens_per_second"]                    # an older file: no paired loop's tokens/s
    write(runs / "fp16.json", fp16)
    rec = recommend(load_runs(runs), 0.01)
    assert "fp16" not in set(rec["run"])        # its 3.0x cannot be put on the reference's scale: left out
    rec = rec.set_index(["draft", "choice"])
    assert rec.loc[("d", "best lossless"), "run"] == "f32"
    slow = rec.loc[("d2", "best lossless")]
    assert slow["speedup_vs_reference"] == pytest.approx(1.5 * BF16_ALONE / F32_ALONE)
    assert slow["note"].startswith("slower than the target alone in float32, its fastest measured dtype (speedup "
                                   "0.86x, not paired, no interval)")
    out = tmp_path / "reports"
    assert main(["report", "--runs", str(runs), "--out", str(out)]) == 0
    capsys.readouterr()
    md = (out / "report.md").read_text()
    assert ("ranked against the target alone in float32, its fastest measured dtype (435 tok/s, the γ = 0 loop of 1 "
            "paired run(s); bfloat16: 249 tok/s (the γ = 0 loop of 2 paired run(s)))") in md
    assert "Runs in float16 are left out: no measurement of the target alone in that dtype." in md


def test_two_dtypes_without_any_measurement_of_the_target_alone_are_not_ranked_and_the_report_says_so(tmp_path,
                                                                                                      capsys):
    runs = tmp_path / "runs"
    for name, dtype, speedup in (("f32", "float32", 1.39), ("bf16", "bfloat16", 1.89)):
        old = run(dtype, speedup, (speedup - 0.05, speedup + 0.05), 300.0)
        del old["metrics"]["ar_tokens_per_second"]
        write(runs / f"{name}.json", old)
    assert recommend(load_runs(runs), 0.01).empty
    out = tmp_path / "reports"
    assert main(["report", "--runs", str(runs), "--out", str(out)]) == 0
    capsys.readouterr()
    md = (out / "report.md").read_text()
    said = ("cnn_dailymail, t: measured in bfloat16, float32, but with no measurement of the target alone in any of "
            "them, so its runs cannot be ranked against one reference")
    recommendation, pair = md.split("## Recommendation")[1].split("\n## cnn_dailymail: t ← d")
    assert "nothing to recommend yet" in recommendation and said in recommendation      # why nothing is
    assert said in pair.split("Pareto front")[0] and "No run or trial with both" in pair
