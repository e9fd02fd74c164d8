// Multi-head attention (Vaswani et al. 2017, §3.2.2; seed tutorials 000, 001, 003):
//
//   MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O,   head_i = Attention(Q W_Qi, K W_Ki, V W_Vi)
//
// Batch-first:  query [N, L, E]   key [N, S, kdim]   value [N, S, vdim]   out [N, L, E]
// Grouped-query attention (seed 000, "GQA/MQA"): num_kv_heads < num_heads key/value heads, each
// shared by num_heads / num_kv_heads query heads; num_kv_heads = 1 is multi-query attention.
// The projections are one GEMM each (one GEMM in all for self-attention with packed weights); the
// per-head split is a stride, never a copy.
#pragma once

#include <cstdint>
#include <xtensor/xtensor.hpp>

#include "transformer_core/layers/module.hpp"
#include "transformer_core/ops/attention.hpp"

namespace transformer_core::layers {

using ops::AttentionPath;

// The masks of one attention call, broadcast to (n, h, l, s) through strides (stride 0 = broadcast).
// Same meaning as in kernels::AttentionArgs: bool nonzero = may attend, float added, key_mask (n, s)
// nonzero = a real key, is_causal: key s visible to query l iff s <= l + causal_offset.
template <class T>
struct MaskArgs {
  const uint8_t* bool_mask = nullptr;
  int64_t bool_mask_strides[4] = {0, 0, 0, 0};
  const T* float_mask = nullptr;
  int64_t float_mask_strides[4] = {0, 0, 0, 0};
  const uint8_t* key_mask = nullptr;
  int64_t key_mask_stride_n = 0, key_mask_stride_s = 0;
  bool is_causal = false;
  int64_t causal_offset = 0;

  void copy_to(kernels::AttentionArgs<T>& a) const {
    a.bool_mask = bool_mask;
    a.float_mask = float_mask;
    for (int i = 0; i < 4; ++i) {
      a.bool_mask_strides[i] = bool_mask_strides[i];
      a.float_mask_strides[i] = float_mask_strides[i];
    }
    a.key_mask = key_mask;
    a.key_mask_stride_n = key_mask_stride_n;
    a.key_mask_stride_s = key_mask_stride_s;
    a.is_causal = is_causal;
    a.causal_offset = causal_offset;
  }
};

// The real (non-padding) tokens of a padded batch [N, L]: index[t] = n · L + l for t in [0, count),
// ascending. Layers run their GEMMs, norms and activations on the count real rows only ("packed"),
// and go back to the padded layout for attention alone.
struct PackedTokens {
  int64_t N = 0, L = 0, count = 0;
  const int64_t* index = nullptr;
};

template <class T>
class MultiheadAttention : public Module<T> {
 public:
  // kdim, vdim: sizes of key and value features (0 = embed_dim). num_kv_heads: 0 = num_heads.
  // Parameters, named as torch.nn.MultiheadAttention's state_dict:
  //   kdim == vdim == embed_dim:  in_proj_weight [E + 2·E_kv, E]        (E_kv = num_kv_heads · head_dim)
  //   otherwise:                  q_proj_weight [E, E], k_proj_weight [E_kv, kdim], v_proj_weight [E_kv, vdim]
  //   bias:                       in_proj_bias [E + 2·E_kv], out_proj.bias [E]
  //   always:                     out_proj.weight [E, E]
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool bias = true, int64_t kdim = 0, int64_t vdim = 0,
                     int64_t num_kv_heads = 0);

  // query [N, L, E], key [N, S, kdim], value [N, S, vdim] -> out [N, L, E].
  // Self-attention (key == value == query, same pointer) with packed weights runs one QKV GEMM.
  // weights: nullptr, or [N, H, L, S] to receive the attention probabilities of every head.
  void forward(const T* query, const T* key, const T* value, int64_t N, int64_t L, int64_t S, T* out,
               const MaskArgs<T>& masks, T* weights = nullptr, AttentionPath path = AttentionPath::kAuto) const;

  // Self-attention over the real tokens of a padded batch: x [count, E] -> out [count, E] (packed
  // rows, see PackedTokens). The masks are those of the padded [N, L] batch; they must hide the
  // padding keys (key_mask). Needs the packed layout (kdim = vdim = embed_dim).
  void forward_packed(const T* x, const PackedTokens& tokens, T* out, const MaskArgs<T>& masks,
                      AttentionPath path = AttentionPath::kAuto) const;

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t kdim() const { return kdim_; }
  int64_t vdim() const { return vdim_; }
  bool packed() const { return packed_; }
  bool has_bias() const { return bias_; }

 private:
  // context [N, L, E] = attention over projected q [N, L, ·] and k, v [N, S, ·] given with their
  // row strides (ld*) in elements.
  void attend(const T* q, int64_t q_ld, const T* k, const T* v, int64_t kv_ld, int64_t N, int64_t L, int64_t S,
              T* context, const MaskArgs<T>& masks, T* weights, AttentionPath path) const;

  int64_t embed_dim_, num_heads_, num_kv_heads_, head_dim_, kv_dim_, kdim_, vdim_;
  bool bias_, packed_;
  xt::xtensor<T, 2> in_proj_weight_;                                 // packed [E + 2·E_kv, E]
  xt::xtensor<T, 2> q_proj_weight_, k_proj_weight_, v_proj_weight_;  // separate (kdim/vdim ≠ E)
  xt::xtensor<T, 1> in_proj_bias_;                                   // [E + 2·E_kv]
  xt::xtensor<T, 2> out_proj_weight_;                                // [E, E]
  xt::xtensor<T, 1> out_proj_bias_;                                  // [E]
};

}  // namespace transformer_core::layers
