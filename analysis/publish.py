"""`make publish PROFILE=name`: a profile's run results, made small, into results/published/<profile>/.

``dvc repro`` of a profile writes one results file per run under its runs folder (results/runs for the default
profile, workspaces/<name>/results/runs for ``make profile PROFILE=name``; pipeline/result.py); they are large (every
sample's text) and not committed. The outputs of its benchmark stages (params ``benchmarks``) are copied as they are
into results/published/<profile>/results/bench/. This writes the figures the tables of README.md and docs/ read from
the runs, and from the trials of its Optuna studies (as ``tune/<pair>/trials/<number>``), into one file,
results/published/<profile>/summary.json:

    published   what the file is, and the command that writes it
    profile, source
    date        when it was published (UTC); measured: the first and last run's own dates, their devices and the
                CPUs they ran on (``machines``)
    version, commit, dirty    specsweep's version and the checkout's commit (dirty: tracked files had changes)
    machine     {"cpu": model name, "cores", "gpus": [names]} of the machine that published it
    runs        {run: record}, run = the results file's path under the runs folder without ".json"
                (e.g. "text-main-float32/text-exact-torch-g2-float32"); a record holds the run's settings
                (RECORD_CONFIG) and its acceptance rule's parameters (``params``, the values it ran with), figures
                (RECORD_METRICS; a Spec-Bench run's per group and per category too, RECORD_CATEGORY), numeric
                quality scores, its speed measurement's repeats,
                interval coverage, flags and what idle OpenMP workers did (``omp_wait``,
                pipeline/env_info.py), and where, when and at which commit it ran (``ran``: its device, the CPU's
                model name, date, commit)

With ``--keep`` the records of the previous summary whose results files the runs folder lacks stay in it as they
were: a profile whose runs were added at another time, in another checkout, than the rest. ``kept`` then lists them
by the commit they were published at: [{"commit", "dirty", "runs": [run, ...]}, ...]. A record's own ``ran.commit``
(the code that ran it, from its results file) says more where it is known; the top-level commit is the checkout's
when it was published.

``python -m pipeline.analysis.docs`` renders the tables from it (analysis/run_tables.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import sys
from pathlib import Path

import yaml

from pipeline.env_info import git_commit, machine, omp_wait_label, versions
from pipeline.errors import SpecsweepError
from pipeline.io import atomic_file, write_json_atomic
from pipeline.result import read_result
from pipeline.results_table import device_label
from pipeline.rules import RULES

WORKSPACES = "workspaces"
"""Where `make profile PROFILE=name` runs a profile other than the default one: <WORKSPACES>/<name>/ (Makefile)."""
FOLDER = "results/published"
RECORD_CONFIG = ("task", "target", "draft", "drafter", "sampler", "backend", "gamma", "draft_schedule",
                 "draft_confidence", "draft_tree", "draft_vocab", "draft_quant", "target_quant", "engine", "dtype",
                 "temperature", "limit", "max_new_tokens", "max_prompt_tokens", "threads", "seed", "device")
RECORD_METRICS = ("speedup", "speedup_ci_low", "speedup_ci_high", "decode_speedup", "decode_speedup_ci_low",
                  "decode_speedup_ci_high", "unpaired_speedup", "flagged", "acceptance_rate", "acceptance_rate_chars",
                  "iid_alpha", "mean_accepted_tokens", "cost_ratio", "verify_cost_ratio", "theoretical_speedup",
                  "predicted_speedup", "tokens_per_second", "new_tokens", "wall_time_s", "peak_memory_mb")
RECORD_CATEGORY = ("questions", "samples", "timed_samples", "new_tokens", "mean_accepted_tokens", "acceptance_rate",
                   "identical_outputs", "prefix_agreement", "speedup", "speedup_ci_low", "speedup_ci_high",
                   "speedup_ci_coverage")
"""A Spec-Bench run's figures per leaderboard group (``by_group``) and per category (``by_category``):
pipeline/categories.py."""


def summary_path(profile: str) -> str:
    """The published summary of ``profile``, from the repository root."""
    return f"{FOLDER}/{profile}/summary.json"


def record(result: dict) -> dict:
    """The published record of one results file (pipeline/result.py's RunResult)."""
    measurement = result.get("measurement") or {}
    provenance = result.get("provenance") or {}
    agreement = result["metrics"].get("greedy_agreement") or {}
    # the run's tokens, sample by sample in id order: two runs emitted the same tokens when their digests match
    tokens = json.dumps([s.get("token_ids") for s in sorted(result.get("samples") or [], key=lambda s: str(s["id"]))])
    config = result["config"]
    rule = RULES.get(config.get("sampler"))
    per = {key: {name: {k: figures.get(k) for k in RECORD_CATEGORY} for name, figures in result["metrics"][key].items()}
           for key in ("by_group", "by_category") if result["metrics"].get(key)}
    params = rule.effective({k: config.get(k) for k in rule.param_names}, config.get("preset")) if rule else {}
    return {"config": {k: config.get(k) for k in RECORD_CONFIG}, "params": params,
            "packed_weights": packed_target(result),
            # which weight-only kernel a quantised draft ran ("int4_linear": ours; "torch"); None: none, or a run from
            # before runs recorded it (torch's)
            "quant_kernel": ((result.get("resolved") or {}).get("quant_kernel") or {}).get("draft"),
            # which kernel the packed target ran over a few rows ("bf16_linear": ours; "onednn"); None: not packed,
            # or a run from before runs recorded it (oneDNN's)
            "few_rows_kernel": ((result.get("resolved") or {}).get("few_rows_kernel") or {}).get("target"),
            # which kernel ran the draft's one-token forwards in one call ("int4_layers"); None: none, or a run from
            # before runs recorded it (llama.py's forward, operator by operator)
            "row_kernel": ((result.get("resolved") or {}).get("row_kernel") or {}).get("draft"),
            # the bytes of each model's own tensors as run (--target-quant's quantised weights included); None: a
            # run from before runs recorded it
            "model_bytes": (result.get("resolved") or {}).get("model_bytes"),
            "metrics": {k: result["metrics"].get(k) for k in RECORD_METRICS}, **per,
            "greedy_agreement": {k: v for k, v in agreement.items() if k != "per_sample"} or None,
            "tokens_sha256": hashlib.sha256(tokens.encode()).hexdigest(),
            "quality": {k: v for k, v in (result.get("quality") or {}).items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)},
            "measurement": {"repeats": measurement.get("repeats"),
                            "samples_per_repeat": measurement.get("samples_per_repeat"),
                            "coverage": (measurement.get("speedup") or {}).get("ci_coverage"),
                            "flags": measurement.get("flags") or [],
                            "omp_wait": (omp_wait_label((measurement.get("threads") or {}).get("env") or {})
                                         if measurement.get("threads") else None)},
            "ran": {"date": provenance.get("date"),
                    "device": device_label(provenance.get("device"), (result.get("resolved") or {}).get("device")),
                    # the CPU's model name; a results file written before runs recorded it was run by the machine
                    # that publishes it
                    "machine": (provenance.get("device") or {}).get("cpu_model") or machine()["cpu"],
                    # the code that ran it (None in results files written before runs recorded it)
                    **{k: (provenance.get("commit") or {}).get(k) for k in ("commit", "dirty")}}}


def packed_target(result: dict) -> bool | None:
    """Whether the run's target multiplied packed weights (pipeline/decoding/static/packed.py): what the run resolved,
    or for a run that recorded only its settings, --packed-weights with our engine on a CPU; None before the
    setting existed."""
    resolved = (result.get("resolved") or {}).get("packed_weights")
    if resolved is not None:
        return bool(resolved.get("target"))
    config = result["config"]
    if "packed_weights" not in config:
        return None
    return bool(config["packed_weights"]) and config.get("engine") == "specsweep" and config.get("device") == "cpu"


def profile_file(profile: str) -> str:
    """The params file of ``profile``: params.yaml for the default profile, else params.<profile>.yaml."""
    return "params.yaml" if profile == "default" else f"params.{profile}.yaml"


def workspace(profile: str, workspaces: str = WORKSPACES) -> str:
    """The folder ``profile``'s `dvc repro` runs in, from the repository root ('.' for the default profile)."""
    return "." if profile == "default" else f"{workspaces}/{profile}"


def profile_source(profile: str, root: Path, workspaces: str = WORKSPACES) -> tuple[str, str, str]:
    """(its runs folder from ``root``, the command that fills it, what the profile is: its params file's first
    comment line where the file is there) of ``profile``."""
    params = Path(root) / profile_file(profile)
    first = next((line.lstrip("# ").strip() for line in params.read_text(encoding="utf-8").splitlines()
                  if line.startswith("#")), "") if params.is_file() else ""
    what = f"the {profile} profile ({params.name}" + (f": {first.rstrip(':.,')})" if first else ")")
    command = "make" if profile == "default" else f"make profile PROFILE={profile}"
    runs_dir = "results/runs" if profile == "default" else f"{workspace(profile, workspaces)}/results/runs"
    return runs_dir, command, what


def benchmark_outs(profile: str, root: Path) -> list[str]:
    """The outputs of the profile's benchmark stages (params ``benchmarks``, dvc.yaml's bench stage), from its
    workspace: what `make publish` copies into results/published/<profile>/."""
    path = Path(root) / profile_file(profile)
    params = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}
    return [bench["out"] for bench in (params.get("benchmarks") or {}).values()]


def publish_benchmarks(profile: str, root: Path, workspaces: str = WORKSPACES) -> list[Path]:
    """Copy the profile's benchmark outputs from its workspace into results/published/<profile>/, under the same
    relative paths (results/bench/...); an output its stage has not written is a one-line error, raised before
    anything is copied."""
    base = Path(root) / workspace(profile, workspaces)
    sources = [base / out for out in benchmark_outs(profile, root)]
    for src in sources:
        if not src.exists():
            raise SpecsweepError(f"{src} does not exist: run `make profile PROFILE={profile}` first")
    copied = []
    for src in sources:
        for f in sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else [src]:
            dest = Path(root) / FOLDER / profile / f.relative_to(base)
            with atomic_file(dest, "wb") as out:       # as it is: JSON, or a figure beside it
                out.write(f.read_bytes())
            copied.append(dest)
    return copied


def summary(profile: str, root: Path, keep: bool = False, workspaces: str = WORKSPACES) -> dict:
    """The published summary of ``profile`` from its runs folder under ``root``; ``keep``: with the previous summary's
    records of runs the folder lacks (see the module docstring)."""
    runs_dir, command, what = profile_source(profile, root, workspaces)
    folder = Path(root) / runs_dir
    if not folder.is_dir():
        raise SpecsweepError(f"{runs_dir} does not exist: run `{command}` first, then `make publish PROFILE={profile}`")
    runs = {}
    for path in sorted(folder.rglob("*.json")):
        result = read_result(path)
        if result is not None:      # else another kind of JSON in the folder
            runs[path.relative_to(folder).with_suffix("").as_posix()] = record(result)
    # the tune stage's trials (results/tune/<pair>/trials/<number>.json beside the runs folder), as tune/<pair>/...
    tune = folder.parent / "tune"
    for path in sorted(tune.glob("*/trials/*.json")):
        result = read_result(path)
        if result is not None:
            runs["tune/" + path.relative_to(tune).with_suffix("").as_posix()] = record(result)
    if not runs:
        raise SpecsweepError(f"{runs_dir} holds no results files: run `{command}` first")
    kept: dict[tuple, list[str]] = {}
    previous = Path(root) / summary_path(profile)
    if keep and previous.is_file():
        before = json.loads(previous.read_text(encoding="utf-8"))
        for name, rec in before["runs"].items():
            if name not in runs:
                # a record from before runs recorded their CPU: the machine that published it ran it
                runs[name] = {**rec, "ran": {**rec["ran"], "machine": rec["ran"].get("machine")
                                             or (before.get("machine") or {}).get("cpu")}}
                # a run the previous summary had kept itself keeps the commit it was published at
                source = next((k for k in before.get("kept", ()) if name in k["runs"]), before)
                kept.setdefault((source["commit"], source["dirty"]), []).append(name)
        runs = dict(sorted(runs.items()))
    dates = sorted(r["ran"]["date"] for r in runs.values() if r["ran"]["date"])
    commit = git_commit(root, ignore=(FOLDER,))   # publishing rewrites the published files: not a local change
    return {"published": f"the runs of {what}, as `{command}` wrote them in {runs_dir}: one record per results file, "
                         f"made by `make publish PROFILE={profile}`; the tables of README.md and docs/ read it "
                         "(`make docs`)",
            "profile": profile, "source": runs_dir,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "measured": {"first": dates[0] if dates else None, "last": dates[-1] if dates else None,
                         "devices": sorted({r["ran"]["device"] for r in runs.values()}),
                         "machines": sorted({r["ran"].get("machine") or machine()["cpu"] for r in runs.values()})},
            "version": versions().get("specsweep"), "commit": commit["commit"], "dirty": commit["dirty"],
            "machine": machine(),
            **({"kept": [{"commit": c, "dirty": d, "runs": names} for (c, d), names in kept.items()]} if kept else {}),
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.analysis.publish", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="default",
                        help="default (params.yaml), or NAME for params.NAME.yaml (default: default)")
    parser.add_argument("--workspaces", default=WORKSPACES,
                        help=f"the folder of the profiles' workspaces (default: {WORKSPACES}; Makefile: WORKSPACES)")
    parser.add_argument("--root", default=".", help="the repository root (default: the working directory)")
    parser.add_argument("--keep", action="store_true", help="keep the previous summary's records of runs the runs "
                                                             "folder lacks")
    args = parser.parse_args(argv)
    try:
        data = summary(args.profile, Path(args.root), args.keep, args.workspaces)
        copied = publish_benchmarks(args.profile, Path(args.root), args.workspaces)
    except SpecsweepError as e:
        print(f"publish: error: {e}", file=sys.stderr)
        return 2
    out = write_json_atomic(Path(args.root) / summary_path(args.profile), data)
    for path in copied:
        print(f"copied {path}")
    kept = sum(len(k["runs"]) for k in data.get("kept", ()))
    kept = f", {kept} kept from the previous summary" if kept else ""
    print(f"wrote {out} ({len(data['runs'])} runs{kept}); then `make docs` and commit both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
