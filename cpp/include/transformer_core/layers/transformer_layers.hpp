// Transformer encoder layer (Vaswani et al. 2017, §3.1; seed 001 "Layer Normalization", seed 002):
//
//   post-LN (norm_first = false, the paper, BERT):   x = LN1(x + SA(x));      x = LN2(x + FFN(x))
//   pre-LN  (norm_first = true, GPT-2, seed 001):    x = x + SA(LN1(x));      x = x + FFN(LN2(x))
//
// Batch-first: src [N, L, E] -> out [N, L, E]. Inference only: dropout is the identity.
#pragma once

#include <cstdint>
#include <xtensor/xtensor.hpp>

#include "transformer_core/layers/feed_forward.hpp"
#include "transformer_core/layers/multihead_attention.hpp"

namespace transformer_core::layers {

template <class T>
class TransformerEncoderLayer : public Module<T> {
 public:
  // Parameters as torch.nn.TransformerEncoderLayer: self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward, Activation activation,
                          T layer_norm_eps, bool norm_first, bool bias = true);

  // src [N, L, E] -> out [N, L, E]; out may alias src.
  void forward(const T* src, int64_t N, int64_t L, T* out, const MaskArgs<T>& masks,
               AttentionPath path = AttentionPath::kAuto) const;

  const MultiheadAttention<T>& self_attn() const { return self_attn_; }
  const FeedForward<T>& feed_forward() const { return ff_; }
  int64_t d_model() const { return d_model_; }
  bool norm_first() const { return norm_first_; }
  T layer_norm_eps() const { return eps_; }

 private:
  int64_t d_model_;
  T eps_;
  bool norm_first_, bias_;
  MultiheadAttention<T> self_attn_;
  FeedForward<T> ff_;
  xt::xtensor<T, 1> norm1_weight_, norm1_bias_, norm2_weight_, norm2_bias_;
};

}  // namespace transformer_core::layers
