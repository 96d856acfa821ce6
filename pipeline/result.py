"""A run's results file: its typed shape, its version, and the one place it is written and read.

``specsweep run`` (pipeline/runner.py) builds a :class:`RunResult` and writes it with :func:`write_result`;
everything that reads results files (the runs table, the report, the Optuna study's baseline reuse, a run's
``--baseline``) goes through :func:`read_result`, which refuses a file written by a newer specsweep with a
one-line error instead of misreading it. The shapes below are TypedDicts, so a result is still plain JSON, and
a type checker or a reader of this module sees every key that exists.

Version history (``specsweep_results``):
  1  the first: config, resolved, provenance, metrics, measurement, quality, samples. Runs record the
     baseline's quality in ``resolved.baseline_quality`` (older files of this version may lack it; readers
     then fall back to the baseline file) and rule parameters flat in ``config`` (``alpha``, ``beta``, ...).
     Later files of this version add optional keys that older readers ignore and newer ones do without:
     token origins per sample (``samples[].origins``, ``samples[].origin_steps``; absent for --engine hf),
     ``metrics.token_class_acceptance`` and ``metrics.roofline`` (pipeline/origins.py, pipeline/roofline.py);
     ``resolved.processes`` and ``resolved.seed_per_example`` (absent: 1 process, one generator), and for a
     data-parallel run ``resolved.rank_wall_time_s`` and ``resolved.speed_measured_on`` (pipeline/distributed.py);
     ``resolved.draft_tokenizer_mode``, ``metrics.cross_tokenizer`` and the acceptance in characters
     (``metrics.accepted_chars``, ``drafted_chars``, ``acceptance_rate_chars``, ``chars_per_step``;
     ``samples[].accepted_chars``, ``drafted_chars``) (pipeline/decoding/drafters/cross_tokenizer.py; absent: one
     tokenizer); for a task with categories (spec_bench), ``metrics.by_category`` and ``metrics.by_group``
     (pipeline/categories.py), ``measurement.groups`` (each category's timing, pipeline/paired.py ``time_groups``),
     ``resolved.ar_outputs`` (whose outputs the quality compares with) and ``config.categories`` /
     ``config.per_category`` (absent: every category); ``metrics.node_acceptance`` (per depth and sibling rank,
     docs/trees.md) and, for a token tree, ``resolved.tree_parents``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypedDict

from pipeline.errors import SpecsweepError
from pipeline.io import write_json_atomic

RESULTS_VERSION = 1
VERSION_KEY = "specsweep_results"


class Resolved(TypedDict, total=False):
    """What the run resolved its settings to."""

    device: str                      # the torch device it ran on, e.g. "cpu", "cuda:0"
    samples: int                     # samples decoded
    baseline: str | None             # --baseline path
    baseline_quality: dict | None    # that baseline's quality scores (so later steps need not read it again)
    forward: dict                    # model -> "static" | "transformers": which forward each model ran
    # and, by model, from pipeline/stack.py's forwards_record: packed_weights, few_rows_kernel, quant_kernel,
    # row_kernel, compiled ({mode, compile_s, shapes}), random_weights (the roles loaded as shapes), fallbacks
    # (role -> why a CPU forward ran torch's products where ours would have run) and model_bytes (role -> bytes of
    # the model's own tensors as run, --target-quant's quantised weights included)
    llama_cpp: dict                  # --engine llama.cpp: the server's flags, the GGUF files' types, draft settings
    processes: int                   # data-parallel processes that decoded the samples (1: this process alone)
    seed_per_example: bool           # each example drew from its own generator (pipeline/rng.py)
    rank_wall_time_s: list[float]    # with processes > 1: each rank's seconds inside generate (wall_time_s: the most)
    speed_measured_on: str           # with processes > 1: where the paired speed measurement ran, "rank 0 (cpu)"
    draft_tokenizer_mode: str        # shared, intersection or string (pipeline/decoding/drafters/cross_tokenizer.py)
    ar_outputs: str | None           # spec_bench: the γ = 0 outputs its quality compares with (None at T > 0)
    tree_parents: list[int]          # with --draft-tree: the tree's parents list (breadth-first, -1 the root)
    speed_only: dict                 # --sampler synthetic: {note, rates (per position), rates_from}; no quality claim
    # and the task's record of inputs it cut to fit (pipeline/tasks: e.g. truncated, long_inputs)


class Metrics(TypedDict, total=False):
    """Flat metrics (see pipeline/runner.py's docstring for their definitions)."""

    tokens_per_second: float
    tokens_per_second_ci_low: float
    tokens_per_second_ci_high: float
    tokens_per_second_relative_iqr: float
    pass_tokens_per_second: float | None
    ar_tokens_per_second: float
    speedup: float
    speedup_ci_low: float
    speedup_ci_high: float
    speedup_paired: bool
    unpaired_speedup: float
    baseline_tokens_per_second: float
    flagged: bool
    wall_time_s: float
    new_tokens: int
    verify_steps: int
    accepted_tokens: int
    drafted_tokens: int
    acceptance_rate: float | None
    mean_accepted_tokens: float | None
    prefill_time_s: float
    draft_time_s: float
    target_time_s: float
    verify_time_s: float
    bridge_time_s: float             # a draft with another tokenizer: re-reading the emitted text (host)
    draft_forwards: int
    # what the drafter counted beyond its forwards, summed over the run (lookup-model: row_steps, lookup_tokens,
    # draft_tokens, accepted_lookup, accepted_draft, lookup_only_steps, steps_without_draft, lookup_histogram); None
    # for the other drafters
    drafter_counts: dict | None
    target_forwards: int
    peak_memory_mb: float
    acceptance_counted: bool
    draft_forward_s: float | None
    target_forward_s: float | None
    verify_forward_s: float | None
    cost_ratio: float | None
    verify_cost_ratio: float | None
    iid_alpha: float | None
    theoretical_speedup: float | None
    predicted_speedup: float | None
    accepted_histogram: list[int] | None
    position_acceptance: list[float] | None
    # per depth, per sibling rank: {"reached", "accepted": [[int]], "rate": [[float | None]]} (None at γ = 0)
    node_acceptance: dict | None
    # {"token": {class: {offered, accepted}}, "previous": {class or "start": {...}}}: over the positions where a
    # draft token was on offer, how many were accepted, by token class (pipeline/origins.py); None at γ = 0
    token_class_acceptance: dict | None
    # analytic FLOPs and bytes per phase against measured time and the machine's peak (pipeline/roofline.py)
    roofline: dict | None
    # acceptance counted in characters (each target token's text as it decodes), comparable across tokenizers
    accepted_chars: int
    drafted_chars: int
    acceptance_rate_chars: float | None
    chars_per_step: float | None
    # a draft with another tokenizer (pipeline/decoding/drafters/cross_tokenizer.py): mode, intersection_size,
    # target_vocab,
    # draft_vocab, target_share_in_intersection, and in intersection mode target_mass_on_intersection and
    # draft_mass_on_intersection (with the sums they come from); None with one tokenizer
    cross_tokenizer: dict | None
    # a task with categories (spec_bench): {category: figures} and {group: figures, "overall": figures}, the figures
    # of pipeline/categories.py (tokens, steps, mean accepted tokens, agreement with AR, paired speedup)
    by_category: dict
    by_group: dict


class Sample(TypedDict, total=False):
    """One decoded sample."""

    id: str
    text: str
    token_ids: list[int]
    prompt_tokens: int
    new_tokens: int
    accepted: int
    drafted: int
    verify_steps: int
    acceptance_rate: float | None
    mean_accepted_tokens: float
    reference: str | None
    quality: dict
    origins: str                     # one letter per token (A accepted draft, C corrected, B bonus, T target alone)
    origin_steps: list[int]          # tokens emitted per verify step, in order (they sum to new_tokens)
    accepted_chars: int              # characters of the accepted draft tokens, and of all proposed ones
    drafted_chars: int


class RunResult(TypedDict):
    """A results file."""

    specsweep_results: int           # RESULTS_VERSION
    config: dict                     # RunConfig.to_dict(): flat settings
    resolved: Resolved
    provenance: dict                 # pipeline.env_info.provenance: versions, machine, git commit
    metrics: Metrics
    measurement: dict                # pipeline.paired.summarize: repeats, timings, intervals, load, flags
    quality: dict                    # the task's scores (rougeL, wer, ...)
    samples: list[Sample]


def make_result(config: dict, resolved: Resolved, provenance: dict, metrics: Metrics, measurement: dict,
                quality: dict, samples: list[Sample]) -> RunResult:
    return RunResult(specsweep_results=RESULTS_VERSION, config=config, resolved=resolved, provenance=provenance,
                     metrics=metrics, measurement=measurement, quality=quality, samples=samples)


def write_result(path: str | os.PathLike, result: RunResult) -> None:
    """Write atomically (a reader never sees half a file; an earlier file survives a failure)."""
    missing = sorted(set(RunResult.__annotations__) - set(result))
    if missing:
        raise ValueError(f"a run result lacks {missing}")
    write_json_atomic(path, result)


def read_result(path: str | os.PathLike) -> RunResult | None:
    """The results file at ``path``; None for another kind of JSON (a benchmark's, a study's front).
    Unreadable JSON, or a file from a newer specsweep, is a one-line SpecsweepError."""
    path = Path(path)
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SpecsweepError(f"{path}: not readable JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(result, dict) or VERSION_KEY not in result:
        return None
    version = result[VERSION_KEY]
    if not isinstance(version, int) or version > RESULTS_VERSION:
        raise SpecsweepError(f"{path}: results version {version!r} is newer than this specsweep reads "
                             f"({RESULTS_VERSION}): update specsweep")
    return result
