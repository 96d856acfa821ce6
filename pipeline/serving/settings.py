"""What ``specsweep serve`` serves: a :class:`RunConfig` of the pair and its verify settings, and a line saying
where they came from.

Three sources:
  the command line   --target, --draft, --sampler, --gamma, --temperature, the rule's parameters, ...
  --from-study DIR   an Optuna study folder (results/tune/<task>): its trials' results files, with the AR
                     baseline they were measured against as the quality reference
  --from-report DIR  a report folder (reports/): its results.csv, the table the report's recommendation read

From a study or a report the point is the report's recommendation (analysis/recommend.py): the fastest setting
within the allowed quality loss (``--max-quality-loss``, default 1 %), or with ``--lossless`` the fastest lossless
one. Its acceptance rule, backend, γ, rule parameters, preset, dtype and temperature are served; the pair is the
point's unless --target/--draft are given, which then pick the pair's recommendation. Speech pairs are left out:
the server decodes text prompts.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from pipeline.analysis.recommend import recommend, to_number
from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError
from pipeline.result import read_result
from pipeline.results_table import result_row
from pipeline.rules import RULES, get_rule, param_names
from pipeline.tasks import get_task

POINT_SETTINGS = ("sampler", "backend", "gamma", "preset", "dtype", "temperature", "draft_schedule", "draft_confidence",
                  "gamma_max")
"""Settings a recommended point fixes (with the rule's parameters); giving them as flags as well is an error."""


@dataclasses.dataclass(frozen=True)
class Served:
    """The served settings (``config.task`` is always ``prompts``) and where they came from (one line)."""

    config: RunConfig
    source: str

    def describe(self) -> str:
        """One line: the pair, the rule with its parameters, γ, temperature and dtype."""
        c = self.config
        params = ", ".join(f"{k}={v:g}" for k, v in sorted(c.rule_params.items()))
        rule = c.sampler + (f" ({params})" if params else "") + (f" preset {c.preset}" if c.preset else "")
        return (f"target {c.target}, {drafter_of(c)}, sampler {rule}, backend {c.backend}, γ {c.gamma}, "
                f"temperature {c.temperature:g}, dtype {c.dtype}")


def drafter_of(c: RunConfig) -> str:
    """The drafter and its settings, in words: "draft D", "prompt lookup (n-grams 1..3)", ..."""
    if c.drafter == "model":
        return f"draft {c.draft}"
    if c.drafter == "prompt-lookup":
        return f"drafter prompt-lookup (n-grams {c.lookup_min}..{c.lookup_max})"
    if c.drafter == "lookup-model":
        return f"drafter lookup-model (n-grams {c.lookup_min}..{c.lookup_max}, then draft {c.draft})"
    return (f"drafter suffix (depth {c.suffix_depth}, factor {c.suffix_factor:g}, min prob {c.suffix_min_prob:g}"
            f"{', earlier outputs' if c.suffix_outputs else ''})")


def check(config: RunConfig, max_batch: int) -> RunConfig:
    """Raise SpecsweepError (one line) for served settings no engine can run: the decoding checks every run makes
    (RunConfig.validate_decoding), and a rule that decodes one request at a time with a larger --max-batch."""
    config.validate_decoding()
    rule = get_rule(config.sampler)
    if rule.batch_one and max_batch != 1:
        raise SpecsweepError(f"--sampler {rule.name} decodes one request at a time: use --max-batch 1")
    return config


def from_recommendation(folder: str, kind: str, base: dict, max_quality_loss: float, lossless: bool) -> Served:
    """The served settings from a study (``kind`` "study") or a report (``kind`` "report") folder: ``base`` holds
    the other settings (target and draft None unless given, to pick the pair)."""
    table = study_table(folder) if kind == "study" else report_table(folder)
    choice = "best lossless" if lossless else f"fastest within {max_quality_loss:.1%} quality loss"
    row = pick(table, base.get("target"), base.get("draft"), max_quality_loss, lossless, f"{kind} {folder}",
               base.get("temperature"))
    rule = RULES[row["sampler"]]
    rule_params = {p: float(row[p]) for p in rule.param_names if _number(row.get(p)) is not None}
    temperature = _number(row.get("temperature"))
    point = {"target": row["target"] if base.get("target") is None else base["target"],
             "draft": row["draft"] if base.get("draft") is None else base["draft"],
             "sampler": row["sampler"], "backend": _text(row.get("backend")) or "torch",
             "gamma": int(float(row["gamma"])), "preset": _text(row.get("preset")),
             "dtype": _text(row.get("dtype")) or "float32",
             # the adaptive draft length the point was measured with (pipeline/decoding/draft_policy.py), if any
             "draft_schedule": _text(row.get("draft_schedule")) or "constant",
             "draft_confidence": _number(row.get("draft_confidence")) or 0.0,
             "gamma_max": None if _number(row.get("gamma_max")) is None else int(_number(row.get("gamma_max"))),
             # a draft with another tokenizer: the mode it was measured in
             # (pipeline/decoding/drafters/cross_tokenizer.py)
             "draft_tokenizer_mode": _text(row.get("draft_tokenizer_mode")) or "auto",
             **({"temperature": temperature} if temperature is not None else {})}
    config = RunConfig(**{k: v for k, v in base.items() if k not in point}, **point, rule_params=rule_params,
                       task="prompts", data="")
    speedup = _number(row.get("speedup"))
    loss = _number(row.get("quality_loss"))
    detail = ", ".join(x for x in (
        f"speedup {speedup:.2f}x" if speedup is not None else None,
        f"quality loss {100 * loss:+.2f} %" if loss is not None else None,
        f"measured on {row['device_name']}" if _text(row.get("device_name")) else None,
        "no temperature recorded: the default" if temperature is None else None) if x)
    return Served(config, f"{kind} {folder}: {choice}, {row.get('kind') or 'run'} {row.get('run')} "
                          f"({row.get('source')}; {detail})")


def pick(table, target: str | None, draft: str | None, max_quality_loss: float, lossless: bool, where: str,
         temperature: float | None = None) -> dict:
    """The recommended row (a dict) of the one text pair in ``table`` that matches target/draft (None: any), at
    ``temperature`` (None: the one temperature the pair was measured at; several are a one-line error)."""

    rec = recommend(table, max_quality_loss) if not table.empty else table
    if rec.empty:
        raise SpecsweepError(f"{where} holds no run or trial with a measured speedup: nothing to recommend")
    rec = rec[[not _is_speech(t, get_task) for t in rec["task"]]]
    if target is not None:
        rec = rec[[same_model(t, target) for t in rec["target"]]]
    if draft is not None:
        rec = rec[[same_model(d, draft) for d in rec["draft"]]]
    pairs = sorted({(str(t), str(d)) for t, d in zip(rec["target"], rec["draft"])}) if not rec.empty else []
    if not pairs:
        raise SpecsweepError(f"{where} has no recommendation for a text pair"
                             + (f" with target {target}" if target else "") + (f" and draft {draft}" if draft else "")
                             + ": check --target/--draft against the pairs the study or report measured")
    if len(pairs) > 1 or len(set(rec["task"])) > 1:
        raise SpecsweepError(f"{where} recommends settings for several pairs or tasks ({pairs}): pick one with "
                             "--target and --draft")
    label = "best lossless" if lossless else "fastest within"
    rows = rec[[str(c).startswith(label) for c in rec["choice"]]]
    if temperature is not None:
        rows = rows[[_number(t) in (None, float(temperature)) for t in rows["temperature"]]]
    measured = sorted({t for t in map(_number, rows["temperature"]) if t is not None})
    if rows.empty:
        raise SpecsweepError(f"{where} has no recommendation at --temperature {temperature:g} for {pairs[0][0]}: "
                             "give a temperature it was measured at")
    if len(rows) > 1:
        raise SpecsweepError(f"{where} recommends settings at temperatures {', '.join(f'{t:g}' for t in measured)} "
                             f"for {pairs[0][0]}: pick one with --temperature")
    row = rows.iloc[0].to_dict()
    if row.get("run") is None or (isinstance(row.get("run"), float) and math.isnan(row["run"])):
        raise SpecsweepError(f"{where}: no {label.replace(' within', '')} setting for {pairs[0][0]} ({row.get('note')})"
                             + ("; drop --lossless or measure a lossless rule" if lossless
                                else "; raise --max-quality-loss or use --lossless"))
    return row


def study_table(folder: str):
    """The runs table of an Optuna study folder (results/tune/<task>): a row per trial results file
    (trials/*.json), the study's own baselines (baseline-*.json) and the AR baselines the trials name."""
    import pandas as pd


    study = Path(folder)
    trials = sorted((study / "trials").glob("*.json")) if study.is_dir() else []
    if not trials:
        raise SpecsweepError(f"--from-study {folder} holds no trials (no {study / 'trials'}/*.json): give a study "
                             "folder that `specsweep tune --study-dir` wrote, e.g. results/tune/text")
    rows, baselines = [], set(study.glob("baseline-*.json"))
    for path in trials:
        result = read_result(path)
        if result is None:
            continue
        rows.append({**result_row(result, path, f"{study.name}#{path.stem}"), "kind": "trial"})
        named = (result.get("resolved") or {}).get("baseline")
        if named and Path(named).is_file():
            baselines.add(Path(named))
    for path in sorted(baselines):
        result = read_result(path)
        if result is not None:
            rows.append(result_row(result, path))
    return pd.DataFrame(rows)


def report_table(folder: str):
    """The table a report's recommendation was made from: ``<folder>/results.csv``."""
    import pandas as pd

    path = Path(folder) / "results.csv"
    if not path.is_file():
        raise SpecsweepError(f"--from-report {folder} has no results.csv: give the folder `specsweep report --out` "
                             "wrote (default reports/)")
    table = pd.read_csv(path, low_memory=False)
    if "kind" not in table.columns:
        raise SpecsweepError(f"{path} is not a specsweep report table (no 'kind' column)")
    return table


def same_model(a, b) -> bool:
    """Whether two model references name the same model: equal after normalising, or the same folder on disk."""
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
        return a is b
    a, b = str(a), str(b)
    if os.path.normpath(a) == os.path.normpath(b):
        return True
    return Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve()


def given_point_settings(values: dict) -> list[str]:
    """Of the command-line values (None = not given), the point settings and rule parameters that were given."""
    return [k for k in (*POINT_SETTINGS, *param_names()) if values.get(k) is not None]


def _is_speech(task, get_task) -> bool:
    try:
        return bool(get_task(str(task)).speech)
    except SpecsweepError:
        return False


def _number(v) -> float | None:

    return to_number(v)


def _text(v) -> str | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or str(v) == "" else str(v)
