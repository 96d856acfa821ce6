"""llama.cpp's ``llama-server`` (and ``llama-bench``, ``llama-quantize``), built once from a pinned source into the
machine's cache directory.

The source is llama-cpp-python's source distribution on PyPI, which carries llama.cpp's whole tree under
``vendor/llama.cpp`` (tools included): :data:`SDIST` at :data:`VERSION`, pinned by :data:`SDIST_SHA256`. It is
fetched with ``pip download --no-deps --no-binary :all:`` (pip's index settings and cache apply), or read from a
local copy (``--sdist PATH``, or ``$SPECSWEEP_LLAMA_CPP_SDIST``); either way its sha256 must match the pin.

Build: cmake with ninja, Release, static libraries, no TLS (``LLAMA_OPENSSL=OFF``; CURL is gone from llama.cpp), no
web UI (``LLAMA_BUILD_UI=OFF``, ``LLAMA_USE_PREBUILT_UI=OFF``: that would download one), ``GGML_NATIVE=ON`` (the
build CPU's instructions), then only the :data:`TARGETS`. The binaries land in
``<cache_dir>/llama.cpp/<VERSION>-<cpu>/bin`` (:func:`build_dir`), ``<cpu>`` a hash of the CPU's model name and flags
(a native build is for this CPU), with ``build.json`` beside them: the version, the sdist's sha256, the cmake flags,
the compiler and how long it took. The folder is built under a file lock in a temporary folder and renamed into
place, so parallel processes build it once and nobody sees half of it. About 15 minutes on two busy cores.
``$SPECSWEEP_LLAMA_CPP_DIR`` moves the folder that holds the builds (default ``<cache_dir>/llama.cpp``): the test
suite points it at the user's cache, since it keeps ``$SPECSWEEP_CACHE_DIR`` in a temporary folder of its own.

    python -m pipeline.decoding.llama_cpp.build [--sdist PATH] [--jobs N]     # prints the folder

:func:`find` answers whether the build is there without building (the engine and the tests ask it);
:func:`missing_tools` says which of cmake, ninja and a C/C++ compiler are missing, in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from pipeline.errors import OneLineParser, SpecsweepError
from pipeline.io import atomic_dir, file_lock

SDIST = "llama-cpp-python"
VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TARGETS = ("llama-server", "llama-bench", "llama-quantize")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_SUBPROCESS=OFF",
)
ENV_SDIST = "SPECSWEEP_LLAMA_CPP_SDIST"
ENV_DIR = "SPECSWEEP_LLAMA_CPP_DIR"
BUILD_COMMAND = "python -m pipeline.decoding.llama_cpp.build"


def cpu_key() -> str:
    """A short hash of this CPU's model name and flags: a native build runs on the CPU it was built for."""
    from pipeline.roofline import cpu_name  # kept local: `specsweep --help` need not load roofline (torch)

    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                flags = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    text = f"{platform.machine()}|{cpu_name()}|{flags}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def builds_root() -> Path:
    """The folder of llama.cpp builds: ``$SPECSWEEP_LLAMA_CPP_DIR``, else ``<cache_dir>/llama.cpp``."""
    from pipeline.roofline import cache_dir  # kept local: `specsweep --help` need not load roofline (torch)

    return Path(os.environ[ENV_DIR]).expanduser() if os.environ.get(ENV_DIR) else cache_dir() / "llama.cpp"


def build_dir() -> Path:
    """Where this machine's build lives (or would): ``<builds_root>/<VERSION>-<cpu_key>``."""
    return builds_root() / f"{VERSION}-{cpu_key()}"


def binary(name: str, root: Path | None = None) -> Path:
    return (root or build_dir()) / "bin" / name


def find() -> Path | None:
    """The built folder when its llama-server is there, else None (nothing is built)."""
    root = build_dir()
    return root if binary("llama-server", root).is_file() else None


def require() -> Path:
    """The built folder, or a one-line :class:`SpecsweepError` that says how to build it."""
    root = find()
    if root is None:
        tools = missing_tools()
        need = f"; first install {tools}" if tools else ""
        raise SpecsweepError(f"llama.cpp {VERSION} is not built on this machine (no {binary('llama-server')}): run "
                             f"`{BUILD_COMMAND}` once (about 15 minutes){need}")
    return root


def missing_tools() -> str:
    """"" when cmake, ninja and C and C++ compilers are on PATH, else one phrase naming what to install."""
    missing = [name for name in ("cmake", "ninja") if shutil.which(name) is None]
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        missing.append("a C compiler (gcc or clang)")
    if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        missing.append("a C++ compiler (g++ or clang++)")
    return ", ".join(missing) + (" (e.g. apt-get install cmake ninja-build g++)" if missing else "")


def fetch_sdist(dest: Path, local: Path | None = None) -> Path:
    """The pinned sdist in ``dest``: copied from ``local`` (or ``$SPECSWEEP_LLAMA_CPP_SDIST``), else pip-downloaded;
    a one-line :class:`SpecsweepError` when pip fails or the sha256 differs from the pin."""
    from pipeline.weights.pypi import sha256  # kept local: only a build reads the sdist

    local = local or (Path(os.environ[ENV_SDIST]) if os.environ.get(ENV_SDIST) else None)
    dest.mkdir(parents=True, exist_ok=True)
    if local is not None:
        if not local.is_file():
            raise SpecsweepError(f"the llama.cpp source {local} does not exist: give the path of {SDIST_FILE}")
        path = Path(shutil.copy(local, dest / SDIST_FILE))
    else:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "--dest", str(dest), f"{SDIST}=={VERSION}"]
        done = subprocess.run(cmd, stdout=2, stderr=subprocess.PIPE, text=True)
        path = dest / SDIST_FILE
        if done.returncode != 0 or not path.is_file():
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            why = errors[-1].removeprefix("ERROR: ") if errors else f"exit code {done.returncode}"
            raise SpecsweepError(f"pip download {SDIST}=={VERSION} (llama.cpp's source) failed ({why}): check that "
                                 f"PyPI (or your pip index) is reachable, or pass --sdist PATH to {SDIST_FILE}")
    if (actual := sha256(path)) != SDIST_SHA256:
        raise SpecsweepError(f"{path.name} has sha256 {actual}, but {SDIST_SHA256} is pinned for it: not the "
                             f"pinned {SDIST} {VERSION} source")
    return path


def _extract_llama_cpp(sdist: Path, dest: Path) -> Path:
    """``vendor/llama.cpp`` of the sdist, extracted into ``dest``: the source folder."""
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(dest, members=members, filter="data")
    return dest / prefix


def _run(cmd: list[str], cwd: Path, log: Path) -> None:
    """Run one build command, its output appended to ``log``; a one-line error with the log's last error line."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        lines = log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if "error" in line.lower()] or lines[-1:] or [""]
        raise SpecsweepError(f"building llama.cpp failed at `{cmd[0]} {cmd[1]}` (exit {done.returncode}): "
                             f"{errors[-1].strip()[:200]} (full log: {log})")


def build(sdist: Path | None = None, jobs: int | None = None) -> Path:
    """Build (once per machine and :data:`VERSION`) and return the folder; see the module's doc."""
    root = build_dir()
    if find() is not None:
        return root
    if tools := missing_tools():
        raise SpecsweepError(f"building llama.cpp needs {tools}")
    with file_lock(root.parent / f".{root.name}.lock"):
        if find() is not None:  # another process built it while this one waited
            return root
        log = root.parent / f"{root.name}.build.log"
        log.write_text("")
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=root.parent, prefix=".src-") as tmp, atomic_dir(root) as out:
            src = _extract_llama_cpp(fetch_sdist(Path(tmp) / "sdist", sdist), Path(tmp) / "src")
            work = Path(tmp) / "build"
            _run(["cmake", "-S", str(src), "-B", str(work), "-G", "Ninja", *CMAKE_FLAGS], Path(tmp), log)
            jobs = jobs or max(1, os.cpu_count() or 1)
            _run(["ninja", "-C", str(work), "-j", str(jobs), *TARGETS], Path(tmp), log)
            (out / "bin").mkdir()
            for name in TARGETS:
                shutil.copy2(work / "bin" / name, out / "bin" / name)
            compiler = subprocess.run([os.environ.get("CXX") or "c++", "--version"], capture_output=True,
                                      text=True).stdout.splitlines()[:1]
            info = {"llama_cpp_source": f"{SDIST}=={VERSION}", "sdist_sha256": SDIST_SHA256,
                    "cmake_flags": list(CMAKE_FLAGS), "targets": list(TARGETS), "compiler": compiler,
                    "jobs": jobs, "build_seconds": round(time.perf_counter() - start, 1), "cpu_key": cpu_key()}
            (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
        shutil.copy2(log, root / "build.log")
        log.unlink()
    return root


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog=BUILD_COMMAND, description="build llama.cpp's llama-server, llama-bench and "
                           f"llama-quantize ({SDIST} {VERSION}'s vendored tree) once into the cache directory")
    parser.add_argument("--sdist", type=Path, default=None,
                        help=f"a local {SDIST_FILE} (default: ${ENV_SDIST}, else pip download)")
    parser.add_argument("--jobs", type=int, default=None, help="ninja's parallel jobs (default: the CPU count)")
    args = parser.parse_args(argv)
    try:
        root = build(args.sdist, args.jobs)
    except SpecsweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
