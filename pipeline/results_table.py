"""The runs table: every results JSON under a folder, one tidy row per run (pandas).

:func:`result_row` turns one results dict into a row (config, metrics, quality, and where the numbers came from);
:func:`load_runs` reads a folder of them. ``specsweep report`` (pipeline/report.py) writes this table to
reports/runs.csv and reports/summary.md, and the analysis report (pipeline.analysis, from analysis/) builds on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.objectives import quality_value, tradeoff
from pipeline.result import read_result
from pipeline.rules import is_speed_only, param_names

# Config columns first (what was run; every acceptance rule's parameters by name), then the metrics (what it
# measured), then quality scores.
CONFIG_COLUMNS = ("task", "target", "draft", "drafter", "sampler", "backend", "gamma", "draft_tree", "draft_schedule",
                  "draft_confidence", "gamma_max", "dtype", "temperature", *param_names(), "synthetic_rates", "preset",
                  "engine", "batch_size", "max_new_tokens", "limit", "categories", "per_category", "seed", "device")
METRIC_COLUMNS = ("tokens_per_second", "ar_tokens_per_second", "speedup", "speedup_ci_low", "speedup_ci_high",
                  "speedup_paired", "unpaired_speedup", "flagged", "acceptance_rate", "iid_alpha",
                  "mean_accepted_tokens", "theoretical_speedup", "predicted_speedup", "cost_ratio", "verify_cost_ratio",
                  "wall_time_s", "new_tokens", "peak_memory_mb", "acceptance_rate_chars", "chars_per_step")
# A draft with another tokenizer than the target's (pipeline/decoding/drafters/cross_tokenizer.py): from
# metrics.cross_tokenizer, None
# for a run with one tokenizer. The mode itself is the ``draft_tokenizer_mode`` column (resolved; "shared" for a
# results file written before drafts could have another tokenizer).
CROSS_TOKENIZER_COLUMNS = ("intersection_size", "target_share_in_intersection", "target_mass_on_intersection")
# Per-step detail, kept as JSON text so the table stays flat (and survives CSV); for a task with categories
# (spec_bench) the figures per category and per group of them (pipeline/categories.py), None for other tasks.
LIST_COLUMNS = ("accepted_histogram", "position_acceptance", "by_category", "by_group")


def device_label(device: dict | None, fallback: str | None = None) -> str:
    """A short human name for a provenance device record: the GPU's name, else ``CPU (arch, N threads)``."""
    device = device or {}
    if device.get("gpu"):
        return str(device["gpu"])
    name = str(device.get("device") or fallback or "unknown")
    if name.startswith("cuda"):
        return name
    threads = device.get("cpu_threads")
    detail = ", ".join(x for x in (device.get("cpu"), f"{threads} threads" if threads else None) if x)
    return f"CPU ({detail})" if detail else "CPU"


def result_row(result: dict, source: str | os.PathLike, name: str | None = None) -> dict:
    """One tidy row for a results dict: config, resolved device and draft-tokenizer mode, metrics (with a draft of
    another tokenizer, its intersection with the target's), quality, provenance."""

    cfg, metrics, quality = result["config"], result["metrics"], result.get("quality", {})
    prov = result.get("provenance", {})
    row = {"run": name or Path(source).stem}
    row.update({k: cfg.get(k) for k in CONFIG_COLUMNS})
    # what proposed: a draft model (the draft column names it), or a drafter without one, which then stands in the
    # draft column so that the report treats it as the target's pairing with it; lookup-model with its draft
    # ("lookup-model+DRAFT"), a pairing of its own beside the draft model's
    row["drafter"] = cfg.get("drafter") or "model"
    if row["drafter"] == "lookup-model":
        row["draft"] = f"lookup-model+{cfg.get('draft')}"
    elif row["drafter"] != "model":
        row["draft"] = row["drafter"]
    row["resolved_device"] = result.get("resolved", {}).get("device")
    row["draft_tokenizer_mode"] = result.get("resolved", {}).get("draft_tokenizer_mode") or "shared"
    parents = result.get("resolved", {}).get("tree_parents")        # a token tree's shape, as it ran (best:N too)
    row["tree_parents"] = None if parents is None else ",".join(str(p) for p in parents)
    row["ar_outputs"] = result.get("resolved", {}).get("ar_outputs")   # spec_bench: whose outputs it was compared with
    row.update({k: metrics.get(k) for k in METRIC_COLUMNS})
    cross = metrics.get("cross_tokenizer") or {}
    row.update({k: cross.get(k) for k in CROSS_TOKENIZER_COLUMNS})
    # synthetic acceptance measures speed only (pipeline/rules.py): its quality scores are left out of the table, so
    # the report never ranks or recommends it by quality; the results file keeps them
    row["speed_only"] = is_speed_only(cfg.get("sampler"))
    if not row["speed_only"]:
        row.update({k: v for k, v in quality.items() if isinstance(v, (int, float))})
    row["quality"] = None if row["speed_only"] else quality_value(cfg.get("task"), quality)
    row["tradeoff"] = None if row["speed_only"] else tradeoff(result)
    row["samples"] = len(result.get("samples", [])) or result.get("resolved", {}).get("samples")
    row["kind"] = "baseline" if cfg.get("gamma") == 0 else "run"
    row.update({k: json.dumps(metrics.get(k)) if metrics.get(k) is not None else None for k in LIST_COLUMNS})
    # a speed measurement not to trust (pipeline/measure.py): why, and how busy the machine was
    measurement = result.get("measurement") or {}
    row["flagged"] = bool(metrics.get("flagged", False))
    row["flag_reasons"] = "; ".join(measurement.get("flags") or []) or None
    row["others_busy_cores"] = (measurement.get("load") or {}).get("others_busy_cores")
    row["baseline"] = result.get("resolved", {}).get("baseline")
    row["source"] = str(source)
    row["date"] = prov.get("date")
    row["host"] = prov.get("host")
    row["device_name"] = device_label(prov.get("device"), row["resolved_device"])
    row["cpu_only"] = not str(row["resolved_device"] or cfg.get("device") or "").startswith("cuda")
    return row


def load_runs(folder: str | os.PathLike):
    """A DataFrame with one row per ``*.json`` specsweep results file in ``folder`` or its subfolders (sorted by
    path; the DVC pipeline writes one subfolder per task and dtype), or of the one results file ``folder`` names."""
    import pandas as pd

    folder = Path(folder)
    if folder.is_file() and folder.suffix == ".json":
        if read_result(folder) is None:
            raise SpecsweepError(f"--runs {folder} is not a specsweep results file (`specsweep run --out` writes one)")
        paths = [folder]
    elif folder.is_dir():
        paths = sorted(folder.rglob("*.json"))
    else:
        raise SpecsweepError(f"--runs {folder} is not a folder or a results JSON file: run `dvc repro` or "
                             "`specsweep run --out` first")
    rows = []
    for path in paths:
        result = read_result(path)
        if result is not None:  # else another kind of JSON in the folder
            rows.append(result_row(result, path))
    return pd.DataFrame(rows)
