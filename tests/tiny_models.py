"""Tiny synthetic pairs for the tests (see pipeline/synthetic.py) and prompts in their vocabulary."""

from pipeline.synthetic import WORDS, build_model, build_tokenizer, noisy_copy, save_pair  # noqa: F401

PROMPTS = [
    "the storm hit the city",
    "police said the plane was",
    "a new report",
    "the president of the world team said that the game was not",
    "water",
]
