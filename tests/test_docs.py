"""The generated blocks of README.md and docs/*.md (`make docs`, `make check-docs`: pipeline.analysis.docs), the
published results they read (`make publish`: pipeline.analysis.publish) and the tables of run results
(pipeline.analysis.run_tables), on the repository itself and on small results files written in the real schema."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline import env_info
from pipeline.analysis import bench_blocks, docs, gpu_blocks, paired_tokens, publish, run_tables, tree_blocks
from pipeline.analysis.run_tables import TABLES
from pipeline.env_info import git_commit
from pipeline.errors import SpecsweepError
from pipeline.result import make_result, write_result

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("results/bench", "kernels/results", "kernels/shapes", "results/published")


def copy_repo(tmp_path: Path) -> Path:
    """The pages and the committed sources of the generated blocks, copied under ``tmp_path``."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", root / "README.md")
    for page in (ROOT / "docs").glob("*.md"):
        shutil.copy(page, root / "docs" / page.name)
    for folder in SOURCES:
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, root / folder)
    return root


def test_the_repositorys_generated_blocks_are_what_make_docs_writes(capsys):
    assert docs.main(["--check", "--root", str(ROOT)]) == 0, capsys.readouterr().out
    names = docs.block_names(ROOT)
    assert {"headline", "gpu-summary", "bench-kernels-gpu", "bench-host-gpu", "bench-forward-qwen-cuda",
            "bench-block-gain", "gpu-lossless", "trees-lookup"} <= names


def test_changing_any_digit_inside_a_generated_block_makes_the_check_fail():
    rendered = docs.render_all(ROOT, docs.block_names(ROOT))
    checked = 0
    for page in docs.documents(ROOT):
        where = str(page.relative_to(ROOT))
        lines = page.read_text(encoding="utf-8").split("\n")
        for block in docs.find_blocks(lines, where):
            # the block with its BEGIN and END lines: rewriting it alone checks what rewriting the page would
            # (rewrite compares block by block), without re-reading the page for every digit
            window = lines[block.first - 1:block.end + 1]
            assert docs.rewrite("\n".join(window), where, rendered)[1] == []      # as committed: no difference
            for i in range(1, len(window) - 1):
                for m in re.finditer(r"\d", window[i]):
                    changed = list(window)
                    digit = int(m.group())
                    changed[i] = window[i][:m.start()] + str((digit + 1) % 10) + window[i][m.end():]
                    _, differing = docs.rewrite("\n".join(changed), where, rendered)
                    assert [name for name, _, _ in differing] == [block.name], (where, block.first + i, changed[i])
                    checked += 1
    assert checked > 500       # the blocks hold that many digits: none was skipped


def test_check_docs_prints_the_differing_block_as_a_diff_and_make_docs_restores_it(tmp_path, capsys):
    root = copy_repo(tmp_path)
    page = root / "docs" / "benchmarks.md"
    text = page.read_text(encoding="utf-8")
    page.write_text(text.replace("| 2 | 1.634 | 1.641 |", "| 2 | 1.634 | 1.642 |"), encoding="utf-8")
    assert docs.main(["--check", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "docs/benchmarks.md: block bench-block-gain differs" in out
    assert "-| 2 | 1.634 | 1.642 |" in out and "+| 2 | 1.634 | 1.641 |" in out
    assert docs.main(["--root", str(root)]) == 0
    assert page.read_text(encoding="utf-8") == text
    assert docs.main(["--check", "--root", str(root)]) == 0


def one_line_error(capsys, argv: list[str], module=docs) -> str:
    """Run ``module.main(argv)``: it must exit 2 with a single line on stderr, which is returned."""
    assert module.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_an_unknown_block_name_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "README.md").write_text("x\n<!-- BEGIN GENERATED no-such-block -->\n1\n<!-- END GENERATED -->\n")
    err = one_line_error(capsys, ["--check", "--root", str(tmp_path)])
    assert "README.md:2: unknown generated block 'no-such-block'" in err


def test_a_block_without_its_end_line_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "README.md").write_text("<!-- BEGIN GENERATED gpu-summary -->\n1\n")
    assert "has no `<!-- END GENERATED -->` line" in one_line_error(capsys, ["--root", str(tmp_path)])


def test_a_missing_source_is_a_one_line_error_that_names_it(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "gpu.md").write_text("<!-- BEGIN GENERATED gpu-machine -->\n<!-- END GENERATED -->\n")
    err = one_line_error(capsys, ["--check", "--root", str(tmp_path)])
    assert "block gpu-machine: source kernels/results/kernels-nvidia-h200.json is missing" in err


# ---------------------------------------------------------------------------------------------- published run tables

def run_result(task: str, gamma: int, speedup: float, *, drafter: str | None = None, quality: float = 1.0,
               seed: int = 0) -> dict:
    """A results file as `specsweep run` writes it (pipeline/result.py), with made-up figures."""
    scores = ({"rouge1": quality, "rouge2": quality / 2, "rougeL": quality, "rougeLsum": quality}
              if task == "cnn_dailymail" else {"wer": quality, "normalizer": "basic"})
    config = {"task": task, "target": "t", "draft": None if drafter else "d", "drafter": drafter,
              "sampler": "exact", "backend": "torch", "gamma": gamma, "draft_tree": None, "dtype": "float32",
              "temperature": 0.0, "limit": 8, "max_new_tokens": 32, "seed": seed, "device": "cpu", "repeats": 6}
    metrics = {"speedup": speedup, "speedup_ci_low": speedup - 0.05, "speedup_ci_high": speedup + 0.1,
               "unpaired_speedup": speedup + 0.02, "flagged": False, "acceptance_rate": 0.5 if gamma else None,
               "iid_alpha": 0.8 if gamma else None, "mean_accepted_tokens": 2.25 if gamma else 1.0,
               "cost_ratio": None if drafter or not gamma else 0.125, "verify_cost_ratio": 1.4 if gamma else None,
               "theoretical_speedup": 2.0 if gamma else None, "predicted_speedup": 1.6 if gamma else None,
               "tokens_per_second": 100.0 * speedup, "new_tokens": 64, "wall_time_s": 1.0}
    measurement = {"repeats": 6, "samples_per_repeat": 4, "flags": [], "flagged": False,
                   "speedup": {"median": speedup, "ci_low": speedup - 0.05, "ci_high": speedup + 0.1,
                               "ci_coverage": 0.97, "n": 6}}
    provenance = {"date": "2026-11-27T10:00:00+00:00", "host": "h", "versions": {"specsweep": "0.1.0"},
                  "device": {"device": "cpu", "cpu": "x86_64", "cpu_threads": 1}}
    samples = [{"id": f"p{i}", "text": "x", "new_tokens": 8, "verify_steps": 4} for i in range(2)]
    return make_result(config, {"device": "cpu", "samples": 2}, provenance, metrics, measurement, scores, samples)


def write_runs(folder: Path, runs: dict[str, dict]) -> None:
    for key, result in runs.items():
        write_result(folder / f"{key}.json", result)


def toy_runs() -> dict[str, dict]:
    runs = {}
    for pair, task in (("text", "cnn_dailymail"), ("speech", "librispeech")):
        runs[f"{pair}-ar-float32"] = run_result(task, 0, 1.0, quality=0.0 if task == "librispeech" else 1.0)
        for i, rule in enumerate(("exact", "sigmoid", "greedy")):
            for gamma in (2, 4):
                runs[f"{pair}-main-float32/{pair}-{rule}-torch-g{gamma}-float32"] = run_result(
                    task, gamma, 1.0 + i / 10 + gamma / 100)
        for rule in ("block", "typical", "fuzzy", "relaxed", "accept_all"):
            runs[f"{pair}-rules-float32/{pair}-{rule}-torch-g4-float32"] = run_result(task, 4, 1.5, quality=0.04)
        runs[f"{pair}-lookup-float32/{pair}-exact-torch-g4-float32"] = run_result(
            task, 4, 0.98, drafter="prompt-lookup", quality=0.5)
    return runs


def test_publish_writes_one_small_summary_with_what_it_is_the_machine_the_date_and_the_version(tmp_path, capsys):
    runs = toy_runs()
    write_runs(tmp_path / "results" / "runs", runs)
    (tmp_path / "results" / "runs" / "text-pareto.json").write_text("{}")       # another kind of JSON: skipped
    assert publish.main(["--profile", "default", "--root", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "results/published/default/summary.json").read_text())
    assert summary["profile"] == "default" and "make publish PROFILE=default" in summary["published"]
    assert summary["machine"]["cores"] >= 1 and summary["machine"]["cpu"]
    assert summary["date"] and summary["version"] and "commit" in summary
    assert summary["measured"]["devices"] == ["CPU (x86_64, 1 threads)"]
    assert set(summary["runs"]) == set(runs)
    record = summary["runs"]["text-main-float32/text-exact-torch-g2-float32"]
    assert record["metrics"]["speedup"] == pytest.approx(1.02) and record["measurement"]["coverage"] == 0.97
    assert record["quality"] == {"rouge1": 1.0, "rouge2": 0.5, "rougeL": 1.0, "rougeLsum": 1.0}
    assert all(set(r) == {"config", "params", "metrics", "greedy_agreement", "tokens_sha256", "quality", "measurement",
                          "ran", "packed_weights", "quant_kernel", "few_rows_kernel", "row_kernel", "model_bytes"}
               for r in summary["runs"].values())
    assert record["params"] == {}       # exact has no parameters (a sigmoid run's: the sigmoid table's test)


def test_a_checkout_is_dirty_for_publishing_only_when_files_outside_the_published_folder_changed(tmp_path):
    """`make publish` rewrites results/published/: that is not a local change of the code the runs came from."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=a@b.c", "-c", "user.name=a", *args], check=True,
                       capture_output=True)

    (tmp_path / publish.FOLDER).mkdir(parents=True)
    (tmp_path / publish.FOLDER / "summary.json").write_text("{}")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("a\n")
    (tmp_path / "README.md").write_text("a\n")
    (tmp_path / "workspace").mkdir()                 # a profile's workspace: a folder inside the checkout
    (tmp_path / "workspace" / "params.yaml").write_text("a: 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    (tmp_path / publish.FOLDER / "summary.json").write_text('{"runs": {}}')
    assert git_commit(tmp_path)["dirty"] is True
    assert git_commit(tmp_path, ignore=(publish.FOLDER,))["dirty"] is False
    # a run's own record (env_info.code_commit): the pages `make docs` rewrites are not its code either
    (tmp_path / "docs" / "page.md").write_text("b\n")
    (tmp_path / "README.md").write_text("b\n")
    assert git_commit(tmp_path, ignore=env_info.NOT_CODE)["dirty"] is False
    assert git_commit(tmp_path / "workspace", ignore=env_info.NOT_CODE)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path, ignore=(publish.FOLDER,))["dirty"] is True
    assert git_commit(tmp_path, ignore=env_info.NOT_CODE)["dirty"] is True
    # seen from a folder inside the checkout (a benchmark stage run in its workspace), the whole checkout counts
    assert git_commit(tmp_path / "workspace")["dirty"] is True
def test_publish_keeps_the_published_runs_a_later_runs_folder_lacks_only_when_asked(tmp_path, capsys, monkeypatch):
    commits = iter("abcd")
    monkeypatch.setattr(publish, "git_commit", lambda root, **_: {"commit": next(commits) * 40, "dirty": False})
    folder = tmp_path / "workspaces" / "pair" / "results" / "runs"
    write_runs(folder, {"old": run_result("cnn_dailymail", 4, 1.2), "both": run_result("cnn_dailymail", 4, 1.3)})
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    for path in folder.iterdir():
        path.unlink()
    write_runs(folder, {"new": run_result("cnn_dailymail", 4, 1.5), "both": run_result("cnn_dailymail", 4, 1.4)})
    assert publish.main(["--profile", "pair", "--root", str(tmp_path), "--keep"]) == 0
    summary = json.loads((tmp_path / "results/published/pair/summary.json").read_text())
    assert list(summary["runs"]) == ["both", "new", "old"] and [k["runs"] for k in summary["kept"]] == [["old"]]
    assert summary["runs"]["both"]["metrics"]["speedup"] == pytest.approx(1.4)         # the folder's record wins
    assert summary["runs"]["old"]["metrics"]["speedup"] == pytest.approx(1.2)
    for path in folder.iterdir():                     # a third publish: each kept run keeps the commit it came from
        path.unlink()
    write_runs(folder, {"newest": run_result("cnn_dailymail", 4, 1.6)})
    assert publish.main(["--profile", "pair", "--root", str(tmp_path), "--keep"]) == 0
    summary = json.loads((tmp_path / "results/published/pair/summary.json").read_text())
    assert [(k["commit"][0], k["runs"]) for k in summary["kept"]] == [("b", ["both", "new"]), ("a", ["old"])]
    assert " ".join(run_tables.provenance("pair")(tmp_path).split()).endswith(
        "specsweep 0.1.0: 2 runs at bbbbbbb, 1 at ccccccc, 1 at aaaaaaa.")
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "results/published/pair/summary.json").read_text())
    assert list(summary["runs"]) == ["newest"] and "kept" not in summary


def test_a_record_keeps_the_commit_its_run_recorded_and_the_line_counts_runs_by_it(tmp_path, monkeypatch):
    """A results file's `provenance.commit` (the code that ran it) is its record's `ran.commit`, whenever it is
    published; the line counts runs by it, and a kept record without one by the commit it was published at."""
    monkeypatch.setattr(publish, "git_commit", lambda root, **_: {"commit": "p" * 40, "dirty": False})
    folder = tmp_path / "workspaces" / "pair" / "results" / "runs"
    write_runs(folder, {"old": run_result("cnn_dailymail", 4, 1.2)})          # written before runs recorded it
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    (folder / "old.json").unlink()
    runs = {}
    for name, commit, dirty in (("a", "a", False), ("b", "a", False), ("c", "c", True)):
        runs[name] = run_result("cnn_dailymail", 4, 1.3)
        runs[name]["provenance"]["commit"] = {"commit": commit * 40, "dirty": dirty}
    write_runs(folder, runs)
    assert publish.main(["--profile", "pair", "--root", str(tmp_path), "--keep"]) == 0
    summary = json.loads((tmp_path / "results/published/pair/summary.json").read_text())
    assert [summary["runs"][n]["ran"]["commit"] for n in "abc"] == ["a" * 40, "a" * 40, "c" * 40]
    assert summary["runs"]["old"]["ran"]["commit"] is None
    assert " ".join(run_tables.provenance("pair")(tmp_path).split()).endswith(
        "specsweep 0.1.0: 2 runs at aaaaaaa, 1 at ccccccc with local changes, 1 at ppppppp.")
    for name in "bc":
        (folder / f"{name}.json").unlink()
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    assert " ".join(run_tables.provenance("pair")(tmp_path).split()).endswith("specsweep 0.1.0 at aaaaaaa.")


def test_each_record_names_the_cpu_it_ran_on_and_the_line_names_each_cpu_when_they_differ(tmp_path, monkeypatch):
    """A results file's `provenance.device.cpu_model` is its record's `ran.machine`; a record from before runs
    recorded it, published fresh or kept, ran on the machine that published it; one CPU gives the one-machine line,
    two give each with its runs and dates."""
    monkeypatch.setattr(publish, "git_commit", lambda root, **_: {"commit": "p" * 40, "dirty": False})
    monkeypatch.setattr(publish, "machine", lambda: {"cpu": "AMD EPYC", "cores": 2, "gpus": []})
    folder = tmp_path / "workspaces" / "pair" / "results" / "runs"
    write_runs(folder, {"old": run_result("cnn_dailymail", 4, 1.2)})          # written before runs recorded it
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "results/published/pair/summary.json").read_text())
    assert first["runs"]["old"]["ran"]["machine"] == "AMD EPYC"              # published fresh: its publisher's CPU
    assert " ".join(run_tables.provenance("pair")(tmp_path).split()).startswith(
        "Measured on AMD EPYC (2 cores), 2026-11-27, by `make profile PROFILE=pair`, specsweep")
    (folder / "old.json").unlink()
    monkeypatch.setattr(publish, "machine", lambda: {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "gpus": []})
    runs = {name: run_result("cnn_dailymail", 4, 1.3) for name in ("a", "b")}
    for result in runs.values():
        result["provenance"]["device"]["cpu_model"] = "Intel(R) Xeon(R) Processor"
        result["provenance"]["date"] = "2026-12-02T01:00:00+00:00"
    write_runs(folder, runs)
    assert publish.main(["--profile", "pair", "--root", str(tmp_path), "--keep"]) == 0
    summary = json.loads((tmp_path / "results/published/pair/summary.json").read_text())
    xeon = "Intel(R) Xeon(R) Processor"
    assert [summary["runs"][n]["ran"]["machine"] for n in ("a", "b", "old")] == [xeon, xeon, "AMD EPYC"]
    assert summary["measured"]["machines"] == ["AMD EPYC", xeon]
    assert " ".join(run_tables.provenance("pair")(tmp_path).split()).startswith(
        "Measured on Intel Xeon (2 runs, 2026-12-02) and AMD EPYC (1 run, 2026-11-27), 2 cores each, by `make "
        "profile PROFILE=pair`, specsweep")
    assert env_info.device_info("cpu")["cpu_model"] == env_info.cpu_model()


def test_provenance_names_the_commit_of_the_checkout_it_runs_from():
    """`specsweep run` from this checkout records its commit (results and the pages not counting as a change); from
    an installed copy, where no .git sits beside the package, None."""
    root = Path(env_info.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        assert env_info.provenance()["commit"] is None
        return
    assert env_info.provenance()["commit"] == env_info.git_commit(root, ignore=env_info.NOT_CODE)
    assert len(env_info.provenance()["commit"]["commit"]) == 40


def test_the_provenance_line_says_what_idle_openmp_workers_did_in_the_published_runs(tmp_path, monkeypatch):
    """A run's `measurement.threads.env` is published as its `omp_wait`; the line names it once where every run
    agrees, with counts where runs differ, and nothing for summaries published before runs recorded it."""
    monkeypatch.setattr(publish, "git_commit", lambda root, **_: {"commit": "a" * 40, "dirty": False})
    folder = tmp_path / "workspaces" / "pair" / "results" / "runs"

    def with_env(env: dict | None, speedup: float) -> dict:
        result = run_result("cnn_dailymail", 4, speedup)
        if env is not None:
            result["measurement"]["threads"] = {"intra_op": 2, "env": env}
        return result

    spin = {"GOMP_SPINCOUNT": "10000"}
    write_runs(folder, {"a": with_env(spin, 1.5), "b": with_env(spin, 1.6)})
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "results/published/pair/summary.json").read_text())
    assert summary["runs"]["a"]["measurement"]["omp_wait"] == "GOMP_SPINCOUNT=10000"
    assert " ".join(run_tables.provenance("pair")(tmp_path).split()).endswith(
        "at aaaaaaa. Idle OpenMP workers: GOMP_SPINCOUNT=10000.")
    write_runs(folder, {"b": with_env({"OMP_WAIT_POLICY": "PASSIVE"}, 1.6), "c": with_env({}, 1.7),
                        "d": with_env(None, 1.8)})
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    assert " ".join(run_tables.provenance("pair")(tmp_path).split()).endswith(
        "Idle OpenMP workers: GOMP_SPINCOUNT=10000 (1 run), OMP_WAIT_POLICY=PASSIVE (1 run), libgomp's default "
        "(1 run), not recorded (1).")
    for path in folder.iterdir():
        path.unlink()
    write_runs(folder, {"d": with_env(None, 1.8)})
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    assert run_tables.provenance("pair")(tmp_path).rstrip().endswith("at aaaaaaa.")


def test_publish_without_the_profiles_runs_is_a_one_line_error(tmp_path, capsys):
    err = one_line_error(capsys, ["--profile", "real", "--root", str(tmp_path)], publish)
    assert "workspaces/real/results/runs does not exist: run `make profile PROFILE=real` first" in err


def table(root: Path, name: str) -> list[list[str]]:
    """A run table rendered from ``root``'s published summary, as rows of cells (header first)."""
    text = {t.name: t for t in TABLES}[name].render(root)
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.split("\n") if not line.startswith("|--")]


def test_the_pair_table_gives_leviathans_theory_only_for_a_draft_model_proposing_a_fixed_gamma_alone(tmp_path):
    """The formula fixes γ and prices every proposed token at one draft forward: a run whose drafting stops early
    (--draft-confidence) or whose tokens come from prompt lookup gets a blank cell, not a figure it does not mean."""
    runs = {name: run_result("cnn_dailymail", 4, 1.2) for _, name in run_tables.PAIR_RUNS}
    runs.update({"qwen-model-k32768-int4-g6-bfloat16-128": run_result("cnn_dailymail", 6, 1.5),
                 "qwen-model-k32768-int4-g6-conf0.4-bfloat16-128": run_result("cnn_dailymail", 6, 1.6),
                 "qwen-lookup-g4-bfloat16-128": run_result("cnn_dailymail", 4, 2.0, drafter="prompt-lookup")})
    runs["qwen-model-k32768-int4-g6-conf0.4-bfloat16-128"]["config"]["draft_confidence"] = 0.4
    write_runs(tmp_path / "workspaces" / "pair" / "results" / "runs", runs)
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    rows = {row[0]: row for row in table(tmp_path, "results-pair")}
    label = {name: label for label, name in run_tables.PAIR_RUNS}
    column = rows["Qwen2.5-Coder-1.5B-Instruct with"].index("Leviathan's theory")
    assert rows[label["qwen-model-k32768-int4-g6-bfloat16-128"]][column] == "2.00"
    assert rows[label["qwen-model-k32768-int4-g6-conf0.4-bfloat16-128"]][column] == ""
    assert rows[label["qwen-lookup-g4-bfloat16-128"]][column] == ""


def test_the_toy_tables_are_rendered_from_the_published_summary(tmp_path):
    write_runs(tmp_path / "results" / "runs", toy_runs())
    assert publish.main(["--profile", "default", "--root", str(tmp_path)]) == 0
    toy = table(tmp_path, "results-toy-speedups")
    assert toy[0] == ["pair", "exact γ 2", "exact γ 4", "sigmoid γ 2", "sigmoid γ 4", "greedy γ 2", "greedy γ 4"]
    assert [cell.split(" (")[0] for cell in toy[1]] == [
        "text", "1.02 [0.97, 1.12]", "1.04 [0.99, 1.14]", "1.12 [1.07, 1.22]", "1.14 [1.09, 1.24]",
        "1.22 [1.17, 1.32]", "1.24 [1.19, 1.34]"]
    assert toy[2][1] == "1.02 [0.97, 1.12] (1.04)"
    rules = table(tmp_path, "results-toy-rules")
    assert rules[1][1] == "1.50 [1.45, 1.60], 0.040" and rules[2][1] == "1.50 [1.45, 1.60], 4 %"   # ROUGE-L, WER
    assert rules[2][-1] == "0.98 [0.93, 1.08], 50 %"
    theory = table(tmp_path, "results-toy-theory")
    assert theory[1] == ["exact γ 2", "0.80", "0.125", "1.40", "1.02", "1.60", "2.00", "0.51", "0.64"]


def test_the_real_tables_are_rendered_and_a_run_the_summary_lacks_is_a_one_line_error(tmp_path, capsys):
    from pipeline.analysis.run_tables import REAL_RUNS

    runs = {"qwen-ar-bfloat16": run_result("cnn_dailymail", 0, 1.0, quality=0.158),
            "smollm2-ar-bfloat16": run_result("cnn_dailymail", 0, 1.0, quality=0.198),
            "whisper-base-ar-bfloat16": run_result("librispeech", 0, 1.0, quality=0.057)}
    for i, (_, run, _) in enumerate(REAL_RUNS):
        task = "librispeech" if run.startswith("whisper") else "cnn_dailymail"
        runs[run] = run_result(task, 4, 1.0 + i / 10, drafter="prompt-lookup" if "lookup" in run else None)
    for rule in ("exact", "sigmoid", "typical"):
        runs[f"qwen-sampling-bfloat16/qwen-sampling-bfloat16-{rule}-torch-g4"] = run_result("cnn_dailymail", 4, 1.2,
                                                                                             quality=0.13)
    write_runs(tmp_path / "workspaces" / "real" / "results" / "runs", runs)
    assert publish.main(["--profile", "real", "--root", str(tmp_path)]) == 0
    readme = table(tmp_path, "results-real")
    head = readme[0]
    assert head[:6] == ["target, drafter", "dtype", "γ", "samples", "new tokens", "paired speedup"]
    assert readme[1][:3] == ["Qwen2.5-Coder-1.5B, 0.5B draft in int4", "float32", "4"]
    assert readme[1][head.index("paired speedup")] == "1.00 [0.95, 1.10]"
    assert readme[1][head.index("samples")] == "8"      # each run says how many samples and new tokens it decoded
    assert readme[1][head.index("target alone (bfloat16)")] == "ROUGE-L 0.158"
    assert readme[1][head.index("c")] == "0.12"
    assert readme[3][head.index("c")] == ""            # prompt lookup: no draft model, no c
    float32_row = readme[1 + next(i for i, (_, run, _) in enumerate(run_tables.REAL_RUNS) if "float32" in run)]
    assert float32_row[head.index("target alone (bfloat16)")] == ""    # no target alone in its dtype and length
    assert readme[-1][head.index("target alone (bfloat16)")] == "WER 5.7 %"
    sampling = table(tmp_path, "results-real-sampling")
    assert [r[0] for r in sampling[1:]] == ["exact", "sigmoid", "typical"] and sampling[1][1] == "0.130"

    runs_dir = tmp_path / "workspaces/real/results/runs"
    (runs_dir / "qwen-sampling-bfloat16/qwen-sampling-bfloat16-typical-torch-g4.json").unlink()
    assert publish.main(["--profile", "real", "--root", str(tmp_path)]) == 0
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text(
        "<!-- BEGIN GENERATED results-real-sampling -->\n<!-- END GENERATED -->\n")
    capsys.readouterr()
    err = one_line_error(capsys, ["--root", str(tmp_path)])
    assert "holds no run 'qwen-sampling-bfloat16/qwen-sampling-bfloat16-typical-torch-g4'" in err


def spec_bench_result(speedups: dict[str, float], drafter: str | None = None) -> dict:
    """A Spec-Bench results file with per-category and per-group figures (pipeline/categories.py)."""
    from pipeline.tasks.spec_bench import GROUPS

    result = run_result("spec_bench", 5, 2.0, drafter=drafter)

    def figures(x: float) -> dict:
        return {"questions": 1, "samples": 1, "timed_samples": 1, "new_tokens": 64, "mean_accepted_tokens": x + 1,
                "acceptance_rate": 0.5, "identical_outputs": 1.0, "prefix_agreement": 1.0, "speedup": x,
                "speedup_ci_low": x - 0.1, "speedup_ci_high": x + 0.2, "speedup_ci_coverage": 0.75}

    result["metrics"]["by_category"] = {c: figures(x) for c, x in speedups.items()}
    result["metrics"]["by_group"] = {g: figures(speedups[cats[0]]) for g, cats in GROUPS.items()
                                     if cats[0] in speedups}
    result["metrics"]["by_group"]["overall"] = figures(2.0)
    result["metrics"]["greedy_agreement"] = {"samples": 21, "identical": 20, "shared_prefix_share": 0.99}
    return result


def test_the_spec_bench_category_tables_read_each_runs_groups_and_a_missing_one_is_a_one_line_error(tmp_path):
    from pipeline.tasks.spec_bench import CATEGORIES

    speedups = {c: 1.0 + i / 10 for i, c in enumerate(CATEGORIES)}
    folder = tmp_path / "workspaces/pair-spec-bench-categories/results/runs"
    runs = {run: spec_bench_result(speedups, drafter=None if "model" in run else "prompt-lookup")
            for _, run in run_tables.PAIR_SBC_RUNS}
    runs["qwen-ar-bfloat16"] = run_result("spec_bench", 0, 1.0)
    write_runs(folder, runs)
    assert publish.main(["--profile", "pair-spec-bench-categories", "--root", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "results/published/pair-spec-bench-categories/summary.json").read_text())
    assert set(summary["runs"]["qwen-lookup-g4-bfloat16"]["by_category"]) == set(CATEGORIES)
    assert "by_group" not in summary["runs"]["qwen-ar-bfloat16"]
    groups = table(tmp_path, "pair-spec-bench-groups")
    assert groups[0][1:] == ["Multi-turn Conversation", "Translation", "Summarization", "Question Answering",
                             "Mathematical Reasoning", "Retrieval-aug. Generation", "Overall",
                             "turns identical to the target alone"]
    # MT-Bench's group cell is the first category's figures here; translation is the 9th category (1.8)
    assert groups[1][1:3] == ["1.00 [0.90, 1.20], 2.0", "1.80 [1.70, 2.00], 2.8"] and groups[1][-1] == "20 of 21"
    mt = table(tmp_path, "pair-spec-bench-mt-bench")
    assert mt[0][1:] == list(CATEGORIES[:8]) and mt[2][5] == "1.40 [1.30, 1.60], 2.4"     # coding
    del runs["qwen-lookup-g4-bfloat16"]["metrics"]["by_category"]["coding"]
    write_runs(folder, runs)
    assert publish.main(["--profile", "pair-spec-bench-categories", "--root", str(tmp_path)]) == 0
    with pytest.raises(SpecsweepError, match="no timed 'coding' in by_category") as e:
        run_tables.TABLES[[t.name for t in TABLES].index("pair-spec-bench-mt-bench")].render(tmp_path)
    assert "\n" not in str(e.value)


def test_the_sigmoid_table_shows_each_rules_parameters_and_the_study_its_trials(tmp_path):
    def rule_run(sampler: str, speedup: float, quality: float, **params) -> dict:
        result = run_result("cnn_dailymail", 4, speedup, quality=quality)
        result["config"].update({"sampler": sampler, "temperature": 1.0, **params})
        return result

    runs = {"qwen-ar-t1-bfloat16": run_result("cnn_dailymail", 0, 1.0, quality=0.20),
            "qwen-exact-g4-t1-bfloat16": rule_run("exact", 1.3, 0.21),
            "qwen-sigmoid-g4-t1-bfloat16": rule_run("sigmoid", 1.4, 0.19),
            "qwen-sigmoid-tuned-g4-t1-bfloat16": rule_run("sigmoid", 1.5, 0.195, alpha=2.5, beta=-7.25),
            "qwen-typical-g4-t1-bfloat16": rule_run("typical", 1.6, 0.18),
            "study/trials/00000": rule_run("sigmoid", 1.1, 0.21, alpha=0.5, beta=-25.0),
            "study/trials/00001": rule_run("sigmoid", 1.55, 0.19, alpha=2.5, beta=-7.25)}
    write_runs(tmp_path / "workspaces/pair-sigmoid/results/runs", runs)
    assert publish.main(["--profile", "pair-sigmoid", "--root", str(tmp_path)]) == 0
    rows = table(tmp_path, "pair-sigmoid")
    assert [r[0] for r in rows[1:]] == [label for label, _ in run_tables.PAIR_SIGMOID_RUNS]
    assert rows[1][1:4] == ["", "0.200", ""]                        # the target alone: its ROUGE-L only
    assert rows[3][1] == "α 1.00, β −20.0" and rows[4][1] == "α 2.50, β −7.2" and rows[5][1] == "ε 0.09, δ 0.30"
    assert rows[2][1] == "" and rows[4][3] == "1.50 [1.45, 1.60]"
    study = [line.split("|")[1:-1] for line in run_tables.sigmoid_study(tmp_path).splitlines()]
    study = [[c.strip() for c in row] for row in study]
    assert [r[0] for r in study[2:]] == ["0", "1"] and [r[1] for r in study[2:]] == ["α 0.50, β −25.0",
                                                                                     "α 2.50, β −7.2"]
    assert study[2][4] == "+5.0 %" and study[3][4] == "−5.0 %"
    # no setting within the distortion map's bound: no tuned run, and the table says so instead of failing
    shutil.rmtree(tmp_path / "workspaces/pair-sigmoid/results/runs")
    del runs["qwen-sigmoid-tuned-g4-t1-bfloat16"]
    write_runs(tmp_path / "workspaces/pair-sigmoid/results/runs", runs)
    assert publish.main(["--profile", "pair-sigmoid", "--root", str(tmp_path)]) == 0
    rows = table(tmp_path, "pair-sigmoid")
    assert rows[4][:2] == ["sigmoid, α and β from the distortion map", run_tables.NO_TUNED_SIGMOID]
    assert set(rows[4][2:]) == {""} and rows[5][3] == "1.60 [1.55, 1.70]"    # typical still reads its run
    del runs["qwen-typical-g4-t1-bfloat16"]                               # only the tuned row may be absent
    shutil.rmtree(tmp_path / "workspaces/pair-sigmoid/results/runs")
    write_runs(tmp_path / "workspaces/pair-sigmoid/results/runs", runs)
    assert publish.main(["--profile", "pair-sigmoid", "--root", str(tmp_path)]) == 0
    with pytest.raises(SpecsweepError, match="holds no run 'qwen-typical-g4-t1-bfloat16'"):
        table(tmp_path, "pair-sigmoid")


# ---------------------------------------------------------------------------------------------- docs/trees.md

def lookup_run(drafter: str, temperature: int, tree: str | None, counts: list[tuple[int, int]],
               tokens: list[list[int]]) -> dict:
    """A `specsweep run` results file of a drafter without a model: a tree (``tree``) or the chain of 3 (None)."""
    config = {"task": "cnn_dailymail", "drafter": drafter, "draft_tree": tree, "gamma": 15 if tree else 3,
              "temperature": float(temperature), "seed": 0, "limit": len(counts), "threads": 1}
    samples = [{"id": f"p{i}", "text": "x", "new_tokens": n, "verify_steps": steps, "token_ids": ids}
               for i, ((n, steps), ids) in enumerate(zip(counts, tokens))]
    provenance = {"date": "2026-11-27T10:00:00+00:00", "device": {"device": "cpu", "cpu": "x86_64", "cpu_threads": 1}}
    return make_result(config, {"device": "cpu"}, provenance, {}, {}, {}, samples)


def compare_lookup(root: Path, drafter: str, t: int, tree_first: int, tree_drafter: str | None = None) -> None:
    """Write a tree and its chain (the tree emits ``tree_first`` tokens in 3 steps on p0, the chain 6; both 8 in 4 on
    p1, with other tokens) and their comparison where `make trees` writes it."""
    tree = root / "runs" / f"{drafter}-tree-t{t}.json"
    chain = root / "runs" / f"{drafter}-chain-t{t}.json"
    write_result(tree, lookup_run(tree_drafter or drafter, t, "3,2,1", [(tree_first, 3), (8, 4)], [[1, 2], [3]]))
    write_result(chain, lookup_run(drafter, t, None, [(6, 3), (8, 4)], [[1, 2], [4]]))
    out = root / tree_blocks.comparison_path(drafter, t)
    assert paired_tokens.main([str(tree), str(chain), "--out", str(out)]) == 0


def test_the_lookup_tree_table_is_rendered_from_the_comparisons_make_trees_writes(tmp_path, capsys):
    for k, (drafter, t) in enumerate([(d, t) for d in ("prompt-lookup", "suffix") for t in (1, 0)]):
        compare_lookup(tmp_path, drafter, t, 9 + 3 * k)
    capsys.readouterr()
    text = tree_blocks.lookup_trees(tmp_path)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.split("\n")
            if line.startswith("|") and not line.startswith("|--")]
    assert rows[0] == ["drafter", "T", "`3,2,1` (15 nodes)", "chain γ = 3", "paired difference (95 % interval)",
                       "prompts the tree is ahead on, behind on", "prompts with the same tokens"]
    # p0: the tree 3 + k tokens per step against the chain's 2; p1: 2 and 2, with other tokens
    assert [r[:2] for r in rows[1:]] == [["prompt lookup", "1"], ["prompt lookup", "0"], ["suffix decoding", "1"],
                                          ["suffix decoding", "0"]]
    for k, row in enumerate(rows[1:]):
        assert row[2:] == [f"{(17 + 3 * k) / 7:.2f}", "2.00",
                           f"+{(1 + k) / 2:.2f} [+0.00, +{1 + k:.2f}]", "1, 0", "1 of 2"], k
    where = " ".join(text.split("\n\n")[-1].split())
    assert where.startswith("Measured on ")
    assert where.endswith("2 prompts per run (`make profile PROFILE=trees`, results/published/trees/).")


def test_a_comparison_of_other_settings_than_its_name_says_is_a_one_line_error(tmp_path, capsys):
    for drafter in ("prompt-lookup", "suffix"):
        for t in (1, 0):
            compare_lookup(tmp_path, drafter, t, 9, tree_drafter="suffix")       # every tree is suffix decoding's
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "trees.md").write_text("<!-- BEGIN GENERATED trees-lookup -->\n<!-- END GENERATED -->\n")
    capsys.readouterr()
    err = one_line_error(capsys, ["--check", "--root", str(tmp_path)])
    assert ("block trees-lookup: source results/published/trees/results/bench/trees-prompt-lookup-t1.json: "
            "side A ran") in err
    assert "'drafter': 'suffix'" in err and "`make profile PROFILE=trees` writes it" in err


def test_the_qwen_engine_table_says_when_ours_against_hf_assisted_is_no_comparison_of_loops(tmp_path):
    """A row whose loop drafts otherwise than HF's assisted loop (another drafter: settings.equal_gamma false) marks
    that ratio "not equal γ"; a row at equal γ does not."""
    for path in bench_blocks.ENGINE_QWEN:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    rows = [r for r in bench_blocks.bench_engine_qwen(tmp_path).splitlines() if r.startswith("| ")][1:]
    marked = ["(not equal γ)" in r for r in rows]
    assert marked == [not json.loads((ROOT / p).read_text())["settings"]["equal_gamma"]
                      for p in bench_blocks.ENGINE_QWEN] and any(marked) and not all(marked)
    by_setting = {tuple(r.split(" | ")[:2]): r for r in rows}      # (our loop, CPU): a setting may run on two CPUs
    lookup = by_setting["| prompt-lookup, γ 4", "AMD EPYC"]
    assert lookup.startswith("| prompt-lookup, γ 4 | AMD EPYC | 1 x 48 | bf16 |")
    # the int4 draft's row says its options and its size (3 articles x 128 tokens)
    int4 = by_setting["| draft model, γ 5, head cut to 32768 tokens, draft weights in int4", "AMD EPYC"]
    assert " | 3 x 128 | bf16 | " in int4 and "(not equal γ)" not in int4
    # a file that records its CPU model is named by it (files from before 2026-12-02 do not: UNRECORDED_CPU)
    assert " | 3 x 128 | bf16 | " in by_setting["| draft model, γ 4", "Intel Xeon"]
    assert "n-grams of 1-4 tokens" in by_setting["| prompt-lookup, γ 12, n-grams of 1-4 tokens", "Intel Xeon"]


# ---------------------------------------------------------------------------------------------- GPU blocks

@pytest.mark.parametrize("median, high, verdict", [(41.9, 47.1, "it holds: the whole interval is below the goal"),
                                                   (48.0, 52.0, "it holds at the median, not over the whole interval"),
                                                   (50.5, 55.0, "it does not hold")])
def test_the_host_goal_is_judged_on_the_goal_rows_interval(median, high, verdict):
    """Issue 43's ≤ 50 µs at the goal row (B 1, γ 5, V 128256, bf16, exact): held only where the whole interval is
    within it; another row's figures never decide it."""
    def row(b: int, sampler: str, us: float, top: float) -> dict:
        return {"B": b, "gamma": 5, "V": 128256, "dtype": "bfloat16", "sampler": sampler,
                "host_us": {"median": us, "ci_low": us - 4, "ci_high": top}}

    data = {"results": [row(1, "greedy", 99.0, 99.0), row(16, "exact", 10.0, 11.0), row(1, "exact", median, high)]}
    text = gpu_blocks.host_goal(data)
    assert text.endswith(f"µs, so {verdict}."), text
    assert f"{median:.1f} [{median - 4:.1f}, {high:.1f}]" in text
    with pytest.raises(SpecsweepError, match="no exact row"):
        gpu_blocks.host_goal({"results": data["results"][:2]})


def test_the_forward_roofline_counts_what_a_forward_reads_and_wants_the_kernels_card(tmp_path):
    """The bytes of one one-token forward of the 1.5B shape, counted by hand from its config.json as every run's
    roofline counts them (the layers' matrices and the untied head once, the K/V cache, the logits; bf16; not the
    embedding table), and a forward measured on another card than the copy bandwidth is refused in one line."""
    h, inner, layers, vocab, kv, context = 1536, 8960, 28, 151936, 2 * 128, 600
    matrices = layers * (2 * h * h + 2 * h * kv + 3 * h * inner) + vocab * h
    want = 2 * (matrices + 2 * layers * kv * (context + 1) + vocab)
    assert gpu_blocks.forward_bytes(ROOT / "kernels/shapes/qwen2.5-coder-1.5b-shape", context, "bfloat16") == want

    root = copy_repo(tmp_path)
    path = root / gpu_blocks.FORWARDS_QWEN[0][1]
    data = json.loads(path.read_text())
    data["provenance"]["device"]["gpu"] = "NVIDIA A100"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecsweepError, match=r"measured on an NVIDIA A100.*the copy bandwidth of the same card"):
        gpu_blocks.bench_forward_qwen_cuda(root)


def test_a_record_says_whether_the_target_ran_packed_weights():
    """What the run resolved; else, for a run that recorded only its settings, --packed-weights with our engine on a
    CPU; None for a run from before the setting (README's pair table writes "packed weights" after the dtype)."""
    from pipeline.analysis.publish import packed_target
    from pipeline.analysis.run_tables import dtype_weights

    settings = {"packed_weights": True, "engine": "specsweep", "device": "cpu", "dtype": "bfloat16"}
    assert packed_target({"config": settings, "resolved": {"packed_weights": {"target": False}}}) is False
    assert packed_target({"config": settings, "resolved": {"packed_weights": {"target": True, "draft": False}}})
    assert packed_target({"config": settings, "resolved": {}}) is True
    assert packed_target({"config": {**settings, "engine": "hf"}}) is False
    assert packed_target({"config": {**settings, "device": "cuda"}}) is False
    assert packed_target({"config": {"engine": "specsweep", "device": "cpu"}}) is None
    assert dtype_weights({"config": settings, "packed_weights": True}) == "bfloat16, packed weights"
    assert dtype_weights({"config": settings, "packed_weights": None}) == "bfloat16"
    assert dtype_weights({"config": settings, "packed_weights": True, "quant_kernel": "int4_linear"}) == \
        "bfloat16, packed weights, int4_linear"
    assert dtype_weights({"config": settings, "packed_weights": True, "quant_kernel": "torch"}) == \
        "bfloat16, packed weights"
    assert dtype_weights({"config": settings, "packed_weights": True, "few_rows_kernel": "bf16_linear",
                          "quant_kernel": "int4_linear"}) == "bfloat16, packed weights, bf16_linear, int4_linear"
    assert dtype_weights({"config": settings, "packed_weights": True, "few_rows_kernel": "onednn"}) == \
        "bfloat16, packed weights"


def test_publish_copies_the_profiles_benchmark_outputs_as_they_are_and_a_missing_one_is_a_one_line_error(tmp_path,
                                                                                                       capsys):
    """Each `out` of the profile's benchmarks (a file, or a folder with a figure beside its JSON) is copied byte for
    byte from the workspace into results/published/<profile>/, under the same path."""
    (tmp_path / "params.demo.yaml").write_text(yaml.safe_dump({"benchmarks": {
        "one": {"cmd": "x", "dep": "a", "dep2": "a", "out": "results/bench/one.json"},
        "map": {"cmd": "y", "dep": "a", "dep2": "a", "out": "results/bench/map"}}}))
    workspace = tmp_path / "workspaces/demo"
    write_runs(workspace / "results/runs", {"r": run_result("cnn_dailymail", 4, 1.2)})
    (workspace / "results/bench/map").mkdir(parents=True)
    (workspace / "results/bench/one.json").write_text('{"a": 1}')
    (workspace / "results/bench/map/m.json").write_text('{"b": 2}')
    (workspace / "results/bench/map/m.png").write_bytes(b"\x89PNG\r\n\x00\xff")
    assert publish.main(["--profile", "demo", "--root", str(tmp_path)]) == 0
    published = tmp_path / "results/published/demo/results/bench"
    assert (published / "one.json").read_text() == '{"a": 1}'
    assert (published / "map/m.png").read_bytes() == b"\x89PNG\r\n\x00\xff"
    assert (published / "map/m.json").is_file()
    (workspace / "results/bench/one.json").unlink()
    err = one_line_error(capsys, ["--profile", "demo", "--root", str(tmp_path)], publish)
    assert "one.json does not exist: run `make profile PROFILE=demo` first" in err


def test_publish_takes_the_trials_of_the_profiles_studies_beside_its_runs(tmp_path):
    """The tune stage writes each trial's results file under results/tune/<pair>/trials/: published as
    tune/<pair>/trials/<number>, with the runs."""
    workspace = tmp_path / "workspaces/sigmoid/results"
    write_runs(workspace / "runs", {"qwen-ar-bfloat16": run_result("cnn_dailymail", 0, 1.0)})
    write_runs(workspace / "tune/qwen/trials", {"00000": run_result("cnn_dailymail", 4, 1.1),
                                                "00001": run_result("cnn_dailymail", 4, 1.5)})
    (workspace / "tune/qwen-pareto.json").write_text("{}")          # not a results file: not published
    assert publish.main(["--profile", "sigmoid", "--root", str(tmp_path)]) == 0
    runs = json.loads((tmp_path / "results/published/sigmoid/summary.json").read_text())["runs"]
    assert set(runs) == {"qwen-ar-bfloat16", "tune/qwen/trials/00000", "tune/qwen/trials/00001"}
    assert runs["tune/qwen/trials/00001"]["metrics"]["speedup"] == 1.5


# ---------------------------------------------------------------------------------------------- README's headline

def test_the_headline_picks_the_fastest_published_run_of_each_question_on_one_cpu(tmp_path):
    """Each row is the published run with the highest median paired speedup among those that answer it, on the
    headline's CPU: a faster run on another CPU, a flagged run, or one on fewer articles is passed over."""
    from pipeline.analysis import headline

    def run(drafter, gamma, speedup, *, limit=24, cpu="AMD EPYC 7B13", flagged=False, quant="int4"):
        result = run_result("cnn_dailymail", gamma, speedup, drafter=drafter)
        result["config"].update({"dtype": "bfloat16", "limit": limit, "draft_quant": quant, "draft_vocab": None,
                                 "draft_confidence": 0.0})
        result["metrics"]["flagged"] = flagged
        result["metrics"]["greedy_agreement"] = {"reference": "the paired γ = 0 loop", "samples": 2, "identical": 2,
                                                 "shared_prefix_tokens": 16, "tokens": 16, "shared_prefix_share": 1.0}
        result["provenance"]["device"]["cpu_model"] = cpu
        return result

    pair = {"lookup-g8": run("prompt-lookup", 8, 2.0), "lookup-g12": run("prompt-lookup", 12, 2.2),
            "lookup-xeon": run("prompt-lookup", 12, 2.9, cpu="Intel(R) Xeon(R) Processor"),
            "lookup-3": run("prompt-lookup", 12, 3.1, limit=3), "suffix": run("suffix", 16, 2.3, flagged=True),
            "model-g6": run(None, 6, 1.7), "model-g5": run(None, 5, 1.6)}
    write_runs(tmp_path / "workspaces/pair/results/runs", pair)
    write_runs(tmp_path / "workspaces/pair-spec-bench/results/runs",
               {"coding-g5": run("lookup-model", 5, 2.05), "ar": run(None, 0, 1.0)})
    sigmoid = {"qwen-ar-t1-bfloat16": run_result("cnn_dailymail", 0, 1.0, quality=0.22),  # 8 articles, γ 4
               **{f"qwen-{rule}-g4-t1-bfloat16": run_result("cnn_dailymail", 4, s, quality=q)
                  for rule, s, q in (("exact", 1.3, 0.14), ("sigmoid", 1.5, 0.17), ("typical", 1.7, 0.2))}}
    write_runs(tmp_path / "workspaces/pair-sigmoid/results/runs", sigmoid)
    for profile in ("pair", "pair-spec-bench", "pair-sigmoid"):
        assert publish.main(["--profile", profile, "--root", str(tmp_path)]) == 0
    shutil.copytree(ROOT / "kernels/results", tmp_path / "kernels/results")
    text = headline.render(tmp_path)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    assert rows[0] == headline.HEADER
    assert rows[1][1:3] == ["prompt lookup, γ 12", "2.20 [2.15, 2.30]"]      # not the Xeon's, 3 articles' or flagged
    assert rows[2][1:3] == ["int4 draft, γ 6", "1.70 [1.65, 1.80]"]
    assert rows[3][1] == "prompt lookup then the int4 draft, γ 5" and rows[3][0] == "Spec-Bench coding (2 turns)"
    assert rows[5][:2] == ["The paper's sigmoid at T = 1 (8 articles)", "sigmoid, γ 4"]
    assert rows[5][4] == "ROUGE-L 0.170 (target alone 0.220)"
    assert "the fastest lossless way" in text and "prompt lookup at γ 12 (2.20x)" in " ".join(text.split())
    for name in ("lookup-g8", "lookup-g12", "lookup-3", "suffix"):       # nothing left on that CPU: one line
        (tmp_path / f"workspaces/pair/results/runs/{name}.json").unlink()
    assert publish.main(["--profile", "pair", "--root", str(tmp_path)]) == 0
    with pytest.raises(SpecsweepError, match="no published run on AMD EPYC answers 'the best lossless setting"):
        headline.render(tmp_path)
