// Functional ops: check the sizes, then run the kernel over all rows in parallel.
// Every op takes raw, C-contiguous buffers (the bindings adapt numpy arrays without copying) and
// throws std::invalid_argument, which the bindings turn into Python's ValueError.
#pragma once

#include <cstdint>
#include <string>

#include "transformer_core/kernels/elementwise.hpp"

namespace transformer_core::ops {

using kernels::Activation;

// y[rows, out] = x[rows, in] · weightᵀ + bias      weight: [out, in]   bias: [out] or nullptr
template <class T>
void linear(const T* x, int64_t rows, int64_t in, const T* weight, const T* bias, int64_t out, T* y);

// In place, over the last dim of x viewed as [rows, n].
template <class T>
void softmax(T* x, int64_t rows, int64_t n);

// y[rows, n] = LayerNorm(x[rows, n]) · weight + bias   (weight/bias [n] or nullptr; x may be y)
template <class T>
void layer_norm(const T* x, int64_t rows, int64_t n, const T* weight, const T* bias, T eps, T* y);

// In place, element-wise over n values.
template <class T>
void activation(T* x, int64_t n, Activation act);

// Parses "relu", "gelu", "gelu_new"/"gelu_pytorch_tanh"/"gelu_tanh" (the tanh form); throws otherwise.
Activation parse_activation(const std::string& name);

}  // namespace transformer_core::ops
