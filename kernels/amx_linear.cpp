// amx_linear: y = x @ W.T (+ b) for a bfloat16 weight W [N, K] and a few bfloat16 rows x [M, K] (M <= 16), on a CPU
// with AMX (Intel's tile unit: amx_tile, amx_bf16): the static forward's projections over the rows of a decode or
// verify forward where the CPU has it (pipeline/decoding/static/packed.py calls it through kernels/cpu.py).
// Products in bfloat16, sums in float32 in one fixed order, the bias added in float32, rounded to bfloat16 once.
//
// Why. bf16_linear (AVX-512 BF16) spends one vdpbf16ps per row per 64 bytes of W, so on a CPU whose cores run it at
// a few GHz its arithmetic overtakes the weights' stream past 3-5 rows: on the project's Xeon a 9-row product of the
// 1.5B target's gate and up projections took 3.2x its one-row time, and the target's verify forward over 9 tokens
// 1.7 one-token forwards. One TDPBF16PS multiplies a 16 x 32 block of x by a 32 x 16 block of W (1 KB of weights) in
// the time a core streams about as many bytes, so up to 16 rows the product costs what reading W once costs
// (docs/benchmarks.md, "A few rows on an AMX CPU").
//
// Layout: bf16_linear's (kernels/cpu.py packs it), N padded to a multiple of 16 with zero rows,
//     packed   uint16 [N / 16][K / 2][16][2]: packed[j][p][l][e] = W[16 j + l, 2 p + e]
// which is TDPBF16PS's B operand as it is: the 16 pairs p0 .. p0 + 15 of block j are one 16-row, 64-byte-wide tile
// (1 KB, contiguous). x is the A operand, M rows of 32 bfloat16 per tile; C holds M rows of 16 float32 outputs.
// Each y[m, n] is the sum over the K / 32 tiles, in order, of what TDPBF16PS adds for row m: it reads row m of x and
// nothing of the other rows, so a row's result is the same alone or among others, whatever M and the threads
// (tests/test_cpu_kernels.py holds it), which keeps a verify forward's logits its one-token forwards' bit for bit.
//
// Tiles: C0..C3 (4 blocks of 16 outputs at once), A (the k-th 32 inputs of x), B in 3 rotating tiles. Threads split
// N's blocks; each loads the tile configuration itself (it is per thread) and releases it at the end. Linux gives a
// process the tile registers only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM): amx_linear_init does, once.
#include <errno.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {
constexpr int PF = 4;

constexpr int ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr int XFEATURE_XTILEDATA = 18;

struct TileConfig {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

void configure(int M) {
    TileConfig cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 4; ++t) { cfg.rows[t] = (uint8_t)M; cfg.colsb[t] = 64; }   // C: M x 16 float32
    cfg.rows[4] = (uint8_t)M; cfg.colsb[4] = 64;                                   // A: M x 32 bfloat16
    for (int t = 5; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }           // B: 16 pairs x 16 outputs
    _tile_loadconfig(&cfg);
}

// C tile -> y[:, n0 .. n0 + 16) (+ bias), rounded to bfloat16; columns past N are not written.
void store(const float* c, int M, const float* bias, int64_t N, int64_t n0, uint16_t* y) {
    const int64_t valid = N - n0 < 16 ? N - n0 : 16;
    const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) {
        const __m256i out = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(c + 16 * m), b));
        _mm256_mask_storeu_epi16((void*)(y + m * N + n0), mask, out);
    }
}

// Four blocks j0 .. j0 + 3 of 16 outputs each.
void four_blocks(const uint16_t* x, int M, int64_t K, const uint16_t* packed, const float* bias, int64_t N,
                 uint16_t* y, int64_t j0) {
    const int64_t block = K * 16;   // uint16 per block of 16 rows of W
    const uint16_t* w = packed + j0 * block;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(4, x + k, K * 2);
        const uint16_t* wk = w + k * 16;     // pairs k / 2 .. k / 2 + 15 of block j0: 16 rows of 64 bytes
        for (int r = 0; r < 4; ++r)
            for (int l = 0; l < 16; ++l) _mm_prefetch((const char*)(wk + r * block + PF * 512 + l * 32), _MM_HINT_T0);
        _tile_loadd(5, wk, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, wk + block, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, wk + 2 * block, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, wk + 3 * block, 64);
        _tile_dpbf16ps(3, 4, 5);
    }
    alignas(64) float c[4][16 * 16];
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
    for (int r = 0; r < 4; ++r) store(c[r], M, bias, N, (j0 + r) * 16, y);
}

void one_block(const uint16_t* x, int M, int64_t K, const uint16_t* packed, const float* bias, int64_t N,
               uint16_t* y, int64_t j) {
    const uint16_t* w = packed + j * K * 16;
    _tile_zero(0);
    for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(4, x + k, K * 2);
        _tile_loadd(5, w + k * 16, 64);
        _tile_dpbf16ps(0, 4, 5);
    }
    alignas(64) float c[16 * 16];
    _tile_stored(0, c, 64);
    store(c, M, bias, N, j * 16, y);
}

}  // namespace

// 0 where this process may use the tile registers (asked for once; Linux 5.16+), else the errno of the refusal.
extern "C" int amx_linear_init() {
    static int status = -1;
    if (status < 0) status = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) ? errno : 0;
    return status;
}

// threads: OpenMP threads for the call. x bfloat16 [M, K] contiguous, M in 1 .. 16, K a multiple of 32; bias float
// [N] or null; y bfloat16 [M, N] contiguous. Returns 0, 1 for arguments out of range, 2 without the tile registers
// (nothing written either way).
extern "C" int amx_linear(const uint16_t* x, int64_t M, int64_t K, const uint16_t* packed, const float* bias,
                          int64_t N, uint16_t* y, int threads) {
    if (M < 1 || M > 16 || K < 32 || K % 32 || N < 1 || threads < 1) return 1;
    if (amx_linear_init()) return 2;
    const int64_t blocks = (N + 15) / 16;
    const int64_t groups = (blocks + 3) / 4;
#pragma omp parallel num_threads(threads)
    {
        configure((int)M);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t j0 = g * 4;
            if (j0 + 4 <= blocks)
                four_blocks(x, (int)M, K, packed, bias, N, y, j0);
            else
                for (int64_t j = j0; j < blocks; ++j) one_block(x, (int)M, K, packed, bias, N, y, j);
        }
        _tile_release();
    }
    return 0;
}
