"""Tasks: what a run reads, how it builds the model input, and how it scores the output.

    prompts        JSONL of {"id", "prompt"}; no quality metric
    cnn_dailymail  article + " Summary:" (the paper's cue), scored with ROUGE against the highlights

A task turns records into prompt strings (recording what it truncated) and scores decoded predictions.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import SpecsweepError

SUMMARY_CUE = " Summary:"
CHAT_INSTRUCTION = "Summarize the following news article in a few sentences.\n\n"


class PromptsTask:
    name = "prompts"

    def load(self, path: str, limit: int | None, seed: int | None) -> list[dict]:
        from pipeline.data import read_jsonl, select_subset

        p = Path(path)
        if p.is_dir() or p.suffix not in (".jsonl", ".json"):
            raise SpecsweepError(f"--task prompts reads a JSONL file of {{'id', 'prompt'}} lines; got {path}")
        rows = ((obj.get("id", f"line-{n}"), {"id": obj.get("id", f"line-{n}"), "prompt": obj["prompt"]})
                for n, obj in read_jsonl(p, ("prompt",)))
        kept, _ = select_subset(rows, limit, seed)
        records = [r for _, _, r in kept]
        if not records:
            raise SpecsweepError(f"{path}: no prompts (empty data file)")
        return records

    def prompts(self, records: list[dict], tokenizer, max_prompt_tokens: int | None, chat: bool):
        """-> (prompt strings, number of prompts truncated)."""
        texts, truncated = [], 0
        for r in records:
            text, cut = _truncate(r["prompt"], tokenizer, max_prompt_tokens)
            truncated += cut
            texts.append(_chat(tokenizer, text) if chat else text)
        return texts, truncated

    def reference(self, record: dict) -> str | None:
        return None

    def score(self, predictions: list[str], records: list[dict], tokenizer, seed: int) -> tuple[dict, list[dict]]:
        return {}, [{} for _ in predictions]


class CnnDailyMailTask(PromptsTask):
    name = "cnn_dailymail"

    def load(self, path: str, limit: int | None, seed: int | None) -> list[dict]:
        from pipeline.data import load_task_data

        return load_task_data("cnn_dailymail", path, limit=limit, seed=seed)

    def prompts(self, records: list[dict], tokenizer, max_prompt_tokens: int | None, chat: bool):
        """Prompt = article + " Summary:" (or the chat template around an instruction and the article).
        Articles longer than the budget are cut from the end; the cue is always kept."""
        cue_tokens = len(tokenizer(SUMMARY_CUE, add_special_tokens=False).input_ids)
        budget = None if max_prompt_tokens is None else max(1, max_prompt_tokens - cue_tokens - 2)
        texts, truncated = [], 0
        for r in records:
            article, cut = _truncate(r["article"], tokenizer, budget)
            truncated += cut
            texts.append(_chat(tokenizer, CHAT_INSTRUCTION + article) if chat else article + SUMMARY_CUE)
        return texts, truncated

    def reference(self, record: dict) -> str | None:
        return record["highlights"]

    def score(self, predictions, records, tokenizer, seed):
        from pipeline.metrics import rouge

        result = rouge(predictions, [r["highlights"] for r in records], seed=seed)
        quality = {k: v for k, v in result.scores.items()}
        quality["rouge_settings"] = result.settings
        return quality, result.per_sample


TASKS = {"prompts": PromptsTask, "cnn_dailymail": CnnDailyMailTask}


def get_task(name: str):
    if name not in TASKS:
        raise SpecsweepError(f"unknown task {name!r}: choose one of {list(TASKS)}")
    return TASKS[name]()


def _truncate(text: str, tokenizer, max_tokens: int | None) -> tuple[str, int]:
    if max_tokens is None:
        return text, 0
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) <= max_tokens:
        return text, 0
    return tokenizer.decode(ids[:max_tokens]), 1


def _chat(tokenizer, content: str) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise SpecsweepError("--chat-template asked for, but the target's tokenizer has no chat template: "
                             "drop --chat-template")
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)
