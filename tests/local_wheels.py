"""Wheels built in the tests, holding model files as PyPI model wheels do, and a pip that finds only them."""

from __future__ import annotations

import zipfile
from pathlib import Path


def write_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """``folder/<dist>-<version>-py3-none-any.whl`` with ``files`` (name -> bytes) under ``<package>/data/``, an
    ``__init__.py`` and the ``.dist-info`` metadata pip reads (METADATA, WHEEL, RECORD)."""
    package = dist.replace("-", "_")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package}-{version}-py3-none-any.whl"
    info = f"{package}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{package}/__init__.py", "")
        for name, data in files.items():
            z.writestr(f"{package}/data/{name}", data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: specsweep-tests\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def pip_finds_only(monkeypatch, folder: Path) -> None:
    """pip (in subprocesses too) reads wheels from ``folder`` and no index: offline, and no other package."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
