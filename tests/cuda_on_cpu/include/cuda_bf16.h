// cuda_bf16.h for the CPU runtime: the __nv_bfloat16 storage type and its conversion to fp32.
#pragma once

#include <bit>
#include <cstdint>

struct __nv_bfloat16 {
  unsigned short x;
};

// bfloat16 is the top half of an fp32: the conversion is a 16-bit shift, exact.
inline float __bfloat162float(__nv_bfloat16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.x) << 16); }
