"""Helpers the text tasks share: cutting a text to a number of tokens, the chat-template wrapper, a left-padded
batch of prompts, and the encoder base that knows how many prompt tokens the target takes."""

from __future__ import annotations

from pipeline.errors import SpecsweepError
from pipeline.tasks.base import Encoder

DRAFT_RESERVE = 8
"""Positions kept beyond max_new_tokens for the last draft block: max(γ, DRAFT_RESERVE)."""


def cut_tokens(text: str, tokenizer, max_tokens: int | None) -> tuple[str, int]:
    """``text`` cut to its first ``max_tokens`` tokens (no special tokens) -> (text, 1 if it was cut else 0)."""
    if max_tokens is None:
        return text, 0
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) <= max_tokens:
        return text, 0
    return tokenizer.decode(ids[:max_tokens]), 1


def check_chat_template(tokenizer) -> None:
    """A one-line SpecsweepError where ``tokenizer`` has no chat template (--chat-template asked for one)."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecsweepError("--chat-template asked for, but the target's tokenizer has no chat template: "
                             "drop --chat-template")


def chat_prompt(tokenizer, content: str) -> str:
    """One user turn of the tokenizer's chat template, ending with the assistant's generation prompt."""
    check_chat_template(tokenizer)
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def prompt_length(text: str, tokenizer, chat: bool) -> int:
    """Tokens of one prompt as :func:`left_padded` encodes it."""
    return len(tokenizer(text, add_special_tokens=not chat).input_ids)


def left_padded(texts: list[str], tokenizer, chat: bool) -> dict:
    """Prompts -> ``{"input_ids", "attention_mask"}`` left-padded int64 [B, L] (a chat template brings its own
    special tokens), and ``"prompt_texts"``: the texts, which a draft with another tokenizer reads."""
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=not chat)
    return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "prompt_texts": list(texts)}


class PromptEncoder(Encoder):
    """A text encoder whose prompts must fit the target's ``positions`` (None: no known limit): a prompt may take
    ``room`` = positions − max_new_tokens − max(γ, DRAFT_RESERVE) − 2 tokens."""

    unit = "tokens"
    truncated_key = "prompts_truncated"

    def __init__(self, config, positions: int | None) -> None:
        super().__init__(config.long_inputs, positions)
        self.max_new_tokens = config.max_new_tokens
        self.reserve = max(config.gamma, DRAFT_RESERVE)
        self.room = None if positions is None else positions - config.max_new_tokens - self.reserve - 2

    def excess(self, text: str, tokenizer, chat: bool) -> int:
        """Tokens of ``text`` past the room (<= 0: it fits)."""
        return 0 if self.room is None else prompt_length(text, tokenizer, chat) - self.room

    def too_long(self, what: str, excess: int, remedy: str) -> SpecsweepError:
        """The one-line refusal of a prompt ``excess`` tokens past the room (``--long-inputs error``)."""
        return SpecsweepError(
            f"{what} is too long for the target: its prompt ({self.room + excess} tokens) + max_new_tokens "
            f"({self.max_new_tokens}) + max(γ, {DRAFT_RESERVE}) ({self.reserve}) + 2 exceeds the target's "
            f"{self.limit} positions; {remedy}")
