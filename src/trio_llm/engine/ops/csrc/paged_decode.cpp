// Decode attention over the paged KV cache where it lies: one query per sequence, each
// sequence's keys and values read block by block through its block table, no gather.
//
// Why a kernel of our own: the torch path gathers every context block per layer into a
// contiguous buffer and hands it to SDPA's flash kernel, which is built for many queries a
// head; with one query a head most of its time goes to set-up, not arithmetic. vLLM ships the
// same idea for its CPU build in C++.
//
// Each (sequence, KV head) pair is one task: its query heads (the GQA group) are scored
// against the keys in float32, softmaxed, and the values accumulated in float32. A task's
// arithmetic depends only on its own sequence, never on how many share the call.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

inline float load(const float* p, int64_t i) { return p[i]; }

inline float load(const c10::BFloat16* p, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, p + i, sizeof bits);
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

inline float load(const c10::Half* p, int64_t i) { return static_cast<float>(p[i]); }

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src, i);
}

constexpr int64_t kLanes = 16;
constexpr int64_t kMaxHeads = 256;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes load_lanes(const float* p) {
  Lanes out;
  std::memcpy(&out, p, sizeof out);
  return out;
}

// A dot product in 16-lane vectors (GCC's vector extensions: two AVX2 registers or one
// AVX-512, whichever the machine has), the lanes then halved into each other. A compiler's
// own vectorized reduction sums the lanes one by one, a chain of 16 dependent adds that cost
// more than the products. `dim` is a multiple of kLanes (checked by the caller).
inline float dot(const float* a, const float* b, int64_t dim) {
  Lanes acc = load_lanes(a) * load_lanes(b);
  for (int64_t d = kLanes; d < dim; d += kLanes) acc += load_lanes(a + d) * load_lanes(b + d);
  acc += __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  acc += __builtin_shufflevector(acc, acc, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  acc += __builtin_shufflevector(acc, acc, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  acc += __builtin_shufflevector(acc, acc, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  return acc[0];
}

struct Shape {
  int64_t batch, heads, dim, block_size, kv_heads, group, table_width;
  int64_t token_stride, block_stride;  // one slot and one block of a layer's cache
};

constexpr int64_t kAhead = 4;

// The row `kAhead` tokens on asked for now: a sequence's blocks lie anywhere in the cache, and
// the hardware prefetcher loses the stream at every block boundary.
template <typename T>
inline void prefetch_row(const T* cache, const Shape& s, const int64_t* table, int64_t pos,
                         int64_t offset, int64_t used) {
  const char* p = reinterpret_cast<const char*>(
      cache + table[pos / s.block_size] * s.block_stride + (pos % s.block_size) * s.token_stride +
      offset);
  for (int64_t b = 0; b < used * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(p + b);
}

// One sequence, KV heads [kv0, kv1) (all of them unless the batch is smaller than the
// threads): a token's keys are one contiguous row of the cache, read once and in order, which
// the hardware prefetcher follows; a task per (sequence, KV head) read a third of each row at
// a stride, and ran slower than the gather it replaced.
template <typename T>
void decode_sequence(const Shape& s, int64_t b, int64_t kv0, int64_t kv1, const T* qp, const T* kp, const T* vp,
                     const int64_t* tables, const int64_t* lens, float scale, float cap,
                     int64_t window, T* op, std::vector<float>& qf, std::vector<float>& acc,
                     std::vector<float>& row, std::vector<float>& scores) {
  const int64_t len = lens[b];
  const int64_t first = window > 0 ? std::max<int64_t>(len - window, 0) : 0;
  const int64_t n = len - first;
  const int64_t dim = s.dim, group = s.group, width = s.token_stride;
  const int64_t h0 = kv0 * group, h1 = kv1 * group;  // the query heads of these KV heads
  const int64_t offset = kv0 * dim, used = (kv1 - kv0) * dim;  // their part of a cache row
  T* dst = op + b * s.heads * dim;
  if (n <= 0) {
    for (int64_t i = h0 * dim; i < h1 * dim; ++i) dst[i] = T(0.0f);
    return;
  }
  to_float(qp + (b * s.heads + h0) * dim, qf.data() + h0 * dim, (h1 - h0) * dim);
  scores.resize(s.heads * n);
  const int64_t* table = tables + b * s.table_width;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = first + t;
    if (t + kAhead < n) prefetch_row(kp, s, table, first + t + kAhead, offset, used);
    to_float(kp + table[pos / s.block_size] * s.block_stride + (pos % s.block_size) * width +
                 offset, row.data() + offset, used);
    for (int64_t h = h0; h < h1; ++h) {
      float score = dot(qf.data() + h * dim, row.data() + (h / group) * dim, dim) * scale;
      if (cap > 0.0f) score = cap * std::tanh(score / cap);
      scores[h * n + t] = score;
    }
  }
  float sums[kMaxHeads];
  for (int64_t h = h0; h < h1; ++h) {
    float* sh = scores.data() + h * n;
    float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
    for (int64_t t = 0; t < n; ++t) top = std::max(top, sh[t]);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t t = 0; t < n; ++t) {
      sh[t] = std::exp(sh[t] - top);
      total += sh[t];
    }
    sums[h] = total;
  }
  std::fill(acc.begin(), acc.end(), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = first + t;
    if (t + kAhead < n) prefetch_row(vp, s, table, first + t + kAhead, offset, used);
    to_float(vp + table[pos / s.block_size] * s.block_stride + (pos % s.block_size) * width +
                 offset, row.data() + offset, used);
    for (int64_t h = h0; h < h1; ++h) {
      const Lanes p = Lanes{} + scores[h * n + t];
      float* a = acc.data() + h * dim;
      const float* v = row.data() + (h / group) * dim;
      for (int64_t d = 0; d < dim; d += kLanes) {
        const Lanes sum = load_lanes(a + d) + p * load_lanes(v + d);
        std::memcpy(a + d, &sum, sizeof sum);
      }
    }
  }
  for (int64_t h = h0; h < h1; ++h) {
    const float inv = 1.0f / sums[h];
    for (int64_t d = 0; d < dim; ++d) dst[h * dim + d] = T(acc[h * dim + d] * inv);
  }
}

template <typename T>
void decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
            double softcap, int64_t window, at::Tensor& out) {
  Shape s;
  s.batch = q.size(0);
  s.heads = q.size(1);
  s.dim = q.size(2);
  s.block_size = k_cache.size(1);
  s.kv_heads = k_cache.size(2);
  s.group = s.heads / s.kv_heads;
  s.table_width = block_tables.size(1);
  s.token_stride = s.kv_heads * s.dim;
  s.block_stride = s.block_size * s.token_stride;
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  // Fewer sequences than threads: each sequence's KV heads split between tasks.
  const int64_t threads = at::get_num_threads();
  const int64_t parts = std::clamp<int64_t>((threads + s.batch - 1) / s.batch, 1, s.kv_heads);
  at::parallel_for(0, s.batch * parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(s.heads * s.dim), acc(s.heads * s.dim), row(s.token_stride), scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / parts, part = task % parts;
      decode_sequence<T>(s, b, part * s.kv_heads / parts, (part + 1) * s.kv_heads / parts, qp,
                         kp, vp, tables, lens, static_cast<float>(scale),
                         static_cast<float>(softcap), window, op, qf, acc, row, scores);
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
  TORCH_CHECK(q.size(2) % kLanes == 0, "the head size must be a multiple of ", kLanes);
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
