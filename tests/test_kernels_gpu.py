"""The cupy kernels against the torch reference on a GPU (skips without CUDA).

The shared cases and agreement rule of tests/kernel_cases.py (also run on the CPU runtime in every CI run), plus
what only a GPU can show: half precision against fp32 at full size, no host sync, and the verify step captured
and replayed in CUDA graphs (growing B, two streams).
"""

from __future__ import annotations

import pytest
import torch
from kernel_cases import KernelBackend, KernelCases, make_inputs

from pipeline.samplers import cupy_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cupy_backend.available(), reason=f"cupy backend: {cupy_backend.unavailable_reason()}"),
]

CUDA = torch.device("cuda")


@pytest.fixture
def gpu() -> KernelBackend:
    return KernelBackend(cupy_backend.SAMPLERS, CUDA)


class TestKernelsOnGpu(KernelCases):
    @pytest.fixture
    def kb(self, gpu) -> KernelBackend:
        return gpu


def _run(sampler, inputs, seed):
    return sampler(*inputs, generator=torch.Generator(device="cuda").manual_seed(seed))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["exact", "sigmoid"])
def test_half_precision_within_tolerance_of_fp32(dtype, name):
    """The same logit values as fp16/bf16 and as fp32 (exact upcast): only the summation grouping differs, so at
    least 99% of rows must be identical."""
    dt, dl, tl = make_inputs(CUDA, 64, 8, 128_256, 128_256, dtype, seed=4)
    sampler = cupy_backend.SAMPLERS[name](temperature=1.0)
    half = _run(sampler, (dt, dl, tl), seed=5)
    full = _run(sampler, (dt, dl.float(), tl.float()), seed=5)
    same = (half.tokens == full.tokens).all(1)
    assert same.float().mean().item() >= 0.99, f"{(~same).sum().item()} of 64 rows differ"


def test_no_host_sync_and_reproducible():
    inputs = make_inputs(CUDA, 16, 5, 32_000, 32_000, "bfloat16", seed=7)
    samplers = [cupy_backend.SAMPLERS[n]() for n in ("exact", "sigmoid", "greedy")]
    for s in samplers:                        # warm up: compile / load the module outside the checked region
        _run(s, inputs, 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        first = [_run(s, inputs, 8) for s in samplers]
        second = [_run(s, inputs, 8) for s in samplers]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, second):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accepted, b.accepted)
