"""The ``prompts`` task: free-form prompts from a JSONL file of ``{"id", "prompt"}`` lines (``id`` optional,
default ``line-<n>``), continued by the target; no reference and no quality metric, so runs of it measure speed
and acceptance only.

A prompt is cut to ``--max-prompt-tokens`` when given (from the end, counted in the results). A prompt too long
for the target is not cut (cutting its end would change what the model continues): the engine stops the run
with a one-line error.
"""

from __future__ import annotations

from pipeline.tasks.base import Cuts, Encoder, Task
from pipeline.tasks.text import chat_prompt, cut_tokens, left_padded


class PromptsTask(Task):
    name = "prompts"
    display = "prompts"
    columns = ("id", "prompt")
    source_fields = ("prompt",)
    source_hint = 'a JSONL file of {"id", "prompt"} lines'

    def encoder(self, target, tokenizer, processor, config) -> Encoder:
        return _Prompts(tokenizer, config.max_prompt_tokens, config.chat_template)


class _Prompts(Encoder):
    unit = "tokens"
    truncated_key = "prompts_truncated"

    def __init__(self, tokenizer, max_prompt_tokens: int | None, chat: bool) -> None:
        super().__init__("error", None)  # the engine's check: a prompt too long for the target stops the run
        self.tokenizer, self.max_prompt_tokens, self.chat = tokenizer, max_prompt_tokens, chat

    def __call__(self, records: list[dict]) -> tuple[dict, Cuts]:
        texts, cuts = [], Cuts()
        for r in records:
            text, cut = cut_tokens(r["prompt"], self.tokenizer, self.max_prompt_tokens)
            cuts += Cuts(truncated=cut)
            texts.append(chat_prompt(self.tokenizer, text) if self.chat else text)
        return left_padded(texts, self.tokenizer, self.chat), cuts

    def record(self, cuts: Cuts) -> dict:
        return {self.truncated_key: cuts.truncated}
