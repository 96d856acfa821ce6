"""The floating-point dtypes a run, a benchmark or a kernel can use: their names, defined once, and ``auto``.

Names are what the CLI, params.yaml and results files carry; :func:`torch_dtype` and :func:`dtype_name` convert.
``auto`` (:func:`resolve_dtype`) is the fastest dtype the device computes natively for the model: on a CPU that
multiplies bfloat16 in hardware (x86 with AVX-512 BF16 or AMX, Arm with its BF16 extension), bfloat16 for a target
of at least :data:`AUTO_BF16_MIN_PARAMETERS` parameters, whose forward reads its weights from memory and in
bfloat16 reads half the bytes of float32's (docs/benchmarks.md, over packed weights: Qwen2.5-Coder-1.5B's forward
about 1.8-1.9x faster than in float32 at 1 to 17 tokens); float32 for a smaller
one, whose weights sit in the caches and whose forward is mostly per-operation cost, which bfloat16 raises (the toy
pairs), and on other CPUs (where bfloat16 is emulated); bfloat16 on a GPU that has it, else float16.
This module imports torch only inside functions, so ``specsweep --help`` stays light.
"""

from __future__ import annotations

from pathlib import Path

DTYPES = ("float32", "float16", "bfloat16")
AUTO = "auto"
DTYPE_CHOICES = (AUTO, *DTYPES)
# /proc/cpuinfo flags of native bfloat16 arithmetic: x86 (flags) and Arm (Features)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# the smallest target that auto runs in bfloat16 on such a CPU (the toy targets have about 3 million parameters,
# the smallest real one, SmolLM2-135M, 135 million)
AUTO_BF16_MIN_PARAMETERS = 50_000_000


def torch_dtype(name: str):
    """The torch dtype called ``name`` (one of :data:`DTYPES`); ValueError otherwise."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: choose one of {list(DTYPES)}")
    import torch

    return getattr(torch, name)


def dtype_name(dtype) -> str:
    """'float32' for torch.float32 (one of :data:`DTYPES`); ValueError for another dtype."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype} is not one of {list(DTYPES)}")
    return name


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The CPU's flags of native bfloat16 arithmetic (:data:`BF16_CPU_FLAGS`), read from ``cpuinfo`` (the text of
    /proc/cpuinfo; read from the file when None): [] where there are none or the file cannot be read (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return []
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return [f for f in BF16_CPU_FLAGS if f in flags]


def resolve_dtype(name: str, device: str, parameters: int | None = None) -> tuple[str, str | None]:
    """(the dtype a run uses, why it was chosen or None) for ``name`` (:data:`DTYPE_CHOICES`) on ``device`` ('cpu',
    'cuda' or 'cuda:N', already resolved) for a target of ``parameters`` parameters (None: unknown, taken as large):
    ``auto`` becomes the fastest native dtype (module docstring), any other name is returned as it is, with None."""
    if name != AUTO:
        return name, None
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_bf16_supported():
            return "bfloat16", "auto: the GPU computes bfloat16"
        return "float16", "auto: the GPU has no bfloat16"
    flags = cpu_bf16_flags()
    if not flags:
        return "float32", "auto: the CPU has no native bfloat16 arithmetic (no avx512_bf16, amx_bf16 or bf16 flag)"
    if parameters is not None and parameters < AUTO_BF16_MIN_PARAMETERS:
        return "float32", (f"auto: a target of {parameters / 1e6:.1f}M parameters (below "
                           f"{AUTO_BF16_MIN_PARAMETERS / 1e6:.0f}M) runs faster in float32 on a CPU")
    return "bfloat16", f"auto: the CPU multiplies bfloat16 natively ({', '.join(flags)})"
