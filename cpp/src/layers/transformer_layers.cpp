#include "transformer_core/layers/transformer_layers.hpp"

#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::layers {

using kernels::Scratch;

namespace {
template <class T>
AttentionInputs<T> inputs_of(const AttentionMasks<T>& masks, AttentionPath path) {
  AttentionInputs<T> in;
  in.masks = masks;
  in.path = path;
  return in;
}
}  // namespace

template <class T>
TransformerEncoderLayer<T>::TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                    Activation activation, T layer_norm_eps, bool norm_first,
                                                    bool bias)
    : d_model_(d_model),
      norm_first_(norm_first),
      weights_check_({{4, d_model, d_model}, {2, d_model, dim_feedforward}}, sizeof(T), "d_model, dim_feedforward"),
      self_attn_(d_model, nhead, bias),
      ff_(d_model, dim_feedforward, activation, bias),
      norm1_(d_model, layer_norm_eps, bias),
      norm2_(d_model, layer_norm_eps, bias) {
  this->register_module("self_attn", self_attn_);
  this->register_module("", ff_);  // linear1.* / linear2.*: torch's names at the top level of the layer
  this->register_module("norm1", norm1_);
  this->register_module("norm2", norm2_);
}

template <class T>
template <class Attend>
void TransformerEncoderLayer<T>::run(const T* src, int64_t rows, T* out, const Attend& attend) const {
  const size_t size = static_cast<size_t>(rows * d_model_);
  T* a = kernels::workspace<T>(Scratch::kLayerA, size);
  T* b = kernels::workspace<T>(Scratch::kLayerB, size);
  if (norm_first_) {
    T* x = kernels::workspace<T>(Scratch::kLayerX, size);
    norm1_.forward(src, rows, a);                                   // a = norm1(src)
    attend(a, b);                                                   // b = SA(a)
    ops::add(src, b, rows * d_model_, x);                           // x = src + SA(a)
    norm2_.forward(x, rows, a);                                     // a = norm2(x)
    ff_.forward(a, rows, b);                                        // b = FFN(a)
    ops::add(x, b, rows * d_model_, out);                           // out = x + FFN(a)
  } else {
    attend(src, a);                                                 // a = SA(src)
    norm1_.forward_add(src, a, rows, a);                            // a = norm1(src + SA(src))
    ff_.forward(a, rows, b);                                        // b = FFN(a)
    norm2_.forward_add(a, b, rows, out);                            // out = norm2(a + FFN(a))
  }
}

template <class T>
void TransformerEncoderLayer<T>::forward(const T* src, int64_t N, int64_t L, T* out, const AttentionMasks<T>& masks,
                                         AttentionPath path) const {
  const AttentionInputs<T> in = inputs_of(masks, path);
  run(src, N * L, out, [&](const T* x, T* sa) { self_attn_.forward(x, x, x, N, L, L, sa, in); });
}

template <class T>
void TransformerEncoderLayer<T>::forward_packed(const T* x, const PackedTokens& tokens, T* out,
                                                AttentionPath path) const {
  run(x, tokens.count, out, [&](const T* in, T* sa) { self_attn_.forward_packed(in, tokens, sa, path); });
}

template <class T>
TransformerDecoderLayer<T>::TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                    Activation activation, T layer_norm_eps, bool norm_first,
                                                    bool bias)
    : d_model_(d_model),
      norm_first_(norm_first),
      weights_check_({{8, d_model, d_model}, {2, d_model, dim_feedforward}}, sizeof(T), "d_model, dim_feedforward"),
      self_attn_(d_model, nhead, bias),
      cross_attn_(d_model, nhead, bias),
      ff_(d_model, dim_feedforward, activation, bias),
      norm1_(d_model, layer_norm_eps, bias),
      norm2_(d_model, layer_norm_eps, bias),
      norm3_(d_model, layer_norm_eps, bias) {
  this->register_module("self_attn", self_attn_);
  this->register_module("multihead_attn", cross_attn_);
  this->register_module("", ff_);
  this->register_module("norm1", norm1_);
  this->register_module("norm2", norm2_);
  this->register_module("norm3", norm3_);
}

template <class T>
void TransformerDecoderLayer<T>::forward(const T* tgt, int64_t N, int64_t Tq, const T* memory, int64_t S, T* out,
                                         const AttentionMasks<T>& self_masks, const AttentionMasks<T>& cross_masks,
                                         AttentionPath path) const {
  const int64_t rows = N * Tq, E = d_model_;
  const size_t size = static_cast<size_t>(rows * E);
  T* x = kernels::workspace<T>(Scratch::kLayerX, size);
  T* a = kernels::workspace<T>(Scratch::kLayerA, size);
  T* b = kernels::workspace<T>(Scratch::kLayerB, size);
  const AttentionInputs<T> self_in = inputs_of(self_masks, path), cross_in = inputs_of(cross_masks, path);
  if (norm_first_) {
    norm1_.forward(tgt, rows, a);                                             // a = norm1(tgt)
    self_attn_.forward(a, a, a, N, Tq, Tq, b, self_in);                       // b = SA(a)
    ops::add(tgt, b, rows * E, x);                                            // x = tgt + SA(a)
    norm2_.forward(x, rows, a);                                               // a = norm2(x)
    cross_attn_.forward(a, memory, memory, N, Tq, S, b, cross_in);            // b = CA(a, memory)
    ops::add(x, b, rows * E, x);                                              // x = x + CA(a, memory)
    norm3_.forward(x, rows, a);                                               // a = norm3(x)
    ff_.forward(a, rows, b);                                                  // b = FFN(a)
    ops::add(x, b, rows * E, out);                                            // out = x + FFN(a)
  } else {
    self_attn_.forward(tgt, tgt, tgt, N, Tq, Tq, a, self_in);                 // a = SA(tgt)
    norm1_.forward_add(tgt, a, rows, x);                                      // x = norm1(tgt + SA(tgt))
    cross_attn_.forward(x, memory, memory, N, Tq, S, a, cross_in);            // a = CA(x, memory)
    norm2_.forward_add(x, a, rows, x);                                        // x = norm2(x + CA(x, memory))
    ff_.forward(x, rows, b);                                                  // b = FFN(x)
    norm3_.forward_add(x, b, rows, out);                                      // out = norm3(x + FFN(x))
  }
}

template class TransformerEncoderLayer<float>;
template class TransformerEncoderLayer<double>;
template class TransformerDecoderLayer<float>;
template class TransformerDecoderLayer<double>;

}  // namespace transformer_core::layers
