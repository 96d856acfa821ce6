// cuda_fp16.h for the CPU runtime: the __half storage type and the conversions verify.cu uses.
#pragma once

#include <bit>
#include <cstdint>

struct __half {
  unsigned short x;
};

inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }

// IEEE binary16 -> binary32, exact (every half value, subnormals included, is a normal or zero float).
inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.x & 0x8000u) << 16;
  const uint32_t exponent = (h.x >> 10) & 0x1fu;
  const uint32_t mantissa = h.x & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));         // 127 - 15 = 112
}
