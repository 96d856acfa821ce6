// The C interface of a kernel library built for the CPU runtime (loaded from Python with ctypes).
#include "cuda_on_cpu.h"

#if defined(__x86_64__)
// cuda_on_cpu_switch(void** save_sp [rdi], void* load_sp [rsi]): save the callee-saved registers (System V ABI)
// on the current stack, store its pointer to *save_sp, continue on load_sp's stack where the same registers were
// saved, and return there. MXCSR (flush-to-zero) is per OS thread and the same for every fibre: not switched.
asm(R"(
  .text
  .globl cuda_on_cpu_switch
  .type cuda_on_cpu_switch, @function
cuda_on_cpu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_on_cpu_switch, .-cuda_on_cpu_switch
)");
#endif

namespace {

const cuda_on_cpu::Kernel* find(const char* name) {
  auto it = cuda_on_cpu::registry().find(name);
  return it == cuda_on_cpu::registry().end() ? nullptr : &it->second;
}

void copy_error(const std::string& message, char* out, size_t size) {
  if (size == 0) return;
  std::snprintf(out, size, "%s", message.c_str());
}

}  // namespace

// Built with -fvisibility=hidden (the TLS of the runtime and of __shared__ then resolves within the library);
// only these functions are exported.
#define CUDA_ON_CPU_API __attribute__((visibility("default")))

extern "C" {

// Number of parameters of kernel `name`, or -1 when no such kernel was registered.
CUDA_ON_CPU_API int cuda_on_cpu_param_count(const char* name) {
  const auto* k = find(name);
  return k ? static_cast<int>(k->param_sizes.size()) : -1;
}

// Size in bytes of parameter i of kernel `name`.
CUDA_ON_CPU_API size_t cuda_on_cpu_param_size(const char* name, int i) { return find(name)->param_sizes.at(i); }

// Launches kernel `name` over grid x block with `params[i]` pointing at argument i (as cuLaunchKernel) on
// `workers` OS threads, and returns when every block has finished. `schedule`: 0 runs a block's threads in index
// order, any other value seeds a random order per pass (see run_block). 0 on success; otherwise 1 with the reason in
// `error` (unknown kernel, bad geometry, a failed check or a deadlock inside a block).
CUDA_ON_CPU_API int cuda_on_cpu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, void** params, unsigned workers, uint64_t schedule, char* error,
                       size_t error_size) {
  const auto* k = find(name);
  if (!k) {
    copy_error(std::string("no kernel registered as ") + name, error, error_size);
    return 1;
  }
  const unsigned long threads = static_cast<unsigned long>(bx) * by * bz;
  if (threads == 0 || threads > cuda_on_cpu::kMaxThreads || threads % cuda_on_cpu::kWarpSize != 0) {
    copy_error("block size must be a multiple of 32 up to 1024 threads", error, error_size);
    return 1;
  }
  if (gx == 0 || gy == 0 || gz == 0 || gy > 65535 || gz > 65535) {
    copy_error("grid dimensions must be >= 1 (y and z at most 65535)", error, error_size);
    return 1;
  }
  const std::string message = k->launch(params, dim3{gx, gy, gz}, dim3{bx, by, bz}, workers == 0 ? 1 : workers,
                                        schedule);
  copy_error(message, error, error_size);
  return message.empty() ? 0 : 1;
}

// 16-byte loads (__ldg / __ldcg of a 16-byte type) made by the last launch.
CUDA_ON_CPU_API unsigned long cuda_on_cpu_last_vector_loads() { return cuda_on_cpu::last_vector_loads(); }

}  // extern "C"
