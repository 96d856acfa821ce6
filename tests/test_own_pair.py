"""README's "Your own pair": its two bash blocks run as written, on a tiny synthetic pair and small JSONL files, and
`specsweep init`'s one-line errors.

The blocks run in a temporary copy of what `make profile` reads (Makefile, dvc.yaml, .dvcignore, sweeps/,
pyproject.toml, constraints.txt), so nothing is written into the repository. Its `.venv/` links every entry of the
venv running the tests except `.installed`, which is made afresh after pyproject.toml and constraints.txt: the
Makefile's `setup` prerequisite is then up to date and never reinstalls (into the real venv or anywhere). The
README's placeholders become the tiny pair's folders (pipeline.synthetic.save_pair, as tests/test_pipeline_dvc.py),
a JSONL file and its task: the profile block with `cnn_dailymail` articles (a task with a quality metric: the
target alone, both drafters and the Optuna study), the one-off block with `prompts`.

One step is not in the README: between `specsweep init` and `make profile` the test shrinks the profile (3 prompts,
6 new tokens, 2 Optuna trials) and relaxes the speed measurement's plausibility checks (max_cpu_wait 1,
max_spread 1000: a busy test machine would otherwise fail the study's trials as contended), as a user edits it.
The two blocks run side by side (each is a chain of processes whose start-up dominates)."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
PLACEHOLDERS = ("TARGET", "DRAFT", "DATA", "TASK")
WORDS = "the storm hit the city police said the plane was a new report water".split()
CHECKOUT = ("Makefile", "dvc.yaml", ".dvcignore", "pyproject.toml", "constraints.txt")


# ------------------------------------------------------------------------------------------------ README

def readme_blocks(text: str) -> list[str]:
    """The bash blocks of README's section headed "Your own pair" (any case), in order."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.fullmatch(r"#{1,6}\s+your own pair\s*", line, re.I)), None)
    assert start is not None, "README.md has no section headed 'Your own pair'"
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    end = next((i for i in range(start + 1, len(lines))
                if re.match(rf"#{{1,{level}}}\s", lines[i])), len(lines))
    blocks = re.findall(r"^```bash\n(.*?)^```", "\n".join(lines[start:end]) + "\n", re.M | re.S)
    return blocks


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, blank and comment-only lines left out."""
    joined = re.sub(r"\\\n", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def substitute(command: str, values: dict[str, str]) -> str:
    return re.sub(rf"\b({'|'.join(PLACEHOLDERS)})\b", lambda m: shlex.quote(values[m.group(1)]), command)


def test_the_readme_section_has_the_two_blocks_and_names_every_placeholder():
    blocks = readme_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) == 2, blocks
    first, second = map(commands, blocks)
    assert [c.split()[:3] for c in first] == [[".venv/bin/specsweep", "init", "mine"], ["make", "profile",
                                                                                        "PROFILE=mine"]]
    assert [c.split()[:2] for c in second] == [[".venv/bin/specsweep", "run"], [".venv/bin/specsweep", "report"]]
    for block in blocks:
        for name in PLACEHOLDERS:
            assert re.search(rf"\b{name}\b", block), (name, block)


# ------------------------------------------------------------------------------------------------ running

def _checkout(root: Path) -> Path:
    """What `make profile` and the README's commands read, with a venv that never reinstalls (module docstring)."""
    root.mkdir()
    for name in CHECKOUT:
        shutil.copy(REPO / name, root / name)
        os.utime(root / name, (0, 0))
    shutil.copytree(REPO / "sweeps", root / "sweeps")
    venv = Path(sys.prefix)
    if not (venv / "bin" / "specsweep").is_file():
        pytest.skip(f"no specsweep console script in {venv}/bin (make setup installs it)")
    (root / ".venv").mkdir()
    for entry in venv.iterdir():
        if entry.name != ".installed":
            (root / ".venv" / entry.name).symlink_to(entry)
    (root / ".venv" / ".installed").touch()
    return root


def _inputs(root: Path) -> dict[str, Path]:
    from pipeline.synthetic import save_pair

    target, draft = save_pair(root / "models")
    articles, prompts = root / "articles.jsonl", root / "prompts.jsonl"
    rows = [(" ".join(WORDS[i:] + WORDS[:i]), " ".join(WORDS[i:i + 4])) for i in range(3)]
    articles.write_text("".join(json.dumps({"id": f"a{i}", "article": a, "highlights": h}) + "\n"
                                for i, (a, h) in enumerate(rows)))
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": a}) + "\n" for i, (a, _) in enumerate(rows)))
    return {"target": target, "draft": draft, "articles": articles, "prompts": prompts}


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(REPO)}
    for name in ("OPTUNA_STORAGE", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VENV", "WORKSPACES", "PROFILE", "FORCE",
                 "SPECSWEEP_FIXTURES"):
        env.pop(name, None)
    return env


def shrink(profile: Path) -> None:
    """The test's edit of the written profile (module docstring): tiny runs, a 2-trial study, relaxed checks."""
    params = yaml.safe_load(profile.read_text())
    params["run"].update(max_cpu_wait=1.0, max_spread=1000.0)
    for config in [p["config"] for p in params["pairs"]] + [r["config"] for r in params["pair_runs"].values()]:
        config.update(limit=3, max_new_tokens=6)
    params["tune"]["n_trials"] = 2
    profile.write_text(yaml.safe_dump(params, sort_keys=False))


def run_block(block: str, values: dict[str, str], cwd: Path, env: dict) -> list[tuple[str, str]]:
    """Each command of ``block`` as written (placeholders substituted) in ``cwd``; (command, stdout) each."""
    done = []
    for command in commands(block):
        command = substitute(command, values)
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        done.append((command, proc.stdout))
        if re.match(r"\S*specsweep init (\S+)", command):
            shrink(cwd / f"params.{command.split()[2]}.yaml")
    return done


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    written = [REPO / "params.mine.yaml", REPO / "workspaces" / "mine", REPO / "results" / "mine",
               REPO / "reports" / "mine"]      # where the commands would write, run in the repository
    before = [p.exists() for p in written]
    root = tmp_path_factory.mktemp("own-pair")
    checkout = _checkout(root / "checkout")
    made = _inputs(root)
    profile_block, one_off_block = readme_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    models = {"TARGET": str(made["target"]), "DRAFT": str(made["draft"])}
    env = _env()
    with ThreadPoolExecutor(max_workers=2) as pool:
        profile = pool.submit(run_block, profile_block,
                              {**models, "DATA": str(made["articles"]), "TASK": "cnn_dailymail"}, checkout, env)
        one_off = pool.submit(run_block, one_off_block,
                              {**models, "DATA": str(made["prompts"]), "TASK": "prompts"}, checkout, env)
        done = {"profile": profile.result(), "one_off": one_off.result()}
    assert [p.exists() for p in written] == before     # nothing written into the repository
    return checkout, done


def _table(path: Path) -> list[dict]:
    import csv

    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_init_then_make_profile_reports_the_baseline_the_draft_model_and_prompt_lookup(readme_run):
    checkout, done = readme_run
    (_, init_out), _ = done["profile"]
    assert "make profile PROFILE=mine" in init_out
    workspace = checkout / "workspaces" / "mine"
    assert (workspace / "reports" / "report.md").is_file() and (workspace / "reports" / "report.html").is_file()
    rows = _table(workspace / "reports" / "runs.csv")
    baseline = [r for r in rows if r["gamma"] == "0"]
    assert [r["run"] for r in baseline] == ["mine-ar-auto"]
    runs = {(r["drafter"], int(r["gamma"])): float(r["speedup"]) for r in rows if r["gamma"] != "0"}
    assert set(runs) == {(d, g) for d in ("model", "prompt-lookup") for g in (2, 4, 6)}
    assert all(math.isfinite(s) and s > 0 for s in runs.values()), runs
    assert {r["task"] for r in rows} == {"cnn_dailymail"} and {r["sampler"] for r in rows} == {"exact"}
    front = json.loads((workspace / "results" / "tune" / "mine-pareto.json").read_text())
    assert front["n_complete"] == 2 and front["best_trials"]


def test_the_one_off_run_and_report_hold_every_drafter_and_gamma(readme_run):
    checkout, done = readme_run
    assert [c.split()[1] for c, _ in done["one_off"]] == ["run", "report"]
    reports = checkout / "reports" / "mine"
    assert (reports / "report.md").is_file()
    rows = _table(reports / "runs.csv")
    runs = {(r["drafter"], int(r["gamma"])): float(r["speedup"]) for r in rows}
    assert set(runs) == {(d, g) for d in ("model", "prompt-lookup") for g in (2, 4, 6)}
    assert all(math.isfinite(s) and s > 0 for s in runs.values()), runs
    assert {r["task"] for r in rows} == {"prompts"}
    assert sorted(p.name for p in (checkout / "results" / "mine").iterdir()) == sorted(
        f"{d}-g{g}.json" for d in ("model", "prompt-lookup") for g in (2, 4, 6))


# ------------------------------------------------------------------------------------------------ init

@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    return _inputs(tmp_path_factory.mktemp("pair"))


def _init(monkeypatch, tmp_path, capsys, *argv: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    try:
        code = cli_main(["init", *argv])
    except SystemExit as e:       # argparse's errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["mine", "--task", "translate"], "invalid choice: 'translate'"),
    (["mine", "--data", "missing.jsonl"], "--data missing.jsonl does not exist"),
    (["mine", "--target", "no-such-model"], "--target no-such-model is neither a folder nor a model name"),
    (["mine", "--draft", "no/such/folder"], "--draft no/such/folder is neither a folder nor a model name"),
    (["my profile"], "NAME 'my profile' is not a file-name word"),
    (["../mine"], "NAME '../mine' is not a file-name word"),
    (["default"], "NAME default is the default profile's"),
    (["mine", "--task", "cnn_dailymail"], "missing field(s) 'article', 'highlights'"),
    (["mine", "--gamma", "2,x"], "--gamma '2,x'"),
    (["mine", "--dtype", "float64"], "--dtype 'float64'"),
], ids=["task", "data", "target", "draft", "name-space", "name-path", "name-default", "data-schema", "gamma", "dtype"])
def test_init_refuses_bad_input_in_one_line_with_exit_2(argv, message, pair, monkeypatch, tmp_path, capsys):
    given = {"--target": str(pair["target"]), "--draft": str(pair["draft"]), "--data": str(pair["prompts"]),
             "--task": "prompts"}
    for flag, value in zip(argv[1::2], argv[2::2]):
        given[flag] = value
    code, out, err = _init(monkeypatch, tmp_path, capsys, argv[0], *[x for kv in given.items() for x in kv])
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not list(tmp_path.iterdir())


def test_init_refuses_to_overwrite_a_profile_without_force(pair, monkeypatch, tmp_path, capsys):
    argv = ["mine", "--target", str(pair["target"]), "--data", str(pair["prompts"]), "--task", "prompts"]
    (tmp_path / "params.mine.yaml").write_text("mine\n")
    code, _, err = _init(monkeypatch, tmp_path, capsys, *argv)
    assert code == 2 and err.strip() == ("specsweep init: error: params.mine.yaml exists: give --force to overwrite "
                                         "it, or choose another NAME")
    assert (tmp_path / "params.mine.yaml").read_text() == "mine\n"
    code, out, _ = _init(monkeypatch, tmp_path, capsys, *argv, "--force")
    assert code == 0 and out.splitlines()[-1].startswith("next: make profile PROFILE=mine")
    assert yaml.safe_load((tmp_path / "params.mine.yaml").read_text())["pair_runs"]


def _stages(profile: Path, tmp_path: Path) -> list[str]:
    """`dvc stage list` of the shared dvc.yaml with ``profile`` as its params.yaml (as `make profile` lays it out)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, ws / name)
    shutil.copy(profile, ws / "params.yaml")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for args in (["init", "--no-scm", "-q"], ["stage", "list"]):
        proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=ws, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return sorted(line.split()[0] for line in proc.stdout.splitlines() if line.strip())


def test_registry_names_are_downloaded_and_the_profile_resolves_every_stage(pair, monkeypatch, tmp_path, capsys):
    code, _, _ = _init(monkeypatch, tmp_path, capsys, "mine", "--target", "qwen2.5-coder-1.5b-instruct", "--draft",
                       "qwen2.5-coder-0.5b-instruct", "--data", str(pair["articles"]), "--task", "cnn_dailymail",
                       "--dtype", "auto,float32", "--gamma", "3,5")
    assert code == 0
    text = (tmp_path / "params.mine.yaml").read_text()
    params = yaml.safe_load(text)
    assert params["benchmarks"] == {} and params["pair_runs"] == {} and params["missing"] == []
    assert params["prepare"]["downloads"]["mine"] == {
        "cmd": "specsweep fetch --model qwen2.5-coder-1.5b-instruct --out models/mine/target --no-progress && "
               "specsweep fetch --model qwen2.5-coder-0.5b-instruct --out models/mine/draft --no-progress",
        "out": "models/mine"}
    (config,) = [p["config"] for p in params["pairs"]]
    assert config["target"] == "models/mine/target" and config["draft"] == "models/mine/draft"
    assert config["data"] == str(pair["articles"]) and Path(config["data"]).is_absolute()
    assert params["pairs"][0]["model_dep"] == "models/mine" and params["dtypes"] == ["auto", "float32"]
    assert [g["config"]["gamma"] for g in params["grids"]] == ["3,5", "3,5"]
    assert params["tune"]["space"] == "sweeps/optuna_space.own.yaml" and params["tune"]["dtype"] == "auto"
    stages = _stages(tmp_path / "params.mine.yaml", tmp_path)
    assert stages == ["baseline@pair0-auto", "baseline@pair0-float32", "downloads@mine", "report",
                      "run@pair0-grid0-auto", "run@pair0-grid0-float32", "run@pair0-grid1-auto",
                      "run@pair0-grid1-float32", "tune@0"]


def test_a_prompts_profile_runs_pair_runs_and_no_study(pair, monkeypatch, tmp_path, capsys):
    """dvc.yaml tunes every pair of `pairs`, and a prompts task has no quality metric to tune: its runs are pair runs
    (local folders read in place, by absolute path), `missing:` says why no study runs, and a stage makes the empty
    results/tune/ the report stage depends on."""
    relative = os.path.relpath(pair["target"], tmp_path)      # init runs in tmp_path: written as an absolute path
    code, _, _ = _init(monkeypatch, tmp_path, capsys, "mine", "--target", relative, "--draft",
                       str(pair["draft"]), "--data", str(pair["prompts"]), "--task", "prompts")
    assert code == 0
    params = yaml.safe_load((tmp_path / "params.mine.yaml").read_text())
    assert params["pairs"] == [] and params["prepare"]["downloads"] == {}
    runs = params["pair_runs"]
    assert sorted(runs) == ["mine-lookup-auto", "mine-model-auto"]
    assert runs["mine-model-auto"]["config"]["target"] == str(pair["target"])
    assert runs["mine-lookup-auto"]["config"]["drafter"] == "prompt-lookup"
    assert params["missing"][0]["what"] == "an Optuna study of the pair"
    assert _stages(tmp_path / "params.mine.yaml", tmp_path) == [
        "data@no-study", "pair_run@mine-lookup-auto", "pair_run@mine-model-auto", "report"]
