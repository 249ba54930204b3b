// A matmul of float32 activations by plain float32 weights whose every output is one chain of
// fused multiply-adds over the inputs in order, whatever the number of rows in the call: the
// dense float32 matmul of a batch-invariant engine (engine/ops/f32_rows.py).
//
// Why a kernel of our own: a lone row is what a decode step of one stream multiplies, and
// MKL's and oneDNN's one-row products read a float32 model's weights at 11-19 GB/s on an AMD
// EPYC whose two threads read 56 GB/s from one contiguous block (bench/results/
// float32_gemv.md). Here the weight lies in strips of 32 outputs, [strips, K, 32] (`pack`), so
// a lone row reads each thread's strips as one contiguous stream, and a call of many rows
// multiplies a strip, held in the cache, by blocks of rows: a GEMM's micro-kernel, with the
// inner dimension walked once from 0 to K for every output, never split, so each output is
// fma(x[K-1], w[K-1], ... fma(x[0], w[0], 0)) in any call. The machine's vector width changes
// how many outputs share an instruction, never an output's chain, so the bits are the same
// with AVX-512, AVX2 or the scalar fallback.
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

#include "lanes.h"

namespace {

constexpr int64_t kStrip = 32;                 // outputs a strip
constexpr int64_t kVectors = kStrip / kLanes;  // vectors a strip's row: 2 (AVX-512), 4 (AVX2)
// Strips a pass multiplies together, and rows a pass: their accumulators and the strips' rows of
// weights fill the registers (32 with AVX-512: 2 strips by 6 rows, 24 accumulators; 16 with
// AVX2: one strip by 3 rows, 12). A broadcast of x then feeds four FMAs rather than two, and a
// lone row has four chains of FMAs rather than two: on an AMD EPYC, against one strip by 12
// rows, 512 rows took 0.90-0.98x the time and 1-16 rows 0.90-1.0x (the default model's shapes,
// 2 threads, side by side in one process).
constexpr int64_t kStrips = kLanes == 16 ? 2 : 1;
constexpr int64_t kRows = kLanes == 16 ? 6 : 3;
// Rows whose activations a thread keeps in its cache while it walks its strips: a call of many
// rows reads each strip once a block of this many rather than once a pass.
constexpr int64_t kBlockRows = 96;

// A plain weight's strips: each [K][32] float32, `stride` apart.
struct Plain {
  const float* w;
  int64_t stride;
  Lanes lanes(int64_t t, int64_t k, int64_t v) const {
    return load_lanes(w + t * stride + k * kStrip + v * kLanes);
  }
  float at(int64_t t, int64_t k, int64_t j) const { return w[t * stride + k * kStrip + j]; }
};

// A GGUF block of 32 inputs: each output's 32 weights share one scale and one offset.
constexpr int64_t kBlock = 32;

// kLanes int8 values at p as floats. Spelled out: GCC lowers `__builtin_convertvector` from
// int8 lanes to a scalar conversion a lane.
inline Lanes bytes_to_lanes(const int8_t* p) {
#if defined(TRIO_LANES16)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return reinterpret_cast<Lanes>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)));
#elif defined(__AVX2__)
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return reinterpret_cast<Lanes>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
#else
  Lanes out;
  for (int64_t i = 0; i < kLanes; ++i) out[i] = static_cast<float>(p[i]);
  return out;
#endif
}

// The product d * q, kept from fusing with the offset's sum into one FMA (which rounds once):
// the `gguf` package rounds each.
template <class T>
inline T unfused(T product) {
#if defined(__AVX512F__)
  asm("" : "+v"(product));
#elif defined(__AVX__)
  asm("" : "+x"(product));
#else
  asm("" : "+m"(product));
#endif
  return product;
}

// A GGUF block weight's strips (Q4_0, Q4_1, Q8_0): q [K][32] int8 a strip, `K * 32` apart; d
// and m [K / 32][32] float32 a strip, `K` apart (m null where the format has none). Its values
// are w = d * q (+ m), each rounded as the `gguf` package's dequantization rounds it, so that
// they are the values a dense copy of the file holds.
struct Blocks {
  const int8_t* q;
  const float* d;
  const float* m;
  int64_t K;
  Lanes lanes(int64_t t, int64_t k, int64_t v) const {
    const int64_t at = t * K + k / kBlock * kStrip + v * kLanes;
    Lanes w = unfused(load_lanes(d + at) * bytes_to_lanes(q + t * K * kStrip + k * kStrip +
                                                           v * kLanes));
    return m == nullptr ? w : w + load_lanes(m + at);
  }
  float at(int64_t t, int64_t k, int64_t j) const {
    const int64_t at = t * K + k / kBlock * kStrip + j;
    const float w = unfused(d[at] * static_cast<float>(q[t * K * kStrip + k * kStrip + j]));
    return m == nullptr ? w : w + m[at];
  }
};

// Rows [0, R) of x (`ldx` apart) by strips [0, S) of `w`: out[r * ldo + 32 t + j] for the
// outputs j < width - 32 t of strip t.
template <int R, int S, class Source>
void rows_by_strips(const float* x, int64_t ldx, const Source& w, int64_t K, float* out,
                    int64_t ldo, int64_t width) {
#if defined(__FMA__) || defined(__AVX512F__)
  constexpr int64_t V = S * kVectors;
  Lanes acc[R][V] = {};
  for (int64_t k = 0; k < K; ++k) {
    Lanes row[V];
    for (int64_t t = 0; t < S; ++t)
      for (int64_t v = 0; v < kVectors; ++v) row[t * kVectors + v] = w.lanes(t, k, v);
    for (int r = 0; r < R; ++r) {
      const Lanes a = Lanes{} + x[r * ldx + k];
      for (int64_t v = 0; v < V; ++v) acc[r][v] = fma_lanes(a, row[v], acc[r][v]);
    }
  }
  if (width == S * kStrip) {
    for (int r = 0; r < R; ++r) std::memcpy(out + r * ldo, acc[r], sizeof acc[r]);
    return;
  }
  for (int r = 0; r < R; ++r) {
    float lanes[S * kStrip];
    std::memcpy(lanes, acc[r], sizeof lanes);
    std::memcpy(out + r * ldo, lanes, width * sizeof(float));
  }
#else
  for (int r = 0; r < R; ++r) {
    float acc[S * kStrip] = {};
    for (int64_t t = 0; t < S; ++t)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < kStrip; ++j)
          acc[t * kStrip + j] = std::fma(x[r * ldx + k], w.at(t, k, j), acc[t * kStrip + j]);
    std::memcpy(out + r * ldo, acc, width * sizeof(float));
  }
#endif
}

template <class Source>
using RowsFn = void (*)(const float*, int64_t, const Source&, int64_t, float*, int64_t, int64_t);

template <class Source, int S, int... R>
constexpr std::array<RowsFn<Source>, sizeof...(R)> table(std::integer_sequence<int, R...>) {
  return {&rows_by_strips<R + 1, S, Source>...};
}

// [strips a pass - 1][rows a pass - 1]
template <class Source>
const std::array<std::array<RowsFn<Source>, kRows>, 2> kRowsFns = {
    table<Source, 1>(std::make_integer_sequence<int, kRows>{}),
    table<Source, kStrips>(std::make_integer_sequence<int, kRows>{})};

// Rows [M0, M1) of x [M, K] by `count` strips of `w` (strip s of the weight first) into out.
template <class Source>
void strips_pass(const float* x, int64_t M0, int64_t M1, int64_t K, const Source& w,
                 int64_t count, float* out, int64_t N, int64_t s) {
  const int64_t width = std::min(count * kStrip, N - s * kStrip);
  for (int64_t m = M0; m < M1; m += kRows) {
    const int64_t rows = std::min(kRows, M1 - m);
    kRowsFns<Source>[count - 1][rows - 1](x + m * K, K, w, K, out + m * N + s * kStrip, N,
                                          width);
  }
}

// Calls of at most this many rows dequantize each weight in the registers of every pass that
// multiplies it; calls of more, once a block of rows into a buffer the passes read. On an AMD
// EPYC (2 threads, the default model's shapes, against the dense strips): in the registers a
// lone row took 0.36-0.52x the dense weight's time, 12 rows 0.73-0.93x (bench/results/
// f32_blocks.md), 32 rows 1.12-1.2x; through the buffer a lone row 0.72-0.78x, 13-512 rows
// 0.92-1.08x.
constexpr int64_t kFusedRows = 2 * kRows;

// Strips [0, S) of `w` as a plain weight's strips, into out ([S][K][32]).
void dequantize_strips(const Blocks& w, int64_t K, int64_t S, float* out) {
  for (int64_t t = 0; t < S; ++t)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t v = 0; v < kVectors; ++v) {
        const Lanes lanes = w.lanes(t, k, v);
        std::memcpy(out + t * K * kStrip + k * kStrip + v * kLanes, &lanes, sizeof lanes);
      }
}

}  // namespace

// x [M, K] float32 by a weight packed as [strips, K * 32] float32 (output 32 s + j's input k at
// [s, 32 k + j]): [M, N] float32 (N: the unpadded outputs).
torch::Tensor f32_linear(const torch::Tensor& x, const torch::Tensor& strips, int64_t N) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "x: contiguous [M, K] float32");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(strips.dtype() == torch::kFloat32 && strips.is_contiguous() && strips.dim() == 2 &&
                  strips.size(1) == K * kStrip && N <= strips.size(0) * kStrip,
              "strips: contiguous [strips, K * 32] float32");
  auto out = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = strips.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, strips.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = 0; block < M; block += kBlockRows) {
      const int64_t block_end = std::min(M, block + kBlockRows);
      for (int64_t s = begin; s < end; s += kStrips)
        strips_pass(xp, block, block_end, K, Plain{wp + s * K * kStrip, K * kStrip},
                    std::min(kStrips, end - s), op, N, s);
    }
  });
  return out;
}

// x [M, K] float32 by a GGUF block weight laid out in strips: q [strips, K * 32] int8 (output
// 32 s + j's input k at [s, 32 k + j]), scale and offset [strips, K / 32 * 32] float32 (its
// block b at [s, 32 b + j]; offset empty where the format has none): [M, N] float32, bitwise
// what `f32_linear` gives on the dequantized weight's strips: a lone row reads 1.25 bytes a
// weight from memory rather than 4.
torch::Tensor f32_blocks_linear(const torch::Tensor& x, const torch::Tensor& q,
                                const torch::Tensor& scale, const torch::Tensor& offset,
                                int64_t N) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "x: contiguous [M, K] float32");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % kBlock == 0, "K: a whole number of blocks of 32");
  TORCH_CHECK(q.dtype() == torch::kInt8 && q.is_contiguous() && q.dim() == 2 &&
                  q.size(1) == K * kStrip && N <= q.size(0) * kStrip,
              "q: contiguous [strips, K * 32] int8");
  const int64_t strips = q.size(0);
  TORCH_CHECK(scale.dtype() == torch::kFloat32 && scale.is_contiguous() &&
                  scale.numel() == strips * K,
              "scale: contiguous [strips, K / 32 * 32] float32");
  const bool has_offset = offset.numel() > 0;
  TORCH_CHECK(!has_offset || (offset.dtype() == torch::kFloat32 && offset.is_contiguous() &&
                              offset.numel() == strips * K),
              "offset: empty, or contiguous [strips, K / 32 * 32] float32");
  auto out = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* dp = scale.data_ptr<float>();
  const float* mp = has_offset ? offset.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  auto blocks = [&](int64_t s) {
    return Blocks{qp + s * K * kStrip, dp + s * K, mp == nullptr ? nullptr : mp + s * K, K};
  };
  at::parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {
    if (M <= kFusedRows) {
      for (int64_t s = begin; s < end; s += kStrips)
        strips_pass(xp, 0, M, K, blocks(s), std::min(kStrips, end - s), op, N, s);
      return;
    }
    thread_local std::vector<float> buffer;
    buffer.resize(kStrips * K * kStrip);
    for (int64_t block = 0; block < M; block += kBlockRows) {
      const int64_t block_end = std::min(M, block + kBlockRows);
      for (int64_t s = begin; s < end; s += kStrips) {
        const int64_t count = std::min(kStrips, end - s);
        dequantize_strips(blocks(s), K, count, buffer.data());
        strips_pass(xp, block, block_end, K, Plain{buffer.data(), K * kStrip}, count, op, N, s);
      }
    }
  });
  return out;
}

// Which instructions compute the sums here: "avx512", "avx2" (FMA3) or "generic".
std::string path() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__FMA__)
  return "avx2";
#else
  return "generic";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("f32_linear", &f32_linear, "float32 rows by a float32 weight's strips, row-exact");
  m.def("f32_blocks_linear", &f32_blocks_linear,
        "float32 rows by a GGUF block weight's strips, dequantized a pass at a time, row-exact");
  m.def("path", &path, "which instructions compute the sums on this machine");
}
