// A linear layer for a handful of rows (decoding, seed 001's 7-token sentence):
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
    for (int64_t i = 0; i < m; ++i) {
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
