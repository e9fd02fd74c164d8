#include "transformer_core/ops/functional.hpp"

#include <stdexcept>
#include <string>

#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::ops {

namespace {
void check_nonnegative(int64_t v, const char* what) {
  if (v < 0) throw std::invalid_argument(std::string(what) + " must be >= 0, got " + std::to_string(v));
}
// Rows per task so that a task holds ~16K elements: small inputs stay serial.
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }
}  // namespace

template <class T>
void linear(const T* x, int64_t rows, int64_t in, const T* weight, const T* bias, int64_t out, T* y) {
  check_nonnegative(rows, "linear: rows");
  check_nonnegative(in, "linear: in_features");
  check_nonnegative(out, "linear: out_features");
  kernels::linear(x, rows, in, weight, bias, out, y);  // one BLAS call, threaded by OpenBLAS
}

template <class T>
void softmax(T* x, int64_t rows, int64_t n) {
  check_nonnegative(rows, "softmax: rows");
  check_nonnegative(n, "softmax: n");
  kernels::parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) kernels::softmax_row(x + r * n, n);
  });
}

template <class T>
void layer_norm(const T* x, int64_t rows, int64_t n, const T* weight, const T* bias, T eps, T* y) {
  check_nonnegative(rows, "layer_norm: rows");
  if (n <= 0) throw std::invalid_argument("layer_norm: normalized size must be >= 1, got " + std::to_string(n));
  kernels::parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) kernels::layer_norm_row(x + r * n, n, weight, bias, eps, y + r * n);
  });
}

template <class T>
void activation(T* x, int64_t n, Activation act) {
  kernels::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) { kernels::activate(x + b, e - b, act); });
}

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh" || name == "gelu_new" || name == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  throw std::invalid_argument("activation: expected 'relu', 'gelu' or 'gelu_tanh', got '" + name + "'");
}

#define TC_INSTANTIATE(T)                                                                        \
  template void linear<T>(const T*, int64_t, int64_t, const T*, const T*, int64_t, T*);          \
  template void softmax<T>(T*, int64_t, int64_t);                                                \
  template void layer_norm<T>(const T*, int64_t, int64_t, const T*, const T*, T, T*);            \
  template void activation<T>(T*, int64_t, Activation);
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::ops
