// Activations: the library's one table of names, and the element-wise / gated ops.
//
//   relu(x) = max(x, 0)                         gelu(x) = x · Φ(x)  (exact, erf)
//   gelu_tanh(x) = 0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³)))   (GPT-2's "gelu_new")
//   silu(x) = x · σ(x)  (Llama's SwiGLU gate)   tanh(x)  (BERT's pooler)
//   gated:  h = act(gate) · up                  (Shazeer 2020: SwiGLU, GeGLU)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transformer_core/kernels/elementwise.hpp"

namespace transformer_core::ops {

using kernels::Activation;

// The activation a name stands for: "relu", "gelu", "gelu_tanh" (= "gelu_new", "gelu_pytorch_tanh"),
// "silu" (= "swish"), "tanh". Throws std::invalid_argument("activation: expected one of ...").
Activation parse_activation(const std::string& name);

// Every accepted name, in the table's order.
std::vector<std::string> activation_names();

// x[i] = act(x[i]) for i < n, in place.
template <class T>
void activation(T* x, int64_t n, Activation act);

// y[i] = act(x[i]) for i < n (one pass: the input is not copied first).
template <class T>
void activation(const T* x, int64_t n, Activation act, T* y);

// out[r, j] = act(gate[r·ld + j]) · up[r·ld + j],   j < F      out: [rows, F]
// gate and up rows have stride ld: ld = 2F reads the packed [gate | up] output of one [rows, 2F]
// product (GatedFeedForward: up = gate + F), ld = F two separate [rows, F] arrays.
template <class T>
void gated_activation(const T* gate, const T* up, int64_t rows, int64_t F, int64_t ld, Activation act, T* out);

}  // namespace transformer_core::ops
