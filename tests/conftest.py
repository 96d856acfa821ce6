"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]

# On a GPU, float32 means float32 in the tests: cuDNN's TF32 convolutions are on by default (Whisper's encoder
# has two), and batched and one-row forwards would then differ by more than the token-for-token comparisons
# with HF's own decoding allow.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False

# In parallel workers (pytest-xdist, `make test`) each worker's torch gets its share of the cores, so the workers'
# thread pools do not outnumber the cores; tests that set threads themselves set them as before.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def fixtures_path() -> Path:
    """The real sample data: $SPECSWEEP_FIXTURES, else <repo root>/../shared/fixtures (absent in a user's clone)."""
    return Path(os.environ.get("SPECSWEEP_FIXTURES") or REPO_ROOT.parent / "shared" / "fixtures")


@pytest.fixture
def fixtures_dir() -> Path:
    """The real sample data folder (see fixtures_path); the test skips when it is absent."""
    path = fixtures_path()
    if not path.is_dir():
        pytest.skip(f"real sample data not found at {path} (set SPECSWEEP_FIXTURES)")
    return path


def _converted_models_folder() -> Path | None:
    """Where the suite keeps the registry's converted models between runs: one folder per version of the converters
    (the sources of pipeline/weights/) and of the libraries they call, so a change to either converts again; older
    versions' folders are removed once unused for a week; None where no cache folder can be made. Converting SmolLM2
    and the two Whispers takes about half a minute."""
    import hashlib
    import shutil
    import time
    from importlib import metadata

    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "pipeline" / "weights").glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    for dist in ("torch", "transformers", "gguf", "ctranslate2", "safetensors", "tokenizers"):
        try:
            digest.update(f"{dist}=={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{dist}: none".encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specsweep" / "test-models"
    folder = root / digest.hexdigest()[:16]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)     # its last use: another checkout's suite may be using another version's folder now
    except OSError:          # no writable cache: the session's temporary one, as before
        return None
    for old in root.iterdir():
        if old != folder and old.is_dir() and time.time() - old.stat().st_mtime > 7 * 86400:
            shutil.rmtree(old, ignore_errors=True)
    return folder


@pytest.fixture(autouse=True, scope="session")
def _machine_cache_in_a_temporary_folder(tmp_path_factory):
    """Runs cache the machine's probed peak (pipeline/roofline.py) under $SPECSWEEP_CACHE_DIR: the suite keeps it
    in a temporary folder of its own rather than the user's cache (subprocesses inherit the variable). Converted
    registry models go to $SPECSWEEP_MODELS_DIR, kept between runs (:func:`_converted_models_folder`)."""
    if "SPECSWEEP_CACHE_DIR" not in os.environ:
        os.environ["SPECSWEEP_CACHE_DIR"] = str(tmp_path_factory.mktemp("specsweep-cache"))
    if "SPECSWEEP_MODELS_DIR" not in os.environ and (models := _converted_models_folder()) is not None:
        os.environ["SPECSWEEP_MODELS_DIR"] = str(models)
    yield

