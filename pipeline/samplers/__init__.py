"""Verify-step samplers behind one contract (see :mod:`pipeline.samplers.contract`).

    from pipeline.samplers import get_sampler, available_samplers
    sampler = get_sampler("exact", backend="torch", temperature=1.0)
    result = sampler(draft_tokens, draft_logits, target_logits, generator=gen)

Names: exact (lossless), sigmoid (the paper's approximation; ``preset="paper"`` for its kernel constants),
greedy, and hf (transformers' own step, the baseline). Backends: ``torch`` (the reference, CPU or CUDA) and
``cupy`` (CUDA kernels in kernels/, listed only where a GPU and CuPy are present).
"""

from __future__ import annotations

import importlib
import inspect

from pipeline.errors import BackendUnavailableError, SamplerInputError
from pipeline.samplers.contract import FiniteCheck, SamplerResult
from pipeline.samplers.hf import HFSampler
from pipeline.samplers.torch_ref import ExactSampler, GreedySampler, Sampler, SigmoidSampler

__all__ = ["SAMPLER_NAMES", "FiniteCheck", "Sampler", "SamplerResult", "available_samplers", "get_sampler"]

SAMPLER_NAMES = ("exact", "sigmoid", "greedy", "hf")

_TORCH = {"exact": ExactSampler, "sigmoid": SigmoidSampler, "greedy": GreedySampler, "hf": HFSampler}

# Backends other than torch live in their own modules, imported on first use. Each module exposes
# SAMPLERS (name -> class), available() -> bool and unavailable_reason() -> str.
_OPTIONAL_BACKENDS = {"cupy": "pipeline.samplers.cupy_backend"}


def _backend_module(backend: str):
    return importlib.import_module(_OPTIONAL_BACKENDS[backend])


def _classes(backend: str) -> dict:
    if backend == "torch":
        return _TORCH
    if backend not in _OPTIONAL_BACKENDS:
        raise SamplerInputError(
            f"unknown sampler backend {backend!r}: choose one of {['torch', *_OPTIONAL_BACKENDS]}")
    module = _backend_module(backend)
    if not module.available():
        raise BackendUnavailableError(f"sampler backend {backend!r} is unavailable: {module.unavailable_reason()}")
    return module.SAMPLERS


def available_samplers() -> list[tuple[str, str]]:
    """(name, backend) pairs that can run on this machine."""
    pairs = [(name, "torch") for name in _TORCH]
    for backend in _OPTIONAL_BACKENDS:
        try:
            module = _backend_module(backend)
        except ImportError:
            continue
        if module.available():
            pairs += [(name, backend) for name in module.SAMPLERS]
    return pairs


def get_sampler(name: str, backend: str = "torch", preset: str | None = None, **params) -> Sampler:
    """Build a sampler. ``params``: temperature (all), alpha and beta (sigmoid). ``preset="paper"`` (sigmoid)
    uses the constants of the paper's released kernels (see SigmoidSampler.paper)."""
    if name not in SAMPLER_NAMES:
        raise SamplerInputError(f"unknown sampler {name!r}: choose one of {list(SAMPLER_NAMES)}")
    classes = _classes(backend)
    if name not in classes:
        raise SamplerInputError(f"sampler {name!r} has no {backend!r} backend: choose one of {sorted(classes)}")
    cls = classes[name]
    if preset is not None:
        if preset != "paper" or name != "sigmoid":
            raise SamplerInputError(f"preset {preset!r} does not exist for {name!r}: only sigmoid has preset 'paper'")
        if {"alpha", "beta"} & params.keys():
            raise SamplerInputError("preset 'paper' fixes alpha and beta: pass either the preset or alpha/beta")
        params = {**params, "alpha": SigmoidSampler.PAPER_ALPHA, "beta": SigmoidSampler.PAPER_BETA}
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise SamplerInputError(f"sampler {name!r} takes parameters {accepted}; got unknown {unknown}")
    return cls(**params)
