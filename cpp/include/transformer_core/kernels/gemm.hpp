// Matrix products through CBLAS (OpenBLAS), row-major:  C = alpha · op(A) · op(B) + beta · C
// a: [m, k] (or [k, m] if trans_a)   b: [k, n] (or [n, k] if trans_b)   c: [m, n]
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/kernels/linear_small.hpp"
#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::kernels {

// OpenBLAS (OpenMP build) sizes its team from omp_get_max_threads() unless it is called inside a
// parallel region. Every GEMM of ours runs single-threaded — our parallel_for splits the work — so
// outside a region the guard sets this thread's OpenMP count to 1 for the call. That keeps one
// threading runtime, no oversubscription, and results that do not depend on the thread count.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(omp_in_parallel() ? 0 : omp_get_max_threads()) {
    if (saved_ > 1) omp_set_num_threads(1);
  }
  ~SingleThreadedBlas() {
    if (saved_ > 1) omp_set_num_threads(saved_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int saved_;
};

inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  SingleThreadedBlas single;
  if (m == 1 && !trans_a) {  // one row (decoding): a matrix-vector product, no packing of b
    // beta = 0 as zero-fill + beta = 1: some OpenBLAS versions scale y by 0 and so keep a NaN in it
    if (beta == 0) {
      std::fill(c, c + n, 0);
      beta = 1;
    }
    if (trans_b)              // c[0, :] = alpha · b[n, k] · a[0, :] + beta · c
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), alpha, b,
                  static_cast<int>(ldb), a, 1, beta, c, 1);
    else                      // c[0, :] = alpha · b[k, n]ᵀ · a[0, :] + beta · c
      cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(k), static_cast<int>(n), alpha, b,
                  static_cast<int>(ldb), a, 1, beta, c, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                 int64_t ldc) {
  SingleThreadedBlas single;
  if (m == 1 && !trans_a) {  // one row (decoding): a matrix-vector product, no packing of b
    // beta = 0 as zero-fill + beta = 1: some OpenBLAS versions scale y by 0 and so keep a NaN in it
    if (beta == 0) {
      std::fill(c, c + n, 0);
      beta = 1;
    }
    if (trans_b)              // c[0, :] = alpha · b[n, k] · a[0, :] + beta · c
      cblas_dgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), alpha, b,
                  static_cast<int>(ldb), a, 1, beta, c, 1);
    else                      // c[0, :] = alpha · b[k, n]ᵀ · a[0, :] + beta · c
      cblas_dgemv(CblasRowMajor, CblasTrans, static_cast<int>(k), static_cast<int>(n), alpha, b,
                  static_cast<int>(ldb), a, 1, beta, c, 1);
    return;
  }
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// y[m, n] = act(x[m, k] · wᵀ + bias)      w: [n, k] (torch's nn.Linear layout)   bias: [n] or nullptr
// With w_in_out, w is [k, n] and y = x · w + bias (Hugging Face's Conv1D layout, GPT-2).
//
// Parallel over fixed tiles of y (kLinearTileRows × kLinearTileCols), each one single-threaded
// GEMM inside our parallel region. The tiles do not depend on the thread count, and every element
// is accumulated over k in the same order, so the result is bitwise the same for 1 or 2 threads.
constexpr int64_t kLinearTileRows = 64;
constexpr int64_t kLinearTileCols = 512;
// Below this many multiply-adds (≈ 10 µs of work) a parallel region costs more than it saves.
constexpr int64_t kLinearSerialMacs = 1 << 18;

template <class T>
inline void linear(const T* x, int64_t m, int64_t k, const T* w, const T* bias, int64_t n, T* y,
                   bool w_in_out = false, Activation act = Activation::kNone) {
  if (m == 0 || n == 0) return;
  // y[r0:r0+rows, c0:c0+cols] = act(y ...), applied to each tile right after its product, while the
  // tile is still in cache: the activation of a feed-forward layer costs no pass over memory.
  auto activate_tile = [&](T* yt, int64_t rows, int64_t cols) {
    if (act == Activation::kNone) return;
    for (int64_t i = 0; i < rows; ++i) activate(yt + i * n, cols, act);
  };
  if (m <= kSmallRows && !w_in_out && k > 0) {  // a few rows: stream w once (linear_small.hpp)
    const int64_t chunks = (n + 63) / 64;           // 64 output features per task, fixed
    auto chunk = [&](int64_t c, int) {
      const int64_t c0 = c * 64, c1 = std::min(n, c0 + 64);
      linear_small_rows(x, m, k, w, bias, c0, c1, n, y);
      activate_tile(y + c0, m, c1 - c0);
    };
    if (m * n * k < kLinearSerialMacs) {
      for (int64_t c = 0; c < chunks; ++c) chunk(c, 0);
    } else {
      parallel_tasks(chunks, chunk);
    }
    return;
  }
  const int64_t row_tiles = (m + kLinearTileRows - 1) / kLinearTileRows;
  const int64_t col_tiles = (n + kLinearTileCols - 1) / kLinearTileCols;
  auto tile = [&](int64_t task, int) {
    const int64_t r0 = (task / col_tiles) * kLinearTileRows, c0 = (task % col_tiles) * kLinearTileCols;
    const int64_t rows = std::min(kLinearTileRows, m - r0), cols = std::min(kLinearTileCols, n - c0);
    T* yt = y + r0 * n + c0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) yt[i * n + j] = bias != nullptr ? bias[c0 + j] : T(0);
    if (k == 0) return activate_tile(yt, rows, cols);
    if (w_in_out) {
      gemm(false, false, rows, cols, k, T(1), x + r0 * k, k, w + c0, n, T(1), yt, n);
    } else {
      gemm(false, true, rows, cols, k, T(1), x + r0 * k, k, w + c0 * k, k, T(1), yt, n);
    }
    activate_tile(yt, rows, cols);
  };
  if (m * n * k < kLinearSerialMacs) {
    for (int64_t t = 0; t < row_tiles * col_tiles; ++t) tile(t, 0);  // same tiles, same result
  } else {
    parallel_tasks(row_tiles * col_tiles, tile);
  }
}

}  // namespace transformer_core::kernels
