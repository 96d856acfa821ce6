"""Build CUDA kernel sources for the CPU runtime (cuda_on_cpu.h) and launch them as the cupy backend does.

    lib = build(loader.SOURCE_PATH, loader.NAME_EXPRESSIONS)      # g++, cached by a hash of every input
    launcher = CpuLauncher(lib, sm_count=132)                       # a cupy_backend.Launcher
    samplers = cupy_backend.bind(launcher)                          # exact / sigmoid / greedy on CPU tensors

The kernels read and write CPU tensors in place (their ``data_ptr``), with the grid sizing, workspace layout
and argument packing of pipeline/samplers/cupy_backend.py: only the last call, the launch, differs. Each launch
runs the whole grid and returns when it is done. See README.md beside this file for what this proves and what
only a GPU can.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pipeline.kernels.loader import CXX_TYPES, THREADS, ArgPack
from pipeline.samplers.cupy_backend import Launcher

RUNTIME_DIR = Path(__file__).resolve().parent
RUNTIME_FILES = (RUNTIME_DIR / "cuda_on_cpu.h", RUNTIME_DIR / "launch_api.cpp",
                 RUNTIME_DIR / "include" / "cuda_fp16.h", RUNTIME_DIR / "include" / "cuda_bf16.h")
# -ffp-contract=off: no fused multiply-add, so a * b + c rounds twice as __fmul_rn / __fadd_rn promise.
# -fvisibility=hidden: thread-locals (the runtime's, and every __shared__ array) resolve inside the library.
CXXFLAGS = ("-std=c++20", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden", "-ffp-contract=off",
            "-fno-fast-math",
            "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function", "-Wno-unused-variable")


class BuildError(RuntimeError):
    """The kernels could not be built for the CPU runtime (no compiler, or a compile error)."""


def compiler() -> str | None:
    """A C++20 compiler (g++ >= 11 or clang++ >= 14), or None."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


def cache_dir() -> Path:
    root = os.environ.get("SPECSWEEP_CACHE") or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "specsweep" / "cuda-on-cpu"


def _entry_source(source: Path, name_expressions: tuple[str, ...]) -> str:
    """The translation unit: the kernel source, unchanged, then one registration per instantiation."""
    lines = ['#include "cuda_on_cpu.h"', f'#include "{source}"', ""]
    lines += [f"CUDA_ON_CPU_KERNEL({i}, {expr});" for i, expr in enumerate(name_expressions)]
    return "\n".join(lines) + "\n"


def build(source: str | Path, name_expressions: tuple[str, ...], *, text: str | None = None,
          depends: tuple[Path, ...] = ()) -> Path:
    """Compile ``source`` (or ``text``, a modified copy of it) with every name expression registered.

    Returns the shared library's path. Built once per distinct input: the file name is a hash of the kernel
    source, the files it includes that are named in ``depends``, the runtime's files, the flags and the compiler's
    version. Raises BuildError.
    """
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (g++ or clang++, or $CXX)")
    source = Path(source).resolve()
    code = source.read_text(encoding="utf-8") if text is None else text
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    for part in (code, version, " ".join(CXXFLAGS), *name_expressions,
                 *(Path(f).read_text(encoding="utf-8") for f in (*RUNTIME_FILES, *depends))):
        digest.update(part.encode())
    out = cache_dir() / f"{source.stem}-{digest.hexdigest()[:20]}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cuda-on-cpu-") as tmp:
        kernel = Path(tmp) / source.name
        kernel.write_text(code, encoding="utf-8")
        entry = Path(tmp) / "entry.cpp"
        entry.write_text(_entry_source(kernel, name_expressions), encoding="utf-8")
        lib = Path(tmp) / "kernels.so"
        cmd = [cxx, *CXXFLAGS, f"-I{RUNTIME_DIR}", f"-I{RUNTIME_DIR / 'include'}", str(entry),
               str(RUNTIME_DIR / "launch_api.cpp"), "-o", str(lib)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"{Path(cxx).name} failed on {source.name}:\n{proc.stderr[-6000:]}")
        tmp_out = out.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(lib, tmp_out)
        os.replace(tmp_out, out)   # atomic: a concurrent build of the same inputs writes the same bytes
    return out


class LaunchError(RuntimeError):
    """A launch failed inside the CPU runtime: a deadlock, a misaligned load, an unsupported warp mask..."""


class KernelLibrary:
    """A built library: launch a registered kernel by name expression, cuLaunchKernel style."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(self.path))
        self._lib.cuda_on_cpu_param_count.argtypes = [ctypes.c_char_p]
        self._lib.cuda_on_cpu_param_count.restype = ctypes.c_int
        self._lib.cuda_on_cpu_param_size.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self._lib.cuda_on_cpu_param_size.restype = ctypes.c_size_t
        self._lib.cuda_on_cpu_launch.argtypes = [ctypes.c_char_p, *[ctypes.c_uint] * 6,
                                                 ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_uint64,
                                                 ctypes.c_char_p, ctypes.c_size_t]
        self._lib.cuda_on_cpu_launch.restype = ctypes.c_int
        self._lib.cuda_on_cpu_last_vector_loads.restype = ctypes.c_ulong
        self._sizes: dict[str, tuple[int, ...]] = {}
        self.vector_loads = 0    # 16-byte loads (__ldg / __ldcg of a 16-byte type) of every launch so far

    def param_sizes(self, name: str) -> tuple[int, ...]:
        if name not in self._sizes:
            key = name.encode()
            n = self._lib.cuda_on_cpu_param_count(key)
            if n < 0:
                raise LaunchError(f"no kernel {name!r} in {self.path.name}")
            self._sizes[name] = tuple(self._lib.cuda_on_cpu_param_size(key, i) for i in range(n))
        return self._sizes[name]

    def launch(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple,
               workers: int = 1, schedule: int = 1) -> None:
        """Run kernel ``name`` to completion. ``args``: numpy scalars, one per kernel parameter, each of the
        parameter's exact size (a mismatch is an error here, where CUDA would read garbage). ``schedule``: 0 runs a
        block's threads in index order between barriers, any other value seeds a random order."""
        self.launch_pack(name, grid, block, ArgPack(args), workers, schedule)

    def launch_pack(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], pack: ArgPack,
                    workers: int = 1, schedule: int = 1) -> None:
        """:meth:`launch` with the arguments already packed as cuLaunchKernel takes them (a loader.ArgPack)."""
        sizes = self.param_sizes(name)
        if len(pack.sizes) != len(sizes):
            raise LaunchError(f"{name} takes {len(sizes)} arguments; got {len(pack.sizes)}")
        wrong = [(i, got, want) for i, (got, want) in enumerate(zip(pack.sizes, sizes)) if got != want]
        if wrong:
            raise LaunchError(f"{name}: argument size mismatch (index, bytes given, bytes expected): {wrong}")
        error = ctypes.create_string_buffer(512)
        rc = self._lib.cuda_on_cpu_launch(name.encode(), *grid, *block, pack.params, workers, schedule, error,
                                           len(error))
        if rc != 0:
            raise LaunchError(f"{name} grid {grid}: {error.value.decode()}")
        self.vector_loads += self._lib.cuda_on_cpu_last_vector_loads()


class CpuLauncher(Launcher):
    """A cupy_backend launcher that runs verify.cu on the CPU runtime (CPU tensors in, CPU tensors out).

    ``sm_count`` is the GPU the launch geometry is computed for (132: an H100 SXM), so grids have as many blocks
    as they would there and the multi-block paths (partials, last-block-done) run. ``workers``: OS threads that
    run blocks concurrently. ``schedule``: the seed of the random order of a block's threads (0: index order).
    """

    name = "cuda-on-cpu"
    device_type = "cpu"

    def __init__(self, library: KernelLibrary, sm_count: int = 132, workers: int | None = None,
                 schedule: int = 1) -> None:
        super().__init__()
        self.library = library
        self.schedule = schedule
        self.sms = sm_count
        self.workers = workers or os.cpu_count() or 1
        self.launches: list[tuple[str, tuple[int, int, int]]] = []   # (kernel<dtype>, grid) of every launch

    def sm_count(self, device) -> int:
        return self.sms

    def stream(self, device) -> object:
        return "cpu"

    def kernel(self, kernel, dtype, device) -> object:
        return f"{kernel}<{CXX_TYPES[dtype]}>"

    def launch(self, kernel, grid, args, stream) -> None:
        self.launches.append((kernel, tuple(grid)))
        self.library.launch_pack(kernel, tuple(grid), (THREADS, 1, 1), args, self.workers, self.schedule)
