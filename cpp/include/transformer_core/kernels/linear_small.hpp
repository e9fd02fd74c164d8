// A linear layer for a handful of rows (decoding, the encoder tutorial's 7-token sentence):
//
//   y[i, j] = Σ_k x[i, k] · w[j, k] + bias[j]        x: [m, k]   w: [n, k] (torch's layout)   y: [m, n]
//
// GEMM packs w into panels before multiplying; with m ≤ kSmallRows rows that copy costs more than
// the product itself. Here w is streamed once instead: four of its rows at a time stay in L1 while
// they meet every row of x (in blocks of four rows of x), each dot product accumulated in SIMD
// lanes (xsimd) and summed once.
// Every y[i, j] is computed the same way whatever the split over j, so results do not depend on the
// thread count.
#pragma once

#include <xsimd/xsimd.hpp>

#include <cstdint>

namespace transformer_core::kernels {

// Up to this many rows stream w (MiniLM on one sentence: 9 rows took 3.8 ms packed, 2.0 ms here;
// the two paths cross near 40 rows on an AVX-512 Xeon).
constexpr int64_t kSmallRows = 32;

namespace linear_small_detail {

constexpr int64_t kRowsOfW = 4;

// y[r, j + c] = Σ_k x[r, k] · wr[c][k] + bias[j + c]   for r < RX rows of x (row stride k), c < cols_of_w:
// RX × 4 independent FMA chains in SIMD lanes, each summed across its lanes once at the end.
template <int RX, class T>
inline void dot_block(const T* x, int64_t k, const T* const* wr, int64_t cols_of_w, const T* bias, int64_t j,
                      int64_t n, T* y) {
  using Batch = xsimd::batch<T>;
  constexpr int64_t lanes = static_cast<int64_t>(Batch::size);
  const int64_t k_vec = k - k % lanes;
  Batch acc[RX][kRowsOfW];
  #pragma GCC unroll 4
  for (int r = 0; r < RX; ++r)
    #pragma GCC unroll 4
    for (int c = 0; c < kRowsOfW; ++c) acc[r][c] = Batch(T(0));
  for (int64_t kk = 0; kk < k_vec; kk += lanes) {
    Batch wv[kRowsOfW];
    #pragma GCC unroll 4
    for (int c = 0; c < kRowsOfW; ++c) wv[c] = xsimd::load_unaligned(wr[c] + kk);
    #pragma GCC unroll 4
    for (int r = 0; r < RX; ++r) {
      const Batch xv = xsimd::load_unaligned(x + r * k + kk);
      #pragma GCC unroll 4
      for (int c = 0; c < kRowsOfW; ++c) acc[r][c] = xsimd::fma(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RX; ++r) {
    const T* xr = x + r * k;
    for (int64_t c = 0; c < cols_of_w; ++c) {
      T sum = xsimd::hadd(acc[r][c]);
      for (int64_t kk = k_vec; kk < k; ++kk) sum += xr[kk] * wr[c][kk];
      y[r * n + j + c] = sum + (bias != nullptr ? bias[j + c] : T(0));
    }
  }
}

}  // namespace linear_small_detail

// Columns [j0, j1) of y; y has row stride n.
template <class T>
void linear_small_rows(const T* x, int64_t m, int64_t k, const T* w, const T* bias, int64_t j0, int64_t j1,
                       int64_t n, T* y) {
  using linear_small_detail::dot_block;
  using linear_small_detail::kRowsOfW;
  // Rows of x per block: 4 × 4 accumulators, 4 + 4 loads per 16 FMAs, where the CPU has 32 vector
  // registers (AVX-512); 2 × 4 with 16 (AVX2).
  constexpr int kRowsOfX = sizeof(xsimd::batch<T>) >= 64 ? 4 : 2;
  for (int64_t j = j0; j < j1; j += kRowsOfW) {
    const int64_t cols_of_w = std::min<int64_t>(kRowsOfW, j1 - j);
    const T* wr[kRowsOfW];
    for (int64_t c = 0; c < kRowsOfW; ++c) wr[c] = w + (j + std::min(c, cols_of_w - 1)) * k;
    int64_t i = 0;
    for (; i + kRowsOfX <= m; i += kRowsOfX) dot_block<kRowsOfX>(x + i * k, k, wr, cols_of_w, bias, j, n, y + i * n);
    // the last m mod kRowsOfX rows in one block
    const T* xi = x + i * k;
    T* yi = y + i * n;
    switch (m - i) {
      case 3: dot_block<3>(xi, k, wr, cols_of_w, bias, j, n, yi); break;
      case 2: dot_block<2>(xi, k, wr, cols_of_w, bias, j, n, yi); break;
      case 1: dot_block<1>(xi, k, wr, cols_of_w, bias, j, n, yi); break;
      default: break;
    }
  }
}

}  // namespace transformer_core::kernels
