// The fp32 GEMM kernels for AVX2 + FMA (sgemm.hpp). Compiled with -mavx2 -mfma; chosen at run time.
// The same FMA order as the AVX-512 kernels, so the same bits; the panels are half as wide (below).
#include <immintrin.h>

#include <algorithm>

#include "transformer_core/kernels/sgemm.hpp"
#include "sgemm_panels.hpp"

namespace transformer_core::kernels::sgemm {

namespace {

constexpr int kRows = 6;           // MR: 6 rows × 2 ymm = 12 accumulators (BLIS's Haswell kernel shape)

// Transposes 8 rows of 8 floats in registers: on return r[c] holds column c (element t = row t).
inline void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {  // interleave row pairs: 2 × 2 blocks
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {  // pairs of those: 4 × 4 blocks inside each 128-bit lane
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {  // 128-bit lanes across the two groups of 4 rows
    t[q] = _mm256_permute2f128_ps(r[q], r[4 + q], 0x20);
    t[4 + q] = _mm256_permute2f128_ps(r[q], r[4 + q], 0x31);
  }
  for (int q = 0; q < 8; ++q) r[q] = t[q];
}

// AVX2 packs B into panels of kWidth = 16 columns, half of sgemm.hpp's kPanel:
//   panel s holds B[p, 16s + t] at packed[16s·k + 16p + t]      (zero beyond the last column)
// so column j (a multiple of 16) still starts at packed + j·k, and the kernel's two loads per step
// are one 64-byte line, consecutive from one step to the next. (Reading halves of 32-wide panels,
// 128 bytes apart, ran 5-9 % slower on Zen 3: the hardware prefetcher follows one stream better.)
constexpr int64_t kWidth = kPanel / 2;

void pack_b(int64_t k, int64_t cols, const float* b, int64_t rs_b, int64_t cs_b, float* packed) {
  alignas(32) static constexpr int32_t kFirst[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j0 = 0; j0 < cols; j0 += kWidth) {
    const int64_t nc = std::min(kWidth, cols - j0);
    float* panel = packed + j0 * k;
    if (rs_b == 1) {  // B = wᵀ (a weight [n, k], attention's keys): 8 × 8 blocks of w transposed in
                      // registers; the columns past nc and the depth past k read as zeros
      for (int64_t p = 0; p < k; p += 8) {
        const int64_t depth = std::min<int64_t>(8, k - p);
        const __m256i mp = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kFirst + 8 - depth));
        for (int64_t g = 0; g < kWidth; g += 8) {
          __m256 r[8];
          for (int t = 0; t < 8; ++t)
            r[t] = g + t < nc ? _mm256_maskload_ps(b + (j0 + g + t) * cs_b + p, mp) : _mm256_setzero_ps();
          transpose8(r);
          for (int c = 0; c < depth; ++c) _mm256_storeu_ps(panel + (p + c) * kWidth + g, r[c]);
        }
      }
      continue;
    }
    if (cs_b == 1) {  // B rows are contiguous: copy 16 columns a row, two registers (zeros past nc)
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kFirst + 8 - std::min<int64_t>(nc, 8)));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kFirst + 8 - std::max<int64_t>(nc - 8, 0)));
      for (int64_t p = 0; p < k; ++p) {
        const float* row = b + p * rs_b + j0;
        _mm256_storeu_ps(panel + p * kWidth, _mm256_maskload_ps(row, lo));
        _mm256_storeu_ps(panel + p * kWidth + 8, _mm256_maskload_ps(row + 8, hi));
      }
      continue;
    }
    for (int64_t p = 0; p < k; ++p)
      for (int64_t t = 0; t < kWidth; ++t) panel[p * kWidth + t] = t < nc ? b[p * rs_b + (j0 + t) * cs_b] : 0.0f;
  }
}

// The micro-kernel, for sgemm_panels.hpp's loops.
struct Micro {
  static constexpr int kRows = sgemm::kRows;
  static constexpr int64_t kWidth = sgemm::kWidth;
  // panel-outer, the order in which this kernel was tuned on Zen 3 (bench/README.md); rows-outer,
  // AVX-512's order, was measured only on Emerald Rapids
  static constexpr bool kRowsOuter = false;
  template <int R, bool Masked>
  static void tile(int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* panel, int64_t ldp, float* c,
                   int64_t ldc, int64_t nc, bool accumulate);
};

// c[0:R, 0:nc] = A[0:R, :] · panel   (R rows of A from a, nc ≤ 16 columns; panel row p at
// panel + p · ldp: kWidth for packed panels, B's row stride for multiply_rows). Masked: only the nc
// columns are read (the last, narrower panel of an unpacked B, whose row may end the array).
template <int R, bool Masked>
void Micro::tile(int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* panel, int64_t ldp, float* c,
                 int64_t ldc, int64_t nc, bool accumulate) {
  alignas(32) static constexpr int32_t kFirst[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  const __m256i mlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kFirst + 8 - std::min<int64_t>(nc, 8)));
  const __m256i mhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kFirst + 8 - std::max<int64_t>(nc - 8, 0)));
  __m256 lo[R], hi[R];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  prefetch_rows_for_write<R>(c, ldc, nc);
  for (int64_t p = 0; p < k; ++p, a += cs_a, panel += ldp) {
    const __m256 b0 = Masked ? _mm256_maskload_ps(panel, mlo) : _mm256_loadu_ps(panel);
    const __m256 b1 = Masked ? _mm256_maskload_ps(panel + 8, mhi) : _mm256_loadu_ps(panel + 8);
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
    if (nc == kWidth) {
      if (accumulate) {
        lo[r] = _mm256_add_ps(_mm256_loadu_ps(row), lo[r]);
        hi[r] = _mm256_add_ps(_mm256_loadu_ps(row + 8), hi[r]);
      }
      _mm256_storeu_ps(row, lo[r]);
      _mm256_storeu_ps(row + 8, hi[r]);
    } else {  // a last, narrower panel: through a buffer
      alignas(32) float sums[kWidth];
      _mm256_store_ps(sums, lo[r]);
      _mm256_store_ps(sums + 8, hi[r]);
      for (int64_t t = 0; t < nc; ++t) row[t] = accumulate ? row[t] + sums[t] : sums[t];
    }
  }
}

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{"avx2", pack_b, multiply<Micro>, multiply_rows<Micro>};
  return k;
}

}  // namespace transformer_core::kernels::sgemm
