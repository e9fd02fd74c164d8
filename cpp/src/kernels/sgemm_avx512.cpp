// The fp32 GEMM kernels for AVX-512 (sgemm.hpp). Compiled with -mavx512f; chosen at run time.
#include <immintrin.h>

#include <algorithm>

#include "transformer_core/kernels/sgemm.hpp"
#include "sgemm_panels.hpp"

namespace transformer_core::kernels::sgemm {

namespace {

constexpr int kRows = 12;  // MR: 12 rows × 2 zmm = 24 accumulators, 2 panel loads and 12 broadcasts per step
// How far ahead (steps of k) the tile asks for its panel's rows: the panels stream from L2 (64 KiB
// at k = 512, past L1), and the hardware's L1 prefetch left the loads waiting. Emerald Rapids, 2
// threads, the harness of bench/README.md ("Our GEMM"): 16 rows +2-8 % on MiniLM's, SmolLM2's and
// 2048³'s shapes (4 rows +1-6 %, 8 rows 0-7 %).
constexpr int64_t kPrefetchRows = 16;

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

// The micro-kernel, for sgemm_panels.hpp's loops.
struct Micro {
  static constexpr int kRows = sgemm::kRows;
  static constexpr int64_t kWidth = kPanel;
  // 12 rows of A (24 KiB at K = 512) stay in L1 across a tile's four 64 KiB panels: +0-2 % alone
  // (Emerald Rapids, harness of linear_packed's tasks; with the task's own packing and the
  // register-held row pointers below, +4-7 %: bench/README.md).
  static constexpr bool kRowsOuter = true;
  template <int R, bool Masked>
  static void tile(int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* panel, int64_t ldp, float* c,
                   int64_t ldc, int64_t nc, bool accumulate);
};

// c[0:R, 0:nc] = A[0:R, :] · panel   (R rows of A from a, nc ≤ 32 columns; panel row p at
// panel + p · ldp: kPanel for packed panels, B's row stride for multiply_rows). Masked: only the nc
// columns are read (the last, narrower panel of an unpacked B, whose row may end the array).
template <int R, bool Masked>
void Micro::tile(int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* panel, int64_t ldp, float* c,
                 int64_t ldc, int64_t nc, bool accumulate) {
  const __mmask16 mlo = static_cast<__mmask16>(nc >= 16 ? 0xFFFF : (1u << nc) - 1);
  const __mmask16 mhi = static_cast<__mmask16>(nc >= 32 ? 0xFFFF : nc > 16 ? (1u << (nc - 16)) - 1 : 0);
  __m512 lo[R], hi[R];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  prefetch_rows_for_write<R>(c, ldc, nc);
  // Row r of A is read at base[r / 3] + (r % 3) · rs_a: four pointers and two strides stay in
  // registers, where twelve row offsets did not (three were reloaded from the stack every step).
  constexpr int G = (R + 2) / 3;  // groups of three rows
  const float* base[G];
  #pragma GCC unroll 4
  for (int g = 0; g < G; ++g) base[g] = a + 3 * g * rs_a;
  const int64_t rs1 = rs_a, rs2 = 2 * rs_a;
  for (int64_t p = 0; p < k; ++p, panel += ldp) {
    const __m512 b0 = Masked ? _mm512_maskz_loadu_ps(mlo, panel) : _mm512_loadu_ps(panel);
    const __m512 b1 = Masked ? _mm512_maskz_loadu_ps(mhi, panel + 16) : _mm512_loadu_ps(panel + 16);
    // the panel's row kPrefetchRows steps ahead, into L1 (a prefetch past the end does not fault)
    _mm_prefetch(reinterpret_cast<const char*>(panel + kPrefetchRows * ldp), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(panel + kPrefetchRows * ldp + 16), _MM_HINT_T0);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float* row = base[r / 3];
      const __m512 ar = _mm512_set1_ps(r % 3 == 0 ? row[0] : r % 3 == 1 ? row[rs1] : row[rs2]);
      lo[r] = _mm512_fmadd_ps(ar, b0, lo[r]);
      hi[r] = _mm512_fmadd_ps(ar, b1, hi[r]);
    }
    #pragma GCC unroll 4
    for (int g = 0; g < G; ++g) base[g] += cs_a;
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

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{"avx512", pack_b, multiply<Micro>, multiply_rows<Micro>};
  return k;
}

}  // namespace transformer_core::kernels::sgemm
