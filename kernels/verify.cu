// Verify-step kernels for speculative decoding: exact (modified rejection sampling), sigmoid, greedy.
//
// What they compute is defined by pipeline/samplers/torch_ref.py; shapes follow pipeline/samplers/contract.py:
//   draft_tokens  int64 [B, γ]         target logits  T [B, γ+1, V_t]      draft logits  T [B, γ, V_d]
//   u             fp32  [B, γ+1]       (column i < γ: acceptance uniforms, column γ: inverse-CDF draw)
//   lengths       int64 [B] or null    per-row draft lengths (null: γ for every row), see below
//   draft logits may be null: a deterministic draft (V_d = V_t), see below
//   tokens        int64 [B, γ+1]       accepted  int64 [B]      draft_ok / target_ok  bool [B]
// T is float, __half or __nv_bfloat16 (templated; instantiated by name from kernels/loader.py). Logits may have
// any batch / position strides, but unit stride along the vocabulary. All arithmetic is fp32.
//
// The math, for a row that drafted γ tokens (a row with a per-row length g: read g for γ, see below). With
// weights w(z) (exact: softmax(z/T), sigmoid: sigmoid(alpha*z/T + beta)):
//   accept draft token x_i  iff  w_d,i(x_i) > 0  and  u_i * w_d,i(x_i) < w_t,i(x_i)          (no division)
//   n = length of the accepted prefix
//   emitted token ~ norm(max(0, w_t,n - w_d,n))   if n < γ and that residual has mass > TOL * mass(w_t,n)
//                 ~ norm(w_t,n)                    otherwise (bonus token, or residual that is rounding noise)
// The emitted token is drawn by inverse CDF with u_γ, in two levels exactly as contract.sample_from_weights:
// sums over chunks of kChunk = 1024 entries, the chunk k holding u_γ * total, then a scan inside chunk k.
//
// Per-row draft lengths (contract.py, "Per-row draft lengths"): every kernel takes a nullable `lengths`. Row b is
// then verified exactly as if it were alone with γ = g, where g = clamp(lengths[b], 0, γ) (g = γ when `lengths`
// is null), computed once per row by row_length: at most g tokens are accepted (n <= g; the decisions at
// positions >= g are made but never counted), the residual is a candidate only where n < g, a row with n == g
// draws a bonus token from target row g, and the emitted token's uniform is u_g (column g, not γ). Everything
// else (the rows reduced, the finiteness flags over all γ positions, the launch geometry) does not depend on g.
// Greedy: the accepted prefix stops at g too, and the emitted token is the argmax of target row n.
//
// Deterministic drafts (contract.py, "Deterministic drafts"; a null `draft` pointer): the draft's distribution at
// position i is the point mass on x_i, so w_d,i(x_i) = 1 and the residual is w_t,n with x_n removed (w_t,n(x_n) - 1
// <= 0 clamps to 0), which is what one-hot draft logits give, bit for bit, without reading them: exact_partials
// reduces the γ+1 target rows only (grid (S1, γ+1, B)) and accepts x_i iff u_i < p_i(x_i); sample_exact zeroes entry
// x_n of target row n where the residual is a candidate (RowPass.det, RowPass.xr) and reads no draft row; greedy
// skips the draft's NaN/+inf check at the drafted tokens. A token outside [0, V_t) is rejected and flags draft_ok,
// as with logits. sigmoid takes no deterministic draft (the host refuses it at T > 0).
//
// Softmax needs per-row normalisers m = max z/T and S = Σ exp(z/T - m): these are computed in one read of the
// logits with an online (rescaling) max/sum-exp, never materialising probabilities. The residual needs the
// normalisers of rows n of both models *before* it can be summed (max(0, p - q) does not decompose over
// blocks), so exact uses two launches on one stream:
//   exact_partials<T>  grid (S1, 2γ+1, B), (S1, γ+1, B) for a deterministic draft: block (s, r, b) reduces
//                      slice s of row r (γ+1 target rows, then γ draft rows) to (m, S); the last block of batch
//                      row b (atomic counter + __threadfence) combines the S1 partials per row, makes the γ
//                      acceptance decisions and writes n (the accepted prefix within the row's length g), the
//                      accepted tokens, the flags and the normalisers of rows n.
//   exact_sample<T>    grid (S2, B): block (s, b) sums p and max(0, p - q) over its chunks of row n; the last
//                      block of row b chooses the chunk and scans inside it.
// Why not one launch: a single launch would need either a spin barrier between blocks (correct only while
// every block is co-resident, which MPS limits, green contexts or a busy GPU do not guarantee, and a wrong
// guess hangs the GPU) or would leave the residual pass over two full rows to the one last block per batch row
// (one SM reading 2 x V entries: several microseconds at B = 1 with V = 128k, far more than a second launch
// costs). Two launches keep every pass spread over the whole GPU at B = 1 and cost one launch gap; both are
// captured by CUDA graphs.
//   sigmoid_sample<T>  grid (S2, B): sigmoid weights are unnormalised, so every block makes the γ acceptance
//                      decisions itself from the 2γ drafted logits (cheap, identical in every block), then
//                      runs the same chunk pass as exact_sample over row n. One launch.
//   greedy_verify<T>   grid (S1, γ+1, B): block (s, r, b) finds the argmax of slice s of target row r (first
//                      index on ties, as torch.max); the last block of row b combines them. One launch.
//
// Work split: the vocabulary is cut into slices of whole 1024-entry chunks, and the host (loader.py) picks the
// number of slices so that the grid has a few blocks per SM even at B = 1. Every block has kThreads = 256
// threads; each thread loads 16 bytes at a time (4 fp32 or 8 fp16/bf16 entries), always aligned: the few entries
// of a row before its first 16-byte boundary (rows of an odd-V tensor start anywhere) are read one by one
// (vec_head, "peeling"). Entries past a row's end read as -inf (weight 0).
//
// Faults avoided (of the paper's released kernels): shared arrays are fp32/int and sized by compile-time
// bounds (kMaxRows, kMaxChunks, kWarps), never by a half-precision count; reductions are warp shuffles over
// full warps plus a loop over all warps, so no element is dropped whatever the slice length; every
// __syncthreads() is reached by all threads of the block (a block that is not last leaves as a whole); no
// [γ, V] probability, ratio or residual tensor is written: the workspace holds per-slice partials, per-chunk
// sums and per-row decisions only. Arrival counters wrap back to 0 by themselves (atomicInc), so no memset per step.
//
// Matching the torch reference: tempering is z * (1/T) rounded once (__fmul_rn), as torch multiplies; softmax
// entries are expf(x - m) / S, as torch's epilogue; sigmoid is 1 / (1 + expf(-(z * a + b))) with separate
// roundings, as torch's mul, add and sigmoid kernels. Acceptance uses the same comparison. Given the same
// uniforms, decisions can differ from the reference only where u * w_d and w_t are within fp32 rounding of each
// other (the reference's S is summed in another order), and the emitted token only where u_γ * total lies
// within rounding of a CDF step. CuPy compiles with -ftz=true, so weights below FLT_MIN (1.2e-38) count as 0.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace specsweep {

constexpr int kThreads = 256;                  // threads per block, all kernels
constexpr int kMinBlocksPerSM = 4;             // register cap 65536 / (256 * 4) = 64: 1024 threads per SM
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 1024;                   // == contract.CDF_CHUNK
constexpr int kMaxGamma = 16;
constexpr int kMaxRows = 2 * kMaxGamma + 1;    // rows reduced per batch row by exact_partials
constexpr int kMaxChunks = 256;                // V_t <= 262144
constexpr int kUnroll = 4;                     // 16-byte loads in flight per thread in the partial passes
constexpr int kPassUnroll = 2;                 // ... and per row (target, draft) in the chunk pass
constexpr float kResidualZeroTol = 16.0f * 1.1920928955078125e-07f;  // == contract.RESIDUAL_ZERO_TOL
constexpr unsigned kFull = 0xffffffffu;
constexpr int kNoIndex = 0x7fffffff;           // "no index found" in min-reductions over indices
#define SPECSWEEP_INF __int_as_float(0x7f800000)   // NVRTC has no math.h: INFINITY / NAN spelled out
#define SPECSWEEP_NAN __int_as_float(0x7fffffff)

// ---- loads --------------------------------------------------------------------------------------------------

template <typename T> struct Vec;
template <> struct Vec<float> { static constexpr int N = 4; };
template <> struct Vec<__half> { static constexpr int N = 8; };
template <> struct Vec<__nv_bfloat16> { static constexpr int N = 8; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// The two 16-bit values packed in one 32-bit word, low half first.
__device__ __forceinline__ void unpack2(unsigned w, float& lo, float& hi, __half) {
  lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}
__device__ __forceinline__ void unpack2(unsigned w, float& lo, float& hi, __nv_bfloat16) {
  lo = __uint_as_float(w << 16);             // bf16 -> fp32 is a 16-bit shift, exact
  hi = __uint_as_float(w & 0xffff0000u);
}

template <typename T>
__device__ __forceinline__ void unpack16(const uint4& r, float (&v)[Vec<T>::N]) {
  unpack2(r.x, v[0], v[1], T());
  unpack2(r.y, v[2], v[3], T());
  unpack2(r.z, v[4], v[5], T());
  unpack2(r.w, v[6], v[7], T());
}
template <>
__device__ __forceinline__ void unpack16<float>(const uint4& r, float (&v)[4]) {
  v[0] = __uint_as_float(r.x); v[1] = __uint_as_float(r.y);
  v[2] = __uint_as_float(r.z); v[3] = __uint_as_float(r.w);
}

// v[k] = row[i + k] for i + k < len, else fill. `vec`: the row start is 16-byte aligned (and i is a multiple of
// N), so a whole vector in range is read with one 16-byte load.
template <typename T>
__device__ __forceinline__ void load_vec(const T* __restrict__ row, int i, int len, bool vec, float fill,
                                         float (&v)[Vec<T>::N]) {
  constexpr int N = Vec<T>::N;
  if (vec && i + N <= len) {
    unpack16<T>(__ldg(reinterpret_cast<const uint4*>(row + i)), v);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = (i + k < len) ? to_float(row[i + k]) : fill;
  }
}

// Entries of a row before its first 16-byte boundary (0..N-1). From that index on, every N entries are one aligned
// 16-byte load; rows of a tensor whose V is not a multiple of N start at every alignment, so each pass reads
// these few head entries one by one and the rest as vectors ("peeling").
template <typename T>
__device__ __forceinline__ int vec_head(const T* p) {
  return static_cast<int>(((16ull - (reinterpret_cast<unsigned long long>(p) & 15ull)) & 15ull) / sizeof(T));
}

// v[0] = row[i] where i < len, the other entries fill: one entry in the shape of a vector.
template <typename T>
__device__ __forceinline__ void load_one(const T* __restrict__ row, int i, int len, float fill,
                                         float (&v)[Vec<T>::N]) {
#pragma unroll
  for (int k = 0; k < Vec<T>::N; ++k) v[k] = fill;
  if (i < len) v[0] = to_float(row[i]);
}

__device__ __forceinline__ bool nan_or_posinf(float x) { return isnan(x) || x == SPECSWEEP_INF; }

// ---- reductions ---------------------------------------------------------------------------------------------

// Online softmax normaliser: m = max, s = Σ exp(x - m). m == -inf means "no entry yet" (then s == 0).
struct MaxSum {
  float m;
  float s;
};

__device__ __forceinline__ MaxSum ms_merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -SPECSWEEP_INF) return {m, 0.0f};
  const float sa = (a.s == 0.0f) ? 0.0f : a.s * expf(a.m - m);
  const float sb = (b.s == 0.0f) ? 0.0f : b.s * expf(b.m - m);
  return {m, sa + sb};
}

// Adds N logits, scaled by inv_t, to an online max / sum-exp; NaN or +inf sets `bad`.
template <int N>
__device__ __forceinline__ void ms_add(MaxSum& acc, bool& bad, float (&z)[N], float inv_t) {
  float vm = -SPECSWEEP_INF;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    z[k] = __fmul_rn(z[k], inv_t);
    bad |= nan_or_posinf(z[k]);
    vm = fmaxf(vm, z[k]);
  }
  if (vm > acc.m) {
    acc.s = (acc.s == 0.0f) ? 0.0f : acc.s * expf(acc.m - vm);
    acc.m = vm;
  }
  if (acc.m != -SPECSWEEP_INF) {
#pragma unroll
    for (int k = 0; k < N; ++k) acc.s += expf(z[k] - acc.m);
  }
}

__device__ __forceinline__ MaxSum warp_ms(MaxSum v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    MaxSum o = {__shfl_xor_sync(kFull, v.m, off), __shfl_xor_sync(kFull, v.s, off)};
    v = ms_merge(v, o);
  }
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// Minimum (kMax false) or maximum (kMax true) of one int per thread over the block; every thread gets the
// result. Called by all threads.
template <bool kMax>
__device__ __forceinline__ int block_extreme_int(int v, int* sh /* [kWarps] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const int o = __shfl_xor_sync(kFull, v, off);
    v = kMax ? max(v, o) : min(v, o);
  }
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  int r = sh[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) r = kMax ? max(r, sh[w]) : min(r, sh[w]);
  __syncthreads();
  return r;
}

// Inclusive prefix sum of one float per thread over the block (thread order). Called by all threads.
__device__ __forceinline__ float block_inclusive_scan(float v, float* sh /* [kWarps] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float o = __shfl_up_sync(kFull, v, off);
    if (lane >= off) v += o;
  }
  if (lane == 31) sh[warp] = v;
  __syncthreads();
  float before = 0.0f;
  for (int w = 0; w < warp; ++w) before += sh[w];
  __syncthreads();
  return before + v;
}

// Last-block-done: returns true in every thread of the one block of batch row b that arrives last. Writes the
// block made before the call are visible to that block. Called by all threads. The counter counts arrivals with
// atomicInc, which wraps to 0 at the last one: it is back at 0 for the next launch with no store, memset or
// reset launch (so a step captured in a CUDA graph replays with nothing to prepare).
__device__ __forceinline__ bool arrive_last(unsigned* counter, unsigned blocks, int* sh_flag) {
  __threadfence();                     // release this block's global writes
  __syncthreads();
  if (threadIdx.x == 0) *sh_flag = (atomicInc(counter, blocks - 1u) == blocks - 1u) ? 1 : 0;
  __syncthreads();
  const bool last = *sh_flag != 0;
  if (last) __threadfence();           // acquire: order the reads of the other blocks' writes after the atomic
  return last;
}

// Draft length g of batch row b: lengths[b] clamped into [0, γ], or γ where `lengths` is null (every row drafted
// γ). The row is verified as if it were alone with γ = g (see the top of this file). Same value in every thread.
__device__ __forceinline__ int row_length(const long long* __restrict__ lengths, int b, int gamma) {
  if (lengths == nullptr) return gamma;
  const long long g = lengths[b];
  return g <= 0 ? 0 : (g >= gamma ? gamma : static_cast<int>(g));
}

// ---- weights ------------------------------------------------------------------------------------------------

__device__ __forceinline__ float softmax_w(float z, float inv_t, float m, float s) {
  return expf(__fsub_rn(__fmul_rn(z, inv_t), m)) / s;
}

__device__ __forceinline__ float sigmoid_w(float z, float a, float b) {
  const float x = __fadd_rn(__fmul_rn(z, a), b);
  return 1.0f / (1.0f + expf(-x));
}

// ---- inverse-CDF draw over chunk sums (last block of a batch row) -------------------------------------------

struct Shared {
  float red[kWarps];
  int ired[kWarps];
  float cdf[kMaxChunks];
  float csum[kMaxChunks];
  int flag;
  int n;
  float total;
};

// Inverse CDF over non-negative weights, as contract.sample_from_weights: the first index whose cdf exceeds the
// target x *and* whose weight is positive; where rounding leaves none, the last index with positive weight.
// The positive-weight condition is needed because an fp32 scan is not monotone (Kogge-Stone adds in another
// order for each lane, and the in-chunk cdf below is rebuilt by a subtraction): an entry of weight 0 (a -inf
// logit, a masked or top-k-removed token, a chunk with no mass) can get a cdf a little below its predecessor's,
// and counting #(cdf <= x) could then stop on it and emit a token the model gave probability 0.

// Which chunk holds x = u * total; returns k and the mass left inside it. `w` is this thread's chunk weight
// (thread c = chunk c).
__device__ __forceinline__ int choose_chunk(float w, int nc, float u, Shared& sh, float& offset) {
  const int c = threadIdx.x;
  const float cdf = block_inclusive_scan(c < nc ? w : 0.0f, sh.red);
  sh.cdf[c] = cdf;
  sh.csum[c] = w;
  if (c == nc - 1) sh.total = cdf;
  __syncthreads();
  const float x = u * sh.total;
  const bool mass = c < nc && w > 0.0f;
  const int first = block_extreme_int<false>(mass && cdf > x ? c : kNoIndex, sh.ired);
  const int last = block_extreme_int<true>(mass ? c : -1, sh.ired);
  const int k = first != kNoIndex ? first : max(last, 0);
  offset = x - (sh.cdf[k] - sh.csum[k]);
  return k;
}

// Position inside a chunk: thread t holds weights w[0..3] of entries 4t..4t+3; `offset` is the mass to skip.
__device__ __forceinline__ int choose_in_chunk(const float (&w)[4], float offset, Shared& sh) {
  float local[4];
  local[0] = w[0];
  local[1] = local[0] + w[1];
  local[2] = local[1] + w[2];
  local[3] = local[2] + w[3];
  const float incl = block_inclusive_scan(local[3], sh.red);
  const float before = incl - local[3];
  int first = kNoIndex, last = -1;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (w[e] > 0.0f) {
      if (first == kNoIndex && before + local[e] > offset) first = threadIdx.x * 4 + e;
      last = threadIdx.x * 4 + e;
    }
  }
  const int j = block_extreme_int<false>(first, sh.ired);
  const int jl = block_extreme_int<true>(last, sh.ired);
  return j != kNoIndex ? j : max(jl, 0);
}

// ---- the chunk pass shared by exact_sample and sigmoid_sample ----------------------------------------------

// Per-row inputs of the pass over row n, already decided.
struct RowPass {
  const void* trow;       // target row n
  const void* drow;       // draft row min(n, γ-1), or nullptr when γ == 0 or the draft is deterministic
  bool residual;          // n < g (the row's draft length): the residual is a candidate
  bool det;               // a deterministic draft: the residual is target row n with entry xr removed
  long long xr;           // deterministic: x_n, the proposed token the residual removes
  // exact: softmax normalisers of the two rows; sigmoid: unused
  float mt, st, md, sd;
};

struct WeightParams {
  bool sigmoid;
  float inv_t;            // exact: 1/T
  float a, b;             // sigmoid: alpha/T, beta
};

// p and max(0, p - q) of one entry with target logit zt and draft logit zd; q counts only where the residual is a
// candidate and the entry is inside the draft's vocabulary (has_q). is_x: a deterministic draft's removed entry (its
// residual is 0, as max(0, p - 1) is; every other entry keeps p, as max(0, p - 0) does).
__device__ __forceinline__ void entry_weights(float zt, float zd, bool has_q, bool is_x, const RowPass& rp,
                                              const WeightParams& wp, float& sum_p, float& sum_r) {
  const float p = wp.sigmoid ? sigmoid_w(zt, wp.a, wp.b) : softmax_w(zt, wp.inv_t, rp.mt, rp.st);
  float q = 0.0f;
  if (has_q) q = wp.sigmoid ? sigmoid_w(zd, wp.a, wp.b) : softmax_w(zd, wp.inv_t, rp.md, rp.sd);
  sum_p += p;
  sum_r += is_x ? 0.0f : fmaxf(__fsub_rn(p, q), 0.0f);
}

// Sums p and max(0, p - q) over the chunks [c0, c1) of row n and stores them per chunk in csum[c] (float2).
// With `flags`, also reduces the raw logits of the rows for the sigmoid reference's row checks: *bad_t / *bad_d
// get NaN or +inf seen, *any_t / *any_d an entry above -inf seen (per thread).
//
// Work split: a chunk is served by kChunk / N threads (whole warps, so every warp sums entries of one chunk).
// Thread j of a chunk reads the aligned 16-byte vector at chunk start + head + j N (head: the target row's
// entries before a 16-byte boundary, see vec_head) up to the chunk's end, and threads j < head also the single
// entry chunk start + j; the draft row is read at the same entries, as vectors when its head is the same.
// Each loop trip covers kPassUnroll block steps, with their loads in flight before any arithmetic, and ends
// with one pair of barriers.
template <typename T>
__device__ void chunk_pass(const RowPass& rp, const WeightParams& wp, int vt, int vd, bool read_draft, int c0,
                           int c1, float2* __restrict__ csum, bool flags, Shared& sh, bool& bad_t, bool& bad_d,
                           bool& any_t, bool& any_d) {
  constexpr int N = Vec<T>::N;
  constexpr int kThreadsPerChunk = kChunk / N;                 // 256 (fp32) or 128 (16-bit)
  constexpr int kChunksPerStep = kThreads / kThreadsPerChunk;  // 1 or 2
  constexpr int kWarpsPerChunk = kThreadsPerChunk / 32;
  constexpr int kChunksPerTrip = kChunksPerStep * kPassUnroll;
  const T* trow = static_cast<const T*>(rp.trow);
  const T* drow = static_cast<const T*>(rp.drow);
  const int head = vec_head(trow);
  const bool dvec = read_draft && vec_head(drow) == head;
  const int lim = min(c1 * kChunk, vt);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = threadIdx.x / kThreadsPerChunk;              // which chunk of a block step this thread serves
  const int j = threadIdx.x % kThreadsPerChunk;                // and its place in that chunk
  for (int c = c0; c < c1; c += kChunksPerTrip) {              // same trip count in every thread
    float zt[kPassUnroll][N], zd[kPassUnroll][N], ht[kPassUnroll][N], hd[kPassUnroll][N];
#pragma unroll
    for (int q = 0; q < kPassUnroll; ++q) {
      const int cs = (c + q * kChunksPerStep + sub) * kChunk;  // start of this thread's chunk
      const int end = min(cs + kChunk, lim);
      const int dend = min(end, vd);
      load_vec<T>(trow, cs + head + j * N, end, true, -SPECSWEEP_INF, zt[q]);
      load_one<T>(trow, j < head ? cs + j : end, end, -SPECSWEEP_INF, ht[q]);
      if (read_draft) {
        load_vec<T>(drow, cs + head + j * N, dend, dvec, -SPECSWEEP_INF, zd[q]);
        load_one<T>(drow, j < head ? cs + j : dend, dend, -SPECSWEEP_INF, hd[q]);
      } else {
#pragma unroll
        for (int k = 0; k < N; ++k) zd[q][k] = hd[q][k] = -SPECSWEEP_INF;
      }
    }
#pragma unroll
    for (int q = 0; q < kPassUnroll; ++q) {
      const int cs = (c + q * kChunksPerStep + sub) * kChunk;
      const int i = cs + head + j * N;
      if (flags) {                                             // max ignores NaN: NaN is looked for apart
        float mt = ht[q][0], md = hd[q][0];
        bool nan_t = isnan(mt), nan_d = isnan(md);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          mt = fmaxf(mt, zt[q][k]);
          md = fmaxf(md, zd[q][k]);
          nan_t |= isnan(zt[q][k]);
          nan_d |= isnan(zd[q][k]);
        }
        bad_t |= nan_t || mt == SPECSWEEP_INF;
        bad_d |= nan_d || md == SPECSWEEP_INF;
        any_t |= mt > -SPECSWEEP_INF;
        any_d |= md > -SPECSWEEP_INF;
      }
      float sp = 0.0f, sr = 0.0f;
      const bool has_q = rp.residual && !rp.det;               // a draft row to subtract
      const long long xr = rp.residual && rp.det ? rp.xr : -1;  // a deterministic draft's entry to remove
      if (i < lim) {
#pragma unroll
        for (int k = 0; k < N; ++k)
          entry_weights(zt[q][k], zd[q][k], has_q && i + k < vd, i + k == xr, rp, wp, sp, sr);
      }
      if (j < head && cs + j < lim)
        entry_weights(ht[q][0], hd[q][0], has_q && cs + j < vd, cs + j == xr, rp, wp, sp, sr);
      sp = warp_sum(sp);
      sr = warp_sum(sr);
      if (lane == 0) {
        sh.cdf[q * kWarps + warp] = sp;                        // scratch: per-warp sums of this trip
        sh.csum[q * kWarps + warp] = sr;
      }
    }
    __syncthreads();
    if (threadIdx.x < kChunksPerTrip) {                         // thread t sums chunk c + t over its warps
      const int q = threadIdx.x / kChunksPerStep, s = threadIdx.x % kChunksPerStep;
      float tp = 0.0f, tr = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarpsPerChunk; ++w) {
        tp += sh.cdf[q * kWarps + s * kWarpsPerChunk + w];
        tr += sh.csum[q * kWarps + s * kWarpsPerChunk + w];
      }
      if (c + static_cast<int>(threadIdx.x) < c1) csum[c + threadIdx.x] = make_float2(tp, tr);
    }
    __syncthreads();
  }
}

// Weights of the 4 entries 4t..4t+3 of chunk k (thread t), for the in-chunk scan of the last block.
template <typename T>
__device__ __forceinline__ void chunk_weights(const RowPass& rp, const WeightParams& wp, bool use_residual, int k,
                                              int vt, int vd, float (&w)[4]) {
  const T* trow = static_cast<const T*>(rp.trow);
  const T* drow = static_cast<const T*>(rp.drow);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int v = k * kChunk + threadIdx.x * 4 + e;
    float p = 0.0f;
    if (v < vt) {
      const float z = to_float(trow[v]);
      p = wp.sigmoid ? sigmoid_w(z, wp.a, wp.b) : softmax_w(z, wp.inv_t, rp.mt, rp.st);
      if (use_residual && rp.det) {
        if (v == rp.xr) p = 0.0f;                  // a deterministic draft: x_n removed
      } else if (use_residual) {
        float q = 0.0f;
        if (v < vd) {
          const float zd = to_float(drow[v]);
          q = wp.sigmoid ? sigmoid_w(zd, wp.a, wp.b) : softmax_w(zd, wp.inv_t, rp.md, rp.sd);
        }
        p = fmaxf(__fsub_rn(p, q), 0.0f);
      }
    }
    w[e] = p;
  }
}

// The last block of batch row b: residual or target weights, chunk, entry. Returns the token (all threads).
template <typename T>
__device__ int draw_token(const RowPass& rp, const WeightParams& wp, int vt, int vd, int nc,
                          const float2* __restrict__ csum, float u, Shared& sh) {
  float cp = 0.0f, cr = 0.0f;
  if (threadIdx.x < nc) {
    const float2 s = __ldcg(csum + threadIdx.x);   // written by other blocks: read past L1
    cp = s.x;
    cr = s.y;
  }
  // reference: use the residual where a draft token was rejected and its mass is more than rounding noise
  const float tp = block_inclusive_scan(cp, sh.red);
  const float tr = block_inclusive_scan(cr, sh.red);
  if (threadIdx.x == kThreads - 1) {
    sh.cdf[0] = tp;
    sh.cdf[1] = tr;
  }
  __syncthreads();
  const bool use_residual = rp.residual && sh.cdf[1] > kResidualZeroTol * sh.cdf[0];
  __syncthreads();
  float offset;
  const int k = choose_chunk(use_residual ? cr : cp, nc, u, sh, offset);
  float w[4];
  chunk_weights<T>(rp, wp, use_residual, k, vt, vd, w);
  const int j = choose_in_chunk(w, offset, sh);
  return min(k * kChunk + j, vt - 1);
}

// ---- slice reductions of the partial passes (exact_partials, greedy_verify, tree_verify_partials) ---------------

// Online max / sum-exp of x = z * inv_t over entries [start, end) of one row, reduced over the block. Slices start
// at whole chunks, so the row's head (vec_head) is the slice's. Returns (m, S) in thread 0, or (NaN, 0) where an
// entry was NaN or +inf (the other threads get garbage). Called by all threads.
template <typename T>
__device__ float2 slice_maxsum(const T* __restrict__ row, int start, int end, float inv_t, Shared& sh) {
  constexpr int N = Vec<T>::N;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int head = vec_head(row);
  MaxSum acc = {-SPECSWEEP_INF, 0.0f};
  bool bad = false;
  if (threadIdx.x < head) {
    float z[N];
    load_one<T>(row, start + threadIdx.x, end, -SPECSWEEP_INF, z);
    ms_add<N>(acc, bad, z, inv_t);
  }
  for (int i0 = start + head + threadIdx.x * N; i0 < end; i0 += kThreads * N * kUnroll) {
    float z[kUnroll][N];
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) load_vec<T>(row, i0 + q * kThreads * N, end, true, -SPECSWEEP_INF, z[q]);
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) ms_add<N>(acc, bad, z[q], inv_t);
  }
  acc = warp_ms(acc);
  bad = __any_sync(kFull, bad);
  if (lane == 0) {
    sh.cdf[warp] = acc.m;
    sh.csum[warp] = acc.s;
    sh.ired[warp] = bad;
  }
  __syncthreads();
  float2 out = make_float2(0.0f, 0.0f);
  if (threadIdx.x == 0) {
    MaxSum t = {sh.cdf[0], sh.csum[0]};
    bool any_bad = sh.ired[0] != 0;
    for (int w = 1; w < kWarps; ++w) {
      t = ms_merge(t, {sh.cdf[w], sh.csum[w]});
      any_bad |= sh.ired[w] != 0;
    }
    out = any_bad ? make_float2(SPECSWEEP_NAN, 0.0f) : make_float2(t.m, t.s);
  }
  return out;
}

// The `slices` partials of slice_maxsum of one row (part_row[0..slices), written by other blocks), combined by one
// warp: every lane gets (m, S), and `bad` whether a slice had NaN or +inf. Called by all 32 lanes of the warp.
__device__ __forceinline__ MaxSum combine_maxsum(const float2* __restrict__ part_row, int slices, bool& bad) {
  const int lane = threadIdx.x & 31;
  MaxSum t = {-SPECSWEEP_INF, 0.0f};
  bool rbad = false;
  for (int ss = lane; ss < slices; ss += 32) {
    const float2 p = __ldcg(part_row + ss);
    if (isnan(p.x)) rbad = true;
    else t = ms_merge(t, {p.x, p.y});
  }
  bad = __any_sync(kFull, rbad);
  return warp_ms(t);
}

// Argmax pair: larger value wins, the smaller index on ties (torch.max's first maximal index).
__device__ __forceinline__ void arg_merge(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// Argmax of entries [start, end) of one row, reduced over the block: (value, index as float bits) in thread 0,
// value NaN where an entry was NaN (the other threads get garbage). Called by all threads.
template <typename T>
__device__ float2 slice_argmax(const T* __restrict__ row, int start, int end, Shared& sh) {
  constexpr int N = Vec<T>::N;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int head = vec_head(row);
  float best = -SPECSWEEP_INF;
  int besti = kNoIndex;
  bool bad = false;
  // entries past `end` read as -inf with a larger index than any entry in range, so they never win
  if (threadIdx.x < head && start + threadIdx.x < end) {
    const float z = to_float(row[start + threadIdx.x]);
    bad |= isnan(z);
    arg_merge(best, besti, z, start + threadIdx.x);
  }
  for (int i0 = start + head + threadIdx.x * N; i0 < end; i0 += kThreads * N * kUnroll) {
    float z[kUnroll][N];
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) load_vec<T>(row, i0 + q * kThreads * N, end, true, -SPECSWEEP_INF, z[q]);
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        bad |= isnan(z[q][k]);
        arg_merge(best, besti, z[q][k], i0 + q * kThreads * N + k);
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    arg_merge(best, besti, __shfl_xor_sync(kFull, best, off), __shfl_xor_sync(kFull, besti, off));
  bad = __any_sync(kFull, bad);
  if (lane == 0) {
    sh.cdf[warp] = best;
    sh.ired[warp] = besti;
    sh.csum[warp] = bad ? 1.0f : 0.0f;
  }
  __syncthreads();
  float2 out = make_float2(0.0f, 0.0f);
  if (threadIdx.x == 0) {
    float v = sh.cdf[0];
    int vi = sh.ired[0];
    bool any_bad = sh.csum[0] != 0.0f;
    for (int w = 1; w < kWarps; ++w) {
      arg_merge(v, vi, sh.cdf[w], sh.ired[w]);
      any_bad |= sh.csum[w] != 0.0f;
    }
    out = make_float2(any_bad ? SPECSWEEP_NAN : v, __int_as_float(vi));
  }
  return out;
}

// The `slices` partials of slice_argmax of one row, combined by one warp: every lane gets the row's argmax (clamped
// into [0, vt)) and `bad`: a slice had NaN, or the maximum is not finite (the reference's isfinite(max)). Called by
// all 32 lanes of the warp.
__device__ __forceinline__ int combine_argmax(const float2* __restrict__ part_row, int slices, int vt, bool& bad) {
  const int lane = threadIdx.x & 31;
  float v = -SPECSWEEP_INF;
  int vi = kNoIndex;
  bool rbad = false;
  for (int ss = lane; ss < slices; ss += 32) {
    const float2 p = __ldcg(part_row + ss);
    if (isnan(p.x)) rbad = true;
    else arg_merge(v, vi, p.x, __float_as_int(p.y));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    arg_merge(v, vi, __shfl_xor_sync(kFull, v, off), __shfl_xor_sync(kFull, vi, off));
  bad = __any_sync(kFull, rbad) || !isfinite(v);
  return min(vi, vt - 1);
}

// ---- exact: pass 1 --------------------------------------------------------------------------------------------

// Workspace of one batch row b (float/int arrays allocated by loader.py):
//   part    float2 [B, 2γ+1, S1]  (m, S) per row slice; m = NaN marks a slice with NaN or +inf
//   dec     float4 [B]             (m_t, S_t, m_d, S_d) of target row n and draft row min(n, γ-1)
//   nacc    int    [B]             n
//   csum    float2 [B, kMaxChunks] per-chunk (Σ p, Σ max(0, p - q)) of row n
//   count   unsigned [B]           arrival counters, shared by the two passes (one after the other on a
//                                  stream); atomicInc wraps each back to 0 at its last arrival
template <typename T>
__device__ void exact_partials_impl(const long long* __restrict__ tokens, const long long* __restrict__ lengths,
                                    const T* __restrict__ target, const T* __restrict__ draft,
                                    const float* __restrict__ u, int gamma, int vt, int vd, long long tsb,
                                    long long tsr, long long dsb, long long dsr, float inv_t, int slice,
                                    float2* __restrict__ part, float4* __restrict__ dec, int* __restrict__ nacc,
                                    unsigned* __restrict__ count, long long* __restrict__ out_tokens, long long out_ld,
                                    long long* __restrict__ out_accepted, long long acc_stride,
                                    bool* __restrict__ draft_ok, bool* __restrict__ target_ok) {
  __shared__ Shared sh;
  __shared__ float sh_m[kMaxRows], sh_s[kMaxRows];
  __shared__ int sh_bad[kMaxRows], sh_acc[kMaxGamma], sh_tok_bad;
  const int s = blockIdx.x, r = blockIdx.y, b = blockIdx.z;
  const bool det = draft == nullptr;           // a deterministic draft: the γ+1 target rows only
  const int rows = det ? gamma + 1 : 2 * gamma + 1, slices = gridDim.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // 1) this block's slice of row r: online max / sum-exp of x = z / T, NaN / +inf seen
  const bool is_target = r <= gamma;
  const T* row = is_target ? target + b * tsb + r * tsr : draft + b * dsb + (r - gamma - 1) * dsr;
  const int len = is_target ? vt : vd;
  const int start = s * slice, end = min(start + slice, len);
  const float2 partial = slice_maxsum<T>(row, start, end, inv_t, sh);
  if (threadIdx.x == 0) part[(static_cast<long long>(b) * rows + r) * slices + s] = partial;
  if (!arrive_last(count + b, static_cast<unsigned>(slices * rows), &sh.flag)) return;

  // 2) last block of batch row b: combine the slices of every row (one warp per row)
  for (int rr = warp; rr < rows; rr += kWarps) {
    bool rbad;
    const MaxSum t = combine_maxsum(part + (static_cast<long long>(b) * rows + rr) * slices, slices, rbad);
    if (lane == 0) {
      sh_m[rr] = t.m;
      sh_s[rr] = t.s;
      sh_bad[rr] = rbad || t.m == -SPECSWEEP_INF;   // NaN/+inf, or a row of only -inf: softmax is NaN there
    }
  }
  if (threadIdx.x == 0) sh_tok_bad = 0;
  __syncthreads();

  // 3) acceptance decisions, one thread per drafted position (all γ: the draft flag covers every position; only the
  //    first g count)
  const int g = row_length(lengths, b, gamma);
  const int i = threadIdx.x;
  long long x = -1;
  if (i < gamma) {
    x = tokens[static_cast<long long>(b) * gamma + i];
    const bool in_range = x >= 0 && x < vd;
    bool accept = false;
    if (in_range) {
      const float p = softmax_w(to_float(target[b * tsb + i * tsr + x]), inv_t, sh_m[i], sh_s[i]);
      const float q = det ? 1.0f   // the point mass on x: q(x) = 1
                          : softmax_w(to_float(draft[b * dsb + i * dsr + x]), inv_t, sh_m[gamma + 1 + i],
                                      sh_s[gamma + 1 + i]);
      accept = q > 0.0f && u[static_cast<long long>(b) * (gamma + 1) + i] * q < p;
    } else {
      atomicOr(&sh_tok_bad, 1);               // a token the draft cannot have proposed: reject, flag the draft
    }
    sh_acc[i] = accept;
  }
  __syncthreads();
  int n = 0;
  while (n < g && sh_acc[n]) ++n;              // same loop in every thread: n is uniform; never past the length g

  if (i <= gamma) out_tokens[b * out_ld + i] = (i < n) ? x : -1;   // position n is written by exact_sample
  if (i == 0) {
    bool dok = sh_tok_bad == 0, tok = true;
    for (int rr = 0; rr <= gamma; ++rr) tok &= !sh_bad[rr];
    for (int rr = gamma + 1; rr < rows; ++rr) dok &= !sh_bad[rr];
    out_accepted[b * acc_stride] = n;
    draft_ok[b] = dok;
    target_ok[b] = tok;
    nacc[b] = n;
    const int nd = gamma > 0 ? min(n, gamma - 1) : 0;
    const bool has_draft_row = gamma > 0 && !det;
    dec[b] = make_float4(sh_m[n], sh_s[n], has_draft_row ? sh_m[gamma + 1 + nd] : 0.0f,
                         has_draft_row ? sh_s[gamma + 1 + nd] : 1.0f);
  }
}

// ---- exact: pass 2, and sigmoid -------------------------------------------------------------------------------

template <typename T, bool kSigmoid>
__device__ void sample_impl(const long long* __restrict__ tokens, const long long* __restrict__ lengths,
                            const T* __restrict__ target, const T* __restrict__ draft, const float* __restrict__ u,
                            int gamma, int vt, int vd, long long tsb, long long tsr, long long dsb, long long dsr,
                            float inv_t, float a, float beta, int chunks_per_block, const float4* __restrict__ dec,
                            const int* __restrict__ nacc, float2* __restrict__ csum_all,
                            unsigned* __restrict__ count, unsigned* __restrict__ flag_words,
                            long long* __restrict__ out_tokens, long long out_ld,
                            long long* __restrict__ out_accepted, long long acc_stride, bool* __restrict__ draft_ok,
                            bool* __restrict__ target_ok) {
  __shared__ Shared sh;
  __shared__ int sh_acc[kMaxGamma], sh_point_bad_t, sh_point_bad_d;
  const int s = blockIdx.x, b = blockIdx.y;
  const int nc = (vt + kChunk - 1) / kChunk;
  const long long ub = static_cast<long long>(b) * (gamma + 1);
  const int g = row_length(lengths, b, gamma);   // the row's draft length

  // 1) n: read from pass 1 (exact) or decided here from the 2γ drafted logits (sigmoid, identical in all blocks)
  int n;
  RowPass rp;
  WeightParams wp;
  wp.sigmoid = kSigmoid;
  wp.inv_t = inv_t;
  wp.a = a;
  wp.b = beta;
  long long x = -1;
  if (kSigmoid) {
    if (threadIdx.x == 0) {
      sh_point_bad_t = 0;
      sh_point_bad_d = 0;
    }
    __syncthreads();
    const int i = threadIdx.x;
    if (i < gamma) {
      x = tokens[static_cast<long long>(b) * gamma + i];
      bool accept = false;
      if (x >= 0 && x < vd) {
        const float zt = to_float(target[b * tsb + i * tsr + x]);
        const float zd = to_float(draft[b * dsb + i * dsr + x]);
        if (nan_or_posinf(zt)) atomicOr(&sh_point_bad_t, 1);
        if (nan_or_posinf(zd)) atomicOr(&sh_point_bad_d, 1);
        const float wt = sigmoid_w(zt, a, beta), wd = sigmoid_w(zd, a, beta);
        accept = wd > 0.0f && u[ub + i] * wd < wt;
      } else {
        atomicOr(&sh_point_bad_d, 1);
      }
      sh_acc[i] = accept;
    }
    __syncthreads();
    n = 0;
    while (n < g && sh_acc[n]) ++n;
  } else {
    n = nacc[b];
    const float4 d = dec[b];
    rp.mt = d.x;
    rp.st = d.y;
    rp.md = d.z;
    rp.sd = d.w;
  }
  const int nd = gamma > 0 ? min(n, gamma - 1) : 0;
  rp.det = !kSigmoid && draft == nullptr;         // a deterministic draft (exact only): remove x_n, read no draft row
  rp.trow = target + b * tsb + n * tsr;
  rp.drow = gamma > 0 && !rp.det ? static_cast<const void*>(draft + b * dsb + nd * dsr) : nullptr;
  rp.xr = rp.det && gamma > 0 ? tokens[static_cast<long long>(b) * gamma + nd] : -1;
  rp.residual = n < g;                            // n == g: the whole draft was accepted, a bonus token from row g
  // sigmoid reads draft row min(n, γ-1) even when n == g: the reference checks that row's maximum
  const bool read_draft = gamma > 0 && !rp.det && (rp.residual || kSigmoid);

  // 2) this block's chunks of row n
  float2* csum = csum_all + static_cast<long long>(b) * kMaxChunks;
  const int c0 = s * chunks_per_block, c1 = min(c0 + chunks_per_block, nc);
  bool bad_t = false, bad_d = false, any_t = false, any_d = false;
  chunk_pass<T>(rp, wp, vt, vd, read_draft, c0, c1, csum, kSigmoid, sh, bad_t, bad_d, any_t, any_d);
  if (kSigmoid) {
    // bit 0: NaN/+inf in target row, bit 1: same in draft row, bit 2/3: an entry above -inf in target/draft
    const unsigned bits = (__syncthreads_or(bad_t) ? 1u : 0u) | (__syncthreads_or(bad_d) ? 2u : 0u) |
                          (__syncthreads_or(any_t) ? 4u : 0u) | (__syncthreads_or(any_d) ? 8u : 0u);
    if (threadIdx.x == 0 && bits) atomicOr(flag_words + b, bits);
  }
  if (!arrive_last(count + b, gridDim.x, &sh.flag)) return;

  // 3) last block: the emitted token, drawn with u_g (and, for sigmoid, everything else of this batch row)
  const int token = draw_token<T>(rp, wp, vt, vd, nc, csum, u[ub + g], sh);
  if (kSigmoid) {
    const int i = threadIdx.x;
    if (i <= gamma) out_tokens[b * out_ld + i] = (i < n) ? x : (i == n ? token : -1);
    if (i == 0) {
      const unsigned bits = atomicExch(flag_words + b, 0u);
      const bool row_d_ok = gamma == 0 || (!(bits & 2u) && (bits & 8u));
      out_accepted[b * acc_stride] = n;
      target_ok[b] = !sh_point_bad_t && !(bits & 1u) && (bits & 4u);
      draft_ok[b] = !sh_point_bad_d && row_d_ok;
    }
  } else if (threadIdx.x == 0) {
    out_tokens[b * out_ld + n] = token;
  }
}

// ---- greedy --------------------------------------------------------------------------------------------------

template <typename T>
__device__ void greedy_impl(const long long* __restrict__ tokens, const long long* __restrict__ lengths,
                            const T* __restrict__ target, const T* __restrict__ draft, int gamma, int vt, int vd,
                            long long tsb, long long tsr, long long dsb, long long dsr, int slice,
                            float2* __restrict__ part, unsigned* __restrict__ count,
                            long long* __restrict__ out_tokens, long long out_ld, long long* __restrict__ out_accepted,
                            long long acc_stride, bool* __restrict__ draft_ok, bool* __restrict__ target_ok) {
  __shared__ Shared sh;
  __shared__ int sh_arg[kMaxGamma + 1], sh_bad[kMaxGamma + 1], sh_acc[kMaxGamma], sh_dbad;
  const int s = blockIdx.x, r = blockIdx.y, b = blockIdx.z;
  const int rows = gamma + 1, slices = gridDim.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  const float2 partial = slice_argmax<T>(target + b * tsb + r * tsr, s * slice, min(s * slice + slice, vt), sh);
  if (threadIdx.x == 0) part[(static_cast<long long>(b) * rows + r) * slices + s] = partial;
  if (!arrive_last(count + b, static_cast<unsigned>(slices * rows), &sh.flag)) return;

  for (int rr = warp; rr < rows; rr += kWarps) {
    bool rbad;
    const int arg = combine_argmax(part + (static_cast<long long>(b) * rows + rr) * slices, slices, vt, rbad);
    if (lane == 0) {
      sh_arg[rr] = arg;
      sh_bad[rr] = rbad;                      // reference: isfinite(target max)
    }
  }
  if (threadIdx.x == 0) sh_dbad = 0;
  __syncthreads();
  const int i = threadIdx.x;
  long long x = -1;
  if (i < gamma) {
    x = tokens[static_cast<long long>(b) * gamma + i];
    if (x >= 0 && x < vd) {   // a deterministic draft (null draft) has no logits to check
      if (draft != nullptr && nan_or_posinf(to_float(draft[b * dsb + i * dsr + x]))) atomicOr(&sh_dbad, 1);
    } else {
      atomicOr(&sh_dbad, 1);
    }
    sh_acc[i] = (x == sh_arg[i]);
  }
  __syncthreads();
  const int g = row_length(lengths, b, gamma);
  int n = 0;
  while (n < g && sh_acc[n]) ++n;              // the accepted prefix stops at the row's draft length
  if (i <= gamma) out_tokens[b * out_ld + i] = (i < n) ? x : (i == n ? sh_arg[n] : -1);
  if (i == 0) {
    bool tok = true;
    for (int rr = 0; rr < rows; ++rr) tok &= !sh_bad[rr];
    out_accepted[b * acc_stride] = n;
    draft_ok[b] = sh_dbad == 0;
    target_ok[b] = tok;
  }
}

// ---- tree_verify: exact verification of a token tree ------------------------------------------------------------
//
// What it computes is defined by pipeline/samplers/tree.py (the torch reference; docs/trees.md): recursive rejection
// sampling down a token tree of N nodes, its shape the same for every row of the step, given as `tree` int32
// [2, N+1]: per position (0: the root, n + 1: node n) the node index of its first child, then its child count
// (children are contiguous, breadth-first: pipeline/tree_shape.py). Shapes:
//   draft_tokens  int64 [B, N]      target logits  T [B, N+1, V_t]      draft logits  T [B, N, V_d] or null
//   u             fp32  [B, N+1]    (column n tests node n, column N draws the emitted token)
//   real          bool  [B, N] or null (row stride real_ld; null: every node is real): the nodes each row proposed
//   tokens        int64 [B, D+1]    accepted int64 [B]    path int64 [B, D] (node indices, -1 after accepted)
// Node n's draft row is the distribution its parent's children were drawn from. At a node with target distribution
// p (softmax of its target row) its children c_0, c_1, ... (tokens x_j) are tried in order; child j is accepted iff
// q_j(x_j) > 0 and u_{c_j} q_j(x_j) < p_j(x_j), where
//   p_0 = p,   p_{j+1} = norm(max(0, p_j - q_j))   (p_j where that residual's mass is <= kResidualZeroTol)
//   with replacement:     q_j = softmax of node c_j's draft row
//   without replacement:  q_0 = softmax of node c_0's draft row, q_{j+1} = norm(q_j with x_j removed) (all zeros where
//                         that mass is <= kResidualZeroTol)
//   deterministic (null draft): q_j is the point mass on x_j, and p_{j+1} is p_j with x_j removed, renormalised
// An accepted child is the next node (its own target row); a node whose children are all rejected emits a token
// drawn from its last residual, a leaf from its target row, by inverse CDF with u_N exactly as draw_token. At T = 0
// (`greedy`) the walk follows the first child equal to the target's argmax and emits the argmax where none is.
// A node that is not real (padding: a drafter without a model proposed a smaller tree in that row) is never tested,
// at any temperature: it is neither accepted nor taken out of p or q, so the j above count the real children only
// (child j's draft row is the j-th real child's) and a node whose children are all padding emits from p itself; each
// row is verified as its own smaller tree would be.
//
// Two launches on one stream:
//   tree_verify_partials<T>  grid (S1, rows, B), rows = N+1 target rows, then the N draft rows (stochastic with
//                            draft logits): block (s, r, b) reduces slice s of row r to (m, S), or to its argmax
//                            at T = 0, in `part` float2 [B, rows, S1] (as exact_partials and greedy_verify).
//   tree_verify<T>           grid (1, B): one block per batch row combines the partials (flags, normalisers),
//                            then walks the tree. Each rejection needs the residual's mass, so the block makes one
//                            pass over the vocabulary per rejected child, evaluating p_j and q_j entry by entry
//                            from the logits and the scalars of the rejections before it (nothing of size V is
//                            written), and one pass of chunk sums for the draw.
// Flags as the chain kernels set them: target_ok False where a target row has NaN/+inf or only -inf (at T = 0: a
// non-finite maximum), draft_ok False where a draft row does (at T = 0: a NaN/+inf draft logit at a drafted token)
// or a drafted token is outside [0, V_d) (rejected; the reference has no such token).

constexpr int kMaxTreeNodes = 256;                  // == tree_shape.MAX_TREE_NODES
constexpr int kMaxTreeRows = 2 * kMaxTreeNodes + 1;

// A batch row's inputs for the walk (the target row of the node being verified is set per node).
template <typename T>
struct TreeRow {
  const T* trow;          // target row of the current node
  const T* draft;         // draft + b * dsb; null: deterministic children
  long long dsr;
  int n, vt, vd;
  float inv_t;
  bool replacement;
};

// Shared state of one batch row's walk.
struct TreeWalk {
  float m[kMaxTreeRows];          // softmax normalisers of the rows (target 0..N, draft N+1..2N)
  float s[kMaxTreeRows];
  int arg[kMaxTreeNodes + 1];     // T = 0: argmax of each target row
  int bad[kMaxTreeRows];
  float chunk[kMaxChunks];        // chunk sums of the emitted token's weights
  // the node being verified: its target row's normalisers, its first child, and per tested (real) child j its node
  // index and token, the residual's mass and (without replacement) the mass of q left after removing x_j
  float mt, st;
  int first;
  int node[kMaxTreeNodes];
  long long x[kMaxTreeNodes];
  float mass[kMaxTreeNodes];
  float qmass[kMaxTreeNodes];
  int tok_bad;
};

// Sum of one float per thread over the block; every thread gets it. Called by all threads.
__device__ __forceinline__ float block_sum(float v, float* sh /* [kWarps] */) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = sh[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) t += sh[w];
  __syncthreads();
  return t;
}

// Whether a row proposed node n (real: that row's flags [N], or null: every node).
__device__ __forceinline__ bool is_real(const bool* __restrict__ real, int n) { return real == nullptr || real[n]; }

// q_j(v) of a stochastic child drawn from node `node`'s draft row: its softmax, 0 past V_d.
template <typename T>
__device__ __forceinline__ float draft_w(const TreeRow<T>& r, const TreeWalk& w, int node, int v) {
  if (v >= r.vd) return 0.0f;
  return softmax_w(to_float(r.draft[node * r.dsr + v]), r.inv_t, w.m[r.n + 1 + node], w.s[r.n + 1 + node]);
}

// p_k(v): the current node's target distribution at entry v after its first k children were rejected, evaluated
// as the reference computes it (the same fp32 operations in the same order; only the masses are summed in another
// order). j counts the tested (real) children of the node. With `q`, also *q = q_k(v), the distribution the k-th
// tested child is tested against (node[k] and x[k] set).
template <typename T>
__device__ float tree_weight(const TreeRow<T>& r, const TreeWalk& w, int k, int v, float* q) {
  float p = softmax_w(to_float(r.trow[v]), r.inv_t, w.mt, w.st);
  const bool det = r.draft == nullptr, without = !det && !r.replacement;
  float qw = without && (k > 0 || q != nullptr) ? draft_w<T>(r, w, w.first, v) : 0.0f;   // q_j(v), running
  const int last = q != nullptr ? k : k - 1;
  for (int j = 0; j <= last; ++j) {
    const float qj = det ? (v == w.x[j] ? 1.0f : 0.0f) : (without ? qw : draft_w<T>(r, w, w.node[j], v));
    if (j == k) {
      *q = qj;
      break;
    }
    const float mj = w.mass[j];
    if (mj > kResidualZeroTol) p = (det ? (v == w.x[j] ? 0.0f : p) : fmaxf(__fsub_rn(p, qj), 0.0f)) / mj;
    if (without) qw = w.qmass[j] > kResidualZeroTol ? (v == w.x[j] ? 0.0f : qw / w.qmass[j]) : 0.0f;
  }
  return p;
}

// The walk at T > 0: returns the emitted token (all threads); writes the accepted nodes to path[0..] (thread 0)
// and their count to *accepted. real: the row's flags [N] or null (every node real).
template <typename T>
__device__ int tree_walk(TreeRow<T>& r, TreeWalk& w, const int* __restrict__ tree, const long long* __restrict__ tok,
                         const bool* __restrict__ real, const float* __restrict__ u, const T* __restrict__ trow_b,
                         long long tsr, long long* __restrict__ path, int& accepted, Shared& sh) {
  const bool det = r.draft == nullptr, without = !det && !r.replacement;
  int pos = 0, k = 0;
  accepted = 0;
  while (true) {                                   // one trip per node on the path: the same in every thread
    r.trow = trow_b + pos * tsr;
    const int first = tree[pos], count = tree[r.n + 1 + pos];
    if (threadIdx.x == 0) {
      w.mt = w.m[pos];
      w.st = w.s[pos];
      w.first = first;
    }
    __syncthreads();
    int chosen = -1;
    k = 0;                                         // children tested so far (the real ones)
    for (int i = 0; i < count; ++i) {
      const int child = first + i;
      if (!is_real(real, child)) continue;         // padding: never tested (the same in every thread)
      // thread 0 tests the child against (p_k, q_k); the block learns the decision at the barrier
      bool accept = false;
      if (threadIdx.x == 0) {
        const long long x = tok[child];
        w.x[k] = x;
        w.node[k] = child;
        if (x >= 0 && x < r.vd) {
          float q;
          const float p = tree_weight<T>(r, w, k, static_cast<int>(x), &q);
          accept = q > 0.0f && u[child] * q < p;
        }
      }
      if (__syncthreads_or(accept)) {
        chosen = child;
        break;
      }
      // child k rejected: the mass of max(0, p_k - q_k) (and, without replacement, of q_k without x_k)
      float sr = 0.0f, sq = 0.0f;
      const long long xk = w.x[k];
      for (int v = threadIdx.x; v < r.vt; v += kThreads) {
        float q;
        const float p = tree_weight<T>(r, w, k, v, &q);
        sr += det ? (v == xk ? 0.0f : p) : fmaxf(__fsub_rn(p, q), 0.0f);
        if (without && v != xk) sq += q;
      }
      sr = block_sum(sr, sh.red);
      sq = block_sum(sq, sh.red);
      if (threadIdx.x == 0) {
        w.mass[k] = sr;
        w.qmass[k] = sq;
      }
      __syncthreads();
      ++k;
    }
    if (chosen < 0) break;                          // every real child rejected, or none: emit from p_k
    if (threadIdx.x == 0) path[accepted] = chosen;
    ++accepted;
    pos = chosen + 1;
  }
  // the emitted token: chunk sums of p_k (a warp per chunk), then the chunk and the entry, as draw_token
  const int nc = (r.vt + kChunk - 1) / kChunk;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int c = warp; c < nc; c += kWarps) {
    float sum = 0.0f;
    for (int v = c * kChunk + lane; v < min((c + 1) * kChunk, r.vt); v += 32) sum += tree_weight<T>(r, w, k, v, nullptr);
    sum = warp_sum(sum);
    if (lane == 0) w.chunk[c] = sum;
  }
  __syncthreads();
  float offset;
  const int kc = choose_chunk(threadIdx.x < nc ? w.chunk[threadIdx.x] : 0.0f, nc, u[r.n], sh, offset);
  float wt[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int v = kc * kChunk + threadIdx.x * 4 + e;
    wt[e] = v < r.vt ? tree_weight<T>(r, w, k, v, nullptr) : 0.0f;
  }
  const int j = choose_in_chunk(wt, offset, sh);
  return min(kc * kChunk + j, r.vt - 1);
}

// Workspace: part float2 [B, rows, S1] (slice partials, as exact_partials / greedy_verify write them).
template <typename T>
__device__ void tree_verify_partials_impl(const T* __restrict__ target, const T* __restrict__ draft, int n_nodes,
                                          int vt, int vd, long long tsb, long long tsr, long long dsb, long long dsr,
                                          float inv_t, int greedy, int slice, float2* __restrict__ part) {
  __shared__ Shared sh;
  const int s = blockIdx.x, r = blockIdx.y, b = blockIdx.z;
  const int rows = gridDim.y, slices = gridDim.x;
  const bool is_target = r <= n_nodes;
  const T* row = is_target ? target + b * tsb + r * tsr : draft + b * dsb + (r - n_nodes - 1) * dsr;
  const int start = s * slice, end = min(start + slice, is_target ? vt : vd);
  const float2 partial = greedy ? slice_argmax<T>(row, start, end, sh) : slice_maxsum<T>(row, start, end, inv_t, sh);
  if (threadIdx.x == 0) part[(static_cast<long long>(b) * rows + r) * slices + s] = partial;
}

template <typename T>
__device__ void tree_verify_impl(const long long* __restrict__ tokens, const int* __restrict__ tree,
                                 const T* __restrict__ target, const T* __restrict__ draft, const float* __restrict__ u,
                                 const bool* __restrict__ real, long long real_ld, int n_nodes, int depth, int vt,
                                 int vd, long long tsb, long long tsr, long long dsb, long long dsr, float inv_t,
                                 int greedy, int replacement, int slices,
                                 const float2* __restrict__ part, long long* __restrict__ out_tokens, long long out_ld,
                                 long long* __restrict__ out_accepted, long long acc_stride,
                                 long long* __restrict__ out_path, long long path_ld, bool* __restrict__ draft_ok,
                                 bool* __restrict__ target_ok) {
  __shared__ Shared sh;
  __shared__ TreeWalk w;
  const int b = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool det = draft == nullptr;
  const int rows = n_nodes + 1 + (greedy || det ? 0 : n_nodes);
  const long long* tok = tokens + static_cast<long long>(b) * n_nodes;
  const bool* rrow = real == nullptr ? nullptr : real + b * real_ld;
  long long* path = out_path + b * path_ld;

  // 1) combine the slice partials of every row (one warp per row): normalisers or argmax, and the flags
  for (int rr = warp; rr < rows; rr += kWarps) {
    bool rbad;
    const float2* prow = part + (static_cast<long long>(b) * rows + rr) * slices;
    if (greedy) {
      const int arg = combine_argmax(prow, slices, vt, rbad);
      if (lane == 0) w.arg[rr] = arg;
    } else {
      const MaxSum t = combine_maxsum(prow, slices, rbad);
      rbad |= t.m == -SPECSWEEP_INF;               // a row of only -inf: softmax is NaN there
      if (lane == 0) {
        w.m[rr] = t.m;
        w.s[rr] = t.s;
      }
    }
    if (lane == 0) w.bad[rr] = rbad;
  }
  if (threadIdx.x == 0) w.tok_bad = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n_nodes; i += kThreads) {
    const long long x = tok[i];
    if (x < 0 || x >= vd) atomicOr(&w.tok_bad, 1);   // a token the draft cannot have proposed: rejected, flagged
    else if (greedy && !det && nan_or_posinf(to_float(draft[b * dsb + i * dsr + x]))) atomicOr(&w.tok_bad, 1);
  }
  for (int i = threadIdx.x; i < depth; i += kThreads) path[i] = -1;
  __syncthreads();
  if (threadIdx.x == 0) {
    bool dok = w.tok_bad == 0, tok_ok = true;
    for (int rr = 0; rr <= n_nodes; ++rr) tok_ok &= !w.bad[rr];
    for (int rr = n_nodes + 1; rr < rows; ++rr) dok &= !w.bad[rr];
    draft_ok[b] = dok;
    target_ok[b] = tok_ok;
  }

  // 2) the walk
  int accepted = 0, token = 0;
  if (greedy) {                                    // follow the first child equal to the argmax (thread 0 alone)
    if (threadIdx.x == 0) {
      int pos = 0;
      while (true) {
        const int first = tree[pos], count = tree[n_nodes + 1 + pos];
        int chosen = -1;
        for (int k = 0; k < count && chosen < 0; ++k)
          if (tok[first + k] == w.arg[pos] && is_real(rrow, first + k)) chosen = first + k;
        if (chosen < 0) break;
        path[accepted++] = chosen;
        pos = chosen + 1;
      }
      token = w.arg[pos];
    }
  } else {
    TreeRow<T> r = {nullptr, det ? nullptr : draft + b * dsb, dsr, n_nodes, vt, vd, inv_t, replacement != 0};
    token = tree_walk<T>(r, w, tree, tok, rrow, u + static_cast<long long>(b) * (n_nodes + 1), target + b * tsb, tsr,
                         path, accepted, sh);
  }
  __syncthreads();                                 // the path written by thread 0 is read below
  if (threadIdx.x == 0) {
    long long* out = out_tokens + b * out_ld;
    for (int d = 0; d <= depth; ++d) out[d] = d < accepted ? tok[path[d]] : (d == accepted ? token : -1);
    out_accepted[b * acc_stride] = accepted;
  }
}

}  // namespace specsweep

// ---- entry points (instantiated by name: exact_partials<float>, sample_exact<__half>, ...) -------------------
// `lengths`: int64 [B] per-row draft lengths, or null (every row drafted γ); see row_length.

template <typename T>
__global__ void __launch_bounds__(specsweep::kThreads, specsweep::kMinBlocksPerSM)
exact_partials(const long long* tokens, const long long* lengths, const T* target, const T* draft, const float* u,
               int gamma, int vt, int vd, long long tsb, long long tsr, long long dsb, long long dsr, float inv_t,
               int slice, float2* part, float4* dec, int* nacc, unsigned* count, long long* out_tokens,
               long long out_ld, long long* out_accepted, long long acc_stride, bool* draft_ok, bool* target_ok) {
  specsweep::exact_partials_impl<T>(tokens, lengths, target, draft, u, gamma, vt, vd, tsb, tsr, dsb, dsr, inv_t,
                                    slice, part, dec, nacc, count, out_tokens, out_ld, out_accepted, acc_stride,
                                    draft_ok, target_ok);
}

template <typename T>
__global__ void __launch_bounds__(specsweep::kThreads, specsweep::kMinBlocksPerSM)
sample_exact(const long long* tokens, const long long* lengths, const T* target, const T* draft, const float* u,
             int gamma, int vt, int vd, long long tsb, long long tsr, long long dsb, long long dsr, float inv_t,
             int chunks_per_block, const float4* dec, const int* nacc, float2* csum, unsigned* count,
             long long* out_tokens, long long out_ld) {
  specsweep::sample_impl<T, false>(tokens, lengths, target, draft, u, gamma, vt, vd, tsb, tsr, dsb, dsr, inv_t, 0.0f,
                                   0.0f, chunks_per_block, dec, nacc, csum, count, nullptr, out_tokens, out_ld,
                                   nullptr, 0, nullptr, nullptr);
}

template <typename T>
__global__ void __launch_bounds__(specsweep::kThreads, specsweep::kMinBlocksPerSM)
sample_sigmoid(const long long* tokens, const long long* lengths, const T* target, const T* draft, const float* u,
               int gamma, int vt, int vd, long long tsb, long long tsr, long long dsb, long long dsr, float a,
               float beta, int chunks_per_block, float2* csum, unsigned* count, unsigned* flag_words,
               long long* out_tokens, long long out_ld, long long* out_accepted, long long acc_stride,
               bool* draft_ok, bool* target_ok) {
  specsweep::sample_impl<T, true>(tokens, lengths, target, draft, u, gamma, vt, vd, tsb, tsr, dsb, dsr, 1.0f, a,
                                  beta, chunks_per_block, nullptr, nullptr, csum, count, flag_words, out_tokens,
                                  out_ld, out_accepted, acc_stride, draft_ok, target_ok);
}

template <typename T>
__global__ void __launch_bounds__(specsweep::kThreads, specsweep::kMinBlocksPerSM)
greedy_verify(const long long* tokens, const long long* lengths, const T* target, const T* draft, int gamma, int vt,
              int vd, long long tsb, long long tsr, long long dsb, long long dsr, int slice, float2* part,
              unsigned* count, long long* out_tokens, long long out_ld, long long* out_accepted,
              long long acc_stride, bool* draft_ok, bool* target_ok) {
  specsweep::greedy_impl<T>(tokens, lengths, target, draft, gamma, vt, vd, tsb, tsr, dsb, dsr, slice, part, count,
                            out_tokens, out_ld, out_accepted, acc_stride, draft_ok, target_ok);
}

template <typename T>
__global__ void __launch_bounds__(specsweep::kThreads, specsweep::kMinBlocksPerSM)
tree_verify_partials(const T* target, const T* draft, int n_nodes, int vt, int vd, long long tsb, long long tsr,
                     long long dsb, long long dsr, float inv_t, int greedy, int slice, float2* part) {
  specsweep::tree_verify_partials_impl<T>(target, draft, n_nodes, vt, vd, tsb, tsr, dsb, dsr, inv_t, greedy, slice,
                                          part);
}

// `tree`: int32 [2, N+1], per position its first child's node index, then its child count; `real`: bool [B, N]
// (row stride real_ld) or null (see tree_verify_impl).
template <typename T>
__global__ void __launch_bounds__(specsweep::kThreads, specsweep::kMinBlocksPerSM)
tree_verify(const long long* tokens, const int* tree, const T* target, const T* draft, const float* u,
            const bool* real, long long real_ld, int n_nodes, int depth, int vt, int vd, long long tsb, long long tsr,
            long long dsb, long long dsr, float inv_t, int greedy, int replacement, int slices, const float2* part,
            long long* out_tokens, long long out_ld, long long* out_accepted, long long acc_stride,
            long long* out_path, long long path_ld, bool* draft_ok, bool* target_ok) {
  specsweep::tree_verify_impl<T>(tokens, tree, target, draft, u, real, real_ld, n_nodes, depth, vt, vd, tsb, tsr, dsb,
                                 dsr, inv_t, greedy, replacement, slices, part, out_tokens, out_ld, out_accepted,
                                 acc_stride, out_path, path_ld, draft_ok, target_ok);
}
