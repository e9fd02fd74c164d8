// Cross-entropy fused with log-softmax over the vocabulary, one row per call, forward and backward
// in the same pass over the logits (llm.c's crossentropy_softmax_backward; torch's cross_entropy
// with label_smoothing, LossNLL.cpp).
//
// Row x[V] with target t, label smoothing ε:
//   lse = log Σ_j exp(x_j)                        (max-subtracted: m + log Σ exp(x_j - m))
//   nll = lse - x_t                               (-log softmax(x)_t)
//   smooth = Σ_j (lse - x_j) = V · lse - Σ_j x_j  (-Σ_j log softmax(x)_j, torch's smooth_loss)
//   loss = (1 - ε) · nll + (ε / V) · smooth
// Gradient of w · loss (w: the row's weight, e.g. 1 / #non-ignored rows for reduction="mean"):
//   dx_j = w · (p_j - ε / V - (1 - ε) · [j = t]),     p_j = exp(x_j - lse)
// since (1 - ε)(p_j - [j = t]) + (ε / V)(V p_j - 1) = p_j - ε/V - (1 - ε)[j = t].
//
// The sums run in double; exp by the vectorisable fast_math::exp_nonpos. A NaN logit makes the row's
// loss and gradient NaN (the caller reports it); logits of +inf give NaN as well.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "transformer_core/kernels/fast_math.hpp"
#include "transformer_core/kernels/flash_attention.hpp"

namespace transformer_core::kernels {

// Returns the row's loss; writes dx (if not nullptr) scaled by w.   x, dx: [V]   0 <= t < V
template <class T>
inline double cross_entropy_row(const T* x, int64_t V, int64_t t, double label_smoothing, double w, T* dx) {
  const T m = flash_detail::row_max(x, V);  // NaN anywhere: m is NaN and so is everything below
  // Σ exp(x_j - m), 16 partial sums so the loop vectorises
  constexpr int64_t W = 16;
  double lane[W] = {};
  int64_t j = 0;
  for (; j + W <= V; j += W)
    for (int64_t u = 0; u < W; ++u) lane[u] += static_cast<double>(fast_math::exp_nonpos(x[j + u] - m));
  double sum = 0;
  for (; j < V; ++j) sum += static_cast<double>(fast_math::exp_nonpos(x[j] - m));
  for (int64_t u = 0; u < W; ++u) sum += lane[u];
  // lse - x_t as (m - x_t) + log Σ: m - x_t is exact in double, and log Σ (≤ log V) is not rounded
  // away by a large m (logits of 3e38: m + log Σ - x_t would give 0 instead of log 3)
  const double log_sum = std::log(sum);
  double loss = (1.0 - label_smoothing) * ((static_cast<double>(m) - static_cast<double>(x[t])) + log_sum);
  if (label_smoothing != 0.0) {
    // Σ_k (lse - x_k) = Σ_k (m - x_k) + V log Σ, each m - x_k exact in double
    double sd = 0;
    for (int64_t k = 0; k < V; ++k) sd += static_cast<double>(m) - static_cast<double>(x[k]);
    loss += label_smoothing / static_cast<double>(V) * (sd + static_cast<double>(V) * log_sum);
  }
  if (dx != nullptr) {
    // x_j - lse as (x_j - m) - log Σ: x_j - m is exact near the max (Sterbenz) and log Σ is small
    // (≤ log V), so the exponent's error is relative to the exponent itself. x_j - T(lse) instead
    // rounded lse to T first: an error of up to half an ulp of |lse|, 5e-5 in p_j at logits of 1e4.
    const T log_sum = static_cast<T>(std::log(sum)), wt = static_cast<T>(w);
    const T off = static_cast<T>(label_smoothing / static_cast<double>(V));
    // ≤ 0 (m is the max, log Σ ≥ 0); the clamp keeps exp_nonpos's domain against any rounding
    for (int64_t k = 0; k < V; ++k) {
      const T e = (x[k] - m) - log_sum;
      dx[k] = wt * (fast_math::exp_nonpos(e > T(0) ? T(0) : e) - off);
    }
    dx[t] -= static_cast<T>(w * (1.0 - label_smoothing));
  }
  return loss;
}

}  // namespace transformer_core::kernels
