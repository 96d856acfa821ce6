"""Compile the verify kernels of verify.cu with CuPy (NVRTC) and launch them on PyTorch's current stream.

    module(device_index)              cupy.RawModule with every instantiation (compiled once per process and
                                      device; CuPy's on-disk cache means a second process loads the cubin)
    function(device_index, name, dtype)    one instantiation, loaded (its ``ptr`` is the CUfunction)
    launch(fn, grid, pack, stream, index)  one launch through the driver (cuLaunchKernel); no synchronisation
    ArgPack(args)                     a kernel's arguments, laid out once as cuLaunchKernel reads them
    compile_for_arch("90")            compile every instantiation to a cubin without a GPU (tests, ptxas figures)

Kernel arguments are raw device addresses of torch tensors (``tensor.data_ptr()``): no copies, no DLPack
objects, nothing that waits for the device. Scalars are given as explicit numpy types (int32 / int64 /
float32) so that they match the kernel's C types byte for byte. An :class:`ArgPack` holds them in the form
cuLaunchKernel takes (``kernelParams``: an array of pointers, one per argument, to the argument's bytes); it is
built once per launch shape, a call rewrites only the addresses that change (its inputs), and the launch hands
the array to the driver as it is: no conversion of each argument on every call.

Headers: cuda_fp16.h and cuda_bf16.h come from the ``nvidia-cuda-runtime`` wheel (nvidia/cu13/include), found
with cuda-pathfinder, so compilation needs no CUDA toolkit on the machine.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SOURCE_PATH = Path(__file__).with_name("verify.cu")

# torch dtype name -> C++ type of the logits
CXX_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
KERNELS = ("exact_partials", "sample_exact", "sample_sigmoid", "greedy_verify", "tree_verify_partials",
           "tree_verify")
NAME_EXPRESSIONS = tuple(f"{k}<{t}>" for k in KERNELS for t in CXX_TYPES.values())

# Mirrors of the constants in verify.cu (checked against the source by tests/test_kernels_compile.py).
THREADS = 256
CHUNK = 1024
MAX_GAMMA = 16
MAX_CHUNKS = 256
MAX_VOCAB = MAX_CHUNKS * CHUNK  # 262,144
MAX_TREE_NODES = 256            # == tree_shape.MAX_TREE_NODES

# Options CuPy's RawModule adds itself for NVRTC; compile_for_arch adds them too, so its cubins and ptxas
# figures are those of the code that runs.
_CUPY_ADDED_OPTIONS = ("--device-as-default-execution-space", "-ftz=true")


class KernelBuildError(RuntimeError):
    """The kernels could not be compiled (missing NVRTC or headers, or a compile error)."""


def source() -> str:
    return SOURCE_PATH.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def header_dir() -> str:
    """The folder holding cuda_fp16.h / cuda_bf16.h (the nvidia-cuda-runtime wheel's include folder)."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError as e:
        raise KernelBuildError("cuda-pathfinder is not installed: pip install -e '.[dev]' (it comes with cupy)") from e
    found = find_nvidia_header_directory("cudart")
    if not found or not (Path(found) / "cuda_fp16.h").is_file() or not (Path(found) / "cuda_bf16.h").is_file():
        raise KernelBuildError(
            f"cuda_fp16.h / cuda_bf16.h not found (cudart headers: {found}): pip install nvidia-cuda-runtime "
            "(the version pinned in constraints.txt)")
    return str(found)


def compile_options() -> tuple[str, ...]:
    return ("-std=c++17", f"-I{header_dir()}")


@dataclass
class CompiledKernels:
    """Result of :func:`compile_for_arch`: one cubin holding every instantiation."""

    arch: str
    cubin: bytes
    lowered_names: dict[str, str]   # name expression -> mangled name
    log: str                        # NVRTC log (ptxas -v lines when asked for)
    seconds: float


def compile_for_arch(arch: str | int, ptxas_verbose: bool = False) -> CompiledKernels:
    """Compile every instantiation for ``sm_<arch>`` with NVRTC (no GPU needed). Raises KernelBuildError."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as e:
        raise KernelBuildError(
            "CuPy is not installed: pip install -e '.[dev]' (cupy-cuda13x, nvidia-cuda-nvrtc)") from e
    arch = str(arch).removeprefix("sm_")
    options = (*compile_options(), *_CUPY_ADDED_OPTIONS, f"-arch=sm_{arch}")
    if ptxas_verbose:
        options += ("-Xptxas=-v",)
    t0 = time.perf_counter()
    prog = nvrtc.createProgram(source(), SOURCE_PATH.name, (), ())
    try:
        for name in NAME_EXPRESSIONS:
            nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as e:
            raise KernelBuildError(f"NVRTC failed for sm_{arch}: {e}\n{nvrtc.getProgramLog(prog)}") from e
        lowered = {name: nvrtc.getLoweredName(prog, name) for name in NAME_EXPRESSIONS}
        cubin = nvrtc.getCUBIN(prog)
        log = nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return CompiledKernels(arch=arch, cubin=cubin, lowered_names=lowered, log=log,
                           seconds=time.perf_counter() - t0)


@functools.cache
def module(device_index: int):
    """The RawModule for one device, every instantiation loaded (first call compiles or reads CuPy's cache)."""
    import cupy

    with cupy.cuda.Device(device_index):
        mod = cupy.RawModule(code=source(), options=compile_options(), name_expressions=NAME_EXPRESSIONS)
        for name in NAME_EXPRESSIONS:
            mod.get_function(name)  # compile + load now, not inside the first timed or captured step
    return mod


@functools.cache
def function(device_index: int, name: str, dtype: str):
    """Kernel ``name<dtype>`` loaded on the device: a cupy.cuda.Function (``ptr`` is its CUfunction), kept."""
    import cupy

    raw = module(device_index).get_function(f"{name}<{CXX_TYPES[dtype]}>")     # a RawKernel, per device
    with cupy.cuda.Device(device_index):
        return raw.kernel


_STREAMS: dict[tuple[int, int], object] = {}


def cupy_stream(device_index: int):
    """CuPy's view of torch's current stream on the device (cached per stream handle)."""
    import cupy
    import torch

    stream = torch.cuda.current_stream(device_index)
    key = (device_index, stream.cuda_stream)
    cp_stream = _STREAMS.get(key)
    if cp_stream is None:
        if hasattr(cupy.cuda.Stream, "from_external"):
            cp_stream = cupy.cuda.Stream.from_external(stream)
        else:
            cp_stream = cupy.cuda.ExternalStream(stream.cuda_stream, device_index)
        _STREAMS[key] = cp_stream
    return cp_stream


def launch(fn, grid: tuple[int, int, int], pack: ArgPack, stream: int, device_index: int) -> None:
    """Launch ``fn`` (from :func:`function`) over ``grid`` with ``THREADS`` threads per block on ``stream`` (a CUDA
    stream handle: torch's ``current_stream().cuda_stream``) of device ``device_index``, with the arguments in
    ``pack``. Asynchronous. cuLaunchKernel copies the arguments when it is called, so ``pack`` may be rewritten
    as soon as this returns."""
    runtime, _ = _driver()
    if runtime.getDevice() == device_index:
        _launch_on_current_device(fn, grid, pack, stream, device_index)
        return
    import cupy

    with cupy.cuda.Device(device_index):
        _launch_on_current_device(fn, grid, pack, stream, device_index)


_THREAD = threading.local()


def _launch_on_current_device(fn, grid, pack: ArgPack, stream: int, device_index: int) -> None:
    runtime, launch_kernel = _driver()
    ready = _THREAD.__dict__.setdefault("devices", set())
    if device_index not in ready:    # as CuPy's own launches: a runtime call makes the device's context current on
        runtime.memGetInfo()         # this thread, once per thread and device (the driver launches in it)
        ready.add(device_index)
    launch_kernel(fn.ptr, *grid, THREADS, 1, 1, 0, stream, pack.address, 0)


@functools.cache
def _driver():
    """(CuPy's CUDA runtime bindings, cuLaunchKernel), imported on the first launch."""
    from cupy.cuda import runtime
    from cupy_backends.cuda.api import driver

    return runtime, driver.launchKernel


# ---- argument helpers ------------------------------------------------------------------------------------------

class ArgPack:
    """A kernel's arguments as cuLaunchKernel reads them: each in its own 8-byte slot of one buffer (``slots``,
    uint64 [n]; an argument of 4 bytes in its slot's first 4, as a little-endian machine reads it), and ``params``,
    the array of the slots' addresses (``void*[n]``, at ``address``). ``sizes``: each argument's bytes. Built once;
    :meth:`set` rewrites one slot in place (a pointer that changes from call to call)."""

    def __init__(self, args: tuple) -> None:
        values = [np.asarray(a) for a in args]
        unfit = [i for i, v in enumerate(values) if v.ndim or v.itemsize > 8]
        if unfit:
            raise ValueError(f"kernel arguments are numpy scalars of at most 8 bytes; arguments {unfit} are not")
        self.sizes = tuple(v.itemsize for v in values)
        self.slots = np.zeros(len(values), dtype=np.uint64)
        raw = self.slots.view(np.uint8).reshape(len(values), 8)
        for i, v in enumerate(values):
            raw[i, : v.itemsize] = np.frombuffer(v.tobytes(), dtype=np.uint8)
        base = self.slots.ctypes.data
        self.params = (ctypes.c_void_p * len(values))(*(base + 8 * i for i in range(len(values))))
        self.address = ctypes.addressof(self.params)

    def set(self, index: int, address: int) -> None:
        """Write a device address (a pointer argument) into slot ``index``."""
        self.slots[index] = address


def ptr(tensor) -> np.uint64:
    """Device address of a torch tensor's first element, as a kernel pointer argument."""
    return np.uint64(tensor.data_ptr())


def i32(value: int) -> np.int32:
    return np.int32(value)


def i64(value: int) -> np.int64:
    return np.int64(value)


def f32(value: float) -> np.float32:
    return np.float32(value)
