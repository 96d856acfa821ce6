"""The runs table: every results JSON under a folder, one tidy row per run (pandas), plus a short summary.

Minimal on purpose: ``specsweep report`` writes reports/runs.csv and reports/summary.md; the analysis report
(plots, Pareto fronts, kernel comparisons) builds on :func:`load_runs`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.io import write_text_atomic

# Config columns first (what was run), then the metrics (what it measured), then quality scores.
CONFIG_COLUMNS = ("task", "target", "draft", "sampler", "backend", "gamma", "dtype", "temperature", "alpha",
                  "beta", "preset", "engine", "batch_size", "max_new_tokens", "limit", "seed", "device")
METRIC_COLUMNS = ("tokens_per_second", "speedup", "acceptance_rate", "mean_accepted_tokens",
                  "theoretical_speedup", "cost_ratio", "wall_time_s", "new_tokens", "peak_memory_mb")


def load_runs(folder: str | os.PathLike):
    """A DataFrame with one row per ``*.json`` specsweep results file in ``folder`` (sorted by file name)."""
    import pandas as pd

    from pipeline.tune import quality_value, tradeoff

    folder = Path(folder)
    if not folder.is_dir():
        raise SpecsweepError(f"--runs {folder} is not a folder: run `dvc repro` or `specsweep run --out` first")
    rows = []
    for path in sorted(folder.glob("*.json")):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise SpecsweepError(f"{path}: not readable JSON ({' '.join(str(e).split())[:120]})") from None
        if not isinstance(result, dict) or result.get("specsweep_results") != 1:
            continue  # another kind of JSON in the folder
        cfg, metrics, quality = result["config"], result["metrics"], result.get("quality", {})
        row = {"run": path.stem}
        row.update({k: cfg.get(k) for k in CONFIG_COLUMNS})
        row["resolved_device"] = result.get("resolved", {}).get("device")
        row.update({k: metrics.get(k) for k in METRIC_COLUMNS})
        row.update({k: v for k, v in quality.items() if isinstance(v, (int, float))})
        row["quality"] = quality_value(cfg.get("task"), quality)
        row["tradeoff"] = tradeoff(result)
        row["samples"] = len(result.get("samples", []))
        rows.append(row)
    return pd.DataFrame(rows)


def summary_markdown(table) -> str:
    """A short Markdown summary: one section per task, one line per run, best speedup first."""
    lines = ["# specsweep runs", "", f"{len(table)} run(s).", ""]
    if table.empty:
        return "\n".join(lines) + "\n"
    cols = [c for c in ("run", "sampler", "backend", "gamma", "dtype", "tokens_per_second", "speedup",
                        "acceptance_rate", "quality", "tradeoff") if c in table.columns]
    for task, group in table.groupby("task", sort=True, dropna=False):
        lines += [f"## {task}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        ordered = group.sort_values("speedup", ascending=False, na_position="last")
        for _, row in ordered.iterrows():
            lines.append("| " + " | ".join(_fmt(row[c]) for c in cols) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def write_report(runs: str | os.PathLike, out_dir: str | os.PathLike) -> tuple[Path, Path, int]:
    """Write ``runs.csv`` and ``summary.md`` (atomically) into ``out_dir``; returns their paths and the row count."""
    table = load_runs(runs)
    out_dir = Path(out_dir)
    csv_path = write_text_atomic(out_dir / "runs.csv", table.to_csv(index=False))
    md_path = write_text_atomic(out_dir / "summary.md", summary_markdown(table))
    return csv_path, md_path, len(table)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
