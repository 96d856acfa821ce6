"""Helpers the text tasks share: cutting a text to a number of tokens, the chat-template wrapper, and a
left-padded batch of prompts."""

from __future__ import annotations

from pipeline.errors import SpecsweepError


def cut_tokens(text: str, tokenizer, max_tokens: int | None) -> tuple[str, int]:
    """``text`` cut to its first ``max_tokens`` tokens (no special tokens) -> (text, 1 if it was cut else 0)."""
    if max_tokens is None:
        return text, 0
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) <= max_tokens:
        return text, 0
    return tokenizer.decode(ids[:max_tokens]), 1


def chat_prompt(tokenizer, content: str) -> str:
    """One user turn of the tokenizer's chat template, ending with the assistant's generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecsweepError("--chat-template asked for, but the target's tokenizer has no chat template: "
                             "drop --chat-template")
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
