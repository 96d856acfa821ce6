"""The prompts a benchmark decodes, built as `specsweep run` builds them: the task's records (its data file,
``--limit`` by the run's subset rule) through the task's own encoder (chat template, ``--max-prompt-tokens``, the
long-inputs rule), one batch-1 encoding per record. A record is one prompt here: a task whose later prompts read
earlier outputs (spec_bench's second turns) is beyond it."""

from __future__ import annotations

from pipeline.config import RunConfig
from pipeline.data import load_task_data
from pipeline.tasks import get_task


def prompts_of(config: RunConfig, target, tokenizer) -> list[dict]:
    """The run's prompts for ``target`` and its ``tokenizer``: one dict per record, as the task's encoder returns a
    batch of one: ``input_ids`` and ``attention_mask`` int64 [1, L], ``prompt_texts`` [the prompt's text]."""
    records = load_task_data(config.task, config.data, config.limit, config.seed if config.limit else None)
    encode = get_task(config.task).encoder(target, tokenizer, None, config)
    return [encode([record])[0] for record in records]
