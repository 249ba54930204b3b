// A matmul of bf16 activations by 4-bit (or 8-bit) weights whose every output row is computed the same
// way whatever the number of rows in the call: the quantized matmul of a batch-invariant
// engine (engine/ops/int4_rows.py).
//
// Why a kernel of our own: torch's int4 kernel is row-exact but dequantizes a weight tile for
// every few rows, so a decode batch of 32 costs 4x oneDNN's bf16 matmul; oneDNN is fast for a
// batch but reads bf16 weights for a lone stream, and the two sum a row's products in
// different orders, so an engine that picks one by row count is not batch-invariant. Here a
// strip of 32 outputs is dequantized once into bf16 pairs (the layout AVX512-BF16's dot
// product reads) and every row of the call is multiplied by it: a lone row pays one
// dequantization of 4-bit weights, a batch shares it.
//
// A row's sums: for each output, one float32 accumulator takes the input pairs (k, k + 1) in
// order from k = 0, then is rounded once to bf16. Where the CPU has AMX, tiles of 16 rows by
// 32 inputs take each chunk of 32 inputs in one `tdpbf16ps` (a tile's rows are computed
// apart: a call of fewer rows configures shorter tiles, never another order); else
// `vdpbf16ps` takes one pair at a time; else a float32 multiply-add per product. No blocking
// over rows changes that sequence, so a row's result depends on the row and the weight alone.
//
// Layout (`int4_pack`): the weight is padded to whole strips of 32 outputs; for strip s and
// input pair p, 32 bytes whose byte j holds output 32 s + j's weights 2 p (low nibble) and
// 2 p + 1 (high nibble). Each group of `group` inputs has a float32 scale and offset per
// output: w = q * scale + offset (q in 0..15), computed in float32 and rounded to bf16. An
// 8-bit weight (`dequantize_strip8`) is the same with signed bytes, two per output a pair.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define TRIO_AVX512_BF16 1
#endif

namespace {

constexpr int64_t kStrip = 32;  // outputs a strip
constexpr int64_t kRows = 12;   // rows a pass over a strip (24 float32 accumulators)

inline uint16_t round_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even, as vcvtne2ps2bf16 does
  return static_cast<uint16_t>(bits >> 16);
}

inline float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

// Strip `s` of the weight dequantized into `buf`: [K / 2][32 outputs][2] bf16.
void dequantize_strip(const uint8_t* packed, const float* scales, const float* offsets,
                      int64_t s, int64_t K, int64_t group, uint16_t* buf) {
  const int64_t pairs = K / 2, groups = K / group;
  const uint8_t* q = packed + s * pairs * kStrip;
  const float* sc = scales + s * groups * kStrip;
  const float* of = offsets + s * groups * kStrip;
#ifdef TRIO_AVX512_BF16
  const __m512i lo_idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i hi_idx =
      _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  for (int64_t g = 0; g < groups; ++g) {
    __m512 scale[4], offset[4];
    for (int h = 0; h < 2; ++h) {
      const __m512 s16 = _mm512_loadu_ps(sc + g * kStrip + 16 * h);
      const __m512 o16 = _mm512_loadu_ps(of + g * kStrip + 16 * h);
      scale[2 * h] = _mm512_permutexvar_ps(lo_idx, s16);
      scale[2 * h + 1] = _mm512_permutexvar_ps(hi_idx, s16);
      offset[2 * h] = _mm512_permutexvar_ps(lo_idx, o16);
      offset[2 * h + 1] = _mm512_permutexvar_ps(hi_idx, o16);
    }
    for (int64_t p = g * group / 2; p < (g + 1) * group / 2; ++p) {
      for (int h = 0; h < 2; ++h) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + p * kStrip + 16 * h));
        const __m128i even = _mm_and_si128(v, nibble);
        const __m128i odd = _mm_and_si128(_mm_srli_epi16(v, 4), nibble);
        const __m128i a = _mm_unpacklo_epi8(even, odd);  // outputs 0..7, (k, k + 1) each
        const __m128i b = _mm_unpackhi_epi8(even, odd);  // outputs 8..15
        const __m512 wa = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(a)),
                                          scale[2 * h], offset[2 * h]);
        const __m512 wb = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)),
                                          scale[2 * h + 1], offset[2 * h + 1]);
        const __m512bh w = _mm512_cvtne2ps_pbh(wb, wa);
        _mm512_storeu_si512(buf + p * 2 * kStrip + 32 * h, reinterpret_cast<const __m512i&>(w));
      }
    }
  }
#else
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t g = 2 * p / group;
    for (int64_t j = 0; j < kStrip; ++j) {
      const uint8_t byte = q[p * kStrip + j];
      const float scale = sc[g * kStrip + j], offset = of[g * kStrip + j];
      buf[p * 2 * kStrip + 2 * j] = round_bf16(static_cast<float>(byte & 15) * scale + offset);
      buf[p * 2 * kStrip + 2 * j + 1] = round_bf16(static_cast<float>(byte >> 4) * scale + offset);
    }
  }
#endif
}

// Strip `s` of an 8-bit weight (`int8_pack`: for pair p, 64 signed bytes, output j's inputs
// 2 p and 2 p + 1 at 2 j and 2 j + 1) dequantized into `buf` as dequantize_strip does.
void dequantize_strip8(const uint8_t* packed, const float* scales, const float* offsets,
                       int64_t s, int64_t K, int64_t group, uint16_t* buf) {
  const int64_t pairs = K / 2, groups = K / group;
  const int8_t* q = reinterpret_cast<const int8_t*>(packed) + s * pairs * 2 * kStrip;
  const float* sc = scales + s * groups * kStrip;
  const float* of = offsets + s * groups * kStrip;
#ifdef TRIO_AVX512_BF16
  const __m512i lo_idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i hi_idx =
      _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  for (int64_t g = 0; g < groups; ++g) {
    __m512 scale[4], offset[4];
    for (int h = 0; h < 2; ++h) {
      const __m512 s16 = _mm512_loadu_ps(sc + g * kStrip + 16 * h);
      const __m512 o16 = _mm512_loadu_ps(of + g * kStrip + 16 * h);
      scale[2 * h] = _mm512_permutexvar_ps(lo_idx, s16);
      scale[2 * h + 1] = _mm512_permutexvar_ps(hi_idx, s16);
      offset[2 * h] = _mm512_permutexvar_ps(lo_idx, o16);
      offset[2 * h + 1] = _mm512_permutexvar_ps(hi_idx, o16);
    }
    for (int64_t p = g * group / 2; p < (g + 1) * group / 2; ++p) {
      for (int h = 0; h < 2; ++h) {
        const int8_t* row = q + p * 2 * kStrip + 32 * h;
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16));
        const __m512 wa = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a)),
                                          scale[2 * h], offset[2 * h]);
        const __m512 wb = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)),
                                          scale[2 * h + 1], offset[2 * h + 1]);
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
      const float value = static_cast<float>(q[p * 2 * kStrip + e]);
      buf[p * 2 * kStrip + e] = round_bf16(value * sc[g * kStrip + j] + of[g * kStrip + j]);
    }
  }
#endif
}

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
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + 2 * p, sizeof pair);
      const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
    }
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


#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#define TRIO_AMX 1

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0, 1: C for outputs 0..15 and 16..31; 2: A (R rows x 32 inputs); 3, 4: B.
void configure(int rows) {
  TileConfig cfg;
  for (int t = 0; t < 5; ++t) cfg.colsb[t] = 64;
  cfg.rows[0] = cfg.rows[1] = cfg.rows[2] = static_cast<uint8_t>(rows);
  cfg.rows[3] = cfg.rows[4] = 16;
  _tile_loadconfig(&cfg);
}

// The tile configuration found on this thread, put back when the call ends: torch's own AMX
// kernels (oneDNN's brgemm under SDPA's flash kernel) may keep theirs configured between
// calls and skip configuring it again.
class SavedTiles {
 public:
  SavedTiles() { _tile_storeconfig(&saved_); }
  ~SavedTiles() {
    if (saved_.palette == 0) _tile_release();
    else _tile_loadconfig(&saved_);
  }

 private:
  TileConfig saved_;
};

bool amx_permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
  return ok;
}

void rows_by_strip_amx(const uint16_t* x, int64_t ldx, int rows, const uint16_t* buf, int64_t K,
                       float* out) {
  configure(rows);
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t k = 0; k < K; k += 32) {
    _tile_loadd(2, x + k, ldx * 2);
    _tile_loadd(3, buf + k * kStrip, 128);
    _tile_loadd(4, buf + k * kStrip + 32, 128);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 16, 128);
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
                          const torch::Tensor& scales, const torch::Tensor& offsets,
                          int64_t group, int64_t N, bool allow_amx) {
  bool use_amx = false;
#ifdef TRIO_AMX
  use_amx = allow_amx && x.size(1) % 32 == 0 && amx_permitted();
#endif
  TORCH_CHECK(x.dtype() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "x: contiguous [M, K] bf16");
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t strips = packed.size(0);
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) * 2 == K &&
                  (packed.size(2) == kStrip || packed.size(2) == 2 * kStrip),
              "packed: [strips, K / 2, 32] (4 bits) or [strips, K / 2, 64] (8 bits) uint8");
  const bool eight = packed.size(2) == 2 * kStrip;
  TORCH_CHECK(K % group == 0 && group % 2 == 0 && N <= strips * kStrip, "shapes");
  auto out = torch::empty({M, N}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const auto* qp = packed.data_ptr<uint8_t>();
  const auto* sp = scales.data_ptr<float>();
  const auto* fp = offsets.data_ptr<float>();
  at::parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> buf(K * kStrip);
    std::vector<float> acc(16 * kStrip);
#ifdef TRIO_AMX
    std::optional<SavedTiles> saved;
    if (use_amx) saved.emplace();
#endif
    const int64_t block = use_amx ? 16 : kRows;
    for (int64_t s = begin; s < end; ++s) {
      (eight ? dequantize_strip8 : dequantize_strip)(qp, sp, fp, s, K, group, buf.data());
      const int64_t width = std::min<int64_t>(kStrip, N - s * kStrip);
      for (int64_t m = 0; m < M; m += block) {
        const int64_t rows = std::min<int64_t>(block, M - m);
#ifdef TRIO_AMX
        if (use_amx) rows_by_strip_amx(xp + m * K, K, static_cast<int>(rows), buf.data(), K, acc.data());
        else
#endif
        kRowsFns[rows - 1](xp + m * K, K, buf.data(), K, acc.data());
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
  m.def("path", &path, "which instructions compute the sums on this machine");
}
