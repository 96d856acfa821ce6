"""`specsweep report` and pipeline.analysis: the table, the Pareto front, the theory curves, the recommendation,
the figures and the HTML, from small results files written in the real schema."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from pipeline.analysis.pareto import pareto_mask
from pipeline.analysis.recommend import recommend
from pipeline.analysis.tables import load_all
from pipeline.cli import main
from pipeline.objectives import expected_tokens_iid, expected_tokens_positions, position_acceptance
from pipeline.results_table import CONFIG_COLUMNS, METRIC_COLUMNS, load_runs

PNG = b"\x89PNG\r\n\x1a\n"


def result(task="cnn_dailymail", sampler="exact", gamma=4, speedup=1.5, score=0.40, acceptance=0.7,
           hist=(2, 1, 1, 2, 4), alpha=None, beta=None, temperature=1.0, baseline=None, device="cpu", dtype="float32",
           target="t", draft="d"):
    """A results dict with every field the report reads, shaped as pipeline.runner.run writes it."""
    quality = ({"rouge1": score, "rouge2": score / 2, "rougeL": score, "rougeLsum": score}
               if task == "cnn_dailymail" else {"wer": score, "normalizer": "basic"})
    hist = list(hist)[: gamma + 1] if gamma else None
    prov_device = {"device": device, "cpu": "x86_64", "cpu_threads": 2}
    if device.startswith("cuda"):
        prov_device = {"device": device, "gpu": "NVIDIA H100", "cuda_runtime": "13.0"}
    return {
        "specsweep_results": 1,
        "config": {"task": task, "target": target, "draft": draft, "sampler": sampler, "backend": "torch",
                   "alpha": alpha, "beta": beta, "preset": None, "gamma": gamma, "temperature": temperature,
                   "dtype": dtype, "device": device, "batch_size": 1, "max_new_tokens": 32, "limit": 8, "seed": 0,
                   "engine": "specsweep", "baseline": baseline, "out": "x.json"},
        "resolved": {"device": device, "samples": 8, "baseline": baseline},
        "provenance": {"date": "2026-11-21T10:00:00+00:00", "host": "box", "versions": {"torch": "2.13.0"},
                       "device": prov_device},
        "metrics": {"tokens_per_second": 100.0 * (speedup or 1.0), "wall_time_s": 1.0, "new_tokens": 100,
                    "acceptance_rate": acceptance if gamma else None,
                    "mean_accepted_tokens": expected_tokens_iid(acceptance, gamma) if gamma else None,
                    "cost_ratio": 0.1 if gamma else None, "theoretical_speedup": speedup * 1.1 if gamma else 1.0,
                    "peak_memory_mb": 10.0, "accepted_histogram": hist,
                    "position_acceptance": position_acceptance(hist),
                    **({"speedup": speedup, "baseline_tokens_per_second": 100.0} if gamma else {})},
        "quality": quality,
        "samples": [{"id": f"s{i}"} for i in range(8)],
    }


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def make_study(tune: Path, name: str, trials: list[tuple[dict, tuple[float, float], Path | None]]) -> None:
    """An Optuna study in tune/<name>/study.db with these (params, values, results file) trials, and its front."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    (tune / name).mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name=f"s-{name}", storage=f"sqlite:///{tune / name / 'study.db'}",
                                directions=["maximize", "maximize"])
    dists = {"gamma": optuna.distributions.IntDistribution(1, 8),
             "sampler": optuna.distributions.CategoricalDistribution(["exact", "sigmoid"]),
             "dtype": optuna.distributions.CategoricalDistribution(["float32"]),
             "alpha": optuna.distributions.FloatDistribution(0.25, 4.0, log=True),
             "beta": optuna.distributions.FloatDistribution(-30.0, 0.0)}
    for params, values, path in trials:
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params}, values=list(values),
            user_attrs={"results": str(path) if path else None}))
    best = sorted(study.best_trials, key=lambda t: t.number)
    write(tune / f"{name}-pareto.json",
          {"study": f"s-{name}", "objectives": ["speedup", "quality"], "n_trials": len(trials),
           "best_trials": [{"number": t.number, "values": dict(zip(("speedup", "quality"), t.values)),
                            "params": t.params, "results": t.user_attrs.get("results")} for t in best]})


@pytest.fixture
def tree(tmp_path):
    """results/runs (an AR baseline, four runs, an unrelated JSON), results/tune (a study), results/bench."""
    runs = tmp_path / "runs"
    ar = write(runs / "text-ar-float32.json", result(gamma=0, speedup=None, score=0.40))
    b = str(ar)
    write(runs / "text-exact-torch-g2-float32.json", result(gamma=2, speedup=1.2, score=0.401, baseline=b))
    write(runs / "text-exact-torch-g4-float32.json", result(gamma=4, speedup=1.5, score=0.398, baseline=b))
    write(runs / "text-sigmoid-torch-g4-float32.json",
          result(sampler="sigmoid", gamma=4, speedup=2.0, score=0.35, acceptance=0.9, baseline=b))
    write(runs / "text-greedy-torch-g4-float32.json",
          result(sampler="greedy", gamma=4, speedup=3.0, score=0.20, acceptance=0.95, baseline=b))
    write(runs / "notes.json", {"something": "else"})
    tune = tmp_path / "tune"
    t0 = write(tune / "text" / "trials" / "00000.json", result(gamma=4, speedup=1.4, score=0.40, baseline=b))
    t1 = write(tune / "text" / "trials" / "00001.json",
               result(sampler="sigmoid", gamma=2, speedup=1.8, score=0.398, alpha=2.0, beta=-10.0, baseline=b))
    make_study(tune, "text", [({"gamma": 4, "sampler": "exact", "dtype": "float32"}, (1.4, 0.40), t0),
                              ({"gamma": 2, "sampler": "sigmoid", "dtype": "float32", "alpha": 2.0, "beta": -10.0},
                               (1.8, 0.398), t1),
                              ({"gamma": 6, "sampler": "sigmoid", "dtype": "float32", "alpha": 0.5, "beta": -5.0},
                               (1.1, 0.30), None)])  # no results file: known from the study only
    bench = tmp_path / "bench"
    rows = [{"B": B, "gamma": 4, "V": V, "dtype": "float32", "sampler": s, "backend": be, "median_s": m * V * B}
            for B in (1, 16) for V in (32000, 128256)
            for s, be, m in (("exact", "torch", 1e-9), ("sigmoid", "torch", 5e-10), ("hf", "transformers", 4e-9))
            if not (s == "hf" and B != 1)]
    write(bench / "samplers-cpu.json", {"benchmark": "samplers", "results": rows,
                                        "provenance": {"date": "2026-11-21T09:00:00+00:00", "host": "box",
                                                       "device": {"device": "cpu", "cpu_threads": 2}}})
    return tmp_path


def kernel_results(path: Path) -> Path:
    """A `specsweep bench kernels` JSON: cupy samplers with their floor, torch, hf at B = 1, FlashInfer."""
    rows = []
    for B in (1, 16, 64):
        for V in (32000, 128256):
            base = {"B": B, "gamma": 5, "V": V, "dtype": "bfloat16"}
            for s, m in (("exact", 2e-10), ("sigmoid", 1e-10), ("greedy", 1e-10)):
                rows.append({**base, "impl": "cupy", "sampler": s, "median_s": m * B * V, "floor_s": 5e-11 * B * V})
            rows.append({**base, "impl": "torch", "sampler": "exact", "median_s": 1e-9 * B * V})
            rows.append({**base, "impl": "flashinfer+softmax", "sampler": "exact", "median_s": 3e-10 * B * V})
            if B == 1:
                rows.append({**base, "impl": "hf", "sampler": "exact", "median_s": 4e-9 * V})
    return write(path, {"benchmark": "kernels", "results": rows, "floor": {"empty_launch_s": 3e-6},
                        "provenance": {"date": "2026-11-22T09:00:00+00:00", "host": "gpu1",
                                       "device": {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}}})


def test_table_has_one_row_per_run_baseline_trial_and_timing(tree):
    runs = load_runs(tree / "runs")
    for col in ("run", *CONFIG_COLUMNS, "resolved_device", *METRIC_COLUMNS, "rougeL", "quality", "tradeoff",
                "samples"):
        assert col in runs.columns, col  # the minimal report's columns are all still there
    assert sorted(runs["run"]) == ["text-ar-float32", "text-exact-torch-g2-float32", "text-exact-torch-g4-float32",
                                   "text-greedy-torch-g4-float32", "text-sigmoid-torch-g4-float32"]
    assert runs.set_index("run").loc["text-ar-float32", "kind"] == "baseline"
    assert runs["cpu_only"].all() and set(runs["device_name"]) == {"CPU (x86_64, 2 threads)"}
    assert runs.set_index("run").loc["text-exact-torch-g4-float32", "tradeoff"] == pytest.approx(1.5 * 0.398 / 0.40)

    table = load_all(runs, tune=tree / "tune", kernels=tree / "no-kernels", bench=tree / "bench")
    assert table["kind"].value_counts().to_dict() == {"latency": 10, "run": 4, "trial": 3, "baseline": 1}
    trials = table[table["kind"] == "trial"].set_index("trial")
    assert sorted(trials["run"]) == ["s-text#0", "s-text#1", "s-text#2"]
    assert trials.loc[1, "source"].endswith("00001.json") and trials.loc[1, "alpha"] == 2.0
    # the trial without a results file: values from the study, task and pair from its siblings
    assert trials.loc[2, "source"].endswith("text-pareto.json") and trials.loc[2, "task"] == "cnn_dailymail"
    assert trials.loc[2, "rougeL"] == pytest.approx(0.30) and trials.loc[2, "speedup"] == pytest.approx(1.1)
    assert list(trials.sort_index()["on_study_front"]) == [True, True, False]
    lat = table[table["kind"] == "latency"]
    assert set(lat["impl"]) == {"exact (torch)", "sigmoid (torch)", "hf"} and lat["cpu_only"].all()


def test_study_database_is_only_read(tree):
    db = tree / "tune" / "text" / "study.db"
    before = (db.stat().st_mtime_ns, db.read_bytes())
    load_all(load_runs(tree / "runs"), tune=tree / "tune")
    assert (db.stat().st_mtime_ns, db.read_bytes()) == before


def brute_force_front(xs, ys):
    n = len(xs)
    return [all(not (xs[j] >= xs[i] and ys[j] >= ys[i] and (xs[j], ys[j]) != (xs[i], ys[i])) for j in range(n))
            for i in range(n)]


def test_pareto_front_matches_brute_force_with_ties():
    rng = random.Random(0)
    for trial in range(400):
        n = rng.randint(1, 25)
        grid = rng.choice((3, 6, 1000))  # small grids force ties in x, in y and identical points
        xs = [rng.randint(0, grid) / grid for _ in range(n)]
        ys = [rng.randint(0, grid) / grid for _ in range(n)]
        assert pareto_mask(xs, ys) == brute_force_front(xs, ys), (trial, xs, ys)
    assert pareto_mask([1.0, 1.0, 0.5], [2.0, 2.0, 3.0]) == [True, True, True]
    assert pareto_mask([1.0, float("nan"), 2.0], [1.0, 5.0, None]) == [True, False, False]
    assert pareto_mask([], []) == []


def test_theory_curves():
    assert expected_tokens_positions([0.6] * 5, 5) == pytest.approx(expected_tokens_iid(0.6, 5))
    assert expected_tokens_iid(1.0, 4) == 5.0 and expected_tokens_iid(0.0, 4) == 1.0
    assert expected_tokens_positions([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens_positions([0.5, None], 2) is None and expected_tokens_positions([0.5], 3) is None
    # from a histogram: E[accepted + 1] of the steps it counts
    hist = [3, 1, 0, 2, 4]
    mean = sum((k + 1) * c for k, c in enumerate(hist)) / sum(hist)
    assert expected_tokens_positions(position_acceptance(hist), 4) == pytest.approx(mean)


def test_recommendation_picks_fastest_within_the_loss_and_best_lossless(tree):
    table = load_all(load_runs(tree / "runs"), tune=tree / "tune")
    rec = recommend(table, 0.01).set_index("choice")
    fast = rec.loc["fastest within 1.0% quality loss"]
    # sigmoid g4 (2.0x, -12.5 %) and greedy (3.0x, -50 %) lose too much; trial #1 (1.8x, -0.5 %) wins
    assert fast["run"] == "s-text#1" and fast["quality_loss"] == pytest.approx(0.005)
    lossless = rec.loc["best lossless"]
    assert lossless["run"] == "text-exact-torch-g4-float32"   # greedy at T = 1 is not lossless
    wide = recommend(table, 0.2).set_index("choice").loc["fastest within 20.0% quality loss"]
    assert wide["run"] == "text-sigmoid-torch-g4-float32"


def test_flagged_runs_are_left_out_of_recommendation_and_front_and_listed_on_their_own(tree, capsys):
    """The issue's case: an exact run at 9.3x against a theoretical 0.94x, flagged by its run, must not win."""
    runs = tree / "runs"
    bad = result(gamma=5, speedup=9.31, score=0.401, baseline=str(runs / "text-ar-float32.json"))
    bad["metrics"].update(flagged=True, theoretical_speedup=0.94, predicted_speedup=0.94, speedup_ci_low=9.2,
                          speedup_ci_high=9.4)
    reason = "implausible: measured speedup 9.31x is 9.90 times the 0.94x that the run's own acceptance and cost ratio"
    bad["measurement"] = {"flags": [reason], "load": {"others_busy_cores": 1.7}}
    write(runs / "text-exact-torch-g5-float32.json", bad)
    table = load_all(load_runs(runs), tune=tree / "tune")
    assert table.set_index("run").loc["text-exact-torch-g5-float32", "flagged"] == True  # noqa: E712
    rec = recommend(table, 0.01).set_index("choice")
    assert rec.loc["best lossless", "run"] == "text-exact-torch-g4-float32"
    assert rec.loc["fastest within 1.0% quality loss", "run"] == "s-text#1"
    out = tree / "reports"
    assert main(["report", "--runs", str(runs), "--tune", str(tree / "tune"), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    flagged_section = md.split("## Flagged measurements")[1].split("\n## ")[0]
    assert "text-exact-torch-g5-float32" in flagged_section and reason in flagged_section
    front = md.split("Pareto front (")[1].split("\n### ")[0]
    assert "text-exact-torch-g5-float32" not in front
    assert "9.31x" not in md.split("## Recommendation")[1].split("## Flagged measurements")[0]
    capsys.readouterr()


def test_recommendation_on_wer_uses_word_accuracy_and_greedy_at_t0(tmp_path):
    runs = tmp_path / "runs"
    ar = str(write(runs / "asr-ar.json", result(task="librispeech", gamma=0, speedup=None, score=0.10,
                                                  temperature=0.0)))
    for name, sampler, speedup, wer in (("a", "sigmoid", 2.0, 0.105), ("b", "sigmoid", 2.5, 0.12),
                                        ("c", "greedy", 1.7, 0.10), ("d", "exact", 1.6, 0.10)):
        write(runs / f"asr-{name}.json", result(task="librispeech", sampler=sampler, speedup=speedup, score=wer,
                                                temperature=0.0, baseline=ar))
    rec = recommend(load_runs(runs), 0.01).set_index("choice")
    fast = rec.loc["fastest within 1.0% quality loss"]
    assert fast["run"] == "asr-a" and fast["quality_loss"] == pytest.approx(1 - 0.895 / 0.9)
    assert rec.loc["best lossless", "run"] == "asr-c"


def html_refs(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', html)


@pytest.mark.parametrize("with_kernels", [False, True])
def test_report_writes_every_figure_and_the_html_references_only_files_that_exist(tree, capsys, with_kernels):
    kernels = tree / "kernels"
    if with_kernels:
        kernel_results(kernels / "h100.json")
    out = tree / "reports"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "stale.png").write_bytes(PNG)
    assert main(["report", "--runs", str(tree / "runs"), "--tune", str(tree / "tune"), "--kernels", str(kernels),
                 "--bench", str(tree / "bench"), "--out", str(out)]) == 0
    assert "5 run(s)" in capsys.readouterr().out
    figs = sorted(p.name for p in (out / "figures").glob("*.png"))
    slug = "cnn-dailymail-t-d"
    expected = {f"quality-{slug}.png", f"acceptance-{slug}.png", f"sigmoid-{slug}.png", "latency-samplers.png"}
    assert set(figs) == expected | ({"latency-kernels.png"} if with_kernels else set())  # stale.png removed
    for name in figs:
        data = (out / "figures" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    html = (out / "report.html").read_text()
    refs = html_refs(html)
    assert sorted(Path(r).name for r in refs) == figs
    assert all((out / r).is_file() for r in refs) and not any("://" in r for r in refs)
    md = (out / "report.md").read_text()
    assert all((out / r).is_file() for r in re.findall(r"\]\(([^)]+\.png)\)", md))
    skipped = "No kernel benchmark results"
    assert (skipped in md) != with_kernels and (skipped in html) != with_kernels
    assert "CPU only" in md and "paper, as reported" in md.lower()
    assert "text-exact-torch-g4-float32.json" in md  # the recommendation names its source file
    import pandas as pd

    full = pd.read_csv(out / "results.csv")
    assert len(full) == 18 + (3 * 2 * 5 + 2 if with_kernels else 0)  # kernels: B x V x impls, + hf at B = 1
    assert sorted(pd.read_csv(out / "runs.csv")["run"]) == sorted(load_runs(tree / "runs")["run"])


def engine_results(path: Path, device: dict) -> Path:
    """A `specsweep bench engine` JSON (its structure, with made-up numbers) at T = 0 and T = 1."""
    rows, goals = [], {}
    for t, spec, ar, acc in ((0.0, 1.3, 1.04, (0.39, 0.39)), (1.0, 2.04, 0.98, (0.438, 0.446))):
        for loop, gamma, a in (("ours_speculative", 4, acc[0]), ("hf_assisted", 4, acc[1]),
                               ("ours_autoregressive", 0, None), ("hf_plain", 0, None)):
            rows.append({"loop": loop, "gamma": gamma, "temperature": t, "new_tokens": 512, "acceptance_rate": a})
        goals[f"T={t}"] = {"speculative_over_hf_assisted": spec, "autoregressive_over_hf_plain": ar,
                           **({"speculative_ceiling_over_hf_assisted": 1.46} if device["device"] == "cpu" else {})}
    return write(path, {"benchmark": "engine", "results": rows, "goals": goals,
                        "settings": {"target": "synthetic pair", "gamma": 4, "repeats": 12},
                        "provenance": {"date": "2026-11-21T12:00:00+00:00", "host": "box", "device": device}})


def test_report_shows_the_engine_benchmark_per_file_and_temperature(tree):
    engine_results(tree / "bench" / "engine-cpu.json", {"device": "cpu", "cpu_threads": 2})
    engine_results(tree / "bench" / "engine-cuda.json", {"device": "cuda", "gpu": "NVIDIA H200"})
    table = load_all(load_runs(tree / "runs"), bench=tree / "bench")
    loops = table[table["kind"] == "loop"].sort_values(["source", "temperature"])
    assert len(loops) == 4 and list(loops["speculative_over_hf"]) == [1.3, 2.04, 1.3, 2.04]
    assert list(loops["cpu_only"]) == [True, True, False, False]
    assert loops["ceiling_over_hf"].isna().tolist() == [False, False, True, True]  # measured on CPU only
    out = tree / "reports"
    assert main(["report", "--runs", str(tree / "runs"), "--bench", str(tree / "bench"), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    section = md[md.index("Decoding loop against Hugging Face"):]
    for text in ("engine-cpu.json", "engine-cuda.json", "NVIDIA H200", "2.04x", "0.98x", "1.46x",
                 "0.438 / 0.446"):
        assert text in section, text
    assert "Decoding loop against Hugging Face" in (out / "report.html").read_text()


def test_table_only_and_empty_runs(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    out = tmp_path / "reports"
    assert main(["report", "--runs", str(tmp_path / "runs"), "--out", str(out), "--table-only"]) == 0
    assert (out / "runs.csv").is_file() and not (out / "report.md").exists()
    assert main(["report", "--runs", str(tmp_path / "runs"), "--tune", str(tmp_path / "none"), "--kernels",
                 str(tmp_path / "none"), "--bench", str(tmp_path / "none"), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "nothing to recommend yet" in md and "No kernel benchmark results" in md
    assert "No engine benchmark results" in md


@pytest.mark.parametrize("args, message", [
    (["--max-quality-loss", "2"], "--max-quality-loss must be a fraction"),
    (["--runs", "/nonexistent/runs"], "is not a folder"),
])
def test_bad_input_is_one_line_and_exit_2(tree, capsys, args, message):
    base = ["report", "--runs", str(tree / "runs"), "--tune", str(tree / "tune"), "--out", str(tree / "r")]
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_unreadable_json_is_an_error(tree, capsys):
    (tree / "bench" / "samplers-broken.json").write_text("{not json")
    assert main(["report", "--runs", str(tree / "runs"), "--bench", str(tree / "bench"), "--out",
                 str(tree / "r")]) == 2
    assert "samplers-broken.json: not readable JSON" in capsys.readouterr().err


def test_a_recommendation_slower_than_the_target_alone_says_so(tmp_path):
    """The toy speech pair on a CPU: its best setting still loses to decoding without a draft; the report says so
    instead of presenting 0.87x as a choice like any other."""
    runs = tmp_path / "runs"
    ar = str(write(runs / "asr-ar.json", result(task="librispeech", gamma=0, speedup=None, score=0.0,
                                                  temperature=0.0)))
    for name, sampler, speedup in (("a", "greedy", 0.87), ("b", "exact", 0.56)):
        r = result(task="librispeech", sampler=sampler, speedup=speedup, score=0.0, temperature=0.0, baseline=ar)
        r["metrics"].update(speedup_ci_low=speedup - 0.1, speedup_ci_high=speedup + 0.05)
        write(runs / f"asr-{name}.json", r)
    ok = result(speedup=1.5, score=0.4)
    ok["metrics"].update(speedup_ci_low=0.9, speedup_ci_high=1.8)   # interval reaching above 1: no note
    write(runs / "text-ok.json", ok)
    rec = recommend(load_runs(runs), 0.01).set_index(["task", "choice"])
    fast = rec.loc[("librispeech", "fastest within 1.0% quality loss")]
    assert fast["run"] == "asr-a" and fast["note"].startswith("slower than the target alone (speedup 0.87x")
    assert rec.loc[("cnn_dailymail", "best lossless"), "note"] == ""
    out = tmp_path / "reports"
    assert main(["report", "--runs", str(runs), "--out", str(out)]) == 0
    md = (out / "report.md").read_text().split("## Recommendation")[1]
    assert "(`asr-a`): slower than the target alone" in md and "(`text-ok`)" not in md


def test_every_acceptance_rule_appears_side_by_side_with_its_parameters_and_losslessness(tmp_path):
    runs = tmp_path / "runs"
    ar = str(write(runs / "ar.json", result(gamma=0, speedup=None, score=0.40)))
    for name, sampler, speedup, score, params in (("e", "exact", 1.4, 0.40, {}), ("g", "greedy", 2.0, 0.39, {}),
                                                   ("s", "sigmoid", 1.8, 0.30, {"alpha": 2.0}),
                                                   ("r", "relaxed", 2.2, 0.40, {})):
        r = result(sampler=sampler, speedup=speedup, score=score, baseline=ar, **params)
        if sampler == "relaxed":  # a rule whose parameters are not alpha/beta, recommended as the fastest
            r["config"]["prob_delta"] = 0.25
        write(runs / f"{name}.json", r)
    out = tmp_path / "reports"
    assert main(["report", "--runs", str(runs), "--out", str(out)]) == 0
    section = (out / "report.md").read_text().split("### Acceptance rules side by side")[1].split("###")[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [line.split("|")[1].strip() for line in lines] == ["relaxed", "greedy", "sigmoid", "exact"]  # fastest first
    by_rule = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in lines}
    assert by_rule["exact"][1] == "yes" and by_rule["greedy"][1] == "no"          # greedy at T = 1 is not lossless
    assert by_rule["sigmoid"][3] == "alpha=2, beta=-20"                          # its own alpha, the default beta
    assert by_rule["sigmoid"][7] == "+25.00 %"                                   # quality loss: 1 - 0.30 / 0.40
    assert by_rule["relaxed"][3] == "top_k=10, prob_delta=0.25"                  # its default top_k, its own delta
    recommendation = (out / "report.md").read_text().split("## Recommendation")[1].split("\n## ")[0]
    assert "| relaxed | torch | 4 | top_k=10, prob_delta=0.25 | float32 |" in recommendation
