"""The DVC pipeline end to end: in a temporary git repository, `dvc repro` of a tiny profile (tiny synthetic
models instead of toy training) produces every declared output, the metrics, W&B offline runs, and an Optuna
study with its Pareto front; a second `dvc repro` does nothing; changing the grid's γ re-runs only the grid (one
process per task and dtype) and the report."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

MAKE_DATA = """import json, pathlib
words = "the storm hit the city police said the plane was a new report water".split()
out = pathlib.Path("data/tiny"); out.mkdir(parents=True, exist_ok=True)
rows = [{"id": f"a{i}", "article": " ".join(words[i:] + words[:i]), "highlights": " ".join(words[i:i + 4])}
        for i in range(3)]
(out / "test.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
"""
MAKE_MODELS = """import pathlib
from pipeline.synthetic import save_pair
save_pair(pathlib.Path("models/tiny/text"))
"""
TINY = {
    "prepare": {"data": {"tiny": {"cmd": "python make_data.py", "out": "data/tiny"}},
                "models": {"text": {"cmd": "python make_models.py", "dep": "data/tiny", "out": "models/tiny/text"}},
                "downloads": {}, "speak": {}, "distill": {}},
    # the measurement flags off (they are tested in test_paired.py and test_measure.py): this test checks the
    # pipeline's plumbing, and a busy machine would otherwise fail the tune trials as contended
    "run": {"device": "cpu", "temperature": 1.0, "seed": 0, "batch_size": 1, "no_progress": True,
            "max_cpu_wait": 1.0, "max_spread": 1000.0},
    "tracking": {"wandb_project": "specsweep-test", "wandb_group": "tiny"},
    "pairs": [{"name": "text", "data_dep": "data/tiny", "model_dep": "models/tiny/text",
               "config": {"task": "cnn_dailymail", "data": "data/tiny/test.jsonl", "target": "models/tiny/text/target",
                          "draft": "models/tiny/text/draft", "limit": 3, "max_new_tokens": 6}}],
    "grids": [{"name": "main", "config": {"sampler": "exact,sigmoid", "backend": "torch", "gamma": "2"}}],
    "dtypes": ["float32"],
    # a run of one pair (dvc.yaml's pair_run stage): the pair's settings and its own
    "pair_runs": {"text-greedy-float32": {"data_dep": "data/tiny", "model_dep": "models/tiny/text",
                                          "config": {"task": "cnn_dailymail", "data": "data/tiny/test.jsonl",
                                                     "target": "models/tiny/text/target",
                                                     "draft": "models/tiny/text/draft", "limit": 3,
                                                     "max_new_tokens": 6, "sampler": "exact", "gamma": 2,
                                                     "temperature": 0, "dtype": "float32"}}},
    # a benchmark stage (dvc.yaml's bench): the pair run's tokens per step compared prompt by prompt (a stage's output
    # folder as one side; with itself, so the queued γ variants below leave it as it is)
    "benchmarks": {"paired": {"cmd": "python -m pipeline.analysis.paired_tokens results/runs/text-greedy-float32 "
                                     "results/runs/text-greedy-float32 --resamples 200 --out results/bench/paired.json",
                              "dep": "results/runs/text-greedy-float32", "dep2": "results/runs/text-greedy-float32",
                              "out": "results/bench/paired.json"}},
    "tune": {"space": "sweeps/optuna_space.yaml", "n_trials": 2, "dtype": "float32", "study_prefix": "tiny"},
}


def _dvc(repo: Path, *args: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"dvc {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("dvcrepo")
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, repo / name)
    (repo / "sweeps").mkdir()
    shutil.copy(REPO / "sweeps" / "optuna_space.yaml", repo / "sweeps")
    (repo / "make_data.py").write_text(MAKE_DATA)
    (repo / "make_models.py").write_text(MAKE_MODELS)
    (repo / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env.pop("OPTUNA_STORAGE", None)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _dvc(repo, "init", "-q", env=env)
    _dvc(repo, "repro", env=env)
    return repo, env


@pytest.mark.slow
def test_dvc_repro_produces_every_declared_output(repo):
    repo, _ = repo
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    expected = {"data@tiny", "models@text", "baseline@pair0-float32", "run@pair0-grid0-float32",
                "pair_run@text-greedy-float32", "bench@paired", "tune@0", "report"}
    assert set(lock) == expected
    for stage in lock.values():
        for out in stage.get("outs", []):
            assert (repo / out["path"]).exists(), out["path"]
    for name in ("text-ar-float32", "text-main-float32/text-exact-torch-g2-float32",
                 "text-main-float32/text-sigmoid-torch-g2-float32",
                 "text-greedy-float32/text-greedy-float32-exact-torch-g2"):
        result = json.loads((repo / "results" / "runs" / f"{name}.json").read_text())
        assert result["samples"] and result["config"]["wandb_group"] == "tiny"
    sd = json.loads((repo / "results/runs/text-main-float32/text-sigmoid-torch-g2-float32.json").read_text())
    assert sd["config"]["gamma"] == 2 and sd["config"]["sampler"] == "sigmoid" and sd["metrics"]["speedup"] > 0
    # the pair run: its own settings, no --baseline (greedy agreement against its own γ = 0 loop)
    own = json.loads((repo / "results/runs/text-greedy-float32/text-greedy-float32-exact-torch-g2.json").read_text())
    assert own["config"]["temperature"] == 0 and own["config"]["baseline"] is None
    # the benchmark stage read both runs (a folder of one file, and one file) and compared them prompt by prompt
    paired = json.loads((repo / "results/bench/paired.json").read_text())
    assert paired["prompts"] == 3 and paired["mean_difference"] == 0 and paired["sides"]["a"]["files"]
    agreement = own["metrics"]["greedy_agreement"]
    assert agreement["samples"] >= 1 and agreement["identical"] == agreement["samples"]
    # params.yaml -> RunConfig: the same settings, by the same names, as the run recorded
    from pipeline.config import RunConfig

    p = TINY
    cfg = RunConfig.from_dict({**{k: v for k, v in p["run"].items() if k != "no_progress"}, **p["tracking"],
                               **p["pairs"][0]["config"], "sampler": "sigmoid", "backend": "torch", "gamma": 2,
                               "dtype": "float32", "baseline": "results/runs/text-ar-float32.json",
                               "out": "results/runs/text-main-float32/text-sigmoid-torch-g2-float32.json"})
    assert cfg.to_dict() == sd["config"]


@pytest.mark.slow
def test_quality_wandb_runs_study_and_report(repo):
    repo, env = repo
    metrics = json.loads(_dvc(repo, "metrics", "show", "--json", env=env))
    files = next(iter(metrics.values()))["data"]
    baseline_metrics = files["results/runs/text-ar-float32.json"]["data"]["metrics"]
    assert baseline_metrics["tokens_per_second"] > 0 and baseline_metrics["new_tokens"] > 0
    assert files["results/tune/text-pareto.json"]["data"]["n_complete"] == 2
    runs = sorted((repo / "wandb").glob("offline-run-*"))
    assert len(runs) == 5  # the baseline, 2 runs of one grid process, the pair run, 1 tune worker: all offline
    assert all(list(r.glob("run-*.wandb")) for r in runs)
    front = json.loads((repo / "results/tune/text-pareto.json").read_text())
    assert front["study"] == "tiny-text" and front["best_trials"]
    assert (repo / "results/tune/text/study.db").is_file()
    import pandas as pd

    table = pd.read_csv(repo / "reports/runs.csv")
    assert sorted(table["run"]) == ["text-ar-float32", "text-exact-torch-g2-float32",
                                    "text-greedy-float32-exact-torch-g2", "text-sigmoid-torch-g2-float32"]
    assert "## cnn_dailymail" in (repo / "reports/summary.md").read_text()


@pytest.mark.slow
def test_second_repro_does_nothing_and_a_new_gamma_reruns_only_its_stages(repo):
    repo, env = repo
    assert "Data and pipelines are up to date." in _dvc(repo, "repro", env=env)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["grids"][0]["config"]["gamma"] = "2,3"
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    dry = _dvc(repo, "repro", "--dry", env=env)
    would_run = {line.split("'")[1] for line in dry.splitlines() if line.startswith("Running stage")}
    # the report follows once results/runs changes; nothing else (data, models, baseline, tune) re-runs
    assert would_run - {"report"} == {"run@pair0-grid0-float32"}


@pytest.mark.slow
def test_queued_profile_variants_run_side_by_side_in_dvc_queue_workers(repo):
    """`dvc exp run --queue` + `dvc queue start -j 2`: two variants of the profile (two γ of the run grid) run by a
    queue of two CPU workers, each to a successful experiment with its own settings (docs/pipeline.md: GPUs are
    divided among workers with CUDA_VISIBLE_DEVICES)."""
    import time

    repo, env = repo
    (repo / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))   # the earlier test edited it
    for cmd in (["git", "add", "-A"], ["git", "commit", "-qm", "the pipeline's state"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True)
    for gamma in (3, 4):
        _dvc(repo, "exp", "run", "--queue", "-S", f"grids.0.config.gamma={gamma}", "--name", f"gamma{gamma}", env=env)
    _dvc(repo, "queue", "start", "-j", "2", env=env)
    deadline, status = time.monotonic() + 400, ""
    try:
        while time.monotonic() < deadline:
            status = _dvc(repo, "queue", "status", env=env)
            if "Queued" not in status and "Running" not in status:
                break
            time.sleep(2)
    finally:
        subprocess.run([sys.executable, "-m", "dvc", "queue", "stop"], cwd=repo, env=env, capture_output=True)
    done = {line.split()[1]: line.split()[-1] for line in status.splitlines() if line.split()[1:2] in
            (["gamma3"], ["gamma4"])}
    assert done == {"gamma3": "Success", "gamma4": "Success"}, status
    shown = json.loads(_dvc(repo, "exp", "show", "--json", env=env))
    runs = {}
    for commit in shown:
        for exp in commit.get("experiments") or []:
            for rev in exp.get("revs", []):
                params = rev.get("data", {}).get("params", {}).get("params.yaml", {}).get("data", {})
                runs[exp.get("name")] = params["grids"][0]["config"]["gamma"]
    assert runs == {"gamma3": 3, "gamma4": 4}, runs     # each experiment ran the profile with its own γ


@pytest.mark.parametrize("profile, stages", [
    ("params.yaml", ["data@toy", "models@toy", "baseline@pair0-float32", "tune@0", "report"]),
    ("params.paper.yaml", ["downloads@", "report"]),
    ("params.real.yaml", ["data@cnn_dailymail", "data@librispeech", "downloads@qwen", "downloads@smollm2",
                          "downloads@whisper", "baseline@pair0-bfloat16", "run@pair2-grid0-bfloat16",
                          "pair_run@qwen-model-bfloat16", "pair_run@qwen-model-float32", "pair_run@qwen-hf-bfloat16",
                          "pair_run@qwen-sampling-bfloat16", "pair_run@whisper-base-model-bfloat16", "tune@2",
                          "report"]),
    ("params.pair.yaml", ["data@cnn_dailymail", "downloads@qwen", "baseline@pair0-bfloat16", "run@pair0-grid4-bfloat16",
                          "pair_run@qwen-hf-float32", "bench@forward", "bench@replay", "tune@0", "report"]),
    ("params.spec-bench.yaml", ["data@spec_bench", "downloads@qwen", "baseline@pair1-bfloat16",
                                "run@pair1-grid2-bfloat16", "tune@1", "report"]),
    ("params.sigmoid.yaml", ["data@cnn_dailymail", "downloads@qwen", "run@pair0-grid0-bfloat16", "bench@distortion",
                             "tune@0", "report"]),
    ("params.trees.yaml", ["data@toy", "models@text", "pair_run@suffix-tree-t0", "bench@suffix-t0", "report"]),
    ("params.distill.yaml", ["data@cnn_dailymail", "data@librispeech", "data@cnn_dailymail_pool", "downloads@smollm2",
                             "downloads@whisper-base", "speak@speech_synth", "distill@smollm2", "distill@whisper-base",
                             "baseline@pair1-float32", "run@pair1-grid2-float32", "tune@1", "report"]),
])
def test_every_profile_resolves_with_the_shared_dvc_yaml(tmp_path, profile, stages):
    """`dvc stage list` of dvc.yaml with each profile as its params.yaml (as `make profile` lays them out):
    every stage resolves, and the stages each profile needs are there."""
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copy(REPO / profile, tmp_path / "params.yaml")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    _dvc(tmp_path, "init", "--no-scm", "-q", env=env)
    listed = [line.split()[0] for line in _dvc(tmp_path, "stage", "list", env=env).splitlines() if line.strip()]
    for stage in stages:
        assert any(name.startswith(stage) for name in listed), (stage, listed)
    params = yaml.safe_load((REPO / profile).read_text())   # each pair runs each grid in each dtype
    assert sum(name.startswith("run@") for name in listed) == (len(params["pairs"]) * len(params["grids"])
                                                               * len(params["dtypes"]))
    assert sum(name.startswith("pair_run@") for name in listed) == len(params["pair_runs"])
    assert sum(name.startswith("bench@") for name in listed) == len(params["benchmarks"])


def test_every_profile_is_one_the_makefile_runs_and_names_what_it_answers():
    """Each params.<name>.yaml is a profile `make profile PROFILE=<name>` runs; its first line says which profile it is,
    and the Makefile itself holds no experiment (no `specsweep run`, no benchmark command)."""
    makefile = (REPO / "Makefile").read_text()
    assert "specsweep run" not in makefile and "pipeline.benchmarks" not in makefile
    assert len(makefile.splitlines()) < 100
    for path in sorted(REPO.glob("params.*.yaml")):
        name = path.name[len("params."):-len(".yaml")]
        first = path.read_text().splitlines()[0]
        assert first.startswith("#") and name in first, (path.name, first)
        assert "benchmarks" in yaml.safe_load(path.read_text()), path.name


def _stage_settings(params: dict) -> list[tuple[str, dict]]:
    """(stage, settings) of every `specsweep run` a profile's baseline, run and pair_run stages make, merged as
    dvc.yaml orders the flags (argparse: the later flag wins)."""
    shared = {**params["run"], **params["tracking"]}
    out = {"out": "x-{sampler}-{backend}-g{gamma}-{dtype}-{drafter}-{draft_tree}-{draft_vocab}-{draft_quant}.json"}
    stages = []
    for pair in params["pairs"]:
        for dtype in params["dtypes"]:
            stages.append((f"baseline@{pair['name']}-{dtype}", {**shared, **pair["config"], "dtype": dtype,
                                                                 "gamma": 0, "sampler": "exact", **out}))
            stages += [(f"run@{pair['name']}-{grid['name']}-{dtype}",
                        {**shared, **pair["config"], **grid["config"], "dtype": dtype, **out})
                       for grid in params["grids"]]
    stages += [(f"pair_run@{key}", {**shared, **item["config"], **out})
               for key, item in (params.get("pair_runs") or {}).items()]
    return stages


@pytest.mark.parametrize("profile", sorted(p.name for p in REPO.glob("params*.yaml")))
def test_every_run_a_profile_makes_has_valid_settings(profile):
    """Each point of each `specsweep run` a profile's stages make passes RunConfig's decoding checks, so a profile
    never fails at its first run after hours of downloads (a --draft-quant on the γ = 0 baseline did)."""
    from pipeline.commands.run import DISPLAY_FLAGS, expand_grid
    from pipeline.config import RunConfig

    params = yaml.safe_load((REPO / profile).read_text())
    # a flag left out is its default, as argparse gives it
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}
    checked = 0
    for stage, settings in _stage_settings(params):
        for point in expand_grid({**defaults, **{k: v for k, v in settings.items() if k not in DISPLAY_FLAGS}}):
            try:
                RunConfig.from_dict(point).validate_decoding()
            except Exception as e:
                pytest.fail(f"{profile} {stage}: {e}")
            checked += 1
    assert checked >= len(params["pairs"]) * len(params["dtypes"]) + len(params.get("pair_runs") or {})


class _Parsed(Exception):
    """Raised in place of running a command once its flags have parsed."""


@pytest.mark.parametrize("profile", sorted(p.name for p in REPO.glob("params*.yaml")))
def test_every_benchmark_command_of_a_profile_parses(profile, monkeypatch):
    """Each command of a profile's bench stages (`python -m MODULE ...` or `specsweep ...`, joined by &&) takes its
    flags: argparse is stopped right after parsing, so a mistyped flag fails here, not after a profile's hours of
    runs."""
    import argparse
    import importlib
    import shlex

    from pipeline.cli import build_parser

    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    params = yaml.safe_load((REPO / profile).read_text())
    for name, bench in (params.get("benchmarks") or {}).items():
        for part in bench["cmd"].split("&&"):
            words = shlex.split(part)
            if words[:2] == ["python", "-m"]:
                run = importlib.import_module(words[2]).main
            else:
                assert words[0] == "specsweep", (profile, name, part)
                run = build_parser().parse_args
            with pytest.raises(_Parsed):
                run(words[3:] if words[0] == "python" else words[1:])
