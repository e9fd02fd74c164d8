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

template void linear<float>(const float*, int64_t, int64_t, const float*, const float*, int64_t, float*, Activation);
template void linear<double>(const double*, int64_t, int64_t, const double*, const double*, int64_t, double*,
                             Activation);

}  // namespace transformer_core::ops
