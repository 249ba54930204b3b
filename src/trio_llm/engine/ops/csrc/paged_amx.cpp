// Attention over the paged KV cache in place on AMX tiles, for bf16 caches: the queries of a
// step (decodes, and prefill queries laid out as decodes of their own positions) scored and
// summed by `tdpbf16ps`, a flash-attention loop over 128-key chunks of each sequence.
//
// Why a second kernel beside paged_decode.cpp: that one widens every key and value to float32
// and sums in vector lanes, which is right for a decode's one query a head but leaves a prefill
// at the speed of vector FMAs: a 2,000-token prompt spent half its time in SDPA's flash kernel,
// and with batch invariance (every query a decode) a third in the float kernel. AMX tiles do
// the products 16 rows at a time; what is left is the softmax in lanes.
//
// Why it keeps batch invariance: a row of an AMX product depends on its own A row and the B
// tile alone (the instruction's order of sums is fixed per element), so a query's scores are
// the same bits in a tile of 1 row or of 16. The keys come in chunks of 128 aligned to position
// 0 of the sequence, each chunk folded into the running softmax (max, sum, values) by the same
// operations for every row, and positions at or past a row's context length count for exactly
// nothing (their probability is 0, not a tiny number). So a query's result depends on its own
// context alone: a decode, a prefill chunk of any size and any batch give the same bits, and
// decodes and prefill queries may share this kernel under invariance. The probabilities enter
// the values' product rounded to bf16, as SDPA's flash kernel takes them, or, asked (`split`,
// as batch invariance asks, whose quantized matmuls already round activations to int8), as two
// bf16 parts, the rounded value and what the rounding left: 16 bits where one bf16 keeps 8.
// The softmax's sum is taken over the same parts, so the weights that are summed are the
// weights that are normalized.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "amx.h"
#include "bf16.h"
#include "lanes.h"
#include "paged.h"

namespace {

constexpr int64_t kKeys = 128;    // keys a chunk: one softmax update per row per chunk
constexpr int64_t kRows = 16;     // rows of a tile (query heads of a tile's queries)
constexpr int64_t kRun = 64;      // queries of one sequence sharing the chunks they read, at most
constexpr int64_t kMaxDim = 256;  // head sizes: multiples of 32 up to this
constexpr int64_t kMaxHeads = 16;  // KV heads a task packs together, at most

// The kernel builds where the compiler targets AVX512-BF16 (every AMX CPU has it too): the
// products on AMX tiles where the build targets them, else on `vdpbf16ps` in vector lanes.
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define TRIO_BF16_DOT 1
#endif

#ifdef TRIO_BF16_DOT

#ifdef TRIO_AMX
// Every tile rows of 64 bytes: 0-3 accumulators (scores of 16 keys, or values of 16 head
// dimensions) and 4 an A tile (queries, or probabilities), `rows` rows each (a tile's rows of
// queries); 5-7 B tiles (keys, or values), 16 rows (32 inputs). Tiles are not renamed, so a
// load into a tile waits for the product that reads it, and three B tiles let three loads run
// ahead of their products. A product's row depends on its own A row alone, so how many rows a
// tile has changes no row's bits; a decode's tile has as many rows as query heads share a KV
// head (3 on the default model), and 16 rows cost it 5 times the products and stores.
void configure(int64_t rows) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = t < 5 ? rows : kRows;
  _tile_loadconfig(&cfg);
}
#endif  // TRIO_AMX

// A 16 x 16 matrix of 32-bit elements transposed in registers (rows in, columns out): four
// rounds of unpacks and lane shuffles.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// One chunk of a sequence's keys and values for KV heads [g0, g1), each head's packed as AMX's
// B tiles want them (and `vdpbf16ps` its second operand). Keys: for key block kb (16 keys) and
// input chunk dk (32 dimensions), row i holds the pair of dimensions (2i, 2i + 1) of each of
// the 16 keys. Values: for key half kh (32 keys) and output block db (16 dimensions), row i
// holds the pair of keys (2i, 2i + 1) of each dimension. Positions at or past `end` are zeros,
// so that a probability of 0 times them is 0. Head h's keys go to kp + (h - g0) * kstride,
// its values to vp + (h - g0) * vstride.
//
// Why all of a task's heads at once: a head's part of a cache row is a third of the row on the
// default model, and reading the whole row in one pass lets the hardware stream it; packing
// head by head made a 32-sequence decode's attention 1.15-1.25x as long (an AMD EPYC).
void pack_chunk(const uint16_t* kc, const uint16_t* vc, const Shape& s, const int64_t* table,
                int64_t g0, int64_t g1, int64_t c, int64_t end, uint32_t* kp, int64_t kstride,
                uint16_t* vp, int64_t vstride) {
  const int64_t dim = s.dim, dks = dim / 32, dbs = dim / 16;
  const int64_t valid = std::min(kKeys, end - c);
  const uint16_t* krow[kKeys];
  const uint16_t* vrow[kKeys];
  alignas(64) static thread_local uint16_t zeros[kMaxHeads * kMaxDim] = {};
  for (int64_t n = 0; n < kKeys; ++n) {
    if (n < valid) {
      const int64_t at = s.slot(table, c + n) + g0 * dim;
      krow[n] = kc + at;
      vrow[n] = vc + at;
    } else {
      krow[n] = vrow[n] = zeros;
    }
  }
  for (int64_t kb = 0; kb < kKeys / 16; ++kb) {
    for (int64_t h = 0; h < g1 - g0; ++h) {
      for (int64_t dk = 0; dk < dks; ++dk) {
        __m512i r[16];
        for (int i = 0; i < 16; ++i)
          r[i] = _mm512_loadu_si512(krow[kb * 16 + i] + h * dim + dk * 32);
        transpose16(r);
        uint32_t* out = kp + h * kstride + (kb * dks + dk) * 256;
        for (int i = 0; i < 16; ++i) _mm512_storeu_si512(out + i * 16, r[i]);
      }
    }
  }
  // Output block j of a pair of value rows a, b: [a(16j) b(16j) a(16j+1) b(16j+1) ...] from
  // a's and b's 32 dimensions at a time (`permutex2var` takes a from lanes 0-31, b from 32-63).
  __m512i zip[2];
  for (int j = 0; j < 2; ++j) {
    alignas(64) uint16_t idx[32];
    for (int i = 0; i < 16; ++i) idx[2 * i] = 16 * j + i, idx[2 * i + 1] = 32 + 16 * j + i;
    zip[j] = _mm512_load_si512(idx);
  }
  for (int64_t n = 0; n < kKeys; n += 2) {
    const int64_t kh = n / 32, i = (n % 32) / 2;
    for (int64_t h = 0; h < g1 - g0; ++h) {
      for (int64_t d0 = 0; d0 < dim; d0 += 32) {
        const __m512i a = _mm512_loadu_si512(vrow[n] + h * dim + d0);
        const __m512i b = _mm512_loadu_si512(vrow[n + 1] + h * dim + d0);
        for (int j = 0; j < 2; ++j) {
          const int64_t db = d0 / 16 + j;
          _mm512_storeu_si512(vp + h * vstride + ((kh * dbs + db) * 16 + i) * 32,
                              _mm512_permutex2var_epi16(a, zip[j], b));
        }
      }
    }
  }
}

// The next chunk's cache rows, asked for a few lines at a time from inside the current chunk's
// arithmetic (`pump` in the scores', softmax's and values' loops), so that reading the cache
// overlaps the work. A sequence's blocks lie anywhere in the cache, so the hardware prefetcher
// loses the stream at every block boundary; and asking for a whole chunk at once (98 KiB on the
// default model) filled the core's queue of misses and stalled it until the chunk had arrived:
// 8 decodes at 1,800 positions on one thread of an AMD EPYC read the cache at 9 GB/s, where the
// same work with the caches already in L3 ran at 24 GB/s, as if reading and arithmetic took
// turns. Spread out, the two overlap: 0.56-0.73x the time of a decode step's attention
// (bench/results/paged_attention_ahead_epyc.md).
class Ahead {
 public:
  // The chunk at position c of the sequence (rows at or past `end` are not read), KV heads
  // [g0, g1), spread over about `sites` calls of `pump`.
  void start(const uint16_t* kc, const uint16_t* vc, const Shape& s, const int64_t* table,
             int64_t g0, int64_t g1, int64_t c, int64_t end, int64_t sites) {
    kc_ = reinterpret_cast<const char*>(kc);
    vc_ = reinterpret_cast<const char*>(vc);
    table_ = table;
    offset_ = g0 * s.dim * 2;
    block_bytes_ = s.block_stride * 2;
    row_bytes_ = s.token_stride * 2;
    block_size_ = s.block_size;
    keys_ = std::clamp<int64_t>(end - c, 0, kKeys);
    lines_ = ((g1 - g0) * s.dim * 2 + 63) / 64;
    key_ = line_ = 0;
    if (keys_ > 0) {
      block_ = c / block_size_;
      in_block_ = c % block_size_;
      at_ = table_[block_] * block_bytes_ + in_block_ * row_bytes_ + offset_;
    }
    per_ = std::max<int64_t>(1, (keys_ * lines_ * 2 + sites - 1) / std::max<int64_t>(sites, 1));
  }

  // About one share of the chunk's lines: each a line of keys and the same line of values.
  __attribute__((always_inline)) void pump() {
    for (int64_t asked = 0; asked < per_ && key_ < keys_; asked += 2) {
      __builtin_prefetch(kc_ + at_ + line_ * 64);
      __builtin_prefetch(vc_ + at_ + line_ * 64);
      if (++line_ < lines_) continue;
      line_ = 0;
      ++key_;
      if (++in_block_ < block_size_) {
        at_ += row_bytes_;
      } else if (key_ < keys_) {
        in_block_ = 0;
        at_ = table_[++block_] * block_bytes_ + offset_;
      }
    }
  }

  // Whatever is left, before the chunk is read.
  void finish() {
    per_ = keys_ * lines_ * 2;
    pump();
  }

 private:
  const char* kc_ = nullptr;
  const char* vc_ = nullptr;
  const int64_t* table_ = nullptr;
  int64_t offset_ = 0, block_bytes_ = 0, row_bytes_ = 0, block_size_ = 1;
  int64_t keys_ = 0, lines_ = 0, key_ = 0, line_ = 0, block_ = 0, in_block_ = 0, at_ = 0;
  int64_t per_ = 1;
};

// The per-row state of a tile: the running max, the running sum of the (rounded) probabilities
// and the float32 value sums, and the row's output and context length. The sum is kept in 16
// lanes a row and added across them once, at the end: a horizontal sum per row and chunk was a
// chain of four shuffles and adds that the softmax waited on (a tenth of a prompt's kernel).
struct Tile {
  int64_t rows = 0;
  uint16_t* out[kRows] = {};
  int64_t len[kRows] = {};
  float m[kRows], alpha[kRows];
  alignas(64) float l[kRows * 16];  // each row's running sum, in lanes
  alignas(64) uint16_t qbuf[kRows * kMaxDim];
  alignas(64) float acc[kRows * kMaxDim];
  // One chunk's scores, probabilities (bf16) and values' sums.
  alignas(64) float scores[kRows * kKeys];
  alignas(64) uint16_t probs[kRows * kKeys];     // each probability rounded to bf16
  alignas(64) uint16_t residues[kRows * kKeys];  // and what that rounding left, in bf16
  alignas(64) float values[kRows * kMaxDim];
};

inline Lanes vmax(Lanes a, Lanes b) { return a > b ? a : b; }

inline float hmax(Lanes a) {
  a = vmax(a, __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  a = vmax(a, __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3));
  a = vmax(a, __builtin_shufflevector(a, a, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1));
  a = vmax(a, __builtin_shufflevector(a, a, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0));
  return a[0];
}

// Lanes rounded to bf16 by `vcvtneps2bf16` (nearest even, as AMX reads bf16: a denormal is
// zero), and those bf16 widened back to floats.
inline __m256i bf16_bits(Lanes x) {
  __m512 v;
  std::memcpy(&v, &x, sizeof v);
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
}

inline Lanes widen_bits(__m256i bits) {
  const __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16);
  Lanes out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

// A chunk of keys folded into a tile's rows in three passes, each over every tile of a task
// before the next (`run_heads`): an AMX tile load of data that vector stores just wrote waits
// for them to reach the cache, and the other tiles' work fills that wait.

#ifdef TRIO_AMX
// Scores by AMX: tiles 0-3 take four key blocks of 16 at a time, each summed over the input
// chunks in order.
void scores_of(Tile& t, const Shape& s, const uint32_t* kp, Ahead& ahead) {
  const int64_t dim = s.dim, dks = dim / 32;
  for (int64_t kb = 0; kb < kKeys / 16; kb += 4) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t dk = 0; dk < dks; ++dk) {
      ahead.pump();
      _tile_loadd(4, t.qbuf + dk * 32, dim * 2);
      _tile_loadd(5, kp + ((kb + 0) * dks + dk) * 256, 64);
      _tile_loadd(6, kp + ((kb + 1) * dks + dk) * 256, 64);
      _tile_loadd(7, kp + ((kb + 2) * dks + dk) * 256, 64);
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 6);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, kp + ((kb + 3) * dks + dk) * 256, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, t.scores + kb * 16, kKeys * 4);
    _tile_stored(1, t.scores + kb * 16 + 16, kKeys * 4);
    _tile_stored(2, t.scores + kb * 16 + 32, kKeys * 4);
    _tile_stored(3, t.scores + kb * 16 + 48, kKeys * 4);
  }
}

#else
// The same products in vector lanes where AMX is absent (AVX512-BF16's `vdpbf16ps`: a lane
// adds two bf16 products to its float32 sum). A chunk's packed keys are already what the
// instruction takes as its second operand (a vector holds one pair of dimensions of 16 keys),
// and a row's query pair is broadcast. A score is one chain of `vdpbf16ps` over the pairs in
// order, whichever rows share its registers, so a row's bits do not depend on its tile.
template <typename T>
inline __m512bh as_bh(T v) {
  return (__m512bh)v;
}

// Rows [r0, r0 + R) against 64 keys (four blocks of 16) from block kb: 4R sums in registers.
// Never inlined (nor `value_rows`): where GCC inlined some of them into their callers, by
// choices that moved with unrelated edits, a prompt's attention took 1.3x as long.
template <int R>
__attribute__((noinline)) void score_rows(Tile& t, int64_t r0, int64_t kb, int64_t dks,
                                          const uint32_t* kp, int64_t dim, Ahead& ahead) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  const auto* q = reinterpret_cast<const uint32_t*>(t.qbuf) + r0 * dim / 2;
  for (int64_t dk = 0; dk < dks; ++dk) {
    ahead.pump();
    for (int64_t i = 0; i < 16; ++i) {
      __m512i b[4];
      for (int j = 0; j < 4; ++j)
        b[j] = _mm512_loadu_si512(kp + ((kb + j) * dks + dk) * 256 + i * 16);
      for (int r = 0; r < R; ++r) {
        const __m512i a = _mm512_set1_epi32(static_cast<int>(q[r * dim / 2 + dk * 16 + i]));
        for (int j = 0; j < 4; ++j)
          acc[r][j] = _mm512_dpbf16_ps(acc[r][j], as_bh(a), as_bh(b[j]));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j)
      _mm512_storeu_ps(t.scores + (r0 + r) * kKeys + (kb + j) * 16, acc[r][j]);
}

// Rows in groups of up to six (24 sums, four key vectors and a broadcast: 29 of 32 registers).
template <int R, typename F>
inline void by_rows(int64_t rows, F&& f) {
  int64_t r0 = 0;
  for (; r0 + R <= rows; r0 += R) f(std::integral_constant<int, R>{}, r0);
  const int64_t left = rows - r0;
  if (left == 0) return;
  if (left == 1) f(std::integral_constant<int, 1>{}, r0);
  else if (left == 2) f(std::integral_constant<int, 2>{}, r0);
  else if (left == 3) f(std::integral_constant<int, 3>{}, r0);
  else if (left == 4) f(std::integral_constant<int, 4>{}, r0);
  else f(std::integral_constant<int, 5>{}, r0);
}

void scores_of(Tile& t, const Shape& s, const uint32_t* kp, Ahead& ahead) {
  const int64_t dim = s.dim, dks = dim / 32;
  for (int64_t kb = 0; kb < kKeys / 16; kb += 4)
    by_rows<6>(t.rows, [&](auto R, int64_t r0) {
      score_rows<R.value>(t, r0, kb, dks, kp, dim, ahead);
    });
}
#endif  // TRIO_AMX

// 2^x of 16 floats (x <= 0): 2^round(x) times a polynomial of the rest (Taylor's, relative
// error under 5e-5 at degree 4, enough for weights rounded to bf16, under 1e-7 at degree 6, as
// float32's own rounding). `vscalefps` applies 2^round(x) whatever its size (to 0 far below
// 2^-126), so no clamp and no integer arithmetic on the exponent: seven operations a vector
// where the clamp and the exponent's integer add took thirteen, with the same bits wherever
// 2^x is a normal float (the product of the polynomial and a power of two is exact either way).
template <int Degree>
inline Lanes exp2_lanes(Lanes x) {
  __m512 v;
  std::memcpy(&v, &x, sizeof v);
  const __m512 n = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Lanes whole;
  std::memcpy(&whole, &n, sizeof whole);
  const Lanes f = x - whole;
  Lanes p;
  if constexpr (Degree >= 6) {
    p = Lanes{} + 1.5403530e-4f;
    p = p * f + 1.3333558e-3f;
    p = p * f + 9.6181291e-3f;
  } else {
    p = Lanes{} + 9.6181291e-3f;
  }
  p = p * f + 5.5504109e-2f;
  p = p * f + 2.4022651e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.0f;
  __m512 pv;
  std::memcpy(&pv, &p, sizeof pv);
  const __m512 scaled = _mm512_scalef_ps(pv, n);
  Lanes out;
  std::memcpy(&out, &scaled, sizeof out);
  return out;
}

// The softmax update in lanes, row by row: the new running max, the factor the old sums take
// (`alpha`), the probabilities rounded to bf16 and their sum (in lanes), all in base 2
// (`scale` is the scores' scale times log2(e), so 2^(x - max) is e^(scaled score - max)).
// Positions at or past a row's context length get probability 0; a chunk wholly past it leaves
// the row as it was.
template <bool Split>
void softmax_of(Tile& t, int64_t c, float scale, Ahead& ahead) {
  constexpr int kDegree = Split ? 6 : 4;
  const float ninf = -std::numeric_limits<float>::infinity();
  LanesInt index;
  for (int j = 0; j < 16; ++j) index[j] = j;
  for (int64_t r = 0; r < t.rows; ++r) {
    ahead.pump();
    uint16_t* pr = t.probs + r * kKeys;
    uint16_t* rr = t.residues + r * kKeys;
    const int64_t valid = std::clamp<int64_t>(t.len[r] - c, 0, kKeys);
    t.alpha[r] = 1.0f;
    if (valid == 0) {
      std::memset(pr, 0, kKeys * 2);
      if (Split) std::memset(rr, 0, kKeys * 2);
      continue;
    }
    const bool whole = valid == kKeys;
    constexpr int kVecs = kKeys / 16;
    Lanes x[kVecs];
    LanesInt keep[kVecs];
    Lanes top_lanes = Lanes{} + ninf;
    for (int i = 0; i < kVecs; ++i) {
      x[i] = load_lanes(t.scores + r * kKeys + i * 16);
      if (!whole) {
        keep[i] = (index + i * 16) < static_cast<int32_t>(valid);
        x[i] = keep[i] ? x[i] : Lanes{} + ninf;
      }
      top_lanes = vmax(top_lanes, x[i]);
    }
    // The max of the raw scores, scaled (`scale` > 0, and rounding keeps order); each exponent
    // is then one fused multiply-add from the raw score, not a product and a difference.
    const float top = std::max(t.m[r], hmax(top_lanes) * scale);
    // A max that did not move leaves the sums as they are: 2^0 is exactly 1 (the polynomial's
    // constant term), so the exponential is skipped, not changed.
    t.alpha[r] = t.m[r] == ninf ? 0.0f
                 : t.m[r] == top ? 1.0f
                                 : exp2_lanes<kDegree>(Lanes{} + (t.m[r] - top))[0];
    t.m[r] = top;
    Lanes total{};
    for (int i = 0; i < kVecs; ++i) {
      Lanes e = exp2_lanes<kDegree>(x[i] * scale - top);
      if (!whole) e = keep[i] ? e : Lanes{};
      const __m256i bits = bf16_bits(e);
      const Lanes rounded = widen_bits(bits);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + i * 16), bits);
      total += rounded;
      if constexpr (Split) {
        const __m256i rest = bf16_bits(e - rounded);
        total += widen_bits(rest);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(rr + i * 16), rest);
      }
    }
    const Lanes sum = load_lanes(t.l + r * 16) * t.alpha[r] + total;
    std::memcpy(t.l + r * 16, &sum, sizeof sum);
  }
}

#ifdef TRIO_AMX
// The probabilities times the values by AMX (tiles 0-3 take four output blocks at a time, each
// summed over the key halves in order).
void values_of(Tile& t, const Shape& s, const uint16_t* vp, bool split, Ahead& ahead) {
  const int64_t dim = s.dim, dbs = dim / 16;
  const int parts = split ? 2 : 1;
  const uint16_t* weights[2] = {t.probs, t.residues};
  for (int64_t db0 = 0; db0 < dbs; db0 += 4) {
    const int64_t nb = std::min<int64_t>(4, dbs - db0);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    // Each key quarter twice: the rounded probabilities, then their residues (so the
    // weights carry 16 bits, not bf16's 8; the values are bf16 as the cache holds them).
    for (int64_t kh = 0; kh < kKeys / 32; ++kh) {
      ahead.pump();
      const uint16_t* vb = vp + (kh * dbs + db0) * 512;
      _tile_loadd(5, vb, 64);
      if (nb > 1) _tile_loadd(6, vb + 512, 64);
      if (nb > 2) _tile_loadd(7, vb + 1024, 64);
      for (int part = 0; part < parts; ++part) {
        _tile_loadd(4, weights[part] + kh * 32, kKeys * 2);
        _tile_dpbf16ps(0, 4, 5);
        if (nb > 1) _tile_dpbf16ps(1, 4, 6);
        if (nb > 2) _tile_dpbf16ps(2, 4, 7);
      }
      if (nb > 3) {
        _tile_loadd(5, vb + 1536, 64);
        for (int part = 0; part < parts; ++part) {
          _tile_loadd(4, weights[part] + kh * 32, kKeys * 2);
          _tile_dpbf16ps(3, 4, 5);
        }
      }
    }
    float* vo = t.values + db0 * 16;
    _tile_stored(0, vo, dim * 4);
    if (nb > 1) _tile_stored(1, vo + 16, dim * 4);
    if (nb > 2) _tile_stored(2, vo + 32, dim * 4);
    if (nb > 3) _tile_stored(3, vo + 48, dim * 4);
  }
}

// The calls of `Ahead::pump` a tile of `rows` rows makes per chunk: the scores' and values'
// tile loops and the softmax's rows.
int64_t pump_sites(int64_t rows, int64_t dim) {
  return kKeys / 64 * (dim / 32) + (dim / 16 + 3) / 4 * (kKeys / 32) + rows;
}

#else
// Rows [r0, r0 + R) times output blocks [db0, db0 + 4) of the values: per key quarter and
// pair of keys, the rows' broadcast probability pairs (and their residues, `split`) times the
// values' packed pairs, each sum one chain in the same order whichever rows share it.
template <int R>
__attribute__((noinline)) void value_rows(Tile& t, int64_t r0, int64_t db0, int64_t nb,
                                          int64_t dbs, const uint16_t* vp, int parts,
                                          int64_t dim, Ahead& ahead) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  const uint32_t* weights[2] = {reinterpret_cast<const uint32_t*>(t.probs),
                                reinterpret_cast<const uint32_t*>(t.residues)};
  for (int64_t kh = 0; kh < kKeys / 32; ++kh) {
    ahead.pump();
    for (int64_t i = 0; i < 16; ++i) {
      __m512i b[4];
      for (int j = 0; j < 4; ++j)
        b[j] = j < nb ? _mm512_loadu_si512(vp + ((kh * dbs + db0 + j) * 16 + i) * 32)
                      : _mm512_setzero_si512();
      for (int part = 0; part < parts; ++part) {
        for (int r = 0; r < R; ++r) {
          const uint32_t pair = weights[part][((r0 + r) * kKeys + kh * 32) / 2 + i];
          const __m512i a = _mm512_set1_epi32(static_cast<int>(pair));
          for (int j = 0; j < 4; ++j)
            if (j < nb) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], as_bh(a), as_bh(b[j]));
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < nb; ++j)
      _mm512_storeu_ps(t.values + (r0 + r) * dim + (db0 + j) * 16, acc[r][j]);
}

void values_of(Tile& t, const Shape& s, const uint16_t* vp, bool split, Ahead& ahead) {
  const int64_t dim = s.dim, dbs = dim / 16;
  const int parts = split ? 2 : 1;
  for (int64_t db0 = 0; db0 < dbs; db0 += 4) {
    const int64_t nb = std::min<int64_t>(4, dbs - db0);
    by_rows<6>(t.rows, [&](auto R, int64_t r0) {
      value_rows<R.value>(t, r0, db0, nb, dbs, vp, parts, dim, ahead);
    });
  }
}

// The calls of `Ahead::pump` a tile of `rows` rows makes per chunk: one per input chunk or key
// quarter in each group of rows' scores and values, and one per row in the softmax.
int64_t pump_sites(int64_t rows, int64_t dim) {
  const int64_t groups = (rows + 5) / 6;
  return groups * (kKeys / 64 * (dim / 32) + (dim / 16 + 3) / 4 * (kKeys / 32)) + rows;
}
#endif  // TRIO_AMX

// The chunk's values' sums added to the rows' running sums, after `alpha`.
void accumulate(Tile& t, const Shape& s, int64_t c) {
  const int64_t dim = s.dim;
  for (int64_t r = 0; r < t.rows; ++r) {
    if (t.len[r] - c <= 0) continue;
    float* a = t.acc + r * dim;
    const float* v = t.values + r * dim;
    const Lanes al = Lanes{} + t.alpha[r];
    for (int64_t d = 0; d < dim; d += 16) {
      const Lanes sum = load_lanes(a + d) * al + load_lanes(v + d);
      std::memcpy(a + d, &sum, sizeof sum);
    }
  }
}

// A thread's buffers, kept across calls: allocating and zeroing them per call cost a lone
// decode more than its arithmetic (256 KiB a thread a layer).
struct Work {
  std::vector<uint32_t> kp;  // two chunks (read, packed) of each head's keys
  std::vector<uint16_t> vp;  // and values
  std::vector<Tile> tiles;
  Ahead ahead;
  int64_t rows = 0;  // the rows the tiles are configured for

  // The tiles configured for `t`'s rows (`configure`), where they are not already (vector
  // lanes need no configuring).
  void fit([[maybe_unused]] const Tile& t) {
#ifdef TRIO_AMX
    if (rows != t.rows) configure(rows = t.rows);
#endif
  }
};

// A task: a run of queries [b0, b1) of one sequence and its KV heads [g0, g1).
struct Task {
  int64_t b0 = 0, b1 = 0, g0 = 0, g1 = 0;

  // The furthest any of its queries reads: its chunks are those below this.
  int64_t end(const int64_t* lens) const { return *std::max_element(lens + b0, lens + b1); }
};

// A call's tasks, handed out one by one in order to whichever thread asks: causal runs differ in
// cost (a later run reads more keys).
class Tasks {
 public:
  Tasks(const std::vector<std::pair<int64_t, int64_t>>& runs, int64_t per_task, int64_t apart)
      : runs_(runs), per_task_(per_task), apart_(apart),
        count_(static_cast<int64_t>(runs.size()) * apart) {}

  int64_t count() const { return count_; }

  // The next task not yet handed out, or none.
  std::optional<Task> take() {
    const int64_t i = next_++;
    if (i >= count_) return std::nullopt;
    const auto [b0, b1] = runs_[i / apart_];
    const int64_t g0 = i % apart_ * per_task_;
    return Task{b0, b1, g0, g0 + per_task_};
  }

 private:
  const std::vector<std::pair<int64_t, int64_t>>& runs_;
  const int64_t per_task_, apart_, count_;
  std::atomic<int64_t> next_{0};
};

// One task: each head's rows (query, head) in tiles of 16, the chunks of the run's keys read
// once for all of them. Returns the thread's next task, taken from `tasks` as this one packs its
// last chunk, so that its first chunk is asked for during this one's last (a decode's task reads
// two chunks at 250 positions, and its first one, read cold, took as long as the other).
std::optional<Task> run_heads(const Shape& s, const Task& task, const uint16_t* qp,
                              const uint16_t* kc, const uint16_t* vc, const int64_t* tables,
                              const int64_t* lens, float scale, bool split, uint16_t* op,
                              Work& w, Tasks& tasks) {
  const int64_t b0 = task.b0, b1 = task.b1, g0 = task.g0, g1 = task.g1;
  const int64_t dim = s.dim, group = s.group, heads = g1 - g0;
  const int64_t rows = (b1 - b0) * group, per_head = (rows + kRows - 1) / kRows;
  const int64_t ntiles = per_head * heads;
  const float ninf = -std::numeric_limits<float>::infinity();
  if (static_cast<int64_t>(w.tiles.size()) < ntiles) w.tiles.resize(ntiles);
  const int64_t kn = kKeys * dim / 2, vn = kKeys * dim;  // a head's chunk, packed
  if (static_cast<int64_t>(w.kp.size()) < 2 * heads * kn) w.kp.resize(2 * heads * kn);
  if (static_cast<int64_t>(w.vp.size()) < 2 * heads * vn) w.vp.resize(2 * heads * vn);
  int64_t hi = 0, sites = 0;
  for (int64_t i = 0; i < ntiles; ++i) {
    Tile& t = w.tiles[i];
    const int64_t g = g0 + i / per_head, first = (i % per_head) * kRows;
    t.rows = std::min(kRows, rows - first);
    sites += pump_sites(t.rows, dim);
    for (int64_t r = 0; r < kRows; ++r) t.m[r] = ninf;
    std::memset(t.l, 0, sizeof t.l);
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t row = first + r, b = b0 + row / group, h = g * group + row % group;
      t.out[r] = op + (b * s.heads + h) * dim;
      t.len[r] = lens[b];
      hi = std::max(hi, lens[b]);
      std::memcpy(t.qbuf + r * dim, qp + (b * s.heads + h) * dim, dim * 2);
      std::memset(t.acc + r * dim, 0, dim * 4);
    }
  }
  const int64_t* table = tables + b0 * s.table_width;
  // Each pass reads what another wrote a pass or more before (chunks packed one ahead, in two
  // buffers; a chunk's values added to the sums after the next chunk's scores).
  const float base2 = scale * 1.44269504088896341f;
  // Chunk n's packed keys and values for tile i's head (chunks alternate between two buffers).
  auto keys = [&](int64_t n, int64_t i) {
    return w.kp.data() + ((n % 2) * heads + i / per_head) * kn;
  };
  auto values = [&](int64_t n, int64_t i) {
    return w.vp.data() + ((n % 2) * heads + i / per_head) * vn;
  };
  // Chunk n + 1 is asked for while chunk n is worked on (`Ahead`), and packed before chunk n's
  // values are summed; after the last chunk comes the next task's first.
  Ahead& ahead = w.ahead;
  std::optional<Task> next;  // taken once, by the ask past the last chunk
  auto ask_ahead = [&](int64_t c) {
    if (c < hi) return ahead.start(kc, vc, s, table, g0, g1, c, hi, sites);
    next = tasks.take();
    if (next)
      ahead.start(kc, vc, s, tables + next->b0 * s.table_width, next->g0, next->g1, 0,
                  next->end(lens), sites);
  };
  ahead.finish();  // this task's first chunk, if the previous task asked for it
  if (hi > 0) {
    pack_chunk(kc, vc, s, table, g0, g1, 0, hi, keys(0, 0), kn, values(0, 0), vn);
    ask_ahead(kKeys);
  }
  for (int64_t c = 0, n = 0; c < hi; c += kKeys, ++n) {
    for (int64_t i = 0; i < ntiles; ++i) {
      w.fit(w.tiles[i]);
      scores_of(w.tiles[i], s, keys(n, i), ahead);
    }
    if (c > 0)
      for (int64_t i = 0; i < ntiles; ++i) accumulate(w.tiles[i], s, c - kKeys);
    for (int64_t i = 0; i < ntiles; ++i) {
      if (split) softmax_of<true>(w.tiles[i], c, base2, ahead);
      else softmax_of<false>(w.tiles[i], c, base2, ahead);
    }
    if (c + kKeys < hi) {
      ahead.finish();
      pack_chunk(kc, vc, s, table, g0, g1, c + kKeys, hi, keys(n + 1, 0), kn, values(n + 1, 0),
                 vn);
      ask_ahead(c + 2 * kKeys);
    }
    for (int64_t i = 0; i < ntiles; ++i) {
      w.fit(w.tiles[i]);
      values_of(w.tiles[i], s, values(n, i), split, ahead);
    }
  }
  if (hi > 0)
    for (int64_t i = 0; i < ntiles; ++i) accumulate(w.tiles[i], s, (hi - 1) / kKeys * kKeys);
  for (int64_t i = 0; i < ntiles; ++i) {
    const Tile& t = w.tiles[i];
    for (int64_t r = 0; r < t.rows; ++r) {
      if (t.len[r] <= 0) {
        std::memset(t.out[r], 0, dim * 2);
        continue;
      }
      const float inv = 1.0f / lanes_sum(load_lanes(t.l + r * 16));
      for (int64_t d = 0; d < dim; ++d) t.out[r][d] = round_bf16(t.acc[r * dim + d] * inv);
    }
  }
  return hi > 0 ? next : tasks.take();  // a task that read no chunk took none
}

#endif  // TRIO_BF16_DOT

}  // namespace

// Whether this build and this process can run the kernel: AMX tiles where the build targets
// them (and Linux lends them), else AVX512-BF16's vector products.
bool available() {
#ifdef TRIO_AMX
  return amx_permitted();
#elif defined(TRIO_BF16_DOT)
  return true;
#else
  return false;
#endif
}

// Which instructions do the products: "amx", "avx512_bf16", or "" where none can.
std::string isa() {
#ifdef TRIO_AMX
  return "amx";
#elif defined(TRIO_BF16_DOT)
  return "avx512_bf16";
#else
  return "";
#endif
}

// q [B, Hq, D] bf16; k_cache, v_cache [blocks, block_size, Hkv, D] bf16; block_tables [B, W]
// int64; context_lens [B] int64 (the query's own position included); split: the probabilities
// in two bf16 parts (16 bits), else one (8 bits, as SDPA's flash kernel takes them, and faster:
// the two parts cost a prefill chunk a quarter more). Returns [B, Hq, D].
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& context_lens, double scale, bool split) {
  TORCH_CHECK(available(), "paged_attention: neither AMX nor AVX512-BF16 in this build or process");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes());
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous());
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16);
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(2) % 32 == 0 && q.size(2) <= kMaxDim,
              "the head size must be a multiple of 32 up to ", kMaxDim);
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong);
  TORCH_CHECK(block_tables.is_contiguous() && context_lens.is_contiguous());
  TORCH_CHECK(block_tables.size(0) == q.size(0) && context_lens.size(0) == q.size(0));
  at::Tensor out = at::empty_like(q);
#ifdef TRIO_BF16_DOT
  const Shape s(q, k_cache, block_tables);
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const auto* kc = reinterpret_cast<const uint16_t*>(k_cache.data_ptr());
  const auto* vc = reinterpret_cast<const uint16_t*>(v_cache.data_ptr());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  // Long runs read each chunk of keys for more queries; short ones make enough tasks for the
  // threads when there are few queries (how queries are grouped changes no row's arithmetic).
  const int64_t threads_wanted = at::get_num_threads();
  auto runs = runs_of(tables, s.batch, s.table_width, kRun);
  if (static_cast<int64_t>(runs.size()) * s.kv_heads < 8 * threads_wanted)
    runs = runs_of(tables, s.batch, s.table_width, kRun / 4);
  // With many runs a task takes all of a run's KV heads (`pack_chunk` reads whole cache rows);
  // with few, a head each, so that the threads have enough tasks.
  const int64_t per_task = static_cast<int64_t>(runs.size()) >= 4 * threads_wanted &&
                                   s.kv_heads <= kMaxHeads
                               ? s.kv_heads
                               : 1;
  const int64_t heads_apart = s.kv_heads / per_task;
  Tasks tasks(runs, per_task, heads_apart);
  const int threads = static_cast<int>(std::min<int64_t>(threads_wanted, tasks.count()));
#pragma omp parallel num_threads(threads)
  {
    static thread_local Work w;
#ifdef TRIO_AMX
    SavedTiles saved;
    configure(w.rows = kRows);
#endif
    w.ahead = Ahead{};  // nothing asked for by an earlier call (another layer's cache)
    for (std::optional<Task> t = tasks.take(); t;)
      t = run_heads(s, *t, qp, kc, vc, tables, lens, static_cast<float>(scale), split, op, w,
                    tasks);
  }
#endif
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &available, "whether the kernel can run here");
  m.def("isa", &isa, "the instructions that do its products");
  m.def("paged_attention", &paged_attention,
        "attention of each query over its sequence's paged cache, on AMX tiles or AVX512-BF16");
}
