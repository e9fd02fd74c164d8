// A few fp32 rows of x times a matrix, on the calling thread: the products of a decoding step,
// whose attention has one query row (or, under GQA, the query heads of one key/value head: 2–3
// rows) against thousands of keys.
//
//   rows_times_transposed:  y[i, j] (+)= Σ_p x[i, p] · b[j, p]   b: [n, k] (row stride ldb)   q · kᵀ: scores
//   rows_times:             y[i, j] (+)= Σ_p x[i, p] · b[p, j]   b: [k, n] (row stride ldb)   p · v: output
//
// A GEMM would pack b into panels first, for a few rows' use of them; these stream b once for up to
// kGemvMaxRows rows of x at a time (SmolLM2's GQA, 3 query heads per key/value head, 2,048 cached
// keys from DRAM, the products alone: 0.24–0.27 → 0.21–0.23 ms on two threads of a Zen 4). Each y[i, j]
// is summed the same way whatever n, ldb, its position in y and the rows beside it, so a key's score
// does not depend on how the keys are cut into blocks or chunks, nor a row's result on the others:
//   * rows_times_transposed: blocks of as many rows of b as a SIMD register has lanes, one
//     accumulator each per row of x; sum_lanes adds each accumulator's lanes by the same tree, all
//     of them at once into one register (lane c = the dot product with row c); the k mod lanes last
//     products are added in order after. The rows of a block are read two at a time, each from its
//     start to its end, and the rows four blocks on are prefetched into L2 meanwhile. A decoding
//     step's keys come from memory (the rest of the model ran since they were last read), and
//     reading all sixteen rows side by side, a vector of each in turn, defeats the hardware
//     prefetchers: one thread, Zen 4, 12 heads × 4,096 keys of 64 from DRAM: 1.5 → 0.7 ms. (With
//     every key in L2 the side-by-side order is 10–30 % faster, but a decoding step does not find
//     its keys there.)
//   * rows_times: each y[i, j] is one fused multiply-add chain over p in order, in a SIMD lane or,
//     for the last n mod lanes columns, in std::fma: the same bits either way.
// (One thread, Zen 5, 2048 keys of 64 in L2: the scores 5.3 → 3.9 µs, the output 4.2 → 2.1 µs
// against OpenBLAS's gemv; decoding SDPA, bench/README.md.)
#pragma once

#include <xsimd/xsimd.hpp>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "transformer_core/kernels/simd.hpp"

namespace transformer_core::kernels {

// Rows of x that share one pass over b (a GQA decoding step: the query heads of a key/value head).
constexpr int64_t kGemvMaxRows = 3;

namespace gemv_detail {

using Batch = xsimd::batch<float>;
constexpr int64_t kLanes = static_cast<int64_t>(Batch::size);

// Lane c of the result = the sum of the lanes of v[c], c < kLanes: xsimd::haddp, except on AVX-512,
// where xsimd 8's returns the lanes out of order (0 1 4 5 2 3 ...): there pairs of registers are
// interleaved and added, halving the lanes each of them stands for, until one register is left.
inline Batch sum_lanes(const Batch* v) {
#if defined(__AVX512F__)
  static_assert(kLanes == 16);
  __m512 quad[4];  // quad[q], 128-bit lane g: the part of v[4q .. 4q+3] in lane g of the registers
  for (int q = 0; q < 4; ++q) {
    const __m512 a = v[4 * q], b = v[4 * q + 1], c = v[4 * q + 2], d = v[4 * q + 3];
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const __m512d x = _mm512_castps_pd(ab), y = _mm512_castps_pd(cd);
    quad[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                            _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // add the four 128-bit lanes: 0x88 takes lanes 0, 2 of each operand, 0xDD lanes 1, 3
  auto fold = [](__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
  };
  return fold(fold(quad[0], quad[1]), fold(quad[2], quad[3]));
#else
  return xsimd::haddp(v);  // right for SSE and AVX registers (checked: lane c sums v[c])
#endif
}

// M rows of x at once (M ≤ kGemvMaxRows), so that each row of b is read once for all of them.
template <int M>
void rows_times_transposed(int64_t n, int64_t k, const float* x, int64_t ldx, const float* b, int64_t ldb,
                           float* y, int64_t ldy, bool accumulate) {
  constexpr int64_t W = kLanes;
  constexpr int64_t kPrefetchBlocks = 4;
  constexpr int kRowsAtOnce = 2;  // rows of b read side by side (W is a multiple of it)
  const int64_t k_vec = k - k % W;
  for (int64_t j0 = 0; j0 < n; j0 += W) {
    const int64_t count = std::min(W, n - j0);
    const float* rows[W];  // a short last block repeats its last row (computed, not stored)
    for (int64_t c = 0; c < W; ++c) rows[c] = b + std::min(j0 + c, n - 1) * ldb;
    const int64_t ahead = j0 + kPrefetchBlocks * W;  // the rows of b read kPrefetchBlocks blocks later
    Batch acc[M][W];
    for (int64_t c = 0; c < W; c += kRowsAtOnce) {
      Batch sum[kRowsAtOnce][M];
      for (int r = 0; r < kRowsAtOnce; ++r)
        for (int i = 0; i < M; ++i) sum[r][i] = Batch(0.f);
      for (int64_t p = 0; p < k_vec; p += W) {
        for (int r = 0; r < kRowsAtOnce; ++r) {
          if (ahead < n) __builtin_prefetch(b + std::min(ahead + c + r, n - 1) * ldb + p, 0, 2);  // prefetcht1
          const Batch bv = Batch::load_unaligned(rows[c + r] + p);
          for (int i = 0; i < M; ++i) sum[r][i] = simd::fma(Batch::load_unaligned(x + i * ldx + p), bv, sum[r][i]);
        }
      }
      for (int r = 0; r < kRowsAtOnce; ++r)
        for (int i = 0; i < M; ++i) acc[i][c + r] = sum[r][i];
    }
    for (int i = 0; i < M; ++i) {
      const float* xi = x + i * ldx;
      float* yi = y + i * ldy;
      alignas(64) float sums[W];
      sum_lanes(acc[i]).store_aligned(sums);
      for (int64_t c = 0; c < count; ++c) {
        float s = sums[c];
        for (int64_t p = k_vec; p < k; ++p) s += xi[p] * rows[c][p];
        yi[j0 + c] = accumulate ? yi[j0 + c] + s : s;
      }
    }
  }
}

template <int M>
void rows_times(int64_t n, int64_t k, const float* x, int64_t ldx, const float* b, int64_t ldb, float* y,
                int64_t ldy, bool accumulate) {
  constexpr int64_t W = kLanes;
  constexpr int64_t kChains = 4;  // registers of columns at a time
  auto store = [&](int i, int64_t j, const Batch& acc) {
    float* yij = y + i * ldy + j;
    (accumulate ? Batch::load_unaligned(yij) + acc : acc).store_unaligned(yij);
  };
  int64_t j = 0;
  for (; j + kChains * W <= n; j += kChains * W) {
    Batch acc[M][kChains];
    for (int i = 0; i < M; ++i)
      for (int64_t c = 0; c < kChains; ++c) acc[i][c] = Batch(0.f);
    for (int64_t p = 0; p < k; ++p) {
      const float* row = b + p * ldb + j;
      for (int64_t c = 0; c < kChains; ++c) {
        const Batch bv = Batch::load_unaligned(row + c * W);
        for (int i = 0; i < M; ++i) acc[i][c] = simd::fma(Batch(x[i * ldx + p]), bv, acc[i][c]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int64_t c = 0; c < kChains; ++c) store(i, j + c * W, acc[i][c]);
  }
  for (; j + W <= n; j += W) {
    Batch acc[M];
    for (int i = 0; i < M; ++i) acc[i] = Batch(0.f);
    for (int64_t p = 0; p < k; ++p) {
      const Batch bv = Batch::load_unaligned(b + p * ldb + j);
      for (int i = 0; i < M; ++i) acc[i] = simd::fma(Batch(x[i * ldx + p]), bv, acc[i]);
    }
    for (int i = 0; i < M; ++i) store(i, j, acc[i]);
  }
  for (; j < n; ++j)
    for (int i = 0; i < M; ++i) {
      float s = 0;
      for (int64_t p = 0; p < k; ++p) s = std::fma(x[i * ldx + p], b[p * ldb + j], s);
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + s : s;
    }
}

// fn(std::integral_constant<int, M>, rows of x, rows of y) for the rows of x in groups of
// kGemvMaxRows (the last group M = what is left).
template <class F>
void in_row_groups(int64_t m, const float* x, int64_t ldx, float* y, int64_t ldy, const F& fn) {
  static_assert(kGemvMaxRows == 3, "one case per group size below");
  for (int64_t i = 0; i < m; i += kGemvMaxRows) {
    const float* xi = x + i * ldx;
    float* yi = y + i * ldy;
    switch (std::min(kGemvMaxRows, m - i)) {
      case 1: fn(std::integral_constant<int, 1>{}, xi, yi); break;
      case 2: fn(std::integral_constant<int, 2>{}, xi, yi); break;
      default: fn(std::integral_constant<int, 3>{}, xi, yi); break;
    }
  }
}

}  // namespace gemv_detail

// The m rows of x (row stride ldx) times b into the m rows of y (row stride ldy), up to
// kGemvMaxRows rows at once (so each row of b is read once for them), each row's result bit for bit
// the one it gets alone.
inline void rows_times_transposed(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* b,
                                  int64_t ldb, float* y, int64_t ldy, bool accumulate) {
  gemv_detail::in_row_groups(m, x, ldx, y, ldy, [&](auto rows, const float* xi, float* yi) {
    gemv_detail::rows_times_transposed<decltype(rows)::value>(n, k, xi, ldx, b, ldb, yi, ldy, accumulate);
  });
}

inline void rows_times(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* b, int64_t ldb,
                       float* y, int64_t ldy, bool accumulate) {
  gemv_detail::in_row_groups(m, x, ldx, y, ldy, [&](auto rows, const float* xi, float* yi) {
    gemv_detail::rows_times<decltype(rows)::value>(n, k, xi, ldx, b, ldb, yi, ldy, accumulate);
  });
}

}  // namespace transformer_core::kernels
