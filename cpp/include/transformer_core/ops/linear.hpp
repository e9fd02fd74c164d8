// The affine map of nn.Linear, with an optional activation fused on the output tiles:
//
//   y[rows, out] = act(x[rows, in] · weightᵀ + bias)      weight: [out, in]   bias: [out] or nullptr
#pragma once

#include <cstdint>

#include "transformer_core/ops/activation.hpp"

namespace transformer_core::ops {

// x, y must not alias. Throws std::invalid_argument for negative sizes.
template <class T>
void linear(const T* x, int64_t rows, int64_t in, const T* weight, const T* bias, int64_t out, T* y,
            Activation act = Activation::kNone);

// y[r, j] += bias[j] for r < rows, j < n.
template <class T>
void add_bias(T* y, int64_t rows, int64_t n, const T* bias);

}  // namespace transformer_core::ops
