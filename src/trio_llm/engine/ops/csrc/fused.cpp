// The elementwise work between a decoder layer's matmuls, one pass each, for bf16 or float32
// rows on the CPU (engine/ops/fused.py):
//   add_rms_norm: x += out (when given), then h = weight * (x / rms(x)), rms over the row;
//   rotate_:      rotary embedding of a row's query and key heads, in place;
//   silu_mul:     silu(gate) * up from the gate_up projection's two halves.
//
// Why: in eager torch these are ~25 small ops a layer (casts, powers, means, slices, a cat),
// each a dispatch of several microseconds at decode sizes, so a lone stream's step spent more
// time between its matmuls than in them. One call each here. Every row is computed from its own
// values in a fixed order, so a row's result does not depend on its batch (batch invariance).
//
// Rounding: values are widened to float32, computed a vector of lanes at a time (csrc/lanes.h),
// and rounded to the row dtype where transformers' modules round (the residual, the normalized
// row, silu's result); the rotary embedding rounds once where eager torch rounds three times.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "lanes.h"

namespace {

typedef uint32_t LanesBits __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef uint16_t Words __attribute__((vector_size(kLanes * sizeof(uint16_t))));

// Lanes of a row's values at [i, i + kLanes) as float32, zeros past `n`; and back, rounded to the
// row dtype (bf16: to nearest even, as torch rounds), nothing written past `n`.
inline Lanes load_row(const float* p, int64_t i, int64_t n) {
  if (i + kLanes <= n) return load_lanes(p + i);
  Lanes out{};
  for (int64_t j = 0; i + j < n; ++j) out[j] = p[i + j];
  return out;
}

inline Lanes load_row(const at::BFloat16* p, int64_t i, int64_t n) {
  Words w{};
  if (i + kLanes <= n) std::memcpy(&w, p + i, sizeof w);
  else std::memcpy(&w, p + i, (n - i) * sizeof(uint16_t));
  const LanesBits bits = __builtin_convertvector(w, LanesBits) << 16;
  Lanes out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// A whole vector is one store; only a row's tail takes a copy of its length.
inline void store_row(float* p, int64_t i, int64_t n, Lanes v) {
  if (i + kLanes <= n) std::memcpy(p + i, &v, sizeof v);
  else std::memcpy(p + i, &v, (n - i) * sizeof(float));
}

// Rounded to bf16 by integer arithmetic: to nearest even, a NaN kept a quiet NaN, a denormal
// rounded as any other value (as torch rounds).
inline Words round_words_exact(Lanes v) {
  LanesBits bits;
  std::memcpy(&bits, &v, sizeof bits);
  const LanesBits rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const LanesBits nan = (bits >> 16) | 0x40u;
  return __builtin_convertvector((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded, Words);
}

#if defined(__AVX512BF16__) && defined(TRIO_LANES16)
// `vcvtneps2bf16` rounds as the integer arithmetic does (to nearest even, a NaN quiet with the
// same bits) in one instruction where that takes ten, but reads a denormal as zero; a vector
// holding one (a float32 below 2^-126 that is not zero) takes the integer arithmetic instead,
// so every value rounds as torch rounds it. At 2,000 rows of the default model the norm took
// 0.68x the time and silu 0.85x (an AMX Xeon, the same bits).
inline Words round_words(Lanes v) {
  __m512 x;
  std::memcpy(&x, &v, sizeof x);
  // A denormal's magnitude lies strictly between 0 and the smallest normal's bits.
  const __m512i magnitude =
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  const __mmask16 denormal =
      _mm512_cmpgt_epu32_mask(magnitude, _mm512_setzero_si512()) &
      _mm512_cmplt_epu32_mask(magnitude, _mm512_set1_epi32(0x00800000));
  if (denormal) [[unlikely]] return round_words_exact(v);
  const __m256i out = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
  Words w;
  std::memcpy(&w, &out, sizeof w);
  return w;
}
#else
inline Words round_words(Lanes v) { return round_words_exact(v); }
#endif

inline void store_row(at::BFloat16* p, int64_t i, int64_t n, Lanes v) {
  const Words w = round_words(v);
  if (i + kLanes <= n) std::memcpy(p + i, &w, sizeof w);
  else std::memcpy(p + i, &w, (n - i) * sizeof(uint16_t));
}

// What a value rounded to the row dtype reads back as (bf16: rounded; float32: itself).
inline Lanes as_row_dtype(Lanes v, const float*) { return v; }

inline Lanes as_row_dtype(Lanes v, const at::BFloat16*) {
  const LanesBits bits = __builtin_convertvector(round_words(v), LanesBits) << 16;
  Lanes out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) (an argument <= 0, as exp_lanes takes).
inline Lanes silu_lanes(Lanes g) {
  const Lanes e = exp_lanes(g < 0.0f ? g : -g);
  // One division for both signs (a vector select evaluates both of its arms).
  const Lanes sigmoid = (g < 0.0f ? e : Lanes{} + 1.0f) / (1.0f + e);
  return g * sigmoid;
}

// Rows of a call are split over threads only when there are enough of them to pay for it.
constexpr int64_t kGrain = 16;

template <class T>
void add_rms_norm_rows(T* x, const T* out, const T* weight, T* h, int64_t rows, int64_t n,
                       int64_t ldx, int64_t ldo, float eps) {
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> row(n + kLanes);
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * ldx;
      Lanes squares{};
      for (int64_t j = 0; j < n; j += kLanes) {
        Lanes v = load_row(xr, j, n);
        if (out != nullptr) {
          v = as_row_dtype(v + load_row(out + r * ldo, j, n), xr);  // the residual as stored
          store_row(xr, j, n, v);
        }
        std::memcpy(row.data() + j, &v, sizeof v);
        squares += v * v;
      }
      const float inv = 1.f / std::sqrt(lanes_sum(squares) / static_cast<float>(n) + eps);
      T* hr = h + r * n;
      for (int64_t j = 0; j < n; j += kLanes) {
        // transformers' order: normalized in float32, rounded to the row dtype, then scaled.
        const Lanes normed = as_row_dtype(load_lanes(row.data() + j) * inv, xr);
        store_row(hr, j, n, load_row(weight, j, n) * normed);
      }
    }
  });
}

template <class T>
void rotate_rows(T* qk, const T* cos, const T* sin, const int64_t* positions, int64_t rows,
                 int64_t heads, int64_t d, int64_t ldq) {
  const int64_t half = d / 2;
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* c = cos + positions[r] * d;
      const T* s = sin + positions[r] * d;
      for (int64_t hd = 0; hd < heads; ++hd) {
        T* v = qk + r * ldq + hd * d;
        for (int64_t j = 0; j < half; j += kLanes) {
          // x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
          const Lanes a = load_row(v, j, half), b = load_row(v + half, j, half);
          store_row(v, j, half, a * load_row(c, j, half) - b * load_row(s, j, half));
          store_row(v + half, j, half,
                    b * load_row(c + half, j, half) + a * load_row(s + half, j, half));
        }
      }
    }
  });
}

template <class T>
void silu_mul_rows(const T* gate_up, T* act, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * 2 * n;
      T* o = act + r * n;
      for (int64_t j = 0; j < n; j += kLanes) {
        // silu rounded to the row dtype, as torch's silu returns it, then the product.
        const Lanes silu = as_row_dtype(silu_lanes(load_row(g, j, n)), o);
        store_row(o, j, n, silu * load_row(g + n, j, n));
      }
    }
  });
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.stride(1) == 1,
              name, ": [rows, n] on the CPU, unit stride along n");
  TORCH_CHECK(t.dtype() == torch::kBFloat16 || t.dtype() == torch::kFloat32,
              name, ": bf16 or float32");
}

}  // namespace

// x [T, n] (its rows may be strided) += out when given; returns weight * rms_norm(x), [T, n].
torch::Tensor add_rms_norm(torch::Tensor x, const std::optional<torch::Tensor>& out,
                           const torch::Tensor& weight, double eps) {
  check_rows(x, "x");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == n && weight.dtype() == x.dtype(),
              "weight: [n] of x's dtype");
  if (out) {
    check_rows(*out, "out");
    TORCH_CHECK(out->sizes() == x.sizes() && out->dtype() == x.dtype(), "out: x's shape, dtype");
  }
  auto h = torch::empty({rows, n}, x.options());
  AT_DISPATCH_SWITCH(x.scalar_type(), "add_rms_norm",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      add_rms_norm_rows<float>(x.data_ptr<float>(), out ? out->data_ptr<float>() : nullptr,
                               weight.data_ptr<float>(), h.data_ptr<float>(), rows, n,
                               x.stride(0), out ? out->stride(0) : 0, static_cast<float>(eps));
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      using T = at::BFloat16;
      add_rms_norm_rows<T>(x.data_ptr<T>(), out ? out->data_ptr<T>() : nullptr,
                           weight.data_ptr<T>(), h.data_ptr<T>(), rows, n, x.stride(0),
                           out ? out->stride(0) : 0, static_cast<float>(eps));
    }));
  return h;
}

// Rotates, in place, the first `heads` heads of `d` values of each row of qk ([T, >= heads * d],
// rows strided) by the rows `positions` of cos and sin ([positions, d], qk's dtype).
void rotate_(torch::Tensor qk, int64_t heads, int64_t d, const torch::Tensor& cos,
             const torch::Tensor& sin, const torch::Tensor& positions) {
  check_rows(qk, "qk");
  TORCH_CHECK(qk.size(1) >= heads * d && d % 2 == 0, "qk: heads * d values a row");
  for (const auto* t : {&cos, &sin})
    TORCH_CHECK(t->is_contiguous() && t->dim() == 2 && t->size(1) == d &&
                    t->dtype() == qk.dtype(),
                "cos, sin: contiguous [positions, d] of qk's dtype");
  TORCH_CHECK(positions.dtype() == torch::kInt64 && positions.is_contiguous() &&
                  positions.numel() == qk.size(0),
              "positions: one int64 a row");
  const auto* pos = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < qk.size(0); ++r)
    TORCH_CHECK(pos[r] >= 0 && pos[r] < cos.size(0), "a position past the rotary table");
  AT_DISPATCH_SWITCH(qk.scalar_type(), "rotate_",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      rotate_rows<float>(qk.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                         pos, qk.size(0), heads, d, qk.stride(0));
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      using T = at::BFloat16;
      rotate_rows<T>(qk.data_ptr<T>(), cos.data_ptr<T>(), sin.data_ptr<T>(), pos, qk.size(0),
                     heads, d, qk.stride(0));
    }));
}

// gate_up [T, 2 n] (contiguous) -> silu(gate_up[:, :n]) * gate_up[:, n:], [T, n].
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.is_contiguous() && gate_up.size(1) % 2 == 0, "gate_up: contiguous [T, 2 n]");
  const int64_t rows = gate_up.size(0), n = gate_up.size(1) / 2;
  auto act = torch::empty({rows, n}, gate_up.options());
  AT_DISPATCH_SWITCH(gate_up.scalar_type(), "silu_mul",
    AT_DISPATCH_CASE(at::kFloat, [&] {
      silu_mul_rows<float>(gate_up.data_ptr<float>(), act.data_ptr<float>(), rows, n);
    })
    AT_DISPATCH_CASE(at::kBFloat16, [&] {
      using T = at::BFloat16;
      silu_mul_rows<T>(gate_up.data_ptr<T>(), act.data_ptr<T>(), rows, n);
    }));
  return act;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "x += out; weight * rms_norm(x)");
  m.def("rotate_", &rotate_, "rotary embedding of query and key heads, in place");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
}
