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
           target="t", draft="d", mode="shared", cross=None, chars=(None, None)):
    """A results dict with every field the report reads, shaped as pipeline.runner.run writes it. ``mode``: the
    resolved draft-tokenizer mode (None: a file from before drafts could have another tokenizer, without the key);
    ``cross``: metrics.cross_tokenizer; ``chars``: (acceptance in characters, characters per verify step)."""
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
        "resolved": {"device": device, "samples": 8, "baseline": baseline,
                     **({"draft_tokenizer_mode": mode} if mode else {})},
        "provenance": {"date": "2026-11-21T10:00:00+00:00", "host": "box", "versions": {"torch": "2.13.0"},
                       "device": prov_device},
        "metrics": {"tokens_per_second": 100.0 * (speedup or 1.0), "wall_time_s": 1.0, "new_tokens": 100,
                    "acceptance_rate": acceptance if gamma else None,
                    "mean_accepted_tokens": expected_tokens_iid(acceptance, gamma) if gamma else None,
                    "cost_ratio": 0.1 if gamma else None, "theoretical_speedup": speedup * 1.1 if gamma else 1.0,
                    "peak_memory_mb": 10.0, "accepted_histogram": hist,
                    "position_acceptance": position_acceptance(hist),
                    **({"acceptance_rate_chars": chars[0] if gamma else None,
                        "chars_per_step": chars[1] if gamma else None, "cross_tokenizer": cross} if mode else {}),
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
             "dtype": optuna.distributions.CategoricalDistribution(["float32", "bfloat16"]),
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


def kernel_results(path: Path, gpu: str = "NVIDIA H100 80GB HBM3") -> Path:
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
                                       "device": {"device": "cuda", "gpu": gpu}}})


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


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_report_writes_every_figure_and_the_html_references_only_files_that_exist(tree, capsys, gpus):
    """With kernel results from two GPUs (the same shapes on each), each implementation's time relative to HF's is
    taken within one file: one GPU, one process."""
    kernels = tree / "kernels"
    with_kernels = gpus > 0
    for name, gpu in (("h100", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200"))[:gpus]:
        kernel_results(kernels / f"{name}.json", gpu)
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
    assert len(full) == 18 + gpus * (3 * 2 * 5 + 2)  # kernels: B x V x impls, + hf at B = 1, per GPU
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


def test_a_report_of_the_runs_named_reads_nothing_else_from_the_working_directory(tree, monkeypatch):
    """After `make`, the working directory holds the pipeline's studies and benchmarks (results/tune, results/bench,
    kernels/results): `specsweep report --runs DIR` must not add them; named, they are read."""
    import shutil

    import pandas as pd

    checkout = tree / "checkout"
    shutil.copytree(tree / "tune", checkout / "results" / "tune")
    shutil.copytree(tree / "bench", checkout / "results" / "bench")
    kernel_results(checkout / "kernels" / "results" / "h100.json")
    monkeypatch.chdir(checkout)
    assert main(["report", "--runs", str(tree / "runs"), "--out", str(tree / "only-runs")]) == 0
    assert set(pd.read_csv(tree / "only-runs" / "results.csv")["kind"]) == {"run", "baseline"}
    assert main(["report", "--runs", str(tree / "runs"), "--tune", "results/tune", "--kernels", "kernels/results",
                 "--bench", "results/bench", "--out", str(tree / "named")]) == 0
    assert {"trial", "latency"} <= set(pd.read_csv(tree / "named" / "results.csv")["kind"])


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
    ok["metrics"].update(speedup_ci_low=1.1, speedup_ci_high=1.8)   # interval above 1: no note
    write(runs / "text-ok.json", ok)
    unsure = result(speedup=1.3, score=0.4, task="other")
    unsure["metrics"].update(speedup_ci_low=0.87, speedup_ci_high=2.01)   # faster at the median, interval below 1
    write(runs / "other-unsure.json", unsure)
    rec = recommend(load_runs(runs), 0.01).set_index(["task", "choice"])
    fast = rec.loc[("librispeech", "fastest within 1.0% quality loss")]
    assert fast["run"] == "asr-a" and fast["note"].startswith("slower than the target alone (speedup 0.87x")
    assert rec.loc[("cnn_dailymail", "best lossless"), "note"] == ""
    assert rec.loc[("other", "best lossless"), "note"].startswith(
        "not shown faster than the target alone (speedup 1.30x, but its interval [0.87, 2.01] reaches below 1x)")
    out = tmp_path / "reports"
    assert main(["report", "--runs", str(runs), "--out", str(out)]) == 0
    md = (out / "report.md").read_text().split("## Recommendation")[1]
    assert "(`asr-a`): slower than the target alone" in md and "(`text-ok`)" not in md
    assert "(`other-unsure`): not shown faster" in md


def test_a_slow_draft_of_a_target_points_to_the_faster_drafter_of_the_same_target(tmp_path):
    """SmolLM2's distilled draft ran slower than the target alone while prompt lookup on the same target was
    faster: the note names prompt lookup rather than advising to decode with the target alone."""
    runs = tmp_path / "runs"
    ar = str(write(runs / "ar.json", result(gamma=0, speedup=None, score=0.40, temperature=0.0)))
    slow = result(speedup=0.63, score=0.40, temperature=0.0, baseline=ar, sampler="greedy")
    slow["metrics"].update(speedup_ci_low=0.62, speedup_ci_high=0.64)
    write(runs / "distilled.json", slow)
    lookup = result(speedup=1.23, score=0.40, temperature=0.0, baseline=ar, sampler="greedy")
    lookup["config"].update(drafter="prompt-lookup", draft=None)
    lookup["metrics"].update(speedup_ci_low=1.22, speedup_ci_high=1.25)
    write(runs / "lookup.json", lookup)
    rec = recommend(load_runs(runs), 0.01)
    notes = dict(zip(rec["run"], rec["note"]))
    assert notes["distilled"].startswith("slower than the target alone (speedup 0.63x")
    assert "on this target, prompt-lookup is faster (1.23x [1.22, 1.25], run lookup)" in notes["distilled"]
    assert notes["lookup"] == ""
    lookup["metrics"].update(speedup_ci_low=0.95)                     # not shown faster: no pointer to it
    write(runs / "lookup.json", lookup)
    notes = dict(zip(*(lambda r: (r["run"], r["note"]))(recommend(load_runs(runs), 0.01))))
    assert notes["distilled"].endswith("decode with the target alone")


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


# ---------------------------------------------------------------------------------------------- drafts with another
# tokenizer (pipeline/decoding/drafters/cross_tokenizer.py): the runs table's columns and the report's section

BRIDGE = {"intersection_size": 412, "target_vocab": 1003, "draft_vocab": 2000, "target_share_in_intersection": 0.41,
          "draft_tokens_per_target_token_max": 3}


def cross(mode, mass=None):
    """metrics.cross_tokenizer as the runner writes it: the bridge's summary, and in intersection mode the masses."""
    out = {"mode": mode, **BRIDGE}
    if mode == "intersection":
        out.update(target_mass_sum=64.0, target_positions=100, draft_mass_sum=40.0, draft_positions=80,
                   target_mass_on_intersection=mass, draft_mass_on_intersection=0.5)
    return out


def interval(r: dict, low: float, high: float) -> dict:
    r["metrics"].update(speedup_ci_low=low, speedup_ci_high=high)
    return r


@pytest.fixture
def cross_tree(tmp_path):
    """One target, two drafts: d (the target's tokenizer) and d-bpe (another: intersection and string modes), an AR
    baseline measured with d only, a flagged d-bpe run, a second d-bpe run at a setting it already has (slower), and
    a run from a results file older than draft tokenizer modes."""
    runs = tmp_path / "runs"
    b = str(write(runs / "text-ar-float32.json", result(gamma=0, speedup=None, score=0.40)))
    bpe = {"draft": "d-bpe", "baseline": b}
    for name, r, ci in (
        ("d-exact-g2", result(gamma=2, speedup=1.4, score=0.40, chars=(0.83, 4.0), baseline=b), (1.3, 1.5)),
        ("d-exact-g4", result(gamma=4, speedup=1.7, score=0.401, chars=(0.81, 5.2), baseline=b), (1.6, 1.8)),
        ("d-greedy-g4", result(sampler="greedy", gamma=4, speedup=2.0, score=0.40, temperature=0.0,
                               chars=(0.9, 6.0), baseline=b), (1.9, 2.1)),
        ("bpe-exact-g2", result(gamma=2, speedup=1.15, score=0.399, acceptance=0.55, mode="intersection",
                                cross=cross("intersection", 0.66), chars=(0.5, 2.4), **bpe), (1.05, 1.25)),
        ("bpe-exact-g4", result(gamma=4, speedup=1.3, score=0.40, acceptance=0.5, mode="intersection",
                                cross=cross("intersection", 0.64), chars=(0.52, 3.1), **bpe), (1.2, 1.4)),
        ("bpe-exact-g4-b4", result(gamma=4, speedup=1.1, score=0.40, acceptance=0.5, mode="intersection",
                                   cross=cross("intersection", 0.64), chars=(0.52, 3.0), **bpe), (1.0, 1.2)),
        ("bpe-greedy-g4", result(sampler="greedy", gamma=4, speedup=1.2, score=0.40, acceptance=0.45,
                                 temperature=0.0, mode="string", cross=cross("string"), chars=(0.6, 3.5), **bpe),
         (1.1, 1.3)),
        ("bpe-sigmoid-g4", result(sampler="sigmoid", gamma=4, speedup=9.0, score=0.40, mode="intersection",
                                  cross=cross("intersection", 0.6), chars=(0.5, 3.0), **bpe), (8.9, 9.1)),
    ):
        write(runs / f"{name}.json", interval(r, *ci))
    flagged_run = json.loads((runs / "bpe-sigmoid-g4.json").read_text())
    flagged_run["metrics"]["flagged"] = True
    write(runs / "bpe-sigmoid-g4.json", flagged_run)
    batch4 = json.loads((runs / "bpe-exact-g4-b4.json").read_text())
    batch4["config"]["batch_size"] = 4
    write(runs / "bpe-exact-g4-b4.json", batch4)
    write(runs / "old.json", interval(result(gamma=4, speedup=1.6, score=0.40, mode=None, baseline=b), 1.5, 1.7))
    return tmp_path


def test_runs_table_has_the_draft_tokenizer_columns(cross_tree):
    from pipeline.results_table import CROSS_TOKENIZER_COLUMNS

    runs = load_runs(cross_tree / "runs").set_index("run")
    for col in ("draft_tokenizer_mode", "acceptance_rate_chars", "chars_per_step", *CROSS_TOKENIZER_COLUMNS):
        assert col in runs.columns, col
    assert runs.loc["old", "draft_tokenizer_mode"] == "shared"            # an older results file: one tokenizer
    assert runs.loc["text-ar-float32", "draft_tokenizer_mode"] == "shared"
    assert runs.loc["bpe-greedy-g4", "draft_tokenizer_mode"] == "string"
    bpe = runs.loc["bpe-exact-g4"]
    assert (bpe["draft_tokenizer_mode"], bpe["intersection_size"], bpe["target_share_in_intersection"],
            bpe["target_mass_on_intersection"], bpe["acceptance_rate_chars"], bpe["chars_per_step"]) == \
        ("intersection", 412, 0.41, 0.64, 0.52, 3.1)
    matched = runs.loc["d-exact-g4"]
    assert matched["acceptance_rate_chars"] == 0.81 and matched["chars_per_step"] == 5.2
    for col in CROSS_TOKENIZER_COLUMNS:   # None where the run has one tokenizer, and in string mode the mass
        assert runs[col].isna()[["d-exact-g4", "old", "text-ar-float32"]].all(), col
    assert pd_isna(runs.loc["bpe-greedy-g4", "target_mass_on_intersection"])
    assert runs.loc["bpe-greedy-g4", "intersection_size"] == 412


def pd_isna(v) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


def table_rows(md: str, after: str) -> list[list[str]]:
    """The cells of the first Markdown table after the text ``after`` (header first)."""
    lines = md.split(after, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if "---" not in line:
            rows.append([c.strip() for c in line.split("|")[1:-1]])
    return rows


def test_report_compares_drafts_with_another_tokenizer(cross_tree, capsys):
    from pipeline.analysis import tokenizers_view
    from pipeline.analysis.tables import load_all

    out = cross_tree / "reports"
    assert main(["report", "--runs", str(cross_tree / "runs"), "--out", str(out)]) == 0
    capsys.readouterr()
    md = (out / "report.md").read_text()
    section = md.split("## Drafts with another tokenizer")[1].split("\n## ")[0]
    rows = table_rows(section, "### cnn_dailymail: t")
    assert rows[0] == ["draft", "draft tokenizer", "rule", "γ", "T", "speedup [interval]", "acceptance (tokens)",
                       "acceptance (chars)", "chars/step", "shared tokens", "target vocab in them",
                       "target mass on them", "run"]
    # one row per (draft, mode, rule, γ, T), the target's own tokenizer first: the fastest run of each (the old file
    # and the batch-4 run are slower runs of a setting already there); the flagged sigmoid run is left out
    assert [(r[0], r[1], r[2], r[3], r[4], r[-1]) for r in rows[1:]] == [
        ("d", "shared", "exact", "2", "1", "d-exact-g2"), ("d", "shared", "exact", "4", "1", "d-exact-g4"),
        ("d", "shared", "greedy", "4", "0", "d-greedy-g4"),
        ("d-bpe", "intersection", "exact", "2", "1", "bpe-exact-g2"),
        ("d-bpe", "intersection", "exact", "4", "1", "bpe-exact-g4"),
        ("d-bpe", "string", "greedy", "4", "0", "bpe-greedy-g4")]
    by_run = {r[-1]: r for r in rows[1:]}
    assert by_run["bpe-exact-g4"][5:12] == ["1.30x [1.20, 1.40]", "0.50", "0.52", "3.10", "412", "41 %", "64 %"]
    assert by_run["d-exact-g4"][5:12] == ["1.70x [1.60, 1.80]", "0.70", "0.81", "5.20", "–", "–", "–"]
    assert by_run["bpe-greedy-g4"][9:12] == ["412", "41 %", "–"]
    assert "1 flagged measurement(s)" in section
    # the sentences: the numbers of the table's rows, compared at the same setting
    assert ("At exact γ 4, T = 1, `d-bpe` (intersection) reaches 1.30x [1.20, 1.40] against 1.70x [1.60, 1.80] for "
            "`d`, which shares the target's tokenizer (the intervals do not overlap); its acceptance in characters "
            "is 0.52 against 0.81 and it emits 3.10 characters per verify step against 5.20.") in section
    assert ("The 412 shared tokens are 41 % of the target's vocabulary and carry 64 % of the target's probability "
            "where it scored, which bounds the token acceptance: measured 0.50.") in section
    assert ("Best against best: 1.30x [1.20, 1.40] (exact γ 4, T = 1) against 2.00x [1.90, 2.10] for `d` (greedy γ "
            "4, T = 0).") in section
    assert ("At greedy γ 4, T = 0, `d-bpe` (string) reaches 1.20x [1.10, 1.30] against 2.00x [1.90, 2.10]"
            in section)
    assert (out / "figures" / "tokenizers-cnn-dailymail-t.png").read_bytes().startswith(PNG)
    assert "figures/tokenizers-cnn-dailymail-t.png" in (out / "report.html").read_text()

    # the two drafts are two pairs: the mismatched one's tables name each run's mode, the matched one's do not
    mismatched = md.split("## cnn_dailymail: t ← d-bpe")[1].split("\n## ")[0]
    matched = md.split("## cnn_dailymail: t ← d\n")[1].split("\n## ")[0]
    assert "draft tokenizer" in table_rows(mismatched, "### Acceptance rules side by side")[0]
    assert "draft tokenizer" not in table_rows(matched, "### Acceptance rules side by side")[0]
    assert "draft tokenizer" not in matched
    # and both are recommended, the mismatched one against the AR baseline measured with the other draft
    table = load_all(load_runs(cross_tree / "runs"))
    rec = recommend(table, 0.01).set_index(["draft", "temperature", "choice"])
    lossless = rec.loc[("d-bpe", 1.0, "best lossless")]
    assert lossless["run"] == "bpe-exact-g4" and lossless["reference_source"].startswith("AR baseline")
    # each temperature has its own recommendation: greedy at T = 0 is lossless there, and never ranked against the
    # runs at T = 1 (nor scored against their AR baseline: T = 0 has none, so nothing has a known loss there)
    assert rec.loc[("d", 0.0, "best lossless"), "run"] == "d-greedy-g4"
    assert rec.loc[("d", 1.0, "best lossless"), "run"] == "d-exact-g4"
    assert pd_isna(rec.loc[("d", 0.0, "fastest within 1.0% quality loss"), "run"])
    assert rec.loc[("d", 0.0, "fastest within 1.0% quality loss"), "note"] == (
        "no AR baseline or exact run at this temperature to measure a loss against")
    recommendation = md.split("## Recommendation")[1].split("\n## ")[0]
    assert "| exact | torch | 4 | draft tokenizer intersection | float32 | 1.30x [1.20, 1.40] |" in recommendation

    blocks = tokenizers_view.section(table)   # without a figure folder: no figure, the same table
    assert [type(b).__name__ for b in blocks].count("Table") == 1 and "Figure" not in map(lambda b: type(b).__name__,
                                                                                            blocks)


def test_a_pair_decoded_at_two_temperatures_has_a_front_per_temperature(cross_tree, capsys):
    """d ran greedy at T = 0 and exact at T = 1: one figure and front each, never a greedy point on the sampled
    runs' front (or the reverse), and the rules table names each run's T, the greedy run (T = 0) first."""
    out = cross_tree / "reports"
    assert main(["report", "--runs", str(cross_tree / "runs"), "--out", str(out)]) == 0
    capsys.readouterr()
    section = (out / "report.md").read_text().split("## cnn_dailymail: t ← d\n")[1].split("\n## ")[0]
    greedy = section.split("### Quality against speedup, T = 0")[1].split("\n### ")[0]
    sampled = section.split("### Quality against speedup, T = 1")[1].split("\n### ")[0]
    assert [r[0] for r in table_rows(greedy, "Pareto front")[1:]] == ["d-greedy-g4"]
    assert "1 of 1 runs" in greedy and "no AR" not in greedy
    assert [r[0] for r in table_rows(sampled, "Pareto front")[1:]] == ["d-exact-g4"]
    assert "1 of 3 runs" in sampled             # d-exact-g2, d-exact-g4 and old: the T = 1 runs only
    for t in ("t0", "t1"):
        assert (out / "figures" / f"quality-cnn-dailymail-t-d-{t}.png").read_bytes().startswith(PNG)
    assert not (out / "figures" / "quality-cnn-dailymail-t-d.png").exists()
    rules = table_rows(section, "### Acceptance rules side by side")
    assert rules[0][:4] == ["rule", "lossless", "T", "gamma"]
    assert [(r[2], r[-1]) for r in rules[1:]] == [("0", "d-greedy-g4"), ("1", "d-exact-g4"), ("1", "old"),
                                                   ("1", "d-exact-g2")]
    # the greedy run has no reference at T = 0 (the AR baseline sampled at T = 1): its loss is unknown, not 0
    assert rules[1][-3] == "–"


def test_no_section_without_a_draft_of_another_tokenizer(tree, capsys):
    from pipeline.analysis import tokenizers_view
    from pipeline.analysis.tables import load_all

    assert tokenizers_view.section(load_all(load_runs(tree / "runs"), tune=tree / "tune")) == []
    out = tree / "reports"
    assert main(["report", "--runs", str(tree / "runs"), "--tune", str(tree / "tune"), "--out", str(out)]) == 0
    capsys.readouterr()
    md = (out / "report.md").read_text()
    assert "Drafts with another tokenizer" not in md and "draft tokenizer" not in md
    assert not list((out / "figures").glob("tokenizers-*.png"))


def test_the_profiles_missing_list_is_the_reports_section_and_a_bad_one_is_one_line(tree, tmp_path, capsys):
    profile = tmp_path / "params.yaml"
    profile.write_text("pairs: []\nmissing:\n  - what: A pair with a draft\n    why: >-\n      no draft yet\n")
    out = tmp_path / "reports"
    args = ["report", "--runs", str(tree / "runs"), "--tune", str(tree / "tune"), "--out", str(out)]
    assert main([*args, "--profile", str(profile)]) == 0
    md = (out / "report.md").read_text()
    assert "## What this profile does not run yet" in md and "**A pair with a draft**: no draft yet" in md
    assert md.index("does not run yet") < md.index("Recommend")      # stated before the recommendation
    assert main(args) == 0 and "does not run yet" not in (out / "report.md").read_text()
    capsys.readouterr()
    profile.write_text("missing:\n  - nothing here\n")
    assert main([*args, "--profile", str(profile)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "`missing:` must be a list of {what, why} entries" in err


def test_a_pair_without_a_sigmoid_run_has_no_sigmoid_section(tmp_path, capsys):
    runs = tmp_path / "runs"
    write(runs / "a.json", result(sampler="exact", gamma=4, speedup=1.3, score=0.5))
    assert main(["report", "--runs", str(runs), "--tune", str(tmp_path / "none"), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Acceptance against theory" in md and "Sigmoid: alpha/beta landscape" not in md


def test_latency_figure_draws_a_line_per_implementation_and_gpu(tmp_path, monkeypatch):
    """Kernel files from two GPUs measure the same shapes: the B and V panels draw each implementation once per GPU
    (a line through both would zigzag between them), named by its GPU; with one GPU the names stay plain."""
    from analysis import figures
    from analysis.tables import load_latency

    drawn = {}
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.setdefault(Path(path).name, fig) and path)
    for name, gpu in (("h100", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200")):
        kernel_results(tmp_path / "two" / f"{name}.json", gpu)
    kernel_results(tmp_path / "one" / "h100.json")
    for folder in ("two", "one"):
        figures.latency(load_latency(tmp_path / folder, "kernels"), "kernels", tmp_path / f"{folder}.png")
    def labels(fig) -> list[str]:
        return [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("floor")]

    by_b = labels(drawn["two.png"])
    one = labels(drawn["one.png"])
    assert "exact (cupy)" in one and "flashinfer+softmax" in one and not any("NVIDIA" in name for name in one), one
    assert sorted(by_b) == sorted(f"{impl} ({gpu})" for impl in one
                                  for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200")), by_b
    for line in drawn["two.png"].axes[0].get_lines():
        assert len(set(line.get_xdata())) == len(line.get_xdata())          # each B once on a line
