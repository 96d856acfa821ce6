"""The task registry: every task a run can use, one module each, and the lookups the rest of the project reads.

    prompts        pipeline/tasks/prompts.py        JSONL of {"id", "prompt"}; no quality metric
    cnn_dailymail  pipeline/tasks/cnn_dailymail.py  article + " Summary:", ROUGE against the highlights
    librispeech    pipeline/tasks/librispeech.py    Whisper ASR of 16 kHz audio, corpus WER
    spec_bench     pipeline/tasks/spec_bench.py     Spec-Bench's questions as chat conversations, per category

What a task is (its interface, its quality metric, the long-inputs rule) is :mod:`pipeline.tasks.base`.
``RunConfig``'s task choices, `specsweep fetch`'s ``--task`` choices (:data:`FETCHABLE`), pipeline/data.py,
the objectives (pipeline/objectives.py), the runner and the report all read this registry. Adding a task is
adding its module and its line in :data:`_TASKS`. Importing the registry imports no torch, numpy,
transformers, datasets or pyarrow, so ``specsweep --help`` stays fast.
"""

from __future__ import annotations

from pipeline.errors import SpecsweepError
from pipeline.tasks.base import LONG_INPUTS, QualityMetric, Task
from pipeline.tasks.cnn_dailymail import CnnDailyMailTask
from pipeline.tasks.librispeech import LibriSpeechTask
from pipeline.tasks.prompts import PromptsTask
from pipeline.tasks.spec_bench import SpecBenchTask

__all__ = ["FETCHABLE", "LONG_INPUTS", "TASK_NAMES", "default_temperature", "get_task", "quality_metric"]

_TASKS: dict[str, Task] = {task.name: task for task in (PromptsTask(), CnnDailyMailTask(), LibriSpeechTask(),
                                                         SpecBenchTask())}

TASK_NAMES: tuple[str, ...] = tuple(_TASKS)
"""Every task's name, in the order --help lists them."""

FETCHABLE: tuple[str, ...] = tuple(name for name, task in _TASKS.items() if task.fetchable)
"""The tasks with data on the Hub or a published file: `specsweep fetch`'s choices."""


def get_task(name: str) -> Task:
    """The task called ``name``; a :class:`SpecsweepError` naming the known tasks otherwise."""
    try:
        return _TASKS[name]
    except KeyError:
        raise SpecsweepError(f"unknown task {name!r}: choose one of {list(_TASKS)}") from None


def quality_metric(name: str) -> QualityMetric | None:
    """The quality metric of task ``name``; None for a task without one (or a name that is no task, as a runs
    table row without a task has)."""
    task = _TASKS.get(name)
    return task.metric if task is not None else None


def default_temperature(name: str) -> float:
    """The temperature a run of task ``name`` samples at when none is given (1.0 for a name that is no task: the
    run's validation refuses it)."""
    task = _TASKS.get(name)
    return task.default_temperature if task is not None else 1.0
