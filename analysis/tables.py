"""Every results file the pipeline writes, in one tidy pandas table (one row per run, trial or timing).

``kind`` says what a row is:
  run        a results/runs JSON with γ > 0                       (pipeline.results_table.result_row)
  baseline   an AR (γ = 0) results JSON: results/runs, or a study's own baseline-<dtype>.json
  trial      an Optuna trial: its results JSON when the file is there, else the values the study stored
  latency    one timing row of a verify-step benchmark: ``specsweep bench kernels`` (kernels/results/*.json,
             GPU) or ``specsweep bench samplers`` (results/bench/samplers-*.json)
  loop       one temperature of a decoding-loop benchmark, ``specsweep bench engine``
             (results/bench/engine-*.json): our loops over HF's, paired ratios
  lossless   one (rule, dtype) of the losslessness benchmark, ``specsweep bench lossless``
             (results/bench/lossless-*.json): greedy match rate against the target alone, sampled p-values

Optuna studies are read from their files only: ``<pair>-pareto.json`` beside the study folder, and the SQLite
``<task>/study.db`` opened read-only when present. Every row records its ``source`` file, ``date``, ``host``,
``device_name`` and whether it was measured on a CPU only (``cpu_only``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.objectives import QUALITY
from pipeline.result import read_result
from pipeline.results_table import device_label, result_row
from pipeline.rules import param_names

from .serving import load_serving

LATENCY_COLUMNS = ("benchmark", "impl", "B", "V", "median_s", "floor_s")


def load_all(runs_table, tune: str | os.PathLike | None = None, kernels: str | os.PathLike | None = None,
             bench: str | os.PathLike | None = None):
    """The runs table (from :func:`pipeline.results_table.load_runs`) plus trials and benchmark timings, one table.

    Missing folders are fine (nothing to add); a folder that exists but holds unreadable JSON is an error."""
    import pandas as pd

    parts = [runs_table]
    if tune is not None:
        parts.append(load_trials(tune))
    if kernels is not None:
        parts.append(load_latency(kernels, "kernels"))
    if bench is not None:
        parts.append(load_latency(bench, "samplers"))
        parts.append(load_loops(bench))
        parts.append(load_lossless(bench))
        parts.append(load_serving((p, d, _where(p, d)) for p, d in _bench_files(bench, "serve-*.json", "serve")))
    parts = [p for p in parts if p is not None and not p.empty]
    if not parts:
        return pd.DataFrame(columns=["run", "kind"])
    return pd.concat(parts, ignore_index=True, sort=False)


# ---------------------------------------------------------------------------------------------- Optuna studies

def load_trials(tune_dir: str | os.PathLike):
    """Rows for every trial of every study under ``tune_dir`` (``<pair>-pareto.json`` + ``<task>/``)."""
    import pandas as pd

    tune_dir = Path(tune_dir)
    rows: list[dict] = []
    if not tune_dir.is_dir():
        return pd.DataFrame(rows)
    for front_path in sorted(tune_dir.glob("*-pareto.json")):
        front = _read_json(front_path)
        name = front_path.name[: -len("-pareto.json")]
        study_dir = tune_dir / name
        best = {t.get("number") for t in front.get("best_trials", [])}
        trials = _trials_from_db(study_dir / "study.db", front.get("study"))
        if trials is None:  # no SQLite study here (e.g. a PostgreSQL one): the front is what the files hold
            trials = [{"number": t.get("number"), "state": "COMPLETE", "values": t.get("values") or {},
                       "params": t.get("params") or {}, "results": t.get("results")}
                      for t in front.get("best_trials", [])]
        study_rows = [_trial_row(t, front, front_path, study_dir, best) for t in trials]
        _fill_from_siblings(study_rows)
        rows += study_rows
        for path in sorted(study_dir.glob("baseline-*.json")):  # a baseline the study measured itself
            result = read_result(path)
            if result is not None:
                rows.append({**result_row(result, path, f"{name}/{path.stem}"), "study": front.get("study")})
    return pd.DataFrame(rows)


def _trials_from_db(db: Path, study_name: str | None) -> list[dict] | None:
    """All trials of the SQLite study at ``db``, opened read-only; None when there is no such file."""
    if not db.is_file():
        return None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///file:{db.resolve()}?mode=ro&uri=true"
    try:
        names = [s.study_name for s in optuna.get_all_study_summaries(url)]
        name = study_name if study_name in names else (names[0] if len(names) == 1 else None)
        if name is None:
            raise SpecsweepError(f"{db}: holds studies {names}, none named {study_name!r}")
        study = optuna.load_study(study_name=name, storage=url)
        trials = study.get_trials(deepcopy=False)
    except SpecsweepError:
        raise
    except Exception as e:
        raise SpecsweepError(f"{db}: cannot read the Optuna study ({' '.join(str(e).split())[:120]})") from None
    return [{"number": t.number, "state": t.state.name,
             "values": dict(zip(("speedup", "quality"), t.values)) if t.values else {},
             "params": dict(t.params), "results": t.user_attrs.get("results")} for t in trials]


def _fill_from_siblings(rows: list[dict]) -> None:
    """A trial known only from the study (no results file) takes task, pair and device from a sibling trial that
    has one, and its raw quality score (ROUGE-L, or WER = -quality) from its stored objective."""

    full = next((r for r in rows if r.get("task") is not None), None)
    for r in rows:
        if r.get("task") is not None or full is None:
            continue
        for key in ("task", "target", "draft", "device", "resolved_device", "device_name", "cpu_only", "host",
                    "temperature", "backend"):
            r.setdefault(key, full.get(key))
            if r[key] is None:
                r[key] = full.get(key)
        if r["task"] in QUALITY and r.get("quality") is not None:
            key, sign = QUALITY[r["task"]]
            r[key] = sign * r["quality"]


def _trial_row(trial: dict, front: dict, front_path: Path, study_dir: Path, best: set) -> dict:
    """A trial's row: from its results JSON when that file exists, else from the study's stored values."""
    number = trial["number"]
    candidates = [Path(p) for p in (trial.get("results"),) if p]
    candidates.append(study_dir / "trials" / f"{number:05d}.json")
    path = next((p for p in candidates if p.is_file()), None)
    result = read_result(path) if path is not None and trial["state"] == "COMPLETE" else None
    name = f"{front.get('study') or study_dir.name}#{number}"
    if result is not None:
        row = result_row(result, path, name)
        row["kind"] = "trial"
    else:
        params, values = trial.get("params", {}), trial.get("values", {})
        row = {"run": name, "kind": "trial", "sampler": params.get("sampler"), "gamma": params.get("gamma"),
               "dtype": params.get("dtype"), **{k: params.get(k) for k in param_names()},
               "speedup": values.get("speedup"), "quality": values.get("quality"), "source": str(front_path)}
    row.update({"study": front.get("study"), "trial": number, "trial_state": trial["state"],
                "on_study_front": number in best})
    return row


# ---------------------------------------------------------------------------------------------- benchmarks

def load_latency(folder: str | os.PathLike, benchmark: str):
    """Timing rows from every ``specsweep bench {kernels,samplers}`` JSON in ``folder`` (none: empty table)."""
    import pandas as pd

    rows: list[dict] = []
    pattern = "*.json" if benchmark == "kernels" else f"{benchmark}-*.json"
    for path, data in _bench_files(folder, pattern, benchmark):
        floor = data.get("floor", {})
        for r in data.get("results", []):
            impl, sampler = _impl(r, benchmark)
            rows.append({"run": f"{path.stem}:{impl}:B{r['B']}:g{r['gamma']}:V{r['V']}:{r['dtype']}",
                         "kind": "latency", "benchmark": benchmark, "impl": impl, "sampler": sampler,
                         "backend": r.get("backend") or r.get("impl"), "B": r["B"], "gamma": r["gamma"],
                         "V": r["V"], "dtype": r["dtype"], "median_s": r["median_s"], "floor_s": r.get("floor_s"),
                         "launch_floor_s": floor.get("empty_launch_s"), **_where(path, data)})
    return pd.DataFrame(rows)


def load_loops(folder: str | os.PathLike):
    """One row per (``specsweep bench engine`` JSON in ``folder``, temperature): the pair, γ, the paired ratios
    of our loops over HF's (speculative over assisted, autoregressive over plain), the ceiling where measured,
    and both speculative loops' acceptance."""
    import pandas as pd

    rows: list[dict] = []
    for path, data in _bench_files(folder, "engine-*.json", "engine"):
        settings = data.get("settings", {})
        by = {(r["loop"], r["temperature"]): r for r in data.get("results", [])}
        for key, goal in data.get("goals", {}).items():
            temperature = float(key.split("=", 1)[1])
            ours, hf = by.get(("ours_speculative", temperature), {}), by.get(("hf_assisted", temperature), {})
            rows.append({"run": f"{path.stem}:T{temperature:g}", "kind": "loop", "benchmark": "engine",
                         "pair": settings.get("target"), "gamma": settings.get("gamma"),
                         "temperature": temperature, "new_tokens": ours.get("new_tokens"),
                         "repeats": settings.get("repeats"),
                         "speculative_over_hf": goal.get("speculative_over_hf_assisted"),
                         "autoregressive_over_hf": goal.get("autoregressive_over_hf_plain"),
                         "ceiling_over_hf": goal.get("speculative_ceiling_over_hf_assisted"),
                         "acceptance_ours": ours.get("acceptance_rate"), "acceptance_hf": hf.get("acceptance_rate"),
                         **_where(path, data)})
    return pd.DataFrame(rows)


def load_lossless(folder: str | os.PathLike):
    """One row per (``specsweep bench lossless`` JSON in ``folder``, rule, dtype): the greedy match rate against
    the target alone and the first divergences ("p<prompt>@<position>"), the sampled tests' smallest p-values
    (first token, first two tokens) and the verdict."""
    import pandas as pd

    rows: list[dict] = []
    for path, data in _bench_files(folder, "lossless-*.json", "lossless"):
        settings = data.get("settings", {})
        for r in data.get("results", []):
            greedy, sampled = r.get("greedy") or {}, r.get("sampled") or {}
            tests = sampled.get("per_prompt", [])
            diverged = [p for p in greedy.get("per_prompt", []) if not p.get("identical")]
            rows.append({"run": f"{path.stem}:{r.get('label')}:{r.get('dtype')}", "kind": "lossless",
                         "benchmark": "lossless", "sampler": r.get("rule"), "preset": r.get("preset"),
                         "rule_label": r.get("label"), "registry_lossless": r.get("lossless"),
                         "dtype": r.get("dtype"), "pair": settings.get("target"), "gamma": settings.get("gamma"),
                         "greedy_match_rate": greedy.get("match_rate"), "greedy_identical": greedy.get("identical"),
                         "greedy_prompts": greedy.get("prompts"), "greedy_skipped": r.get("greedy_skipped"),
                         "first_divergences": ", ".join(f"p{p['prompt']}@{p['first_divergence']['position']}"
                                                        for p in diverged) if greedy else None,
                         "p_first_token": min((t["first_token"]["p_value"] for t in tests), default=None),
                         "p_first_two": min((t["first_two_tokens"]["p_value"] for t in tests), default=None),
                         "samples": sampled.get("samples"), "threshold": sampled.get("threshold"),
                         "verdict": sampled.get("verdict"), **_where(path, data)})
    return pd.DataFrame(rows)


def _impl(row: dict, benchmark: str) -> tuple[str, str]:
    """(implementation label, sampler) of a timing row; HF's _speculative_sampling is labelled ``hf``."""
    if benchmark == "kernels":
        impl = row["impl"]
        return (impl if impl in ("hf", "flashinfer+softmax") else f"{row['sampler']} ({impl})"), row["sampler"]
    if row["sampler"] == "hf":
        return "hf", "exact"
    return f"{row['sampler']} ({row['backend']})", row["sampler"]


def _bench_files(folder: str | os.PathLike, pattern: str, benchmark: str):
    """(path, data) of every JSON in ``folder`` matching ``pattern`` that ``specsweep bench <benchmark>`` wrote
    (other JSON is skipped; no folder: nothing)."""
    folder = Path(folder)
    for path in sorted(folder.glob(pattern)) if folder.is_dir() else ():
        data = _read_json(path)
        if isinstance(data, dict) and data.get("benchmark") == benchmark:
            yield path, data


def _where(path: Path, data: dict) -> dict:
    """Where a benchmark row came from: its file, date, host and device (and whether it was a CPU only)."""
    prov = data.get("provenance", {})
    device = prov.get("device", {})
    return {"source": str(path), "date": prov.get("date"), "host": prov.get("host"), "device": device.get("device"),
            "device_name": device_label(device), "cpu_only": not str(device.get("device", "")).startswith("cuda")}


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecsweepError(f"{path}: not readable JSON ({' '.join(str(e).split())[:120]})") from None
