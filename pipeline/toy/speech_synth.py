"""Render words as speech-like audio: 16 kHz mono float32, no text-to-speech library.

Every word of the lexicon (:data:`LEXICON`) has its own acoustic signature (:data:`SIGNATURES`): three
sound segments in a row, each one of eleven segment sounds (:data:`SEGMENTS`):

* eight voiced sounds: harmonics of the speaker's pitch ``f0`` under one formant, the formants spread
  from 350 Hz to 3.4 kHz about 1.4x apart (so the speaker's formant scale never confuses two of them);
* three unvoiced sounds: noise bursts in bands around 4.5, 5.8 and 7.1 kHz.

The codes are ``(a, b, (a + b) mod 11)``, so any two words differ in at least two of their three segments
(a word cannot be mistaken for another by one misheard segment). Words are separated by silences and the
utterance is embedded in background noise. Per utterance a "speaker" is drawn (:class:`Speaker`): pitch,
formant scale (vocal tract length), speaking rate (0.9x to 1.1x), loudness and signal-to-noise ratio; per
segment the duration jitters. The same words thus sound different every time, and a recogniser must learn the
segments' spectral shapes, not memorise waveforms.

Everything draws from a ``numpy.random.Generator`` passed in, so a seeded generator gives identical audio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16_000
"""Sample rate (Hz) of every rendered array."""

LEXICON = tuple("""red blue green black white gold pink gray
cat dog fox owl bee cow pig hen yak elk
one two six ten nine
run sit jump swim walk fly dig
big small fast slow tiny quiet
river stone cloud apple tiger lemon piano robot""".split())
"""The words :func:`render` can say (44, in a fixed order)."""

VOICED_FORMANTS_HZ = (350, 500, 700, 950, 1300, 1800, 2500, 3400)
BURST_BANDS_HZ = ((4500, 700), (5800, 900), (7100, 900))  # (centre, width)
SEGMENTS = tuple(("voiced", f) for f in VOICED_FORMANTS_HZ) + tuple(("burst", b) for b in BURST_BANDS_HZ)
"""The segment sounds: ``("voiced", formant Hz)`` or ``("burst", (centre Hz, width Hz))``."""


def _signatures(words: tuple[str, ...]) -> dict[str, tuple[int, int, int]]:
    """Word -> 3 segment indices; codes ``(a, b, (a + b) % n)`` have pairwise Hamming distance >= 2. The codes
    are taken in a fixed stride through the n * n possible ones so that every segment is used about equally."""
    n = len(SEGMENTS)
    codes = [(k // n, k % n, (k // n + k % n) % n) for k in range(n * n)]
    stride = 3  # coprime with n * n = 121: visits every code once
    return {w: codes[(7 + stride * i) % (n * n)] for i, w in enumerate(words)}


SIGNATURES = _signatures(LEXICON)
"""Word -> its three segment indices into :data:`SEGMENTS`."""

SEGMENT_SECONDS = 0.065        # nominal segment length at speed 1 (a word is three of them)
WORD_GAP_SECONDS = (0.06, 0.14)
EDGE_SILENCE_SECONDS = (0.05, 0.15)
FORMANT_BANDWIDTH_HZ = 120.0


@dataclass(frozen=True)
class Speaker:
    """Per-utterance voice: pitch (Hz), formant scale, speed (> 1 is faster), peak level, SNR (dB)."""

    f0: float
    formant_scale: float
    speed: float
    level: float
    snr_db: float

    @classmethod
    def draw(cls, rng: np.random.Generator) -> Speaker:
        return cls(f0=float(rng.uniform(100, 220)), formant_scale=float(rng.uniform(0.94, 1.06)),
                   speed=float(rng.uniform(0.9, 1.1)), level=float(rng.uniform(0.3, 0.8)),
                   snr_db=float(rng.uniform(18, 32)))


def _edges(n: int, ramp: int) -> np.ndarray:
    """float32 [n] envelope: raised-cosine rise and fall of ``ramp`` samples each."""
    env = np.ones(n, dtype=np.float32)
    ramp = min(ramp, n // 2)
    if ramp > 0:
        rise = 0.5 - 0.5 * np.cos(np.linspace(0, np.pi, ramp, dtype=np.float32))
        env[:ramp], env[n - ramp:] = rise, rise[::-1]
    return env


def _voiced(n: int, f0: float, formant: float, phase: float) -> np.ndarray:
    """Harmonics of ``f0`` weighted by a Gaussian resonance around ``formant`` Hz. float32 [n], peak about 1."""
    t = np.arange(n, dtype=np.float64) / SAMPLE_RATE
    lo, hi = formant - 3 * FORMANT_BANDWIDTH_HZ, formant + 3 * FORMANT_BANDWIDTH_HZ
    harmonics = np.arange(max(1, int(lo // f0)), int(hi // f0) + 2, dtype=np.float64) * f0       # [H]
    harmonics = harmonics[(harmonics > 60) & (harmonics < SAMPLE_RATE / 2 - 200)]
    weight = np.exp(-0.5 * ((harmonics - formant) / FORMANT_BANDWIDTH_HZ) ** 2)                   # [H]
    # a harmonic comb can miss a narrow formant (high f0): then sound the formant itself
    if harmonics.size == 0 or weight.max() < 0.3:
        harmonics, weight = np.array([formant]), np.array([1.0])
    wave = (weight[None, :] * np.sin(2 * np.pi * harmonics[None, :] * t[:, None] + phase)).sum(-1)
    return (wave / max(1e-6, np.abs(wave).max())).astype(np.float32)


def _burst(n: int, centre: float, width: float, rng: np.random.Generator) -> np.ndarray:
    """Band-limited noise: white noise smoothed to ``width`` Hz, shifted to ``centre`` Hz. float32 [n]."""
    kernel = max(1, int(SAMPLE_RATE / width))
    noise = np.convolve(rng.standard_normal(n + kernel), np.ones(kernel) / kernel, mode="valid")[:n]
    t = np.arange(n) / SAMPLE_RATE
    wave = noise * np.cos(2 * np.pi * centre * t)
    return (wave / max(1e-6, np.abs(wave).max())).astype(np.float32)


def render_segment(index: int, speaker: Speaker, rng: np.random.Generator) -> np.ndarray:
    """One segment's sound, float32 [n] (n about :data:`SEGMENT_SECONDS` / speed, jittered by +-15 %)."""
    n = int(SEGMENT_SECONDS / speaker.speed * rng.uniform(0.85, 1.15) * SAMPLE_RATE)
    kind, value = SEGMENTS[index]
    if kind == "voiced":
        wave = _voiced(n, speaker.f0, value * speaker.formant_scale, float(rng.uniform(0, 2 * np.pi)))
    else:
        centre, width = value
        wave = 0.6 * _burst(n, centre * speaker.formant_scale, width, rng)
    return wave * _edges(n, int(0.006 * SAMPLE_RATE))


def render_word(word: str, speaker: Speaker, rng: np.random.Generator) -> np.ndarray:
    """A word's three segments back to back, float32 [n]."""
    if word not in SIGNATURES:
        raise ValueError(f"no sound for {word!r}: words must come from speech_synth.LEXICON")
    return np.concatenate([render_segment(i, speaker, rng) for i in SIGNATURES[word]])


def render(words: list[str], speaker: Speaker, rng: np.random.Generator) -> np.ndarray:
    """The utterance of ``words`` by ``speaker`` with background noise: float32 [N] in [-1, 1] at 16 kHz."""
    def silence(bounds: tuple[float, float]) -> np.ndarray:
        return np.zeros(int(rng.uniform(*bounds) / speaker.speed * SAMPLE_RATE), dtype=np.float32)

    parts = [silence(EDGE_SILENCE_SECONDS)]
    for i, word in enumerate(words):
        if i:
            parts.append(silence(WORD_GAP_SECONDS))
        parts.append(render_word(word, speaker, rng))
    parts.append(silence(EDGE_SILENCE_SECONDS))
    clean = np.concatenate(parts) * speaker.level
    signal_power = float(np.mean(clean ** 2))
    noise = rng.standard_normal(clean.shape[0]).astype(np.float32)
    noise *= np.sqrt(signal_power / 10 ** (speaker.snr_db / 10))
    return np.clip(clean + noise, -1.0, 1.0).astype(np.float32)


def seconds(audio: np.ndarray) -> float:
    """Duration of a rendered array (float32 [N]) in seconds."""
    return audio.shape[0] / SAMPLE_RATE
