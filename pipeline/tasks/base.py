"""What a task is: the :class:`Task` interface each module in pipeline/tasks/ implements, the records that
describe a task (its :class:`QualityMetric`, its :class:`HubDataset`), and the long-inputs rule's pieces
(:data:`LONG_INPUTS`, :class:`Cuts`, :class:`Encoder`).

A task owns everything about itself: where its data lives on the Hub and which columns it reads, the shape of
a ``--source`` JSONL line, how a Hub row or a source line becomes a record and how records become a Parquet
table and back (pipeline/data.py does the reading, subsetting and writing, and asks the task for these), how a
batch of records becomes engine inputs for one run's model, how predictions are scored, and its quality
metric (key, direction, display name) that the objectives and the report read.

Long inputs, one rule for every task: an input longer than the model takes (an article whose prompt +
max_new_tokens + γ + 2 exceeds the target's positions, a clip longer than Whisper's window) is cut to fit
(``"truncate"``, the default: the run warns once, and its results count the cut inputs and how much was cut)
or stops the run with a one-line error (``"error"``). The run's setting is ``RunConfig.long_inputs``.

A task whose prompts depend on what the run decoded (a conversation, each turn built from the model's own earlier
answers: ``spec_bench``) splits its records into decode units (:meth:`Task.decode_units`), batches them so that
no unit shares a batch with a unit it depends on (:meth:`Task.batches`), and reads the answers through
:meth:`Encoder.answered`. A task with categories may time them apart (:meth:`Task.timing_groups`), score against
the γ = 0 loop's own outputs (:attr:`Task.wants_ar_outputs`, :meth:`Task.score_run`) and add per-category
metrics to a run's results (:meth:`Task.run_metrics`). Every hook has a default that leaves a task without them
as it was.

Nothing here imports torch, numpy, transformers, datasets or pyarrow at import time (``specsweep --help`` reads
the registry): a task imports what it needs inside the method that needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import SpecsweepError

LONG_INPUTS = ("truncate", "error")
"""The long-inputs rule's choices: cut an input to fit the model, or stop the run."""


@dataclass(frozen=True)
class QualityMetric:
    """A task's quality objective: ``results["quality"][key]``."""

    key: str                  # the score's key in a run's quality (and a column of the runs table)
    sign: float               # +1.0: higher is better (ROUGE-L); -1.0: lower is better (WER)
    display: str              # its name in the report
    error_rate: bool = False  # an error rate: its ratio to the baseline's is taken on 1 - value (floored at 0)


@dataclass(frozen=True)
class HubDataset:
    """Where a task's data lives on the Hugging Face Hub."""

    repo_id: str
    config: str
    columns: tuple[str, ...]  # the columns read (streamed) from the Hub


@dataclass(frozen=True)
class Cuts:
    """What encoding cut off inputs, per batch; ``+`` sums batches. ``most`` and ``total`` are in the
    encoder's unit (tokens of text, seconds of audio) and count only the cuts made to fit the model."""

    truncated: int = 0   # inputs the model sees cut, whatever the reason (--max-prompt-tokens, the window)
    too_long: int = 0    # of them, inputs longer than the model takes, cut by the long-inputs rule
    most: float = 0      # the most cut off one of those
    total: float = 0     # all cut off them

    def __add__(self, other: Cuts) -> Cuts:
        return Cuts(self.truncated + other.truncated, self.too_long + other.too_long, max(self.most, other.most),
                    self.total + other.total)


class Encoder:
    """One run's input builder: ``encoder(records) -> (engine inputs, Cuts)``, where engine inputs are
    ``{"input_ids", "attention_mask"}`` (left-padded int64 [B, L]) and, for an encoder-decoder model,
    ``"encoder_inputs"``. ``limit`` is what the model takes, in ``unit`` (None: no known limit); ``rule`` the
    long-inputs rule; ``truncated_key`` the results' name for the count of cut inputs."""

    unit: str
    truncated_key: str

    def __init__(self, rule: str, limit: float | None) -> None:
        self.rule, self.limit = rule, limit

    def __call__(self, records: list[dict]) -> tuple[dict, Cuts]:
        raise NotImplementedError

    def answered(self, records: list[dict], texts: list[str]) -> None:
        """What the run decoded for ``records`` (their output texts, in order). A conversation task builds later turns
        from it; the default ignores it."""

    def warning(self, cuts: Cuts) -> str:
        """The one line a run prints when it cut inputs to fit the model (``cuts.too_long > 0``)."""
        raise NotImplementedError

    def record(self, cuts: Cuts) -> dict:
        """What ``results["resolved"]`` records about the run's cuts."""
        return {self.truncated_key: cuts.truncated,
                "long_inputs": {"rule": self.rule, "limit": self.limit, "unit": self.unit, "cut": cuts.too_long,
                                "most_cut": cuts.most, "total_cut": cuts.total}}


class Task:
    """One task. A module in pipeline/tasks/ subclasses it, sets the class attributes and overrides what differs;
    the registry (pipeline/tasks/__init__.py) holds one instance per name. The defaults describe a text task whose
    records are flat string fields (``columns``)."""

    name: str
    display: str                        # the task's name in the report and in --help
    speech = False                      # True: a speech-to-text target (processor + encoder-decoder model)
    metric: QualityMetric | None = None
    hub: HubDataset | None = None       # None: the task reads local files only (`specsweep fetch` cannot fetch it)
    url: str | None = None              # or one published JSONL file in the --source schema (`specsweep fetch`)
    columns: tuple[str, ...]            # the fields of a record, and the Parquet columns `specsweep fetch` writes
    source_fields: tuple[str, ...]      # required (string) keys of a --source JSONL line
    source_hint: str                    # the --source shape, for help and error messages

    # ----------------------------------------------------------------------------------- data (pipeline/data.py)

    def source_row(self, obj: dict, line: int, path: Path) -> dict:
        """A --source JSONL object (checked to hold :attr:`source_fields`) -> an undecoded row with an ``"id"``
        (default ``line-<n>``)."""
        return {"id": obj.get("id", f"line-{line}"), **{k: obj[k] for k in self.columns if k != "id"}}

    def hub_stream(self, ds):
        """The streamed Hub split, prepared for reading :attr:`HubDataset.columns` (e.g. audio left undecoded)."""
        return ds

    def hub_row(self, row: dict) -> dict:
        """A streamed Hub row -> an undecoded row with a string ``"id"``."""
        return {k: str(row[k]) if k == "id" else row[k] for k in self.columns}

    def finish(self, rows: list[dict], progress: bool) -> list[dict]:
        """Undecoded rows of the chosen subset -> records (e.g. audio decoded)."""
        return rows

    def to_table(self, records: list[dict]):
        """Records -> a pyarrow Table of :attr:`columns`."""
        import pyarrow as pa

        return pa.table({k: pa.array([r[k] for r in records], pa.string()) for k in self.columns})

    def from_table(self, table) -> list[dict]:
        """A pyarrow Table holding :attr:`columns` -> records."""
        columns = [table.column(c).to_pylist() for c in self.columns]
        return [dict(zip(self.columns, values)) for values in zip(*columns)]

    def manifest_extra(self, records: list[dict]) -> dict:
        """Task-specific entries of a fetch manifest."""
        return {}

    def fetch_summary(self, manifest: dict) -> str:
        """What `specsweep fetch` adds to its one-line summary (", ..." or "")."""
        return ""

    @property
    def fetchable(self) -> bool:
        """`specsweep fetch` can fetch the task's data (from the Hub, or its published file)."""
        return self.hub is not None or self.url is not None

    def select(self, records: list[dict], categories: list[str] | None, per_category: int | None) -> list[dict]:
        """The records of ``categories`` (None: all), the first ``per_category`` of each (None: all), in order. Only
        a task whose records have categories selects by them."""
        if categories is None and per_category is None:
            return records
        raise SpecsweepError(f"--categories and --per-category select categories of a task that has them; --task "
                             f"{self.name} has none")

    # ------------------------------------------------------------------------------- runs (pipeline/runner.py)

    def check_config(self, config) -> None:
        """Settings this task cannot run with (``RunConfig.validate`` asks, before anything loads): a one-line
        :class:`SpecsweepError`."""
        if getattr(config, "categories", None) is not None or getattr(config, "per_category", None) is not None:
            self.select([], config.categories_list(), config.per_category)

    def check_target(self, config) -> None:
        """A target this task cannot run with, refused before the models load (a one-line
        :class:`SpecsweepError`); the default checks nothing."""

    def decode_units(self, records: list[dict]) -> list[dict]:
        """Records -> what a run decodes, one prompt each (the default: the records themselves)."""
        return records

    def batches(self, units: list[dict], size: int) -> list[list[dict]]:
        """Decode units -> batches of at most ``size``, in order; a unit never shares a batch with one whose output
        its prompt reads (the default: consecutive units)."""
        return [units[i: i + size] for i in range(0, len(units), size)]

    def timing_groups(self, units: list[dict], per_group: int) -> dict[str, list[dict]] | None:
        """The units a run's paired timing decodes, by group, each group's loops timed back to back in every repeat
        (pipeline/paired.py ``time_groups``); None: the first ``per_group`` units, as one."""
        return None


    def encoder(self, target, tokenizer, processor, config) -> Encoder:
        """The run's :class:`Encoder` for ``target`` (its tokenizer and, for speech, its processor)."""
        raise NotImplementedError

    def reference(self, record: dict) -> str | None:
        """The reference text a prediction is scored against (None: the task is not scored)."""
        return None

    def score(self, predictions: list[str], records: list[dict], tokenizer, seed: int) -> tuple[dict, list[dict]]:
        """-> (corpus-level quality, per-sample quality)."""
        return {}, [{} for _ in predictions]

    wants_ar_outputs = False
    """True: the run scores against the γ = 0 loop's own outputs (:meth:`score_run`'s ``ar_samples``)."""

    default_temperature = 1.0
    """The temperature a run of this task samples at when --temperature is not given."""

    def quality_error(self, temperature: float) -> str | None:
        """Why this task's quality score is not defined at ``temperature`` (None: it is, or the task has none).
        `specsweep tune`, whose objective is the quality, refuses such a study in one line."""
        return None

    def score_run(self, samples: list[dict], records: list[dict], tokenizer, seed: int,
                  ar_samples: list[dict] | None) -> tuple[dict, list[dict]]:
        """A run's quality from its samples (pipeline/result.py ``Sample``) -> (corpus-level, per sample). The
        default scores the output texts (:meth:`score`); ``ar_samples``: the γ = 0 loop's samples of the same
        records, with :attr:`wants_ar_outputs` (None where they are not compared: T > 0)."""
        return self.score([s["text"] for s in samples], records, tokenizer, seed)

    def run_metrics(self, records: list[dict], samples: list[dict], measurement: dict) -> dict:
        """Metrics a run adds to its results beyond the common ones (e.g. per category), from its decode units, its
        scored samples and its measurement record; the default adds none."""
        return {}
