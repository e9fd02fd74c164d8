// Position-wise feed-forward network (Vaswani et al. 2017, eq. 2; seed 001 "The Feed-Forward Layer"):
//
//   FFN(x) = linear2(act(linear1(x)))      act = ReLU (the paper) or GELU (BERT, GPT-2)
//
// x [rows, d_model] -> [rows, d_model], hidden [rows, dim_feedforward].
#pragma once

#include <cstdint>
#include <xtensor/xtensor.hpp>

#include "transformer_core/kernels/elementwise.hpp"
#include "transformer_core/layers/module.hpp"

namespace transformer_core::layers {

using kernels::Activation;

template <class T>
class FeedForward : public Module<T> {
 public:
  // Parameters: linear1.weight [F, E], linear1.bias [F], linear2.weight [E, F], linear2.bias [E].
  FeedForward(int64_t d_model, int64_t dim_feedforward, Activation activation, bool bias = true);

  // x [rows, d_model] -> out [rows, d_model]; out must not alias x.
  void forward(const T* x, int64_t rows, T* out) const;

  int64_t d_model() const { return d_model_; }
  int64_t dim_feedforward() const { return dim_feedforward_; }
  Activation activation() const { return activation_; }

 private:
  int64_t d_model_, dim_feedforward_;
  Activation activation_;
  bool bias_;
  xt::xtensor<T, 2> linear1_weight_, linear2_weight_;
  xt::xtensor<T, 1> linear1_bias_, linear2_bias_;
};

}  // namespace transformer_core::layers
