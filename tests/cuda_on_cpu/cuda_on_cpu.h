// A CPU runtime for CUDA kernels: enough of CUDA's execution model to run kernels/verify.cu, unmodified, on a
// CPU, so the kernels are executed and checked in every CI run (which never has a GPU).
//
// The model, as CUDA defines it:
//   grid     blocks run independently; here each one runs on one of a few OS threads (a real thread pool, so
//            blocks of one launch do run at the same time and talk through global memory and atomics).
//   block    its threads run as fibres on that OS thread, switched cooperatively: a fibre runs until it waits
//            at a barrier, in an order that is random (seeded) or by index. __shared__ is `static thread_local`: one copy per OS thread, so one per
//            running block, and like real shared memory it keeps whatever the previous block left there.
//   warp     32 consecutive threads. Shuffles, votes and __syncwarp synchronise the 32 lanes of the calling
//            warp only (a block-wide or 64-lane version gives wrong results in code that only some warps run).
//   barriers are strict: __syncthreads waits for every thread of the block, a warp operation for all 32 lanes.
//            A barrier that some thread never reaches (it returned, or waits at another barrier) is reported as
//            a deadlock with the waiting threads, instead of hanging.
//   numbers  fp32 arithmetic is IEEE single (SSE, -ffp-contract=off: no fused multiply-add, like __f*_rn), and
//            each worker sets flush-to-zero and denormals-are-zero, as CuPy compiles with -ftz=true. expf and
//            division are the C library's, not CUDA's (see README for what that leaves uncaught).
//
// Kernels are C++ function templates here (__global__ expands to nothing); cuda_on_cpu_entry.cpp (generated
// by the Python side) registers each instantiation by its name expression, and the launch API below unpacks a
// cuLaunchKernel-style `void** params` array into the kernel's typed arguments, checking each argument's size.
#pragma once

#include <pmmintrin.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

// ---- CUDA keywords -------------------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local   // one copy per OS thread = per running block (see above)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace cuda_on_cpu {

constexpr int kWarpSize = 32;
constexpr int kMaxThreads = 1024;
constexpr size_t kStackBytes = 64 * 1024;   // per fibre; kernels here keep a few hundred bytes of locals

// ---- one block: its threads as fibres ------------------------------------------------------------------------

enum class Wait { none, block, warp };

// ---- switching between fibres -------------------------------------------------------------------------------
//
// x86-64: a fibre's context is its saved stack pointer; cuda_on_cpu_switch (launch_api.cpp) pushes the
// callee-saved registers, swaps stack pointers and pops them (about 5 ns). Elsewhere: ucontext (portable, but
// swapcontext makes a system call per switch, about 100x slower).
#if defined(__x86_64__)
extern "C" void cuda_on_cpu_switch(void** save_sp, void* load_sp);
struct Context {
  void* sp = nullptr;
};
inline void switch_context(Context& from, Context& to) { cuda_on_cpu_switch(&from.sp, to.sp); }
// A new context that starts `entry` on the stack [base, base + size) when first switched to.
inline void make_context(Context& c, char* base, size_t size, void (*entry)()) {
  auto* top = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(base + size) & ~uintptr_t{15});
  *--top = nullptr;                              // entry's return address: it never returns
  *--top = reinterpret_cast<void*>(entry);       // popped by cuda_on_cpu_switch's `ret`
  for (int r = 0; r < 6; ++r) *--top = nullptr;  // rbp rbx r12 r13 r14 r15
  c.sp = top;
}
#else
struct Context {
  ucontext_t uc;
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void make_context(Context& c, char* base, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = base;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

// A barrier for `expected` participants with a generation count: the last to arrive opens it.
struct Barrier {
  int expected = 0;
  int arrived = 0;
  unsigned generation = 0;
};

struct Fibre {
  Context ctx;
  dim3 idx;                 // threadIdx
  int lane = 0, warp = 0;
  bool done = false;
  Wait waiting = Wait::none;
  const Barrier* barrier = nullptr;   // while waiting: the barrier, and the generation it waits to see pass
  unsigned generation = 0;
};

struct WarpState {
  Barrier barrier;
  uint64_t slots[2][kWarpSize];   // exchange buffers, alternated per generation (one barrier per exchange)
};

struct Block {
  dim3 idx, dim, grid;
  Context scheduler;
  std::vector<Fibre> fibres;
  Fibre* current = nullptr;
  Barrier barrier;                // __syncthreads
  int vote[2] = {0, 0};           // __syncthreads_or accumulators, alternated per generation
  std::vector<WarpState> warps;
  unsigned long events = 0;       // arrivals and exits: no change over a whole pass = deadlock
  std::string error;              // set by a failed check inside a fibre; the block then stops
};

inline thread_local Block* tl_block = nullptr;
inline thread_local unsigned long tl_vector_loads = 0;   // 16-byte loads through __ldg / __ldcg, per worker

inline Block& block() { return *tl_block; }
inline Fibre& fibre() { return *tl_block->current; }

// Stop the block from inside a fibre: record why and return to the scheduler, never to run again.
[[noreturn]] inline void fail(const std::string& why) {
  Block& b = block();
  if (b.error.empty()) b.error = why;
  Fibre& f = fibre();
  f.done = true;
  switch_context(f.ctx, b.scheduler);
  __builtin_unreachable();
}

inline void yield() {
  Block& b = block();
  switch_context(b.current->ctx, b.scheduler);
  asm volatile("" ::: "memory");   // other fibres ran: re-read shared and global memory
}

// Arrive at `bar` and wait until its generation turns. Returns the generation that was waited for.
inline unsigned arrive_and_wait(Barrier& bar, Wait kind) {
  Block& b = block();
  const unsigned gen = bar.generation;
  ++b.events;
  if (++bar.arrived == bar.expected) {
    bar.arrived = 0;
    ++bar.generation;
    if (kind == Wait::block) b.vote[(gen + 1) & 1] = 0;   // ready for the next __syncthreads_or
  } else {
    Fibre& f = fibre();
    f.waiting = kind;
    f.barrier = &bar;
    f.generation = gen;
    yield();                         // the scheduler resumes this fibre only once the generation has turned
    f.waiting = Wait::none;
  }
  asm volatile("" ::: "memory");
  return gen;
}

inline void syncthreads() { arrive_and_wait(block().barrier, Wait::block); }

inline int syncthreads_or(int pred) {
  Block& b = block();
  const unsigned gen = b.barrier.generation;
  b.vote[gen & 1] |= (pred != 0);
  arrive_and_wait(b.barrier, Wait::block);
  return b.vote[gen & 1];
}

inline void check_full_mask(unsigned mask, const char* what) {
  if (mask != 0xffffffffu)
    fail(std::string(what) + " with a partial warp mask: the CPU runtime supports full warps only");
}

// Every lane of the calling warp contributes `value`; returns the value of lane `src` (own value if out of range).
template <typename T>
inline T warp_exchange(T value, int src) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "warp exchange of values up to 8 bytes");
  Fibre& f = fibre();
  WarpState& w = block().warps[f.warp];
  const unsigned slot = w.barrier.generation & 1;
  std::memcpy(&w.slots[slot][f.lane], &value, sizeof(T));
  arrive_and_wait(w.barrier, Wait::warp);
  if (src < 0 || src >= kWarpSize) return value;
  T out;
  std::memcpy(&out, &w.slots[slot][src], sizeof(T));
  return out;
}

// Every lane contributes `pred`; returns the 32-bit ballot of the warp.
inline unsigned warp_ballot(int pred) {
  Fibre& f = fibre();
  WarpState& w = block().warps[f.warp];
  const unsigned slot = w.barrier.generation & 1;
  w.slots[slot][f.lane] = pred != 0;
  arrive_and_wait(w.barrier, Wait::warp);
  unsigned bits = 0;
  for (int l = 0; l < kWarpSize; ++l) bits |= static_cast<unsigned>(w.slots[slot][l] != 0) << l;
  return bits;
}

// ---- running a grid ------------------------------------------------------------------------------------------

using BlockBody = void (*)(void*);   // runs the kernel for the current thread with the launch's arguments

struct LaunchState {
  BlockBody body;
  void* args;
  dim3 grid, dim;
  uint64_t schedule;              // 0: threads in index order each pass; else the seed of a random order
  std::atomic<unsigned long> next_block{0};
  std::mutex error_mutex;
  std::string error;
  std::atomic<unsigned long> vector_loads{0};
};

inline thread_local LaunchState* tl_launch = nullptr;

inline void fibre_main() {
  tl_launch->body(tl_launch->args);
  Block& b = block();
  ++b.events;
  b.current->done = true;
  switch_context(b.current->ctx, b.scheduler);   // never resumed
  __builtin_unreachable();
}

inline std::string describe_deadlock(const Block& b) {
  int at_block = 0, at_warp = 0, exited = 0;
  for (const Fibre& f : b.fibres) {
    if (f.done) ++exited;
    else if (f.waiting == Wait::block) ++at_block;
    else if (f.waiting == Wait::warp) ++at_warp;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "deadlock in block (%u, %u, %u): %d threads wait at __syncthreads, %d at a warp operation, %d "
                "have exited: a barrier is not reached by every thread it waits for",
                b.idx.x, b.idx.y, b.idx.z, at_block, at_warp, exited);
  return buf;
}

// xorshift64: the random schedule's generator (any fixed, cheap generator would do).
inline uint64_t next_random(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

// Runs one block to completion on this OS thread. Returns false (with b.error set) on a failed check or deadlock.
// Each pass resumes every live thread once, until it waits at a barrier or exits. With a schedule seed the order
// of a pass is a fresh random permutation, so a missing barrier shows up as a wrong result (in index order,
// lower warps would always write before higher warps read, and such races would stay hidden).
inline bool run_block(Block& b, char* stacks, uint64_t schedule) {
  const int n = static_cast<int>(b.dim.x * b.dim.y * b.dim.z);
  b.fibres.assign(n, Fibre{});
  b.warps.assign((n + kWarpSize - 1) / kWarpSize, WarpState{});
  b.barrier = Barrier{n, 0, 0};
  for (auto& w : b.warps) w.barrier.expected = kWarpSize;
  b.vote[0] = b.vote[1] = 0;
  b.events = 0;
  b.error.clear();
  for (int t = 0; t < n; ++t) {
    Fibre& f = b.fibres[t];
    f.idx = {t % b.dim.x, (t / b.dim.x) % b.dim.y, t / (b.dim.x * b.dim.y)};
    f.lane = t % kWarpSize;
    f.warp = t / kWarpSize;
    make_context(f.ctx, stacks + t * (kStackBytes + getpagesize()) + getpagesize(), kStackBytes,  // above its guard
                 fibre_main);
  }
  std::vector<int> order(n);
  for (int t = 0; t < n; ++t) order[t] = t;
  const unsigned long linear = b.idx.x + static_cast<unsigned long>(b.grid.x) * (b.idx.y + b.grid.y * b.idx.z);
  uint64_t rng = schedule * 0x9E3779B97F4A7C15ull + linear + 1;   // per block: the same block, the same order
  int live = n;
  while (live > 0 && b.error.empty()) {
    const unsigned long before = b.events;
    if (schedule != 0)   // Fisher-Yates, with a multiply-shift in place of a modulo
      for (int i = n - 1; i > 0; --i)
        std::swap(order[i], order[((next_random(rng) >> 32) * static_cast<uint64_t>(i + 1)) >> 32]);
    live = 0;
    for (int t : order) {
      Fibre& f = b.fibres[t];
      if (f.done) continue;
      if (f.waiting != Wait::none && f.barrier->generation == f.generation) {   // its barrier is still closed
        ++live;
        continue;
      }
      b.current = &f;
      switch_context(b.scheduler, f.ctx);
      if (!b.error.empty()) break;
      live += !f.done;
    }
    if (live > 0 && b.events == before && b.error.empty()) b.error = describe_deadlock(b);
  }
  b.current = nullptr;
  return b.error.empty();
}

inline void worker(LaunchState* launch) {
  // -ftz=true as CuPy compiles: denormal results flush to zero, denormal inputs read as zero
  _mm_setcsr(_mm_getcsr() | _MM_FLUSH_ZERO_ON | _MM_DENORMALS_ZERO_ON);
  const long page = getpagesize();
  const unsigned threads = launch->dim.x * launch->dim.y * launch->dim.z;
  const size_t bytes = threads * (kStackBytes + page);
  char* stacks = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (stacks == MAP_FAILED) {
    std::lock_guard<std::mutex> lock(launch->error_mutex);
    launch->error = "cannot map fibre stacks";
    return;
  }
  for (unsigned t = 0; t < threads; ++t) mprotect(stacks + t * (kStackBytes + page), page, PROT_NONE);  // guards
  Block b;
  tl_block = &b;
  tl_launch = launch;
  b.dim = launch->dim;
  b.grid = launch->grid;
  const unsigned long total = static_cast<unsigned long>(launch->grid.x) * launch->grid.y * launch->grid.z;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(launch->error_mutex);
      if (!launch->error.empty()) break;
    }
    const unsigned long i = launch->next_block.fetch_add(1);
    if (i >= total) break;
    b.idx = {static_cast<unsigned>(i % launch->grid.x), static_cast<unsigned>((i / launch->grid.x) % launch->grid.y),
             static_cast<unsigned>(i / (static_cast<unsigned long>(launch->grid.x) * launch->grid.y))};
    if (!run_block(b, stacks, launch->schedule)) {
      std::lock_guard<std::mutex> lock(launch->error_mutex);
      if (launch->error.empty()) launch->error = b.error;
      break;
    }
  }
  launch->vector_loads += tl_vector_loads;
  tl_vector_loads = 0;
  tl_block = nullptr;
  tl_launch = nullptr;
  munmap(stacks, bytes);
}

// 16-byte loads of the last launch (tests check that aligned vector loads stay in use).
inline unsigned long& last_vector_loads() {
  static unsigned long n = 0;
  return n;
}

// Runs the whole grid on `workers` OS threads; returns the first error ("" when every block completed).
inline std::string run_grid(BlockBody body, void* args, dim3 grid, dim3 dim, unsigned workers, uint64_t schedule) {
  LaunchState launch;
  launch.schedule = schedule;
  launch.body = body;
  launch.args = args;
  launch.grid = grid;
  launch.dim = dim;
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w) pool.emplace_back(worker, &launch);
  for (auto& t : pool) t.join();
  last_vector_loads() = launch.vector_loads.load();
  return launch.error;
}

// ---- kernels by name -----------------------------------------------------------------------------------------

struct Kernel {
  std::string (*launch)(void** params, dim3 grid, dim3 dim, unsigned workers, uint64_t schedule);
  std::vector<size_t> param_sizes;
};

inline std::map<std::string, Kernel>& registry() {
  static std::map<std::string, Kernel> kernels;
  return kernels;
}

// Calls kernel F with its arguments unpacked from params (pointers to each argument, as cuLaunchKernel takes).
template <auto F, typename... Args, size_t... I>
void call_with(void** params, std::index_sequence<I...>) {
  F(*static_cast<std::remove_cv_t<std::remove_reference_t<Args>>*>(params[I])...);
}

template <auto F, typename... Args>
struct Registration {
  explicit Registration(const char* name) {
    Kernel k;
    k.param_sizes = {sizeof(std::remove_cv_t<std::remove_reference_t<Args>>)...};
    k.launch = [](void** params, dim3 grid, dim3 dim, unsigned workers, uint64_t schedule) {
      return run_grid([](void* p) { call_with<F, Args...>(static_cast<void**>(p), std::index_sequence_for<Args...>{}); },
                      params, grid, dim, workers, schedule);
    };
    registry()[name] = k;
  }
};

template <auto F, typename R, typename... Args>
Registration<F, Args...> make_registration(const char* name, R (*)(Args...)) {
  return Registration<F, Args...>(name);
}

}  // namespace cuda_on_cpu

// Register kernel instantiation EXPR (e.g. exact_partials<float>) under its name expression.
#define CUDA_ON_CPU_KERNEL(ID, ...) \
  static auto cuda_on_cpu_reg_##ID = ::cuda_on_cpu::make_registration<&__VA_ARGS__>(#__VA_ARGS__, &__VA_ARGS__)

// ---- built-in variables --------------------------------------------------------------------------------------

#define threadIdx (::cuda_on_cpu::fibre().idx)
#define blockIdx (::cuda_on_cpu::block().idx)
#define blockDim (::cuda_on_cpu::block().dim)
#define gridDim (::cuda_on_cpu::block().grid)
constexpr int warpSize = 32;

// ---- synchronisation, warp operations --------------------------------------------------------------------------

inline void __syncthreads() { cuda_on_cpu::syncthreads(); }
inline int __syncthreads_or(int pred) { return cuda_on_cpu::syncthreads_or(pred); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  cuda_on_cpu::check_full_mask(mask, "__syncwarp");
  cuda_on_cpu::warp_ballot(0);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  cuda_on_cpu::check_full_mask(mask, "__shfl_xor_sync");
  if (width != 32) cuda_on_cpu::fail("__shfl_xor_sync with width != 32 is not supported by the CPU runtime");
  return cuda_on_cpu::warp_exchange(value, cuda_on_cpu::fibre().lane ^ lane_mask);
}

template <typename T>
inline T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  cuda_on_cpu::check_full_mask(mask, "__shfl_up_sync");
  if (width != 32) cuda_on_cpu::fail("__shfl_up_sync with width != 32 is not supported by the CPU runtime");
  return cuda_on_cpu::warp_exchange(value, cuda_on_cpu::fibre().lane - static_cast<int>(delta));
}

template <typename T>
inline T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  cuda_on_cpu::check_full_mask(mask, "__shfl_down_sync");
  if (width != 32) cuda_on_cpu::fail("__shfl_down_sync with width != 32 is not supported by the CPU runtime");
  const int src = cuda_on_cpu::fibre().lane + static_cast<int>(delta);
  return cuda_on_cpu::warp_exchange(value, src < 32 ? src : cuda_on_cpu::fibre().lane);
}

inline int __any_sync(unsigned mask, int pred) {
  cuda_on_cpu::check_full_mask(mask, "__any_sync");
  return cuda_on_cpu::warp_ballot(pred) != 0u;
}
inline int __all_sync(unsigned mask, int pred) {
  cuda_on_cpu::check_full_mask(mask, "__all_sync");
  return cuda_on_cpu::warp_ballot(pred) == 0xffffffffu;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  cuda_on_cpu::check_full_mask(mask, "__ballot_sync");
  return cuda_on_cpu::warp_ballot(pred);
}

// ---- atomics and fences (global memory is shared between the worker threads) ----------------------------------

inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
// ((old >= limit) ? 0 : old + 1), as CUDA's atomicInc
inline unsigned atomicInc(unsigned* p, unsigned limit) {
  unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, old >= limit ? 0u : old + 1u, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  return old;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- loads ------------------------------------------------------------------------------------------------------

template <typename T>
inline T checked_load(const T* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "misaligned address %p for a %zu-byte %s", static_cast<const void*>(p),
                  alignof(T), what);
    cuda_on_cpu::fail(buf);
  }
  if constexpr (sizeof(T) == 16) ++cuda_on_cpu::tl_vector_loads;
  return *p;
}
template <typename T>
inline T __ldg(const T* p) { return checked_load(p, "__ldg"); }
template <typename T>
inline T __ldcg(const T* p) { return checked_load(p, "__ldcg"); }

// ---- math ----------------------------------------------------------------------------------------------------

using std::isfinite;
using std::isnan;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

// Round-to-nearest fp32 operations: plain operations, since the build uses -ffp-contract=off.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

constexpr float __int_as_float(int x) { return std::bit_cast<float>(x); }
constexpr float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
constexpr int __float_as_int(float x) { return std::bit_cast<int>(x); }
constexpr unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
