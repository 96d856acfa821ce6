"""Writing safely: every JSON/CSV the project produces goes through here, atomically; so do folders built in one go
(a converted model), and the lock that keeps parallel processes from building one thing twice."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w"):
    """Open a temporary file beside ``path`` for writing; on success it is synced and renamed over ``path``,
    so a reader (or a crash) never sees a half-written file and an existing file is replaced only by a
    complete one. On error the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a new temporary folder beside ``path`` to build in; on success it is renamed to ``path`` (which must
    not exist, or be an empty folder), so a reader (or a crash) never sees a half-built folder. On error the
    temporary folder is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    tmp.mkdir()  # the permissions of a folder made as usual (mkdtemp's are owner-only)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def file_lock(path: str | os.PathLike):
    """Hold an exclusive lock on the file ``path`` (created if missing) for the block, so that parallel processes
    do one thing at a time (probe the machine, build a cached model); no lock where the platform has no fcntl."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:  # closing the file releases the lock
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_file(path) as f:
        f.write(text)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy / torch scalars and arrays
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
