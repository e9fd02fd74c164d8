// softmax over the last dim of x viewed as [rows, n], in place:
//   p_j = exp(x_j - max x) / Σ_k exp(x_k - max x)
// A row that is all -inf (fully masked) becomes zeros, not NaN; NaN in a row gives NaN.
#pragma once

#include <cstdint>

namespace transformer_core::ops {

template <class T>
void softmax(T* x, int64_t rows, int64_t n);

}  // namespace transformer_core::ops
