// nn.Linear:  y = act(x · weightᵀ + bias)      x: [rows, in]   weight: [out, in]   bias: [out]
//
// The weight is fp32/fp64 (an xtensor), or — Linear<float> only — a QuantizedMatrix
// (layers/quantized_matrix.hpp: int8 per output channel, or GGUF blocks read in place) that replaces
// and frees it; the bias stays fp32. Every layer that holds a Linear (attention projections,
// feed-forward, LM heads, poolers) then computes quantized without knowing it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <xtensor/xtensor.hpp>

#include "transformer_core/layers/module.hpp"
#include "transformer_core/layers/quantized_matrix.hpp"
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

  // Quantized weights (Linear<float> only; Linear<double> throws std::invalid_argument):
  // quantize_int8() quantizes the current weight per output channel; set_quantized() installs a
  // matrix of [out, in] (GGUF blocks, say). Either frees the fp32 weight; it is then read back
  // dequantized (state_dict) and can no longer be written.
  void quantize_int8();
  void set_quantized(std::unique_ptr<QuantizedMatrix> weight);
  // The quantized weight, or nullptr while it is fp32/fp64.
  const QuantizedMatrix* quantized_weight() const { return quantized_.get(); }
  QuantizedMatrix* quantized_weight() { return quantized_.get(); }

  bool quantized(const std::string& name) const override;
  std::string storage(const std::string& name, int64_t row0 = 0, int64_t rows = -1) const override;
  void dequantize_rows(const std::string& name, int64_t row0, int64_t rows, T* out) const override;

 private:
  int64_t in_, out_;
  bool has_bias_;
  xt::xtensor<T, 2> weight_;
  xt::xtensor<T, 1> bias_;
  std::unique_ptr<QuantizedMatrix> quantized_;  // non-null: replaces weight_ (then empty)
};

}  // namespace transformer_core::layers
