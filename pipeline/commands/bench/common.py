"""What the `specsweep bench` subcommands share: the device rule, the GPU check, the toy pair's default folders and the
help of `specsweep run`'s flags."""

from __future__ import annotations

import dataclasses

from pipeline.config import RunConfig
from pipeline.errors import SpecsweepError


def run_help(name: str) -> str:
    """The help of `specsweep run`'s flag for setting ``name`` (RunConfig's field), so both flags say one thing."""
    return next(f for f in dataclasses.fields(RunConfig) if f.name == name).metadata["help"].replace("%", "%%")


def bench_device(name: str) -> str:
    """cpu, cuda, cuda:N or auto (CUDA when there is one): the run's own rules, minus the dtype check (the benchmarks "
    "choose their dtypes)."""
    from pipeline.models import resolve_device  # imports torch: kept out of `specsweep --help`

    return resolve_device(name)


def toy_pair(name: str) -> str:
    """The toy text pair's folder of ``name`` (target or draft), as `make` writes it."""
    return f"models/toy/text/{name}"


def gpu_slug() -> str:
    """The current GPU's name as a file-name part (e.g. nvidia-h100-80gb-hbm3)."""
    import re

    import torch  # a GPU benchmark only

    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")


def require_cupy(command: str) -> None:
    """A one-line SpecsweepError unless the cupy backend (a CUDA GPU, cupy and the kernels) can run ``command``."""
    from pipeline.samplers import cupy_backend  # imports torch: kept out of `specsweep --help`

    if not cupy_backend.available():
        raise SpecsweepError(f"{command} needs the cupy backend: {cupy_backend.unavailable_reason()}")
