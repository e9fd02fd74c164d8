#include "transformer_core/ops/softmax.hpp"

#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

template <class T>
void softmax(T* x, int64_t rows, int64_t n) {
  require_nonnegative(rows, "softmax: rows");
  require_nonnegative(n, "softmax: size");
  kernels::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) kernels::softmax_row(x + r * n, n);
  });
}

template void softmax<float>(float*, int64_t, int64_t);
template void softmax<double>(double*, int64_t, int64_t);

}  // namespace transformer_core::ops
