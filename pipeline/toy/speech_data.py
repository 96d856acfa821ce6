"""A generated ASR task with the shape of LibriSpeech: WAV clips and a JSONL manifest ``{id, file, text}``.

Each utterance is 2 to 5 words drawn uniformly and independently from :data:`WORDS`, so no language prior
helps: a decoder that ignores the audio can only guess (about 1 word in ``len(WORDS)``). The words are
rendered by :mod:`pipeline.toy.speech_synth` (each word its own three-segment sound) with a fresh random
speaker, speed and noise level per clip.
Clips are at most :data:`MAX_SECONDS` long (longer draws are redrawn with fewer words).

Layout written by :func:`generate` (the manifest's ``file`` is relative to the manifest's folder, as
:func:`pipeline.data.load_task_data` reads it for ``librispeech``)::

    <out>/train/manifest.jsonl   <out>/train/wav/train-00000.wav ...
    <out>/test/manifest.jsonl    <out>/test/wav/test-00000.wav ...

WAV files are 16-bit PCM, 16 kHz, mono; the same seed writes the same bytes.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from pipeline.io import write_text_atomic
from pipeline.toy import speech_synth

WORDS = speech_synth.LEXICON

MIN_WORDS, MAX_WORDS = 2, 5
MAX_SECONDS = 1.95
CHUNK_SECONDS = 2
"""The feature extractor's window (``chunk_length``) that the toy Whisper models are built for."""

TRAIN_CLIPS = 2000
TEST_CLIPS = 100
QUICK_TRAIN_CLIPS = 16
QUICK_TEST_CLIPS = 4


def make_utterance(rng: np.random.Generator) -> tuple[str, np.ndarray]:
    """One ``(transcript, audio float32 [N])`` with at most :data:`MAX_SECONDS` of audio."""
    n_words = int(rng.integers(MIN_WORDS, MAX_WORDS + 1))
    while True:
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=n_words)]
        audio = speech_synth.render(words, speech_synth.Speaker.draw(rng), rng)
        if speech_synth.seconds(audio) <= MAX_SECONDS or n_words == 1:
            return " ".join(words), audio
        n_words -= 1


def wav_bytes(audio: np.ndarray) -> bytes:
    """16-bit PCM mono WAV at 16 kHz of ``audio`` (float32 [N] in [-1, 1])."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, audio, speech_synth.SAMPLE_RATE, subtype="PCM_16", format="WAV")
    return buf.getvalue()


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_split(out_dir: Path, split: str, n: int, seed: int, progress: bool = True) -> dict:
    """Render ``n`` clips of ``split`` into ``out_dir`` (wav/ and manifest.jsonl, the manifest last).

    Returns ``{"manifest", "clips", "total_seconds", "min_seconds", "max_seconds"}``.
    """
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, 7031])
    lines, durations = [], []
    for i in tqdm(range(n), desc=f"speech {split}", unit="clip", disable=not progress):
        example_id = f"{split}-{i:05d}"
        text, audio = make_utterance(rng)
        rel = f"wav/{example_id}.wav"
        write_bytes_atomic(out_dir / rel, wav_bytes(audio))
        lines.append(json.dumps({"id": example_id, "file": rel, "text": text}) + "\n")
        durations.append(speech_synth.seconds(audio))
    manifest = write_text_atomic(out_dir / "manifest.jsonl", "".join(lines))
    return {"manifest": str(manifest), "clips": n, "total_seconds": round(sum(durations), 3),
            "min_seconds": round(min(durations), 3), "max_seconds": round(max(durations), 3)}


def generate(out_dir: Path, seed: int = 0, quick: bool = False, progress: bool = True) -> dict:
    """Write the train and test splits under ``out_dir``; return ``{"train": {...}, "test": {...}}``."""
    sizes = {"train": QUICK_TRAIN_CLIPS if quick else TRAIN_CLIPS, "test": QUICK_TEST_CLIPS if quick else TEST_CLIPS}
    return {split: write_split(Path(out_dir) / split, split, n, seed, progress) for split, n in sizes.items()}
