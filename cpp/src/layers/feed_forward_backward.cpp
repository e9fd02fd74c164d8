// The feed-forward networks' training forward and backward (feed_forward.hpp has the forwards):
//
//   FeedForward:       pre = x W1ᵀ + b1,  h = drop(act(pre)),  out = h W2ᵀ + b2
//     dh = dout · W2;   dpre = act'(pre) · drop(dh);   dx = dpre · W1          (+ the weights' sums)
//   GatedFeedForward:  [g | u] = x [Wg; Wu]ᵀ,  h = drop(act(g) · u),  out = h Wdᵀ
//     dh = dout · Wd;   dg = drop(dh) · u · act'(g),  du = drop(dh) · act(g);   dx = [dg | du] · [Wg; Wu]
//
// The training forward runs the forward's products, with the activation as a separate pass over the
// product's output (the forward fuses it into the product's tiles: the same function on the same
// values, so the same bits), and keeps pre (or [g | u]) and h.
#include <stdexcept>

#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/layers/feed_forward.hpp"
#include "transformer_core/ops/activation.hpp"
#include "transformer_core/ops/backward.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::layers {

using kernels::Scratch;

template <class T>
void Mlp<T>::forward_train(const T*, int64_t, T*, double, uint64_t) {
  throw std::logic_error("this feed-forward layer has no training forward");
}

template <class T>
void Mlp<T>::backward(const T*, T*) {
  throw std::logic_error("this feed-forward layer has no backward");
}

template <class T>
void FeedForward<T>::forward_train(const T* x, int64_t rows, T* out, double hidden_dropout, uint64_t seed) {
  const int64_t F = dim_feedforward();
  const size_t size = static_cast<size_t>(ops::checked_product({rows, F}, "FeedForward: rows × dim_feedforward"));
  Saved& s = saved_;
  s.valid = false;
  s.x = x, s.rows = rows, s.dropout = hidden_dropout, s.seed = seed;
  s.pre.resize(size);
  s.hidden.resize(size);
  linear1_.forward(x, rows, s.pre.data());                      // pre = x · linear1ᵀ + b1
  std::copy(s.pre.begin(), s.pre.end(), s.hidden.begin());
  ops::activation(s.hidden.data(), rows * F, activation_);      // hidden = act(pre)
  if (hidden_dropout > 0) ops::dropout(s.hidden.data(), s.hidden.data(), rows * F, hidden_dropout, seed);
  linear2_.forward(s.hidden.data(), rows, out);                 // out = hidden · linear2ᵀ + b2
  s.valid = true;
}

template <class T>
void FeedForward<T>::backward(const T* dout, T* dx) {
  Saved& s = saved_;
  if (!s.valid) throw std::logic_error("FeedForward: backward without a training forward");
  s.valid = false;
  const int64_t F = dim_feedforward(), rows = s.rows;
  T* dh = kernels::workspace<T>(Scratch::kGradFfnHidden, static_cast<size_t>(rows * F));  // [rows, F]
  linear2_.backward(s.hidden.data(), dout, rows, dh);                  // dh = dout · W2
  if (s.dropout > 0) ops::dropout(dh, dh, rows * F, s.dropout, s.seed);  // the same mask
  ops::activation_backward(s.pre.data(), dh, rows * F, activation_, dh);  // dpre = act'(pre) · dh
  linear1_.backward(s.x, dh, rows, dx);                                // dx = dpre · W1
}

template <class T>
void FeedForward<T>::release_activations() {
  saved_ = Saved{};
}

template <class T>
void GatedFeedForward<T>::forward_train(const T* x, int64_t rows, T* out, double hidden_dropout, uint64_t seed) {
  const int64_t F = dim_feedforward();
  const size_t size = static_cast<size_t>(ops::checked_product({rows, F}, "GatedFeedForward: rows × dim_feedforward"));
  Saved& s = saved_;
  s.valid = false;
  s.x = x, s.rows = rows, s.dropout = hidden_dropout, s.seed = seed;
  s.gate_up.resize(2 * size);
  s.hidden.resize(size);
  gate_up_proj_.forward(x, rows, s.gate_up.data());                                        // [gate | up]
  ops::gated_activation(s.gate_up.data(), s.gate_up.data() + F, rows, F, 2 * F, activation_, s.hidden.data());
  if (hidden_dropout > 0) ops::dropout(s.hidden.data(), s.hidden.data(), rows * F, hidden_dropout, seed);
  down_proj_.forward(s.hidden.data(), rows, out);
  s.valid = true;
}

template <class T>
void GatedFeedForward<T>::backward(const T* dout, T* dx) {
  Saved& s = saved_;
  if (!s.valid) throw std::logic_error("GatedFeedForward: backward without a training forward");
  s.valid = false;
  const int64_t F = dim_feedforward(), rows = s.rows;
  T* dh = kernels::workspace<T>(Scratch::kGradFfnHidden, static_cast<size_t>(rows * F));        // [rows, F]
  T* dgu = kernels::workspace<T>(Scratch::kGradFfnGateUp, static_cast<size_t>(rows * 2 * F));   // [rows, 2F]
  down_proj_.backward(s.hidden.data(), dout, rows, dh);                                          // dh = dout · Wd
  if (s.dropout > 0) ops::dropout(dh, dh, rows * F, s.dropout, s.seed);
  const T* gu = s.gate_up.data();
  ops::gated_activation_backward(gu, gu + F, rows, F, 2 * F, dh, activation_, dgu, dgu + F, 2 * F);
  gate_up_proj_.backward(s.x, dgu, rows, dx);                                                    // dx = [dg | du] · [Wg; Wu]
}

template <class T>
void GatedFeedForward<T>::release_activations() {
  saved_ = Saved{};
}

#define TC_INSTANTIATE(T)                                                                     \
  template void Mlp<T>::forward_train(const T*, int64_t, T*, double, uint64_t);               \
  template void Mlp<T>::backward(const T*, T*);                                               \
  template void FeedForward<T>::forward_train(const T*, int64_t, T*, double, uint64_t);       \
  template void FeedForward<T>::backward(const T*, T*);                                       \
  template void FeedForward<T>::release_activations();                                        \
  template void GatedFeedForward<T>::forward_train(const T*, int64_t, T*, double, uint64_t);  \
  template void GatedFeedForward<T>::backward(const T*, T*);                                  \
  template void GatedFeedForward<T>::release_activations();
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::layers
