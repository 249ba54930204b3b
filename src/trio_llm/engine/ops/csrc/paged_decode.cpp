// Decode attention over the paged KV cache where it lies: one query per sequence, each
// sequence's keys and values read block by block through its block table, no gather.
//
// Why a kernel of our own: the torch path gathers every context block per layer into a
// contiguous buffer and hands it to SDPA's flash kernel, which is built for many queries a
// head; with one query a head most of its time goes to set-up, not arithmetic. vLLM ships the
// same idea for its CPU build in C++.
//
// Each sequence is one task (a tile of up to 16 queries where batch invariance lays a prefill out
// as decodes of one sequence): its query heads are scored against the keys in float32,
// softmaxed, and the values accumulated in float32. A query's arithmetic depends only on its
// own context, never on how many share the call or its tile.
//
// Both products are register tiles of a matrix product, the query heads of one KV head sharing
// each key and value read: a score is a chain of fused multiply-adds over the head's elements
// in its key's vector lane (the keys transposed in registers as they are read), a value sum a
// chain over positions in its element's lane. Neither sums across lanes, so a tile of 16 queries
// costs what SDPA's flash kernel does for a prompt's 1,000 queries where dot products summed
// across lanes took twice that: batch invariance's price for a prompt on CPUs where this kernel
// attends it (float32 caches, the AVX2-only class).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "bf16.h"
#include "lanes.h"
#include "paged.h"

namespace {

inline float load(const float* p, int64_t i) { return p[i]; }

inline float load(const c10::BFloat16* p, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, p + i, sizeof bits);
  return widen(bits);
}

inline float load(const c10::Half* p, int64_t i) { return static_cast<float>(p[i]); }

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src, i);
}

constexpr int64_t kMaxHeads = 256;
constexpr int64_t kMaxDim = 256;

// A softmax's numerators in place over `n` scores, and their sum: kLanes positions at a time,
// lane i taking positions i, i + kLanes, ... (by position, not address: any buffer gives the same
// sums), the last block padded with scores of -inf.
inline float exp_and_sum(float* sh, int64_t n, float top) {
  Lanes total{};
  int64_t t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    const Lanes e = exp_lanes(load_lanes(sh + t) - top);
    std::memcpy(sh + t, &e, sizeof e);
    total += e;
  }
  if (t < n) {
    float tail[kLanes];
    for (int64_t i = 0; i < kLanes; ++i) tail[i] = t + i < n ? sh[t + i] - top : -1e30f;
    Lanes e = exp_lanes(load_lanes(tail));
    for (int64_t i = 0; t + i < n; ++i) sh[t + i] = e[i];
    for (int64_t i = n - t; i < kLanes; ++i) e[i] = 0.0f;
    total += e;
  }
  return lanes_sum(total);
}

constexpr int64_t kTile = 16;   // queries of one sequence a task shares its key chunks among
constexpr int64_t kChunk = 64;  // keys (and values) converted to float32 at a time
// How far ahead of the row being read a chunk asks for rows of 16-bit caches: about 24 KiB of
// them (a chunk of 64 positions in bf16 on the default model). 4 rows left the reads short of
// the cache's latency: a decode step's attention over bf16 caches took 0.72-0.96x the time with
// 64 on an AMD EPYC, 0.75-0.93x built for AVX2 (bench/results/paged_decode_ahead_avx2.md).
// float32 caches keep 4 rows: they gained nothing at 32 (0.91-1.02x), lost at 64 (1.07-1.08x:
// too many misses in flight), and served float32 x int8 measured 0.93x at one stream with 32.
constexpr int64_t kAheadBytes = 24 * 1024;
constexpr int64_t kAheadRows = 4;
constexpr int64_t kKeyVecs = kChunk / kLanes;
constexpr int kQ = 4;  // query heads a block of scores or values takes at once
// Key vectors a score block holds (kQ * kV sums in registers, beside kV keys and a query's
// element): all of AVX-512's 32 registers are not needed for 16 sums, AVX2's 16 hold 8.
constexpr int kV = kLanes == 16 ? 4 : 2;
// Vectors of a head's values a value block holds for each of its queries (kQV * kS sums).
constexpr int kS = 4;
constexpr int kQV = kLanes == 16 ? 4 : 2;

// Scores of Q query heads (`q[i]`, `dim` floats) against a chunk's keys transposed (`kt`: key
// t's element d at kt[d * kChunk + t], kChunk keys, zeros past the chunk's end): out[i][j]'s
// lane l is key j * kLanes + l's score. A score is one chain of fused multiply-adds over the
// head's elements in order, in its key's lane, so it depends on its query and key alone: not on
// Q, on which queries share the block, or on the tile. The block is a matrix product's
// register tile (Q queries by kV key vectors), each key vector read once for Q queries, where
// a dot product per key would need its lanes summed across, which costs as much as the
// products at a head size of 64.
template <int Q>
void score_block(const float* const* q, const float* kt, int64_t dim, int64_t vecs,
                 Lanes (*out)[kKeyVecs]) {
  for (int64_t j0 = 0; j0 < vecs; j0 += kV) {
    Lanes acc[Q][kV] = {};
    for (int64_t d = 0; d < dim; ++d) {
      Lanes k[kV];
      for (int v = 0; v < kV; ++v) k[v] = load_lanes(kt + d * kChunk + (j0 + v) * kLanes);
      for (int i = 0; i < Q; ++i) {
        const Lanes b = Lanes{} + q[i][d];
        for (int v = 0; v < kV; ++v) acc[i][v] = fma_lanes(b, k[v], acc[i][v]);
      }
    }
    for (int i = 0; i < Q; ++i)
      for (int v = 0; v < kV; ++v) out[i][j0 + v] = acc[i][v];
  }
}

using ScoreBlock = void (*)(const float* const*, const float*, int64_t, int64_t,
                            Lanes (*)[kKeyVecs]);
constexpr ScoreBlock kScoreBlocks[kQ] = {&score_block<1>, &score_block<2>, &score_block<3>,
                                         &score_block<4>};

// Values of Q query heads of one KV head over positions [t0, t1), head elements [e, e + kS *
// kLanes): each query's sums (`a[i]`) take the positions in order, p[i][t] * v[t] fused into
// them, the value rows read once for all Q. A query's sums depend on its own probabilities
// alone: not on Q, nor on which queries share the block (a decode is a block of its KV head's
// query heads).
template <int Q, int S>
void value_block(float* const* a, const float* const* p, const float* v, int64_t stride,
                 int64_t t0, int64_t t1, int64_t e) {
  Lanes acc[Q][S];
  for (int i = 0; i < Q; ++i)
    for (int s = 0; s < S; ++s) acc[i][s] = load_lanes(a[i] + e + s * kLanes);
  for (int64_t t = t0; t < t1; ++t) {
    Lanes x[S];
    for (int s = 0; s < S; ++s) x[s] = load_lanes(v + t * stride + e + s * kLanes);
    for (int i = 0; i < Q; ++i) {
      const Lanes b = Lanes{} + p[i][t];
      for (int s = 0; s < S; ++s) acc[i][s] = fma_lanes(b, x[s], acc[i][s]);
    }
  }
  for (int i = 0; i < Q; ++i)
    for (int s = 0; s < S; ++s) std::memcpy(a[i] + e + s * kLanes, &acc[i][s], sizeof(Lanes));
}

// `value_block` over the whole head: kS vectors at a time, then one at a time.
template <int Q>
void value_head(float* const* a, const float* const* p, const float* v, int64_t stride,
                int64_t t0, int64_t t1, int64_t dim) {
  int64_t e = 0;
  for (; e + kS * kLanes <= dim; e += kS * kLanes) value_block<Q, kS>(a, p, v, stride, t0, t1, e);
  for (; e < dim; e += kLanes) value_block<Q, 1>(a, p, v, stride, t0, t1, e);
}

// `value_head` for n (1 to 4) query heads.
inline void value_heads(int n, float* const* a, const float* const* p, const float* v,
                        int64_t stride, int64_t t0, int64_t t1, int64_t dim) {
  if (t0 >= t1) return;
  switch (n) {
    case 1: return value_head<1>(a, p, v, stride, t0, t1, dim);
    case 2: return value_head<2>(a, p, v, stride, t0, t1, dim);
    case 3: return value_head<3>(a, p, v, stride, t0, t1, dim);
    default: return value_head<4>(a, p, v, stride, t0, t1, dim);
  }
}

// A row further on asked for now (`kAheadBytes`): a sequence's blocks lie anywhere in the cache,
// and the hardware prefetcher loses the stream at every block boundary.
template <typename T>
inline void prefetch_row(const T* cache, const Shape& s, const int64_t* table, int64_t pos,
                         int64_t offset, int64_t used) {
  const char* p = reinterpret_cast<const char*>(
      cache + s.slot(table, pos) +
      offset);
  for (int64_t b = 0; b < used * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(p + b);
}

// Positions [c, c + m) of the cache's KV heads [kv0, kv0 + used / dim), in float32, `used`
// floats a position.
template <typename T>
void chunk_to_float(const T* cache, const Shape& s, const int64_t* table, int64_t c, int64_t m,
                    int64_t end, int64_t offset, int64_t used, float* out) {
  const int64_t ahead =
      sizeof(T) == 2 ? std::clamp<int64_t>(kAheadBytes / (used * 2), kAheadRows, kChunk)
                     : kAheadRows;
  for (int64_t t = 0; t < m; ++t) {
    const int64_t pos = c + t;
    if (pos + ahead < end) prefetch_row(cache, s, table, pos + ahead, offset, used);
    to_float(cache + s.slot(table, pos) + offset,
             out + t * used, used);
  }
}

#ifdef TRIO_LANES16
// a's 128-bit quarters 0 and 2, then b's (`even_quarters`), or 1 and 3 (`odd_quarters`):
// AVX-512's 128-bit shuffle, the last two rounds of a 16x16 transpose.
inline Lanes even_quarters(Lanes a, Lanes b) {
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
}

inline Lanes odd_quarters(Lanes a, Lanes b) {
  return __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}
#endif

// kLanes rows of kLanes floats transposed: out[e]'s lane i is r[i]'s element e. In registers,
// by the shuffles a matrix transpose takes on AVX2 (unpack, shuffle, 128-bit permute) and on
// AVX-512 (unpack, shuffle, twice a 128-bit shuffle). Element by element, a decode step's
// attention took 2.2x as long (32 sequences of 250 positions, one thread): a decode shares a
// transpose among its KV head's few query heads only.
inline void transpose_block(const Lanes (&r)[kLanes], Lanes (&out)[kLanes]) {
#ifdef TRIO_LANES16
  Lanes t[16], u[16], v[16];
  for (int p = 0; p < 8; ++p) {
    t[2 * p] = __builtin_shufflevector(r[2 * p], r[2 * p + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8,
                                       24, 9, 25, 12, 28, 13, 29);
    t[2 * p + 1] = __builtin_shufflevector(r[2 * p], r[2 * p + 1], 2, 18, 3, 19, 6, 22, 7, 23,
                                           10, 26, 11, 27, 14, 30, 15, 31);
  }
  // u[4g + c]: rows 4g..4g+3, elements c, c + 4, c + 8, c + 12 (one a 128-bit lane).
  for (int g = 0; g < 4; ++g)
    for (int h = 0; h < 2; ++h) {
      const Lanes a = t[4 * g + h], b = t[4 * g + h + 2];
      u[4 * g + 2 * h] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25,
                                                 12, 13, 28, 29);
      u[4 * g + 2 * h + 1] = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11,
                                                     26, 27, 14, 15, 30, 31);
    }
  // v[8k + 2c (+1)]: rows 8k..8k+7, elements c and c + 8 (c + 4 and c + 12).
  for (int k = 0; k < 2; ++k)
    for (int c = 0; c < 4; ++c) {
      v[8 * k + 2 * c] = even_quarters(u[8 * k + c], u[8 * k + 4 + c]);
      v[8 * k + 2 * c + 1] = odd_quarters(u[8 * k + c], u[8 * k + 4 + c]);
    }
  for (int c = 0; c < 4; ++c)
    for (int h = 0; h < 2; ++h) {
      out[c + 4 * h] = even_quarters(v[2 * c + h], v[8 + 2 * c + h]);
      out[c + 4 * h + 8] = odd_quarters(v[2 * c + h], v[8 + 2 * c + h]);
    }
#else
  Lanes t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = __builtin_shufflevector(r[2 * p], r[2 * p + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[2 * p + 1] = __builtin_shufflevector(r[2 * p], r[2 * p + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  // u[4g + c]: rows 4g..4g+3, elements c and c + 4 (one a 128-bit lane).
  for (int g = 0; g < 2; ++g)
    for (int h = 0; h < 2; ++h) {
      const Lanes a = t[4 * g + h], b = t[4 * g + h + 2];
      u[4 * g + 2 * h] = __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13);
      u[4 * g + 2 * h + 1] = __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int c = 0; c < 4; ++c) {
    out[c] = __builtin_shufflevector(u[c], u[4 + c], 0, 1, 2, 3, 8, 9, 10, 11);
    out[c + 4] = __builtin_shufflevector(u[c], u[4 + c], 4, 5, 6, 7, 12, 13, 14, 15);
  }
#endif
}

// A chunk's keys (`keys`: position t's `used` floats at keys + t * used) as the score blocks
// read them: element j of position t at out[j * kChunk + t], zeros for positions [m, kChunk).
// Apart from the conversion to float32 (`chunk_to_float`): read from the cache and transposed
// in one pass, a decode step's attention took 1.07-1.09x (AVX-512) and 1.44-1.76x (AVX2) as
// long.
inline void transpose_keys(const float* keys, int64_t m, int64_t used, float* out) {
  for (int64_t t0 = 0; t0 < kChunk; t0 += kLanes)
    for (int64_t j0 = 0; j0 < used; j0 += kLanes) {
      Lanes r[kLanes], o[kLanes];
      for (int64_t i = 0; i < kLanes; ++i)
        r[i] = t0 + i < m ? load_lanes(keys + (t0 + i) * used + j0) : Lanes{};
      transpose_block(r, o);
      for (int64_t e = 0; e < kLanes; ++e)
        std::memcpy(out + (j0 + e) * kChunk + t0, &o[e], sizeof(Lanes));
    }
}

struct Scratch {
  std::vector<float> qf, acc, keys, keys_t, scores;
};

// Rows [b0, b1) of the batch, queries of one sequence (one block table; a decode is a tile of
// one), KV heads [kv0, kv1) (all of them unless the batch is smaller than the threads). Each
// chunk of the sequence's keys is read from the cache and widened once for the whole tile.
// A query's arithmetic is the same in any tile: its scores in position order, its softmax over
// its own scores, its values summed in position order, so a query's result depends on its
// own context alone (batch invariance puts prefill queries here as decodes of their position).
template <typename T>
void decode_tile(const Shape& s, int64_t b0, int64_t b1, int64_t kv0, int64_t kv1,
                 const T* qp, const T* kp, const T* vp, const int64_t* tables,
                 const int64_t* lens, float scale, float cap, int64_t window, T* op,
                 Scratch& w) {
  const int64_t dim = s.dim, group = s.group, rows = b1 - b0;
  const int64_t h0 = kv0 * group, h1 = kv1 * group;  // the query heads of these KV heads
  const int64_t heads = h1 - h0, kvs = kv1 - kv0;
  const int64_t offset = kv0 * dim, used = kvs * dim;  // their part of a cache row
  const int64_t* table = tables + b0 * s.table_width;
  int64_t firsts[kTile], ns[kTile], starts[kTile + 1];
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
  starts[0] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = lens[b0 + r];
    firsts[r] = window > 0 ? std::max<int64_t>(len - window, 0) : 0;
    ns[r] = std::max<int64_t>(len - firsts[r], 0);
    starts[r + 1] = starts[r] + heads * ns[r];
    if (ns[r] > 0) lo = std::min(lo, firsts[r]), hi = std::max(hi, len);
  }
  w.qf.resize(rows * heads * dim);
  w.acc.assign(rows * heads * dim, 0.0f);
  w.keys.resize(kChunk * used);
  w.keys_t.resize(kChunk * used);
  w.scores.resize(starts[rows]);
  for (int64_t r = 0; r < rows; ++r)
    to_float(qp + ((b0 + r) * s.heads + h0) * dim, w.qf.data() + r * heads * dim, heads * dim);
  // Where query head h of row r keeps its scores, by position (its first position at
  // firsts[r]).
  const auto scores_of = [&](int64_t r, int64_t h) {
    return w.scores.data() + starts[r] + h * ns[r] - firsts[r];
  };
  // The query heads of one KV head that see positions of a chunk, gathered kQ at a time.
  struct Block {
    int n = 0;
    const float* q[kQ];
    float* sh[kQ];
    float* a[kQ];
    int64_t t0[kQ], t1[kQ];
  };
  // Each query head of KV head kh that sees positions of chunk [c, c + m), `size` at a time
  // into a Block handed to `flush`.
  const auto in_blocks = [&](int64_t c, int64_t m, int64_t kh, int size, const auto& flush) {
    Block blk;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t0 = std::max(c, firsts[r]), t1 = std::min(c + m, firsts[r] + ns[r]);
      if (t0 >= t1) continue;
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        const int i = blk.n++;
        blk.q[i] = w.qf.data() + (r * heads + h) * dim;
        blk.sh[i] = scores_of(r, h);
        blk.a[i] = w.acc.data() + (r * heads + h) * dim;
        blk.t0[i] = t0, blk.t1[i] = t1;
        if (blk.n == size) flush(blk), blk.n = 0;
      }
    }
    if (blk.n > 0) flush(blk);
  };
  // Scores, a chunk of keys at a time for every query of the tile that sees them.
  for (int64_t c = lo; c < hi; c += kChunk) {
    const int64_t m = std::min(kChunk, hi - c);
    const int64_t vecs = (m + kLanes - 1) / kLanes;
    chunk_to_float(kp, s, table, c, m, hi, offset, used, w.keys.data());
    transpose_keys(w.keys.data(), m, used, w.keys_t.data());
    for (int64_t kh = 0; kh < kvs; ++kh) {
      const float* kt = w.keys_t.data() + kh * dim * kChunk;
      in_blocks(c, m, kh, kQ, [&](const Block& blk) {
        Lanes out[kQ][kKeyVecs];
        kScoreBlocks[blk.n - 1](blk.q, kt, dim, vecs, out);
        for (int i = 0; i < blk.n; ++i) {
          const float* o = reinterpret_cast<const float*>(out[i]) - c;
          for (int64_t t = blk.t0[i]; t < blk.t1[i]; ++t) {
            const float score = o[t] * scale;
            blk.sh[i][t] = cap > 0.0f ? cap * std::tanh(score / cap) : score;
          }
        }
      });
    }
  }
  float sums[kTile * kMaxHeads];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = ns[r];
    for (int64_t h = 0; h < heads; ++h) {
      float* sh = w.scores.data() + starts[r] + h * n;
      float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
      for (int64_t t = 0; t < n; ++t) top = std::max(top, sh[t]);
      sums[r * heads + h] = exp_and_sum(sh, n, top);
    }
  }
  // Values, a chunk at a time: each query's sums take its positions in order, kQV queries of a
  // KV head sharing the chunk's rows over the positions they all see.
  float* values = w.keys.data();
  for (int64_t c = lo; c < hi; c += kChunk) {
    const int64_t m = std::min(kChunk, hi - c);
    chunk_to_float(vp, s, table, c, m, hi, offset, used, values);
    for (int64_t kh = 0; kh < kvs; ++kh) {
      const float* v = values + kh * dim - c * used;
      in_blocks(c, m, kh, kQV, [&](const Block& blk) {
        float* const* a = blk.a;
        const float* const* p = blk.sh;
        int64_t cs = blk.t0[0], ce = blk.t1[0];
        for (int i = 1; i < blk.n; ++i) cs = std::max(cs, blk.t0[i]), ce = std::min(ce, blk.t1[i]);
        if (cs >= ce) cs = ce = blk.t1[0];
        for (int i = 0; i < blk.n; ++i)
          value_heads(1, a + i, p + i, v, used, blk.t0[i], std::min(cs, blk.t1[i]), dim);
        value_heads(blk.n, a, p, v, used, cs, ce, dim);
        for (int i = 0; i < blk.n; ++i)
          value_heads(1, a + i, p + i, v, used, std::max(ce, blk.t0[i]), blk.t1[i], dim);
      });
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* dst = op + (b0 + r) * s.heads * dim + h0 * dim;
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = w.acc.data() + (r * heads + h) * dim;
      if (ns[r] == 0) {
        for (int64_t d = 0; d < dim; ++d) dst[h * dim + d] = T(0.0f);
        continue;
      }
      const float inv = 1.0f / sums[r * heads + h];
      for (int64_t d = 0; d < dim; ++d) dst[h * dim + d] = T(a[d] * inv);
    }
  }
}

template <typename T>
void decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
            double softcap, int64_t window, at::Tensor& out) {
  const Shape s(q, k_cache, block_tables);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const auto runs = runs_of(tables, s.batch, s.table_width, kTile);
  const int64_t count = static_cast<int64_t>(runs.size());
  // Fewer tiles than threads: each tile's KV heads split between tasks.
  const int64_t threads_wanted = at::get_num_threads();
  const int64_t parts = std::clamp<int64_t>((threads_wanted + count - 1) / count, 1, s.kv_heads);
  const int64_t tasks = count * parts;
  const int threads = static_cast<int>(std::min<int64_t>(threads_wanted, tasks));
  // Tasks differ in cost (a prompt's later tiles read more keys; a batch's sequences have
  // different contexts): handed out one by one, the last first, so that no thread is left
  // with a prompt's heaviest half (a 1,000-token prompt took 0.75 of its one-thread time on
  // two threads cut in halves).
#pragma omp parallel num_threads(threads)
  {
    Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < tasks; ++i) {
      const int64_t task = tasks - 1 - i;
      const auto [b0, b1] = runs[task / parts];
      const int64_t part = task % parts;
      decode_tile<T>(s, b0, b1, part * s.kv_heads / parts, (part + 1) * s.kv_heads / parts, qp,
                     kp, vp, tables, lens, static_cast<float>(scale),
                     static_cast<float>(softcap), window, op, scratch);
    }
  }
}

}  // namespace

// q [B, Hq, D]; k_cache, v_cache [blocks, block_size, Hkv, D]; block_tables [B, W] int64;
// context_lens [B] int64 (this step's token included); softcap 0: none; window 0: none.
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens,
                        double scale, double softcap, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes());
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous());
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.size(2) == k_cache.size(3));
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(q.size(1) <= kMaxHeads, "at most ", kMaxHeads, " query heads");
  TORCH_CHECK(q.size(2) % kLanes == 0 && q.size(2) <= kMaxDim,
              "the head size must be a multiple of ", kLanes, " up to ", kMaxDim);
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong);
  TORCH_CHECK(block_tables.is_contiguous() && context_lens.is_contiguous());
  TORCH_CHECK(block_tables.size(0) == q.size(0) && context_lens.size(0) == q.size(0));
  at::Tensor out = at::empty_like(q);
  switch (q.scalar_type()) {
    case at::kFloat:
      decode<float>(q, k_cache, v_cache, block_tables, context_lens, scale, softcap, window, out);
      break;
    case at::kBFloat16:
      decode<c10::BFloat16>(q, k_cache, v_cache, block_tables, context_lens, scale, softcap,
                            window, out);
      break;
    case at::kHalf:
      decode<c10::Half>(q, k_cache, v_cache, block_tables, context_lens, scale, softcap, window,
                        out);
      break;
    default:
      TORCH_CHECK(false, "paged_decode: float32, bfloat16 or float16, not ", q.scalar_type());
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "decode attention over the paged KV cache in place");
}
