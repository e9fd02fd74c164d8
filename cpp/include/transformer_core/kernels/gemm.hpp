// Matrix products through CBLAS (OpenBLAS), row-major:  C = alpha · op(A) · op(B) + beta · C
// a: [m, k] (or [k, m] if trans_a)   b: [k, n] (or [n, k] if trans_b)   c: [m, n]
#pragma once

#include <cblas.h>

#include <cstdint>

namespace transformer_core::kernels {

inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                 int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// y[m, n] = x[m, k] · wᵀ + bias      w: [n, k] (torch's nn.Linear layout)   bias: [n] or nullptr
template <class T>
inline void linear(const T* x, int64_t m, int64_t k, const T* w, const T* bias, int64_t n, T* y) {
  if (m == 0 || n == 0) return;
  T beta = T(0);
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) y[i * n + j] = bias[j];
    beta = T(1);
  }
  if (k == 0) {
    if (bias == nullptr)
      for (int64_t i = 0; i < m * n; ++i) y[i] = T(0);
    return;
  }
  gemm(false, true, m, n, k, T(1), x, k, w, k, beta, y, n);
}

}  // namespace transformer_core::kernels
