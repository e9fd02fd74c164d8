// Multi-head attention (Vaswani et al. 2017, §3.2.2; the tutorials' MultiHeadAttention):
//
//   MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O,   head_i = Attention(Q W_Qi, K W_Ki, V W_Vi)
//
// Batch-first:  query [N, L, E]   key [N, S, kdim]   value [N, S, vdim]   out [N, L, E]
// Grouped-query attention (the GQA/MQA section of the tutorials): num_kv_heads < num_heads key/value
// heads, each shared by num_heads / num_kv_heads query heads; num_kv_heads = 1 is multi-query
// attention. K/V are never repeated in memory.
//
// Decoder use: a KV cache (kv_cache.hpp) receives the new keys/values, and attention runs over past +
// new (bottom-right causal); a rotary table (rotary.hpp) rotates q and k by each token's position
// inside the call. The projections are one GEMM each (one in all for self-attention: q, k, v are
// stored as one packed matrix); the per-head split is a stride, never a copy.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "transformer_core/kernels/attention_masks.hpp"
#include "transformer_core/layers/kv_cache.hpp"
#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/module.hpp"
#include "transformer_core/layers/rotary.hpp"
#include "transformer_core/ops/attention.hpp"

namespace transformer_core::layers {

using kernels::AttentionMasks;
using ops::AttentionPath;

// What one attention call needs besides query/key/value.
template <class T>
struct AttentionInputs {
  AttentionMasks<T> masks;                    // attention_masks.hpp (with a cache: key_mask is [N, past + L])
  KVCache<T>* cache = nullptr;                // self-attention only: append k, v and attend over past + new
  int64_t layer = 0;                          // this layer's index in the cache
  const RotaryEmbedding<T>* rotary = nullptr; // rotate q and k (self-attention only)
  const int64_t* positions = nullptr;         // [N, L] positions of the new tokens; nullptr: past + l
  T* weights = nullptr;                       // [N, H, L, S_total] attention probabilities, or nullptr
  bool average_weights = false;               // weights: [N, L, S_total], the mean over the heads
  AttentionPath path = AttentionPath::kAuto;
  double dropout = 0;                         // training forward only: dropout on the probabilities
  uint64_t dropout_seed = 0;                  // (torch's MultiheadAttention(dropout=)), and its seed
};

// The real (non-padding) tokens of a padded batch of N sequences, packed end to end: sequence n's
// tokens are rows [starts[n], starts[n + 1]) (starts [N + 1], starts[0] = 0, starts[N] = count).
// Layers run their GEMMs, norms and activations on the count real rows only, and attention on each
// sequence's own rows (variable-length attention): no padding row is stored or computed.
struct PackedTokens {
  int64_t N = 0, count = 0;
  const int64_t* starts = nullptr;
};

template <class T>
class MultiheadAttention : public Module<T> {
 public:
  // kdim, vdim: sizes of key and value features (0 = embed_dim); num_kv_heads: 0 = num_heads;
  // head_dim: 0 = embed_dim / num_heads (which must then divide). Parameters, named as
  // torch.nn.MultiheadAttention's state_dict (Hq = num_heads · head_dim, Hkv = num_kv_heads · head_dim):
  //   kdim == vdim == embed_dim:  in_proj_weight [Hq + 2·Hkv, E]          (q, k, v rows, packed)
  //   otherwise:                  q_proj_weight [Hq, E], k_proj_weight [Hkv, kdim], v_proj_weight [Hkv, vdim]
  //   bias:                       in_proj_bias [Hq + 2·Hkv], out_proj.bias [E]
  //   always:                     out_proj.weight [E, Hq]
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool bias = true, int64_t kdim = 0, int64_t vdim = 0,
                     int64_t num_kv_heads = 0, int64_t head_dim = 0);

  // query [N, L, E], key [N, S, kdim], value [N, S, vdim] -> out [N, L, E]; out must not alias the
  // inputs. Self-attention (key == value == query, the same pointer) with packed weights runs one QKV
  // GEMM; a cache or a rotary table needs it.
  void forward(const T* query, const T* key, const T* value, int64_t N, int64_t L, int64_t S, T* out,
               const AttentionInputs<T>& in) const;

  // Self-attention over the real tokens of a padded batch: x [count, E] -> out [count, E] (packed
  // rows, see PackedTokens); each token attends to the tokens of its own sequence (the padding mask
  // that the packing implies, and nothing else). Needs the packed layout (kdim = vdim = embed_dim).
  void forward_packed(const T* x, const PackedTokens& tokens, T* out, AttentionPath path = AttentionPath::kAuto) const;

  // ---- training (multihead_attention_backward.cpp) ----
  // As forward (the same output, bitwise), keeping the projected q, k, v (after RoPE), the context
  // and the log-sum-exp of every query row (FlashAttention-2's backward needs no [L, S] matrix), and
  // POINTERS to query, key, value and the masks (kept alive and unchanged by the caller until
  // backward). in.dropout: dropout on the attention probabilities, its mask drawn from
  // in.dropout_seed (kernels/attention.hpp) and regenerated by the backward. No KV cache and no
  // attention weights (std::invalid_argument).
  void forward_train(const T* query, const T* key, const T* value, int64_t N, int64_t L, int64_t S, T* out,
                     const AttentionInputs<T>& in);
  // dout [N, L, E] -> dquery [N, L, E] (overwritten; nullptr: not wanted) and the parameters'
  // gradients (added). Self-attention (key and value the query itself): the whole input gradient
  // goes to dquery and dkey, dvalue are ignored. Otherwise dkey [N, S, kdim] and dvalue [N, S, vdim]
  // are ADDED into (zero them first; they may be one buffer: memory used as key and value gets the
  // sum; nullptr: not wanted). Throws std::logic_error without a training forward since the last
  // backward.
  void backward(const T* dout, T* dquery, T* dkey, T* dvalue);
  void release_activations() override;

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t kdim() const { return kdim_; }
  int64_t vdim() const { return vdim_; }
  bool packed() const { return packed_; }
  bool has_bias() const { return bias_; }

 private:
  // context [N, L, Hq] = attention of projected q [N, L, ·] over k, v given as AttentionArgs
  // strides (the caller fills k/v pointers and strides, S and the causal offset).
  void attend(kernels::AttentionArgs<T>& a, const T* q, int64_t q_ld, int64_t N, int64_t L, T* context,
              const AttentionInputs<T>& in) const;
  // Self-attention with a cache and/or rotary table: qkv [N·L, Hq + 2·Hkv] projected already.
  void attend_self(T* qkv, int64_t N, int64_t L, T* context, const AttentionInputs<T>& in) const;

  // q [N·L, Hq], k [N·S, Hkv], v [N·S, Hkv]: the projections of query, key and value (cross-attention).
  void project(const T* query, const T* key, const T* value, int64_t NL, int64_t NS, T* q, T* k, T* v) const;

  int64_t embed_dim_, num_heads_, num_kv_heads_, head_dim_, q_dim_, kv_dim_, kdim_, vdim_;
  bool bias_, packed_;
  std::unique_ptr<Linear<T>> in_proj_;                   // packed: [Hq + 2·Hkv, E], bias [Hq + 2·Hkv]
  std::unique_ptr<Linear<T>> q_proj_, k_proj_, v_proj_;  // separate (kdim/vdim ≠ E), no bias of their own
  xt::xtensor<T, 1> in_proj_bias_;                       // separate: [Hq + 2·Hkv]
  ops::WeightsCheck weights_check_;                      // before out_proj_ (and the body) allocate
  Linear<T> out_proj_;                                   // [E, Hq]

  // What the training forward keeps for the backward.
  struct Saved {
    const T *query = nullptr, *key = nullptr, *value = nullptr;
    int64_t N = 0, L = 0, S = 0;
    bool self_attention = false;
    std::vector<T> qkv;            // self-attention: [N·L, Hq + 2·Hkv], q and k rotated
    std::vector<T> q, k, v;        // otherwise: [N·L, Hq], [N·S, Hkv], [N·S, Hkv]
    std::vector<T> context, lse;   // [N·L, Hq], [N, H, L]
    AttentionMasks<T> masks;
    const RotaryEmbedding<T>* rotary = nullptr;
    std::vector<int64_t> positions;  // [N·L] (rotary only)
    AttentionPath path = AttentionPath::kAuto;
    double dropout = 0;
    uint64_t dropout_seed = 0;
    bool valid = false;
  } saved_;
  // The AttentionArgs of the saved forward (q, k, v, context and lse of saved_).
  kernels::AttentionArgs<T> saved_args();
};

}  // namespace transformer_core::layers
