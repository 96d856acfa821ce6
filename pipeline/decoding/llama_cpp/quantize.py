"""``--dtype`` for ``--engine llama.cpp``: a GGUF file stored in another quantisation, made by llama.cpp's own
``llama-quantize`` (built with the server, build.py) and kept in the models cache.

The registry's GGUF files are Q4_K_M. ``--dtype q8_0`` (or ``f16``, ``bf16``) gives llama.cpp the same model stored in
that type: ``llama-quantize --allow-requantize IN OUT TYPE``. The values it starts from are the Q4_K_M file's
(dequantised: llama.cpp has no other copy); F16 rounds them to 11 significant bits, BF16 to 8, and Q8_0 to 8 bits
per block of 32: the same model as the Q4_K_M run, within rounding, stored in more bytes (each file's size is in the
results, ``resolved.llama_cpp.*.target.bytes``). It answers whether speculation pays for llama.cpp once its target's
forward reads more, at the quality of the Q4_K_M model (the converted folders of specsweep's own engine hold those
same values in float32). ``--dtype auto``: the files as they are.

The file is made once per input file (by its path, size and modification time) and type, under a lock, written to a
temporary name and renamed into place: ``<models>/gguf/requantized/<stem>-<type>-<key>.gguf``.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from pipeline.decoding.llama_cpp import build
from pipeline.errors import SpecsweepError
from pipeline.io import file_lock

GGUF_DTYPES = ("q8_0", "f16", "bf16")
"""``--dtype`` values of ``--engine llama.cpp`` besides auto: llama-quantize's type names, lower case."""
FILE_TYPES = {"q8_0": "MOSTLY_Q8_0", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16"}
"""Each type's ``general.file_type`` (gguf's LlamaFileType name): a file already of the type is used as it is."""


def cache_path(path: Path, dtype: str) -> Path:
    """Where ``path`` requantised to ``dtype`` is kept (see the module docstring)."""
    from pipeline.weights.resolver import models_dir  # kept local: the registry's cache, only for a run

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return models_dir() / "gguf" / "requantized" / f"{path.stem}-{dtype}-{key}.gguf"


def requantized(path: Path, dtype: str, flag: str = "--target") -> Path:
    """``path`` stored as ``dtype`` (:data:`GGUF_DTYPES`, or "auto": ``path`` itself), made once with
    llama-quantize; a one-line :class:`SpecsweepError` when the type is unknown, llama.cpp is not built or
    llama-quantize fails."""
    from pipeline.decoding.llama_cpp.gguf_files import describe  # kept local: gguf is read only for a run

    if dtype == "auto":
        return path
    if dtype not in GGUF_DTYPES:
        raise SpecsweepError(f"--engine llama.cpp takes --dtype auto (the GGUF file's own quantisation) or one of "
                             f"{', '.join(GGUF_DTYPES)} (made with llama-quantize); got {dtype!r}")
    if describe(path)["file_type"] == FILE_TYPES[dtype]:
        return path
    out = cache_path(path, dtype)
    if out.is_file():
        return out
    tool = build.binary("llama-quantize", build.require())
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.parent / f".{out.name}.lock"):
        if out.is_file():
            return out
        print(f"{flag} {path.name}: writing it as {dtype.upper()} with llama-quantize into {out}", file=sys.stderr)
        partial = out.with_name(out.name + ".partial")
        done = subprocess.run([str(tool), "--allow-requantize", str(path), str(partial), dtype.upper()],
                              capture_output=True, text=True)
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
            raise SpecsweepError(f"llama-quantize could not write {path.name} as {dtype.upper()} "
                                 f"(exit {done.returncode}: {last[:200]}): check the file, or use --dtype auto")
        partial.replace(out)
    return out
