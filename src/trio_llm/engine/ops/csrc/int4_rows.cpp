// A matmul of bf16 activations by 4-bit (or 8-bit) weights whose every output row is computed the
// same way whatever the number of rows in the call: the quantized matmul of a batch-invariant
// engine, and the default's for calls of few rows where it is the fastest (engine/ops/int4_rows.py).
//
// Why a kernel of our own: torch's int4 kernel is row-exact but dequantizes a weight tile for
// every few rows, so a decode batch of 32 costs 4x oneDNN's bf16 matmul; oneDNN is fast for a
// batch but reads bf16 weights for a lone stream, and the two sum a row's products in
// different orders, so an engine that picks one by row count is not batch-invariant. Here a
// strip of 32 outputs is unpacked once into bf16 pairs (the layout AVX512-BF16's dot product
// and AMX's tiles read) and every row of the call is multiplied by it.
//
// The weight: w = (q - 8) * scale + zero for 4 bits (q in 0..15), w = q * scale + zero for 8
// (signed bytes, zero 0), with a bf16 scale and zero per output and group of inputs (GGUF's
// and torch's int4 layouts are of this form, their scales bf16). Two ways to sum, one a
// machine; under either a row's result depends on the row and the weight alone, never on how
// many rows share the call:
// - AMX (`rows_by_strip_amx`): the strip is dequantized, w in float32 rounded to bf16, and
//   tiles of 16 rows by 32 inputs take each chunk of 32 inputs in one `tdpbf16ps` into one
//   float32 accumulator an output (a call of fewer rows configures shorter tiles, never
//   another order).
// - AVX512-BF16 without AMX (`rows_by_strip_grouped`): the strip holds the integers
//   themselves (exact in bf16; 4-bit ones looked up in a 16-entry table by one `vpermw`, so a
//   lone row's unpacking is two shuffles per 32 weights, not a widening, a conversion and a
//   multiply-add each 16), `vdpbf16ps` sums a group's pairs (k, k + 1) in order into a group
//   accumulator, and the group joins the output's total as scale * its sum, then zero * the
//   row's sum of x over the group. The weights enter unrounded. A call of at most 6 rows
//   unpacks in registers as it multiplies; more rows share a strip unpacked to memory once.
// - Without AVX512-BF16 (where torch's kernels are used) the first way in scalar code.
// The total is rounded once to bf16.
//
// Layout (`RowsExact.pack`): the weight is padded to whole strips of 32 outputs; for strip s
// and input pair p, 32 bytes whose byte j holds output 32 s + j's weights 2 p (low nibble) and
// 2 p + 1 (high nibble); 8 bits (`RowsExact.pack8`): 64 bytes, output j's pair at 2 j, 2 j + 1.
// Scales and zeros: [strips, K / group, 32].
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "amx.h"
#include "bf16.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define TRIO_AVX512_BF16 1
#endif

namespace {

constexpr int64_t kStrip = 32;       // outputs a strip
constexpr int64_t kRows = 12;        // rows a pass over a strip (24 float32 accumulators)
constexpr int64_t kAmxRows = 32;     // rows a pass of the tiles over a strip: two A tiles
constexpr int64_t kGroupedRows = 6;  // the grouped pass: 12 group and 12 total accumulators

#ifdef TRIO_AVX512_BF16
inline __m512 widen16(const uint16_t* bits) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

// Strip `s` of the weight dequantized into `buf`, [K / 2][32 outputs][2] bf16: w = (q - 8) *
// scale + zero (4 bits; `eight`: q * scale + zero, signed bytes) in float32, rounded to bf16.
template <bool kEight>
void dequantize_strip(const uint8_t* packed, const uint16_t* scales, const uint16_t* zeros,
                      int64_t s, int64_t K, int64_t group, uint16_t* buf) {
  const int64_t pairs = K / 2, groups = K / group;
  constexpr int64_t kPairBytes = kEight ? 2 * kStrip : kStrip;
  const uint8_t* q = packed + s * pairs * kPairBytes;
  const uint16_t* sc = scales + s * groups * kStrip;
  const uint16_t* zr = zeros + s * groups * kStrip;
#ifdef TRIO_AVX512_BF16
  const __m512i lo_idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i hi_idx =
      _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const __m512i eight = _mm512_set1_epi32(8);
  for (int64_t g = 0; g < groups; ++g) {
    __m512 scale[4], zero[4];
    for (int h = 0; h < 2; ++h) {
      const __m512 s16 = widen16(sc + g * kStrip + 16 * h);
      const __m512 z16 = widen16(zr + g * kStrip + 16 * h);
      scale[2 * h] = _mm512_permutexvar_ps(lo_idx, s16);
      scale[2 * h + 1] = _mm512_permutexvar_ps(hi_idx, s16);
      zero[2 * h] = _mm512_permutexvar_ps(lo_idx, z16);
      zero[2 * h + 1] = _mm512_permutexvar_ps(hi_idx, z16);
    }
    for (int64_t p = g * group / 2; p < (g + 1) * group / 2; ++p) {
      for (int h = 0; h < 2; ++h) {
        __m512i a, b;  // outputs 0..7 and 8..15 of the half, (k, k + 1) each
        if constexpr (kEight) {
          const auto* row = reinterpret_cast<const __m128i*>(q + p * kPairBytes + 32 * h);
          a = _mm512_cvtepi8_epi32(_mm_loadu_si128(row));
          b = _mm512_cvtepi8_epi32(_mm_loadu_si128(row + 1));
        } else {
          const __m128i v =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + p * kPairBytes + 16 * h));
          const __m128i even = _mm_and_si128(v, nibble);
          const __m128i odd = _mm_and_si128(_mm_srli_epi16(v, 4), nibble);
          a = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(even, odd)), eight);
          b = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(even, odd)), eight);
        }
        const __m512 wa = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), scale[2 * h], zero[2 * h]);
        const __m512 wb =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), scale[2 * h + 1], zero[2 * h + 1]);
        const __m512bh w = _mm512_cvtne2ps_pbh(wb, wa);
        _mm512_storeu_si512(buf + p * 2 * kStrip + 32 * h, reinterpret_cast<const __m512i&>(w));
      }
    }
  }
#else
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t g = 2 * p / group;
    for (int64_t e = 0; e < 2 * kStrip; ++e) {
      const int64_t j = e / 2;
      int value;
      if constexpr (kEight) value = static_cast<int8_t>(q[p * kPairBytes + e]);
      else value = ((q[p * kPairBytes + j] >> (4 * (e % 2))) & 15) - 8;
      buf[p * 2 * kStrip + e] = round_bf16(static_cast<float>(value) * widen(sc[g * kStrip + j]) +
                                           widen(zr[g * kStrip + j]));
    }
  }
#endif
}

#ifdef TRIO_AVX512_BF16
// Each of rows [0, R) of x (`ldx` apart) adds its input pair p times the strip's pair-p vectors
// (outputs 0..15, 16..31) to its accumulators, one `vdpbf16ps` a vector.
template <int R>
inline void dot_pair(__m512 (&acc)[R][2], const uint16_t* x, int64_t ldx, int64_t p, __m512bh w0,
                     __m512bh w1) {
  for (int r = 0; r < R; ++r) {
    int32_t pair;
    std::memcpy(&pair, x + r * ldx + 2 * p, sizeof pair);
    const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
  }
}
#endif

// Rows [0, R) of x (each K bf16, `ldx` apart) by one dequantized strip: out[r][0..32).
template <int R>
void rows_by_strip(const uint16_t* x, int64_t ldx, const uint16_t* buf, int64_t K, float* out) {
  const int64_t pairs = K / 2;
#ifdef TRIO_AVX512_BF16
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(buf + p * 64));
    const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(buf + p * 64 + 32));
    dot_pair<R>(acc, x, ldx, p, w0, w1);
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * kStrip, acc[r][0]);
    _mm512_storeu_ps(out + r * kStrip + 16, acc[r][1]);
  }
#else
  for (int r = 0; r < R; ++r) {
    float acc[kStrip] = {};
    for (int64_t p = 0; p < pairs; ++p) {
      const float a0 = widen(x[r * ldx + 2 * p]), a1 = widen(x[r * ldx + 2 * p + 1]);
#pragma omp simd
      for (int64_t j = 0; j < kStrip; ++j) {
        acc[j] += a0 * widen(buf[p * 64 + 2 * j]);
        acc[j] += a1 * widen(buf[p * 64 + 2 * j + 1]);
      }
    }
    std::memcpy(out + r * kStrip, acc, sizeof acc);
  }
#endif
}

#ifdef TRIO_AVX512_BF16
// Where the grouped pass reads a strip's integer pairs (k, k + 1), 16 outputs a vector (half
// h of the strip): a buffer unpacked before (calls of many rows), or the packing itself (a
// call of a few rows, which would only write the buffer to read it once). Both give the same
// values, so a row's result does not depend on which its call took.
struct FromBuffer {
  const uint16_t* buf;
  __m512i operator()(int64_t p, int h) const { return _mm512_loadu_si512(buf + p * 64 + 32 * h); }
};

struct From4Bits {
  const uint8_t* q;  // the strip's first pair
  __m512i table;     // bf16 of (i & 15) - 8 for the 32 word indices `vpermw` reads

  explicit From4Bits(const uint8_t* strip) : q(strip) {
    alignas(64) uint16_t words[32];
    for (int i = 0; i < 32; ++i) words[i] = round_bf16(static_cast<float>((i & 15) - 8));
    table = _mm512_load_si512(words);
  }
  __m512i operator()(int64_t p, int h) const {
    // A lane's byte b: its low word indexes with b (the low nibble; bit 4, another nibble's,
    // reads the table's repeat), its high word with b >> 4.
    const __m512i b = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + p * kStrip + 16 * h)));
    return _mm512_permutexvar_epi16(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)), table);
  }
};

struct From8Bits {
  const int8_t* q;  // the strip's first pair
  __m512i operator()(int64_t p, int h) const {
    const auto* row = reinterpret_cast<const __m128i*>(q + p * 2 * kStrip + 32 * h);
    const __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row)));
    const __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(row + 1)));
    const __m512bh w = _mm512_cvtne2ps_pbh(b, a);  // exact: |q| <= 128
    return reinterpret_cast<const __m512i&>(w);
  }
};

template <class Source>
void unpack_strip(const Source& source, int64_t K, uint16_t* buf) {
  for (int64_t p = 0; p < K / 2; ++p)
    for (int h = 0; h < 2; ++h) _mm512_storeu_si512(buf + p * 64 + 32 * h, source(p, h));
}

// Each row's sum of x over each group, [M][groups], in one fixed order a row.
void group_sums(const uint16_t* x, int64_t M, int64_t K, int64_t group, float* out) {
  const int64_t groups = K / group;
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const uint16_t* v = x + r * K + g * group;
        __m512 acc = _mm512_setzero_ps();
        int64_t k = 0;
        for (; k + 16 <= group; k += 16) acc = _mm512_add_ps(acc, widen16(v + k));
        float sum = _mm512_reduce_add_ps(acc);
        for (; k < group; ++k) sum += widen(v[k]);
        out[r * groups + g] = sum;
      }
    }
  });
}

// Rows [0, R) of x by one strip of integers: per group, the pairs' dot products in order, then
// total += scale * dot; total += zero * (the row's group sum of x).
template <int R, class Source>
void rows_by_strip_grouped(const uint16_t* x, int64_t ldx, const Source& w, const uint16_t* sc,
                           const uint16_t* zr, const float* xsum, int64_t K, int64_t group,
                           float* out) {
  const int64_t groups = K / group;
  __m512 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = g * group / 2; p < (g + 1) * group / 2; ++p) {
      const __m512bh w0 = reinterpret_cast<__m512bh>(w(p, 0));
      const __m512bh w1 = reinterpret_cast<__m512bh>(w(p, 1));
      dot_pair<R>(acc, x, ldx, p, w0, w1);
    }
    const __m512 s0 = widen16(sc + g * kStrip), s1 = widen16(sc + g * kStrip + 16);
    const __m512 z0 = widen16(zr + g * kStrip), z1 = widen16(zr + g * kStrip + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 sum = _mm512_set1_ps(xsum[r * groups + g]);
      total[r][0] = _mm512_fmadd_ps(sum, z0, _mm512_fmadd_ps(acc[r][0], s0, total[r][0]));
      total[r][1] = _mm512_fmadd_ps(sum, z1, _mm512_fmadd_ps(acc[r][1], s1, total[r][1]));
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(out + r * kStrip, total[r][0]);
    _mm512_storeu_ps(out + r * kStrip + 16, total[r][1]);
  }
}

template <class Source>
using GroupedFn = void (*)(const uint16_t*, int64_t, const Source&, const uint16_t*,
                           const uint16_t*, const float*, int64_t, int64_t, float*);

template <class Source, int... R>
constexpr std::array<GroupedFn<Source>, sizeof...(R)> grouped_table(
    std::integer_sequence<int, R...>) {
  return {&rows_by_strip_grouped<R + 1, Source>...};
}

template <class Source>
constexpr auto kGroupedFns =
    grouped_table<Source>(std::make_integer_sequence<int, kGroupedRows>{});
#endif

#ifdef TRIO_AMX
// The tiles of a pass over a strip of 32 outputs: C 0, 1 (rows 0..15, outputs 0..15 and 16..31)
// and C 2, 3 (rows 16..31), A 4 and 5 (those rows' 32 inputs), B 6 and 7 (the strip's two halves
// of 16 outputs). Each B tile is read once for both A tiles and each A tile once for both B
// tiles: four products a pair of loads, where one A tile per pass left the tiles waiting on
// their loads and on each other's sums. The configuration changes only with a pass's rows; the
// thread's own is put back when the call's tiles go (`SavedTiles`).
class Tiles {
 public:
  explicit Tiles(bool on) {
    if (on) saved_.emplace();
  }

  void shape(int rows) {
    if (rows == rows_) return;
    rows_ = rows;
    TileConfig cfg;
    const auto a = static_cast<uint8_t>(std::min(rows, 16)), b = static_cast<uint8_t>(rows - a);
    for (int t : {0, 1, 4}) cfg.rows[t] = a, cfg.colsb[t] = 64;
    if (b > 0)
      for (int t : {2, 3, 5}) cfg.rows[t] = b, cfg.colsb[t] = 64;
    for (int t : {6, 7}) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
  }

 private:
  std::optional<SavedTiles> saved_;
  int rows_ = 0;
};

// Rows [0, 16) (kTwo: [0, 32)) of x, `ldx` apart, as the tiles are shaped, by a strip of bf16
// pairs [K / 2][32][2]: out[r][0..32), float32. Each chunk of 32 inputs is one `tdpbf16ps` into
// one accumulator an output, whichever tile holds the row, so the row's sums never depend on
// the pass's rows.
template <bool kTwo>
void strip_pass_amx(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K, float* out) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kTwo) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k = 0; k < K; k += 32) {
    _tile_loadd(6, w + k * kStrip, 128);
    _tile_loadd(7, w + k * kStrip + 32, 128);
    _tile_loadd(4, x + k, ldx * 2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kTwo) {
      _tile_loadd(5, x + 16 * ldx + k, ldx * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 16, 128);
  if constexpr (kTwo) {
    _tile_stored(2, out + 16 * kStrip, 128);
    _tile_stored(3, out + 16 * kStrip + 16, 128);
  }
}

// Float32 sums [rows][32] to bf16 outputs: row r's first `width` into out + r * ldo. The tiles
// flush denormals, so `vcvtne2ps2bf16` rounds as `round_bf16` does (nearest even).
void emit_amx(const float* acc, int64_t rows, int64_t width, uint16_t* out, int64_t ldo) {
  const __mmask32 keep = width >= 32 ? ~__mmask32{0} : (__mmask32{1} << width) - 1;
  for (int64_t r = 0; r < rows; ++r) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(acc + r * kStrip + 16),
                                           _mm512_loadu_ps(acc + r * kStrip));
    _mm512_mask_storeu_epi16(out + r * ldo, keep, reinterpret_cast<const __m512i&>(v));
  }
}

// Rows [0, M) of x (K inputs each) by a strip on the tiles, in passes of up to 32 rows, each
// row's first `width` outputs rounded into out (`ldo` apart); `acc` holds a pass's sums.
void rows_by_strip_amx(Tiles& tiles, const uint16_t* x, int64_t M, int64_t K, const uint16_t* w,
                       int64_t width, uint16_t* out, int64_t ldo, float* acc) {
  for (int64_t m = 0; m < M; m += kAmxRows) {
    const int64_t rows = std::min(kAmxRows, M - m);
    tiles.shape(static_cast<int>(rows));
    if (rows > 16) strip_pass_amx<true>(x + m * K, K, w, K, acc);
    else strip_pass_amx<false>(x + m * K, K, w, K, acc);
    emit_amx(acc, rows, width, out + m * ldo, ldo);
  }
}
#endif

using RowsFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*);

template <int... R>
constexpr std::array<RowsFn, sizeof...(R)> table(std::integer_sequence<int, R...>) {
  return {&rows_by_strip<R + 1>...};
}

constexpr auto kRowsFns = table(std::make_integer_sequence<int, kRows>{});

}  // namespace

// x [M, K] bf16 by the packed weight: [M, N] bf16 (N: the unpadded outputs).
torch::Tensor int4_linear(const torch::Tensor& x, const torch::Tensor& packed,
                          const torch::Tensor& scales, const torch::Tensor& zeros, int64_t group,
                          int64_t N, bool allow_amx) {
  bool use_amx = false;
#ifdef TRIO_AMX
  use_amx = allow_amx && x.size(1) % 32 == 0 && amx_permitted();
#endif
  TORCH_CHECK(x.dtype() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x: contiguous [M, K] bf16");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t strips = packed.size(0), groups = K / group;
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) * 2 == K &&
                  (packed.size(2) == kStrip || packed.size(2) == 2 * kStrip),
              "packed: [strips, K / 2, 32] (4 bits) or [strips, K / 2, 64] (8 bits) uint8");
  TORCH_CHECK(K % group == 0 && group % 2 == 0 && N <= strips * kStrip, "shapes");
  for (const auto* t : {&scales, &zeros})
    TORCH_CHECK(t->dtype() == torch::kBFloat16 && t->is_contiguous() &&
                    t->numel() == strips * groups * kStrip,
                "scales, zeros: contiguous [strips, K / group, 32] bf16");
  const bool eight = packed.size(2) == 2 * kStrip;
  auto out = torch::empty({M, N}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const auto* qp = packed.data_ptr<uint8_t>();
  const auto* sp = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::BFloat16>());
  const auto* zp = reinterpret_cast<const uint16_t*>(zeros.data_ptr<at::BFloat16>());
  const int64_t strip_bytes = K / 2 * packed.size(2);
#ifdef TRIO_AVX512_BF16
  const bool grouped = !use_amx;
  std::vector<float> xsum;
  if (grouped) {
    xsum.resize(M * groups);
    group_sums(xp, M, K, group, xsum.data());
  }
#else
  const bool grouped = false;
#endif
  at::parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> buf;
    std::vector<float> acc(kAmxRows * kStrip);
#ifdef TRIO_AMX
    Tiles tiles(use_amx);
#endif
    const int64_t block = grouped ? kGroupedRows : kRows;
    for (int64_t s = begin; s < end; ++s) {
      const uint8_t* strip = qp + s * strip_bytes;
      const uint16_t* sc = sp + s * groups * kStrip;
      const uint16_t* zr = zp + s * groups * kStrip;
      const int64_t width = std::min<int64_t>(kStrip, N - s * kStrip);
      auto emit = [&](int64_t m, int64_t rows) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < width; ++j)
            op[(m + r) * N + s * kStrip + j] = round_bf16(acc[r * kStrip + j]);
      };
#ifdef TRIO_AVX512_BF16
      if (grouped && M <= kGroupedRows) {  // one pass: straight from the packing
        if (eight) {
          const From8Bits w{reinterpret_cast<const int8_t*>(strip)};
          kGroupedFns<From8Bits>[M - 1](xp, K, w, sc, zr, xsum.data(), K, group, acc.data());
        } else {
          const From4Bits w(strip);
          kGroupedFns<From4Bits>[M - 1](xp, K, w, sc, zr, xsum.data(), K, group, acc.data());
        }
        emit(0, M);
        continue;
      }
#endif
      buf.resize(K * kStrip);
#ifdef TRIO_AVX512_BF16
      if (grouped && eight) unpack_strip(From8Bits{reinterpret_cast<const int8_t*>(strip)}, K, buf.data());
      else if (grouped) unpack_strip(From4Bits(strip), K, buf.data());
      else
#endif
      (eight ? dequantize_strip<true> : dequantize_strip<false>)(qp, sp, zp, s, K, group,
                                                                 buf.data());
#ifdef TRIO_AMX
      if (use_amx) {
        rows_by_strip_amx(tiles, xp, M, K, buf.data(), width, op + s * kStrip, N, acc.data());
        continue;
      }
#endif
      for (int64_t m = 0; m < M; m += block) {
        const int64_t rows = std::min<int64_t>(block, M - m);
#ifdef TRIO_AVX512_BF16
        if (grouped)
          kGroupedFns<FromBuffer>[rows - 1](xp + m * K, K, FromBuffer{buf.data()}, sc, zr,
                                            xsum.data() + m * groups, K, group, acc.data());
        else
#endif
        kRowsFns[rows - 1](xp + m * K, K, buf.data(), K, acc.data());
        emit(m, rows);
      }
    }
  });
  return out;
}

// x [M, K] bf16 by a bf16 weight already in the dequantized strips' layout (`bf16_rows.py`:
// [strips, K / 2, 32, 2]): [M, N] bf16. The same pass over a strip as the quantized weights'
// dequantized path, one `vdpbf16ps` chain an output, so a row's result does not depend on the
// call's rows; a lone row reads each weight once, straight from memory. With `allow_amx`, where
// AMX is permitted and K is a multiple of 32, every call runs on the tiles instead
// (`strip_pass_amx`), straight from the same layout: as fast for a lone row and 3-10x as fast
// from 8 rows on (an AMX Xeon, where the `vdpbf16ps` chains lost to oneDNN from 8 rows on), and
// row-exact too, since a weight's calls all take the tiles whatever their rows.
torch::Tensor bf16_linear(const torch::Tensor& x, const torch::Tensor& strips, int64_t N,
                          bool allow_amx) {
  TORCH_CHECK(x.dtype() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x: contiguous [M, K] bf16");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(strips.dtype() == torch::kBFloat16 && strips.is_contiguous() && strips.dim() == 2 &&
                  strips.size(1) == K * kStrip && K % 2 == 0 && N <= strips.size(0) * kStrip,
              "strips: contiguous [strips, K * 32] bf16, K even");
  bool use_amx = false;
#ifdef TRIO_AMX
  use_amx = allow_amx && K % 32 == 0 && amx_permitted();
#endif
  auto out = torch::empty({M, N}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(strips.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  at::parallel_for(0, strips.size(0), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(kAmxRows * kStrip);
#ifdef TRIO_AMX
    Tiles tiles(use_amx);
#endif
    for (int64_t s = begin; s < end; ++s) {
      const int64_t width = std::min<int64_t>(kStrip, N - s * kStrip);
      const uint16_t* w = wp + s * K * kStrip;
#ifdef TRIO_AMX
      if (use_amx) {
        rows_by_strip_amx(tiles, xp, M, K, w, width, op + s * kStrip, N, acc.data());
        continue;
      }
#endif
      for (int64_t m = 0; m < M; m += kRows) {
        const int64_t rows = std::min<int64_t>(kRows, M - m);
        kRowsFns[rows - 1](xp + m * K, K, w, K, acc.data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < width; ++j)
            op[(m + r) * N + s * kStrip + j] = round_bf16(acc[r * kStrip + j]);
      }
    }
  });
  return out;
}

// Which instructions compute the sums here: "amx", "avx512_bf16" or "generic".
std::string path(bool allow_amx) {
#ifdef TRIO_AMX
  if (allow_amx && amx_permitted()) return "amx";
#endif
#ifdef TRIO_AVX512_BF16
  return "avx512_bf16";
#else
  return "generic";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_linear", &int4_linear, "bf16 rows by 4-bit weights, row-exact at any row count");
  m.def("bf16_linear", &bf16_linear, "bf16 rows by a bf16 weight's strips, row-exact");
  m.def("path", &path, "which instructions compute the sums on this machine");
}
