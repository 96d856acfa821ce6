// bf16_linear: y = x @ W.T (+ b) for a bfloat16 weight W [N, K] and a few bfloat16 rows x [M, K] (M <= 9), on a CPU
// with AVX-512 BF16: the static forward's projections over the rows of a decode or verify forward
// (pipeline/decoding/static/packed.py calls it through kernels/cpu.py). Products in bfloat16, sums in float32 in one
// fixed order, the bias added in float32, rounded to bfloat16 once.
//
// Why. oneDNN's packed product (what packed.py uses past 9 rows) does not overlap its arithmetic with its stream of
// W: each row past the first adds its own arithmetic time, so the 1.5B target's verify forward over 7 tokens costs
// a quarter or more above a one-token forward. Here each 64-byte load of W feeds M vdpbf16ps, one per row of x, and up
// to about 9 rows the product costs little more than reading W once (docs/benchmarks.md, "A few rows in bfloat16").
// Past 9 rows the broadcasts of x and the products are the bound (fewer blocks of W fit the registers at once), and
// oneDNN's is as fast or faster: packed.py leaves them to it.
//
// Layout (kernels/cpu.py packs it): N padded to a multiple of 16 with zero rows, then
//     packed   uint16 [N / 16][K / 2][16][2]: packed[j][p][l][e] = W[16 j + l, 2 p + e]
// so a block of 16 rows streams its weights in order, and one vdpbf16ps adds x[m, 2p] W[n, 2p] + x[m, 2p+1] W[n, 2p+1]
// into lane n of row m's accumulator. Each y[m, n] is summed in the same order whatever M, the other rows and the
// threads are: a row's result is the same alone or among others (tests/test_cpu_kernels.py holds it).
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

template <int M, int R>
static void block_rows(const uint16_t* x, int64_t K, const uint16_t* packed, const float* bias, int64_t N,
                       uint16_t* y, int64_t j0) {
    const int64_t pairs = K / 2;
    __m512 acc[R][M];
    for (int r = 0; r < R; ++r)
        for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
    const uint16_t* w[R];
    for (int r = 0; r < R; ++r) w[r] = packed + (j0 + r) * pairs * 32;
    const uint32_t* xp = (const uint32_t*)x;  // x[m, 2p .. 2p + 1] as one 32-bit word: xp[m * pairs + p]
    for (int64_t p = 0; p < pairs; ++p) {
        __m512bh wv[R];
        for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_loadu_si512((const void*)(w[r] + p * 32));
        for (int m = 0; m < M; ++m) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xp[m * pairs + p]);
            for (int r = 0; r < R; ++r) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv[r], xv);
        }
    }
    for (int r = 0; r < R; ++r) {
        const int64_t n0 = (j0 + r) * 16;
        const int64_t valid = N - n0 < 16 ? N - n0 : 16;
        const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
        const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
        for (int m = 0; m < M; ++m) {
            const __m256i out = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][m], b));
            _mm256_mask_storeu_epi16((void*)(y + m * N + n0), mask, out);
        }
    }
}

template <int M>
static void rows(const uint16_t* x, int64_t K, const uint16_t* packed, const float* bias, int64_t N, uint16_t* y,
                 int threads) {
    constexpr int R = M <= 6 ? 4 : 3;  // R * M accumulators (at most 27) of the 32 registers
    const int64_t blocks = (N + 15) / 16;
    const int64_t groups = (blocks + R - 1) / R;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t j0 = g * R;
        if (j0 + R <= blocks)
            block_rows<M, R>(x, K, packed, bias, N, y, j0);
        else
            for (int64_t j = j0; j < blocks; ++j) block_rows<M, 1>(x, K, packed, bias, N, y, j);
    }
}

// threads: OpenMP threads for the call (torch's intra-op count: the caller's OpenMP default is not it in every thread).
// x bfloat16 [M, K] contiguous, M in 1 .. 9, K even; bias float [N] or null; y bfloat16 [M, N] contiguous.
// Returns 0, or 1 for arguments out of range (nothing written).
extern "C" int bf16_linear(const uint16_t* x, int64_t M, int64_t K, const uint16_t* packed, const float* bias,
                           int64_t N, uint16_t* y, int threads) {
    if (M < 1 || M > 9 || K < 2 || K % 2 || N < 1 || threads < 1) return 1;
    switch (M) {
#define CASE(m) case m: rows<m>(x, K, packed, bias, N, y, threads); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9)
#undef CASE
    }
    return 0;
}
