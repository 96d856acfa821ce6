"""The ``cnn_dailymail`` task: news summarisation, as in the paper (Wagner et al., EMNLP 2024).

Data: ``abisee/cnn_dailymail`` (config ``3.0.0``) on the Hub, or a ``--source`` JSONL file of
``{"id", "article", "highlights"}`` lines (``id`` optional, default ``line-<n>``). Records:
``{"id": str, "article": str, "highlights": str}``; ``highlights`` keeps the dataset's newlines between reference
sentences (ROUGE-Lsum splits on them, see :mod:`pipeline.quality`).

Prompt: article + " Summary:" (the paper's cue), or with --chat-template the tokenizer's chat template around an
instruction and the article. The article is cut from its end, the cue always kept: to ``--max-prompt-tokens``
when given, and, by the long-inputs rule (:mod:`pipeline.tasks.base`), so that prompt + max_new_tokens +
max(γ, DRAFT_RESERVE) + 2 fits the target's positions. Scored with ROUGE against the highlights; the quality
objective is ROUGE-L.
"""

from __future__ import annotations

from pipeline.errors import SpecsweepError
from pipeline.tasks.base import Cuts, Encoder, HubDataset, QualityMetric, Task
from pipeline.tasks.text import DRAFT_RESERVE, PromptEncoder, chat_prompt, cut_tokens, left_padded

SUMMARY_CUE = " Summary:"
CHAT_INSTRUCTION = "Summarize the following news article in a few sentences.\n\n"
"""Positions kept free for the draft block when cutting articles: max(γ, this). The same for every γ up to it,
so runs with different γ and their γ = 0 baseline read the same (cut) articles and their quality compares."""


class CnnDailyMailTask(Task):
    name = "cnn_dailymail"
    display = "CNN/DailyMail"
    metric = QualityMetric("rougeL", 1.0, "ROUGE-L")
    hub = HubDataset("abisee/cnn_dailymail", "3.0.0", ("id", "article", "highlights"))
    columns = ("id", "article", "highlights")
    source_fields = ("article", "highlights")
    source_hint = 'a JSONL file of {"id", "article", "highlights"} lines'

    def encoder(self, target, tokenizer, processor, config) -> Encoder:
        from pipeline.models import max_positions  # kept local: imports torch

        return _Summaries(tokenizer, config, max_positions(target.config))

    def reference(self, record: dict) -> str | None:
        return record["highlights"]

    def score(self, predictions, records, tokenizer, seed):
        from pipeline.quality import rouge  # kept local: not loaded by `specsweep --help`

        result = rouge(predictions, [r["highlights"] for r in records], seed=seed)
        quality = dict(result.scores)
        quality["rouge_settings"] = result.settings
        return quality, result.per_sample


class _Summaries(PromptEncoder):
    """Summarisation prompts for one run: ``limit`` is the target's positions."""

    def __init__(self, tokenizer, config, positions: int | None) -> None:
        super().__init__(config, positions)
        self.tokenizer, self.chat = tokenizer, config.chat_template
        cue_tokens = len(tokenizer(SUMMARY_CUE, add_special_tokens=False).input_ids)
        self.budget = (None if config.max_prompt_tokens is None
                       else max(1, config.max_prompt_tokens - cue_tokens - 2))

    def prompt(self, article: str) -> str:
        return chat_prompt(self.tokenizer, CHAT_INSTRUCTION + article) if self.chat else article + SUMMARY_CUE

    def __call__(self, records: list[dict]) -> tuple[dict, Cuts]:
        texts, cuts = [], Cuts()
        for r in records:
            article, cut = cut_tokens(r["article"], self.tokenizer, self.budget)
            text, dropped = self.fit(r["id"], article)
            cuts += Cuts(int(cut or dropped > 0), int(dropped > 0), dropped, dropped)
            texts.append(text)
        return left_padded(texts, self.tokenizer, self.chat), cuts

    def fit(self, example_id: str, article: str) -> tuple[str, int]:
        """The prompt of ``article``, its end cut so that the prompt fits the target -> (prompt, article tokens
        cut). The decoded cut can re-tokenise longer, so the prompt is measured again until it fits."""
        text = self.prompt(article)
        excess = self.excess(text, self.tokenizer, self.chat)
        if excess <= 0:
            return text, 0
        if self.rule == "error":
            raise self.too_long(f"article {example_id!r}", excess, "cut long articles with --long-inputs truncate "
                                "(or --max-prompt-tokens N), or lower --max-new-tokens")
        ids = self.tokenizer(article, add_special_tokens=False).input_ids
        keep = len(ids)
        while excess > 0:
            keep -= excess
            if keep < 1:
                raise SpecsweepError(
                    f"the target's {self.limit} positions leave no room for an article: the prompt around it, "
                    f"max_new_tokens ({self.max_new_tokens}) and the draft block ({self.reserve}) take them all; lower "
                    "--max-new-tokens")
            text = self.prompt(self.tokenizer.decode(ids[:keep]))
            excess = self.excess(text, self.tokenizer, self.chat)
        return text, len(ids) - keep

    def warning(self, cuts: Cuts) -> str:
        return (f"{cuts.too_long} article(s) too long for the target's {self.limit} positions (prompt + "
                f"max_new_tokens + max(γ, {DRAFT_RESERVE}) + 2) were cut from the end to fit ({cuts.most:g} tokens "
                f"at most, {cuts.total:g} in all; the cue kept); --long-inputs error stops the run instead")
