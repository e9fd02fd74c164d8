// The fp32 GEMM kernels for AVX-512 (sgemm.hpp). Compiled with -mavx512f; chosen at run time.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "transformer_core/kernels/sgemm.hpp"

namespace transformer_core::kernels::sgemm {

namespace {

constexpr int kRows = 12;  // MR: 12 rows × 2 zmm = 24 accumulators, 2 panel loads and 12 broadcasts per step

// Transposes 16 rows of 16 floats in registers: on return r[c] holds column c (element t = row t).
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // interleave row pairs: 2 × 2 blocks
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // pairs of those: 4 × 4 blocks inside each 128-bit lane
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 2; ++i)  // 128-bit lanes across groups of 4 rows, then of 8
    for (int q = 0; q < 4; ++q) {
      t[8 * i + q] = _mm512_shuffle_f32x4(r[8 * i + q], r[8 * i + 4 + q], 0x88);
      t[8 * i + 4 + q] = _mm512_shuffle_f32x4(r[8 * i + q], r[8 * i + 4 + q], 0xDD);
    }
  for (int q = 0; q < 8; ++q) {
    r[q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0x88);
    r[8 + q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0xDD);
  }
}

void pack_b(int64_t k, int64_t cols, const float* b, int64_t rs_b, int64_t cs_b, float* packed) {
  for (int64_t j0 = 0; j0 < cols; j0 += kPanel) {
    const int64_t nc = std::min(kPanel, cols - j0);
    float* panel = packed + j0 * k;
    int64_t p = 0;
    if (rs_b == 1) {  // B = wᵀ (a weight [n, k], attention's keys): 16 × 16 blocks of w transposed in
                      // registers; the columns past nc and the depth past k read as zeros
      for (; p < k; p += 16) {
        const int64_t depth = std::min<int64_t>(16, k - p);
        const __mmask16 mp = static_cast<__mmask16>(depth == 16 ? 0xFFFF : (1u << depth) - 1);
        for (int64_t half = 0; half < 2; ++half) {
          __m512 r[16];
          for (int t = 0; t < 16; ++t) {
            const int64_t col = 16 * half + t;
            r[t] = col < nc ? _mm512_maskz_loadu_ps(mp, b + (j0 + col) * cs_b + p) : _mm512_setzero_ps();
          }
          transpose16(r);
          for (int c = 0; c < depth; ++c) _mm512_storeu_ps(panel + (p + c) * kPanel + 16 * half, r[c]);
        }
      }
    } else if (cs_b == 1) {  // B rows are contiguous: copy 32 columns a row
      const __mmask16 lo = static_cast<__mmask16>(nc >= 16 ? 0xFFFF : (1u << nc) - 1);
      const __mmask16 hi = static_cast<__mmask16>(nc >= 32 ? 0xFFFF : nc > 16 ? (1u << (nc - 16)) - 1 : 0);
      for (; p < k; ++p) {
        const float* row = b + p * rs_b + j0;
        _mm512_storeu_ps(panel + p * kPanel, _mm512_maskz_loadu_ps(lo, row));
        _mm512_storeu_ps(panel + p * kPanel + 16, _mm512_maskz_loadu_ps(hi, row + 16));
      }
    }
    for (; p < k; ++p)  // what is left: element by element
      for (int64_t t = 0; t < kPanel; ++t) panel[p * kPanel + t] = t < nc ? b[p * rs_b + (j0 + t) * cs_b] : 0.0f;
  }
}

// c[0:R, 0:nc] = A[0:R, :] · panel   (R rows of A from a, nc ≤ 32 columns; panel row p at
// panel + p · ldp: kPanel for packed panels, B's row stride for multiply_rows). Masked: only the nc
// columns are read (the last, narrower panel of an unpacked B, whose row may end the array).
template <int R, bool Masked>
void tile(int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* panel, int64_t ldp, float* c,
          int64_t ldc, int64_t nc, bool accumulate) {
  const __mmask16 mlo = static_cast<__mmask16>(nc >= 16 ? 0xFFFF : (1u << nc) - 1);
  const __mmask16 mhi = static_cast<__mmask16>(nc >= 32 ? 0xFFFF : nc > 16 ? (1u << (nc - 16)) - 1 : 0);
  __m512 lo[R], hi[R];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p, a += cs_a, panel += ldp) {
    const __m512 b0 = Masked ? _mm512_maskz_loadu_ps(mlo, panel) : _mm512_loadu_ps(panel);
    const __m512 b1 = Masked ? _mm512_maskz_loadu_ps(mhi, panel + 16) : _mm512_loadu_ps(panel + 16);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * rs_a]);
      lo[r] = _mm512_fmadd_ps(ar, b0, lo[r]);
      hi[r] = _mm512_fmadd_ps(ar, b1, hi[r]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* row = c + r * ldc;
    if (accumulate) {
      lo[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(mlo, row), lo[r]);
      hi[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(mhi, row + 16), hi[r]);
    }
    _mm512_mask_storeu_ps(row, mlo, lo[r]);
    _mm512_mask_storeu_ps(row + 16, mhi, hi[r]);
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t, bool);
template <bool Masked, int... R>
constexpr auto make_tiles(std::integer_sequence<int, R...>) {
  return std::array<TileFn, sizeof...(R)>{tile<R + 1, Masked>...};
}
// kTiles[masked][r - 1]: the tile of r rows (the last rows of A, fewer than kRows).
constexpr std::array<std::array<TileFn, kRows>, 2> kTiles = {
    make_tiles<false>(std::make_integer_sequence<int, kRows>{}), make_tiles<true>(std::make_integer_sequence<int, kRows>{})};

// c[0:m, 0:nc] = A · panel: every row of A, kRows at a time, then the last rows.
template <bool Masked>
void panel_times_rows(int64_t m, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* panel, int64_t ldp,
                      float* c, int64_t ldc, int64_t nc, bool accumulate) {
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows)
    tile<kRows, Masked>(k, a + i * rs_a, rs_a, cs_a, panel, ldp, c + i * ldc, ldc, nc, accumulate);
  if (i < m) kTiles[Masked][m - i - 1](k, a + i * rs_a, rs_a, cs_a, panel, ldp, c + i * ldc, ldc, nc, accumulate);
}

void multiply(int64_t m, int64_t cols, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* packed,
              float* c, int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < cols; j += kPanel)  // one panel of B meets every row of A while it is in cache
    panel_times_rows<false>(m, k, a, rs_a, cs_a, packed + j * k, kPanel, c + j, ldc, std::min(kPanel, cols - j),
                            accumulate);
}

void multiply_rows(int64_t m, int64_t cols, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < cols; j += kPanel) {  // the panels are B's columns j .. j + 31, read in place
    const int64_t nc = std::min(kPanel, cols - j);
    if (nc == kPanel) {
      panel_times_rows<false>(m, k, a, rs_a, cs_a, b + j, ldb, c + j, ldc, nc, accumulate);
    } else {  // the last columns: only they are read
      panel_times_rows<true>(m, k, a, rs_a, cs_a, b + j, ldb, c + j, ldc, nc, accumulate);
    }
  }
}

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{"avx512", pack_b, multiply, multiply_rows};
  return k;
}

}  // namespace transformer_core::kernels::sgemm
