"""The report's schedule section: per tuned study, the setting chosen per (batch size, prompt-length bucket), how sure
each choice is (every candidate's median, spread and interval), and fixed against adaptive draft length.

It reads the schedule files `specsweep tune` writes next to its fronts (pipeline/tuning/schedule.py), found beside the
results files the report's table came from: a ``*schedule.json`` of kind "specsweep-schedule" in the folder of a
row's source or up to three folders above it (so ``results/tune/text-schedule.json`` is found from the study's trials
in ``results/tune/text/trials/``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.tuning.schedule import KIND, Cell, describe_settings, draft_ceiling, read_schedule

from .document import Heading, Para, Table

SEARCH_UP = 3   # folders above a source that may hold its study's schedule


def find_schedules(table) -> list[Path]:
    """Schedule files next to (or up to SEARCH_UP folders above) the sources of ``table``'s rows, each once."""
    if table is None or table.empty or "source" not in table.columns:
        return []
    folders: set[Path] = set()
    for source in {str(s) for s in table["source"].dropna()}:
        folder = Path(source).parent
        for _ in range(SEARCH_UP + 1):
            folders.add(folder)
            folder = folder.parent
    found = {}
    for folder in sorted(folders):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*schedule.json")):
            if path.resolve() in found:
                continue
            try:
                found[path.resolve()] = path if read_schedule(path)["kind"] == KIND else None
            except SpecsweepError:
                continue
    return [p for p in found.values() if p is not None]


def section(table) -> list:
    """The blocks of the schedule section; empty when no schedule is found."""
    paths = find_schedules(table)
    if not paths:
        return []
    blocks = [Heading(2, "Schedules: what to deploy per batch size and prompt length"),
              Para("`specsweep tune --batch-sizes ... --context-buckets ...` measures one study per cell: each trial's "
                   "speedup is paired against decoding with the target alone at the cell's batch size, on the cell's "
                   "prompts. A setting scores its median paired speedup minus the penalty times the median absolute "
                   "deviation (MAD) of its repeats; among the candidates whose interval overlaps the best score's, the "
                   "one that drafts least wins (a fixed γ before an adaptive one), so no speculation (γ = 0, speedup "
                   "1 exactly) is chosen wherever no candidate's interval lies above 1. Intervals are the runs' "
                   "order-statistic intervals for the median (docs/measurement.md); candidates \"within the noise\" of "
                   "the choice are those the measurement cannot tell from it. `specsweep export` writes the choices "
                   "for transformers, vLLM, TensorRT-LLM or our own engine (docs/tuning.md).")]
    for path in paths:
        blocks += _schedule_blocks(read_schedule(path), path)
    return blocks


def _schedule_blocks(schedule: dict, path: Path) -> list:
    title = f"{schedule.get('task')}: {schedule.get('target')} ← {schedule.get('draft') or 'no draft model'}"
    blocks = [Heading(3, f"{title} (study {schedule.get('study')})"),
              Para(f"From `{path}`: penalty {schedule.get('penalty'):g} × MAD; lossy rules within "
                   f"{schedule.get('max_quality_loss'):.1%} quality loss of the cell's AR baseline; temperature "
                   f"{schedule.get('temperature')}, dtype {schedule.get('dtype')}, device {schedule.get('device')}.")]
    rows = []
    for cell in schedule["cells"]:
        choice = cell["choice"]
        rows.append([Cell.from_dict(cell).label, describe_settings(choice["settings"]), _interval(choice),
                     _sureness(choice), describe_settings(cell["standard"]["settings"]),
                     describe_settings(cell["standard_fixed"]["settings"]), cell["trials"],
                     cell["unusable"] + cell["ineligible"]])
    blocks.append(Table(["cell", "choice", "speedup [interval]", "how sure", "standard rule (transformers)",
                         "standard, fixed γ (vLLM, TensorRT-LLM)", "trials", "left out"], rows))
    blocks.append(Para("Left out: trials whose measurement was flagged or that have no paired speedup, and lossy "
                       "ones beyond the allowed quality loss."))
    blocks += _fixed_vs_adaptive(schedule)
    blocks += _candidates(schedule)
    return blocks


def _fixed_vs_adaptive(schedule: dict) -> list:
    rows = []
    for cell in schedule["cells"]:
        real = [c for c in cell["candidates"] if c["settings"]["gamma"] > 0]
        fixed = max((c for c in real if not c["adaptive"]), key=lambda c: c["score"], default=None)
        adaptive = max((c for c in real if c["adaptive"]), key=lambda c: c["score"], default=None)
        rows.append([Cell.from_dict(cell).label, *_side(fixed), *_side(adaptive), _verdict(fixed, adaptive)])
    return [Heading(4, "Fixed against adaptive draft length"),
            Para("The best-scoring fixed-γ trial and the best-scoring adaptive one (heuristic schedule and/or "
                 "confidence threshold, pipeline/decoding/draft_policy.py) of each cell, with acceptance "
                 "(accepted / verified "
                 "draft positions) and draft positions per verify step."),
            Table(["cell", "fixed", "speedup", "acceptance", "drafted/step", "adaptive", "speedup", "acceptance",
                   "drafted/step", "verdict"], rows)]


def _side(c: dict | None) -> list:
    if c is None:
        return ["none run", None, None, None]
    return [describe_settings(c["settings"]), _interval(c), c.get("acceptance_rate"), c.get("drafted_per_step")]


def _verdict(fixed: dict | None, adaptive: dict | None) -> str:
    if fixed is None or adaptive is None:
        return "no comparison (a kind without trials)"
    if adaptive["ci_low"] > fixed["ci_high"]:
        return "adaptive faster (intervals disjoint)"
    if fixed["ci_low"] > adaptive["ci_high"]:
        return "fixed faster (intervals disjoint)"
    return "within the noise of each other"


def _candidates(schedule: dict) -> list:
    rows = []
    for cell in schedule["cells"]:
        chosen = cell["choice"].get("index")
        noise = set(cell["choice"].get("within_noise") or [])
        for i, c in enumerate(cell["candidates"]):
            role = "chosen" if i == chosen else ("within noise" if i in noise else "")
            rows.append([Cell.from_dict(cell).label, describe_settings(c["settings"]), draft_ceiling(c["settings"]),
                         c["speedup"], c["mad"], _interval(c, median=False), c.get("coverage"), c["score"],
                         c.get("quality_loss"), role])
    return [Heading(4, "Every candidate"),
            Table(["cell", "setting", "γ max", "median speedup", "MAD", "interval", "coverage", "score",
                   "quality loss", "vs the choice"], rows)]


def _interval(c: dict, median: bool = True) -> str:
    text = f"[{c['ci_low']:.2f}, {c['ci_high']:.2f}]"
    return f"{c['speedup']:.2f} {text}" if median else text


def _sureness(c: dict) -> str:
    others = len(c.get("within_noise") or [])
    tail = f"; {others} other candidate(s) within its noise" if others else "; no other candidate within its noise"
    if c["settings"]["gamma"] == 0:
        return "no candidate surely faster than the target alone" + tail
    return ("interval above 1: faster than the target alone" if c.get("faster_than_target")
            else "interval reaches 1") + tail
