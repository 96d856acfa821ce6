"""``specsweep export``: the chosen setting written as another tool's configuration, or as ours.

Sources (:func:`load_source`): a schedule JSON written by ``specsweep tune`` (``<front>-schedule.json``), a study
folder (its schedule rebuilt from the trials' results, :mod:`pipeline.tuning.schedule`), or a report folder or its
``results.csv`` (the recommendation's row, its settings read from the run's results file: a one-cell schedule).

Formats (each from one pick of the schedule, :data:`PICK_OF`):

  hf      ``<out>/generation_config.json``: the assistant (draft) model's generation config for transformers'
          assisted generation, which reads ``num_assistant_tokens``, ``num_assistant_tokens_schedule`` ("constant",
          or "heuristic_transient": our heuristic starts from γ in every generate call) and
          ``assistant_confidence_threshold`` (0: off) from the assistant's own config. Batch 1 (HF's assisted
          generation is): the smallest batch size's pick. transformers has no γ_max, and with scikit-learn
          installed it adapts the threshold itself during generation.
  vllm    ``<out>``, JSON: vLLM's ``speculative_config`` (``--speculative-config``): method "draft_model", the draft
          ``model``, ``num_speculative_tokens`` (the largest γ), and the per-batch-size schedule
          ``num_speculative_tokens_per_batch_size`` as inclusive ranges ``[first, last, K]`` starting at 1 (vLLM's
          Dynamic Speculative Decoding, in vLLM 0.24's documentation; releases without it reject the key:
          ``--no-batch-schedule`` leaves it out, and vLLM then drafts the smallest batch size's γ at every size).
          A batch size between two measured ones takes the γ of the next larger one measured; vLLM carries the
          last range's γ to every larger batch size.
  trtllm  ``<out>``, YAML: TensorRT-LLM LLM API options (``--extra_llm_api_options``): ``speculative_config`` with
          decoding_type "Draft_Target", ``max_draft_len``, ``speculative_model`` and ``draft_len_schedule``, a map
          from batch-size upper bounds to draft lengths ({4: 4, 16: 2}: sizes 1-4 draft 4, 5-16 draft 2, above the
          largest key 0, speculation off), whose smallest key's value must equal max_draft_len and no value exceed
          it (TensorRT-LLM's DecodingBaseConfig validator). ``--max-batch-size N`` extends the largest measured
          batch size's γ to N.
  json    ``<out>``, JSON (kind "specsweep-settings"): every cell's pick, read back by ``specsweep run
          --from-config FILE`` and by anything serving with our engine (pipeline/settings_file.py).

Token trees (``draft_tree``, docs/trees.md): json carries the shape and the children rule, and ``specsweep run
--from-config`` runs the same tree. transformers' assisted generation, vLLM's draft-model, n-gram and suffix methods
and TensorRT-LLM's Draft_Target and NGram decoding draft chains (their trees belong to EAGLE and Medusa heads), so hf,
vllm and trtllm refuse a tree in one line; ``tree_as_chain`` (``--tree-as-chain``) exports the chain of the tree's
depth instead (its first-child path: the same draft forwards, fewer tokens scored), with a note that this chain is
not the setting that was measured.

Only standard speculative sampling (exact, hf, greedy at T = 0) exists in transformers, vLLM and TensorRT-LLM, and
only transformers has an adaptive draft length: hf exports the schedule's ``standard`` pick, vllm and trtllm its
``standard_fixed`` pick, json its ``choice`` (any rule within the quality loss). Files are written atomically;
bad input is a one-line SpecsweepError.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic, write_text_atomic
from pipeline.result import read_result
from pipeline.settings_file import settings_document
from pipeline.tree_plan import resolve_tree
from pipeline.tuning.schedule import (
    KIND,
    MAX_QUALITY_LOSS,
    PENALTY,
    PICKS,
    Cell,
    build_schedule,
    context_label,
    describe_settings,
    is_adaptive,
    is_standard,
    parse_context_buckets,
    read_schedule,
    settings_of,
    study_cells,
)

FORMATS = ("hf", "vllm", "trtllm", "json")
PICK_OF = {"hf": "standard", "vllm": "standard_fixed", "trtllm": "standard_fixed", "json": "choice"}
HF_SCHEDULE = {"constant": "constant", "heuristic": "heuristic_transient"}


# ---------------------------------------------------------------------------------------------- sources

def load_source(path: str | os.PathLike, *, task: str | None = None, penalty: float = PENALTY,
                max_quality_loss: float = MAX_QUALITY_LOSS, rule: str | None = None) -> dict:
    """A schedule (the dict :func:`pipeline.tuning.schedule.build_schedule` returns) from a schedule JSON, a study
    folder or a report (folder or results.csv); ``rule``: from a study folder, the choice among that rule's trials
    only (one-line error for another source)."""
    path = Path(path)
    if not path.exists():
        raise SpecsweepError(f"--from {path} does not exist: give a schedule JSON written by `specsweep tune`, a study "
                             "folder (--study-dir of `specsweep tune`) or a report folder (`specsweep report --out`)")
    if path.is_dir() and (path / "results.csv").is_file() and not (path / "trials").is_dir():
        path = path / "results.csv"
    if rule is not None and not (path.is_dir() and path.suffix != ".csv"):
        raise SpecsweepError(f"--sampler {rule} picks among a study's trials: give --from a study folder (--study-dir "
                             "of `specsweep tune`), not a schedule or a report")
    if path.suffix == ".csv":
        return _from_report(path, task, max_quality_loss)
    if path.is_dir():
        cells = study_cells(path)
        return build_schedule(cells, study=path.name, penalty=penalty, max_quality_loss=max_quality_loss, rule=rule)
    return read_schedule(path)


def _from_report(csv: Path, task: str | None, max_quality_loss: float) -> dict:
    """A one-cell schedule from a report's recommendation: its "fastest within loss" row as the choice and its
    "best lossless" row as the standard picks (each setting read from its results file)."""
    import pandas as pd

    from pipeline.analysis.recommend import recommend  # kept local: not loaded by `specsweep --help`

    try:
        table = pd.read_csv(csv)
    except (OSError, ValueError) as e:
        raise SpecsweepError(f"{csv}: not a readable report table ({' '.join(str(e).split())[:120]})") from None
    rec = recommend(table, max_quality_loss)
    rows = rec[rec["run"].notna()] if not rec.empty else rec
    tasks = sorted(set(rows["task"])) if not rows.empty else []
    if task is not None:
        rows = rows[rows["task"] == task]
    elif len(tasks) > 1:
        raise SpecsweepError(f"{csv} recommends settings for tasks {tasks}: choose one with --task")
    if rows.empty:
        raise SpecsweepError(f"{csv}: no recommended setting{f' for task {task}' if task else ''} (the report's "
                             "recommendation is empty)")
    decodings = sorted({(str(r["target"]), str(r["draft"]), _temperature_text(r.get("temperature")))
                        for _, r in rows.iterrows()})
    if len(decodings) > 1:
        raise SpecsweepError(f"{csv} recommends settings for {len(decodings)} pairs or temperatures "
                             f"({'; '.join(', '.join(d) for d in decodings)}): export one from its study folder or "
                             "schedule instead")
    picks = {}
    for _, row in rows.iterrows():
        result = read_result(row["source"]) if Path(str(row["source"])).is_file() else None
        if result is None:
            raise SpecsweepError(f"{csv}: the recommended run's results file {row['source']} is missing: export from "
                                 "the study folder or the schedule instead")
        settings = settings_of(result["config"], result.get("resolved"))
        picks[row["choice"]] = {"settings": settings, "speedup": float(row["speedup"]),
                                "ci_low": float(row["speedup_ci_low"]), "ci_high": float(row["speedup_ci_high"]),
                                "source": str(row["source"]), "within_noise": [],
                                "faster_than_target": float(row["speedup_ci_low"]) > 1, "config": result["config"]}
    lossless = picks.get("best lossless")
    choice = next((v for k, v in picks.items() if k.startswith("fastest")), lossless)
    standard = lossless if lossless is not None and _standard(lossless["settings"]) else None
    config = (choice or lossless)["config"]
    cell = {**Cell(int(config.get("batch_size") or 1)).to_dict(), "key": "report", "candidates": [],
            "choice": choice, "standard": standard, "standard_fixed": standard}
    return {"kind": KIND, "version": 1, "study": f"report {csv}",
            **{k: config.get(k) for k in ("task", "target", "draft", "dtype", "temperature", "device")},
            "cells": [cell]}


def _temperature_text(value) -> str:
    """'T = 0' for a recommendation's decoding temperature; 'T unknown' where the report's table does not record it
    (results older than the column)."""
    from pipeline.analysis.recommend import to_number  # kept local: not loaded by `specsweep --help`

    number = to_number(value)
    return "T unknown" if number is None else f"T = {number:g}"


def _standard(settings: dict) -> bool:

    return is_standard(settings) and not is_adaptive(settings)


# ---------------------------------------------------------------------------------------------- entries

def entries(schedule: dict, pick: str, context: str | None = None) -> list[dict]:
    """Per batch size (ascending), the ``pick`` of the schedule's cells of one prompt-length bucket: [{batch_size,
    context, settings, speedup, ci_low, ci_high, faster_than_target}]. ``context``: "LOW-HIGH" (needed when the
    schedule has several buckets)."""

    if pick not in PICKS:
        raise SpecsweepError(f"--pick {pick!r} is not one of {list(PICKS)}")
    cells = [Cell.from_dict(c) for c in schedule["cells"]]
    contexts = sorted({c.context for c in cells}, key=lambda c: (-1,) if c is None else (c[0],))
    if context is not None:
        want = parse_context_buckets(context)[0]
        if want not in contexts:
            raise SpecsweepError(f"--context-bucket {context}: the schedule has buckets "
                                 f"{[context_label(c) for c in contexts if c is not None] or 'none'}")
        contexts = [want]
    elif len(contexts) > 1:
        raise SpecsweepError("the schedule has several prompt-length buckets "
                             f"({', '.join(context_label(c) for c in contexts if c is not None)}): choose one with "
                             "--context-bucket LOW-HIGH")
    out = []
    for cell, raw in sorted(zip(cells, schedule["cells"]), key=lambda x: x[0].batch_size):
        if cell.context != contexts[0]:
            continue
        chosen = raw.get(pick)
        if chosen is None:
            raise SpecsweepError(f"the schedule has no {pick!r} setting for {cell.label} (a report's recommendation "
                                 "without a lossless standard rule): export --format json, or from the study")
        out.append({**cell.to_dict(), "settings": chosen["settings"], "speedup": chosen["speedup"],
                    "ci_low": chosen["ci_low"], "ci_high": chosen["ci_high"],
                    "faster_than_target": chosen.get("faster_than_target", False)})
    return out


# ---------------------------------------------------------------------------------------------- formats

def export(schedule: dict, fmt: str, out: str | os.PathLike, *, pick: str | None = None, context: str | None = None,
           batch_schedule: bool = True, max_batch_size: int | None = None,
           tree_as_chain: bool = False) -> tuple[Path, list[str]]:
    """Write ``schedule``'s pick as format ``fmt`` (:data:`FORMATS`) to ``out``; returns (path written, notes: what
    the target tool cannot express and was left out). ``tree_as_chain``: a token tree goes to hf, vllm and trtllm as
    the chain of its depth (module docstring) instead of a refusal."""
    if fmt not in FORMATS:
        raise SpecsweepError(f"--format {fmt!r} is not one of {list(FORMATS)}")
    if max_batch_size is not None and max_batch_size < 1:
        raise SpecsweepError(f"--max-batch-size must be >= 1; got {max_batch_size}")
    if fmt == "hf" and Path(out).is_file():
        raise SpecsweepError(f"--out {out} is a file: --format hf writes a folder (<out>/generation_config.json)")
    if fmt != "hf" and Path(out).is_dir():
        ext = "yaml" if fmt == "trtllm" else "json"
        raise SpecsweepError(f"--out {out} is a folder: --format {fmt} writes one file; name it, e.g. "
                             f"{out}/{fmt}.{ext}")
    rows = entries(schedule, pick or PICK_OF[fmt], context)
    if fmt == "json":
        return _json(schedule, rows, pick or PICK_OF[fmt], out), []
    rows, tree_notes = _chains(rows, fmt, tree_as_chain)
    if (_drafter(rows) or {}).get("drafter") == "lookup-model":
        raise SpecsweepError(f"{fmt} has no drafter that starts from a prompt-lookup match (lookup-model): export "
                             "--format json, or tune with other drafters")
    if not schedule.get("draft") and _drafter(rows) is None:
        raise SpecsweepError(f"the schedule names no draft model: --format {fmt} needs one")
    for row in rows:
        settings = row["settings"]
        if settings["gamma"] > 0 and fmt != "hf" and settings.get("draft_tokenizer_mode"):
            raise SpecsweepError(f"{fmt} has no draft with another tokenizer than the target's, and the pick for batch "
                                 f"size {row['batch_size']} bridges them ({settings['draft_tokenizer_mode']} mode): "
                                 "export --format hf or json")
        if settings["gamma"] > 0 and fmt != "hf" and _adaptive(settings):
            raise SpecsweepError(f"{fmt} has no adaptive draft length, and the pick for batch size {row['batch_size']} "
                                 f"is {describe_settings(settings)}: use --pick standard_fixed")
        if settings["gamma"] > 0 and not _is_standard(settings):
            raise SpecsweepError(f"{describe_settings(settings)} (batch size {row['batch_size']}) is not standard "
                                 f"speculative sampling, the only verify rule {fmt} has: use --pick standard")
    writer = {"hf": _hf, "vllm": _vllm, "trtllm": _trtllm}[fmt]
    path, notes = writer(schedule, rows, out, batch_schedule=batch_schedule, max_batch_size=max_batch_size)
    return path, tree_notes + notes


def _chains(rows: list[dict], fmt: str, tree_as_chain: bool) -> tuple[list[dict], list[str]]:
    """The rows with each token tree replaced by the chain of its depth where ``tree_as_chain`` (and a note per
    tree), else a one-line refusal at the first tree."""
    out, notes = [], []
    for row in rows:
        settings = row["settings"]
        if not settings.get("draft_tree") or not settings["gamma"]:
            out.append(row)
            continue
        depth = resolve_tree(settings["draft_tree"]).depth
        if not tree_as_chain:
            raise SpecsweepError(f"{fmt} drafts chains, not token trees, and the pick for batch size "
                                 f"{row['batch_size']} is {describe_settings(settings)}: export --format json (run it "
                                 f"with --from-config), or add --tree-as-chain for the chain of its depth (γ {depth}, "
                                 "not measured)")
        chain = {k: v for k, v in settings.items() if k not in ("draft_tree", "tree_children")}
        out.append({**row, "settings": {**chain, "gamma": depth}})
        notes.append(f"batch size {row['batch_size']}: the pick is {describe_settings(settings)} (measured "
                     f"{row['speedup']:.2f}x), which {fmt} cannot draft; exported as the chain of its depth, "
                     f"γ {depth}, which was not measured (it accepts at most as many tokens per step as the tree and "
                     f"scores fewer): measure it with `specsweep run --gamma {depth}` before relying on it")
    return out, notes


def _adaptive(settings: dict) -> bool:

    return is_adaptive(settings)


def _is_standard(settings: dict) -> bool:

    return is_standard(settings)


def _drafter(rows: list[dict]) -> dict | None:
    """The schedule's drafter without a draft model (its settings), or None for a draft model; one line when the
    batch sizes' picks use different drafters (no tool takes that)."""
    drafters = {json.dumps(r["settings"].get("drafter"), sort_keys=True) for r in rows if r["settings"]["gamma"]}
    if len(drafters) > 1:
        raise SpecsweepError(f"the schedule's batch sizes chose different drafters ({sorted(drafters)}): export one "
                             "batch size (--pick, or a report's row) or tune with one drafter")
    return json.loads(drafters.pop()) if drafters else None


def _hf_prompt_lookup(drafter: dict, settings: dict, notes: list[str]):
    """transformers' prompt lookup: the target's own generation config (no assistant model)."""
    from transformers import GenerationConfig

    if drafter["drafter"] != "prompt-lookup":
        raise SpecsweepError(f"transformers has no {drafter['drafter']} drafter: export it with --format vllm "
                             "(method suffix) or --format json")
    if (drafter.get("lookup_min") or 1) > 1:
        notes.append(f"transformers' prompt lookup matches down to 1 token; the tuned --lookup-min "
                     f"{drafter['lookup_min']} is left out")
    config = GenerationConfig(prompt_lookup_num_tokens=int(settings["gamma"]),
                              max_matching_ngram_size=int(drafter["lookup_max"]))
    notes.append("this is the target's generation config (prompt lookup needs no assistant model): save it beside "
                 "the target, or pass prompt_lookup_num_tokens and max_matching_ngram_size to generate")
    return config


def _hf(schedule: dict, rows: list[dict], out, **_) -> tuple[Path, list[str]]:
    from transformers import GenerationConfig

    row, notes = rows[0], []
    settings = row["settings"]
    if row["batch_size"] != 1:
        notes.append(f"transformers' assisted generation runs batch 1; the schedule's smallest batch size is "
                     f"{row['batch_size']}, whose setting this is")
    if settings["gamma"] == 0:
        raise SpecsweepError(f"the schedule chose no speculation at batch size {row['batch_size']} (nothing was surely "
                             "faster): generate without assistant_model")
    if len(rows) > 1:
        notes.append("the settings of batch sizes above the smallest are left out (assisted generation is batch 1)")
    if settings.get("draft_tokenizer_mode"):
        notes.append(f"the draft has another tokenizer than the target's (measured in specsweep's "
                     f"{settings['draft_tokenizer_mode']} mode): pass tokenizer= and assistant_tokenizer= to "
                     "generate, which then runs transformers' own Universal Assisted Generation")
    if settings.get("draft_schedule") == "heuristic" and settings.get("gamma_max"):
        notes.append(f"transformers' heuristic schedule has no ceiling: γ_max {settings['gamma_max']} is left out")
    drafter = settings.get("drafter")
    if drafter is not None:
        base = _hf_prompt_lookup(drafter, settings, notes)
    else:
        draft_dir = Path(str(schedule["draft"]))
        base = (GenerationConfig.from_pretrained(str(draft_dir)) if (draft_dir / "generation_config.json").is_file()
                else GenerationConfig())
        base.update(num_assistant_tokens=int(settings["gamma"]),
                    num_assistant_tokens_schedule=HF_SCHEDULE[settings.get("draft_schedule") or "constant"],
                    assistant_confidence_threshold=float(settings.get("draft_confidence") or 0.0))
    try:
        base.validate(strict=True)
    except (TypeError, ValueError) as e:
        raise SpecsweepError(f"the exported generation config does not validate ({' '.join(str(e).split())[:160]})") \
            from None
    path = write_text_atomic(Path(out) / "generation_config.json", base.to_json_string(use_diff=True))
    return path, notes


def vllm_speculative_config(draft: str, ks: list[tuple[int, int]], batch_schedule: bool = True) -> tuple[dict, list]:
    """vLLM's speculative_config for draft-model speculation with γ ``ks`` = [(batch size, γ)] ascending."""
    if all(k == 0 for _, k in ks):
        raise SpecsweepError("the schedule chose no speculation at every batch size: serve without "
                             "--speculative-config")
    notes = []
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": max(k for _, k in ks)}
    ranges, first = [], 1
    for size, k in ks:
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = size
        else:
            ranges.append([first, size, k])
        first = size + 1
    if len(ranges) > 1 or ranges[0][2] != config["num_speculative_tokens"]:
        if batch_schedule:
            config["num_speculative_tokens_per_batch_size"] = ranges
        else:
            config["num_speculative_tokens"] = ks[0][1] or config["num_speculative_tokens"]
            notes.append(f"--no-batch-schedule: vLLM drafts {config['num_speculative_tokens']} tokens at every batch "
                         f"size; the measured schedule was {ranges}")
    return config, notes


def _vllm(schedule: dict, rows: list[dict], out, *, batch_schedule: bool = True, **_) -> tuple[Path, list[str]]:
    config, notes = vllm_speculative_config(str(schedule["draft"]),
                                            [(r["batch_size"], r["settings"]["gamma"]) for r in rows], batch_schedule)
    drafter = _drafter(rows)
    if drafter is not None:
        config.pop("model")
        config.update(VLLM_DRAFTERS[drafter["drafter"]](drafter))
        if drafter["drafter"] == "suffix" and not drafter.get("suffix_outputs"):
            notes.append("measured without a cache of earlier outputs: vLLM keeps one "
                         "(suffix_decoding_max_cached_requests), which helps repetitive traffic")
    return write_json_atomic(out, config), notes


# a drafter without a draft model -> its keys in vLLM's speculative_config
VLLM_DRAFTERS = {
    "prompt-lookup": lambda d: {"method": "ngram", "prompt_lookup_min": int(d["lookup_min"]),
                                "prompt_lookup_max": int(d["lookup_max"])},
    "suffix": lambda d: {"method": "suffix", "suffix_decoding_max_tree_depth": int(d["suffix_depth"]),
                         "suffix_decoding_max_spec_factor": float(d["suffix_factor"]),
                         "suffix_decoding_min_token_prob": float(d["suffix_min_prob"])},
}


def trtllm_speculative_config(draft: str, ks: list[tuple[int, int]], max_batch_size: int | None = None) \
        -> tuple[dict, list]:
    """TensorRT-LLM's speculative_config (Draft_Target) for γ ``ks`` = [(batch size, γ)] ascending."""
    notes = []
    if ks[0][1] == 0:
        raise SpecsweepError(f"the schedule chose no speculation at batch size {ks[0][0]}, its smallest: "
                             "TensorRT-LLM's draft_len_schedule must start at max_draft_len > 0; serve without "
                             "speculative_config")
    top = ks[0][1]
    if any(k > top for _, k in ks):
        notes.append(f"TensorRT-LLM needs no draft length above the smallest batch size's ({top}): larger ones were "
                     f"lowered to {top} (measured: {dict(ks)})")
    schedule: dict[int, int] = {}
    for size, k in ks:
        k = min(k, top)
        if schedule and list(schedule.values())[-1] == k:
            schedule.pop(list(schedule)[-1])
        schedule[size] = k
    if max_batch_size is not None and max_batch_size > ks[-1][0]:
        last = list(schedule)[-1]
        schedule[max_batch_size] = schedule.pop(last)
    config = {"decoding_type": "Draft_Target", "max_draft_len": top, "speculative_model": draft}
    if len(ks) > 1 or max_batch_size is not None:
        config["draft_len_schedule"] = schedule
        if schedule[list(schedule)[-1]] > 0:
            notes.append(f"TensorRT-LLM turns speculation off above the schedule's largest batch size "
                         f"({list(schedule)[-1]}); --max-batch-size N carries its γ up to N")
    return config, notes


def _trtllm(schedule: dict, rows: list[dict], out, *, max_batch_size: int | None = None, **_) -> tuple[Path, list]:
    import yaml

    drafter = _drafter(rows)
    if drafter is not None and drafter["drafter"] != "prompt-lookup":
        raise SpecsweepError(f"TensorRT-LLM has no {drafter['drafter']} drafter: export it with --format vllm or json")
    if drafter is not None:
        top = max(r["settings"]["gamma"] for r in rows)
        config = {"decoding_type": "NGram", "max_draft_len": top, "max_matching_ngram_size": int(drafter["lookup_max"])}
        return write_text_atomic(out, yaml.safe_dump({"speculative_config": config}, sort_keys=False)), [
            "TensorRT-LLM's NGram decoding keeps its own pool of n-grams (is_keep_all, is_use_oldest): measured here "
            "as prompt lookup, the earliest match of the longest n-gram"]
    config, notes = trtllm_speculative_config(str(schedule["draft"]),
                                              [(r["batch_size"], r["settings"]["gamma"]) for r in rows],
                                              max_batch_size)
    text = yaml.safe_dump({"speculative_config": config}, sort_keys=False)
    return write_text_atomic(out, text), notes


def _json(schedule: dict, rows: list[dict], pick: str, out) -> Path:
    return write_json_atomic(out, settings_document(schedule.get("study"), pick, schedule, rows))
