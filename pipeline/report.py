"""``specsweep report``'s writer: the runs table (pipeline/results_table.py), with each run's speedup against the
target alone in its fastest measured dtype (pipeline.analysis.speed_reference), as reports/runs.csv and a short
reports/summary.md, then the analysis report (pipeline.analysis, installed from analysis/) on top of it.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from pipeline.analysis.build import build_report
from pipeline.analysis.recommend import with_speed_reference
from pipeline.analysis.tables import load_all
from pipeline.errors import SpecsweepError
from pipeline.io import write_text_atomic
from pipeline.results_table import load_runs
from pipeline.rules import SPEED_ONLY_NOTE


def summary_markdown(table) -> str:
    """A short Markdown summary: one section per task, one line per run, best speedup against the common speed
    reference first (``speedup_vs_reference``: the paired speedup where a task and target ran in one dtype)."""
    lines = ["# specsweep runs", "", f"{len(table)} run(s).", ""]
    if table.empty:
        return "\n".join(lines) + "\n"
    cols = [c for c in ("run", "sampler", "backend", "gamma", "dtype", "tokens_per_second", "speedup",
                        "speedup_vs_reference", "acceptance_rate", "quality", "tradeoff") if c in table.columns]
    for task, group in table.groupby("task", sort=True, dropna=False):
        lines += [f"## {task}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        ordered = group.sort_values("speedup_vs_reference", ascending=False, na_position="last")
        for _, row in ordered.iterrows():
            lines.append("| " + " | ".join(_fmt(row[c]) for c in cols) + " |")
        lines.append("")
    if "speed_only" in table.columns and table["speed_only"].eq(True).any():
        lines += [f"sampler synthetic: {SPEED_ONLY_NOTE}; its quality is not shown.", ""]
    return "\n".join(lines) + "\n"


def write_report(runs: str | os.PathLike, out_dir: str | os.PathLike, *, tune: str | os.PathLike | None = None,
                 kernels: str | os.PathLike | None = None, bench: str | os.PathLike | None = None,
                 max_quality_loss: float = 0.01, analysis: bool = True,
                 profile: str | os.PathLike | None = None) -> tuple[Path, Path, int]:
    """Write ``runs.csv`` and ``summary.md`` (atomically) into ``out_dir`` and, with ``analysis``, the full report
    (results.csv, report.md, report.html, figures/); returns the runs table's two paths and its row count.
    ``profile``: the pipeline's params file, whose ``missing:`` list the report states (:func:`profile_missing`)."""
    missing = profile_missing(profile) if profile is not None else []
    table = with_speed_reference(load_runs(runs))
    out_dir = Path(out_dir)
    csv_path = write_text_atomic(out_dir / "runs.csv", table.to_csv(index=False))
    md_path = write_text_atomic(out_dir / "summary.md", summary_markdown(table))
    if analysis:
        full = load_all(table, tune=tune, kernels=kernels, bench=bench)
        build_report(full, out_dir, max_quality_loss=max_quality_loss, missing=missing)
    return csv_path, md_path, len(table)


def profile_missing(path: str | os.PathLike) -> list[dict]:
    """A profile's ``missing:`` list (what it does not run yet: ``[{"what": ..., "why": ...}]``; none when absent).
    A missing file or a malformed list is a one-line error."""
    path = Path(path)
    try:
        params = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SpecsweepError(f"--profile {path}: cannot read it as YAML ({e.__class__.__name__}): give the "
                             "pipeline's params file") from None
    items = params.get("missing") or [] if isinstance(params, dict) else None
    if not isinstance(items, list) or not all(isinstance(m, dict) and {"what", "why"} <= set(m) for m in items):
        raise SpecsweepError(f"--profile {path}: `missing:` must be a list of {{what, why}} entries")
    return [{"what": str(m["what"]), "why": str(m["why"]).strip()} for m in items]


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
