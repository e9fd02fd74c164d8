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

// ---- registers over a whole row --------------------------------------------------------------
// y[i] = f(x[i]), i < n, f on one xsimd register at a time; the last n mod size values go through one
// register padded with `pad`, so that every value takes the same operations wherever it sits (and the
// result does not depend on how the ops cut the work). y may alias x.
template <class T, class F>
inline void map_registers(const T* x, int64_t n, T* y, T pad, F f) {
  using B = xsimd::batch<T>;
  constexpr int64_t W = static_cast<int64_t>(B::size);
  int64_t i = 0;
  for (; i + W <= n; i += W) f(B::load_unaligned(x + i)).store_unaligned(y + i);
  if (i < n) {
    alignas(64) T tail[W];
    std::fill(tail, tail + W, pad);
    std::copy(x + i, x + n, tail);
    f(B::load_aligned(tail)).store_aligned(tail);
    std::copy(tail, tail + (n - i), y + i);
  }
}

// The same with two inputs: y[i] = f(a[i], b[i]) (the backward passes: x and the incoming gradient).
template <class T, class F>
inline void map_registers(const T* a, const T* b, int64_t n, T* y, F f) {
  using B = xsimd::batch<T>;
  constexpr int64_t W = static_cast<int64_t>(B::size);
  int64_t i = 0;
  for (; i + W <= n; i += W) f(B::load_unaligned(a + i), B::load_unaligned(b + i)).store_unaligned(y + i);
  if (i < n) {
    alignas(64) T ta[W] = {}, tb[W] = {};
    std::copy(a + i, a + n, ta);
    std::copy(b + i, b + n, tb);
    f(B::load_aligned(ta), B::load_aligned(tb)).store_aligned(ta);
    std::copy(ta, ta + (n - i), y + i);
  }
}

// exp(x) for x <= 0 on a register: float by the Cephes polynomial of fast_math (<= 1 ulp), double by
// xsimd's exp (<= 1 ulp); exp(-inf) = 0 and NaN stays NaN in both.
inline xsimd::batch<float> exp_register(const xsimd::batch<float>& x) { return fast_math::exp_nonpos(x); }
inline xsimd::batch<double> exp_register(const xsimd::batch<double>& x) { return xsimd::exp(x); }

// erf of doubles on a register: xsimd's, its argument clamped to [-6, 6], where erf is ±1 to the last
// bit (xsimd's erf gives NaN beyond |x| ≈ 1.2e62, so GELU of a huge x did; std::erf gives ±1). NaN
// stays NaN.
inline xsimd::batch<double> erf_register(const xsimd::batch<double>& x) {
  using B = xsimd::batch<double>;
  return xsimd::erf(xsimd::select(x > B(6.0), B(6.0), xsimd::select(x < B(-6.0), B(-6.0), x)));
}

// tanh on a register: float by fast_math's polynomial (relative error <= 2e-7), double by xsimd's.
inline xsimd::batch<float> tanh_register(const xsimd::batch<float>& x) { return fast_math::tanh_approx(x); }
inline xsimd::batch<double> tanh_register(const xsimd::batch<double>& x) { return xsimd::tanh(x); }

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
  // The lanes in registers, the same additions lane by lane as `add` (GCC left the branchy scalar
  // form unvectorised: fp64 LayerNorm took 3-4x torch's time).
  using D = DoubleLanes;
  constexpr int64_t R = kSumLanes / kDoubleLanes > 0 ? kSumLanes / kDoubleLanes : 1;
  static_assert(R * kDoubleLanes == kSumLanes, "kSumLanes lanes must be whole registers");
  D ls[R], lc[R];
  for (int64_t r = 0; r < R; ++r) ls[r] = lc[r] = D(0.0);
  int64_t j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int64_t r = 0; r < R; ++r) {
      const D v = D::load_unaligned(x + j + r * kDoubleLanes);
      const D t = ls[r] + v;
      lc[r] += xsimd::select(xsimd::abs(ls[r]) >= xsimd::abs(v), (ls[r] - t) + v, (v - t) + ls[r]);
      ls[r] = t;
    }
  for (int64_t r = 0; r < R; ++r) ls[r].store_unaligned(lane + r * kDoubleLanes), lc[r].store_unaligned(comp + r * kDoubleLanes);
  double s = 0, c = 0;
  for (; j < n; ++j) add(s, c, x[j]);
  for (int64_t t = 0; t < kSumLanes; ++t) {
    add(s, c, lane[t]);
    add(s, c, comp[t]);
  }
  return s + c;
}

// Σ_j (x[j] - mu) and Σ_j (x[j] - mu)² of a row in kLanes lanes of doubles held in registers (x
// converted as it loads), the order set by n alone; the squares added with one rounding (FMA) when
// kFusedSquares. GCC left the plain loops of these lanes scalar: for float rows two thirds of
// LayerNorm's time (210 ns per add + LayerNorm of a MiniLM row of 384 on Zen 5, 110 ns with
// registers), for double rows a third of it.
template <int64_t kLanes, bool kFusedSquares, class T>
inline void centered_sums_in_lanes(const T* x, int64_t n, double mu, double* sum, double* sum_sq) {
  constexpr int64_t R = kLanes / kDoubleLanes > 0 ? kLanes / kDoubleLanes : 1;
  static_assert(R * kDoubleLanes == kLanes, "the lanes must be whole registers");
  DoubleLanes s1[R], s2[R];
  for (int64_t r = 0; r < R; ++r) s1[r] = s2[r] = DoubleLanes(0.0);
  const DoubleLanes m(mu);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int64_t r = 0; r < R; ++r) {
      const DoubleLanes d = DoubleLanes::load_unaligned(x + j + r * kDoubleLanes) - m;
      s1[r] += d;
      if constexpr (kFusedSquares) s2[r] = simd::fma(d, d, s2[r]);
      else s2[r] += d * d;
    }
  alignas(64) double l1[kLanes], l2[kLanes];
  for (int64_t r = 0; r < R; ++r) s1[r].store_aligned(l1 + r * kDoubleLanes), s2[r].store_aligned(l2 + r * kDoubleLanes);
  double a = 0, b = 0;
  for (; j < n; ++j) {
    const double d = static_cast<double>(x[j]) - mu;
    a += d;
    if constexpr (kFusedSquares) b = std::fma(d, d, b);
    else b += d * d;
  }
  for (int64_t t = 0; t < kLanes; ++t) a += l1[t], b += l2[t];
  *sum = a;
  *sum_sq = b;
}

// double rows: kSumLanes lanes, each square rounded before it is added (the bits of the scalar
// lanes these registers replaced)
inline void centered_sums(const double* x, int64_t n, double mu, double* sum, double* sum_sq) {
  centered_sums_in_lanes<kSumLanes, false>(x, n, mu, sum, sum_sq);
}

// float rows: kFloatSumLanes lanes (see row_sum above), the squares fused
inline void centered_sums(const float* x, int64_t n, double mu, double* sum, double* sum_sq) {
  centered_sums_in_lanes<kFloatSumLanes, true>(x, n, mu, sum, sum_sq);
}

// ---- softmax --------------------------------------------------------------------------------------
// Numerically stable softmax of one row:  y_j = exp(x_j - max x) / Σ_k exp(x_k - max x), y may alias x.
// A row with no finite entry above -inf (everything masked) becomes zeros, not NaN; a NaN anywhere
// in the row gives NaN everywhere in it. Three passes over the row, each a register at a time: the
// max (and whether a NaN is there), the exponentials into y, then y scaled by 1 / Σ. The sum is in
// double, in lanes (a float sum of thousands of terms drifted by 2e-5 at S = 4,097), its order set
// by n alone. (std::exp a value at a time and a serial sum made it 4-7x torch's time.)
template <class T>
inline void softmax_row(const T* x, int64_t n, T* y) {
  using B = xsimd::batch<T>;
  constexpr int64_t W = static_cast<int64_t>(B::size);
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  B mx(neg_inf);
  xsimd::batch_bool<T> nan(false);
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    const B v = B::load_unaligned(x + j);
    nan = nan | xsimd::isnan(v);  // (xsimd's v != v is an ordered compare: false for a NaN)
    mx = xsimd::select(v > mx, v, mx);  // a NaN never wins a comparison: the max of the others
  }
  alignas(64) T lanes[W];
  mx.store_aligned(lanes);
  T m = neg_inf;
  for (const T v : lanes) m = v > m ? v : m;
  bool has_nan = xsimd::any(nan);
  for (; j < n; ++j) {
    const T v = x[j];
    if (v > m) m = v;
    else if (v != v) has_nan = true;
  }
  if (has_nan || m == neg_inf) {
    std::fill(y, y + n, has_nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
    return;
  }
  if (n < W) {  // shorter than a register (softmax over a small dim): a value at a time, no padding
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) sum += (y[k] = fast_math::exp_nonpos(x[k] - m));
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t k = 0; k < n; ++k) y[k] *= inv;
    return;
  }
  const B mb(m);
  map_registers(x, n, y, neg_inf, [&](const B& v) { return exp_register(v - mb); });  // padding: exp(-inf) = 0
  double sum;
  if constexpr (std::is_same_v<T, float>) {
    sum = row_sum(y, n);  // float → double lanes (row_sum above)
  } else {
    xsimd::batch<double> acc[kSumLanes / W > 0 ? kSumLanes / W : 1];
    constexpr int64_t R = sizeof(acc) / sizeof(acc[0]);
    for (int64_t r = 0; r < R; ++r) acc[r] = xsimd::batch<double>(0.0);
    int64_t k = 0;
    for (; k + R * W <= n; k += R * W)
      for (int64_t r = 0; r < R; ++r) acc[r] += xsimd::batch<double>::load_unaligned(y + k + r * W);
    sum = 0;
    for (; k < n; ++k) sum += y[k];
    for (int64_t r = 0; r < R; ++r) {
      acc[r].store_aligned(lanes);
      for (const T v : lanes) sum += v;
    }
  }
  const T inv = static_cast<T>(1.0 / sum);
  for (int64_t k = 0; k < n; ++k) y[k] *= inv;
}

// In place: x ← softmax(x).
template <class T>
inline void softmax_row(T* x, int64_t n) {
  softmax_row(x, n, x);
}

// Softmax down the columns of a block: x and y are [n, ld] (row stride ld), columns [0, cols),
// cols <= kSoftmaxColumns; each column j gets softmax_row's result for x[:, j] up to rounding (the
// same max, exponential and double sum, summed in row order). This is softmax over a dim that is
// not the last: the rows of a column are ld apart, and a row of the block is read a register at a
// time, with no copy that moves the dim last (that copy and rows of a few values made softmax over
// dim 0 of (8, 128, 768) 7x torch's time).
// The lanes of a register are W neighbouring columns: one register of columns goes down all n rows
// three times (max, exponentials and their sums, scaling), its max and sums held in registers. A
// scalar loop per column kept the sums in memory and converted each exponential to double one at
// a time (dim 0 of (8, 128, 768) in float took 1.42x torch's time, one thread). The last cols mod W columns go
// through one register padded with zeros, so every column takes the same operations.
constexpr int64_t kSoftmaxColumns = 256;
template <class T>
inline void softmax_columns(const T* x, int64_t n, int64_t ld, int64_t cols, T* y) {
  using B = xsimd::batch<T>;
  using D = DoubleLanes;
  constexpr int64_t W = static_cast<int64_t>(B::size);
  constexpr int64_t H = W / kDoubleLanes;  // registers of doubles per register of T: 2 (float), 1 (double)
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t c = 0; c < cols; c += W) {
    const int64_t w = std::min(W, cols - c);  // columns in this register
    alignas(64) T buf[W];
    auto load = [&](const T* p) {
      if (w == W) return B::load_unaligned(p);
      std::fill(buf, buf + W, T(0));
      std::copy(p, p + w, buf);
      return B::load_aligned(buf);
    };
    auto store = [&](const B& v, T* p) {
      if (w == W) return v.store_unaligned(p);
      v.store_aligned(buf);
      std::copy(buf, buf + w, p);
    };
    B m(neg_inf);
    xsimd::batch_bool<T> nan(false);
    for (int64_t j = 0; j < n; ++j) {
      const B v = load(x + j * ld + c);
      nan = nan | xsimd::isnan(v);  // (xsimd's v != v is an ordered compare: false for a NaN)
      m = xsimd::select(v > m, v, m);  // a NaN never wins a comparison: the max of the others
    }
    const B shift = xsimd::select(m == B(neg_inf), B(T(0)), m);  // all -inf: exp gives 0s
    D sum[H];
    for (int64_t h = 0; h < H; ++h) sum[h] = D(0.0);
    for (int64_t j = 0; j < n; ++j) {
      const B e = exp_register(load(x + j * ld + c) - shift);
      store(e, y + j * ld + c);
      if constexpr (H == 1) {
        sum[0] += e;
      } else {  // float → double, a half register at a time, through memory (xsimd has no widening cast)
        alignas(64) T lanes[W];
        e.store_aligned(lanes);
        for (int64_t h = 0; h < H; ++h) sum[h] += D::load_aligned(lanes + h * kDoubleLanes);
      }
    }
    alignas(64) double s[W];
    alignas(64) T inv[W];
    for (int64_t h = 0; h < H; ++h) sum[h].store_aligned(s + h * kDoubleLanes);
    for (int64_t i = 0; i < W; ++i) inv[i] = s[i] == 0 ? T(0) : static_cast<T>(1.0 / s[i]);  // all -inf: zeros
    const B scale = xsimd::select(nan, B(std::numeric_limits<T>::quiet_NaN()), B::load_aligned(inv));  // NaN column: NaN
    for (int64_t j = 0; j < n; ++j) store(load(y + j * ld + c) * scale, y + j * ld + c);
  }
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

// The activations on a register, for the whole-array loops below. float: fast_math's polynomials
// with their FMAs written out (the same functions as the scalar forms above). double: xsimd's erf,
// tanh and exp (<= a few ulps; std::erf a value at a time made fp64 GELU 2.4-6x torch's time).
inline xsimd::batch<float> gelu_register(const xsimd::batch<float>& v) {
  using B = xsimd::batch<float>;
  return B(0.5f) * v * (B(1.0f) + fast_math::erf_approx(v * B(0.70710678118654752440f)));
}
inline xsimd::batch<double> gelu_register(const xsimd::batch<double>& v) {
  using B = xsimd::batch<double>;
  return B(0.5) * v * (B(1.0) + erf_register(v * B(0.70710678118654752440)));
}
template <class T>
inline xsimd::batch<T> gelu_tanh_register(const xsimd::batch<T>& v) {
  using B = xsimd::batch<T>;
  const B inner = B(T(0.79788456080286535588)) * (v + B(T(0.044715)) * v * v * v);
  return B(T(0.5)) * v * (B(T(1)) + tanh_register(inner));
}
// σ(x) from e = exp(-|x|) ∈ (0, 1]: 1 / (1 + e) for x ≥ 0, e / (1 + e) below, as the scalar silu
template <class T>
inline xsimd::batch<T> sigmoid_register(const xsimd::batch<T>& v) {
  using B = xsimd::batch<T>;
  const B e = exp_register(-xsimd::abs(v));
  return xsimd::select(v >= B(T(0)), B(T(1)), e) / (B(T(1)) + e);
}

// y[i] = act(x[i]), i < n (y may alias x: in place), a register at a time (map_registers; scalar
// loops over two pointers that may alias were left unvectorised by GCC).
template <class T>
TC_PREFER_512 inline void activate(const T* x, int64_t n, Activation act, T* y) {
  using B = xsimd::batch<T>;
  switch (act) {
    case Activation::kNone:
      if (y != x) std::copy(x, x + n, y);
      return;
    case Activation::kRelu:
      return map_registers(x, n, y, T(0), [](const B& v) {  // NaN stays NaN, as torch's: v <= 0 is false for it
        return xsimd::select(v <= B(T(0)), B(T(0)), v);
      });
    case Activation::kGelu: return map_registers(x, n, y, T(0), [](const B& v) { return gelu_register(v); });
    case Activation::kGeluTanh:
      return map_registers(x, n, y, T(0), [](const B& v) { return gelu_tanh_register(v); });
    case Activation::kSilu: return map_registers(x, n, y, T(0), [](const B& v) { return v * sigmoid_register(v); });
    case Activation::kTanh: return map_registers(x, n, y, T(0), [](const B& v) { return tanh_register(v); });
  }
}

// In place: x[i] ← act(x[i]) (the linear layers' epilogue).
template <class T>
inline void activate(T* x, int64_t n, Activation act) {
  activate(static_cast<const T*>(x), n, act, x);
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
