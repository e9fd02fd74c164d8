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
// Batch-first: src/tgt [N, L, E], memory [N, S, E]. The inference forward has no dropout; the
// training forward (forward_train) applies torch's dropout1/2/3 on the residual branches and the
// feed-forward's hidden dropout, with masks from a seed (Dropout, module.hpp). Attention-probability
// dropout is not implemented.
#pragma once

#include <cstdint>
#include <vector>

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
  // rows; see PackedTokens), each token attending to its own sequence's tokens.
  void forward_packed(const T* x, const PackedTokens& tokens, T* out, AttentionPath path = AttentionPath::kAuto) const;

  const MultiheadAttention<T>& self_attn() const { return self_attn_; }
  const FeedForward<T>& feed_forward() const { return ff_; }
  int64_t d_model() const { return d_model_; }
  bool norm_first() const { return norm_first_; }

  // ---- training (transformer_layers_backward.cpp) ----
  // As forward (the same output, bitwise, when drop.p = drop.ffn_p = 0), keeping what backward needs
  // and POINTERS to src and the masks (kept alive by the caller). out must not alias src.
  void forward_train(const T* src, int64_t N, int64_t L, T* out, const AttentionMasks<T>& masks,
                     AttentionPath path = AttentionPath::kAuto, const Dropout& drop = {});
  // dout [N, L, E] -> dsrc [N, L, E] (overwritten; must not alias dout), parameters' gradients added.
  void backward(const T* dout, T* dsrc);
  void release_activations() override;

 private:
  struct Saved {
    const T* src = nullptr;
    int64_t N = 0, L = 0;
    // post-LN: s1 = src + SA(src), x = norm1(s1), s2 = x + FFN(x)
    // pre-LN:  n1 = norm1(src), x = src + SA(n1), n2 = norm2(x)
    std::vector<T> b1, b2, b3;
    Dropout drop;
    bool valid = false;
  } saved_;

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

  // ---- training (transformer_layers_backward.cpp) ----
  // As forward (the same output, bitwise, without dropout), keeping what backward needs and POINTERS
  // to tgt, memory and the masks (kept alive by the caller). out must not alias tgt.
  void forward_train(const T* tgt, int64_t N, int64_t Tq, const T* memory, int64_t S, T* out,
                     const AttentionMasks<T>& self_masks, const AttentionMasks<T>& cross_masks,
                     AttentionPath path = AttentionPath::kAuto, const Dropout& drop = {});
  // dout [N, T, E] -> dtgt [N, T, E] (overwritten; must not alias dout); dmemory [N, S, E] is ADDED
  // into (a decoder stack sums the memory's gradient over its layers; nullptr: not wanted).
  void backward(const T* dout, T* dtgt, T* dmemory);
  void release_activations() override;

 private:
  int64_t d_model_;
  bool norm_first_;
  ops::WeightsCheck weights_check_;  // before the sublayers allocate
  MultiheadAttention<T> self_attn_, cross_attn_;
  FeedForward<T> ff_;
  LayerNorm<T> norm1_, norm2_, norm3_;
  struct Saved {
    const T *tgt = nullptr, *memory = nullptr;
    int64_t N = 0, T_ = 0, S = 0;
    // post-LN: s1 = tgt + SA, x1 = norm1(s1), s2 = x1 + CA, x2 = norm2(s2), s3 = x2 + FFN
    // pre-LN:  n1 = norm1(tgt), x1 = tgt + SA, n2 = norm2(x1), x2 = x1 + CA, n3 = norm3(x2)
    std::vector<T> b1, b2, b3, b4, b5;
    Dropout drop;
    bool valid = false;
  } saved_;
};

}  // namespace transformer_core::layers
