"""Speech synthesised with eSpeak NG: text -> 16 kHz audio, and a corpus of clips in the speech task's source schema.

A Whisper draft decoder is trained on the target's transcripts of speech (:mod:`pipeline.distill.whisper`), and the
only real speech a clone has offline is a few LibriSpeech clips. eSpeak NG (a formant synthesiser; its library and
voices ship in the ``espeakng-loader`` wheel, so no system package is needed) turns any text into speech: robotic,
but it is what the target hears that the draft learns from, not what a person would say.

    speak = Speaker()
    audio = speak("Nor is Mr. Quilter's manner less interesting.", voice="en-us", wpm=170)   # float32 [N], 16 kHz
    record = write_corpus(texts, "data/speech_synth", clips=120, words=45, seed=0)

:func:`write_corpus` writes ``<out>/audio/<id>.wav`` (16-bit PCM, 16 kHz) and ``<out>/transcripts.jsonl``, lines of
``{"id", "file", "text", "voice", "wpm", "seconds"}``: the ``librispeech`` task's source manifest, so ``specsweep
fetch --task librispeech --source``, ``specsweep run --data`` and ``specsweep distill --data`` read it as they read
LibriSpeech. The folder is built beside itself and renamed when complete.
"""

from __future__ import annotations

import ctypes
import json
import random
import re
from pathlib import Path

import numpy as np

from pipeline.audio import MAX_AUDIO_SECONDS, SAMPLE_RATE
from pipeline.errors import SpecsweepError
from pipeline.io import atomic_dir, write_text_atomic

VOICES = ("en-us", "en", "en-gb-x-rp", "en-gb-scotland", "en-us+f3", "en+m3", "en-us+f2")
"""The voices a corpus draws from (eSpeak NG's English voices and variants: male, female, British, American)."""

WPM = (140, 190)
"""The speaking rates a corpus draws from, words per minute (eSpeak NG's default is 175)."""

_SYNCHRONOUS = 2            # espeak_AUDIO_OUTPUT: AUDIO_OUTPUT_SYNCHRONOUS
_RATE = 1                   # espeak_PARAMETER: espeakRATE
_CHARS_UTF8 = 1             # espeak_Synth flags: espeakCHARS_UTF8
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class Speaker:
    """eSpeak NG, loaded once per process (the library keeps global state). ``speaker(text, voice, wpm)`` ->
    float32 [N] in [-1, 1] at :data:`pipeline.audio.SAMPLE_RATE`."""

    _lib = None
    _rate = 0

    def __init__(self) -> None:
        if Speaker._lib is None:
            try:
                import espeakng_loader
            except ImportError:
                raise SpecsweepError("speech synthesis needs eSpeak NG: pip install espeakng-loader") from None
            lib = ctypes.cdll.LoadLibrary(espeakng_loader.get_library_path())
            rate = lib.espeak_Initialize(_SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), 0)
            if rate <= 0:
                raise SpecsweepError(f"eSpeak NG did not start (espeak_Initialize returned {rate}): reinstall "
                                     "espeakng-loader")
            Speaker._lib, Speaker._rate = lib, rate
        self._chunks: list[np.ndarray] = []
        self._callback = _CALLBACK(self._collect)     # kept alive as long as the speaker

    def _collect(self, wav, n: int, _events) -> int:
        if wav and n > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    def __call__(self, text: str, voice: str = "en-us", wpm: int = 175) -> np.ndarray:
        from scipy.signal import resample_poly

        lib = Speaker._lib
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise SpecsweepError(f"eSpeak NG has no voice {voice!r}: use one of {', '.join(VOICES)}")
        lib.espeak_SetSynthCallback(self._callback)
        lib.espeak_SetParameter(_RATE, int(wpm), 0)
        self._chunks = []
        data = text.encode("utf-8")
        lib.espeak_Synth(data, len(data) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
        lib.espeak_Synchronize()
        if not self._chunks:
            raise SpecsweepError(f"eSpeak NG produced no audio for {text[:40]!r}: give text with words in it")
        pcm = np.concatenate(self._chunks).astype(np.float32) / 32768.0
        g = np.gcd(SAMPLE_RATE, Speaker._rate)
        return resample_poly(pcm, SAMPLE_RATE // g, Speaker._rate // g).astype(np.float32)


def sentences(texts: list[str]) -> list[str]:
    """The sentences of ``texts`` (split after . ! ?), whitespace collapsed, those of 3 to 60 words."""
    out = []
    for text in texts:
        for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            if 3 <= len(s.split()) <= 60:
                out.append(s)
    return out


def clip_texts(texts: list[str], clips: int, words: int, seed: int) -> list[str]:
    """``clips`` texts of at least ``words`` words each: consecutive sentences of a seeded shuffle of ``texts``'
    sentences (cycling through them again if they run out)."""
    pool = sentences(texts)
    if not pool:
        raise SpecsweepError("the texts have no sentences of 3 to 60 words to speak: give prose")
    random.Random(seed).shuffle(pool)
    out, i = [], 0
    for _ in range(clips):
        parts: list[str] = []
        while sum(len(p.split()) for p in parts) < words:
            parts.append(pool[i % len(pool)])
            i += 1
        out.append(" ".join(parts))
    return out


def write_corpus(texts: list[str], out: str | Path, clips: int, words: int, seed: int, progress: bool = True) -> dict:
    """Speak ``clips`` clips of about ``words`` words from ``texts`` (voices and rates drawn with ``seed``) into the
    folder ``out`` (see the module docstring). A clip longer than Whisper's 30 s window loses its last sentences
    until it fits. Returns what was written: clips, seconds, voices used."""
    import soundfile as sf
    from tqdm.auto import tqdm

    speak, rng = Speaker(), random.Random(seed + 1)
    lines, total = [], 0.0
    with atomic_dir(out) as folder:
        (Path(folder) / "audio").mkdir()
        for n, text in enumerate(tqdm(clip_texts(texts, clips, words, seed), desc="speaking", unit="clip",
                                      disable=not progress)):
            voice, wpm = rng.choice(VOICES), rng.randint(*WPM)
            audio = speak(text, voice, wpm)
            while audio.shape[0] > MAX_AUDIO_SECONDS * SAMPLE_RATE and len(sentences([text])) > 1:
                text = " ".join(sentences([text])[:-1])
                audio = speak(text, voice, wpm)
            clip_id = f"espeak-{seed}-{n:05d}"
            sf.write(Path(folder) / "audio" / f"{clip_id}.wav", audio, SAMPLE_RATE, subtype="PCM_16")
            seconds = audio.shape[0] / SAMPLE_RATE
            total += seconds
            lines.append({"id": clip_id, "file": f"audio/{clip_id}.wav", "text": text, "voice": voice, "wpm": wpm,
                          "seconds": round(seconds, 3)})
        write_text_atomic(Path(folder) / "transcripts.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    return {"clips": len(lines), "seconds": total, "voices": sorted({x["voice"] for x in lines})}
