// int4_linear: y = x @ W.T for a group-wise int4 weight W [N, K] and a few bfloat16 rows x [M, K] (M <= 4), on a
// CPU with AVX-512 BF16. A quantised draft's projections (pipeline/decoding/static/quant.py, Int4Linear) call it
// through kernels/cpu.py; what it computes is quant.py's int4 weight, W[n, k] = q[n, k] * s[n, g] + min[n, g] with
// q in 0..15 and g = k / 128, multiplied in float32 (bfloat16 products, float32 sums) and rounded to bfloat16 once.
//
// How. A bfloat16 with the bits 0x4300 | q (q < 128) is exactly 128 + q, so one OR turns a nibble into a bfloat16
// that vdpbf16ps multiplies with x at full rate: per group g, D = sum_k (128 + q_k) x_k, and
//     sum_k W[n, k] x_k = s D + (min - 128 s) X_g,   X_g = sum_{k in g} x_k,
// with zeros = min - 128 s stored by the packer and X_g summed once per call. torch's own int4 kernel widens the
// nibbles to float32 instead and reads the weights at half the memory bandwidth (docs/benchmarks.md).
//
// Layout (kernels/cpu.py packs it): rows in blocks of 4 (N padded to a multiple of 4 with zero rows), then
//     packed   uint8 [N / 4][G][4][64]: the 64 bytes of row n, group g are 32 little-endian 16-bit lanes; lane j
//              holds q[n, g * 128 + t * 32 + j] in bits 4t .. 4t + 3, t = 0 .. 3
//     scales   float [N / 4][G][4]: s;  zeros float [N / 4][G][4]: min - 128 s
// so one block streams its 4 rows' weights in order, and the 4 rows share each load of x.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static const int64_t MAX_GROUPS = 512;  // K <= 65536 (kernels/cpu.py checks)

static inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch's .to(torch.bfloat16)
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline __m512 bf16_to_float(__m256i v) {  // 16 bfloat16 -> 16 float
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

template <int M>
static void int4_linear_rows(const uint16_t* x, int64_t K, const uint8_t* packed, const float* scales,
                             const float* zeros, int64_t N, uint16_t* y, int threads) {
    const int64_t G = K / 128;
    float xsum[M * MAX_GROUPS];
    for (int m = 0; m < M; ++m)
        for (int64_t g = 0; g < G; ++g) {
            const uint16_t* xg = x + m * K + g * 128;
            __m512 s = _mm512_setzero_ps();
            for (int i = 0; i < 128; i += 16) s = _mm512_add_ps(s, bf16_to_float(_mm256_loadu_si256((const __m256i*)(xg + i))));
            xsum[m * G + g] = _mm512_reduce_add_ps(s);
        }
    const __m512i low = _mm512_set1_epi16(0x000F);
    const __m512i exponent = _mm512_set1_epi16(0x4300);
    const int64_t blocks = (N + 3) / 4;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t b = 0; b < blocks; ++b) {
        __m512 acc[4][M];
        float offset[4][M];
        for (int r = 0; r < 4; ++r)
            for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps(), offset[r][m] = 0.f;
        const uint8_t* wb = packed + b * G * 256;
        const float* sb = scales + b * G * 4;
        const float* zb = zeros + b * G * 4;
        for (int64_t g = 0; g < G; ++g) {
            for (int r = 0; r < 4; ++r) {
                const __m512i v = _mm512_loadu_si512((const void*)(wb + (g * 4 + r) * 64));
                const __m512bh w0 = (__m512bh)_mm512_or_si512(_mm512_and_si512(v, low), exponent);
                const __m512bh w1 = (__m512bh)_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), exponent);
                const __m512bh w2 = (__m512bh)_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 8), low), exponent);
                const __m512bh w3 = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(v, 12), exponent);
                const __m512 s = _mm512_set1_ps(sb[g * 4 + r]);
                const float z = zb[g * 4 + r];
                for (int m = 0; m < M; ++m) {
                    const uint16_t* xg = x + m * K + g * 128;
                    __m512 d = _mm512_dpbf16_ps(_mm512_setzero_ps(), w0, (__m512bh)_mm512_loadu_si512(xg));
                    d = _mm512_dpbf16_ps(d, w1, (__m512bh)_mm512_loadu_si512(xg + 32));
                    d = _mm512_dpbf16_ps(d, w2, (__m512bh)_mm512_loadu_si512(xg + 64));
                    d = _mm512_dpbf16_ps(d, w3, (__m512bh)_mm512_loadu_si512(xg + 96));
                    acc[r][m] = _mm512_fmadd_ps(d, s, acc[r][m]);
                    offset[r][m] += z * xsum[m * G + g];
                }
            }
        }
        for (int r = 0; r < 4; ++r) {
            const int64_t n = b * 4 + r;
            if (n >= N) break;
            for (int m = 0; m < M; ++m) y[m * N + n] = float_to_bf16(_mm512_reduce_add_ps(acc[r][m]) + offset[r][m]);
        }
    }
}

// threads: OpenMP threads for the call (torch's intra-op count: the caller's OpenMP default is not it in every thread).
// x bfloat16 [M, K] contiguous, M in 1 .. 4, K a multiple of 128 up to 128 * MAX_GROUPS; y bfloat16 [M, N] contiguous. Returns 0, or 1 for arguments out of range (nothing written).
extern "C" int int4_linear(const uint16_t* x, int64_t M, int64_t K, const uint8_t* packed, const float* scales,
                           const float* zeros, int64_t N, uint16_t* y, int threads) {
    if (M < 1 || M > 4 || K % 128 || K / 128 > MAX_GROUPS || N < 1 || threads < 1) return 1;
    switch (M) {
        case 1: int4_linear_rows<1>(x, K, packed, scales, zeros, N, y, threads); break;
        case 2: int4_linear_rows<2>(x, K, packed, scales, zeros, N, y, threads); break;
        case 3: int4_linear_rows<3>(x, K, packed, scales, zeros, N, y, threads); break;
        default: int4_linear_rows<4>(x, K, packed, scales, zeros, N, y, threads); break;
    }
    return 0;
}
