"""Tasks: what a run reads, how it builds the model input, and how it scores the output.

    prompts        JSONL of {"id", "prompt"}; no quality metric
    cnn_dailymail  article + " Summary:" (the paper's cue), scored with ROUGE against the highlights
    librispeech    16 kHz audio -> Whisper log-mel features; the decoder prompt is the tokenizer's prefix
                   (<|startoftranscript|>, <|en|><|transcribe|> for multilingual models, <|notimestamps|>);
                   scored with corpus WER after the model's own English normaliser

A task reads its records, turns a batch of them into engine inputs (``encode``, which also counts what it
had to truncate) and scores decoded predictions.
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

    speech = False

    def encode(self, records: list[dict], tokenizer, config, processor=None) -> tuple[dict, int]:
        """-> ({"input_ids", "attention_mask"} left-padded int64 [B, L], number of prompts truncated)."""
        texts, truncated = self.prompts(records, tokenizer, config.max_prompt_tokens, config.chat_template)
        enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left",
                        add_special_tokens=not config.chat_template)
        return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask}, truncated

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


class LibriSpeechTask:
    """ASR with a Whisper target. Clips longer than the feature extractor's window (30 s for Whisper) are cut
    to the window, counted, and reported: their WER then compares the cut audio with the full transcript."""

    name = "librispeech"
    speech = True

    def load(self, path: str, limit: int | None, seed: int | None) -> list[dict]:
        from pipeline.data import load_task_data

        return load_task_data("librispeech", path, limit=limit, seed=seed)

    def decoder_prompt(self, model, tokenizer) -> list[int]:
        """Whisper's decoder prompt for English transcription without timestamps."""
        if getattr(model.generation_config, "is_multilingual", False):
            tokenizer.set_prefix_tokens(language="english", task="transcribe", predict_timestamps=False)
        else:
            tokenizer.set_prefix_tokens(predict_timestamps=False)
        return list(tokenizer.prefix_tokens)

    def encode(self, records: list[dict], tokenizer, config, processor=None, prompt: list[int] = ()):
        """-> ({"input_ids", "attention_mask": the decoder prompt [B, P], "encoder_inputs": {"input_features"}},
        number of clips truncated to the window)."""
        import torch

        from pipeline.data import SAMPLE_RATE, truncate_audio

        fe = processor.feature_extractor
        audios, truncated = [], 0
        for r in records:
            cut = truncate_audio(r["audio"], max_seconds=fe.chunk_length, sample_rate=SAMPLE_RATE)
            truncated += cut.truncated
            audios.append(cut.audio)
        features = fe(audios, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        ids = torch.tensor([list(prompt)] * len(records), dtype=torch.int64)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "encoder_inputs": {"input_features": features}}, truncated

    def reference(self, record: dict) -> str | None:
        return record["text"]

    def score(self, predictions, records, tokenizer, seed):
        from pipeline.metrics import wer

        result = wer(predictions, [r["text"] for r in records], tokenizer=tokenizer)
        return ({"wer": result.wer, "normalizer": result.normalizer, "reference_words": result.reference_words},
                [{"wer": s["wer"]} for s in result.per_sample])


TASKS = {"prompts": PromptsTask, "cnn_dailymail": CnnDailyMailTask, "librispeech": LibriSpeechTask}


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
