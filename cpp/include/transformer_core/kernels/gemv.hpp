// One fp32 row of x times a matrix, on the calling thread: the products of a decoding step, whose
// attention has one query row against thousands of keys.
//
//   row_times_transposed:  y[j] (+)= Σ_p x[p] · b[j, p]     b: [n, k] (row stride ldb)   q · kᵀ: scores
//   row_times:             y[j] (+)= Σ_p x[p] · b[p, j]     b: [k, n] (row stride ldb)   p · v: output
//
// A GEMM would pack b into panels first, for one row's use of them; these stream b once. Each y[j]
// is summed the same way whatever n, ldb and its position in y, so a key's score does not depend
// on how the keys are cut into blocks or chunks:
//   * row_times_transposed: blocks of as many rows of b as a SIMD register has lanes, one
//     accumulator each; sum_lanes adds each accumulator's lanes by the same tree, all of them at
//     once into one register (lane c = the dot product of row c); the k mod lanes last products are
//     added in order after. The rows of a block are read one after the other, each from its start
//     to its end, and the rows four blocks on are prefetched into L2 meanwhile. A decoding step's
//     keys come from memory (the rest of the model ran since they were last read), and reading
//     sixteen rows side by side, a vector of each in turn, defeats the hardware prefetchers: one
//     thread, Zen 4, 12 heads × 4,096 keys of 64 from DRAM: 1.5 → 0.7 ms. With every key in L2 the
//     side-by-side order is 25–30 % faster (a load of x per sixteen products instead of one each),
//     but a decoding step does not find its keys there.
//   * row_times: each y[j] is one fused multiply-add chain over p in order, in a SIMD lane or, for
//     the last n mod lanes columns, in std::fma: the same bits either way.
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

#include "transformer_core/kernels/simd.hpp"

namespace transformer_core::kernels {

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

}  // namespace gemv_detail

inline void row_times_transposed(int64_t n, int64_t k, const float* x, const float* b, int64_t ldb, float* y,
                                 bool accumulate) {
  using gemv_detail::Batch;
  constexpr int64_t W = gemv_detail::kLanes;
  constexpr int64_t kPrefetchBlocks = 4;
  const int64_t k_vec = k - k % W;
  for (int64_t j0 = 0; j0 < n; j0 += W) {
    const int64_t count = std::min(W, n - j0);
    const float* rows[W];  // a short last block repeats its last row (computed, not stored)
    for (int64_t c = 0; c < W; ++c) rows[c] = b + std::min(j0 + c, n - 1) * ldb;
    const int64_t ahead = j0 + kPrefetchBlocks * W;  // the rows of b read kPrefetchBlocks blocks later
    Batch acc[W];
    for (int64_t c = 0; c < W; ++c) {
      const float* later = b + std::min(ahead + c, n - 1) * ldb;
      Batch sum(0.f);
      for (int64_t p = 0; p < k_vec; p += W) {
        if (ahead < n) __builtin_prefetch(later + p, 0, 2);  // into L2 (prefetcht1)
        sum = simd::fma(Batch::load_unaligned(x + p), Batch::load_unaligned(rows[c] + p), sum);
      }
      acc[c] = sum;
    }
    alignas(64) float sums[W];
    gemv_detail::sum_lanes(acc).store_aligned(sums);
    for (int64_t c = 0; c < count; ++c) {
      float s = sums[c];
      for (int64_t p = k_vec; p < k; ++p) s += x[p] * rows[c][p];
      y[j0 + c] = accumulate ? y[j0 + c] + s : s;
    }
  }
}

inline void row_times(int64_t n, int64_t k, const float* x, const float* b, int64_t ldb, float* y, bool accumulate) {
  using gemv_detail::Batch;
  constexpr int64_t W = gemv_detail::kLanes;
  constexpr int64_t kChains = 4;  // registers of columns at a time
  auto store = [&](int64_t j, const Batch& acc) {
    (accumulate ? Batch::load_unaligned(y + j) + acc : acc).store_unaligned(y + j);
  };
  int64_t j = 0;
  for (; j + kChains * W <= n; j += kChains * W) {
    Batch acc[kChains];
    for (int64_t c = 0; c < kChains; ++c) acc[c] = Batch(0.f);
    for (int64_t p = 0; p < k; ++p) {
      const Batch xp(x[p]);
      const float* row = b + p * ldb + j;
      for (int64_t c = 0; c < kChains; ++c) acc[c] = simd::fma(xp, Batch::load_unaligned(row + c * W), acc[c]);
    }
    for (int64_t c = 0; c < kChains; ++c) store(j + c * W, acc[c]);
  }
  for (; j + W <= n; j += W) {
    Batch acc(0.f);
    for (int64_t p = 0; p < k; ++p) acc = simd::fma(Batch(x[p]), Batch::load_unaligned(b + p * ldb + j), acc);
    store(j, acc);
  }
  for (; j < n; ++j) {
    float s = 0;
    for (int64_t p = 0; p < k; ++p) s = std::fma(x[p], b[p * ldb + j], s);
    y[j] = accumulate ? y[j] + s : s;
  }
}

}  // namespace transformer_core::kernels
