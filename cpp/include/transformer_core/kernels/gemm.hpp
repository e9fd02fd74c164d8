// Matrix products through CBLAS (OpenBLAS or MKL, kernels/blas.hpp), row-major:  C = alpha · op(A) · op(B) + beta · C
// a: [m, k] (or [k, m] if trans_a)   b: [k, n] (or [n, k] if trans_b)   c: [m, n]
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "transformer_core/kernels/blas.hpp"
#include "transformer_core/kernels/gemv.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/kernels/sgemm.hpp"
#include "transformer_core/kernels/workspace.hpp"

namespace transformer_core::kernels {

// OpenBLAS (OpenMP build) sizes its team from omp_get_max_threads() unless it is called inside a
// parallel region. Every GEMM of ours runs single-threaded — our parallel_for splits the work — so
// outside a region the guard sets this thread's OpenMP count to 1 for the call. That keeps one
// threading runtime, no oversubscription, and results that do not depend on the thread count.
// (MKL runs in its sequential layer: nothing to do.)
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(!blas::table().openblas || omp_in_parallel() ? 0 : omp_get_max_threads()) {
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

// The CBLAS routines of each precision, row-major, under one name, through the BLAS chosen for the
// process (kernels/blas.hpp: OpenBLAS, or MKL on Intel CPUs).
namespace cblas {
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  blas::table().sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  blas::table().dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemv(CBLAS_TRANSPOSE t, int m, int n, float alpha, const float* a, int lda, const float* x, float beta,
                 float* y) {
  blas::table().sgemv(CblasRowMajor, t, m, n, alpha, a, lda, x, 1, beta, y, 1);
}
inline void gemv(CBLAS_TRANSPOSE t, int m, int n, double alpha, const double* a, int lda, const double* x,
                 double beta, double* y) {
  blas::table().dgemv(CblasRowMajor, t, m, n, alpha, a, lda, x, 1, beta, y, 1);
}
}  // namespace cblas

// C = alpha · op(A) · op(B) + beta · C in plain loops, for the products whose leading dimension does
// not fit CBLAS's 32-bit `int` (a row of over 2^31 values). Beta = 0 does not read C, as in BLAS.
template <class T>
inline void gemm_long_rows(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                           int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += (trans_a ? a[p * lda + i] : a[i * lda + p]) * (trans_b ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = (beta == T(0) ? T(0) : beta * c[i * ldc + j]) + alpha * sum;
    }
}

// C = alpha · op(A) · op(B) + beta · C on the calling thread (see SingleThreadedBlas), sizes that
// fit CBLAS's 32-bit `int`.
template <class T>
inline void gemm_blas(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                      const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
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

// C = alpha · op(A) · op(B) + beta · C on the calling thread (see SingleThreadedBlas). CBLAS takes
// 32-bit sizes: a product with more than kBlasMaxBlock rows, columns or inner steps runs as blocks
// of at most that many (the inner blocks added to C in order, the first with the given beta), and
// one whose leading dimension does not fit `int` runs in plain loops (gemm_long_rows). Products
// under 2^30 in every size, all of them in practice, are one BLAS call as before.
constexpr int64_t kBlasMaxBlock = int64_t{1} << 30;
template <class T>
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                 const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  SingleThreadedBlas single;
  constexpr int64_t int_max = std::numeric_limits<int>::max();
  if (lda > int_max || ldb > int_max || ldc > int_max)
    return gemm_long_rows(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (m <= kBlasMaxBlock && n <= kBlasMaxBlock && k <= kBlasMaxBlock)
    return gemm_blas(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  for (int64_t i = 0; i < m; i += kBlasMaxBlock)
    for (int64_t j = 0; j < n; j += kBlasMaxBlock)
      for (int64_t p = 0; p == 0 || p < k; p += kBlasMaxBlock) {  // k = 0 still scales C by beta
        const T* ab = trans_a ? a + p * lda + i : a + i * lda + p;  // op(A)[i.., p..]
        const T* bb = trans_b ? b + j * ldb + p : b + p * ldb + j;  // op(B)[p.., j..]
        gemm_blas(trans_a, trans_b, std::min(kBlasMaxBlock, m - i), std::min(kBlasMaxBlock, n - j),
                  std::min(kBlasMaxBlock, k - p), alpha, ab, lda, bb, ldb, p == 0 ? beta : T(1), c + i * ldc + j,
                  ldc);
      }
}

// C = op(A) · op(B), or C += op(A) · op(B) with accumulate, on the calling thread: fp32 through
// our kernels (sgemm.hpp), anything else (fp64, a CPU without AVX2) through BLAS. The tasks of a
// parallel region call it. Our kernels take op(B) in blocks of kGemmOnThreadDepth rows ×
// kGemmOnThreadCols columns, each packed into this thread's workspace, where all m rows meet it
// while it is in cache; the blocks of the inner dimension are added to C in order (the first one
// stored unless accumulate). A long inner dimension (a vocabulary: dX of an output layer) so
// stays in cache.
// A transposed A (a weight gradient Xᵀ · dY, attention's Pᵀ · dO) has its rows of op(A) down a
// column of a: each step of the inner dimension would jump a whole row of a (kilobytes, a new page
// every step). Its block of kGemmOnThreadDepth columns is first copied into groups of
// kGemmRowGroup rows, each group [depth, kGemmRowGroup] contiguous, which the micro-kernels then
// read in order. (Copying moves no arithmetic: the bits are those of the unpacked product.)
// Fewer rows than kGemmOnThreadMinRows (a decoding step's one query row, or the query heads of one
// key/value head under GQA) would pay the packing of op(B) for too little use of it: they stream B
// once instead, all their rows together (kernels/gemv.hpp), unless A is transposed (then BLAS).
constexpr int64_t kGemmOnThreadCols = 4 * sgemm::kPanel;
constexpr int64_t kGemmOnThreadDepth = 256;
constexpr int64_t kGemmOnThreadMinRows = 4;
constexpr int64_t kGemmRowGroup = 12;  // a multiple of both micro-kernels' rows (AVX-512 12, AVX2 6)

// out[g · depth + p · G + r] = a[p · lda + g + r]   (G = kGemmRowGroup; g = 0, G, 2G, …; r < G, g + r < m):
// rows g … g + G − 1 of op(A) = aᵀ, columns 0 … depth − 1, one group after another (the last group
// is shorter, its slots beyond m unwritten: out holds ⌈m / G⌉ · G · depth floats).
inline void pack_transposed_a(int64_t m, int64_t depth, const float* a, int64_t lda, float* out) {
  for (int64_t g = 0; g < m; g += kGemmRowGroup) {
    const int64_t rows = std::min(kGemmRowGroup, m - g);
    float* group = out + g * depth;
    for (int64_t p = 0; p < depth; ++p) std::copy_n(a + p * lda + g, rows, group + p * kGemmRowGroup);
  }
}

template <class T>
inline void gemm_on_thread(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                           const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if constexpr (std::is_same_v<T, float>) {
    if (k > 0 && m < kGemmOnThreadMinRows && !trans_a && sgemm::active() != nullptr) {
      if (trans_b)
        rows_times_transposed(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
      else
        rows_times(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
      return;
    }
    if (k > 0 && m >= kGemmOnThreadMinRows)
      if (const sgemm::Kernels* kern = sgemm::active()) {
        const int64_t rs_b = trans_b ? 1 : ldb, cs_b = trans_b ? ldb : 1;
        const int64_t depth = std::min(k, kGemmOnThreadDepth);
        float* packed = workspace<float>(Scratch::kGemmPackedTask, sgemm::packed_floats(depth, kGemmOnThreadCols));
        const int64_t groups = (m + kGemmRowGroup - 1) / kGemmRowGroup;
        float* packed_a = trans_a ? workspace<float>(Scratch::kGemmPackedA, groups * kGemmRowGroup * depth) : nullptr;
        for (int64_t p = 0; p < k; p += depth) {
          const int64_t kc = std::min(depth, k - p);
          if (trans_a) pack_transposed_a(m, kc, a + p * lda, lda, packed_a);
          for (int64_t j = 0; j < n; j += kGemmOnThreadCols) {
            const int64_t cols = std::min(kGemmOnThreadCols, n - j);
            kern->pack_b(kc, cols, b + p * rs_b + j * cs_b, rs_b, cs_b, packed);
            if (!trans_a) {
              kern->multiply(m, cols, kc, a + p, lda, 1, packed, c + j, ldc, accumulate || p > 0);
              continue;
            }
            for (int64_t g = 0; g < m; g += kGemmRowGroup)  // a group: A[g + r, q] at packed_a[g · kc + q · G + r]
              kern->multiply(std::min(kGemmRowGroup, m - g), cols, kc, packed_a + g * kc, 1, kGemmRowGroup, packed,
                             c + g * ldc + j, ldc, accumulate || p > 0);
          }
        }
        return;
      }
  }
  if (!accumulate)
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
  if (k > 0) gemm(trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, T(1), c, ldc);
}

}  // namespace transformer_core::kernels
