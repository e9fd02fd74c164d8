// The loops around an fp32 GEMM micro-kernel, shared by the ISAs' kernels (sgemm_avx2.cpp,
// sgemm_avx512.cpp; sgemm.hpp has the design): the tiles of fewer rows than MR, and multiply /
// multiply_rows, which run every row of A against one panel of B at a time (the panel meets every
// row of A while it is in cache). Internal linkage: each translation unit compiles its own copy
// under its own ISA flags (quant_common.hpp says why).
//
// Micro, the ISA's micro-kernel:
//   static constexpr int kRows;       MR: rows of C per tile
//   static constexpr int64_t kWidth;  columns of a panel
//   static constexpr bool kRowsOuter; multiply's loop order (below)
//   template <int R, bool Masked>
//   static void tile(k, a, rs_a, cs_a, panel, ldp, c, ldc, nc, accumulate);
//     c[0:R, 0:nc] (+)= A[0:R, :] · panel, A[i, p] = a[i · rs_a + p · cs_a], panel row p at
//     panel + p · ldp; Masked: only the nc ≤ kWidth columns of each panel row are read.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

namespace transformer_core::kernels::sgemm {
namespace {

// Asks for the lines of a tile's R rows of C (nc ≤ kWidth columns: at most three lines a row)
// before its k loop, so that they arrive while the products run and the stores at the end do not
// wait for them. Zen 4, MiniLM's 384 → 1536 and 384 → 1152 products (96 × 128 tiles of C), one
// thread: 104-108 → 108-112 GFLOP/s and 106-111 → 110-114 (two threads 186-205 → 209-216);
// 1536 → 384, whose tiles take four times longer, about 1 %. The AVX2 kernel there: unchanged.
template <int R>
inline void prefetch_rows_for_write(const float* c, int64_t ldc, int64_t nc) {
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const float* row = c + r * ldc;
    __builtin_prefetch(row, 1, 3);
    __builtin_prefetch(row + (nc - 1) / 2, 1, 3);
    __builtin_prefetch(row + (nc - 1), 1, 3);
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, int64_t, bool);

template <class Micro, bool Masked, int... R>
constexpr std::array<TileFn, sizeof...(R)> tiles_of(std::integer_sequence<int, R...>) {
  return {&Micro::template tile<R + 1, Masked>...};
}
// kTiles<Micro, Masked>[r - 1]: the tile of r rows (the last rows of A, fewer than MR).
template <class Micro, bool Masked>
constexpr std::array<TileFn, Micro::kRows> kTiles =
    tiles_of<Micro, Masked>(std::make_integer_sequence<int, Micro::kRows>{});

// c[0:m, 0:nc] (+)= A · panel: every row of A, MR at a time, then the last rows.
template <class Micro, bool Masked>
void panel_times_rows(int64_t m, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* panel, int64_t ldp,
                      float* c, int64_t ldc, int64_t nc, bool accumulate) {
  constexpr int MR = Micro::kRows;
  int64_t i = 0;
  for (; i + MR <= m; i += MR)
    Micro::template tile<MR, Masked>(k, a + i * rs_a, rs_a, cs_a, panel, ldp, c + i * ldc, ldc, nc, accumulate);
  if (i < m)
    kTiles<Micro, Masked>[m - i - 1](k, a + i * rs_a, rs_a, cs_a, panel, ldp, c + i * ldc, ldc, nc, accumulate);
}

// Kernels::multiply: B in pack_b's panels (panel q at packed + q · kWidth · k, its rows kWidth apart).
// Micro::kRowsOuter: MR rows of A against every panel, then the next MR rows (those rows of A stay in
// L1 while the panels come from L2); else each panel against every row of A (panel_times_rows).
template <class Micro>
void multiply(int64_t m, int64_t cols, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* packed,
              float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t W = Micro::kWidth;
  if constexpr (!Micro::kRowsOuter) {
    for (int64_t j = 0; j < cols; j += W)
      panel_times_rows<Micro, false>(m, k, a, rs_a, cs_a, packed + j * k, W, c + j, ldc, std::min(W, cols - j),
                                     accumulate);
  } else {
    constexpr int MR = Micro::kRows;
    for (int64_t i = 0; i < m; i += MR) {
      const TileFn tile = i + MR <= m ? &Micro::template tile<MR, false> : kTiles<Micro, false>[m - i - 1];
      for (int64_t j = 0; j < cols; j += W)
        tile(k, a + i * rs_a, rs_a, cs_a, packed + j * k, W, c + i * ldc + j, ldc, std::min(W, cols - j), accumulate);
    }
  }
}

// Kernels::multiply_rows: B in place, its rows ldb apart; the panels are its columns j .. j + kWidth - 1,
// the last, narrower one read through masks.
template <class Micro>
void multiply_rows(int64_t m, int64_t cols, int64_t k, const float* a, int64_t rs_a, int64_t cs_a, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t W = Micro::kWidth;
  for (int64_t j = 0; j < cols; j += W) {
    const int64_t nc = std::min(W, cols - j);
    if (nc == W) {
      panel_times_rows<Micro, false>(m, k, a, rs_a, cs_a, b + j, ldb, c + j, ldc, nc, accumulate);
    } else {
      panel_times_rows<Micro, true>(m, k, a, rs_a, cs_a, b + j, ldb, c + j, ldc, nc, accumulate);
    }
  }
}

}  // namespace
}  // namespace transformer_core::kernels::sgemm
