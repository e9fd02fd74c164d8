// Matrix products through CBLAS (OpenBLAS), row-major:  C = alpha · op(A) · op(B) + beta · C
// a: [m, k] (or [k, m] if trans_a)   b: [k, n] (or [n, k] if trans_b)   c: [m, n]
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>

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

}  // namespace transformer_core::kernels
