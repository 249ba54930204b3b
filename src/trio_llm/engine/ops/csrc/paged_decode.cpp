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

// kLanes vectors' sums at once: lane j of the result is a[j]'s lanes summed, halves into each
// other (j's sum depends on a[j] alone).
#ifdef TRIO_LANES16
// Four rounds of two shuffles and an add a pair, 45 operations for 16 sums against
// `lanes_sum`'s 8 each.
inline Lanes sums(Lanes (&a)[kLanes]) {
  Lanes b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18,
                                   19, 20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                   26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18,
                                   19, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21,
                                   22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    d[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20,
                                   21, 24, 25, 28, 29) +
           __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19,
                                   22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                 28, 30) +
         __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
                                 29, 31);
}
#else
inline Lanes sums(Lanes (&a)[kLanes]) {
  Lanes b[4], c[2];
  for (int i = 0; i < 4; ++i)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15);
}
#endif

// One query head's scores over positions [t0, t1) of a key chunk (`k`: position t's head at
// k + t * stride): each a dot product in lanes, kLanes positions' summed at once by `sums` (a
// score depends on its own key alone, so on no grouping of positions); L lanes-vectors a
// head (the head size fixed at compile time), so the query stays in registers.
template <int L>
void score_run(const float* q, const float* k, int64_t stride, int64_t t0, int64_t t1,
               float scale, float cap, float* sh) {
  Lanes qv[L];
  for (int i = 0; i < L; ++i) qv[i] = load_lanes(q + i * kLanes);
  for (int64_t t = t0; t < t1; t += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, t1 - t);
    Lanes acc[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) {
      if (j >= m) {
        acc[j] = Lanes{};
        continue;
      }
      const float* kt = k + (t + j) * stride;
      acc[j] = qv[0] * load_lanes(kt);
      for (int i = 1; i < L; ++i) acc[j] += qv[i] * load_lanes(kt + i * kLanes);
    }
    const Lanes scores = sums(acc) * scale;
    for (int64_t j = 0; j < m; ++j)
      sh[t + j] = cap > 0.0f ? cap * std::tanh(scores[j] / cap) : scores[j];
  }
}

// One query head's values over positions [t0, t1), each added in order into `a`; the sums
// stay in registers over the run.
template <int L>
void value_run(float* a, const float* v, int64_t stride, int64_t t0, int64_t t1,
               const float* sh) {
  Lanes acc[L];
  for (int i = 0; i < L; ++i) acc[i] = load_lanes(a + i * kLanes);
  for (int64_t t = t0; t < t1; ++t) {
    const Lanes p = Lanes{} + sh[t];
    for (int i = 0; i < L; ++i) acc[i] = acc[i] + p * load_lanes(v + t * stride + i * kLanes);
  }
  for (int i = 0; i < L; ++i) std::memcpy(a + i * kLanes, &acc[i], sizeof(Lanes));
}

// The head size's instance of both (any multiple of kLanes up to 256).
using ScoreRun = void (*)(const float*, const float*, int64_t, int64_t, int64_t, float, float,
                          float*);
using ValueRun = void (*)(float*, const float*, int64_t, int64_t, int64_t, const float*);

template <int... L>
ScoreRun score_run_for(int64_t dim, std::integer_sequence<int, L...>) {
  ScoreRun out = nullptr;
  ((dim == (L + 1) * kLanes ? (out = &score_run<L + 1>, 0) : 0), ...);
  return out;
}

template <int... L>
ValueRun value_run_for(int64_t dim, std::integer_sequence<int, L...>) {
  ValueRun out = nullptr;
  ((dim == (L + 1) * kLanes ? (out = &value_run<L + 1>, 0) : 0), ...);
  return out;
}

constexpr int64_t kAhead = 4;
constexpr int64_t kTile = 16;   // queries of one sequence a task shares its key chunks among
constexpr int64_t kChunk = 64;  // keys (and values) converted to float32 at a time

// The row `kAhead` tokens on asked for now: a sequence's blocks lie anywhere in the cache, and
// the hardware prefetcher loses the stream at every block boundary.
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
  for (int64_t t = 0; t < m; ++t) {
    const int64_t pos = c + t;
    if (pos + kAhead < end) prefetch_row(cache, s, table, pos + kAhead, offset, used);
    to_float(cache + s.slot(table, pos) + offset,
             out + t * used, used);
  }
}

struct Scratch {
  std::vector<float> qf, acc, keys, scores;
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
  const int64_t heads = h1 - h0;
  const int64_t offset = kv0 * dim, used = (kv1 - kv0) * dim;  // their part of a cache row
  const int64_t* table = tables + b0 * s.table_width;
  const auto lanes = std::make_integer_sequence<int, kMaxDim / kLanes>{};
  const ScoreRun scores = score_run_for(dim, lanes);
  const ValueRun add_values = value_run_for(dim, lanes);
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
  w.scores.resize(starts[rows]);
  for (int64_t r = 0; r < rows; ++r)
    to_float(qp + ((b0 + r) * s.heads + h0) * dim, w.qf.data() + r * heads * dim, heads * dim);
  // Scores, a chunk of keys at a time for every query of the tile that sees them.
  for (int64_t c = lo; c < hi; c += kChunk) {
    const int64_t m = std::min(kChunk, hi - c);
    chunk_to_float(kp, s, table, c, m, hi, offset, used, w.keys.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t0 = std::max(c, firsts[r]), t1 = std::min(c + m, firsts[r] + ns[r]);
      for (int64_t h = 0; h < heads; ++h) {
        const float* q = w.qf.data() + (r * heads + h) * dim;
        float* sh = w.scores.data() + starts[r] + h * ns[r] - firsts[r];
        const float* k = w.keys.data() + (h / group) * dim - c * used;
        scores(q, k, used, t0, t1, scale, cap, sh);
      }
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
  // Values, a chunk at a time: each query's sums take its positions in order.
  float* values = w.keys.data();
  for (int64_t c = lo; c < hi; c += kChunk) {
    const int64_t m = std::min(kChunk, hi - c);
    chunk_to_float(vp, s, table, c, m, hi, offset, used, values);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t0 = std::max(c, firsts[r]), t1 = std::min(c + m, firsts[r] + ns[r]);
      for (int64_t h = 0; h < heads; ++h) {
        const float* sh = w.scores.data() + starts[r] + h * ns[r] - firsts[r];
        float* a = w.acc.data() + (r * heads + h) * dim;
        const float* v = values + (h / group) * dim - c * used;
        add_values(a, v, used, t0, t1, sh);
      }
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
  const int64_t threads = at::get_num_threads();
  const int64_t parts = std::clamp<int64_t>((threads + count - 1) / count, 1, s.kv_heads);
  at::parallel_for(0, count * parts, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const auto [b0, b1] = runs[task / parts];
      const int64_t part = task % parts;
      decode_tile<T>(s, b0, b1, part * s.kv_heads / parts, (part + 1) * s.kv_heads / parts, qp,
                     kp, vp, tables, lens, static_cast<float>(scale),
                     static_cast<float>(softcap), window, op, scratch);
    }
  });
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
