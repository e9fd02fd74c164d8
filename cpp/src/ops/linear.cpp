#include "transformer_core/ops/linear.hpp"

#include "transformer_core/kernels/linear.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

template <class T>
void linear(const T* x, int64_t rows, int64_t in, const T* weight, const T* bias, int64_t out, T* y, Activation act) {
  require_nonnegative(rows, "linear: rows");
  require_nonnegative(in, "linear: in_features");
  require_nonnegative(out, "linear: out_features");
  kernels::linear(x, rows, in, weight, bias, out, y, act);
}

template <class T>
void add_bias(T* y, int64_t rows, int64_t n, const T* bias) {
  require_nonnegative(rows, "add_bias: rows");
  require_nonnegative(n, "add_bias: size");
  kernels::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) kernels::add_row(y + r * n, bias, n);
  });
}

template void add_bias<float>(float*, int64_t, int64_t, const float*);
template void add_bias<double>(double*, int64_t, int64_t, const double*);
template void linear<float>(const float*, int64_t, int64_t, const float*, const float*, int64_t, float*, Activation);
template void linear<double>(const double*, int64_t, int64_t, const double*, const double*, int64_t, double*,
                             Activation);

}  // namespace transformer_core::ops
