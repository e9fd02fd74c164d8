// Backward of the affine map y = x · Wᵀ + b (torch's nn.Linear; llm.c's matmul_backward):
//
//   dX      = dY · W                 dX: [m, k]   dY: [m, n]   W: [n, k]
//   dW (+)= dYᵀ · X                  dW: [n, k]   X:  [m, k]
//   db (+)= Σ_rows dY                db: [n]
//
// With w_in_out (Hugging Face's Conv1D, GPT-2: W: [k, n], y = x · W + b):
//
//   dX      = dY · Wᵀ                dW (+)= Xᵀ · dY   (dW: [k, n])
//
// "(+)=": with `accumulate` the gradients are added to what dW / db already hold (gradient
// accumulation over micro-batches, or a weight used twice); without it they are overwritten.
//
// Work: fixed tiles of every output, each one single-threaded GEMM inside our parallel region
// (kernels/gemm.hpp's gemm_on_thread: our kernels for fp32, BLAS otherwise): dX in [kBackwardTileRows, kBackwardTileCols]
// tiles over (rows, in_features); dW in tiles over its own [n, k] (or [k, n]) output, each tile
// summing ALL m rows in one GEMM; db in column blocks, each summing the rows in order. No output
// element is written by two tasks and no sum is split between threads, so the result is bitwise
// the same for any thread count.
#pragma once

#include <algorithm>
#include <cstdint>

#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/linear.hpp"
#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::kernels {

// Tiles of the two products. Each task packs the columns of its right operand that it needs and
// meets them with all its rows, so taller tiles pack less: dX's tiles of 1024 rows pack W once per
// 1024 rows (an output layer's 50257 × 768 weight, in the fused LM head's dX, once per chunk of
// rows instead of three times), and 384 columns split GPT-2's 768 and 3072 into equal tasks. GPT-2-small
// training step (bench/train.py, fp32, 2 threads): 256 × 512 tiles 3.9 s, 1024 × 384 3.7 s.
constexpr int64_t kBackwardTileRows = 1024;
constexpr int64_t kBackwardTileCols = 384;
// Columns of db per task (its sums run over all m rows, in order, in double).
constexpr int64_t kBiasGradCols = 256;

// c[rows, cols] (row stride ldc) = 0
template <class T>
inline void zero_tile(T* c, int64_t rows, int64_t cols, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i) std::fill(c + i * ldc, c + i * ldc + cols, T(0));
}

// x: [m, k]   dy: [m, n]   w: [n, k] (or [k, n] with w_in_out)
// dx: [m, k] or nullptr (not wanted)   dw: [n, k] (or [k, n]) or nullptr   db: [n] or nullptr
template <class T>
void linear_backward(const T* x, const T* dy, const T* w, int64_t m, int64_t k, int64_t n, T* dx, T* dw,
                     T* db, bool accumulate, bool w_in_out = false) {
  // dX tiles over [m, k]
  const int64_t dx_row_tiles = dx != nullptr ? (m + kBackwardTileRows - 1) / kBackwardTileRows : 0;
  const int64_t dx_col_tiles = (k + kBackwardTileCols - 1) / kBackwardTileCols;
  const int64_t dx_tasks = dx_row_tiles * dx_col_tiles;
  // dW as [P, Q] = Aᵀ · B over the m rows:  torch layout P = n, A = dY, Q = k, B = X;
  //                                          Conv1D layout P = k, A = X,  Q = n, B = dY.
  const int64_t P = w_in_out ? k : n, Q = w_in_out ? n : k;
  const T* A = w_in_out ? x : dy;
  const T* B = w_in_out ? dy : x;
  const int64_t dw_row_tiles = dw != nullptr ? (P + kBackwardTileRows - 1) / kBackwardTileRows : 0;
  const int64_t dw_col_tiles = (Q + kBackwardTileCols - 1) / kBackwardTileCols;
  const int64_t dw_tasks = dw_row_tiles * dw_col_tiles;
  const int64_t db_tasks = db != nullptr ? (n + kBiasGradCols - 1) / kBiasGradCols : 0;

  auto task = [&](int64_t t, int) {
    if (t < dx_tasks) {
      // dX[r0 : r0+rows, c0 : c0+cols] = dY[r0 : r0+rows, :] · W[:, c0 : c0+cols]     (W: [n, k])
      //                                = dY[r0 : r0+rows, :] · W[c0 : c0+cols, :]ᵀ    (W: [k, n])
      const int64_t r0 = (t / dx_col_tiles) * kBackwardTileRows, c0 = (t % dx_col_tiles) * kBackwardTileCols;
      const int64_t rows = std::min(kBackwardTileRows, m - r0), cols = std::min(kBackwardTileCols, k - c0);
      T* c = dx + r0 * k + c0;
      if (n == 0) return zero_tile(c, rows, cols, k);
      if (w_in_out)
        gemm_on_thread(false, true, rows, cols, n, dy + r0 * n, n, w + c0 * n, n, c, k, false);
      else
        gemm_on_thread(false, false, rows, cols, n, dy + r0 * n, n, w + c0, k, c, k, false);
      return;
    }
    t -= dx_tasks;
    if (t < dw_tasks) {
      // dW[p0 : p0+rows, q0 : q0+cols] (+)= A[:, p0 : p0+rows]ᵀ · B[:, q0 : q0+cols]   (all m rows)
      const int64_t p0 = (t / dw_col_tiles) * kBackwardTileRows, q0 = (t % dw_col_tiles) * kBackwardTileCols;
      const int64_t rows = std::min(kBackwardTileRows, P - p0), cols = std::min(kBackwardTileCols, Q - q0);
      T* c = dw + p0 * Q + q0;
      if (m == 0) {
        if (!accumulate) zero_tile(c, rows, cols, Q);
        return;
      }
      gemm_on_thread(true, false, rows, cols, m, A + p0, P, B + q0, Q, c, Q, accumulate);
      return;
    }
    t -= dw_tasks;
    // db[c0 : c1] (+)= Σ_r dY[r, c0 : c1], rows in order, summed in double
    const int64_t c0 = t * kBiasGradCols, c1 = std::min(n, c0 + kBiasGradCols);
    double acc[kBiasGradCols] = {};
    for (int64_t r = 0; r < m; ++r) {
      const T* row = dy + r * n;
      for (int64_t j = c0; j < c1; ++j) acc[j - c0] += static_cast<double>(row[j]);
    }
    for (int64_t j = c0; j < c1; ++j)
      db[j] = static_cast<T>(accumulate ? static_cast<double>(db[j]) + acc[j - c0] : acc[j - c0]);
  };

  const int64_t tasks = dx_tasks + dw_tasks + db_tasks;
  run_tasks(/*serial=*/2 * m * n * k < kLinearSerialMacs, tasks, task);  // tiny problems on the calling thread
}

}  // namespace transformer_core::kernels
