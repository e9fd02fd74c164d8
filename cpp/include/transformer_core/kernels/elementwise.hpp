// Row-wise and element-wise kernels on raw pointers: softmax, LayerNorm, activations.
// No checks here: the ops above validate shapes before calling.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "transformer_core/kernels/fast_math.hpp"

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
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const T e = std::exp(x[j] - m);
    x[j] = e;
    sum += e;
  }
  const T inv = T(1) / sum;
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

// LayerNorm of one row (Ba et al. 2016):  y = (x - mean) / sqrt(var + eps) · weight + bias
// Two-pass variance (mean first, then the mean of squared deviations), accumulated in double.
// weight, bias: [n] or nullptr (no affine).  x and y may alias.
template <class T>
inline void layer_norm_row(const T* x, int64_t n, const T* weight, const T* bias, T eps, T* y) {
  double mean = 0;
  for (int64_t j = 0; j < n; ++j) mean += x[j];
  mean /= static_cast<double>(n);
  double var = 0;
  for (int64_t j = 0; j < n; ++j) {
    const double d = x[j] - mean;
    var += d * d;
  }
  var /= static_cast<double>(n);
  const T rstd = static_cast<T>(1.0 / std::sqrt(var + static_cast<double>(eps)));
  const T mu = static_cast<T>(mean);
  for (int64_t j = 0; j < n; ++j) {
    T v = (x[j] - mu) * rstd;
    if (weight != nullptr) v *= weight[j];
    if (bias != nullptr) v += bias[j];
    y[j] = v;
  }
}

enum class Activation { kNone, kRelu, kGelu, kGeluTanh };

// GELU (Hendrycks & Gimpel 2016), exact:  x · Φ(x) = 0.5 · x · (1 + erf(x / √2))
template <class T>
inline T gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
}

// GELU, tanh approximation (GPT-2):  0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 x³)))
// float: erf by a vectorisable polynomial (|error| <= 1.5e-7, see fast_math.hpp)
inline float gelu(float x) {
  return 0.5f * x * (1.0f + fast_math::erf_approx(x * 0.70710678118654752440f));
}

template <class T>
inline T gelu_tanh(T x) {
  const T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(inner));
}

template <class T>
inline T relu(T x) {
  return x > T(0) ? x : (x != x ? x : T(0));  // keeps NaN, as torch does
}

template <class T>
inline void activate(T* x, int64_t n, Activation act) {
  switch (act) {
    case Activation::kNone: return;
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = relu(x[i]);
      return;
    case Activation::kGelu:
      for (int64_t i = 0; i < n; ++i) x[i] = gelu(x[i]);
      return;
    case Activation::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) x[i] = gelu_tanh(x[i]);
      return;
  }
}

}  // namespace transformer_core::kernels
