// Row-wise and element-wise kernels on raw pointers: softmax, LayerNorm, RMSNorm, activations.
// No checks here: the ops above validate shapes before calling.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "transformer_core/kernels/fast_math.hpp"
#include "transformer_core/kernels/simd.hpp"

namespace transformer_core::kernels {

// Numerically stable softmax of one row, in place:  p_j = exp(x_j - max x) / Σ_k exp(x_k - max x)
// A row with no finite entry above -inf (everything masked) becomes zeros, not NaN; a NaN anywhere
// in the row still gives NaN.
template <class T>
inline void softmax_row(T* x, int64_t n) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  T m = neg_inf;
  bool has_nan = false;
  for (int64_t j = 0; j < n; ++j) {
    const T v = x[j];
    if (v > m) m = v;
    else if (v != v) has_nan = true;
  }
  if (m == neg_inf) {
    const T fill = has_nan ? std::numeric_limits<T>::quiet_NaN() : T(0);
    for (int64_t j = 0; j < n; ++j) x[j] = fill;
    return;
  }
  double sum = 0;  // in double: a float sum of thousands of terms drifted by 2e-5 (S = 4,097)
  for (int64_t j = 0; j < n; ++j) {
    const T e = std::exp(x[j] - m);
    x[j] = e;
    sum += e;
  }
  const T inv = static_cast<T>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

// y[j] += x[j], j < n
template <class T>
inline void add_row(T* y, const T* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += x[j];
}

// ---- sums of a row, in double, in a fixed order ---------------------------------------------------
// kSumLanes partial sums so that the loops vectorise; the order depends on n only.
constexpr int64_t kSumLanes = 8;

// Float rows: kFloatSumLanes lanes of doubles in xsimd registers (four independent chains of
// additions on AVX-512, eight on AVX2); as above, the order depends on n only. GCC left the plain
// loop of centered_sums scalar (two sums in one loop): it was two thirds of LayerNorm's time, 210 ns
// per add + LayerNorm of a MiniLM row of 384 on Zen 5, 110 ns with these.
constexpr int64_t kFloatSumLanes = 32;
using DoubleLanes = xsimd::batch<double>;
constexpr int64_t kDoubleLanes = static_cast<int64_t>(DoubleLanes::size);
static_assert(kFloatSumLanes % kDoubleLanes == 0, "kFloatSumLanes lanes must be whole registers");

// Σ_j x[j] for float input: every float is exact in double, so plain double lanes lose at most a
// few double ulps of the sum.
inline double row_sum(const float* x, int64_t n) {
  constexpr int64_t R = kFloatSumLanes / kDoubleLanes;
  DoubleLanes acc[R];
  for (int64_t r = 0; r < R; ++r) acc[r] = DoubleLanes(0.0);
  int64_t j = 0;
  for (; j + kFloatSumLanes <= n; j += kFloatSumLanes)
    for (int64_t r = 0; r < R; ++r) acc[r] += DoubleLanes::load_unaligned(x + j + r * kDoubleLanes);  // float → double
  alignas(64) double lane[kFloatSumLanes];
  for (int64_t r = 0; r < R; ++r) acc[r].store_aligned(lane + r * kDoubleLanes);
  double s = 0;
  for (; j < n; ++j) s += static_cast<double>(x[j]);
  for (int64_t t = 0; t < kFloatSumLanes; ++t) s += lane[t];
  return s;
}

// Σ_j x[j] for double input, compensated (Neumaier 1974): each lane carries the rounding error of
// its additions, so rows like 1e8 + N(0, 0.1) keep their small part (a naive sum loses ~1e-6).
inline double row_sum(const double* x, int64_t n) {
  double lane[kSumLanes] = {}, comp[kSumLanes] = {};
  auto add = [](double& s, double& c, double v) {
    const double t = s + v;
    c += std::fabs(s) >= std::fabs(v) ? (s - t) + v : (v - t) + s;
    s = t;
  };
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int64_t t = 0; t < kSumLanes; ++t) add(lane[t], comp[t], x[j + t]);
  double s = 0, c = 0;
  for (; j < n; ++j) add(s, c, x[j]);
  for (int64_t t = 0; t < kSumLanes; ++t) {
    add(s, c, lane[t]);
    add(s, c, comp[t]);
  }
  return s + c;
}

// Σ_j (x[j] - mu) and Σ_j (x[j] - mu)², in double lanes.
template <class T>
inline void centered_sums(const T* x, int64_t n, double mu, double* sum, double* sum_sq) {
  double s1[kSumLanes] = {}, s2[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int64_t t = 0; t < kSumLanes; ++t) {
      const double d = static_cast<double>(x[j + t]) - mu;
      s1[t] += d;
      s2[t] += d * d;
    }
  double a = 0, b = 0;
  for (; j < n; ++j) {
    const double d = static_cast<double>(x[j]) - mu;
    a += d;
    b += d * d;
  }
  for (int64_t t = 0; t < kSumLanes; ++t) a += s1[t], b += s2[t];
  *sum = a;
  *sum_sq = b;
}

// The same sums for a float row, in kFloatSumLanes lanes of doubles (see row_sum above).
inline void centered_sums(const float* x, int64_t n, double mu, double* sum, double* sum_sq) {
  constexpr int64_t R = kFloatSumLanes / kDoubleLanes;
  DoubleLanes s1[R], s2[R];
  for (int64_t r = 0; r < R; ++r) s1[r] = s2[r] = DoubleLanes(0.0);
  const DoubleLanes m(mu);
  int64_t j = 0;
  for (; j + kFloatSumLanes <= n; j += kFloatSumLanes)
    for (int64_t r = 0; r < R; ++r) {
      const DoubleLanes d = DoubleLanes::load_unaligned(x + j + r * kDoubleLanes) - m;
      s1[r] += d;
      s2[r] = simd::fma(d, d, s2[r]);
    }
  alignas(64) double l1[kFloatSumLanes], l2[kFloatSumLanes];
  for (int64_t r = 0; r < R; ++r) s1[r].store_aligned(l1 + r * kDoubleLanes), s2[r].store_aligned(l2 + r * kDoubleLanes);
  double a = 0, b = 0;
  for (; j < n; ++j) {
    const double d = static_cast<double>(x[j]) - mu;
    a += d;
    b = std::fma(d, d, b);
  }
  for (int64_t t = 0; t < kFloatSumLanes; ++t) a += l1[t], b += l2[t];
  *sum = a;
  *sum_sq = b;
}

// mean and rstd = 1 / sqrt(var + eps) of one row, in double, by the corrected two-pass algorithm
// (Chan, Golub & LeVeque 1983): μ₀ from a compensated sum, then d = x - μ₀,
// mean = μ₀ + δ with δ = Σd / n,  var = (Σd² - (Σd)² / n) / n. The mean is returned in two parts
// (μ₀, δ): x - μ₀ is exact for x near μ₀ (Sterbenz), so (x - μ₀) - δ keeps the digits that
// x - (μ₀ + δ) would round away on rows like 1e8 + N(0, 0.1) (a float64 mean there has an ulp of
// 1.5e-8, a tenth of a percent of σ). LayerNorm's forward and backward share it.
template <class T>
inline void layer_norm_stats(const T* x, int64_t n, double eps, double& mu0, double& delta, double& rstd) {
  const double inv_n = 1.0 / static_cast<double>(n);
  mu0 = row_sum(x, n) * inv_n;
  double sd = 0, sd2 = 0;
  centered_sums(x, n, mu0, &sd, &sd2);
  if (std::isinf(sd2) && std::isfinite(mu0)) {
    // Σd² overflowed (some |x - μ₀| beyond ~1e154: float64 rows only; a float's square fits a
    // double). The same sums over d / s, s = max |d|, and rstd = 1 / (s · sqrt(var_s + eps / s²))
    // without forming s² (once gave rstd = 0: a row of zeros, where the true values are finite).
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s = std::max(s, std::abs(static_cast<double>(x[j]) - mu0));
    double a = 0, b = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double d = (static_cast<double>(x[j]) - mu0) / s;
      a += d;
      b = std::fma(d, d, b);
    }
    delta = (a * inv_n) * s;
    const double var_s = std::max(0.0, (b - a * a * inv_n) * inv_n);
    rstd = 1.0 / (s * std::sqrt(var_s + eps / s / s));
    return;
  }
  delta = sd * inv_n;
  const double var = std::max(0.0, (sd2 - sd * sd * inv_n) * inv_n);
  rstd = 1.0 / std::sqrt(var + eps);
}

template <class T>
inline void layer_norm_stats(const T* x, int64_t n, double eps, double& mean, double& rstd) {
  double mu0 = 0, delta = 0;
  layer_norm_stats(x, n, eps, mu0, delta, rstd);
  mean = mu0 + delta;
}

// LayerNorm of one row (Ba et al. 2016):  y = (x - mean) / sqrt(var + eps) · weight + bias
// weight, bias: [n] or nullptr (no affine).  x and y may alias. float rows subtract the mean
// rounded to float (their own precision); double rows subtract it in two parts (see above).
template <class T>
inline void layer_norm_row(const T* x, int64_t n, const T* weight, const T* bias, T eps, T* y) {
  double mu0 = 0, delta = 0, rstd_d = 0;
  layer_norm_stats(x, n, static_cast<double>(eps), mu0, delta, rstd_d);
  const T rstd = static_cast<T>(rstd_d);
  if constexpr (std::is_same_v<T, double>) {
    for (int64_t j = 0; j < n; ++j) {
      T v = ((x[j] - mu0) - delta) * rstd;
      if (weight != nullptr) v *= weight[j];
      if (bias != nullptr) v += bias[j];
      y[j] = v;
    }
  } else if (rstd_d > static_cast<double>(std::numeric_limits<T>::max())) {
    // a row of subnormals with eps = 0: 1 / std overflows float, (x - mean) · rstd does not
    const double mean = mu0 + delta;
    for (int64_t j = 0; j < n; ++j) {
      T v = static_cast<T>((static_cast<double>(x[j]) - mean) * rstd_d);
      if (weight != nullptr) v *= weight[j];
      if (bias != nullptr) v += bias[j];
      y[j] = v;
    }
  } else {
    const T mu = static_cast<T>(mu0 + delta);
    for (int64_t j = 0; j < n; ++j) {
      T v = (x[j] - mu) * rstd;
      if (weight != nullptr) v *= weight[j];
      if (bias != nullptr) v += bias[j];
      y[j] = v;
    }
  }
}

// 1 / sqrt(mean(x²) + eps) of one row, mean(x²) accumulated in double lanes. RMSNorm's forward and
// backward share it.
template <class T>
inline double rms_norm_rstd(const T* x, int64_t n, double eps) {
  double lane[kSumLanes] = {};
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int64_t t = 0; t < kSumLanes; ++t) lane[t] += static_cast<double>(x[j + t]) * static_cast<double>(x[j + t]);
  double ss = 0;
  for (; j < n; ++j) ss += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  for (int64_t t = 0; t < kSumLanes; ++t) ss += lane[t];
  if (std::isinf(ss)) {
    // Σx² overflowed (some |x| beyond ~1e154: float64 rows only; a float's square fits a double).
    // As LayerNorm does: the sum over (x / s)², s = max |x|, and 1 / (s · sqrt(mean_s + eps / s²))
    // without forming s² (it gave 0: a row of zeros, where the true values are finite). An Inf in
    // x keeps Σ = Inf and the row's 0 · Inf = NaN, as torch gives.
    double s = 0;
    for (int64_t k = 0; k < n; ++k) s = std::max(s, std::abs(static_cast<double>(x[k])));
    if (std::isinf(s)) return 0.0;
    double ss_s = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double d = static_cast<double>(x[k]) / s;
      ss_s = std::fma(d, d, ss_s);
    }
    return 1.0 / (s * std::sqrt(ss_s / static_cast<double>(n) + eps / s / s));
  }
  return 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
}

// RMSNorm of one row (Zhang & Sennrich 2019; Llama):  y = x / sqrt(mean(x²) + eps) · weight
// weight: [n] or nullptr.  x and y may alias.
template <class T>
inline void rms_norm_row(const T* x, int64_t n, const T* weight, T eps, T* y) {
  const double rrms_d = rms_norm_rstd(x, n, static_cast<double>(eps));
  if (rrms_d > static_cast<double>(std::numeric_limits<T>::max())) {  // subnormals, eps = 0: in double
    for (int64_t k = 0; k < n; ++k) {
      const T v = static_cast<T>(static_cast<double>(x[k]) * rrms_d);
      y[k] = weight != nullptr ? v * weight[k] : v;
    }
    return;
  }
  const T rrms = static_cast<T>(rrms_d);
  for (int64_t k = 0; k < n; ++k) {
    const T v = x[k] * rrms;
    y[k] = weight != nullptr ? v * weight[k] : v;
  }
}

// GCC vectorises loops 256 bits wide even where AVX-512 is on (-march=native on a CPU with it);
// this asks for 512 on one function, where it pays: the GELU of the linear layers' epilogue took
// 0.75 instead of 0.95 ns a value (a Xeon with AVX-512). Without AVX-512 it changes nothing.
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define TC_PREFER_512 __attribute__((target("prefer-vector-width=512")))
#else
#define TC_PREFER_512
#endif

// The activations of the library; their names (one table) are in ops/activation.hpp.
enum class Activation { kNone, kRelu, kGelu, kGeluTanh, kSilu, kTanh };

// GELU (Hendrycks & Gimpel 2016), exact:  x · Φ(x) = 0.5 · x · (1 + erf(x / √2))
template <class T>
inline T gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
}
// float: erf by a vectorisable polynomial (|error| <= 1.5e-7, see fast_math.hpp)
inline float gelu(float x) {
  return 0.5f * x * (1.0f + fast_math::erf_approx(x * 0.70710678118654752440f));
}

// GELU, tanh approximation (GPT-2):  0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 x³)))
template <class T>
inline T gelu_tanh(T x) {
  const T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(inner));
}

// float: tanh by fast_math::tanh_approx (relative error <= 2e-7), vectorisable
inline float gelu_tanh(float x) {
  const float inner = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + fast_math::tanh_approx(inner));
}

// tanh: std::tanh for double, the vectorisable polynomial for float
template <class T>
inline T tanh_act(T x) {
  return std::tanh(x);
}
inline float tanh_act(float x) { return fast_math::tanh_approx(x); }

template <class T>
inline T relu(T x) {
  return x > T(0) ? x : (x != x ? x : T(0));  // keeps NaN, as torch does
}

// SiLU / swish (Elfwing et al. 2018; Llama's SwiGLU gate):  x · σ(x) = x / (1 + exp(-x))
template <class T>
inline T silu(T x) {
  return x / (T(1) + std::exp(-x));
}
// float, vectorisable: σ(x) from e = exp(-|x|) ∈ (0, 1]: σ = 1 / (1 + e) for x ≥ 0, e / (1 + e) else.
inline float silu(float x) {
  const float e = fast_math::exp_nonpos(-std::fabs(x));
  const float sig = (x >= 0.0f ? 1.0f : e) / (1.0f + e);
  return x * sig;
}

template <class T>
inline T activate_one(T x, Activation act) {
  switch (act) {
    case Activation::kRelu: return relu(x);
    case Activation::kGelu: return gelu(x);
    case Activation::kGeluTanh: return gelu_tanh(x);
    case Activation::kSilu: return silu(x);
    case Activation::kTanh: return tanh_act(x);
    case Activation::kNone: break;
  }
  return x;
}

// x[i] = gelu(x[i]), i < n, in place, a register of floats at a time with its FMAs written out (the
// feed-forward layers' epilogue); the last n mod size values go through one padded register, so
// every value takes the same operations wherever it sits.
inline void gelu_rows(float* x, int64_t n) {
  using B = xsimd::batch<float>;
  constexpr int64_t W = static_cast<int64_t>(B::size);
  const auto gelu_batch = [](const B& v) {
    return B(0.5f) * v * (B(1.0f) + fast_math::erf_approx(v * B(0.70710678118654752440f)));
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) gelu_batch(B::load_unaligned(x + i)).store_unaligned(x + i);
  if (i < n) {
    alignas(64) float tail[W] = {};
    std::copy(x + i, x + n, tail);
    gelu_batch(B::load_aligned(tail)).store_aligned(tail);
    std::copy(tail, tail + (n - i), x + i);
  }
}

// x[i] = act(x[i]), i < n, in place. One loop per activation, so that each vectorises.
template <class T>
TC_PREFER_512 inline void activate(T* x, int64_t n, Activation act) {
  switch (act) {
    case Activation::kNone: return;
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = relu(x[i]);
      return;
    case Activation::kGelu:
      if constexpr (std::is_same_v<T, float>) return gelu_rows(x, n);
      for (int64_t i = 0; i < n; ++i) x[i] = gelu(x[i]);
      return;
    case Activation::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) x[i] = gelu_tanh(x[i]);
      return;
    case Activation::kSilu:
      for (int64_t i = 0; i < n; ++i) x[i] = silu(x[i]);
      return;
    case Activation::kTanh:
      for (int64_t i = 0; i < n; ++i) x[i] = tanh_act(x[i]);
      return;
  }
}

// Gated linear unit of one row (Shazeer 2020, "GLU variants"; SwiGLU with SiLU, GeGLU with GELU):
//   out[j] = act(gate[j]) · up[j],   j < n        gate, up, out: [n]; out may alias gate or up.
template <class T>
inline void gated_row(const T* gate, const T* up, int64_t n, Activation act, T* out) {
  switch (act) {
    case Activation::kSilu:
      for (int64_t j = 0; j < n; ++j) out[j] = silu(gate[j]) * up[j];
      return;
    case Activation::kGelu:
      for (int64_t j = 0; j < n; ++j) out[j] = gelu(gate[j]) * up[j];
      return;
    default:
      for (int64_t j = 0; j < n; ++j) out[j] = activate_one(gate[j], act) * up[j];
      return;
  }
}

}  // namespace transformer_core::kernels
