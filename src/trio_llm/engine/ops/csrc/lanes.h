// Floats a vector register at a time with GCC's vector extensions: sixteen with AVX-512, eight
// with AVX2. Shared by the kernels of csrc/: a fixed order of operations a lane, so a row's
// result does not depend on which call computed it (on one machine: the lanes, and so the
// order of a sum, are the machine's).
//
// Why not sixteen everywhere: GCC lowers a vector wider than the machine's registers through
// the stack, a broadcast as sixteen scalar stores; on AVX2 the decode kernel's value sums ran
// 6x slower than on AVX-512 (a 1,000-query prefill, float32, an EPYC held to AVX2).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

#ifdef __AVX512F__
#define TRIO_LANES16 1
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes load_lanes(const float* p) {
  Lanes out;
  std::memcpy(&out, p, sizeof out);
  return out;
}

// a * b + c in each lane, rounded once where the machine fuses it. Spelled out because whether
// the compiler contracts `a * b + c` depends on the language mode and the optimizer's choice
// at each site; a kernel that keeps batch invariance needs every site that computes a row to
// round it the same way.
inline Lanes fma_lanes(Lanes a, Lanes b, Lanes c) {
#if defined(TRIO_LANES16)
  return reinterpret_cast<Lanes>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a),
                                                 reinterpret_cast<__m512>(b),
                                                 reinterpret_cast<__m512>(c)));
#elif defined(__FMA__)
  return reinterpret_cast<Lanes>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a),
                                                 reinterpret_cast<__m256>(b),
                                                 reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}

// Lanes' sum, the lanes halved into each other. A compiler's own vectorized reduction sums the
// lanes one by one, a chain of dependent adds that cost more than the products.
inline float lanes_sum(Lanes acc) {
#ifdef TRIO_LANES16
  acc += __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  acc += __builtin_shufflevector(acc, acc, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  acc += __builtin_shufflevector(acc, acc, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  acc += __builtin_shufflevector(acc, acc, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
#else
  acc += __builtin_shufflevector(acc, acc, 4, 5, 6, 7, 0, 1, 2, 3);
  acc += __builtin_shufflevector(acc, acc, 2, 3, 0, 1, 2, 3, 0, 1);
  acc += __builtin_shufflevector(acc, acc, 1, 0, 1, 0, 1, 0, 1, 0);
#endif
  return acc[0];
}


typedef int32_t LanesInt __attribute__((vector_size(kLanes * sizeof(int32_t))));

// exp of 16 floats at once (Cephes' expf: 2^n times a degree-6 polynomial of the rest, about one
// unit in the last place), for arguments <= 0 (a softmax's); below -87 it gives 2^-126 against
// e^x's smaller value, nothing a sum of at least one 1 can see. glibc's vector exp is not used
// without -ffast-math, and its scalar expf took a fifth of a prefill's attention.
inline Lanes exp_lanes(Lanes x) {
  x = x < -87.0f ? Lanes{} - 87.0f : x;
  const Lanes magic = Lanes{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Lanes n = (x * 1.44269504088896341f + magic) - magic;
  const Lanes r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Lanes p = Lanes{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Lanes y = p * r * r + r + 1.0f;
  const LanesInt bits = (__builtin_convertvector(n, LanesInt) + 127) << 23;
  Lanes scale_by;
  std::memcpy(&scale_by, &bits, sizeof scale_by);
  return y * scale_by;
}

}  // namespace
