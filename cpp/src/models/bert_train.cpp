// BERT fine-tuning: the training forward on the padded batch and the backward pass.
//
//   x_0 = drop(LayerNorm(word + position + token_type))     x_{i+1} = post-LN encoder layer_i(x_i)
//   last_hidden_state = x_n with padding rows set to zero      pooler = tanh(dense(cls))
//
// cls = x_n[:, 0], position 0's computed state even where it is padding (left padding, a mask with a
// hole there), as Hugging Face pools it and the eval forward does: the padded batch computes every
// query, so the padding query's state is at hand, and the backward carries the pooler's gradient
// into it. A sequence of padding only has no state: cls = 0 (pooler = tanh(bias)), as in eval mode.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "transformer_core/models/bert.hpp"
#include "transformer_core/ops/activation.hpp"
#include "transformer_core/ops/backward.hpp"
#include "transformer_core/ops/checks.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::models {

using ops::to_string;

namespace {

// Whether sequence b's pooler input is its computed position-0 state (x_n[b, 0]): every token real,
// or position 0 real, or padding there but some token of the sequence real. Not for a sequence of
// padding only (its position 0 sees no key): its cls is zeros, as in the eval forward.
bool pools_state(const std::vector<uint8_t>& mask, int64_t b, int64_t L) {
  if (mask.empty()) return true;
  const auto* row = mask.data() + b * L;
  return std::any_of(row, row + L, [](uint8_t m) { return m != 0; });
}

}  // namespace

template <class T>
void BertModel<T>::forward_train(const int64_t* input_ids, const uint8_t* attention_mask, const int64_t* token_type_ids,
                                 int64_t N, int64_t L, T* hidden, T* pooled, const layers::Dropout& drop) {
  const int64_t H = config_.hidden_size, rows = N * L;
  const int64_t n = ops::checked_product({rows, H}, "input_ids");
  TrainState& s = train_;
  s.valid = false;
  if (L > config_.max_position_embeddings)
    throw std::invalid_argument("input_ids: sequence length " + to_string(L) + " exceeds max_position_embeddings (" +
                                to_string(config_.max_position_embeddings) + ")");
  s.N = N, s.L = L;
  s.ids.assign(input_ids, input_ids + rows);
  s.positions.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) s.positions[static_cast<size_t>(r)] = r % L;
  if (token_type_ids != nullptr) s.types.assign(token_type_ids, token_type_ids + rows);
  else s.types.clear();
  const int64_t* tt = token_type_ids != nullptr ? s.types.data() : nullptr;
  embeddings_.check(s.ids.data(), s.positions.data(), tt, rows);
  if (attention_mask != nullptr) s.mask.assign(attention_mask, attention_mask + rows);
  else s.mask.clear();
  s.stream.resize(layers_.size() + 1);
  for (auto& x : s.stream) x.resize(static_cast<size_t>(n));

  layers::AttentionMasks<T> masks;
  if (!s.mask.empty()) {
    masks.key_mask = s.mask.data();
    masks.key_mask_stride_n = L;
    masks.key_mask_stride_s = 1;
  }
  embeddings_.forward_train(s.ids.data(), s.positions.data(), tt, rows, s.stream[0].data(), drop.p,
                            drop.site(1));
  layers::Dropout layer_drop = drop;
  layer_drop.ffn_p = 0;  // BERT has no dropout between the feed-forward's two products
  for (size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->forward_train(s.stream[i].data(), N, L, s.stream[i + 1].data(), masks, ops::AttentionPath::kAuto,
                              layer_drop.child(i));
  std::copy(s.stream.back().begin(), s.stream.back().end(), hidden);
  for (int64_t r = 0; r < rows && !s.mask.empty(); ++r)
    if (!s.mask[static_cast<size_t>(r)]) std::fill(hidden + r * H, hidden + (r + 1) * H, T(0));
  if (pooler_ != nullptr) {
    // pooler_output [N, H] = tanh(cls · Wᵀ + b), the product and tanh as two passes; cls = x_n[:, 0]
    // (zeros for a sequence of padding only)
    s.cls.assign(static_cast<size_t>(N * H), T(0));
    s.pooler_pre.resize(static_cast<size_t>(N * H));
    const T* x_n = s.stream.back().data();
    for (int64_t b = 0; b < N; ++b)
      if (pools_state(s.mask, b, L)) std::copy(x_n + b * L * H, x_n + b * L * H + H, s.cls.data() + b * H);
    pooler_->forward(s.cls.data(), N, s.pooler_pre.data());
    if (pooled != nullptr) {
      std::copy(s.pooler_pre.begin(), s.pooler_pre.end(), pooled);
      ops::activation(pooled, N * H, Activation::kTanh);
    }
  }
  s.valid = true;
}

template <class T>
void BertModel<T>::backward(const T* d_hidden, const T* d_pooled) {
  TrainState& s = train_;
  if (!s.valid) throw std::logic_error("backward: no training forward to differentiate (call the model in training "
                                       "mode first; each forward has one backward)");
  s.valid = false;
  const int64_t H = config_.hidden_size, N = s.N, L = s.L, rows = N * L, n = rows * H;
  s.grad_a.assign(d_hidden, d_hidden + n);
  s.grad_b.resize(static_cast<size_t>(n));
  T* g = s.grad_a.data();
  T* g_next = s.grad_b.data();
  // padding rows of last_hidden_state are constant zeros (the pooler's gradient may reach one below)
  for (int64_t r = 0; r < rows && !s.mask.empty(); ++r)
    if (!s.mask[static_cast<size_t>(r)]) std::fill(g + r * H, g + (r + 1) * H, T(0));
  if (d_pooled != nullptr && pooler_ != nullptr) {
    std::vector<T> dpre(static_cast<size_t>(N * H)), dcls(static_cast<size_t>(N * H));
    ops::activation_backward(s.pooler_pre.data(), d_pooled, N * H, Activation::kTanh, dpre.data());
    pooler_->backward(s.cls.data(), dpre.data(), N, dcls.data());
    // d cls goes into x_n[b, 0], a padding query's state too (the layers' backward carries it through
    // that query's attention over the real keys); a sequence of padding only pooled zeros: nothing
    for (int64_t b = 0; b < N; ++b) {
      if (!pools_state(s.mask, b, L)) continue;
      for (int64_t j = 0; j < H; ++j) g[b * L * H + j] += dcls[static_cast<size_t>(b * H + j)];
    }
  }
  for (size_t i = layers_.size(); i-- > 0;) {
    layers_[i]->backward(g, g_next);
    std::swap(g, g_next);
  }
  embeddings_.backward(g);
}

template <class T>
void BertModel<T>::release_activations() {
  train_ = TrainState{};
  embeddings_.release_activations();
  for (auto& l : layers_) l->release_activations();
}

#define TC_INSTANTIATE(T)                                                                                          \
  template void BertModel<T>::forward_train(const int64_t*, const uint8_t*, const int64_t*, int64_t, int64_t, T*, T*, \
                                            const layers::Dropout&);                                               \
  template void BertModel<T>::backward(const T*, const T*);                                                        \
  template void BertModel<T>::release_activations();
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::models
