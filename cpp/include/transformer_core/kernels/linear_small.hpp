// A linear layer for a handful of rows (decoding, the encoder tutorial's 7-token sentence):
//
//   y[i, j] = Σ_k x[i, k] · w[j, k] + bias[j]        x: [m, k]   w: [n, k] (torch's layout)   y: [m, n]
//
// GEMM packs w into panels before multiplying; with m ≤ kSmallRows rows that copy costs more than
// the product itself. Here w is streamed once instead: four of its rows at a time stay in L1 while
// they meet every row of x, each dot product accumulated in SIMD lanes (xsimd) and summed once.
// Every y[i, j] is computed the same way whatever the split over j, so results do not depend on the
// thread count.
#pragma once

#include <xsimd/xsimd.hpp>

#include <cstdint>

namespace transformer_core::kernels {

constexpr int64_t kSmallRows = 8;

// Columns [j0, j1) of y; y has row stride n.
template <class T>
void linear_small_rows(const T* x, int64_t m, int64_t k, const T* w, const T* bias, int64_t j0, int64_t j1,
                       int64_t n, T* y) {
  using Batch = xsimd::batch<T>;
  constexpr int64_t lanes = static_cast<int64_t>(Batch::size);
  const int64_t k_vec = k - k % lanes;
  constexpr int64_t kRowsOfW = 4;
  for (int64_t j = j0; j < j1; j += kRowsOfW) {
    const int64_t rows_of_w = std::min<int64_t>(kRowsOfW, j1 - j);
    const T* wr[kRowsOfW];
    for (int64_t r = 0; r < kRowsOfW; ++r) wr[r] = w + (j + std::min(r, rows_of_w - 1)) * k;
    int64_t i = 0;
    // Two rows of x against four rows of w: 8 independent FMA chains (enough to hide the FMA
    // latency), 6 loads feeding 8 FMAs.
    for (; i + 2 <= m; i += 2) {
      const T* x0 = x + i * k;
      const T* x1 = x0 + k;
      Batch a00(T(0)), a01(T(0)), a02(T(0)), a03(T(0)), a10(T(0)), a11(T(0)), a12(T(0)), a13(T(0));
      for (int64_t kk = 0; kk < k_vec; kk += lanes) {
        const Batch w0 = xsimd::load_unaligned(wr[0] + kk), w1 = xsimd::load_unaligned(wr[1] + kk);
        const Batch w2 = xsimd::load_unaligned(wr[2] + kk), w3 = xsimd::load_unaligned(wr[3] + kk);
        const Batch xv0 = xsimd::load_unaligned(x0 + kk), xv1 = xsimd::load_unaligned(x1 + kk);
        a00 = xsimd::fma(xv0, w0, a00), a01 = xsimd::fma(xv0, w1, a01);
        a02 = xsimd::fma(xv0, w2, a02), a03 = xsimd::fma(xv0, w3, a03);
        a10 = xsimd::fma(xv1, w0, a10), a11 = xsimd::fma(xv1, w1, a11);
        a12 = xsimd::fma(xv1, w2, a12), a13 = xsimd::fma(xv1, w3, a13);
      }
      T s0[kRowsOfW] = {xsimd::hadd(a00), xsimd::hadd(a01), xsimd::hadd(a02), xsimd::hadd(a03)};
      T s1[kRowsOfW] = {xsimd::hadd(a10), xsimd::hadd(a11), xsimd::hadd(a12), xsimd::hadd(a13)};
      for (int64_t kk = k_vec; kk < k; ++kk)
        for (int64_t r = 0; r < kRowsOfW; ++r) s0[r] += x0[kk] * wr[r][kk], s1[r] += x1[kk] * wr[r][kk];
      for (int64_t r = 0; r < rows_of_w; ++r) {
        const T b = bias != nullptr ? bias[j + r] : T(0);
        y[i * n + j + r] = s0[r] + b;
        y[(i + 1) * n + j + r] = s1[r] + b;
      }
    }
    for (; i < m; ++i) {  // the last row of an odd m
      const T* xi = x + i * k;
      Batch acc0(T(0)), acc1(T(0)), acc2(T(0)), acc3(T(0));
      for (int64_t kk = 0; kk < k_vec; kk += lanes) {
        const Batch xv = xsimd::load_unaligned(xi + kk);
        acc0 = xsimd::fma(xv, xsimd::load_unaligned(wr[0] + kk), acc0);
        acc1 = xsimd::fma(xv, xsimd::load_unaligned(wr[1] + kk), acc1);
        acc2 = xsimd::fma(xv, xsimd::load_unaligned(wr[2] + kk), acc2);
        acc3 = xsimd::fma(xv, xsimd::load_unaligned(wr[3] + kk), acc3);
      }
      T sum[kRowsOfW] = {xsimd::hadd(acc0), xsimd::hadd(acc1), xsimd::hadd(acc2), xsimd::hadd(acc3)};
      for (int64_t kk = k_vec; kk < k; ++kk)
        for (int64_t r = 0; r < kRowsOfW; ++r) sum[r] += xi[kk] * wr[r][kk];
      for (int64_t r = 0; r < rows_of_w; ++r) y[i * n + j + r] = sum[r] + (bias != nullptr ? bias[j + r] : T(0));
    }
  }
}

}  // namespace transformer_core::kernels
