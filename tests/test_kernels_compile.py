"""The CUDA verify kernels build without a GPU: NVRTC (what CuPy runs) and nvcc's ptxas report no spills.

Runs on a CPU-only machine with the PyPI wheels alone (cupy-cuda13x, nvidia-cuda-nvrtc for the compiler,
nvidia-cuda-runtime for cuda_fp16.h / cuda_bf16.h). The nvcc test needs nvcc on PATH and skips without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.errors import BackendUnavailableError
from pipeline.kernels import loader
from pipeline.samplers import available_samplers, contract, get_sampler
from pipeline.tree_shape import MAX_TREE_NODES

ARCHS = ("80", "90")
SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
ENTRY = re.compile(r"Compiling entry function '(\w+)' for 'sm_(\d+)'")


def ptxas_figures(log: str) -> dict[str, tuple[int, int, int, int]]:
    """Mangled kernel name -> (registers, stack frame, spill store, spill load bytes) from a ptxas -v log."""
    out, name = {}, None
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = ENTRY.search(line)
        if m:
            name = m.group(1)
            continue
        s = SPILL.search(line)
        if s and name:
            regs = re.search(r"Used (\d+) registers", " ".join(lines[i + 1:i + 2]))
            out[name] = (int(regs.group(1)) if regs else -1, *map(int, s.groups()))
            name = None
    return out


@pytest.fixture(scope="module", params=ARCHS)
def compiled(request) -> loader.CompiledKernels:
    return loader.compile_for_arch(request.param, ptxas_verbose=True)


@pytest.mark.slow
def test_every_instantiation_compiles_with_nvrtc(compiled):
    assert compiled.cubin[:4] == b"\x7fELF", "NVRTC did not return a cubin"
    assert set(compiled.lowered_names) == set(loader.NAME_EXPRESSIONS)
    assert len(loader.NAME_EXPRESSIONS) == len(loader.KERNELS) * len(loader.CXX_TYPES) == 18
    figures = ptxas_figures(compiled.log)
    missing = [n for n, mangled in compiled.lowered_names.items() if mangled not in figures]
    assert not missing, f"ptxas reported nothing for {missing}"


@pytest.mark.slow
def test_nvrtc_build_has_no_spills_or_stack(compiled):
    figures = ptxas_figures(compiled.log)
    bad = {n: figures[m] for n, m in compiled.lowered_names.items() if figures[m][1:] != (0, 0, 0)}
    assert not bad, f"sm_{compiled.arch}: stack/spills (regs, stack, spill st, spill ld): {bad}"
    too_many = {n: figures[m][0] for n, m in compiled.lowered_names.items() if figures[m][0] > 64}
    assert not too_many, f"more than 64 registers (4 blocks of 256 threads per SM no longer fit): {too_many}"


def test_headers_and_nvrtc_come_from_the_wheels():
    from cuda.pathfinder import load_nvidia_dynamic_lib

    include = Path(loader.header_dir())
    assert (include / "cuda_fp16.h").is_file() and (include / "cuda_bf16.h").is_file()
    assert include.resolve().is_relative_to(Path(sys.prefix).resolve()), f"headers from outside the env: {include}"
    assert load_nvidia_dynamic_lib("nvrtc").found_via == "site-packages"


def test_constants_match_the_source_and_the_contract():
    src = loader.source()

    def const(name):
        return int(re.search(rf"constexpr int {name} = (\d+);", src).group(1))

    assert const("kThreads") == loader.THREADS
    assert const("kChunk") == loader.CHUNK == contract.CDF_CHUNK
    assert const("kMaxGamma") == loader.MAX_GAMMA
    assert const("kMaxChunks") == loader.MAX_CHUNKS
    assert const("kMaxTreeNodes") == loader.MAX_TREE_NODES == MAX_TREE_NODES
    tol = re.search(r"kResidualZeroTol = 16\.0f \* ([0-9.e+-]+)f;", src).group(1)
    assert 16 * float(tol) == contract.RESIDUAL_ZERO_TOL


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((str(p) for p in [Path("/usr/local/cuda/bin/nvcc")] if p.is_file()), None)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.slow
def test_nvcc_ptxas_reports_no_spills(arch, tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (the NVRTC tests above cover compilation)")
    refs = ", ".join(f"(void*)&{name}" for name in loader.NAME_EXPRESSIONS)
    wrapper = tmp_path / "all.cu"
    wrapper.write_text(f'#include "{loader.SOURCE_PATH}"\nvoid* specsweep_all[] = {{{refs}}};\n')
    # -ftz=true as CuPy compiles; nvcc uses its own toolkit's headers here
    cmd = [nvcc, "-std=c++17", f"-arch=sm_{arch}", "-cubin", "-ftz=true", "-Xptxas", "-v", "-o",
           str(tmp_path / "all.cubin"), str(wrapper)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = {n: f for n, f in ptxas_figures(proc.stderr + proc.stdout).items() if "specsweep" not in n}
    kernels = {n: f for n, f in figures.items() if any(k in n for k in loader.KERNELS)}
    assert len(kernels) == 18, f"expected 18 kernels in ptxas output, got {sorted(kernels)}"
    bad = {n: f for n, f in kernels.items() if f[1:] != (0, 0, 0)}
    assert not bad, f"sm_{arch}: stack/spills (regs, stack, spill st, spill ld): {bad}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the backend is available")
def test_cupy_backend_is_reported_unavailable_without_a_gpu():
    from pipeline.samplers import cupy_backend

    assert not cupy_backend.available()
    reason = cupy_backend.unavailable_reason()
    assert "GPU" in reason and "backend='torch'" in reason and "\n" not in reason
    for name in cupy_backend.SAMPLERS:
        with pytest.raises(BackendUnavailableError, match=r"cupy.*unavailable.*GPU"):
            get_sampler(name, backend="cupy")
    assert all(backend != "cupy" for _, backend in available_samplers())
