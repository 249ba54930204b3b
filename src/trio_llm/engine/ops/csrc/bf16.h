// bf16 as the kernels of csrc/ read and write it: the top half of a float32, rounded to nearest
// even (as torch and `vcvtne2ps2bf16` round), a NaN kept a NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace {

inline float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

inline uint16_t round_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace
