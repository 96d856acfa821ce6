"""The CPU kernels, built, packed for and called by kernels/cpu.py: kernels/int4_linear.cpp (an int4 draft's
projections, run by quant.py's Int4Linear where it can), kernels/bf16_linear.cpp and kernels/amx_linear.cpp (a packed
bfloat16 projection over a few rows, run by packed.py's PackedLinear where they can: amx_linear where the CPU has AMX).

int4_linear computes quant.py's int4 weight (q * s + min per group of 128 inputs) times 1-4 bfloat16 rows: the float32
product over the dequantised weight, rounded to bfloat16 once (bfloat16 products are exact in float32; only the order
of the float32 sums differs), for 1-4 rows, output rows not a multiple of the layout's block of 4, one group or 38;
a row's result does not depend on the other rows of the call. The layout puts every nibble, scale and zero where
the kernel's docstring says. Shapes it cannot take are refused; SPECSWEEP_CPU_KERNELS=0 or a compiler that fails
leaves it unavailable, with the reason, and Int4Linear then runs torch's kernel. The kernel tests skip where the CPU
lacks AVX-512 BF16 or no C++ compiler runs (the layout and fallback tests run everywhere).

bf16_linear computes x @ W.T + b for a bfloat16 W and 1-9 rows: the float32 product rounded to bfloat16 once, the
bias added in float32 first; output rows not a multiple of its block of 16; a row's result does not depend on the other
rows of the call or on the threads. Its layout puts W[16 j + l, 2 p + e] at packed[j, p, l, e].

amx_linear computes the same from the same layout for 1-16 rows and K a multiple of 32, with the same properties; its
tests skip where the CPU lacks AMX (or Linux does not grant the tile registers).
"""

from __future__ import annotations

import pytest
import torch

from pipeline.decoding.static import quant
from pipeline.decoding.static.packed import PackedLinear, few_rows_kernel
from pipeline.decoding.static.quant import Int4Linear, quantize_int4
from pipeline.errors import SpecsweepError
from pipeline.kernels import cpu

needs_kernel = pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels: {cpu.unavailable_reason()}")
needs_amx = pytest.mark.skipif(not cpu.amx_available(), reason=f"amx_linear: {cpu.amx_unavailable_reason()}")


@pytest.fixture
def fresh_library(monkeypatch):
    """The kernel's build state forgotten before and after the test (the environment is the test's to change)."""
    cpu._library.cache_clear()
    cpu._amx_library.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    cpu._library.cache_clear()
    cpu._amx_library.cache_clear()


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)


def test_the_layout_puts_each_nibble_scale_and_zero_where_the_kernel_reads_them():
    n, k = 6, 256                                                         # 6 rows: two blocks, the second padded
    q, s, lo = quantize_int4(_weight(n, k, 0))
    w = cpu.pack_int4(q, s, lo)
    assert (w.n, w.k) == (n, k) and w.packed.dtype == torch.uint8 and w.packed.shape == (2, 2, 4, 64)
    lanes = w.packed.view(torch.int16).to(torch.int32) & 0xFFFF          # [block, group, row, 32 lanes]
    for row in range(8):
        b, r = divmod(row, 4)
        for g in range(2):
            for t in range(4):
                nibbles = (lanes[b, g, r] >> (4 * t)) & 0xF
                expected = q[row, g * 128 + t * 32: g * 128 + (t + 1) * 32] if row < n else torch.zeros(32)
                assert torch.equal(nibbles, expected.to(torch.int32)), (row, g, t)
            expected_s = s[row, g] if row < n else 0.0
            assert w.scales[b, g, r] == expected_s
            assert w.zeros[b, g, r] == (lo[row, g] - 128 * s[row, g] if row < n else 0.0)


@needs_kernel
@pytest.mark.parametrize("n,k", [(5, 128), (100, 256), (896, 896), (64, 4864)])
def test_int4_linear_is_the_product_over_the_dequantised_weight(n, k):
    weight = _weight(n, k, n + k)
    q, s, lo = quantize_int4(weight)
    dense = (q.view(n, k // 128, 128) * s[..., None] + lo[..., None]).view(n, k)     # float32
    w = cpu.pack_int4(q, s, lo)
    x = torch.randn(cpu.MAX_ROWS, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for m in range(1, cpu.MAX_ROWS + 1):
        y = cpu.int4_linear(x[:m], w)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        reference = x[:m].float() @ dense.T
        # one bfloat16 rounding of a float32 sum: within bfloat16's half ulp of the result, plus the sums' order
        torch.testing.assert_close(y.float(), reference, rtol=2 ** -8, atol=1e-5 * k ** 0.5)
        for i in range(m):                                             # a row is the same alone and among others
            assert torch.equal(y[i], cpu.int4_linear(x[i: i + 1], w)[0])


@needs_kernel
def test_int4_linear_refuses_what_it_cannot_take():
    w = cpu.pack_int4(*quantize_int4(_weight(8, 128, 0)))
    for x in (torch.zeros(cpu.MAX_ROWS + 1, 128, dtype=torch.bfloat16), torch.zeros(1, 256, dtype=torch.bfloat16),
              torch.zeros(1, 128, dtype=torch.float32), torch.zeros(0, 128, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match=r"int4_linear takes bfloat16 \[1..4, 128\]"):
            cpu.int4_linear(x, w)


@needs_kernel
def test_projections_built_while_turned_off_keep_torchs_kernel():
    with cpu.turned_off():
        assert not cpu.available() and cpu.unavailable_reason() == "turned off by cpu.turned_off()"
        theirs = Int4Linear(_weight(16, 128, 0), None)
        with pytest.raises(SpecsweepError, match=r"int4_linear cannot run here: turned off by cpu\.turned_off"):
            Int4Linear(_weight(16, 128, 0), None, ours=True)
    assert cpu.available() and theirs.kernel_name == "torch"
    assert Int4Linear(_weight(16, 128, 0), None).kernel_name == "int4_linear"
    x = torch.randn(1, 128).to(torch.bfloat16)
    assert theirs(x).shape == (1, 16)                        # still torch's, after the block


@needs_kernel
def test_an_int4_projection_runs_ours_where_it_can_and_torchs_when_asked():
    weight, bias = _weight(100, 256, 3), _weight(1, 100, 4)[0]
    ours, theirs = Int4Linear(weight, bias), Int4Linear(weight, bias, ours=False)
    assert (ours.kernel_name, theirs.kernel_name) == ("int4_linear", "torch")
    x = torch.randn(1, 3, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    # the same quantised weight, two kernels: equal to bfloat16 rounding
    torch.testing.assert_close(ours(x).float(), theirs(x).float(), rtol=2e-2, atol=2e-2)
    assert quant.KERNEL_ROWS <= cpu.MAX_ROWS                 # every call quant.py makes is one the kernel takes


def test_turned_off_the_kernel_is_unavailable_and_int4_runs_torchs(fresh_library):
    fresh_library.setenv("SPECSWEEP_CPU_KERNELS", "0")
    assert not cpu.available() and cpu.unavailable_reason() == "turned off by SPECSWEEP_CPU_KERNELS=0"
    assert Int4Linear(_weight(16, 128, 0), None).kernel_name == "torch"
    with pytest.raises(SpecsweepError, match="int4_linear cannot run here: turned off"):
        Int4Linear(_weight(16, 128, 0), None, ours=True)
    with pytest.raises(RuntimeError, match="int4_linear is unavailable: turned off"):
        cpu.int4_linear(torch.zeros(1, 128, dtype=torch.bfloat16), cpu.pack_int4(*quantize_int4(_weight(4, 128, 0))))


@pytest.mark.skipif(not set(cpu.CPU_FLAGS) <= cpu._cpu_flags(), reason="this CPU lacks AVX-512 BF16")
def test_a_compiler_that_fails_leaves_no_library_and_says_why(fresh_library, tmp_path):
    fresh_library.setenv("SPECSWEEP_CACHE_DIR", str(tmp_path))
    fresh_library.setenv("CXX", "false")                          # runs, prints nothing, exits 1
    assert not cpu.available()
    assert cpu.unavailable_reason().startswith("false failed")
    assert list((tmp_path / "kernels").iterdir()) == []            # no half-written library left for the next process


@needs_kernel
@pytest.mark.parametrize("kernel", ["int4_linear", "bf16_linear", "amx_linear"])
def test_each_kernel_gives_the_same_bits_on_any_number_of_threads(kernel):
    """Each output row is one thread's sum in one order: torch's thread count (passed at each call) changes who
    computes it, not what."""
    if kernel == "amx_linear" and not cpu.amx_available():
        pytest.skip(f"amx_linear: {cpu.amx_unavailable_reason()}")
    if kernel == "int4_linear":
        w, call, rows = cpu.pack_int4(*quantize_int4(_weight(96, 384, 7))), cpu.int4_linear, 2
    elif kernel == "bf16_linear":
        w, call, rows = cpu.pack_bf16(_weight(200, 384, 7)), cpu.bf16_linear, 7
    else:                                             # 200 rows: 13 blocks, three groups of 4 and one alone
        w, call, rows = cpu.pack_bf16(_weight(200, 384, 7)), cpu.amx_linear, 13
    x = torch.randn(rows, 384, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    previous = torch.get_num_threads()
    try:
        outputs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outputs.append(call(x, w))
    finally:
        torch.set_num_threads(previous)
    assert all(torch.equal(outputs[0], y) for y in outputs[1:])


def test_the_python_side_mirrors_the_kernels_limits():
    """cpu.py's MAX_GROUPS, MAX_ROWS and GROUP are what int4_linear.cpp checks and assumes."""
    import re

    source = cpu.SOURCES[0].read_text()
    assert int(re.search(r"MAX_GROUPS = (\d+);", source).group(1)) == cpu.MAX_GROUPS
    assert f"M > {cpu.MAX_ROWS} ||" in source and f"K % {cpu.GROUP} ||" in source
    assert cpu.GROUP == quant.GROUP


def test_the_bf16_layout_puts_each_weight_where_the_kernel_reads_it():
    n, k = 21, 6                                                          # 21 rows: two blocks, the second padded
    weight = torch.arange(n * k, dtype=torch.float32).view(n, k).to(torch.bfloat16)
    w = cpu.pack_bf16(weight)
    assert (w.n, w.k) == (n, k) and w.packed.dtype == torch.bfloat16 and w.packed.shape == (2, 3, 16, 2)
    for j in range(2):
        for p in range(3):
            for lane in range(16):
                for e in range(2):
                    row = 16 * j + lane
                    expected = weight[row, 2 * p + e] if row < n else 0.0
                    assert w.packed[j, p, lane, e] == expected, (j, p, lane, e)
    with pytest.raises(ValueError, match=r"bf16_linear packs a bfloat16 \[N, K\] weight with K even"):
        cpu.pack_bf16(weight[:, :5])


FEW_ROWS = [("bf16_linear", n, k) for n, k in ((5, 2), (16, 48), (100, 256), (2048, 1536), (37, 8960))] + [
    ("amx_linear", n, k) for n, k in ((5, 32), (16, 64), (100, 256), (2048, 1536), (37, 8960), (70, 96))]
"""Each few-row kernel's shapes: N of one block, of several and of blocks left over (amx_linear: of groups of four
blocks and of blocks outside them); K of one pair or tile and of many."""


@pytest.mark.parametrize("kernel,n,k", FEW_ROWS)
def test_each_few_row_kernel_is_the_float32_product_rounded_once(kernel, n, k):
    if not (cpu.amx_available() if kernel == "amx_linear" else cpu.available()):
        pytest.skip(f"{kernel}: {cpu.amx_unavailable_reason() if kernel == 'amx_linear' else cpu.unavailable_reason()}")
    call, most = (cpu.amx_linear, cpu.AMX_ROWS) if kernel == "amx_linear" else (cpu.bf16_linear, cpu.BF16_ROWS)
    weight, bias = _weight(n, k, n + k), _weight(1, n, 2)[0].float()
    w = cpu.pack_bf16(weight)
    x = torch.randn(most, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for m in range(1, most + 1):
        for b in (None, bias):
            y = call(x[:m], w, b)
            assert y.shape == (m, n) and y.dtype == torch.bfloat16
            reference = x[:m].float() @ weight.float().T + (0 if b is None else b)
            # one bfloat16 rounding of a float32 sum: within bfloat16's half ulp of the result, plus the sums' order
            torch.testing.assert_close(y.float(), reference, rtol=2 ** -8, atol=1e-5 * k ** 0.5)
        for i in range(m):                                             # a row is the same alone and among others
            assert torch.equal(y[i], call(x[i: i + 1], w, bias)[0])


@needs_kernel
def test_a_packed_projection_runs_bf16_linear_over_a_few_rows_and_onednns_past_them():
    g = torch.Generator().manual_seed(4)
    ws = [(torch.randn(n, 64, generator=g) * 0.1).to(torch.bfloat16) for n in (37, 8)]
    bs = [(torch.randn(37, generator=g)).to(torch.bfloat16), None]
    with cpu.turned_off(amx_only=True):                   # where the CPU has AMX, amx_linear's test below
        ours = PackedLinear(ws, bs)
    with cpu.turned_off():
        theirs = PackedLinear(ws, bs)
    assert (ours.few_rows_kernel, theirs.few_rows_kernel) == ("bf16_linear", "onednn") and theirs.few is None
    stacked, bias = cpu.pack_bf16(torch.cat(ws)), torch.cat([bs[0], torch.zeros(8, dtype=torch.bfloat16)]).float()
    for rows in (1, 5, cpu.BF16_ROWS, cpu.BF16_ROWS + 1, 40):
        x = torch.randn(1, rows, 64, generator=g).to(torch.bfloat16)
        y = ours(x)
        assert y.shape == (1, rows, 45)
        if rows <= cpu.BF16_ROWS:
            assert torch.equal(y[0], cpu.bf16_linear(x[0], stacked, bias))
        else:
            assert torch.equal(y, theirs(x))                          # past 9 rows: oneDNN's, as before
        torch.testing.assert_close(y.float(), theirs(x).float(), rtol=2 ** -7, atol=1e-2)


def test_turned_off_bf16_linear_is_unavailable_and_packed_projections_run_onednns(fresh_library):
    fresh_library.setenv("SPECSWEEP_CPU_KERNELS", "0")
    with pytest.raises(RuntimeError, match="bf16_linear is unavailable: turned off"):
        cpu.bf16_linear(torch.zeros(1, 32, dtype=torch.bfloat16), cpu.pack_bf16(_weight(4, 32, 0)))
    assert few_rows_kernel(torch.bfloat16) == "onednn" and few_rows_kernel(torch.float32) == "onednn"


def test_the_python_side_mirrors_bf16_linears_limits():
    source = cpu.SOURCES[1].read_text()
    assert f"M > {cpu.BF16_ROWS} ||" in source and "K % 2" in source
    assert f"N padded to a multiple of {cpu.BF16_BLOCK}" in source


@pytest.mark.parametrize("kernel", ["bf16_linear", "amx_linear"])
def test_each_few_row_kernel_refuses_what_it_cannot_take(kernel):
    if not (cpu.amx_available() if kernel == "amx_linear" else cpu.available()):
        pytest.skip(f"{kernel}: {cpu.amx_unavailable_reason() if kernel == 'amx_linear' else cpu.unavailable_reason()}")
    call, most, k = (cpu.amx_linear, cpu.AMX_ROWS, 64) if kernel == "amx_linear" else (cpu.bf16_linear, cpu.BF16_ROWS,
                                                                                        32)
    w = cpu.pack_bf16(_weight(8, k, 0))
    for x in (torch.zeros(most + 1, k, dtype=torch.bfloat16), torch.zeros(1, k + 2, dtype=torch.bfloat16),
              torch.zeros(1, k, dtype=torch.float32), torch.zeros(0, k, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match=rf"{kernel} takes bfloat16 \[1..{most}, {k}\]"):
            call(x, w)
    for bias in (torch.zeros(8, dtype=torch.bfloat16), torch.zeros(9)):
        with pytest.raises(ValueError, match=rf"{kernel} takes a contiguous float32 bias \[8\]"):
            call(torch.zeros(1, k, dtype=torch.bfloat16), w, bias)
    if kernel == "amx_linear":                           # K even, but not of whole tiles
        with pytest.raises(ValueError, match=r"with K a multiple of 32"):
            call(torch.zeros(1, 48, dtype=torch.bfloat16), cpu.pack_bf16(_weight(8, 48, 0)))


@needs_amx
def test_on_an_amx_cpu_a_packed_projection_runs_amx_linear_over_up_to_16_rows():
    """amx_linear over 1-16 rows from the same copy bf16_linear would read, oneDNN's past them; a projection whose K
    is not a multiple of 32 keeps bf16_linear's 9."""
    g = torch.Generator().manual_seed(4)
    ws = [(torch.randn(n, 64, generator=g) * 0.1).to(torch.bfloat16) for n in (37, 8)]
    bs = [(torch.randn(37, generator=g)).to(torch.bfloat16), None]
    ours = PackedLinear(ws, bs)
    with cpu.turned_off():
        theirs = PackedLinear(ws, bs)
    assert (ours.few_rows_kernel, ours.rows) == ("amx_linear", cpu.AMX_ROWS)
    stacked, bias = cpu.pack_bf16(torch.cat(ws)), torch.cat([bs[0], torch.zeros(8, dtype=torch.bfloat16)]).float()
    for rows in (1, 9, cpu.AMX_ROWS, cpu.AMX_ROWS + 1):
        x = torch.randn(1, rows, 64, generator=g).to(torch.bfloat16)
        y = ours(x)
        if rows <= cpu.AMX_ROWS:
            assert torch.equal(y[0], cpu.amx_linear(x[0], stacked, bias))
        else:
            assert torch.equal(y, theirs(x))
    odd = PackedLinear([(torch.randn(16, 48, generator=g)).to(torch.bfloat16)], [None])
    assert (odd.few_rows_kernel, odd.rows) == ("bf16_linear", cpu.BF16_ROWS)
    assert few_rows_kernel(torch.bfloat16, 1536) == "amx_linear" and few_rows_kernel(torch.bfloat16, 48) == \
        "bf16_linear"


def test_turned_off_amx_linear_is_unavailable_and_packed_projections_run_bf16_linear(fresh_library):
    """SPECSWEEP_AMX=0, or cpu.turned_off(amx_only=True), leaves bf16_linear where the other kernels run."""
    with cpu.turned_off(amx_only=True):
        assert not cpu.amx_available()
        assert cpu.amx_unavailable_reason() == "turned off by cpu.turned_off(amx_only=True)" or not cpu.available()
        assert few_rows_kernel(torch.bfloat16, 64) in ("bf16_linear", "onednn")
    fresh_library.setenv("SPECSWEEP_AMX", "0")
    with pytest.raises(RuntimeError, match="amx_linear is unavailable: "):
        cpu.amx_linear(torch.zeros(1, 32, dtype=torch.bfloat16), cpu.pack_bf16(_weight(4, 32, 0)))
    assert not cpu.amx_available()
    assert few_rows_kernel(torch.bfloat16, 64) == ("bf16_linear" if cpu.available() else "onednn")


def test_the_python_side_mirrors_amx_linears_limits():
    source = cpu.AMX_SOURCES[0].read_text()
    assert f"M > {cpu.AMX_ROWS} ||" in source and f"K % {cpu.AMX_K}" in source
    assert "bf16_linear's (kernels/cpu.py packs it)" in source
