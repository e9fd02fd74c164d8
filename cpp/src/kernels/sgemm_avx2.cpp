// The fp32 GEMM kernels for AVX2 + FMA (sgemm.hpp). Compiled with -mavx2 -mfma; chosen at run time.
// Same panels and the same FMA order as the AVX-512 kernels, so the same bits.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "transformer_core/kernels/sgemm.hpp"

namespace transformer_core::kernels::sgemm {

namespace {

constexpr int kRows = 6;           // MR: 6 rows × 2 ymm = 12 accumulators (BLIS's Haswell kernel shape)
constexpr int64_t kHalf = kPanel / 2;  // the kernel covers half a panel: 16 columns

void pack_b(int64_t k, int64_t cols, const float* b, int64_t rs_b, int64_t cs_b, float* packed) {
  for (int64_t j0 = 0; j0 < cols; j0 += kPanel) {
    const int64_t nc = std::min(kPanel, cols - j0);
    float* panel = packed + j0 * k;
    if (rs_b == 1) {  // B = wᵀ: read each row of w once, write it down a column of the panel
      for (int64_t t = 0; t < kPanel; ++t) {
        if (t < nc) {
          const float* row = b + (j0 + t) * cs_b;
          for (int64_t p = 0; p < k; ++p) panel[p * kPanel + t] = row[p];
        } else {
          for (int64_t p = 0; p < k; ++p) panel[p * kPanel + t] = 0.0f;
        }
      }
      continue;
    }
    if (cs_b == 1) {  // B rows are contiguous: copy 32 columns a row
      for (int64_t p = 0; p < k; ++p) {
        std::copy(b + p * rs_b + j0, b + p * rs_b + j0 + nc, panel + p * kPanel);
        std::fill(panel + p * kPanel + nc, panel + (p + 1) * kPanel, 0.0f);
      }
      continue;
    }
    for (int64_t p = 0; p < k; ++p)
      for (int64_t t = 0; t < kPanel; ++t) panel[p * kPanel + t] = t < nc ? b[p * rs_b + (j0 + t) * cs_b] : 0.0f;
  }
}

// c[0:R, 0:nc] = A[0:R, :] · half_panel   (nc ≤ 16 columns; the half panel's rows are kPanel apart)
template <int R>
void tile(int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* half_panel, float* c, int64_t ldc,
          int64_t nc, bool accumulate) {
  __m256 lo[R], hi[R];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; ++p, a += cs_a, half_panel += kPanel) {
    const __m256 b0 = _mm256_loadu_ps(half_panel), b1 = _mm256_loadu_ps(half_panel + 8);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * rs_a);
      lo[r] = _mm256_fmadd_ps(ar, b0, lo[r]);
      hi[r] = _mm256_fmadd_ps(ar, b1, hi[r]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* row = c + r * ldc;
    if (nc == kHalf) {
      if (accumulate) {
        lo[r] = _mm256_add_ps(_mm256_loadu_ps(row), lo[r]);
        hi[r] = _mm256_add_ps(_mm256_loadu_ps(row + 8), hi[r]);
      }
      _mm256_storeu_ps(row, lo[r]);
      _mm256_storeu_ps(row + 8, hi[r]);
    } else {  // a last, narrower half panel: through a buffer
      alignas(32) float sums[kHalf];
      _mm256_store_ps(sums, lo[r]);
      _mm256_store_ps(sums + 8, hi[r]);
      for (int64_t t = 0; t < nc; ++t) row[t] = accumulate ? row[t] + sums[t] : sums[t];
    }
  }
}

template <int... R>
constexpr auto make_tiles(std::integer_sequence<int, R...>) {
  using Fn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t, bool);
  return std::array<Fn, sizeof...(R)>{tile<R + 1>...};
}
// kTiles[r - 1]: the tile of r rows (the last rows of A, fewer than kRows).
constexpr auto kTiles = make_tiles(std::make_integer_sequence<int, kRows>{});

void multiply(int64_t m, int64_t cols, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* packed,
              float* c, int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < cols; j += kHalf) {  // one half panel of B meets every row of A while it is in cache
    const float* half_panel = packed + (j / kPanel) * kPanel * k + j % kPanel;
    const int64_t nc = std::min(kHalf, cols - j);
    int64_t i = 0;
    for (; i + kRows <= m; i += kRows) tile<kRows>(k, a + i * rs_a, rs_a, cs_a, half_panel, c + i * ldc + j, ldc, nc, accumulate);
    if (i < m) kTiles[m - i - 1](k, a + i * rs_a, rs_a, cs_a, half_panel, c + i * ldc + j, ldc, nc, accumulate);
  }
}

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{"avx2", pack_b, multiply};
  return k;
}

}  // namespace transformer_core::kernels::sgemm
