"""Tiny synthetic pairs for the tests (see pipeline/synthetic.py) and prompts in their vocabulary."""

import json

from pipeline.synthetic import WORDS, build_model, build_tokenizer, noisy_copy, save_pair  # noqa: F401

PROMPTS = [
    "the storm hit the city",
    "police said the plane was",
    "a new report",
    "the president of the world team said that the game was not",
    "water",
]


def write_prompts(path):
    """A prompts-task JSONL of PROMPTS: {id: p<i>, prompt}."""
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return path


def write_articles(path, n: int, repeat: int):
    """A CNN/DailyMail-schema JSONL of n rows: article = prompt i repeated ``repeat`` times, highlights = prompt i."""
    path.write_text("".join(json.dumps({"id": f"a{i}", "article": " ".join([p] * repeat), "highlights": p}) + "\n"
                            for i, p in enumerate(PROMPTS[:n])))
    return path
