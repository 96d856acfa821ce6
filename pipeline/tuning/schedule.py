"""The tuned schedule: per (batch size, prompt-length bucket) cell, the setting to deploy and how sure the choice is.

``specsweep tune --batch-sizes 1,4,16 --context-buckets 0-128,128-512`` runs one study per cell
(pipeline/tuning/study.py): trials at that batch size, on the prompts of that length, each speedup paired against
the γ = 0 loop at the same batch size inside the trial's run. This module reads the cells' trial results and picks,
per cell, by a robust rule:

  candidates   completed trials whose measurement is not flagged, lossless ones (pipeline/rules.py) and lossy ones
               within ``max_quality_loss`` of the cell's AR baseline; plus "no speculation" (γ = 0: speedup 1 by
               definition, an interval of width 0), always a legal answer
  score        median of the trial's per-repeat paired speedups − ``penalty`` × their median absolute deviation
  choice       the best score; then, among the candidates whose interval (the run's order-statistic interval for
               the median, pipeline/measure.py) overlaps the best one's, the smallest γ (the most a step drafts),
               a fixed γ before an adaptive one, then the better score: two settings within the noise of each
               other are not told apart by the measurement, and the smaller γ costs less when it is wrong. So
               speculation is chosen only where the best candidate's interval lies above 1

``rule`` (``specsweep export --sampler``) narrows the candidates to one acceptance rule's trials, without "no
speculation": the choice among that rule's settings (e.g. sigmoid's alpha and beta), a one-line error when none is
within the quality loss; a pick whose kind of rule is not among them (standard, for a lossy rule) is absent, and the
cell counts the other rules' trials (``other_rules``).

Three picks per cell: ``choice`` (any rule within the quality loss), ``standard`` (standard speculative sampling,
the verify rule transformers, vLLM and TensorRT-LLM implement: exact, hf, or greedy at T = 0) and ``standard_fixed``
(that with a fixed γ, for tools without an adaptive draft length). Each cell also records every candidate with its
median, MAD, interval and score, so the report can say how sure the choice is.

Files: the schedule JSON (``kind`` "specsweep-schedule") written next to the study's front; ``cell.json`` in each
cell's folder (its batch size and bucket).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic
from pipeline.objectives import quality_ratio
from pipeline.result import read_result
from pipeline.rules import RULES, is_lossless
from pipeline.settings_file import in_bucket
from pipeline.tree_plan import PARENTS, is_widths

KIND = "specsweep-schedule"
VERSION = 1
PENALTY = 1.0
MAX_QUALITY_LOSS = 0.01
PICKS = ("choice", "standard", "standard_fixed")
STANDARD_RULES = ("exact", "hf")     # and greedy at T = 0
DRAFT_KEYS = ("draft_schedule", "draft_confidence", "gamma_max")


# ---------------------------------------------------------------------------------------------- cells

@dataclass(frozen=True)
class Cell:
    """One cell of a study: a batch size and a prompt-length bucket [low, high) in tokens (high None: no upper end;
    context None: every prompt)."""

    batch_size: int
    context: tuple[int, int | None] | None = None

    @property
    def key(self) -> str:
        """The cell's folder and study-name suffix, e.g. ``b4`` or ``b4-c128-512``."""
        if self.context is None:
            return f"b{self.batch_size}"
        low, high = self.context
        return f"b{self.batch_size}-c{low}-{'' if high is None else high}"

    @property
    def label(self) -> str:
        return f"batch {self.batch_size}" + ("" if self.context is None else f", prompts {context_label(self.context)}")

    def to_dict(self) -> dict:
        return {"batch_size": self.batch_size, "context": None if self.context is None else list(self.context)}

    @classmethod
    def from_dict(cls, d: dict) -> Cell:
        ctx = d.get("context")
        if ctx is None:
            return cls(int(d["batch_size"]))
        return cls(int(d["batch_size"]), (int(ctx[0]), None if ctx[1] is None else int(ctx[1])))

    def holds(self, prompt_tokens: int) -> bool:
        return in_bucket(self.context, prompt_tokens)


def context_label(context) -> str:
    low, high = context
    return f"{low}-{'' if high is None else high} tokens"


def parse_batch_sizes(text: str | None) -> list[int] | None:
    """``"1,4,16"`` -> [1, 4, 16] (sorted, unique); None for None. Bad input is a one-line SpecsweepError."""
    if text is None:
        return None
    try:
        sizes = sorted({int(v) for v in str(text).split(",") if v.strip()})
    except ValueError:
        raise SpecsweepError(f"--batch-sizes {text!r}: expected comma-separated integers, e.g. 1,4,16") from None
    if not sizes or sizes[0] < 1:
        raise SpecsweepError(f"--batch-sizes {text!r}: give one or more batch sizes >= 1, e.g. 1,4,16")
    return sizes


def parse_context_buckets(text: str | None) -> list[tuple[int, int | None]] | None:
    """``"0-128,128-512,512-"`` -> [(0, 128), (128, 512), (512, None)]: prompt lengths in tokens, low inclusive,
    high exclusive, an empty high for no upper end. Buckets must not overlap. None for None."""
    if text is None:
        return None
    buckets = []
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        low, sep, high = part.partition("-")
        try:
            bucket = (int(low), int(high) if high.strip() else None)
        except ValueError:
            bucket = None
        if not sep or bucket is None or bucket[0] < 0 or (bucket[1] is not None and bucket[1] <= bucket[0]):
            raise SpecsweepError(f"--context-buckets {text!r}: {part!r} is not LOW-HIGH prompt tokens with "
                                 "0 <= LOW < HIGH (HIGH empty: no upper end), e.g. 0-128,128-512,512-")
        buckets.append(bucket)
    if not buckets:
        raise SpecsweepError(f"--context-buckets {text!r}: give one or more buckets, e.g. 0-128,128-512")
    buckets.sort()
    for (_, high), (low, _) in itertools.pairwise(buckets):
        if high is None or high > low:
            raise SpecsweepError(f"--context-buckets {text!r}: the buckets overlap; give disjoint LOW-HIGH ranges")
    return buckets


def cells_of(batch_sizes: list[int] | None, buckets: list | None, base_batch_size: int) -> list[Cell]:
    """Every (batch size, bucket) cell, batch sizes first."""
    return [Cell(b, c) for b in (batch_sizes or [base_batch_size]) for c in (buckets or [None])]


def write_cell(folder: str | os.PathLike, cell: Cell, study: str) -> None:
    write_json_atomic(Path(folder) / "cell.json", {**cell.to_dict(), "study": study})


def schedule_path(front: str | os.PathLike) -> Path:
    """Where the schedule goes: next to the study's front (``text-pareto.json`` -> ``text-schedule.json``,
    ``pareto.json`` -> ``schedule.json``)."""
    front = Path(front)
    name = front.name
    for suffix in ("-pareto.json", "pareto.json"):
        if name.endswith(suffix):
            return front.with_name(name[: -len(suffix)] + suffix.replace("pareto", "schedule"))
    return front.with_name(front.stem + "-schedule.json")


# ---------------------------------------------------------------------------------------------- candidates

def mad(values) -> float:
    """Median absolute deviation from the median of float values (not scaled)."""
    x = np.asarray(values, dtype=np.float64)
    return float(np.median(np.abs(x - np.median(x))))


def settings_of(config: dict, resolved: dict | None = None) -> dict:
    """The deployable settings of a run's config: γ, rule and its parameters, draft length, temperature, a drafter
    without a model, and a token tree (draft_tree "2,2,1" and tree_children; γ is then its node count). A tree the
    run planned (``best:N``, from --tree-profile files a deployment does not have) or gave by parents is written as
    the tree it ran, ``parents:...``, from the run's ``resolved.tree_parents``."""
    rule = RULES.get(config.get("sampler"))
    params = rule.effective({k: config.get(k) for k in rule.param_names}, config.get("preset")) if rule else {}
    draft = {"draft_schedule": config.get("draft_schedule") or "constant",
             "draft_confidence": float(config.get("draft_confidence") or 0.0), "gamma_max": config.get("gamma_max")}
    out = {"gamma": int(config.get("gamma") or 0), "sampler": config.get("sampler"), "params": params, **draft,
           "temperature": config.get("temperature")}
    if config.get("draft_tokenizer_mode") in ("intersection", "string"):   # a draft with another tokenizer
        out["draft_tokenizer_mode"] = config["draft_tokenizer_mode"]
    drafter = config.get("drafter") or "model"
    if drafter != "model":                                     # a drafter without a draft model, or lookup-model
        out["drafter"] = {"drafter": drafter, **{k: config.get(k) for k in DRAFTER_KEYS[drafter]}}
    if config.get("draft_tree") and out["gamma"]:                       # a token tree: γ is its node count
        out["draft_tree"] = ran_tree(str(config["draft_tree"]), (resolved or {}).get("tree_parents"))
        out["tree_children"] = config.get("tree_children") or "without-replacement"
    return out


def ran_tree(spec: str, parents: list[int] | None) -> str:
    """A run's --draft-tree as a setting that needs nothing but itself: widths as given, else (best:N, parents:...)
    the parents list the run recorded (``resolved.tree_parents``). One line where a planned tree's run recorded none."""
    if is_widths(spec):
        return spec
    if not parents:
        raise SpecsweepError(f"a run with --draft-tree {spec} recorded no resolved.tree_parents (a results file older "
                             "than the tree planner's): run it again to export its tree")
    return PARENTS + ",".join(str(int(p)) for p in parents)


# each drafter but the draft model alone: the run settings that define it (lookup-model's draft is the schedule's)
DRAFTER_KEYS = {"prompt-lookup": ("lookup_min", "lookup_max"), "lookup-model": ("lookup_min", "lookup_max"),
                "suffix": ("suffix_depth", "suffix_factor", "suffix_min_prob", "suffix_outputs")}


def is_adaptive(settings: dict) -> bool:
    return settings.get("draft_schedule") == "heuristic" or (settings.get("draft_confidence") or 0) > 0


def draft_ceiling(settings: dict) -> int:
    """The most tokens a step of this setting drafts (its cost when the draft is wrong)."""
    gamma = int(settings.get("gamma") or 0)
    return max(gamma, int(settings.get("gamma_max") or gamma)) if is_adaptive(settings) else gamma


def is_standard(settings: dict) -> bool:
    """Standard speculative sampling: what transformers, vLLM and TensorRT-LLM verify with."""
    sampler = settings.get("sampler")
    return sampler in STANDARD_RULES or (sampler == "greedy" and float(settings.get("temperature") or 0) == 0)


def candidate(result: dict, source: str, penalty: float) -> dict | None:
    """One trial's candidate record (None when it has no paired speedup or its measurement is flagged)."""
    metrics, measurement = result.get("metrics", {}), result.get("measurement") or {}
    ratios = measurement.get("ratios")
    if metrics.get("flagged") or metrics.get("speedup") is None or not ratios:
        return None
    config = result["config"]
    settings = settings_of(config, result.get("resolved"))
    spread = mad(ratios)
    median = float(np.median(ratios))
    task = config.get("task")
    base_quality = (result.get("resolved") or {}).get("baseline_quality")
    ratio = quality_ratio(task, result.get("quality") or {}, base_quality) if base_quality else None
    steps = metrics.get("verify_steps") or 0
    return {"settings": settings, "source": str(source), "speedup": median, "mad": spread,
            "ci_low": metrics.get("speedup_ci_low"), "ci_high": metrics.get("speedup_ci_high"),
            "coverage": (measurement.get("speedup") or {}).get("ci_coverage"), "repeats": len(ratios),
            "score": median - penalty * spread, "quality_loss": None if ratio is None else 1.0 - ratio,
            "lossless": is_lossless(settings["sampler"], settings["temperature"]),
            "standard": is_standard(settings), "adaptive": is_adaptive(settings),
            "acceptance_rate": metrics.get("acceptance_rate"), "tokens_per_second": metrics.get("tokens_per_second"),
            "ar_tokens_per_second": metrics.get("ar_tokens_per_second"),
            "drafted_per_step": (metrics.get("drafted_tokens") or 0) / steps if steps else None,
            "tokens_per_step": metrics.get("mean_accepted_tokens")}


def no_speculation(temperature) -> dict:
    """The γ = 0 candidate: decoding with the target alone, the reference of every paired speedup."""
    return {"settings": {"gamma": 0, "sampler": "exact", "params": {}, "draft_schedule": "constant",
                         "draft_confidence": 0.0, "gamma_max": None, "temperature": temperature},
            "source": None, "speedup": 1.0, "mad": 0.0, "ci_low": 1.0, "ci_high": 1.0, "coverage": None,
            "repeats": None, "score": 1.0, "quality_loss": 0.0, "lossless": True, "standard": True, "adaptive": False,
            "acceptance_rate": None, "tokens_per_second": None, "ar_tokens_per_second": None,
            "drafted_per_step": 0.0, "tokens_per_step": 1.0}


def eligible(c: dict, max_quality_loss: float) -> bool:
    return c["lossless"] or (c["quality_loss"] is not None and c["quality_loss"] <= max_quality_loss)


def _overlap(a: dict, b: dict) -> bool:
    return a["ci_low"] <= b["ci_high"] and b["ci_low"] <= a["ci_high"]


def choose(candidates: list[dict]) -> tuple[dict, list[dict]]:
    """The robust choice among ``candidates`` (the module docstring's rule) and those within its noise (the
    candidates whose interval overlaps the best-scoring one's, the choice included)."""
    if not candidates:
        raise ValueError("choose needs at least one candidate")
    best = max(candidates, key=lambda c: (c["score"], -draft_ceiling(c["settings"])))
    tied = [c for c in candidates if _overlap(c, best)]
    chosen = min(tied, key=lambda c: (draft_ceiling(c["settings"]), c["adaptive"], -c["score"]))
    return chosen, tied


def pick(candidates: list[dict], keep) -> dict:
    """The choice among the candidates ``keep`` accepts (no speculation always among them), with how sure it is:
    ``within_noise`` (how many other candidates its noise cannot tell from it) and ``faster_than_target``
    (True when its interval lies above 1)."""
    pool = [c for c in candidates if keep(c)]
    chosen, tied = choose(pool)
    return {**chosen, "within_noise": [i for i, c in enumerate(candidates) if c in tied and c is not chosen],
            "faster_than_target": chosen["settings"]["gamma"] > 0 and chosen["ci_low"] > 1.0,
            "index": candidates.index(chosen)}


def cell_schedule(cell: Cell, folder: str | os.PathLike, penalty: float = PENALTY,
                  max_quality_loss: float = MAX_QUALITY_LOSS, rule: str | None = None) -> dict:
    """The cell's candidates (from ``folder/trials/*.json``) and its three picks (:data:`PICKS`); with ``rule``,
    the candidates are that rule's trials only (the module docstring)."""
    folder = Path(folder)
    results = [(p, read_result(p)) for p in sorted((folder / "trials").glob("*.json"))]
    results = [(p, r) for p, r in results if r is not None]
    temperature = results[0][1]["config"].get("temperature") if results else None
    usable = [c for p, r in results if (c := candidate(r, p, penalty)) is not None]
    found = usable if rule is None else [c for c in usable if c["settings"]["sampler"] == rule]
    kept = [c for c in found if eligible(c, max_quality_loss)]
    if rule is not None and not kept:
        raise SpecsweepError(f"{folder}: no {rule} trial is within quality loss {max_quality_loss:g} of the target "
                             f"alone ({len(found)} usable {rule} trials): run more trials, or allow more loss "
                             "(--max-quality-loss)")
    cands = kept if rule is not None else [no_speculation(temperature), *kept]
    keeps = {"choice": lambda c: True, "standard": lambda c: c["standard"],
             "standard_fixed": lambda c: c["standard"] and not c["adaptive"]}
    picks = {name: pick(cands, keep) if any(keep(c) for c in cands) else None for name, keep in keeps.items()}
    return {**cell.to_dict(), "key": cell.key, "folder": str(folder), "trials": len(results),
            "unusable": len(results) - len(usable), "ineligible": len(found) - len(kept),
            **({"other_rules": len(usable) - len(found)} if rule is not None else {}), "candidates": cands, **picks}


def build_schedule(cells: list[tuple[Cell, str | os.PathLike]], *, study: str, penalty: float = PENALTY,
                   max_quality_loss: float = MAX_QUALITY_LOSS, rule: str | None = None) -> dict:
    """The schedule of a study's cells ([(cell, its folder)]): what was measured and the picks per cell."""
    if not (penalty >= 0 and math.isfinite(penalty)):
        raise SpecsweepError(f"--spread-penalty must be a finite number >= 0; got {penalty}")
    if not (0 <= max_quality_loss < 1):
        raise SpecsweepError(f"--max-quality-loss must be a fraction in [0, 1), e.g. 0.01; got {max_quality_loss}")
    per_cell = [cell_schedule(cell, folder, penalty, max_quality_loss, rule) for cell, folder in cells]
    first = next((c for cell in per_cell for c in cell["candidates"] if c["source"]), None)
    config = read_result(first["source"])["config"] if first else {}
    return {"kind": KIND, "version": VERSION, "study": study,
            **{k: config.get(k) for k in ("task", "target", "draft", "dtype", "temperature", "device")},
            "penalty": penalty, "max_quality_loss": max_quality_loss, **({"rule_only": rule} if rule else {}),
            "rule": "score = median paired speedup - penalty x MAD of the per-repeat speedups; among the candidates "
                    "whose interval overlaps the best score's, the smallest γ, fixed before adaptive",
            "cells": per_cell}


def write_schedule(path: str | os.PathLike, schedule: dict) -> Path:
    return write_json_atomic(path, schedule)


def read_schedule(path: str | os.PathLike) -> dict:
    """A schedule JSON; anything else is a one-line SpecsweepError."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecsweepError(f"{path}: not a readable schedule JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise SpecsweepError(f"{path}: not a schedule written by `specsweep tune` (no kind {KIND!r})")
    if not isinstance(data.get("version"), int) or data["version"] > VERSION:
        raise SpecsweepError(f"{path}: schedule version {data.get('version')!r} is newer than this specsweep reads")
    return data


def study_cells(study_dir: str | os.PathLike) -> list[tuple[Cell, Path]]:
    """The cells of a study folder: its own trials (a one-cell study; the cell from its results' batch size) and
    every ``cells/<key>/`` with a ``cell.json``."""
    study_dir = Path(study_dir)
    found = []
    root = sorted((study_dir / "trials").glob("*.json"))
    first = next((r for p in root if (r := read_result(p)) is not None), None)
    if first is not None:
        found.append((Cell(int(first["config"].get("batch_size") or 1)), study_dir))
    for meta in sorted((study_dir / "cells").glob("*/cell.json")):
        try:
            found.append((Cell.from_dict(json.loads(meta.read_text(encoding="utf-8"))), meta.parent))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise SpecsweepError(f"{meta}: not a cell description ({' '.join(str(e).split())[:120]})") from None
    if not found:
        raise SpecsweepError(f"{study_dir}: no trials found (trials/*.json or cells/*/trials/*.json): run "
                             "`specsweep tune` with --study-dir there first")
    return sorted(found, key=lambda item: cell_order(item[0]))


def cell_order(cell: Cell) -> tuple:
    low, high = cell.context or (0, None)
    return cell.batch_size, low, math.inf if high is None else high


# ---------------------------------------------------------------------------------------------- words

def describe_settings(settings: dict) -> str:
    """One short phrase for a setting: ``exact γ 4``, ``exact γ 2 heuristic (≤ 6)``, ``exact γ ≤ 5, confidence 0.6``,
    ``sigmoid γ 3 (alpha 1, beta -20)``, ``exact tree 2,2,1 (10 nodes, top-k)``, or ``no speculation``."""
    gamma = int(settings.get("gamma") or 0)
    if gamma == 0:
        return "no speculation"
    text = f"{settings.get('sampler')} γ {gamma}"
    if settings.get("draft_tree"):
        text = (f"{settings.get('sampler')} tree {settings['draft_tree']} ({gamma} nodes, "
                f"{settings.get('tree_children')})")
    confidence = settings.get("draft_confidence") or 0
    if settings.get("draft_schedule") == "heuristic":
        text += f" heuristic (≤ {draft_ceiling(settings)})"
    elif confidence > 0:
        text = f"{settings.get('sampler')} γ ≤ {draft_ceiling(settings)}"
    if confidence > 0:
        text += f", confidence {confidence:.2g}"
    params = settings.get("params") or {}
    if params:
        text += " (" + ", ".join(f"{k} {v:.3g}" for k, v in params.items()) + ")"
    return text


def describe_pick(chosen: dict) -> str:
    """A pick in one line: the setting, its speedup and interval, and how sure the choice is."""
    what = describe_settings(chosen["settings"])
    others = len(chosen.get("within_noise") or [])
    noise = f"; {others} other candidate(s) within its noise" if others else ""
    if chosen["settings"]["gamma"] == 0:
        return f"{what} (no candidate's interval lies above 1){noise}"
    sure = "faster than the target alone" if chosen.get("faster_than_target") else "not surely faster"
    return f"{what}: speedup {chosen['speedup']:.2f} [{chosen['ci_low']:.2f}, {chosen['ci_high']:.2f}], {sure}{noise}"
