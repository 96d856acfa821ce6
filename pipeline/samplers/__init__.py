"""Verify-step samplers behind one contract (see :mod:`pipeline.samplers.contract`).

    from pipeline.samplers import get_sampler, available_samplers
    sampler = get_sampler("exact", backend="torch", temperature=1.0)
    result = sampler(draft_tokens, draft_logits, target_logits, generator=gen)

Which rules exist, their parameters, presets and backends: :mod:`pipeline.rules`. Backends: ``torch`` (the
reference, CPU or CUDA) and ``cupy`` (CUDA kernels in kernels/, listed only where a GPU and CuPy are present).
"""

from __future__ import annotations

import importlib
import inspect

from pipeline.errors import BackendUnavailableError, SamplerInputError
from pipeline.rules import BACKENDS, RULES
from pipeline.samplers.contract import FiniteCheck, SamplerResult
from pipeline.samplers.torch_ref import Sampler

__all__ = ["FiniteCheck", "Sampler", "SamplerResult", "available_samplers", "get_sampler"]


def _backend_module(backend: str):
    return importlib.import_module(BACKENDS[backend])


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise SamplerInputError(f"unknown sampler backend {backend!r}: choose one of {list(BACKENDS)}")
    if BACKENDS[backend] is None:
        return
    module = _backend_module(backend)
    if not module.available():
        raise BackendUnavailableError(f"sampler backend {backend!r} is unavailable: {module.unavailable_reason()}")


def available_samplers() -> list[tuple[str, str]]:
    """(name, backend) pairs that can run on this machine."""
    usable = []
    for backend, module in BACKENDS.items():
        try:
            if module is None or _backend_module(backend).available():
                usable.append(backend)
        except ImportError:
            continue
    return [(name, backend) for backend in usable for name, rule in RULES.items() if backend in rule.backends]


def get_sampler(name: str, backend: str = "torch", preset: str | None = None, **params) -> Sampler:
    """Build a sampler. ``params``: temperature (all), and the rule's own (see :mod:`pipeline.rules`, e.g.
    alpha and beta for sigmoid). ``preset`` names one of the rule's presets (sigmoid: "paper", the constants
    of the paper's released kernels)."""
    if name not in RULES:
        raise SamplerInputError(f"unknown sampler {name!r}: choose one of {list(RULES)}")
    rule = RULES[name]
    _check_backend(backend)
    if backend not in rule.backends:
        raise SamplerInputError(f"sampler {name!r} has no {backend!r} backend: choose one of {list(rule.backends)}")
    params = rule.with_preset(preset, params)
    cls = rule.implementation(backend)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise SamplerInputError(f"sampler {name!r} takes parameters {accepted}; got unknown {unknown}")
    return cls(**params)
