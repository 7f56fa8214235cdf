// bfloat16 as the CUDA emulator provides it (tests/cuda_emu/include/cuda_emu.h): the bits of
// the upper half of a float, converted with round-to-nearest-even (NaN kept a NaN), as
// __float2bfloat16_rn does on the GPU.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = uint32_t{b.bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
