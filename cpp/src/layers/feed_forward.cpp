#include "transformer_core/layers/feed_forward.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/ops/functional.hpp"

namespace transformer_core::layers {

template <class T>
FeedForward<T>::FeedForward(int64_t d_model, int64_t dim_feedforward, Activation activation, bool bias)
    : d_model_(d_model), dim_feedforward_(dim_feedforward), activation_(activation), bias_(bias) {
  if (d_model < 1) throw std::invalid_argument("d_model must be >= 1, got " + std::to_string(d_model));
  if (dim_feedforward < 1)
    throw std::invalid_argument("dim_feedforward must be >= 1, got " + std::to_string(dim_feedforward));
  const size_t E = static_cast<size_t>(d_model), F = static_cast<size_t>(dim_feedforward);
  linear1_weight_ = xt::zeros<T>({F, E});
  linear2_weight_ = xt::zeros<T>({E, F});
  this->register_parameter("linear1.weight", {dim_feedforward, d_model}, linear1_weight_.data());
  if (bias) {
    linear1_bias_ = xt::zeros<T>({F});
    this->register_parameter("linear1.bias", {dim_feedforward}, linear1_bias_.data());
  }
  this->register_parameter("linear2.weight", {d_model, dim_feedforward}, linear2_weight_.data());
  if (bias) {
    linear2_bias_ = xt::zeros<T>({E});
    this->register_parameter("linear2.bias", {d_model}, linear2_bias_.data());
  }
}

template <class T>
void FeedForward<T>::forward(const T* x, int64_t rows, T* out) const {
  const int64_t F = dim_feedforward_;
  T* hidden = kernels::workspace<T, 0>(static_cast<size_t>(rows * F));  // [rows, F]
  // hidden = act(x · linear1ᵀ + b1): the bias and the activation applied per tile, in cache
  kernels::linear(x, rows, d_model_, linear1_weight_.data(), bias_ ? linear1_bias_.data() : nullptr, F, hidden,
                  /*w_in_out=*/false, activation_);
  kernels::linear(hidden, rows, F, linear2_weight_.data(), bias_ ? linear2_bias_.data() : nullptr, d_model_, out);
}

template class FeedForward<float>;
template class FeedForward<double>;

}  // namespace transformer_core::layers
