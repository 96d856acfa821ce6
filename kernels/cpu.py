"""CPU kernels: C++ sources compiled at first use with the machine's C++ compiler, loaded with ctypes.

    int4_linear.cpp   y = x @ W.T for a group-wise int4 weight W [N, K] and 1-4 bfloat16 rows x [M, K], with
                      AVX-512 BF16: a quantised draft's projections (pipeline/decoding/static/quant.py, Int4Linear)
    bf16_linear.cpp   y = x @ W.T + b for a bfloat16 weight W [N, K] and 1-9 bfloat16 rows x [M, K], with AVX-512
                      BF16: the packed projections of a decode or verify forward (pipeline/decoding/static/packed.py)
    int4_layers.cpp   a Llama-family model's decoder layers over one token with int4_linear's projections, in one
                      call: a quantised draft's one-token forward (pipeline/decoding/static/int4_row.py)
    amx_linear.cpp    y = x @ W.T + b for a bfloat16 weight W [N, K] in bf16_linear's layout and 1-16 bfloat16 rows,
                      with AMX tiles, where the CPU has them: what packed.py multiplies a few rows with there instead of
                      bf16_linear (a library of its own, built and loaded only on such a CPU)

    available()              whether the kernels run here (the CPU's instructions, a compiler, one OpenMP runtime)
    turned_off()             a block within which they do not (projections built there run torch's kernels)
    unavailable_reason()     why not, in one line ("" where they run)
    pack_int4(q, s, lo)      quant.py's int4 weight (q in 0..15, scales and minima per group of 128) in int4_linear's
                             layout (int4_linear.cpp says which): an Int4Weight
    int4_linear(x, weight)   x bfloat16 [M, K] (M <= MAX_ROWS) -> x @ W.T bfloat16 [M, N]
    pack_bf16(w)             a bfloat16 weight [N, K] in bf16_linear's layout (bf16_linear.cpp): a Bf16Weight
    bf16_linear(x, weight, bias)   x bfloat16 [M, K] (M <= BF16_ROWS) -> x @ W.T + bias bfloat16 [M, N]
    amx_available()          whether amx_linear runs here (the kernels above, AMX, and the tile registers granted)
    amx_linear(x, weight, bias)    the same for M <= AMX_ROWS and K a multiple of 32 (amx_linear.cpp)
    int4_layers(x, ...)      a decoder's layers over one token, x bfloat16 [d] updated in place (int4_layers.cpp)

Why our own. torch's int4 CPU kernel (``_weight_int4pack_mm_for_cpu``) widens the nibbles to float32 and spends more
time on that than on reading them; int4_linear turns each nibble into a bfloat16 with one OR and multiplies with
vdpbf16ps. On this project's CPU it is 1.6-2.7x torch's kernel over one row (the 0.5B draft's whole head, 68 MB of int4
that no cache holds: 40 GB/s against 25), 1.3-1.9x over three or four (``python -m pipeline.benchmarks.quant_linear``,
docs/benchmarks.md). No library on PyPI ships such a kernel for this torch on x86 (torchao's wheels carry CUDA kernels
only; llama.cpp's are built from source), and the kernel is 100 lines. oneDNN's packed bfloat16 product (packed.py)
does not overlap its arithmetic with reading the weights over a few rows: each row past the first adds its own
arithmetic time. bf16_linear feeds each load of W to every row's vdpbf16ps, so up to about 9 rows it costs little more
than one (``python -m pipeline.benchmarks.quant_linear``, the ``bf16_linear`` way), where the cores' vector units are
fast enough for it; on a CPU with AMX (the project's Xeon) a tile product of 16 rows costs what reading the weight
costs, while bf16_linear's 9 rows cost 2-3 times one (amx_linear.cpp says more).

Build. ``$CXX`` (else ``c++``) with -O3 -fopenmp and the AVX-512 flags, both sources into one library under
``kernels/`` in the cache directory (pipeline/roofline.py's :func:`cache_dir`), named by a hash of the sources, the
flags and the compiler's version: a second process loads the same file; a failed compile leaves nothing behind and
makes the kernels unavailable. They run only where /proc/cpuinfo lists avx512f, avx512bw, avx512vl and avx512_bf16.
amx_linear.cpp is built the same way into a second library with the AMX flags, only where /proc/cpuinfo lists
amx_tile and amx_bf16 too (a compiler without them leaves the other kernels running), and runs only once Linux has
granted the process the tile registers (``amx_linear_init``, asked once when it loads).
The library links OpenMP by its usual name, libgomp.so.1: torch's Linux wheels load a libgomp.so.1 first, so the
kernels run on torch's OpenMP threads, as many as ``torch.get_num_threads()`` says at each call. Where a second OpenMP
runtime shows up in the process after loading, the kernels are refused (two thread pools would spin against each other
on the same cores). ``SPECSWEEP_CPU_KERNELS=0`` turns them off (quant.py and packed.py then use torch's kernels), to
compare; ``SPECSWEEP_AMX=0`` turns off amx_linear alone (packed.py then runs bf16_linear's few rows).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

SOURCES = tuple(Path(__file__).with_name(name) for name in ("int4_linear.cpp", "bf16_linear.cpp", "int4_layers.cpp"))
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma")
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
"""What /proc/cpuinfo must list for the kernels to run."""
AMX_SOURCES = (Path(__file__).with_name("amx_linear.cpp"),)
AMX_FLAGS = (*FLAGS, "-mamx-tile", "-mamx-bf16")
AMX_CPU_FLAGS = ("amx_tile", "amx_bf16")
"""What /proc/cpuinfo must list besides CPU_FLAGS for amx_linear to run."""
AMX_ROWS = 16
"""The most rows x [M, K] one amx_linear call takes (one tile of x)."""
AMX_K = 32
"""amx_linear's K must be a multiple of it (a tile of x holds 32 inputs of each row)."""
GROUP = 128
"""Inputs per scale and minimum (quant.py's GROUP; the kernel's groups are 128 wide)."""
MAX_ROWS = 4
"""The most rows x [M, K] one int4_linear call takes."""
BF16_ROWS = 9
"""The most rows x [M, K] one bf16_linear call takes (bf16_linear.cpp)."""
BF16_BLOCK = 16
"""Rows of W per block of bf16_linear's layout (N is padded to a multiple)."""
MAX_GROUPS = 512
"""K / GROUP at most (int4_linear.cpp's MAX_GROUPS)."""
BLOCK = 4
"""Rows of W per block of int4_linear's layout (N is padded to a multiple)."""


class Int4Weight(NamedTuple):
    """W [N, K] ≈ q * s + min in int4_linear.cpp's layout (N padded to N' = a multiple of BLOCK with zero rows).

    packed  uint8 [N' / 4, K / 128, 4, 64];  scales, zeros float32 [N' / 4, K / 128, 4] (s, and min - 128 s)
    n       the rows N;  k  the inputs K
    """

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    n: int
    k: int


class Bf16Weight(NamedTuple):
    """W [N, K] bfloat16 in bf16_linear.cpp's layout (N padded to N' = a multiple of BF16_BLOCK with zero rows).

    packed  bfloat16 [N' / 16, K / 2, 16, 2]: packed[j, p, l, e] = W[16 j + l, 2 p + e]
    n       the rows N;  k  the inputs K
    """

    packed: torch.Tensor
    n: int
    k: int


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def _openmp_runtimes() -> set[str]:
    """The OpenMP runtime files mapped into this process (Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    names = ("libgomp", "libiomp", "libomp")
    return {line.split()[-1] for line in maps.splitlines() if any(n in line.rsplit("/", 1)[-1] for n in names)}


def _compile(compiler: str, out: Path, sources=SOURCES, flags=FLAGS) -> str:
    """Compile ``sources`` into ``out`` (atomically); returns "" or the compiler's first error line."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *flags, *map(str, sources), "-o", tmp], capture_output=True, text=True,
                              timeout=120)
        if done.returncode:
            lines = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines() or [""]
            return f"{compiler} failed: {lines[0].strip()[:200]}"
        os.replace(tmp, out)
        return ""
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{compiler} failed: {e}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build(name: str, sources, flags, needs, switch: str) -> tuple[ctypes.CDLL | None, str]:
    """(the library ``name`` built from ``sources`` with ``flags``, loaded, "") or (None, why not): where the
    environment variable ``switch`` is not "0" and /proc/cpuinfo lists every flag of ``needs``."""
    if os.environ.get(switch, "1") == "0":
        return None, f"turned off by {switch}=0"
    missing = [f for f in needs if f not in _cpu_flags()]
    if missing:
        return None, f"this CPU lacks {', '.join(missing)}"
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        return None, "no C++ compiler (set CXX or install g++)"
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"cannot run {compiler}: {e}"
    from pipeline.roofline import cache_dir  # kept local: quant.py imports this module, and `--help` need not load it

    text = b"".join(p.read_bytes() for p in sources)
    digest = hashlib.sha256(text + " ".join(flags).encode() + version.encode()).hexdigest()[:16]
    path = cache_dir() / "kernels" / f"{name}-{digest}.so"
    if not path.exists() and (error := _compile(compiler, path, sources, flags)):
        return None, error
    before = _openmp_runtimes()
    lib = ctypes.CDLL(str(path))
    if len(_openmp_runtimes()) > max(1, len(before)):
        return None, f"loading it brought a second OpenMP runtime ({sorted(_openmp_runtimes())})"
    return lib, ""


@functools.lru_cache(maxsize=1)
def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why not): built and loaded once per process."""
    lib, why = _build("cpu_kernels", SOURCES, FLAGS, CPU_FLAGS, "SPECSWEEP_CPU_KERNELS")
    if lib is None:
        return None, why
    lib.int4_linear.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.int4_linear.restype = ctypes.c_int
    lib.bf16_linear.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.bf16_linear.restype = ctypes.c_int
    lib.int4_layers.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 6,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.int4_layers.restype = ctypes.c_int
    return lib, ""


@functools.lru_cache(maxsize=1)
def _amx_library() -> tuple[ctypes.CDLL | None, str]:
    """(amx_linear's library, "") or (None, why not), once per process, after the other kernels' (it runs beside
    them, and with them off it is off too)."""
    if _library()[0] is None:
        return None, _library()[1]
    lib, why = _build("amx_kernels", AMX_SOURCES, AMX_FLAGS, AMX_CPU_FLAGS, "SPECSWEEP_AMX")
    if lib is None:
        return None, why
    lib.amx_linear_init.restype = ctypes.c_int
    if (status := lib.amx_linear_init()) != 0:
        return None, f"Linux did not grant the tile registers (arch_prctl ARCH_REQ_XCOMP_PERM: errno {status})"
    lib.amx_linear.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.amx_linear.restype = ctypes.c_int
    return lib, ""


_TURNED_OFF = [0]
"""How many :func:`turned_off` blocks are open."""
_AMX_OFF = [0]
"""How many :func:`turned_off` blocks with ``amx_only`` are open."""


@contextlib.contextmanager
def turned_off(amx_only: bool = False):
    """Within it, :func:`available` says False, so the projections built there run torch's kernels (and keep running
    them after): both kinds in one process, to time them paired (pipeline/benchmarks/quant_linear.py, forward.py).
    ``amx_only``: only :func:`amx_available` says False (packed projections built there run bf16_linear's few rows)."""
    counter = _AMX_OFF if amx_only else _TURNED_OFF
    counter[0] += 1
    try:
        yield
    finally:
        counter[0] -= 1


def available() -> bool:
    return not _TURNED_OFF[0] and _library()[0] is not None


def unavailable_reason() -> str:
    return "turned off by cpu.turned_off()" if _TURNED_OFF[0] else _library()[1]


def amx_available() -> bool:
    return available() and not _AMX_OFF[0] and _amx_library()[0] is not None


def amx_unavailable_reason() -> str:
    if not available():
        return unavailable_reason()
    return "turned off by cpu.turned_off(amx_only=True)" if _AMX_OFF[0] else _amx_library()[1]


def pack_int4(q: torch.Tensor, scales: torch.Tensor, minima: torch.Tensor) -> Int4Weight:
    """q int [N, K] in 0..15, scales and minima [N, K / GROUP] (W ≈ q * scales + minima per group, quant.py's
    quantize_int4) -> the kernel's layout (Int4Weight)."""
    N, K = q.shape
    groups = K // GROUP
    pad = -N % BLOCK
    q = torch.nn.functional.pad(q.to(torch.int32), (0, 0, 0, pad))
    s = torch.nn.functional.pad(scales.float(), (0, 0, 0, pad))
    lo = torch.nn.functional.pad(minima.float(), (0, 0, 0, pad))
    blocks = (N + pad) // BLOCK
    q = q.view(blocks, BLOCK, groups, 4, 32)                      # [block, row, group, t, lane]
    lanes = q[:, :, :, 0] | q[:, :, :, 1] << 4 | q[:, :, :, 2] << 8 | q[:, :, :, 3] << 12
    lanes = lanes.permute(0, 2, 1, 3).to(torch.int16)            # [block, group, row, lane]: 16-bit lanes
    packed = lanes.contiguous().view(torch.uint8).view(blocks, groups, BLOCK, 64)

    def per_group(t: torch.Tensor) -> torch.Tensor:          # [N', groups] -> [block, group, row]
        return t.view(blocks, BLOCK, groups).permute(0, 2, 1).contiguous()

    return Int4Weight(packed, per_group(s), per_group(lo - 128 * s), N, K)


def _call_args(kernel: str, x: torch.Tensor, k: int, n: int, rows: int):
    """(the library, x contiguous, an empty y bfloat16 [M, n]) for a call of ``kernel`` on x bfloat16 [M, k], M in
    1..rows; RuntimeError where the kernels do not run, ValueError for another x."""
    lib = _library()[0]
    if lib is None:
        raise RuntimeError(f"{kernel} is unavailable: {unavailable_reason()}")
    x = x.contiguous()
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != k or not 1 <= x.shape[0] <= rows:
        raise ValueError(f"{kernel} takes bfloat16 [1..{rows}, {k}], got {x.dtype} {list(x.shape)}")
    return lib, x, torch.empty(x.shape[0], n, dtype=torch.bfloat16)


def int4_linear(x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
    """x bfloat16 [M, K] on the CPU, 1 <= M <= MAX_ROWS -> x @ W.T bfloat16 [M, N] (int4_linear.cpp)."""
    lib, x, y = _call_args("int4_linear", x, weight.k, weight.n, MAX_ROWS)
    M, K = x.shape
    if lib.int4_linear(x.data_ptr(), M, K, weight.packed.data_ptr(), weight.scales.data_ptr(), weight.zeros.data_ptr(),
                       weight.n, y.data_ptr(), torch.get_num_threads()):
        raise ValueError(f"int4_linear refused [{M}, {K}] x [{weight.n}, {K}]")
    return y


def pack_bf16(weight: torch.Tensor) -> Bf16Weight:
    """weight bfloat16 [N, K] (K even) -> bf16_linear's layout (Bf16Weight): a copy, the weight itself untouched."""
    N, K = weight.shape
    if weight.dtype != torch.bfloat16 or K % 2:
        raise ValueError(f"bf16_linear packs a bfloat16 [N, K] weight with K even, got {weight.dtype} {[N, K]}")
    pad = -N % BF16_BLOCK
    w = torch.nn.functional.pad(weight.detach(), (0, 0, 0, pad))
    blocks = (N + pad) // BF16_BLOCK
    packed = w.view(blocks, BF16_BLOCK, K // 2, 2).permute(0, 2, 1, 3).contiguous()
    return Bf16Weight(packed, N, K)


def bf16_linear(x: torch.Tensor, weight: Bf16Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x bfloat16 [M, K] on the CPU, 1 <= M <= BF16_ROWS, bias float32 [N] or None -> x @ W.T + bias bfloat16 [M, N]
    (bf16_linear.cpp: float32 sums, the bias added in float32, rounded once; a row's result does not depend on the
    others)."""
    lib, x, y = _call_args("bf16_linear", x, weight.k, weight.n, BF16_ROWS)
    M, K = x.shape
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (weight.n,) or not bias.is_contiguous()):
        raise ValueError(f"bf16_linear takes a contiguous float32 bias [{weight.n}], got {bias.dtype} "
                         f"{list(bias.shape)}")
    if lib.bf16_linear(x.data_ptr(), M, K, weight.packed.data_ptr(), None if bias is None else bias.data_ptr(),
                       weight.n, y.data_ptr(), torch.get_num_threads()):
        raise ValueError(f"bf16_linear refused [{M}, {K}] x [{weight.n}, {K}]")
    return y


def amx_linear(x: torch.Tensor, weight: Bf16Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x bfloat16 [M, K] on the CPU, 1 <= M <= AMX_ROWS, K a multiple of AMX_K, bias float32 [N] or None -> x @ W.T +
    bias bfloat16 [M, N] from bf16_linear's packed weight (amx_linear.cpp: float32 sums, the bias added in float32,
    rounded once; a row's result does not depend on the others). RuntimeError where AMX does not run here."""
    lib = _amx_library()[0] if available() else None
    if lib is None:
        raise RuntimeError(f"amx_linear is unavailable: {amx_unavailable_reason()}")
    x = x.contiguous()
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != weight.k or not 1 <= x.shape[0] <= AMX_ROWS \
            or weight.k % AMX_K:
        raise ValueError(f"amx_linear takes bfloat16 [1..{AMX_ROWS}, {weight.k}] with K a multiple of {AMX_K}, got "
                         f"{x.dtype} {list(x.shape)}")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (weight.n,) or not bias.is_contiguous()):
        raise ValueError(f"amx_linear takes a contiguous float32 bias [{weight.n}], got {bias.dtype} "
                         f"{list(bias.shape)}")
    M, K = x.shape
    y = torch.empty(M, weight.n, dtype=torch.bfloat16)
    if lib.amx_linear(x.data_ptr(), M, K, weight.packed.data_ptr(), None if bias is None else bias.data_ptr(),
                      weight.n, y.data_ptr(), torch.get_num_threads()):
        raise ValueError(f"amx_linear refused [{M}, {K}] x [{weight.n}, {K}]")
    return y


INT4_LAYER_PTRS = 18
"""Pointers per layer in int4_layers' table (int4_layers.cpp's enum: norms, then per projection its int4 weight's
packed, scales, zeros and its bias or 0)."""


def int4_layers(x: torch.Tensor, ptrs: torch.Tensor, floats: torch.Tensor, *, heads: int, inter: int,
                keys: torch.Tensor, values: torch.Tensor, pos: int, cos: torch.Tensor, sin: torch.Tensor,
                work: torch.Tensor, scores: torch.Tensor) -> None:
    """Run every layer of ``ptrs`` over one token (int4_layers.cpp): x bfloat16 [d], updated in place.

    ptrs int64 [L, INT4_LAYER_PTRS], floats float32 [L, 3] (each layer's norms' eps and attention scaling); keys,
    values bfloat16 [L, H_kv, capacity, D] (written at ``pos``, read over 0 .. pos); cos, sin bfloat16 [D] (position
    ``pos``'s rows); work bfloat16 and scores float32 scratch (int4_layers.cpp says how much). ValueError for
    arguments out of range."""
    lib = _library()[0]
    if lib is None:
        raise RuntimeError(f"int4_layers is unavailable: {unavailable_reason()}")
    L, kv_heads, capacity, D = keys.shape
    (d,) = x.shape
    need_work = 2 * d + (2 * heads + 2 * kv_heads) * D + 3 * inter
    if (ptrs.shape != (L, INT4_LAYER_PTRS) or floats.shape != (L, 3) or values.shape != keys.shape
            or not all(t.is_contiguous() for t in (x, ptrs, floats, keys, values, cos, sin, work, scores))
            or x.dtype != keys.dtype or keys.dtype != torch.bfloat16 or cos.shape != (D,) or sin.shape != (D,)
            or work.numel() < need_work or scores.numel() < heads * (pos + 1) or not 0 <= pos < capacity):
        raise ValueError(f"int4_layers: arguments out of range (x {list(x.shape)}, keys {list(keys.shape)}, pos {pos})")
    if lib.int4_layers(x.data_ptr(), ptrs.data_ptr(), floats.data_ptr(), L, d, heads, kv_heads, D, inter,
                       keys.data_ptr(), values.data_ptr(), capacity, pos, cos.data_ptr(), sin.data_ptr(),
                       work.data_ptr(), scores.data_ptr(), torch.get_num_threads()):
        raise ValueError(f"int4_layers refused heads {heads} over {kv_heads}, head_dim {D}, pos {pos}")
