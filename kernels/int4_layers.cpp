// int4_layers: a Llama-family model's decoder layers over one token, with int4 projections (int4_linear.cpp), in
// one call: a quantised draft's one-token forward (pipeline/decoding/static/int4_row.py calls it through
// kernels/cpu.py). What each layer computes is llama.py's forward over one token with quant.py's int4 projections:
//     h = rms_norm(x);  q, k, v = split(qkv(h) + b);  q, k = rope(q), rope(k);  cache[pos] = k, v
//     a = softmax(q k^T * scaling) v over positions 0 .. pos;  x = x + o(a) + b
//     h = rms_norm(x);  g, u = split(gate_up(h) + b);  x = x + down(silu(g) * u) + b
// with the same roundings to bfloat16 as torch's operators in llama.py (a product or sum of two bfloat16 tensors is
// computed in float32 and rounded once), except where torch's own order of summation is its own: the mean of x² in
// rms_norm, and attention (here products in bfloat16, sums and softmax in float32, the output rounded once). So the
// draft's logits are llama.py's to bfloat16 rounding, not bit for bit; a draft's proposals only need to be good, the
// target's verify step keeps the output lossless (tests/test_int4_row.py holds the two within tolerance).
//
// Why. A 0.5B draft's one-token forward in Python dispatches about 55 torch operators a layer, 3-5 µs each on this
// project's CPU. Here those operators are a few loops over vectors a few thousand long, and the layers one ctypes
// call: the forward 1.35x faster (docs/benchmarks.md, "Quantised projections", the int4_layers column).
//
// Arguments. x bfloat16 [d], the hidden state, updated in place. ptrs int64 [n_layer][PTRS] and floats float
// [n_layer][3] per layer (int4_row.py builds them once; the order is the enum below). keys, values bfloat16
// [n_layer][kv_heads][capacity][head_dim] (one batch row), written at position pos and read over 0 .. pos. cos, sin
// bfloat16 [head_dim]: position pos's row of llama.py's tables (sin with its first half negated). work: bfloat16
// scratch of d + qkv_n + heads * head_dim + 3 * inter + d elements (qkv_n = (heads + 2 kv_heads) head_dim); scores:
// float scratch [heads][pos + 1].
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

extern "C" int int4_linear(const uint16_t* x, int64_t M, int64_t K, const uint8_t* packed, const float* scales,
                           const float* zeros, int64_t N, uint16_t* y, int threads);

enum { IN_NORM, QKV_W, QKV_S, QKV_Z, QKV_B, O_W, O_S, O_Z, O_B, POST_NORM, GU_W, GU_S, GU_Z, GU_B, DOWN_W, DOWN_S,
       DOWN_Z, DOWN_B, PTRS };
enum { IN_EPS, POST_EPS, SCALING };

static inline float bf(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t to_bf(float f) {  // round to nearest even, as torch's .to(torch.bfloat16)
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline __m512 load16(const uint16_t* p) {  // 16 bfloat16 -> 16 float
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

static inline __m512 exp16(__m512 x) {  // e^x to a few ulp for x <= 0 (softmax's shifted scores), 0 far below
    const __m512 log2e = _mm512_set1_ps(1.4426950408889634f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-100.f));
    const __m512 t = _mm512_mul_ps(x, log2e);
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);  // in [-0.5, 0.5]: 2^f by its Taylor series in f ln 2
    const __m512 y = _mm512_mul_ps(f, _mm512_set1_ps(0.6931471805599453f));
    __m512 p = _mm512_set1_ps(1.f / 5040);
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 720));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

// out = weight * (x * rsqrt(mean(x²) + eps)).to(bfloat16), as llama.py's _rms_norm
static void rms_norm(const uint16_t* x, const uint16_t* weight, float eps, int64_t d, uint16_t* out) {
    float sum = 0.f;
    for (int64_t i = 0; i < d; ++i) sum += bf(x[i]) * bf(x[i]);
    const float inv = 1.f / sqrtf(sum / (float)d + eps);
    for (int64_t i = 0; i < d; ++i) out[i] = to_bf(bf(weight[i]) * bf(to_bf(bf(x[i]) * inv)));
}

static void add_bias(uint16_t* y, const uint16_t* bias, int64_t n) {
    if (bias)
        for (int64_t i = 0; i < n; ++i) y[i] = to_bf(bf(y[i]) + bf(bias[i]));
}

// x * cos + roll(x, D / 2) * sin_signed per head, each product and the sum rounded (llama.py's _rope)
static void rope(const uint16_t* x, int64_t heads, int64_t D, const uint16_t* cos, const uint16_t* sin,
                 uint16_t* out) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; ++h) {
        const uint16_t* xh = x + h * D;
        for (int64_t i = 0; i < D; ++i) {
            const float a = bf(to_bf(bf(xh[i]) * bf(cos[i])));
            const float b = bf(to_bf(bf(xh[(i + half) % D]) * bf(sin[i])));
            out[h * D + i] = to_bf(a + b);
        }
    }
}

// one query head's attention over positions 0 .. end - 1 of its key/value head: out bfloat16 [D]
static void attend(const uint16_t* q, const uint16_t* keys, const uint16_t* values, int64_t end, int64_t D,
                   float scaling, float* scores, uint16_t* out) {
    float top = -INFINITY;
    for (int64_t t = 0; t < end; ++t) {
        const uint16_t* k = keys + t * D;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 32)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + i), (__m512bh)_mm512_loadu_si512(k + i));
        scores[t] = _mm512_reduce_add_ps(acc) * scaling;
        top = scores[t] > top ? scores[t] : top;
    }
    __m512 total = _mm512_setzero_ps();
    int64_t t = 0;
    for (; t + 16 <= end; t += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + t), _mm512_set1_ps(top)));
        _mm512_storeu_ps(scores + t, e);
        total = _mm512_add_ps(total, e);
    }
    float sum = _mm512_reduce_add_ps(total);
    for (; t < end; ++t) sum += (scores[t] = expf(scores[t] - top));
    const float inv = 1.f / sum;
    for (int64_t i = 0; i < D; i += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t s = 0; s < end; ++s)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(scores[s]), load16(values + s * D + i), acc);
        acc = _mm512_mul_ps(acc, _mm512_set1_ps(inv));
        for (int j = 0; j < 16; ++j) out[i + j] = to_bf(acc[j]);
    }
}

static int proj(const int64_t* p, int w, const uint16_t* x, int64_t K, int64_t N, uint16_t* y, int threads) {
    if (int4_linear(x, 1, K, (const uint8_t*)p[w], (const float*)p[w + 1], (const float*)p[w + 2], N, y, threads))
        return 1;
    add_bias(y, (const uint16_t*)p[w + 3], N);
    return 0;
}

// Returns 0, or 1 for arguments out of range (x then holds a partial result; the caller raises).
extern "C" int int4_layers(uint16_t* x, const int64_t* ptrs, const float* floats, int64_t n_layer, int64_t d,
                           int64_t heads, int64_t kv_heads, int64_t D, int64_t inter, uint16_t* keys,
                           uint16_t* values, int64_t capacity, int64_t pos, const uint16_t* cos, const uint16_t* sin,
                           uint16_t* work, float* scores, int threads) {
    if (D % 32 || heads % kv_heads || pos < 0 || pos >= capacity || threads < 1) return 1;
    const int64_t qkv_n = (heads + 2 * kv_heads) * D, rep = heads / kv_heads, end = pos + 1;
    uint16_t* h = work;                      // [d]
    uint16_t* qkv = h + d;                   // [qkv_n]
    uint16_t* a = qkv + qkv_n;               // [heads * D]: the roped queries, then the attention's output
    uint16_t* gu = a + heads * D;            // [2 * inter]
    uint16_t* act = gu + 2 * inter;          // [inter]
    uint16_t* y = act + inter;               // [d]: o's and down's outputs
    for (int64_t l = 0; l < n_layer; ++l) {
        const int64_t* p = ptrs + l * PTRS;
        const float* f = floats + l * 3;
        uint16_t* lk = keys + l * kv_heads * capacity * D;
        uint16_t* lv = values + l * kv_heads * capacity * D;
        rms_norm(x, (const uint16_t*)p[IN_NORM], f[IN_EPS], d, h);
        if (proj(p, QKV_W, h, d, qkv_n, qkv, threads)) return 1;
        rope(qkv, heads, D, cos, sin, a);
        uint16_t knew[kv_heads * D];
        rope(qkv + heads * D, kv_heads, D, cos, sin, knew);
        for (int64_t g = 0; g < kv_heads; ++g) {
            memcpy(lk + (g * capacity + pos) * D, knew + g * D, D * 2);
            memcpy(lv + (g * capacity + pos) * D, qkv + (heads + kv_heads + g) * D, D * 2);
        }
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t j = 0; j < heads; ++j) {
            const int64_t g = j / rep;
            uint16_t qj[D];
            memcpy(qj, a + j * D, D * 2);
            attend(qj, lk + g * capacity * D, lv + g * capacity * D, end, D, f[SCALING], scores + j * end, a + j * D);
        }
        if (proj(p, O_W, a, heads * D, d, y, threads)) return 1;
        for (int64_t i = 0; i < d; ++i) x[i] = to_bf(bf(x[i]) + bf(y[i]));
        rms_norm(x, (const uint16_t*)p[POST_NORM], f[POST_EPS], d, h);
        if (proj(p, GU_W, h, d, 2 * inter, gu, threads)) return 1;
        for (int64_t i = 0; i < inter; ++i) {
            const float g = bf(gu[i]);
            act[i] = to_bf(bf(to_bf(g / (1.f + expf(-g)))) * bf(gu[inter + i]));
        }
        if (proj(p, DOWN_W, act, inter, d, y, threads)) return 1;
        for (int64_t i = 0; i < d; ++i) x[i] = to_bf(bf(x[i]) + bf(y[i]));
    }
    return 0;
}
