#include "transformer_core/ops/norm.hpp"

#include <cmath>
#include <stdexcept>

#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

namespace {
template <class T>
void check(int64_t rows, int64_t n, const NormParams<T>& p, const char* op) {
  require_nonnegative(rows, std::string(op) + ": rows");
  require_positive(n, std::string(op) + ": normalized size");
  if (!(p.eps >= T(0)))  // also refuses NaN
    throw std::invalid_argument(std::string(op) + ": eps: expected a value >= 0, got " + std::to_string(p.eps));
}

// One row of the norm p: y[n] = norm(x[n]).
template <class T>
inline void norm_row(const T* x, int64_t n, const NormParams<T>& p, T* y) {
  if (p.kind == NormKind::kLayerNorm) {
    kernels::layer_norm_row(x, n, p.weight, p.bias, p.eps, y);
  } else {
    kernels::rms_norm_row(x, n, p.weight, p.eps, y);
  }
}

// Rows per task so that a task holds ~16K elements: small inputs stay serial.
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }
}  // namespace

template <class T>
void norm(const T* x, int64_t rows, int64_t n, const NormParams<T>& p, T* y) {
  check(rows, n, p, "norm");
  kernels::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(x + r * n, n, p, y + r * n);
  });
}

template <class T>
void add_norm(const T* a, const T* b, int64_t rows, int64_t n, const NormParams<T>& p, T* y) {
  check(rows, n, p, "add_norm");
  kernels::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* yr = y + r * n;
      for (int64_t j = 0; j < n; ++j) yr[j] = a[r * n + j] + b[r * n + j];
      norm_row(yr, n, p, yr);
    }
  });
}

template <class T>
void residual_norm(T* h, const T* delta, int64_t rows, int64_t n, const NormParams<T>& p, T* y) {
  check(rows, n, p, "residual_norm");
  kernels::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* hr = h + r * n;
      for (int64_t j = 0; j < n; ++j) hr[j] += delta[r * n + j];
      norm_row(hr, n, p, y + r * n);
    }
  });
}

template <class T>
void add(const T* a, const T* b, int64_t count, T* y) {
  require_nonnegative(count, "add: size");
  kernels::parallel_for(0, count, 65536, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
  });
}

#define TC_INSTANTIATE(T)                                                                       \
  template void norm<T>(const T*, int64_t, int64_t, const NormParams<T>&, T*);                  \
  template void add_norm<T>(const T*, const T*, int64_t, int64_t, const NormParams<T>&, T*);    \
  template void residual_norm<T>(T*, const T*, int64_t, int64_t, const NormParams<T>&, T*);     \
  template void add<T>(const T*, const T*, int64_t, T*);
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::ops
