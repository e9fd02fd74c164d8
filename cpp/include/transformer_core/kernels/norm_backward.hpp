// Normalisation layers, training side: RMSNorm's forward and the backward of LayerNorm and RMSNorm,
// one row per call (the ops parallelise over rows), plus the column-block sums of dweight / dbias.
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

// dx of one LayerNorm row (see the top).   x, dy, dx: [n]   w: [n] or nullptr
// Σ g_k and Σ g_k x̂_k in registers of doubles (two of each, x, dy and w converted as they load),
// their order set by n alone: GCC left the plain loops of doubles from floats half vectorised
// (the backward took 1.6-3.5x torch's time).
template <class T>
inline void layer_norm_backward_row(const T* x, const T* dy, const T* w, int64_t n, double mean, double rstd,
                                    T* dx) {
  using D = DoubleLanes;
  constexpr int64_t W = kDoubleLanes;
  const D mean_v(mean), rstd_v(rstd);
  D g0_sum(0.0), g1_sum(0.0), gx0_sum(0.0), gx1_sum(0.0);
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    D g0 = D::load_unaligned(dy + i), g1 = D::load_unaligned(dy + i + W);
    if (w != nullptr) g0 = g0 * D::load_unaligned(w + i), g1 = g1 * D::load_unaligned(w + i + W);
    const D xhat0 = (D::load_unaligned(x + i) - mean_v) * rstd_v, xhat1 = (D::load_unaligned(x + i + W) - mean_v) * rstd_v;
    g0_sum += g0, g1_sum += g1;
    gx0_sum += g0 * xhat0, gx1_sum += g1 * xhat1;
  }
  alignas(64) double lanes[4][W];
  g0_sum.store_aligned(lanes[0]), g1_sum.store_aligned(lanes[1]);
  gx0_sum.store_aligned(lanes[2]), gx1_sum.store_aligned(lanes[3]);
  double sum_g = 0, sum_gx = 0;  // Σ g_k, Σ g_k x̂_k
  for (; i < n; ++i) {
    const double g = w != nullptr ? static_cast<double>(dy[i]) * w[i] : static_cast<double>(dy[i]);
    sum_g += g;
    sum_gx += g * ((x[i] - mean) * rstd);
  }
  for (int64_t t = 0; t < W; ++t) sum_g += lanes[0][t] + lanes[1][t], sum_gx += lanes[2][t] + lanes[3][t];
  const double inv_n = 1.0 / static_cast<double>(n);
  const double mg = sum_g * inv_n, mgx = sum_gx * inv_n;
  if (w != nullptr)  // two loops, so that each vectorises
    for (int64_t j = 0; j < n; ++j)
      dx[j] = static_cast<T>(rstd * (static_cast<double>(dy[j]) * w[j] - mg - ((x[j] - mean) * rstd) * mgx));
  else
    for (int64_t j = 0; j < n; ++j)
      dx[j] = static_cast<T>(rstd * (static_cast<double>(dy[j]) - mg - ((x[j] - mean) * rstd) * mgx));
}

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

// Column block [c0, c1) of the parameter gradients, summed over all rows in order (one task per
// block, so the sums do not depend on the thread count):
//   dw_j (+)= Σ_r dy[r, j] · (x[r, j] - shift_r) · scale_r       (LayerNorm: shift = mean, scale = rstd;
//   db_j (+)= Σ_r dy[r, j]                                         RMSNorm: shift = 0, scale = r)
// x, dy: [rows, n]   shift, scale: [rows] (shift may be nullptr: 0)   dw, db: [n] or nullptr
template <class T, int64_t kCols>
inline void norm_param_grad_block(const T* x, const T* dy, int64_t rows, int64_t n, const double* shift,
                                  const double* scale, int64_t c0, int64_t c1, T* dw, T* db, bool accumulate) {
  double aw[kCols] = {}, ab[kCols] = {};
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;
    const T* dyr = dy + r * n;
    const double sh = shift != nullptr ? shift[r] : 0.0, sc = scale[r];
    if (dw != nullptr)
      for (int64_t j = c0; j < c1; ++j) aw[j - c0] += static_cast<double>(dyr[j]) * ((xr[j] - sh) * sc);
    if (db != nullptr)
      for (int64_t j = c0; j < c1; ++j) ab[j - c0] += static_cast<double>(dyr[j]);
  }
  for (int64_t j = c0; j < c1; ++j) {
    if (dw != nullptr) dw[j] = static_cast<T>(accumulate ? dw[j] + aw[j - c0] : aw[j - c0]);
    if (db != nullptr) db[j] = static_cast<T>(accumulate ? db[j] + ab[j - c0] : ab[j - c0]);
  }
}

}  // namespace transformer_core::kernels
