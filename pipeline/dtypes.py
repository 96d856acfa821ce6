"""The floating-point dtypes a run, a benchmark or a kernel can use: their names, defined once.

Names are what the CLI, params.yaml and results files carry; :func:`torch_dtype` and :func:`dtype_name` convert.
This module imports torch only inside those functions, so ``specsweep --help`` stays light.
"""

from __future__ import annotations

DTYPES = ("float32", "float16", "bfloat16")


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
