"""Audio as the speech task reads it: any file libsndfile reads, decoded to mono float32 at :data:`SAMPLE_RATE`,
and cut to a model's input window.

Decoding uses soundfile (libsndfile ships in its wheel, so no FFmpeg or torchcodec is needed); channels are
averaged and any other rate is resampled with ``scipy.signal.resample_poly``. Whisper reads at most 30 s
(:data:`MAX_AUDIO_SECONDS`): :func:`truncate_audio` cuts longer clips and says that it did, so the caller can
count and report them (the long-inputs rule, see :mod:`pipeline.tasks.base`).
"""

from __future__ import annotations

import io
import math
import os
from typing import NamedTuple

import numpy as np

from pipeline.errors import SpecsweepError

SAMPLE_RATE = 16_000
"""Sample rate (Hz) of every decoded audio array."""

MAX_AUDIO_SECONDS = 30.0
"""Whisper's input window: :func:`truncate_audio` cuts clips to this by default."""


def decode_audio(data: bytes | str | os.PathLike, *, name: str | None = None) -> np.ndarray:
    """Decode an audio file (path or its bytes) to mono float32 [N] at :data:`SAMPLE_RATE`.

    Channels are averaged; any other rate is resampled with ``scipy.signal.resample_poly`` (polyphase
    FIR, the exact rational ratio). ``name`` is used in error messages. An unreadable or empty file is a
    :class:`SpecsweepError`.
    """
    import soundfile as sf

    label = name or (str(data) if not isinstance(data, bytes) else "audio bytes")
    try:
        samples, rate = sf.read(io.BytesIO(data) if isinstance(data, bytes) else os.fspath(data),
                                dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, OSError) as e:
        raise SpecsweepError(f"{label}: cannot read audio ({' '.join(str(e).split())[:200]})") from None
    if samples.shape[0] == 0:
        raise SpecsweepError(f"{label}: audio file is empty (0 samples)")
    mono = samples.mean(axis=1, dtype=np.float32) if samples.shape[1] > 1 else samples[:, 0]
    if rate != SAMPLE_RATE:
        from scipy.signal import resample_poly

        g = math.gcd(int(rate), SAMPLE_RATE)
        mono = resample_poly(mono, SAMPLE_RATE // g, int(rate) // g).astype(np.float32, copy=False)
    return np.ascontiguousarray(mono, dtype=np.float32)


class TruncatedAudio(NamedTuple):
    """What :func:`truncate_audio` returns."""

    audio: np.ndarray         # float32 [min(N, max_seconds * sample_rate)]
    truncated: bool           # True when samples were cut off
    original_seconds: float   # duration before truncation


def truncate_audio(audio: np.ndarray, max_seconds: float = MAX_AUDIO_SECONDS,
                   sample_rate: int = SAMPLE_RATE) -> TruncatedAudio:
    """Cut ``audio`` (float32 [N]) to its first ``max_seconds`` (Whisper's 30 s window by default).

    Returns the (possibly shortened) array, whether it was cut, and the original duration, so the
    caller can count and report truncated examples. A clip of at most ``max_seconds`` is returned as is.
    """
    max_samples = round(max_seconds * sample_rate)
    original = audio.shape[0] / sample_rate
    if audio.shape[0] <= max_samples:
        return TruncatedAudio(audio, False, original)
    return TruncatedAudio(audio[:max_samples], True, original)
