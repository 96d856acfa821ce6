"""What a run is scored by: its quality objective, its quality against the AR baseline, and the single
speed/quality trade-off. One definition, read by the Optuna study (pipeline/tune.py), W&B logging
(pipeline/tracking.py), the runs table (pipeline/results_table.py) and the report (analysis/)."""

from __future__ import annotations

import json
from pathlib import Path

QUALITY = {"cnn_dailymail": ("rougeL", 1.0), "librispeech": ("wer", -1.0)}  # task -> (score key, sign)


def quality_value(task: str, quality: dict) -> float | None:
    """The quality objective of a run (higher is better): ROUGE-L, or -WER; None for a task without one."""
    if task not in QUALITY:
        return None
    key, sign = QUALITY[task]
    value = quality.get(key)
    return None if value is None else sign * float(value)


def quality_ratio(task: str, quality: dict, baseline_quality: dict) -> float | None:
    """Quality relative to the AR baseline (exact sampling from the target): ROUGE-L / baseline ROUGE-L, or
    word accuracy (1 - WER, floored at 0) / the baseline's. 1.0 = as good as the target alone."""
    if task not in QUALITY:
        return None
    key, _ = QUALITY[task]
    ours, base = quality.get(key), baseline_quality.get(key)
    if ours is None or base is None:
        return None
    if task == "librispeech":
        ours, base = max(0.0, 1.0 - ours), max(0.0, 1.0 - base)
    return ours / base if base > 0 else None


def tradeoff(result: dict) -> float | None:
    """The single speed/quality metric the W&B Bayesian sweep maximises: speedup x quality ratio vs the AR
    baseline (see :func:`quality_ratio`). A task without a quality metric scores its speedup. None without a
    baseline."""
    speedup = result.get("metrics", {}).get("speedup")
    if speedup is None:
        return None
    task = result.get("config", {}).get("task")
    if task not in QUALITY:
        return float(speedup)
    baseline_path = result.get("resolved", {}).get("baseline")
    try:
        baseline = json.loads(Path(baseline_path).read_text(encoding="utf-8"))
    except (OSError, TypeError, ValueError):
        return None
    ratio = quality_ratio(task, result.get("quality", {}), baseline.get("quality", {}))
    return None if ratio is None else float(speedup) * ratio
