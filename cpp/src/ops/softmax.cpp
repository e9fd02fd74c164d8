#include "transformer_core/ops/softmax.hpp"

#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

template <class T>
void softmax(const T* x, int64_t outer, int64_t n, int64_t inner, T* y) {
  require_nonnegative(outer, "softmax: outer size");
  require_nonnegative(n, "softmax: size");
  require_nonnegative(inner, "softmax: inner size");
  if (inner == 1) {  // the last dim: one row at a time
    kernels::parallel_for(0, outer, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) kernels::softmax_row(x + r * n, n, y + r * n);
    });
    return;
  }
  // another dim: blocks of kSoftmaxColumns columns of each [n, inner] slab (the tasks are set by
  // the shape alone, so the result does not depend on the thread count)
  const int64_t blocks = (inner + kernels::kSoftmaxColumns - 1) / kernels::kSoftmaxColumns;
  const int64_t per_task = std::max<int64_t>(1, 16384 / std::max<int64_t>(n * kernels::kSoftmaxColumns, 1));
  kernels::parallel_for(0, outer * blocks, per_task, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / blocks, c0 = (t % blocks) * kernels::kSoftmaxColumns;
      const int64_t offset = o * n * inner + c0;
      kernels::softmax_columns(x + offset, n, inner, std::min(kernels::kSoftmaxColumns, inner - c0), y + offset);
    }
  });
}

template void softmax<float>(const float*, int64_t, int64_t, int64_t, float*);
template void softmax<double>(const double*, int64_t, int64_t, int64_t, double*);

}  // namespace transformer_core::ops
