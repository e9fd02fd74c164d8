// A linear layer for a handful of rows (decoding, the encoder tutorial's 7-token sentence):
//
//   y[i, j] = Σ_k x[i, k] · w[j, k] + bias[j]        x: [m, k]   w: [n, k] (torch's layout)   y: [m, n]
//
// GEMM packs w into panels before multiplying; with m ≤ kSmallRows rows that copy costs more than
// the product itself. Here w is streamed once instead: a few of its rows at a time stay in L1 while
// they meet every row of x (AVX-512: blocks of up to 8 rows of x with 3 rows of w; AVX2: 7 × 2, or
// 2 × 4 for one or two rows), the rows of w ahead prefetched meanwhile (prefetch_plan). Each dot
// product is accumulated in SIMD lanes (xsimd) and summed across them once.
// (7 tokens of MiniLM, 2 threads, Sapphire Rapids: the four products of a layer 253 → 215 µs.)
// Every y[i, j] is computed the same way whatever the split over j, so results do not depend on the
// thread count.
#pragma once

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "transformer_core/kernels/simd.hpp"

namespace transformer_core::kernels {

// Up to this many rows stream w (MiniLM on one sentence: 9 rows took 3.8 ms packed, 2.0 ms here;
// the two paths cross near 40 rows on an AVX-512 Xeon).
constexpr int64_t kSmallRows = 32;

namespace linear_small_detail {

// The rows of w ahead of the group being multiplied are prefetched, a cache line per step. Where to
// depends on the CPU. A group reads its RW rows side by side, a pattern that the hardware
// prefetchers follow poorly: on Zen 4 (one thread, rows of 384 floats, a bare read loop) 3 rows
// side by side streamed 9.6 GB/s against 25 for one row; prefetched one group ahead into L1 10.3
// (the L1's few outstanding misses are the limit), into L2 18, two groups ahead into L2 23. MiniLM's
// 24 products on 7 rows, weights from DRAM, 2 threads: 1.8-2.1 ms → 1.35-1.44 ms with this and
// simd::keep_in_register. On Intel's cores (Emerald Rapids, 2 threads, the 24 products on 7 rows,
// weights from L3, five runs each) one group ahead into L1 took 1.06-1.15 ms against 1.21-1.23 for
// two groups ahead into L2.
struct PrefetchPlan {
  int64_t groups;  // groups of RW rows ahead
  bool into_l1;    // prefetcht0, else prefetcht1 (into L2)
};
inline PrefetchPlan prefetch_plan() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const PrefetchPlan plan = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") ? PrefetchPlan{1, true} : PrefetchPlan{2, false};
  }();
  return plan;
#else
  return PrefetchPlan{2, false};
#endif
}

// Depth blocks (kSmallDepthBlock values of k): when the rows of x do not fit L1 beside the rows of
// w (m · k floats past kSmallL1Floats), every group of w's rows would read all of x again from L2.
// The columns are then swept once per block of k instead, x's block staying in L1, and each dot
// product's SIMD accumulator is kept in memory between blocks: the same additions in the same
// order, so the same bits. (MiniLM's FFN2, 1536 → 384, 9 rows: x is 55 KiB against a 48 KiB L1.
// 2 threads, Emerald Rapids, 12 weights in turn: 7 rows 91-116 → 83-88 µs, 32 rows 298-316 → 270-278.)
constexpr int64_t kSmallDepthBlock = 512;
constexpr int64_t kSmallL1Floats = 6144;  // 24 KiB of fp32: half an L1, the rest for w and y

#if defined(__AVX512F__)
// The sums across the 16 lanes of a[0 … 15], one per lane of the result, in order. Each a[i] is
// summed as xsimd::hadd sums one (lanes e and e + 8, then e and e + 4 of those, then neighbours,
// then the two pairs), so the same bits, with the shuffles shared between the 16: 45 instructions
// where 16 hadds take about 130. (MiniLM's 24 products in turn, 2 threads, Emerald Rapids: 9 rows
// 1.55 → 1.50 ms, 16 rows 2.30 → 2.18.)
inline __m512 sum_lanes_of_16(const __m512 a[16]) {
  __m512 b[8], c[4], d[2];
  for (int j = 0; j < 8; ++j)  // b[j]: halves of a[2j] added (e, e + 8), then those of a[2j + 1]
    b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // c[j]: quarter t holds a[4j + t]'s four (e, e + 4)
    c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xDD));
  for (int j = 0; j < 2; ++j)  // d[j]: quarter t holds the neighbours' sums of a[8j + t], a[8j + 4 + t]
    d[j] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * j], c[2 * j + 1], 0x88), _mm512_shuffle_ps(c[2 * j], c[2 * j + 1], 0xDD));
  // lane 4t + u: the sum of a[4u + t]; put it in lane 4u + t
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, e);
}
#endif

// y[r, j + c] = Σ_k x[r, k] · wr[c][k] + bias[j + c]   for r < RX rows of x (row stride k), c < cols_of_w
// (≤ RW rows of w): RX × RW independent FMA chains in SIMD lanes, each summed across its lanes once
// at the end. next: the RW rows of w prefetch_plan().groups groups ahead, prefetched a cache line per
// step (nullptr: none; into L1 if into_l1, else L2), so that the stream from memory runs while this
// group is multiplied.
// Depth [k0, k1) of the chains (k1 ≤ k - k % lanes, a multiple of the lanes): acc holds the RX × RW
// accumulators between depth blocks (nullptr: one block, [0, k_vec)); the first block starts them
// from zero, the last (k1 = k_vec) sums them across their lanes and writes y.
template <int RX, int RW, class T>
inline void dot_block(const T* x, int64_t k, const T* const* wr, int64_t cols_of_w, const T* bias, int64_t j,
                      int64_t n, T* y, const T* const* next, bool into_l1, int64_t k0, int64_t k1, T* acc_kept) {
  using Batch = xsimd::batch<T>;
  constexpr int64_t lanes = static_cast<int64_t>(Batch::size);
  const int64_t k_vec = k - k % lanes;
  Batch acc[RX][RW];
  #pragma GCC unroll 8
  for (int r = 0; r < RX; ++r)
    #pragma GCC unroll 4
    for (int c = 0; c < RW; ++c)
      acc[r][c] = k0 > 0 ? xsimd::load_unaligned(acc_kept + (r * RW + c) * lanes) : Batch(T(0));
  for (int64_t kk = k0; kk < k1; kk += lanes) {
    Batch wv[RW];
    #pragma GCC unroll 4
    for (int c = 0; c < RW; ++c) wv[c] = xsimd::load_unaligned(wr[c] + kk);
    if (next != nullptr && into_l1)
      #pragma GCC unroll 4
      for (int c = 0; c < RW; ++c) __builtin_prefetch(next[c] + kk, 0, 3);  // prefetcht0
    else if (next != nullptr)
      #pragma GCC unroll 4
      for (int c = 0; c < RW; ++c) __builtin_prefetch(next[c] + kk, 0, 2);  // prefetcht1
    #pragma GCC unroll 8
    for (int r = 0; r < RX; ++r) {
      Batch xv = xsimd::load_unaligned(x + r * k + kk);
      simd::keep_in_register(xv);  // one load for the RW FMAs below (simd.hpp says why)
      #pragma GCC unroll 4
      for (int c = 0; c < RW; ++c) acc[r][c] = simd::fma(xv, wv[c], acc[r][c]);
    }
  }
  if (k1 < k_vec) {  // more depth blocks to come: keep the accumulators
    #pragma GCC unroll 8
    for (int r = 0; r < RX; ++r)
      #pragma GCC unroll 4
      for (int c = 0; c < RW; ++c) acc[r][c].store_unaligned(acc_kept + (r * RW + c) * lanes);
    return;
  }
  constexpr int kAcc = RX * RW;
  alignas(64) T sums[(kAcc + 15) / 16 * 16];
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && lanes == 16) {  // 16 accumulators at a time
    for (int a0 = 0; a0 < kAcc; a0 += 16) {
      __m512 rows[16];
      #pragma GCC unroll 16
      for (int t = 0; t < 16; ++t) rows[t] = a0 + t < kAcc ? __m512(acc[(a0 + t) / RW][(a0 + t) % RW]) : _mm512_setzero_ps();
      _mm512_store_ps(sums + a0, sum_lanes_of_16(rows));
    }
  } else
#endif
  {
    for (int a = 0; a < kAcc; ++a) sums[a] = xsimd::hadd(acc[a / RW][a % RW]);
  }
  for (int r = 0; r < RX; ++r) {
    const T* xr = x + r * k;
    for (int64_t c = 0; c < cols_of_w; ++c) {
      T sum = sums[r * RW + c];
      for (int64_t kk = k_vec; kk < k; ++kk) sum += xr[kk] * wr[c][kk];
      y[r * n + j + c] = sum + (bias != nullptr ? bias[j + c] : T(0));
    }
  }
}

// Columns [j0, j1) of y from rows of x in blocks of RX (the last m mod RX rows in one smaller block),
// RW rows of w at a time; over the depth in blocks when x does not fit L1 (see kSmallDepthBlock).
template <int RX, int RW, class T>
void rows_in_blocks(const T* x, int64_t m, int64_t k, const T* w, const T* bias, int64_t j0, int64_t j1, int64_t n,
                    T* y) {
  constexpr int64_t lanes = static_cast<int64_t>(xsimd::batch<T>::size);
  const int64_t k_vec = k - k % lanes;
  const bool blocked = m * k > kSmallL1Floats && k_vec > kSmallDepthBlock;
  const PrefetchPlan plan = prefetch_plan();
  const int64_t depth_block = blocked ? kSmallDepthBlock : std::max<int64_t>(k_vec, 1);
  // The accumulators kept between depth blocks: RX × RW vectors per (block of rows, group of columns).
  const int64_t groups = (j1 - j0 + RW - 1) / RW, row_blocks = (m + RX - 1) / RX;
  thread_local std::vector<T> kept;
  if (blocked && kept.size() < size_t(groups * row_blocks * RX * RW * lanes))
    kept.resize(size_t(groups * row_blocks * RX * RW * lanes));
  for (int64_t k0 = 0; k0 < std::max<int64_t>(k_vec, 1); k0 += depth_block) {
    const int64_t k1 = std::min(k_vec, k0 + depth_block);
    for (int64_t j = j0, g = 0; j < j1; j += RW, ++g) {
      const int64_t cols_of_w = std::min<int64_t>(RW, j1 - j);
      const T* wr[RW];
      const T* next[RW];
      for (int64_t c = 0; c < RW; ++c) {
        wr[c] = w + (j + std::min(c, cols_of_w - 1)) * k;
        next[c] = w + std::min(j + plan.groups * RW + c, j1 - 1) * k;
      }
      const T* const* pf = j + plan.groups * RW < j1 ? next : nullptr;  // the first block of x prefetches
      T* acc = blocked ? kept.data() + g * row_blocks * RX * RW * lanes : nullptr;
      int64_t i = 0;
      for (; i + RX <= m; i += RX, pf = nullptr, acc = acc != nullptr ? acc + RX * RW * lanes : nullptr)
        dot_block<RX, RW>(x + i * k, k, wr, cols_of_w, bias, j, n, y + i * n, pf, plan.into_l1, k0, k1, acc);
      const T* xi = x + i * k;
      T* yi = y + i * n;
      switch (m - i) {
        case 7: if constexpr (RX > 7) dot_block<7, RW>(xi, k, wr, cols_of_w, bias, j, n, yi, pf, plan.into_l1, k0, k1, acc); break;
        case 6: if constexpr (RX > 6) dot_block<6, RW>(xi, k, wr, cols_of_w, bias, j, n, yi, pf, plan.into_l1, k0, k1, acc); break;
        case 5: if constexpr (RX > 5) dot_block<5, RW>(xi, k, wr, cols_of_w, bias, j, n, yi, pf, plan.into_l1, k0, k1, acc); break;
        case 4: if constexpr (RX > 4) dot_block<4, RW>(xi, k, wr, cols_of_w, bias, j, n, yi, pf, plan.into_l1, k0, k1, acc); break;
        case 3: if constexpr (RX > 3) dot_block<3, RW>(xi, k, wr, cols_of_w, bias, j, n, yi, pf, plan.into_l1, k0, k1, acc); break;
        case 2: if constexpr (RX > 2) dot_block<2, RW>(xi, k, wr, cols_of_w, bias, j, n, yi, pf, plan.into_l1, k0, k1, acc); break;
        case 1: if constexpr (RX > 1) dot_block<1, RW>(xi, k, wr, cols_of_w, bias, j, n, yi, pf, plan.into_l1, k0, k1, acc); break;
        default: break;
      }
    }
  }
}

}  // namespace linear_small_detail

// Columns [j0, j1) of y; y has row stride n.
template <class T>
void linear_small_rows(const T* x, int64_t m, int64_t k, const T* w, const T* bias, int64_t j0, int64_t j1,
                       int64_t n, T* y) {
  using linear_small_detail::rows_in_blocks;
  if constexpr (sizeof(xsimd::batch<T>) >= 64) {
    // 32 vector registers (AVX-512): 8 rows of x in a block with 3 rows of w (24 accumulators;
    // 3 + 8 loads per 24 FMAs), the rows past a multiple of 8 in one smaller block. Blocks of 4 × 4
    // for more than 8 rows (4 + 4 loads per 16 FMAs) were slower on every count measured: MiniLM's
    // 24 products in turn (weights from L3), 2 threads, Emerald Rapids: 9 rows 1.85 → 1.55 ms,
    // 16 rows 2.89 → 2.30, 24 rows 4.33 → 3.72, 32 rows 5.99 → 5.48 (the same bits).
    return rows_in_blocks<8, 3>(x, m, k, w, bias, j0, j1, n, y);
  } else {
    // 16 vector registers (AVX2): one or two rows of x (decoding) in blocks of 2 × 4; more in
    // blocks of 7 rows of x with 2 rows of w (14 accumulators), so that 7 tokens read each row of w
    // once. 7 rows of MiniLM's layer shapes, weights from memory, 2 threads (Zen 3): 2 × 4 streamed
    // w at 11-13 GB/s, 7 × 2 at 15-19 (the machine's read bandwidth: 21).
    if (m <= 2) return rows_in_blocks<2, 4>(x, m, k, w, bias, j0, j1, n, y);
    return rows_in_blocks<7, 2>(x, m, k, w, bias, j0, j1, n, y);
  }
}

}  // namespace transformer_core::kernels
