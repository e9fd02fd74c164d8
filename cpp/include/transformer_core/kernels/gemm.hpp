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

// The CBLAS routines of each precision, row-major, under one name.
namespace cblas {
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemv(CBLAS_TRANSPOSE t, int m, int n, float alpha, const float* a, int lda, const float* x, float beta,
                 float* y) {
  cblas_sgemv(CblasRowMajor, t, m, n, alpha, a, lda, x, 1, beta, y, 1);
}
inline void gemv(CBLAS_TRANSPOSE t, int m, int n, double alpha, const double* a, int lda, const double* x,
                 double beta, double* y) {
  cblas_dgemv(CblasRowMajor, t, m, n, alpha, a, lda, x, 1, beta, y, 1);
}
}  // namespace cblas

// C = alpha · op(A) · op(B) + beta · C on the calling thread (see SingleThreadedBlas).
template <class T>
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                 const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  SingleThreadedBlas single;
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  if (m == 1 && !trans_a) {  // one row (decoding): a matrix-vector product, no packing of b
    // beta = 0 as zero-fill + beta = 1: some OpenBLAS versions scale y by 0 and so keep a NaN in it
    if (beta == 0) {
      std::fill(c, c + n, T(0));
      beta = 1;
    }
    if (trans_b)  // c[0, :] = alpha · b[n, k] · a[0, :] + beta · c
      cblas::gemv(CblasNoTrans, N, K, alpha, b, static_cast<int>(ldb), a, beta, c);
    else          // c[0, :] = alpha · b[k, n]ᵀ · a[0, :] + beta · c
      cblas::gemv(CblasTrans, K, N, alpha, b, static_cast<int>(ldb), a, beta, c);
    return;
  }
  cblas::gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

}  // namespace transformer_core::kernels
