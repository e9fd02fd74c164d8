// nn.Linear:  y = act(x · weightᵀ + bias)      x: [rows, in]   weight: [out, in]   bias: [out]
#pragma once

#include <cstdint>
#include <xtensor/xtensor.hpp>

#include "transformer_core/layers/module.hpp"
#include "transformer_core/ops/activation.hpp"

namespace transformer_core::layers {

using ops::Activation;

template <class T>
class Linear : public Module<T> {
 public:
  // Parameters: weight [out, in], bias [out] (if bias).
  Linear(int64_t in_features, int64_t out_features, bool bias = true);

  // x [rows, in] -> y [rows, out], act applied in the same pass; y must not alias x.
  void forward(const T* x, int64_t rows, T* y, Activation act = Activation::kNone) const;
  // Output features [out_begin, out_begin + out_count) only: y [rows, out_count] (e.g. the q, k or v
  // rows of a packed attention projection).
  void forward_rows(const T* x, int64_t rows, T* y, int64_t out_begin, int64_t out_count,
                    Activation act = Activation::kNone) const;

  // ---- training (linear_backward.cpp; llm.c's matmul_backward) ----
  // Given the forward's input x [rows, in] and dy [rows, out], the gradient of its output (before the
  // activation, when one was fused):  dx [rows, in] = dy · W (overwritten; nullptr: not wanted),
  // weight.grad += dyᵀ · x,  bias.grad += Σ_rows dy.
  void backward(const T* x, const T* dy, int64_t rows, T* dx);
  // The same for output features [out_begin, out_begin + out_count) only (forward_rows): dy [rows, out_count].
  void backward_rows(const T* x, const T* dy, int64_t rows, T* dx, int64_t out_begin, int64_t out_count);
  // weight [out, in]: an output layer fused with its loss reads it.
  const T* weight() const { return weight_.data(); }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return has_bias_; }

 private:
  int64_t in_, out_;
  bool has_bias_;
  xt::xtensor<T, 2> weight_;
  xt::xtensor<T, 1> bias_;
};

}  // namespace transformer_core::layers
