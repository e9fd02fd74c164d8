// softmax over the middle dim of x viewed as [outer, n, inner], into y of that shape (y may be x:
// in place); inner = 1 is the last dim:
//   p_j = exp(x_j - max x) / Σ_k exp(x_k - max x)
// A slice that is all -inf (fully masked) becomes zeros, not NaN; NaN in a slice gives NaN.
#pragma once

#include <cstdint>

namespace transformer_core::ops {

template <class T>
void softmax(const T* x, int64_t outer, int64_t n, int64_t inner, T* y);

}  // namespace transformer_core::ops
