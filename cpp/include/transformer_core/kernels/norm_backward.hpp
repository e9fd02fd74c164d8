// Normalisation layers, training side: RMSNorm's forward and the backward of LayerNorm and RMSNorm,
// one row per call (the ops parallelise over rows), plus one row's terms of dweight / dbias (the
// op adds them up in chunks of rows, ops/backward.cpp).
//
// LayerNorm (Ba et al. 2016), one row x[n]:
//   mean = Σ x_j / n,   rstd = 1 / sqrt(Σ (x_j - mean)² / n + eps),   x̂_j = (x_j - mean) · rstd
//   y_j = x̂_j · w_j + b_j
// Backward, with g_j = dy_j · w_j (g = dy without affine):
//   dx_j = rstd · (g_j - mean_k(g_k) - x̂_j · mean_k(g_k x̂_k))
//   dw_j = Σ_rows dy_j x̂_j,   db_j = Σ_rows dy_j
//
// RMSNorm (Zhang & Sennrich 2019; Llama's LlamaRMSNorm), one row x[n]:
//   r = 1 / sqrt(Σ x_j² / n + eps),   y_j = x_j · r · w_j
// Backward, with g_j = dy_j · w_j:
//   dx_j = r · (g_j - x_j · r² · mean_k(g_k x_k))
//   dw_j = Σ_rows dy_j x_j r
//
// Statistics and the row sums are accumulated in double (layer_norm_stats / rms_norm_rstd, shared
// with the forward), so float inputs lose nothing to the reductions. mean and rstd are recomputed from x in the
// backward: one more read of the row, and the forward stays untouched (llm.c saves them instead).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "transformer_core/kernels/elementwise.hpp"

namespace transformer_core::kernels {

// dx of one LayerNorm row (see the top).   x, dy, dx: [n]   w: [n] or nullptr   scratch: [2n] or nullptr
// Σ g_k and Σ g_k x̂_k in registers of doubles (two of each, x, dy and w converted as they load),
// their order set by n alone: GCC left the plain loops of doubles from floats half vectorised
// (the backward took 1.6-3.5x torch's time). Given scratch, that pass also keeps g and x̂ in doubles
// there, so that the pass of dx converts nothing but its result: float rows are bound by the
// conversions (one port on Intel), and the rows of (1024, 768) floats took 570 µs when this pass
// converted x, dy and w again, 410 µs from scratch (in float the same bits). Without scratch (a row
// too long for its doubles to stay in cache, kernels::kNormRowScratch), the dx pass converts again.
template <class T>
inline void layer_norm_backward_row(const T* x, const T* dy, const T* w, int64_t n, double mean, double rstd,
                                    T* dx, double* scratch) {
  using D = DoubleLanes;
  constexpr int64_t W = kDoubleLanes;
  double* g = scratch;                                      // g_j = dy_j · w_j
  double* xhat = scratch != nullptr ? scratch + n : nullptr;  // x̂_j
  const D mean_v(mean), rstd_v(rstd);
  D g0_sum(0.0), g1_sum(0.0), gx0_sum(0.0), gx1_sum(0.0);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    D g0 = D::load_unaligned(dy + i), g1 = D::load_unaligned(dy + i + W);
    if (w != nullptr) g0 = g0 * D::load_unaligned(w + i), g1 = g1 * D::load_unaligned(w + i + W);
    const D xhat0 = (D::load_unaligned(x + i) - mean_v) * rstd_v, xhat1 = (D::load_unaligned(x + i + W) - mean_v) * rstd_v;
    if (scratch != nullptr) {
      g0.store_unaligned(g + i), g1.store_unaligned(g + i + W);
      xhat0.store_unaligned(xhat + i), xhat1.store_unaligned(xhat + i + W);
    }
    g0_sum += g0, g1_sum += g1;
    gx0_sum += g0 * xhat0, gx1_sum += g1 * xhat1;
  }
  alignas(64) double lanes[4][W];
  g0_sum.store_aligned(lanes[0]), g1_sum.store_aligned(lanes[1]);
  gx0_sum.store_aligned(lanes[2]), gx1_sum.store_aligned(lanes[3]);
  double sum_g = 0, sum_gx = 0;  // Σ g_k, Σ g_k x̂_k
  for (; i < n; ++i) {
    const double gi = w != nullptr ? static_cast<double>(dy[i]) * w[i] : static_cast<double>(dy[i]);
    const double xi = (x[i] - mean) * rstd;
    if (scratch != nullptr) g[i] = gi, xhat[i] = xi;
    sum_g += gi;
    sum_gx += gi * xi;
  }
  for (int64_t t = 0; t < W; ++t) sum_g += lanes[0][t] + lanes[1][t], sum_gx += lanes[2][t] + lanes[3][t];
  const double inv_n = 1.0 / static_cast<double>(n);
  const double mg = sum_g * inv_n, mgx = sum_gx * inv_n;
  if (scratch != nullptr)
    for (int64_t j = 0; j < n; ++j) dx[j] = static_cast<T>(rstd * (g[j] - mg - xhat[j] * mgx));
  else if (w != nullptr)  // two loops, so that each vectorises
    for (int64_t j = 0; j < n; ++j)
      dx[j] = static_cast<T>(rstd * (static_cast<double>(dy[j]) * w[j] - mg - ((x[j] - mean) * rstd) * mgx));
  else
    for (int64_t j = 0; j < n; ++j)
      dx[j] = static_cast<T>(rstd * (static_cast<double>(dy[j]) - mg - ((x[j] - mean) * rstd) * mgx));
}

// The longest row whose g and x̂ layer_norm_backward_row keeps in scratch (2n doubles: 256 KiB, about
// what L2 holds beside the row itself); a longer one would only move them through memory.
constexpr int64_t kNormRowScratch = 16384;

// dx of one RMSNorm row (see the top).   x, dy, dx: [n]   w: [n] or nullptr
template <class T>
inline void rms_norm_backward_row(const T* x, const T* dy, const T* w, int64_t n, double r, T* dx) {
  double sum_gx = 0;  // Σ g_k x_k
  for (int64_t j = 0; j < n; ++j) {
    const double g = w != nullptr ? static_cast<double>(dy[j]) * w[j] : static_cast<double>(dy[j]);
    sum_gx += g * x[j];
  }
  const double c = r * sum_gx / static_cast<double>(n) * r;  // r · Σ first: r² underflows where |x| ~ 1e160
  for (int64_t j = 0; j < n; ++j) {
    const double g = w != nullptr ? static_cast<double>(dy[j]) * w[j] : static_cast<double>(dy[j]);
    dx[j] = static_cast<T>(r * (g - x[j] * c));
  }
}

// One row's terms of the parameter gradients, added to a chunk's partial sums (the op sums the rows
// of a chunk while they are in cache, then the chunks in order):
//   aw[j] += dy[j] · ((x[j] - shift) · scale)       (LayerNorm: shift = mean, scale = rstd;
//   ab[j] += dy[j]                                    RMSNorm: shift = 0, scale = r)
// x, dy: [n]   aw, ab: [n] or nullptr. x and dy convert to double as they load, a register at a time.
template <class T>
inline void norm_param_grad_row(const T* x, const T* dy, int64_t n, double shift, double scale, double* aw,
                                double* ab) {
  using D = DoubleLanes;
  constexpr int64_t W = kDoubleLanes;
  const D sh(shift), sc(scale);
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const D d = D::load_unaligned(dy + j);
    if (aw != nullptr) (D::load_unaligned(aw + j) + d * ((D::load_unaligned(x + j) - sh) * sc)).store_unaligned(aw + j);
    if (ab != nullptr) (D::load_unaligned(ab + j) + d).store_unaligned(ab + j);
  }
  for (; j < n; ++j) {  // the same operations, a value at a time
    if (aw != nullptr) aw[j] += static_cast<double>(dy[j]) * ((x[j] - shift) * scale);
    if (ab != nullptr) ab[j] += static_cast<double>(dy[j]);
  }
}

}  // namespace transformer_core::kernels
