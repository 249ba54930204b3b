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

// Rows [0, R) of x (`ldx` apart) by strips [0, S) at `w` (each [K][32], `K * 32` apart):
// out[r * ldo + 32 t + j] for the outputs j < width - 32 t of strip t.
template <int R, int S>
void rows_by_strips(const float* x, int64_t ldx, const float* w, int64_t K, float* out,
                    int64_t ldo, int64_t width) {
#if defined(__FMA__) || defined(__AVX512F__)
  constexpr int64_t V = S * kVectors;
  Lanes acc[R][V] = {};
  const int64_t stride = K * kStrip;
  for (int64_t k = 0; k < K; ++k) {
    Lanes row[V];
    for (int64_t t = 0; t < S; ++t)
      for (int64_t v = 0; v < kVectors; ++v)
        row[t * kVectors + v] = load_lanes(w + t * stride + k * kStrip + v * kLanes);
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
          acc[t * kStrip + j] =
              std::fma(x[r * ldx + k], w[t * K * kStrip + k * kStrip + j], acc[t * kStrip + j]);
    std::memcpy(out + r * ldo, acc, width * sizeof(float));
  }
#endif
}

using RowsFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t);

template <int S, int... R>
constexpr std::array<RowsFn, sizeof...(R)> table(std::integer_sequence<int, R...>) {
  return {&rows_by_strips<R + 1, S>...};
}

// [strips a pass - 1][rows a pass - 1]
const std::array<std::array<RowsFn, kRows>, 2> kRowsFns = {
    table<1>(std::make_integer_sequence<int, kRows>{}),
    table<kStrips>(std::make_integer_sequence<int, kRows>{})};

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
      for (int64_t s = begin; s < end; s += kStrips) {
        const int64_t count = std::min(kStrips, end - s);
        const int64_t width = std::min(count * kStrip, N - s * kStrip);
        for (int64_t m = block; m < block_end; m += kRows) {
          const int64_t rows = std::min(kRows, block_end - m);
          kRowsFns[count - 1][rows - 1](xp + m * K, K, wp + s * K * kStrip, K,
                                        op + m * N + s * kStrip, N, width);
        }
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
  m.def("path", &path, "which instructions compute the sums on this machine");
}
