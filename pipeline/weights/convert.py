"""What a folder of model files is, and turning it into a plain transformers folder.

Formats (:func:`detect`): ``transformers`` (a ``config.json`` naming a ``model_type``: copied as it is), ``gguf``
(one ``*.gguf`` file: :mod:`pipeline.weights.gguf`) and ``ct2-whisper`` (a CTranslate2 ``model.bin`` of a
Whisper model: :mod:`pipeline.weights.ct2_whisper`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.errors import SpecsweepError
from pipeline.weights import ct2_whisper, gguf

FORMATS = ("transformers", "gguf", "ct2-whisper")


def detect(folder: Path) -> str:
    """The format of the model files in ``folder`` (one of :data:`FORMATS`); a one-line :class:`SpecsweepError`
    naming what was found when it is none of them."""

    config = folder / "config.json"  # a CTranslate2 folder has one too, without a model_type
    if config.is_file() and '"model_type"' in config.read_text(encoding="utf-8", errors="replace"):
        return "transformers"
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return "gguf"
    if ggufs:
        raise SpecsweepError(f"{folder} holds several GGUF files ({', '.join(ggufs)}): put the one to convert in a "
                             "folder of its own")
    if (folder / "model.bin").is_file():
        try:
            version, spec = ct2_whisper.read_header(folder / "model.bin")
        except (ValueError, UnicodeDecodeError):
            spec = None
        if spec == ct2_whisper.SPEC:
            return "ct2-whisper"
        if spec:
            raise SpecsweepError(f"{folder / 'model.bin'} is a CTranslate2 {spec} (binary version {version}); "
                                 f"only Whisper models ({ct2_whisper.SPEC}) are converted")
    files = sorted(p.name for p in folder.iterdir())
    raise SpecsweepError(f"unknown model format in {folder} (files: {', '.join(files[:8]) or 'none'}"
                         f"{', ...' if len(files) > 8 else ''}): expected a transformers folder (config.json with a "
                         "model_type), one .gguf file, or a CTranslate2 Whisper model.bin")


def to_transformers(folder: Path, out: Path, dtype) -> str:
    """Write ``folder``'s model into ``out`` (a new, empty folder) as a plain transformers folder, converted
    weights in ``dtype`` (a torch dtype; a transformers folder is copied as it is). Returns the format found."""

    fmt = detect(folder)
    if fmt == "transformers":
        shutil.copytree(folder, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", ".cache"))
    elif fmt == "gguf":
        gguf.convert(next(folder.glob("*.gguf")), out, dtype)
    else:
        ct2_whisper.convert(folder, out, dtype)
    return fmt
