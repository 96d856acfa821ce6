"""The ``librispeech`` task: English speech recognition with a Whisper target.

Data: ``openslr/librispeech_asr`` (config ``clean``) on the Hub, streamed with its audio left undecoded and
decoded here (:func:`pipeline.audio.decode_audio`), or a ``--source`` JSONL manifest of ``{"id", "file", "text"}``
lines whose ``file`` (WAV, FLAC or anything else libsndfile reads) is relative to the manifest's folder (or
absolute); ``id`` is optional (default: the file name's stem). Records: ``{"id": str, "text": str,
"audio": numpy.float32 [N], "duration": float}``: mono samples at :data:`pipeline.audio.SAMPLE_RATE` (16 kHz) in
[-1, 1], ``duration = N / SAMPLE_RATE`` seconds. In Parquet the audio is a large_list<float32> column.

Input: 16 kHz audio -> Whisper log-mel features; the decoder prompt is the tokenizer's prefix
(<|startoftranscript|>, <|en|><|transcribe|> for multilingual models, <|notimestamps|>). A clip longer than the
feature extractor's window (30 s for Whisper) is cut to it by the long-inputs rule (:mod:`pipeline.tasks.base`):
its WER then compares the cut audio with the full transcript. Scored with corpus WER after the model's own
English normaliser; the quality objective is -WER, and its ratio to the baseline is taken on word accuracy.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.tasks.base import Cuts, Encoder, HubDataset, QualityMetric, Task


class LibriSpeechTask(Task):
    name = "librispeech"
    display = "LibriSpeech"
    speech = True
    metric = QualityMetric("wer", -1.0, "WER", error_rate=True)
    hub = HubDataset("openslr/librispeech_asr", "clean", ("id", "audio", "text"))
    columns = ("id", "text", "audio", "duration")
    source_fields = ("file", "text")
    source_hint = 'a JSONL manifest of {"id", "file", "text"} lines, audio files relative to it'

    # ------------------------------------------------------------------------------------------------- data

    def source_row(self, obj: dict, line: int, path: Path) -> dict:
        """-> ``{"id", "text", "audio_path"}``, the audio file checked to exist."""
        audio_path = Path(obj["file"])
        if not audio_path.is_absolute():
            audio_path = path.parent / audio_path
        if not audio_path.is_file():
            raise SpecsweepError(f"{path} line {line}: audio file {obj['file']!r} does not exist "
                                 f"(looked for {audio_path})")
        return {"id": obj.get("id", audio_path.stem), "text": obj["text"], "audio_path": audio_path}

    def hub_stream(self, ds):
        import datasets

        return ds.cast_column("audio", datasets.Audio(decode=False))

    def hub_row(self, row: dict) -> dict:
        """-> ``{"id", "text", "audio_bytes"}`` (the file's bytes, read from a local path when the row has one)."""
        example_id = str(row["id"])
        audio = row["audio"] or {}
        data = audio.get("bytes")
        if data is None and audio.get("path") and Path(audio["path"]).is_file():
            data = Path(audio["path"]).read_bytes()
        if not data:
            raise SpecsweepError(f"{self.hub.repo_id}: example {example_id!r} has no audio bytes")
        return {"id": example_id, "text": row["text"], "audio_bytes": data}

    def finish(self, rows: list[dict], progress: bool) -> list[dict]:
        """Decodes each row's ``audio_path`` or ``audio_bytes``."""
        from tqdm.auto import tqdm

        from pipeline.audio import SAMPLE_RATE, decode_audio  # kept local: not loaded by `specsweep --help`

        records = []
        for row in tqdm(rows, desc="decoding audio", unit="clip", disable=not progress or None, leave=False):
            if "audio_path" in row:
                audio = decode_audio(row["audio_path"])
            else:
                audio = decode_audio(row["audio_bytes"], name=f"audio of example {row['id']!r}")
            records.append({"id": row["id"], "text": row["text"], "audio": audio,
                            "duration": audio.shape[0] / SAMPLE_RATE})
        return records

    def to_table(self, records: list[dict]):
        import numpy as np
        import pyarrow as pa

        lengths = np.array([r["audio"].shape[0] for r in records], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        values = np.concatenate([r["audio"] for r in records]).astype(np.float32, copy=False)
        audio = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, pa.float32()))
        return pa.table({
            "id": pa.array([r["id"] for r in records], pa.string()),
            "text": pa.array([r["text"] for r in records], pa.string()),
            "audio": audio,
            "duration": pa.array([r["duration"] for r in records], pa.float64()),
        })

    def from_table(self, table) -> list[dict]:
        import numpy as np

        from pipeline.audio import SAMPLE_RATE  # kept local: not loaded by `specsweep --help`

        ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
        audios: list[np.ndarray] = []
        for chunk in table.column("audio").chunks:
            offsets = chunk.offsets.to_numpy()
            values = chunk.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
            audios.extend(values[offsets[i]:offsets[i + 1]].copy() for i in range(len(chunk)))
        return [{"id": i, "text": t, "audio": a, "duration": a.shape[0] / SAMPLE_RATE}
                for i, t, a in zip(ids, texts, audios)]

    def manifest_extra(self, records: list[dict]) -> dict:
        from pipeline.audio import MAX_AUDIO_SECONDS, SAMPLE_RATE  # kept local: not loaded by `specsweep --help`

        durations = [r["duration"] for r in records]
        return {"sample_rate": SAMPLE_RATE, "total_seconds": round(sum(durations), 3),
                "max_seconds": round(max(durations), 3),
                "n_over_max_seconds": sum(d > MAX_AUDIO_SECONDS for d in durations)}

    def fetch_summary(self, manifest: dict) -> str:
        from pipeline.audio import MAX_AUDIO_SECONDS  # kept local: not loaded by `specsweep --help`

        return (f", {manifest['total_seconds']:.1f} s of audio, "
                f"{manifest['n_over_max_seconds']} clip(s) over {MAX_AUDIO_SECONDS:.0f} s")

    # ------------------------------------------------------------------------------------------------- runs

    def decoder_prompt(self, model, tokenizer) -> list[int]:
        """Whisper's decoder prompt for English transcription without timestamps."""
        if getattr(model.generation_config, "is_multilingual", False):
            tokenizer.set_prefix_tokens(language="english", task="transcribe", predict_timestamps=False)
        else:
            tokenizer.set_prefix_tokens(predict_timestamps=False)
        return list(tokenizer.prefix_tokens)

    def encoder(self, target, tokenizer, processor, config) -> Encoder:
        return _Clips(processor.feature_extractor, self.decoder_prompt(target, tokenizer), config.long_inputs)

    def reference(self, record: dict) -> str | None:
        return record["text"]

    def score(self, predictions, records, tokenizer, seed):
        from pipeline.quality import wer  # kept local: not loaded by `specsweep --help`

        result = wer(predictions, [r["text"] for r in records], tokenizer=tokenizer)
        return ({"wer": result.wer, "normalizer": result.normalizer, "reference_words": result.reference_words},
                [{"wer": s["wer"]} for s in result.per_sample])


class _Clips(Encoder):
    """Whisper inputs for one run: ``limit`` is the feature extractor's window in seconds."""

    unit = "seconds"
    truncated_key = "audio_truncated"

    def __init__(self, feature_extractor, prompt: list[int], rule: str) -> None:
        super().__init__(rule, feature_extractor.chunk_length)
        self.fe, self.prompt = feature_extractor, prompt

    def __call__(self, records: list[dict]) -> tuple[dict, Cuts]:
        """-> ({"input_ids", "attention_mask": the decoder prompt [B, P], "encoder_inputs": {"input_features"}},
        cuts)."""
        import torch

        from pipeline.audio import SAMPLE_RATE, truncate_audio  # kept local: not loaded by `specsweep --help`

        audios, cuts = [], Cuts()
        for r in records:
            cut = truncate_audio(r["audio"], max_seconds=self.limit, sample_rate=SAMPLE_RATE)
            if cut.truncated:
                if self.rule == "error":
                    raise SpecsweepError(f"clip {r['id']!r} is {cut.original_seconds:.1f} s, longer than the model's "
                                         f"{self.limit} s window: cut long clips with --long-inputs truncate, or "
                                         "leave them out of the data")
                lost = cut.original_seconds - self.limit
                cuts += Cuts(1, 1, lost, lost)
            audios.append(cut.audio)
        features = self.fe(audios, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        ids = torch.tensor([list(self.prompt)] * len(records), dtype=torch.int64)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "encoder_inputs": {"input_features": features}}, cuts

    def warning(self, cuts: Cuts) -> str:
        return (f"{cuts.too_long} clip(s) longer than the model's {self.limit} s window were cut to it "
                f"({cuts.most:.1f} s at most, {cuts.total:.1f} s in all); their WER compares the cut audio with the "
                "full transcript; --long-inputs error stops the run instead")
