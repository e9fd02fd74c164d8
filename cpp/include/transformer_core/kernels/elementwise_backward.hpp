// Element-wise and row-wise kernels of training: the backward of the activations, of the gated
// units, of softmax and of the rotary rotation (their forwards: elementwise.hpp, positional.hpp).
// Raw pointers, no checks: the ops validate sizes before calling.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/kernels/fast_math.hpp"

namespace transformer_core::kernels {

// ---- derivatives act'(x) -----------------------------------------------------------------------
// ReLU: 1 for x > 0, else 0 (torch's threshold_backward on the output: 0 where relu(x) <= 0, so a
// NaN input passes the gradient through, as in torch).
template <class T>
inline T relu_grad(T x) {
  return x <= T(0) ? T(0) : T(1);
}

// GELU exact: d/dx [x Φ(x)] = Φ(x) + x φ(x),   Φ(x) = ½ (1 + erf(x/√2)),   φ(x) = e^(-x²/2) / √(2π)
template <class T>
inline T gelu_grad(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(0.39894228040143267794);
  return cdf + x * pdf;
}
// float: the forward's erf polynomial (|error| <= 1.5e-7) and the vectorisable exp
inline float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + fast_math::erf_approx(x * 0.70710678118654752440f));
  const float pdf = fast_math::exp_nonpos(-0.5f * x * x) * 0.39894228040143267794f;
  return cdf + x * pdf;
}

// GELU tanh form, u = √(2/π) (x + 0.044715 x³):
//   d/dx [½ x (1 + tanh u)] = ½ (1 + tanh u) + ½ x (1 - tanh² u) √(2/π) (1 + 3 · 0.044715 x²)
// (torch's GeluBackward for approximate='tanh', term for term)
template <class T>
inline T gelu_tanh_grad(T x) {
  constexpr T kBeta = T(0.79788456080286535588), kKappa = T(0.044715);
  const T x_sq = x * x;
  const T inner = kBeta * (x + kKappa * x_sq * x);
  const T t = tanh_act(inner);
  const T left = T(0.5) * x, right = T(1) + t;
  const T left_derivative = T(0.5) * right;
  const T right_derivative = left * (T(1) - t * t) * kBeta * (T(1) + T(3) * kKappa * x_sq);
  return left_derivative + right_derivative;
}

// SiLU: d/dx [x σ(x)] = σ(x) (1 + x (1 - σ(x)))
template <class T>
inline T silu_grad(T x) {
  const T s = T(1) / (T(1) + std::exp(-x));
  return s * (T(1) + x * (T(1) - s));
}

// float: σ from the vectorisable exp, as the forward (elementwise.hpp's silu)
inline float silu_grad(float x) {
  const float e = fast_math::exp_nonpos(-std::fabs(x));
  const float s = (x >= 0.0f ? 1.0f : e) / (1.0f + e);
  return s * (1.0f + x * (1.0f - s));
}

template <class T>
inline T activation_grad(T x, Activation act) {
  switch (act) {
    case Activation::kRelu: return relu_grad(x);
    case Activation::kGelu: return gelu_grad(x);
    case Activation::kGeluTanh: return gelu_tanh_grad(x);
    case Activation::kSilu: return silu_grad(x);
    case Activation::kTanh: {
      const T t = tanh_act(x);
      return T(1) - t * t;
    }
    case Activation::kNone: break;
  }
  return T(1);
}

// act'(x) on a register, for activation_backward's loops. float uses fast_math's register
// polynomials, double xsimd's erf, exp and tanh (scalar loops, std::erf a value at a time, were
// 10-19x torch's time for float and 3x for double).
template <class T>
inline xsimd::batch<T> gelu_grad_register(const xsimd::batch<T>& x) {
  using B = xsimd::batch<T>;
  B erf_term;
  if constexpr (std::is_same_v<T, float>) erf_term = fast_math::erf_approx(x * B(0.70710678118654752440f));
  else erf_term = erf_register(x * B(0.70710678118654752440));
  const B cdf = B(T(0.5)) * (B(T(1)) + erf_term);
  const B pdf = exp_register(B(T(-0.5)) * x * x) * B(T(0.39894228040143267794));
  return cdf + x * pdf;
}
template <class T>
inline xsimd::batch<T> silu_grad_register(const xsimd::batch<T>& x) {
  using B = xsimd::batch<T>;
  const B s = sigmoid_register(x);
  return s * (B(T(1)) + x * (B(T(1)) - s));
}
template <class T>
inline xsimd::batch<T> gelu_tanh_grad_register(const xsimd::batch<T>& x) {  // gelu_tanh_grad's terms
  using B = xsimd::batch<T>;
  const B beta(T(0.79788456080286535588)), kappa(T(0.044715));
  const B x_sq = x * x;
  const B t = tanh_register(beta * (x + kappa * x_sq * x));
  const B left = B(T(0.5)) * x, right = B(T(1)) + t;
  return B(T(0.5)) * right + left * (B(T(1)) - t * t) * beta * (B(T(1)) + B(T(3)) * kappa * x_sq);
}

// dx = dy · act'(x), element-wise.   x, dy, dx: [n] (dx may alias dy)
template <class T>
inline void activation_backward(const T* x, const T* dy, int64_t n, Activation act, T* dx) {
  using B = xsimd::batch<T>;
  switch (act) {
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) dx[i] = x[i] <= T(0) ? T(0) : dy[i];
      return;
    case Activation::kGelu:
      return map_registers(x, dy, n, dx, [](const B& v, const B& d) { return d * gelu_grad_register(v); });
    case Activation::kSilu:
      return map_registers(x, dy, n, dx, [](const B& v, const B& d) { return d * silu_grad_register(v); });
    case Activation::kGeluTanh:
      return map_registers(x, dy, n, dx, [](const B& v, const B& d) { return d * gelu_tanh_grad_register(v); });
    case Activation::kTanh:
      return map_registers(x, dy, n, dx, [](const B& v, const B& d) {
        const B t = tanh_register(v);
        return d * (B(T(1)) - t * t);
      });
    default: for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * activation_grad(x[i], act); return;
  }
}

// ---- gated linear units (Dauphin et al. 2017; Shazeer 2020, "GLU Variants Improve Transformer") --
//   h = act(gate) · up          SwiGLU: act = SiLU (Llama's MLP), GeGLU: act = GELU
// gate, up, h: [n]
//   d_up = dh · act(gate),   d_gate = dh · up · act'(gate)
// gate, up, dh, d_gate, d_up: [n]
template <class T>
inline void glu_backward(const T* gate, const T* up, const T* dh, int64_t n, Activation act, T* d_gate,
                         T* d_up) {
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i];
    const T dhi = dh[i];
    d_up[i] = dhi * activate_one(g, act);
    // ReLU: a select, as torch's threshold_backward (0 where relu(gate) <= 0, even if dh · up is inf)
    d_gate[i] = act == Activation::kRelu ? (g <= T(0) ? T(0) : dhi * up[i])
                                             : dhi * up[i] * activation_grad(g, act);
  }
}

// ---- softmax backward, one row -------------------------------------------------------------------
// p = softmax(x):   dx_j = p_j (dp_j - Σ_k p_k dp_k)        p, dp, dx: [n] (dx may alias dp)
// A fully masked row (p = 0) gives dx = 0.
template <class T>
inline void softmax_backward_row(const T* p, const T* dp, int64_t n, T* dx) {
  double lane[kSumLanes] = {};  // Σ p·dp in lanes, so that it vectorises (a serial sum: 1.9x torch)
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int64_t t = 0; t < kSumLanes; ++t) lane[t] += static_cast<double>(p[j + t]) * dp[j + t];
  double s = 0;
  for (; j < n; ++j) s += static_cast<double>(p[j]) * dp[j];
  for (int64_t t = 0; t < kSumLanes; ++t) s += lane[t];
  const T st = static_cast<T>(s);
  for (int64_t j = 0; j < n; ++j) dx[j] = p[j] * (dp[j] - st);
}

// ---- rotary backward, one row --------------------------------------------------------------------
// The rotation is linear, y = R x, and orthogonal when cos² + sin² = 1: dx = Rᵀ dy, a rotation by -θ.
// Written as the exact transpose of rotary_half_row / rotary_interleaved_row (positional.hpp), so it
// holds for any table, including halves that differ.
//
// Half-split layout, forward  y[i] = x[i] c[i] - x[i+h] s[i],   y[i+h] = x[i+h] c[i+h] + x[i] s[i+h]:
//   dx[i]     = dy[i] c[i]     + dy[i+h] s[i+h]
//   dx[i + h] = dy[i+h] c[i+h] - dy[i]   s[i]
// d: [2 · half] (dy in, dx out, in place)   cos, sin: [2 · half]
template <class T>
inline void rotary_half_row_backward(T* d, int64_t half, const T* cos_row, const T* sin_row) {
  for (int64_t i = 0; i < half; ++i) {
    const T d1 = d[i], d2 = d[i + half];
    d[i] = d1 * cos_row[i] + d2 * sin_row[i + half];
    d[i + half] = d2 * cos_row[i + half] - d1 * sin_row[i];
  }
}

// Interleaved layout, forward  y[2i] = a c - b s,   y[2i+1] = b c + a s   (a = x[2i], b = x[2i+1]):
//   dx[2i]   = dy[2i] c + dy[2i+1] s
//   dx[2i+1] = dy[2i+1] c - dy[2i] s
// d: [2 · half] (in place)   cos, sin: [half]
template <class T>
inline void rotary_interleaved_row_backward(T* d, int64_t half, const T* cos_row, const T* sin_row) {
  for (int64_t i = 0; i < half; ++i) {
    const T d0 = d[2 * i], d1 = d[2 * i + 1], c = cos_row[i], s = sin_row[i];
    d[2 * i] = d0 * c + d1 * s;
    d[2 * i + 1] = d1 * c - d0 * s;
  }
}

}  // namespace transformer_core::kernels
