// Quantized weights by activations quantized to 8 bits per block of inputs, summed in integers:
// a matmul whose every row is the same bits at any row count and on any path it takes
// (engine/ops/int_rows.py).
//
// Why integers: a float sum's value depends on its order, so a float kernel is row-exact only
// if it sums every row count in one order, and must then be slow for a lone decode row or for
// a prefill chunk (engine/ops/int4_rows.py). An integer sum has one value in any order. Here a
// row's inputs are quantized per block of 32 (16 for groups of 16) to int8 with a scale of the
// block's own (max |x| / 127), each block's products are summed exactly in int32, and the
// blocks join the output's float total in input order, with the same float operations on every
// path. So every path gives the same bits (AVX512-VNNI `vpdpbusd` over 16 outputs a vector,
// AVX2's `vpmaddubsw` and `vpmaddwd` over 8, or scalar code; tests compare them) and a row's
// result never depends on its call. It is how llama.cpp multiplies its quantized blocks (Q8_1
// activations), on AVX2 as here.
//
// AMX tiles were tried twice and dropped (an AMX Xeon, the fifth and thirteenth sittings): a
// block's int32 sums must leave the tiles for their scales every 32 inputs. A tile store costs
// as long as the product before it, 16 rows of 64 bytes (a micro-benchmark: 4 products at 32
// inputs, 16.5 ns; with their 4 stores, 31 ns), and then the join below, the same float
// operations for every path, bounds AMX as it bounds VNNI. With the join a block behind the
// tiles from a second buffer and passes of 128 rows, AMX took 1.1-1.7x VNNI's time from 16 to
// 512 rows.
//
// The weight: w = (q - 8) * scale + zero for 4 bits (q in 0..15), w = q * scale for 8 bits
// (signed), scale and zero per output and group of inputs. The kernel reads unsigned bytes u
// (q for 4 bits, q + 128 for 8) and an offset zero z' (zero - 8 scale; -128 scale), so that
// w = u * scale + z'. A block's part of an output, with d the block's activation scale:
//   total = fma(d * scale, float(sum(xq * u)), total); total = fma(z', d * float(sum(xq)), total)
// The total is rounded once to the output's dtype.
//
// Layout (`IntRows.pack` in int_rows.py): outputs padded to strips of 32; 4 bits: for strip s
// and octet i of inputs, [32 outputs][4] bytes whose byte b holds inputs 8 i + b (low nibble)
// and 8 i + 4 + b (high nibble); 8 bits: for each quad i of inputs [32 outputs][4] bytes of
// q + 128. Both unpack into VNNI's layout, [quads][outputs][4] unsigned bytes, with
// at most an `and` and a shift. Scales and offset zeros: [strips, K / group, 32] float32.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bf16.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define TRIO_VNNI 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define TRIO_AVX2 1
#endif

namespace {

constexpr int64_t kStrip = 32;     // outputs a strip
constexpr int64_t kVnniRows = 6;   // rows a VNNI pass (4 accumulators a row, 24 in all)
constexpr int64_t kAvx2Rows = 2;   // rows an AVX2 pass (4 accumulators a row of AVX2's 16)
constexpr int64_t kScalarRows = 16;  // rows a scalar pass

// `n` (at most 32) float totals rounded to bf16 at `out`: `round_bf16` on each.
inline void store_bf16(const float* t, int64_t n, uint16_t* out) {
#ifdef __AVX512BF16__
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t lanes = std::min<int64_t>(16, n - j);
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1);
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, t + j));
    _mm256_mask_storeu_epi16(out + j, mask, reinterpret_cast<const __m256i&>(v));
  }
#else
  for (int64_t j = 0; j < n; ++j) out[j] = round_bf16(t[j]);
#endif
}

// A block of bf16 inputs as float.
inline void widen_block(const uint16_t* src, int64_t n, float* v) {
#ifdef TRIO_VNNI
  for (int64_t k = 0; k < n; k += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
    _mm512_storeu_ps(v + k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
#else
  for (int64_t k = 0; k < n; ++k) v[k] = widen(src[k]);
#endif
}

// The activations of a call, quantized: each row's blocks on their own, so a row's values do
// not depend on the others in the call.
struct Quantized {
  std::vector<int8_t> q;    // [M][K]
  std::vector<float> d;     // [M][blocks]: the block's scale
  std::vector<float> xs;    // [M][blocks]: d * float(sum of the block's q)
};

// Block `v` (n values as float) into q: d = max|v| / 127, q = nearest-even(v * (127 / max|v|)),
// xs = d * float(sum of q). The vector form computes the same operations lane by lane.
inline void quantize_block(const float* v, int64_t n, int8_t* q, float* d, float* xs) {
  float amax = 0.f;
#ifdef TRIO_VNNI
  __m512 vmax = _mm512_setzero_ps();
  for (int64_t k = 0; k < n; k += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(v + k)));
  amax = _mm512_reduce_max_ps(vmax);
#else
  for (int64_t k = 0; k < n; ++k) amax = std::max(amax, std::fabs(v[k]));
#endif
  if (amax == 0.f) {
    std::memset(q, 0, n);
    *d = *xs = 0.f;
    return;
  }
  const float inv = 127.f / amax;
  int32_t sum = 0;
#ifdef TRIO_VNNI
  __m512i vsum = _mm512_setzero_si512();
  for (int64_t k = 0; k < n; k += 16) {
    const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + k), _mm512_set1_ps(inv)));
    vsum = _mm512_add_epi32(vsum, r);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtepi32_epi8(r));
  }
  sum = _mm512_reduce_add_epi32(vsum);
#else
  for (int64_t k = 0; k < n; ++k) {
    const int32_t r = static_cast<int32_t>(std::nearbyint(v[k] * inv));  // |r| <= 127
    q[k] = static_cast<int8_t>(r);
    sum += r;
  }
#endif
  *d = amax / 127.f;
  *xs = *d * static_cast<float>(sum);
}

template <class T>
Quantized quantize(const T* x, int64_t M, int64_t K, int64_t block) {
  const int64_t blocks = K / block;
  Quantized out{std::vector<int8_t>(M * K), std::vector<float>(M * blocks),
                std::vector<float>(M * blocks)};
  at::parallel_for(0, M, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> v(block);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const T* src = x + r * K + b * block;
        const float* values = v.data();
        if constexpr (std::is_same_v<T, uint16_t>) {
          widen_block(src, block, v.data());
        } else {
          values = src;
        }
        const int64_t i = r * blocks + b;
        quantize_block(values, block, out.q.data() + r * K + b * block, &out.d[i], &out.xs[i]);
      }
    }
  });
  return out;
}

// What every path shares: the call's shapes and where a strip's data lies.
struct Call {
  const Quantized* x;
  int64_t M, K, block, group, blocks, groups;
  bool eight;
  const uint8_t* packed;
  const float* scales;
  const float* zeros;  // z' = zero - 8 scale (4 bits), -128 scale (8 bits)
  const int64_t* group_at;  // [blocks]: where block b's scales lie in a strip's (g * 32)
  int64_t strip_bytes() const { return K * kStrip / (eight ? 1 : 2); }
  // Block b's scales and offset zeros in strip s: 32 each.
  const float* scales_of(int64_t s, int64_t b) const {
    return scales + s * groups * kStrip + group_at[b];
  }
  const float* zeros_of(int64_t s, int64_t b) const {
    return zeros + s * groups * kStrip + group_at[b];
  }
};

// One block's integer sums c[j] (32 outputs) joining row r's totals: the float operations every
// path takes, in this order.
inline void join_scalar(const Call& call, int64_t r, int64_t b, const float* sc, const float* zr,
                        const int32_t* dot, float* total) {
  const int64_t i = r * call.blocks + b;
  const float d = call.x->d[i], xs = call.x->xs[i];
  for (int64_t j = 0; j < kStrip; ++j) {
    const float m = d * sc[j];
    total[j] = std::fma(m, static_cast<float>(dot[j]), total[j]);
    total[j] = std::fma(zr[j], xs, total[j]);
  }
}

// Unsigned weight bytes of strip `strip`, inputs [4 quad, 4 quad + 4), outputs 0..31, as
// [32][4]: the layout VNNI reads.
inline void unpack_quad_scalar(const Call& call, const uint8_t* strip, int64_t quad,
                               uint8_t* out) {
  if (call.eight) {
    std::memcpy(out, strip + quad * 4 * kStrip, 4 * kStrip);
    return;
  }
  const uint8_t* octet = strip + (quad / 2) * 4 * kStrip;
  const int shift = (quad % 2) * 4;
  for (int64_t e = 0; e < 4 * kStrip; ++e) out[e] = (octet[e] >> shift) & 15;
}

void strip_scalar(const Call& call, int64_t s, int64_t m0, int64_t rows, float* totals) {
  const uint8_t* strip = call.packed + s * call.strip_bytes();
  uint8_t w[4 * kStrip];
  for (int64_t r = 0; r < rows; ++r) {
    float* total = totals + r * kStrip;
    std::fill(total, total + kStrip, 0.f);
    const int8_t* xq = call.x->q.data() + (m0 + r) * call.K;
    for (int64_t b = 0; b < call.blocks; ++b) {
      int32_t dot[kStrip] = {};
      for (int64_t quad = b * call.block / 4; quad < (b + 1) * call.block / 4; ++quad) {
        unpack_quad_scalar(call, strip, quad, w);
        for (int64_t j = 0; j < kStrip; ++j)
          for (int e = 0; e < 4; ++e)
            dot[j] += static_cast<int32_t>(w[4 * j + e]) * xq[4 * quad + e];
      }
      join_scalar(call, m0 + r, b, call.scales_of(s, b), call.zeros_of(s, b), dot, total);
    }
  }
}

#ifdef TRIO_VNNI
// The join of `join_scalar`, 16 outputs a vector: the same operations, lane by lane.
inline __m512 join16(__m512i dot, __m512 d, __m512 scale, __m512 xs, __m512 zero,
                     __m512 total) {
  total = _mm512_fmadd_ps(_mm512_mul_ps(d, scale), _mm512_cvtepi32_ps(dot), total);
  return _mm512_fmadd_ps(zero, xs, total);
}

// Rows [m0, m0 + R) by one strip with `vpdpbusd`: the weights straight from the packing, so a
// lone row reads each byte once and unpacks it with an `and` (and a shift).
template <int R>
void strip_vnni(const Call& call, int64_t s, int64_t m0, float* totals) {
  const uint8_t* strip = call.packed + s * call.strip_bytes();
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm512_setzero_ps();
  const int8_t* xq = call.x->q.data() + m0 * call.K;
  for (int64_t b = 0; b < call.blocks; ++b) {
    __m512i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    auto dot = [&](int64_t quad, __m512i w0, __m512i w1) {
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, xq + r * call.K + 4 * quad, sizeof four);
        const __m512i a = _mm512_set1_epi32(four);
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], w0, a);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], w1, a);
      }
    };
    const int64_t first = b * call.block / 4, last = (b + 1) * call.block / 4;
    if (call.eight) {
      for (int64_t quad = first; quad < last; ++quad) {
        const uint8_t* p = strip + quad * 4 * kStrip;
        dot(quad, _mm512_loadu_si512(p), _mm512_loadu_si512(p + 64));
      }
    } else {
      for (int64_t quad = first; quad < last; quad += 2) {
        const uint8_t* p = strip + (quad / 2) * 4 * kStrip;
        const __m512i v0 = _mm512_loadu_si512(p), v1 = _mm512_loadu_si512(p + 64);
        dot(quad, _mm512_and_si512(v0, nibble), _mm512_and_si512(v1, nibble));
        dot(quad + 1, _mm512_and_si512(_mm512_srli_epi16(v0, 4), nibble),
            _mm512_and_si512(_mm512_srli_epi16(v1, 4), nibble));
      }
    }
    const float* sc = call.scales_of(s, b);
    const float* zr = call.zeros_of(s, b);
    const __m512 s0 = _mm512_loadu_ps(sc), s1 = _mm512_loadu_ps(sc + 16);
    const __m512 z0 = _mm512_loadu_ps(zr), z1 = _mm512_loadu_ps(zr + 16);
    for (int r = 0; r < R; ++r) {
      const int64_t i = (m0 + r) * call.blocks + b;
      const __m512 d = _mm512_set1_ps(call.x->d[i]), xs = _mm512_set1_ps(call.x->xs[i]);
      total[r][0] = join16(acc[r][0], d, s0, xs, z0, total[r][0]);
      total[r][1] = join16(acc[r][1], d, s1, xs, z1, total[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(totals + r * kStrip, total[r][0]);
    _mm512_storeu_ps(totals + r * kStrip + 16, total[r][1]);
  }
}

using VnniFn = void (*)(const Call&, int64_t, int64_t, float*);

template <int... R>
constexpr std::array<VnniFn, sizeof...(R)> vnni_table(std::integer_sequence<int, R...>) {
  return {&strip_vnni<R + 1>...};
}

constexpr auto kVnniFns = vnni_table(std::make_integer_sequence<int, kVnniRows>{});
#endif

#ifdef TRIO_AVX2
// The join of `join_scalar`, 8 outputs a vector: the same operations, lane by lane.
inline __m256 join8(__m256i dot, __m256 d, __m256 scale, __m256 xs, __m256 zero, __m256 total) {
  total = _mm256_fmadd_ps(_mm256_mul_ps(d, scale), _mm256_cvtepi32_ps(dot), total);
  return _mm256_fmadd_ps(zero, xs, total);
}

// 8 outputs' 4 unsigned bytes each (`w`, at most 15) by a row's 4 signed bytes (`a`): the 8
// sums of 4 products, exact. `vpmaddubsw` saturates its pair sums at 16 bits, which 2 * 15 *
// 127 never reaches; 8-bit weights go through it as two nibbles.
inline __m256i dot4(__m256i w, __m256i a, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
}

// Rows [m0, m0 + R) by one strip, VNNI's loop on AVX2 (the pool's CPUs without AVX512): the
// integer sums are the same numbers in another order, and the float joins the same operations.
template <int R>
void strip_avx2(const Call& call, int64_t s, int64_t m0, float* totals) {
  const uint8_t* strip = call.packed + s * call.strip_bytes();
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 total[R][4];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) total[r][i] = _mm256_setzero_ps();
  const int8_t* xq = call.x->q.data() + m0 * call.K;
  auto row_bytes = [&](int r, int64_t quad) {
    int32_t four;
    std::memcpy(&four, xq + r * call.K + 4 * quad, sizeof four);
    return _mm256_set1_epi32(four);
  };
  for (int64_t b = 0; b < call.blocks; ++b) {
    __m256i acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm256_setzero_si256();
    const int64_t first = b * call.block / 4, last = (b + 1) * call.block / 4;
    if (call.eight) {
      // u = 16 hi + lo: sum(u a) = 16 sum(hi a) + sum(lo a), both exact.
      for (int64_t quad = first; quad < last; ++quad) {
        const uint8_t* p = strip + quad * 4 * kStrip;
        __m256i lo[4], hi[4];
        for (int i = 0; i < 4; ++i) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i));
          lo[i] = _mm256_and_si256(v, nibble);
          hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        }
        for (int r = 0; r < R; ++r) {
          const __m256i a = row_bytes(r, quad);
          for (int i = 0; i < 4; ++i)
            acc[r][i] = _mm256_add_epi32(
                acc[r][i], _mm256_add_epi32(_mm256_slli_epi32(dot4(hi[i], a, ones), 4),
                                            dot4(lo[i], a, ones)));
        }
      }
    } else {
      for (int64_t quad = first; quad < last; quad += 2) {
        const uint8_t* p = strip + (quad / 2) * 4 * kStrip;
        __m256i v[4];
        for (int i = 0; i < 4; ++i)
          v[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * i));
        for (int half = 0; half < 2; ++half) {
          __m256i w[4];
          for (int i = 0; i < 4; ++i)
            w[i] = _mm256_and_si256(half ? _mm256_srli_epi16(v[i], 4) : v[i], nibble);
          for (int r = 0; r < R; ++r) {
            const __m256i a = row_bytes(r, quad + half);
            for (int i = 0; i < 4; ++i)
              acc[r][i] = _mm256_add_epi32(acc[r][i], dot4(w[i], a, ones));
          }
        }
      }
    }
    const float* sc = call.scales_of(s, b);
    const float* zr = call.zeros_of(s, b);
    for (int r = 0; r < R; ++r) {
      const int64_t i = (m0 + r) * call.blocks + b;
      const __m256 d = _mm256_set1_ps(call.x->d[i]), xs = _mm256_set1_ps(call.x->xs[i]);
      for (int j = 0; j < 4; ++j)
        total[r][j] = join8(acc[r][j], d, _mm256_loadu_ps(sc + 8 * j), xs,
                            _mm256_loadu_ps(zr + 8 * j), total[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(totals + r * kStrip + 8 * i, total[r][i]);
}

using Avx2Fn = void (*)(const Call&, int64_t, int64_t, float*);

template <int... R>
constexpr std::array<Avx2Fn, sizeof...(R)> avx2_table(std::integer_sequence<int, R...>) {
  return {&strip_avx2<R + 1>...};
}

constexpr auto kAvx2Fns = avx2_table(std::make_integer_sequence<int, kAvx2Rows>{});
#endif

// How a call sums: the paths in order of speed, each taken where it is built and allowed.
enum Path : int64_t { kGeneric = 0, kAvx2 = 1, kVnni = 2 };

// The fastest path built here, at most `best`.
Path path_of(int64_t best) {
#ifdef TRIO_VNNI
  if (best >= kVnni) return kVnni;
#endif
#ifdef TRIO_AVX2
  if (best >= kAvx2) return kAvx2;
#endif
  return kGeneric;
}

}  // namespace

// x [M, K] (bf16 or float32) by the packed weight: [M, N] in x's dtype, on the fastest path
// built here up to `best` (`Path`: every path gives the same bits, and tests compare them).
torch::Tensor int_linear(const torch::Tensor& x, const torch::Tensor& packed,
                         const torch::Tensor& scales, const torch::Tensor& zeros, int64_t group,
                         int64_t N, bool eight, int64_t best) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() &&
                  (x.dtype() == torch::kBFloat16 || x.dtype() == torch::kFloat32),
              "x: contiguous [M, K] bf16 or float32");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t block = group % 32 == 0 ? 32 : 16;
  TORCH_CHECK(group % 16 == 0 && K % group == 0 && K % 8 == 0,
              "group: a multiple of 16 dividing K");
  const int64_t strips = packed.size(0), groups = K / group;
  TORCH_CHECK(packed.dtype() == torch::kUInt8 && packed.is_contiguous() &&
                  packed.numel() == strips * K * kStrip / (eight ? 1 : 2) && N <= strips * kStrip,
              "packed: [strips, K * 32 (8 bits) or K * 16 (4 bits)] uint8");
  for (const auto* t : {&scales, &zeros})
    TORCH_CHECK(t->dtype() == torch::kFloat32 && t->is_contiguous() &&
                    t->numel() == strips * groups * kStrip,
                "scales, zeros: contiguous [strips, K / group, 32] float32");
  const Quantized xq =
      x.dtype() == torch::kBFloat16
          ? quantize(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), M, K, block)
          : quantize(x.data_ptr<float>(), M, K, block);
  std::vector<int64_t> group_at(K / block);
  for (int64_t b = 0; b < K / block; ++b) group_at[b] = b * block / group * kStrip;
  const Call call{&xq, M, K, block, group, K / block, groups, eight, packed.data_ptr<uint8_t>(),
                  scales.data_ptr<float>(), zeros.data_ptr<float>(), group_at.data()};
  const Path taken = path_of(best);
  auto out = torch::empty({M, N}, x.options());
  const bool bf16 = x.dtype() == torch::kBFloat16;
  at::parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> totals(kScalarRows * kStrip);
    for (int64_t s = begin; s < end; ++s) {
      const int64_t width = std::min<int64_t>(kStrip, N - s * kStrip);
      auto emit = [&](int64_t m, int64_t rows) {
        for (int64_t r = 0; r < rows; ++r) {
          const float* t = totals.data() + r * kStrip;
          if (bf16) {
            auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + (m + r) * N;
            store_bf16(t, width, o + s * kStrip);
          } else {
            std::memcpy(out.data_ptr<float>() + (m + r) * N + s * kStrip, t, width * 4);
          }
        }
      };
#ifdef TRIO_VNNI
      if (taken == kVnni) {
        for (int64_t m = 0; m < M; m += kVnniRows) {
          const int64_t rows = std::min<int64_t>(kVnniRows, M - m);
          kVnniFns[rows - 1](call, s, m, totals.data());
          emit(m, rows);
        }
        continue;
      }
#endif
#ifdef TRIO_AVX2
      if (taken == kAvx2) {
        for (int64_t m = 0; m < M; m += kAvx2Rows) {
          const int64_t rows = std::min<int64_t>(kAvx2Rows, M - m);
          kAvx2Fns[rows - 1](call, s, m, totals.data());
          emit(m, rows);
        }
        continue;
      }
#endif
      for (int64_t m = 0; m < M; m += kScalarRows) {
        const int64_t rows = std::min<int64_t>(kScalarRows, M - m);
        strip_scalar(call, s, m, rows, totals.data());
        emit(m, rows);
      }
    }
  });
  return out;
}

// Which instructions sum here, at most `best` (`Path`): "vnni", "avx2" or "generic".
std::string path(int64_t best) {
  switch (path_of(best)) {
    case kVnni: return "vnni";
    case kAvx2: return "avx2";
    default: return "generic";
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int_linear", &int_linear, "quantized weights by int8-quantized rows, integer sums");
  m.def("path", &path, "the fastest path this machine has");
}
