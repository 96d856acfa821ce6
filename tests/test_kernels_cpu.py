"""The CUDA verify kernels, executed on the CPU and held to the torch reference: in every CI run, no GPU needed.

kernels/verify.cu is compiled unchanged with g++ against the CPU runtime in tests/cuda_on_cpu (each block on an
OS thread, each CUDA thread a fibre, strict barriers, 32-lane warps) and driven by the cupy backend's own launch
code: grid sizing for a 132-SM GPU, workspace, argument packing. The same cases and agreement rule as on the GPU
(tests/kernel_cases.py), plus what only this runtime can show: mutants of the kernel that the tests must catch,
and checks of the runtime itself. What it cannot catch is listed in tests/cuda_on_cpu/README.md.
"""

from __future__ import annotations

import pytest
import torch
from cuda_on_cpu import BuildError, CpuLauncher, KernelLibrary, LaunchError, build, compiler
from kernel_cases import (
    CONFIGS,
    KernelBackend,
    KernelCases,
    assert_agree,
    assert_any,
    assert_deterministic_lengths_agree,
    assert_greedy_agrees,
    assert_lengths_agree,
    make_inputs,
)
from stat_utils import THRESHOLD
from test_deterministic_drafts import DET_CASES, first_token_pvalue

from pipeline.kernels import loader
from pipeline.samplers import cupy_backend

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler (g++ >= 11 or clang++): apt install g++")

CPU = torch.device("cpu")


@pytest.fixture(scope="session")
def verify_library() -> KernelLibrary:
    return KernelLibrary(build(loader.SOURCE_PATH, loader.NAME_EXPRESSIONS))


# Configs with a larger batch run at this B on the CPU (B = 256 x V = 51865 x 33 rows would take a minute); the
# one-block-per-row geometry that B = 256 gives on a GPU is tested at a small B with fewer SMs below.
CPU_MAX_BATCH = 24


def cpu_backend(library: KernelLibrary, **launcher_args) -> KernelBackend:
    return KernelBackend(cupy_backend.bind(CpuLauncher(library, **launcher_args)), CPU, max_batch=CPU_MAX_BATCH)


class TestKernelsOnCpu(KernelCases):
    @pytest.fixture
    def kb(self, verify_library) -> KernelBackend:
        return cpu_backend(verify_library)


def test_grids_have_the_blocks_a_gpu_would_run(verify_library):
    """The launch geometry is the GPU's (132 SMs): rows are split over several blocks, so the slice partials and the
    last-block-done combine run; at B = 256 the partial pass has one block per row, as on the GPU."""
    launcher = CpuLauncher(verify_library)
    samplers = cupy_backend.bind(launcher)
    samplers["exact"]()(*make_inputs(CPU, 1, 5, 128_256, 128_256, "bfloat16"), torch.Generator().manual_seed(0))
    samplers["exact"]()(*make_inputs(CPU, 256, 2, 4_096, 4_096, "float32"), torch.Generator().manual_seed(0))
    grids = dict(launcher.launches[:2])
    assert grids["exact_partials<__nv_bfloat16>"] == (42, 11, 1)     # 42 slices x 11 rows: 462 blocks at B = 1
    assert launcher.launches[1][1][0] > 1                             # sample_exact: several blocks for one row
    assert launcher.launches[2] == ("exact_partials<float>", (1, 5, 256))    # one block per row at B = 256
    assert launcher.launches[3] == ("sample_exact<float>", (2, 256, 1))      # 4 chunks: 2 blocks of 2 per row


@pytest.mark.parametrize("name", ["exact", "sigmoid", "greedy"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_block_per_row_at_large_batch(verify_library, name, dtype):
    """B >= 4 blocks per SM: every row gets one block for its whole vocabulary, as B = 256 on a 132-SM GPU (here
    B = 40 on 8 SMs)."""
    kb = cpu_backend(verify_library, sm_count=8)
    kb.max_batch = 40
    params = {} if name == "greedy" else {"temperature": 1.0}
    assert_any(name, kb.inputs(40, 3, 51_865, 51_865, dtype, seed=21), kb, params, seed=22)
    grids = [grid for kernel, grid in kb.samplers[name].launcher.launches]
    assert all(grid[0] == 1 for grid in grids), grids


def test_a_growing_workspace_keeps_the_buffers_it_replaces():
    """A CUDA graph captured at a small B keeps pointers into the workspace: growing it for a larger B must not
    free them (they are retired, not released), and fresh counters start at zero."""
    import weakref

    ws = cupy_backend._Workspace(CPU).ensure(4, 100)
    old = [weakref.ref(t) for t in (ws.count, ws.flags, ws.dec, ws.nacc, ws.csum, ws.part)]
    ws.ensure(64, 10_000)
    assert ws.batch >= 64 and ws.part.numel() >= 10_000 and not bool(ws.count.any())
    assert all(r() is not None for r in old), "a buffer a captured graph may use was freed"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["exact", "greedy", "sigmoid"])
def test_rows_at_odd_vocabulary_sizes_keep_16_byte_loads(verify_library, name, dtype):
    """At an odd V (Whisper's 51865) every row but the first starts off a 16-byte boundary. The passes read each
    row's few head entries one by one and the rest as aligned 16-byte vectors, so nearly all of the logits a
    sampler must read still come in 16-byte loads (without peeling: only the 1 row in 4 (fp32) or 8 (bf16) that
    happens to be aligned)."""
    B, gamma, V = 6, 3, 51_865
    inputs = make_inputs(CPU, B, gamma, V, V, dtype, seed=31)
    kb = cpu_backend(verify_library)
    before = verify_library.vector_loads
    kb.samplers[name](temperature=0.0 if name == "greedy" else 1.0)(*inputs, kb.generator(32))
    per_vector = 4 if dtype == "float32" else 8
    # rows a pass reads: exact and greedy every row in their partial pass (2γ + 1 and γ + 1 per batch row);
    # sigmoid target row n of each batch row. (The draft row read beside a target row in the sample pass uses the
    # target row's split, so it comes in 16-byte loads only where both rows have the same head.)
    rows = {"exact": B * (2 * gamma + 1), "greedy": B * (gamma + 1), "sigmoid": B}[name]
    vectors = verify_library.vector_loads - before
    assert vectors >= 0.97 * rows * V / per_vector, f"{vectors} 16-byte loads for {rows} rows of {V}"


# ---- the inverse-CDF draw on crafted rows --------------------------------------------------------------------

PICK_KERNELS = r"""
#include "{source}"
// The draw's two choices, called as draw_token calls them, on weights and targets the test chooses.
__global__ void pick_chunk(const float* w, int nc, const float* u, int n, int* out) {{
  __shared__ specsweep::Shared sh;
  const float mine = threadIdx.x < nc ? w[threadIdx.x] : 0.0f;
  for (int i = 0; i < n; ++i) {{
    float offset;
    const int k = specsweep::choose_chunk(mine, nc, u[i], sh, offset);
    if (threadIdx.x == 0) out[i] = k;
    __syncthreads();
  }}
}}
__global__ void pick_in_chunk(const float* w, const float* offsets, int n, int* out) {{
  __shared__ specsweep::Shared sh;
  float mine[4];
  for (int e = 0; e < 4; ++e) mine[e] = w[threadIdx.x * 4 + e];
  for (int i = 0; i < n; ++i) {{
    const int j = specsweep::choose_in_chunk(mine, offsets[i], sh);
    if (threadIdx.x == 0) out[i] = j;
    __syncthreads();
  }}
}}
"""


@pytest.fixture(scope="module")
def pick_library(tmp_path_factory) -> KernelLibrary:
    path = tmp_path_factory.mktemp("pick") / "pick.cu"
    path.write_text(PICK_KERNELS.format(source=loader.SOURCE_PATH))
    return KernelLibrary(build(path, ("pick_chunk", "pick_in_chunk"), depends=(loader.SOURCE_PATH,)))


def _float32_run(lo: float, hi: float) -> torch.Tensor:
    """Every float32 from lo to hi (a few thousand at most)."""
    a, b = (torch.tensor([v], dtype=torch.float32).view(torch.int32).item() for v in (lo, hi))
    return torch.arange(a, b + 1, dtype=torch.int32).view(torch.float32)


def test_a_chunk_without_mass_is_never_chosen(pick_library):
    """Chunk sums whose block scan is not monotone: chunk 3 has no mass, yet its cdf (13940954) is below chunk 2's
    (13940955), because Kogge-Stone adds lane 3 as v2 + (v1 + v0) and lane 2 as (v2 + v1) + v0. Every u that puts
    x = u * total in that one-ulp window must still land on a chunk with mass."""
    w = torch.tensor([13939806.0, 748.2108154296875, 400.4255065917969, 0.0, 5.0])
    total = 13940954.0 + 5.0
    u = _float32_run((13940954.0 - 4) / total, (13940955.0 + 4) / total)
    out = torch.empty(len(u), dtype=torch.int32)
    pick_library.launch("pick_chunk", (1, 1, 1), (256, 1, 1),
                        (ptr(w), loader.i32(len(w)), ptr(u), loader.i32(len(u)), ptr(out)))
    assert set(out.tolist()) <= {0, 1, 2, 4} and 2 in out.tolist(), f"chose chunks {sorted(set(out.tolist()))}"


def test_an_entry_without_weight_is_never_chosen_inside_a_chunk(pick_library):
    """Weights [1000.5, 0, 0, 0 | 0, 0, 0, 2^30, 0...]: thread 1's cdf is rebuilt as (incl - local[3]) + local[e],
    and incl = 2^30 + 1000.5 rounds to 2^30 + 1024, so its three zero-weight entries get cdf 1024 > 1000.5. An
    offset in [1000.5, 1024) must pick entry 7 (the mass that follows), never the zero-weight entry 4."""
    w = torch.zeros(1024)
    w[0], w[7] = 1000.5, 2.0**30
    offsets = torch.cat([_float32_run(1000.0, 1000.5), torch.linspace(1000.5, 1024.0, 200),
                         _float32_run(1023.5, 1024.5), torch.tensor([0.0, 5e8])])
    out = torch.empty(len(offsets), dtype=torch.int32)
    pick_library.launch("pick_in_chunk", (1, 1, 1), (256, 1, 1),
                        (ptr(w), ptr(offsets), loader.i32(len(offsets)), ptr(out)))
    want = torch.where(offsets < 1000.5, 0, 7).to(torch.int32)
    assert torch.equal(out, want), f"chose {sorted(set(out.tolist()))} where {sorted(set(want.tolist()))} is right"


def test_the_reference_follows_the_same_rule_on_a_non_monotone_cdf():
    """contract.first_positive_above on a cdf as a parallel scan can produce it (entry 2 has no weight and a cdf
    below entry 1's): the first positive-weight entry above x, else the last positive one."""
    from pipeline.samplers.contract import first_positive_above

    cdf = torch.tensor([[1.0, 3.0, 2.9999, 4.0], [1.0, 3.0, 2.9999, 4.0], [1.0, 2.0, 2.0, 2.0]])
    weights = torch.tensor([[1.0, 2.0, 0.0, 1.0], [1.0, 2.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    x = torch.tensor([[2.99995], [0.5], [2.0]])
    assert first_positive_above(cdf, weights, x).tolist() == [1, 0, 1]


def test_graphed_verify_needs_a_kernel_sampler():
    from pipeline.errors import SamplerInputError
    from pipeline.samplers import get_sampler
    from pipeline.samplers.cuda_graphs import GraphedVerify

    with pytest.raises(SamplerInputError, match=r"needs a kernel sampler .*--backend cupy"):
        GraphedVerify(get_sampler("exact"))


@pytest.mark.parametrize("rule", ["exact", "sigmoid", "greedy"])
def test_graphed_verify_answers_what_the_engine_asks_every_sampler(verify_library, rule):
    """The engine and the draft-tokenizer mode ask a sampler for its name, backend, temperatures, params and whether
    it verifies by argmax; the graph wrapper answers as the sampler it wraps (a GPU run of `specsweep run
    --verify-graphs` failed on a missing verifies_by_argmax)."""
    from pipeline.samplers.cuda_graphs import GraphedVerify

    sampler = cpu_backend(verify_library).samplers[rule](temperature=0.7)
    graphed = GraphedVerify(sampler)
    for attribute in ("name", "backend", "temperature", "draft_temperature", "verifies_by_argmax", "params",
                      "takes_deterministic_drafts"):
        assert getattr(graphed, attribute) == getattr(sampler, attribute), attribute


def test_graphed_verify_checks_lengths_before_capturing(verify_library):
    """GraphedVerify takes per-row lengths as the samplers do: bad ones are refused by the contract's check before
    anything is captured; good ones reach the capture, which needs CUDA tensors."""
    from pipeline.errors import SamplerInputError
    from pipeline.samplers.cuda_graphs import GraphedVerify

    graphed = GraphedVerify(cpu_backend(verify_library).samplers["exact"](temperature=1.0))
    inputs = make_inputs(CPU, 3, 2, 1_000, 1_000, "float32")
    for bad in (torch.ones(3, dtype=torch.int32), torch.ones(2, dtype=torch.int64), [1, 2, 2]):
        with pytest.raises(SamplerInputError, match=r"lengths must be None or int64 \[B\] = \[3\]"):
            graphed(*inputs, lengths=bad)
    with pytest.raises(SamplerInputError, match="lengths is on meta"):
        graphed(*inputs, lengths=torch.ones(3, dtype=torch.int64, device="meta"))
    for lengths in (None, torch.tensor([0, 1, 5])):
        with pytest.raises(SamplerInputError, match="CUDA-graph verify needs CUDA tensors"):
            graphed(*inputs, lengths=lengths)
    assert graphed.graphs == 0


# ---- mutants: the tests above must fail on a broken kernel -----------------------------------------------------

# name -> (anchor in verify.cu, its broken replacement, the checks (CHECKS below) that must all fail)
MUTANTS = {
    # the warp-level Kogge-Stone scan adds one lane too few: every prefix sum after lane 0 is off
    "scan off by one": ("    if (lane >= off) v += o;", "    if (lane > off) v += o;", ("exact", "sigmoid")),
    # the barrier between writing the per-warp totals and reading them in block_inclusive_scan
    "barrier removed": ("  if (lane == 31) sh[warp] = v;\n  __syncthreads();", "  if (lane == 31) sh[warp] = v;",
                        ("exact", "sigmoid")),
    # per-row draft lengths ignored: every row verified with the full γ (padded positions accepted)
    "lengths ignored": ("  if (lengths == nullptr) return gamma;\n", "  return gamma;\n",
                        ("exact lengths", "sigmoid lengths", "greedy lengths")),
    # a row that accepted all of a short draft (n == g < γ) draws from the residual instead of the bonus row
    "residual at n == g": ("  rp.residual = n < g;", "  rp.residual = n < gamma;", ("exact lengths",)),
    # the emitted token drawn with u_γ instead of the row's u_g
    "uniform of column γ": ("csum, u[ub + g], sh);", "csum, u[ub + gamma], sh);", ("exact lengths", "sigmoid lengths")),
    # a deterministic draft's token kept in the residual (drawn from target row n itself after a rejection)
    "deterministic: x kept in the residual": (
        "  rp.xr = rp.det && gamma > 0 ? tokens[static_cast<long long>(b) * gamma + nd] : -1;", "  rp.xr = -1;",
        ("exact deterministic", "exact deterministic lengths")),
    # a deterministic draft's token accepted with probability 1 (q(x) taken ~0: u * q < p always)
    "deterministic: always accepted": ("const float q = det ? 1.0f ", "const float q = det ? 1e-30f ",
                                       ("exact deterministic", "exact deterministic lengths")),
}

CHECKS = {
    "exact": lambda kb: assert_agree(kb, "exact", {"temperature": 1.0}, kb.inputs(*CONFIGS[4]), seed=1),
    "sigmoid": lambda kb: assert_agree(kb, "sigmoid", {"temperature": 1.0, "alpha": 0.5, "beta": 0.0},
                                       kb.inputs(*CONFIGS[6]), seed=3),
    "exact lengths": lambda kb: assert_lengths_agree(kb, "exact", "float32"),
    "sigmoid lengths": lambda kb: assert_lengths_agree(kb, "sigmoid", "float32"),
    "greedy lengths": lambda kb: assert_lengths_agree(kb, "greedy", "float32"),
    "exact deterministic": lambda kb: assert_agree(kb, "exact", {"temperature": 1.0}, kb.deterministic(*CONFIGS[4]),
                                                   seed=51),
    "exact deterministic lengths": lambda kb: assert_deterministic_lengths_agree(kb, "exact"),
}


def mutant_backend(mutant: str) -> KernelBackend:
    """The kernel samplers built from verify.cu with MUTANTS[mutant]'s defect (cached by build() per source text)."""
    original, broken, _ = MUTANTS[mutant]
    source = loader.source()
    assert source.count(original) == 1, f"the mutant's anchor is gone from verify.cu: update MUTANTS[{mutant!r}]"
    library = KernelLibrary(build(loader.SOURCE_PATH, loader.NAME_EXPRESSIONS, text=source.replace(original, broken)))
    return cpu_backend(library)


@pytest.mark.parametrize("mutant", MUTANTS, ids=list(MUTANTS))
def test_the_tests_catch_a_broken_kernel(mutant):
    """Build verify.cu with one defect and run the mutant's agreement checks on it: they must all fail."""
    _, _, checks = MUTANTS[mutant]
    kb = mutant_backend(mutant)
    failures = 0
    for name in checks:
        try:
            CHECKS[name](kb)
        except (AssertionError, LaunchError):
            failures += 1
    assert failures == len(checks), f"{mutant}: only {failures} of {len(checks)} checks failed on the broken kernel"
    # and the unbroken kernel passes the same checks (so the failures above are the mutant's)
    assert_greedy_agrees(kb, kb.inputs(*CONFIGS[6]))


def test_the_exactness_test_catches_a_broken_deterministic_kernel():
    """The chi-square test of tests/test_deterministic_drafts.py (the first emitted token against the target), which
    the kernels pass there on the same case, on the kernel whose deterministic mode keeps x in the residual: it must
    fail. (The torch-level negative controls there cover a draft accepted with probability 1 too.)"""
    sampler = mutant_backend("deterministic: x kept in the residual").samplers["exact"](temperature=1.0)
    broken, _ = first_token_pvalue(sampler, DET_CASES["mixed"], seed=7)
    assert broken <= THRESHOLD, f"the chi-square test passed a broken kernel (p = {broken:.3g})"


# ---- the runtime itself ---------------------------------------------------------------------------------------

RUNTIME_KERNELS = r"""
// Test kernels for the runtime's own checks.
__global__ void warp_sums(const float* in, float* out) {      // only warp 1 reduces: shuffles are per warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 1) {
    float v = in[lane];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    out[lane] = v;
  }
}
__global__ void divergent_barrier(int* out) {                  // thread 0 leaves before the barrier
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void misaligned_load(const float* base, float* out) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(base + 1));
  out[threadIdx.x] = __uint_as_float(v.x);
}
__global__ void partial_mask(float* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1.0f, 1);
}
__global__ void last_block_counts(unsigned* counter, unsigned* last) {   // atomicInc wraps to 0 at the last block
  __shared__ int flag;
  if (threadIdx.x == 0) flag = atomicInc(counter, gridDim.x - 1u) == gridDim.x - 1u;
  __syncthreads();
  if (flag && threadIdx.x == 0) atomicAdd(last, 1u);
}
"""
RUNTIME_NAMES = ("warp_sums", "divergent_barrier", "misaligned_load", "partial_mask", "last_block_counts")


@pytest.fixture(scope="module")
def runtime_library(tmp_path_factory) -> KernelLibrary:
    path = tmp_path_factory.mktemp("runtime") / "runtime_checks.cu"
    path.write_text(RUNTIME_KERNELS)
    return KernelLibrary(build(path, RUNTIME_NAMES))


def ptr(t: torch.Tensor):
    return loader.ptr(t)


def test_warp_operations_synchronise_only_the_calling_warp(runtime_library):
    x = torch.arange(32, dtype=torch.float32)
    out = torch.zeros(32)
    runtime_library.launch("warp_sums", (1, 1, 1), (256, 1, 1), (ptr(x), ptr(out)))
    assert out.tolist() == [float(x.sum())] * 32


def test_a_barrier_not_every_thread_reaches_is_reported_as_a_deadlock(runtime_library):
    out = torch.zeros(256, dtype=torch.int32)
    with pytest.raises(LaunchError, match=r"deadlock .* 255 threads wait at __syncthreads, .* 1 have exited"):
        runtime_library.launch("divergent_barrier", (2, 1, 1), (256, 1, 1), (ptr(out),))


def test_misaligned_vector_loads_and_partial_warps_are_reported(runtime_library):
    x, out = torch.zeros(64), torch.zeros(256)
    with pytest.raises(LaunchError, match=r"misaligned address .* 16-byte __ldg"):
        runtime_library.launch("misaligned_load", (1, 1, 1), (256, 1, 1), (ptr(x), ptr(out)))
    with pytest.raises(LaunchError, match="partial warp mask"):
        runtime_library.launch("partial_mask", (1, 1, 1), (256, 1, 1), (ptr(out),))


def test_arguments_of_the_wrong_size_are_refused(runtime_library):
    out = torch.zeros(256)
    with pytest.raises(LaunchError, match="argument size mismatch"):
        runtime_library.launch("partial_mask", (1, 1, 1), (256, 1, 1), (loader.i32(0),))
    with pytest.raises(LaunchError, match="takes 2 arguments; got 1"):
        runtime_library.launch("warp_sums", (1, 1, 1), (256, 1, 1), (ptr(out),))


@pytest.mark.parametrize("workers", [1, 4])
def test_blocks_run_concurrently_and_one_is_last(runtime_library, workers):
    """Atomics across blocks on several OS threads: exactly one block of each launch sees itself last, and the
    counter is back at 0 after each launch without a reset (three launches in a row)."""
    counter, last = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    for _ in range(3):
        runtime_library.launch("last_block_counts", (97, 1, 1), (64, 1, 1), (ptr(counter), ptr(last)), workers)
    assert counter.item() == 0 and last.item() == 3


def test_build_errors_name_the_compiler_output(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(int* p) { p[0] = undefined_name; }\n")
    with pytest.raises(BuildError, match="undefined_name"):
        build(bad, ("k",))
