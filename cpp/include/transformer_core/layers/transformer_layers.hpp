// Transformer layers (Vaswani et al. 2017, §3.1; the tutorials' encoder and decoder layers).
//
// Encoder layer:
//   post-LN (norm_first = false, the paper, BERT):   x = norm1(x + SA(x));      x = norm2(x + FFN(x))
//   pre-LN  (norm_first = true, GPT-2):              x = x + SA(norm1(x));      x = x + FFN(norm2(x))
//
// Decoder layer (the encoder–decoder tutorial's decoder steps): masked self-attention,
// cross-attention over the encoder memory, feed-forward:
//   post-LN:  x = norm1(x + SA(x));  x = norm2(x + CA(x, mem));  x = norm3(x + FFN(x))
//   pre-LN:   x = x + SA(norm1(x));  x = x + CA(norm2(x), mem);  x = x + FFN(norm3(x))
//
// Batch-first: src/tgt [N, L, E], memory [N, S, E]. Inference only: dropout is the identity.
#pragma once

#include <cstdint>

#include "transformer_core/layers/feed_forward.hpp"
#include "transformer_core/layers/multihead_attention.hpp"
#include "transformer_core/layers/norm.hpp"

namespace transformer_core::layers {

template <class T>
class TransformerEncoderLayer : public Module<T> {
 public:
  // Parameters as torch.nn.TransformerEncoderLayer: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward, Activation activation,
                          T layer_norm_eps, bool norm_first, bool bias = true);

  // src [N, L, E] -> out [N, L, E]; out may alias src.
  void forward(const T* src, int64_t N, int64_t L, T* out, const AttentionMasks<T>& masks,
               AttentionPath path = AttentionPath::kAuto) const;

  // The same layer on the real tokens of a padded batch: x [count, E] -> out [count, E] (packed
  // rows; see PackedTokens). The masks must hide the padding keys (key_mask).
  void forward_packed(const T* x, const PackedTokens& tokens, T* out, const AttentionMasks<T>& masks,
                      AttentionPath path = AttentionPath::kAuto) const;

  const MultiheadAttention<T>& self_attn() const { return self_attn_; }
  const FeedForward<T>& feed_forward() const { return ff_; }
  int64_t d_model() const { return d_model_; }
  bool norm_first() const { return norm_first_; }

 private:
  // The layer over `rows` rows, with self-attention given as attend(in [rows, E], out [rows, E]).
  template <class Attend>
  void run(const T* src, int64_t rows, T* out, const Attend& attend) const;

  int64_t d_model_;
  bool norm_first_;
  ops::WeightsCheck weights_check_;  // before the sublayers allocate
  MultiheadAttention<T> self_attn_;
  FeedForward<T> ff_;
  LayerNorm<T> norm1_, norm2_;
};

template <class T>
class TransformerDecoderLayer : public Module<T> {
 public:
  // Parameters as torch.nn.TransformerDecoderLayer: self_attn.*, multihead_attn.*, linear1.*,
  // linear2.*, norm1.*, norm2.*, norm3.*
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward, Activation activation,
                          T layer_norm_eps, bool norm_first, bool bias = true);

  // tgt [N, T, E], memory [N, S, E] -> out [N, T, E]; out may alias tgt.
  // self_masks: masks of the self-attention (tgt_mask, tgt_key_mask, causal);
  // cross_masks: masks of the cross-attention (memory_mask, memory_key_mask).
  void forward(const T* tgt, int64_t N, int64_t Tq, const T* memory, int64_t S, T* out,
               const AttentionMasks<T>& self_masks, const AttentionMasks<T>& cross_masks,
               AttentionPath path = AttentionPath::kAuto) const;

  int64_t d_model() const { return d_model_; }

 private:
  int64_t d_model_;
  bool norm_first_;
  ops::WeightsCheck weights_check_;  // before the sublayers allocate
  MultiheadAttention<T> self_attn_, cross_attn_;
  FeedForward<T> ff_;
  LayerNorm<T> norm1_, norm2_, norm3_;
};

}  // namespace transformer_core::layers
