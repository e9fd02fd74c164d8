#include "transformer_core/layers/feed_forward.hpp"

#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/ops/activation.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::layers {

using kernels::Scratch;

template <class T>
FeedForward<T>::FeedForward(int64_t d_model, int64_t dim_feedforward, Activation activation, bool bias)
    : weights_check_({{2, d_model, dim_feedforward}}, sizeof(T), "d_model, dim_feedforward"),
      linear1_(d_model, dim_feedforward, bias),
      linear2_(dim_feedforward, d_model, bias), activation_(activation) {
  this->register_module("linear1", linear1_);
  this->register_module("linear2", linear2_);
}

template <class T>
void FeedForward<T>::forward(const T* x, int64_t rows, T* out) const {
  const int64_t F = dim_feedforward();
  const int64_t size = ops::checked_product({rows, F}, "x: rows × dim_feedforward");
  ops::require_allocatable(size, sizeof(T), "x: the hidden activations (rows, dim_feedforward)");
  T* hidden = kernels::workspace<T>(Scratch::kFfnHidden, static_cast<size_t>(size));  // [rows, F]
  linear1_.forward(x, rows, hidden, activation_);  // hidden = act(x · linear1ᵀ + b1), act fused per tile
  linear2_.forward(hidden, rows, out);
}

template <class T>
GatedFeedForward<T>::GatedFeedForward(int64_t d_model, int64_t dim_feedforward, Activation activation, bool bias)
    : weights_check_({{3, d_model, dim_feedforward}}, sizeof(T), "d_model, dim_feedforward"),
      gate_up_proj_(d_model, ops::checked_product({2, dim_feedforward}, "dim_feedforward"), bias),
      down_proj_(dim_feedforward, d_model, bias),
      activation_(activation) {
  const int64_t F = dim_feedforward;
  this->register_slice("gate_proj.weight", gate_up_proj_, "weight", 0, F);
  if (bias) this->register_slice("gate_proj.bias", gate_up_proj_, "bias", 0, F);
  this->register_slice("up_proj.weight", gate_up_proj_, "weight", F, F);
  if (bias) this->register_slice("up_proj.bias", gate_up_proj_, "bias", F, F);
  this->register_module("down_proj", down_proj_);
}

template <class T>
void GatedFeedForward<T>::forward(const T* x, int64_t rows, T* out) const {
  const int64_t F = dim_feedforward();
  const int64_t size = ops::checked_product({rows, 3, F}, "x: rows × dim_feedforward");
  ops::require_allocatable(size, sizeof(T), "x: the hidden activations (rows, 3 · dim_feedforward)");
  T* gate_up = kernels::workspace<T>(Scratch::kFfnHidden, static_cast<size_t>(size));  // [rows, 2F] | [rows, F]
  T* hidden = gate_up + rows * 2 * F;
  gate_up_proj_.forward(x, rows, gate_up);                        // [gate | up] = x · [Wg; Wu]ᵀ
  ops::gated_activation(gate_up, gate_up + F, rows, F, 2 * F, activation_, hidden);  // act(gate) · up
  down_proj_.forward(hidden, rows, out);
}

template class Mlp<float>;
template class Mlp<double>;
template class FeedForward<float>;
template class FeedForward<double>;
template class GatedFeedForward<float>;
template class GatedFeedForward<double>;

}  // namespace transformer_core::layers
