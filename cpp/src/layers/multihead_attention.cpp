#include "transformer_core/layers/multihead_attention.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/ops/linear.hpp"

namespace transformer_core::layers {

using kernels::Scratch;
using ops::to_string;

namespace {
int64_t resolve_head_dim(int64_t embed_dim, int64_t num_heads, int64_t head_dim) {
  ops::require_positive(embed_dim, "embed_dim");
  ops::require_positive(num_heads, "num_heads");
  if (head_dim > 0) return head_dim;
  if (embed_dim % num_heads != 0)
    throw std::invalid_argument("embed_dim: expected a multiple of num_heads (" + to_string(num_heads) + "), got " +
                                to_string(embed_dim));
  return embed_dim / num_heads;
}
}  // namespace

template <class T>
MultiheadAttention<T>::MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool bias, int64_t kdim, int64_t vdim,
                                          int64_t num_kv_heads, int64_t head_dim)
    : embed_dim_(embed_dim),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads > 0 ? num_kv_heads : num_heads),
      head_dim_(resolve_head_dim(embed_dim, num_heads, head_dim)),
      q_dim_(ops::checked_product({num_heads, head_dim_}, "num_heads × head_dim")),
      kv_dim_(ops::checked_product({num_kv_heads_, head_dim_}, "num_kv_heads × head_dim")),
      kdim_(kdim > 0 ? kdim : embed_dim),
      vdim_(vdim > 0 ? vdim : embed_dim),
      bias_(bias),
      packed_(kdim_ == embed_dim && vdim_ == embed_dim),
      weights_check_({{q_dim_, embed_dim}, {kv_dim_, kdim_}, {kv_dim_, vdim_}, {embed_dim, q_dim_}}, sizeof(T),
                     "embed_dim, num_heads, kdim, vdim"),
      out_proj_(q_dim_, embed_dim, bias) {
  if (num_heads % num_kv_heads_ != 0)
    throw std::invalid_argument("num_kv_heads: expected a divisor of num_heads (" + to_string(num_heads) + "), got " +
                                to_string(num_kv_heads_));
  const int64_t width = q_dim_ + 2 * kv_dim_;
  if (packed_) {  // one Linear [q; k; v]: torch's in_proj_weight / in_proj_bias
    in_proj_ = std::make_unique<Linear<T>>(embed_dim, width, bias);
    this->register_alias("in_proj_weight", *in_proj_, "weight");
    if (bias) this->register_alias("in_proj_bias", *in_proj_, "bias");
  } else {
    q_proj_ = std::make_unique<Linear<T>>(embed_dim, q_dim_, false);
    k_proj_ = std::make_unique<Linear<T>>(kdim_, kv_dim_, false);
    v_proj_ = std::make_unique<Linear<T>>(vdim_, kv_dim_, false);
    this->register_alias("q_proj_weight", *q_proj_, "weight");
    this->register_alias("k_proj_weight", *k_proj_, "weight");
    this->register_alias("v_proj_weight", *v_proj_, "weight");
    if (bias) {
      in_proj_bias_ = allocate<T, 1>({width}, "in_proj_bias");
      this->register_parameter("in_proj_bias", {width}, in_proj_bias_.data());
    }
  }
  this->register_module("out_proj", out_proj_);
}

template <class T>
void MultiheadAttention<T>::attend(kernels::AttentionArgs<T>& a, const T* q, int64_t q_ld, int64_t N, int64_t L,
                                   T* context, const AttentionInputs<T>& in) const {
  // Heads are column blocks of width D: [N, L, H·D] read as [N, H, L, D], a stride and no copy.
  const int64_t D = head_dim_;
  a.q = q, a.q_stride_n = L * q_ld, a.q_stride_h = D, a.q_stride_l = q_ld;
  a.out = context, a.o_stride_n = L * q_dim_, a.o_stride_h = D, a.o_stride_l = q_dim_;
  a.batch = N, a.num_heads = num_heads_, a.num_kv_heads = num_kv_heads_;
  a.q_len = L, a.head_dim = D, a.v_head_dim = D;
  a.scale = T(1) / std::sqrt(static_cast<T>(D));
  a.weights = in.weights;
  a.average_weights = in.average_weights;
  ops::scaled_dot_product_attention(a, in.path);
}

template <class T>
void MultiheadAttention<T>::attend_self(T* qkv, int64_t N, int64_t L, T* context, const AttentionInputs<T>& in) const {
  const int64_t width = q_dim_ + 2 * kv_dim_, D = head_dim_;
  KVCache<T>* cache = in.cache;
  const int64_t past = cache != nullptr ? cache->length() : 0;
  if (cache != nullptr) {
    if (cache->batch() != N || cache->num_kv_heads() != num_kv_heads_ || cache->head_dim() != D ||
        in.layer < 0 || in.layer >= cache->num_layers())
      throw std::invalid_argument("past_key_values: a cache of batch " + to_string(cache->batch()) + ", " +
                                  to_string(cache->num_kv_heads()) + " key/value heads of " +
                                  to_string(cache->head_dim()) + " and " + to_string(cache->num_layers()) +
                                  " layers does not fit layer " + to_string(in.layer) + " of batch " + to_string(N) +
                                  " with " + to_string(num_kv_heads_) + " heads of " + to_string(D));
    if (past + L > cache->capacity())
      throw std::invalid_argument("past_key_values: " + to_string(past) + " cached positions and " + to_string(L) +
                                  " new ones exceed the cache's capacity of " + to_string(cache->capacity()) +
                                  " (reserve it first)");
  }
  // Positions of the new tokens: given (left padding), else past + l.
  std::vector<int64_t> default_positions;
  const int64_t* positions = in.positions;
  if (positions == nullptr) {
    default_positions.resize(static_cast<size_t>(N * L));
    for (int64_t r = 0; r < N * L; ++r) default_positions[static_cast<size_t>(r)] = past + r % L;
    positions = default_positions.data();
  }
  // RoPE on the q heads (columns [0, Hq)) and the k heads (columns [Hq, Hq + Hkv)) of each token.
  if (in.rotary != nullptr) {
    in.rotary->apply(qkv, N * L, width, 0, num_heads_, positions);
    in.rotary->apply(qkv, N * L, width, q_dim_, num_kv_heads_, positions);
  }
  kernels::AttentionArgs<T> a;
  static_cast<AttentionMasks<T>&>(a) = in.masks;
  if (cache != nullptr) {
    // Append the new k, v at positions [past, past + L), then attend over all past + L keys:
    // k, v [N, H_kv, capacity, D], causally aligned bottom-right (query l sees keys s <= past + l).
    cache->append(in.layer, qkv + q_dim_, qkv + q_dim_ + kv_dim_, width, L);
    const int64_t cap = cache->capacity();
    a.k = cache->keys(in.layer), a.k_stride_n = num_kv_heads_ * cap * D, a.k_stride_h = cap * D, a.k_stride_s = D;
    a.v = cache->values(in.layer), a.v_stride_n = a.k_stride_n, a.v_stride_h = a.k_stride_h, a.v_stride_s = D;
    a.kv_len = past + L;
    a.causal_offset += past;
  } else {
    a.k = qkv + q_dim_, a.k_stride_n = L * width, a.k_stride_h = D, a.k_stride_s = width;
    a.v = qkv + q_dim_ + kv_dim_, a.v_stride_n = L * width, a.v_stride_h = D, a.v_stride_s = width;
    a.kv_len = L;
  }
  attend(a, qkv, width, N, L, context, in);
}

template <class T>
void MultiheadAttention<T>::project(const T* query, const T* key, const T* value, int64_t NL, int64_t NS, T* q, T* k,
                                   T* v) const {
  const int64_t Hq = q_dim_, Hkv = kv_dim_;
  if (packed_) {  // row blocks of in_proj: q [0, Hq), k [Hq, Hq + Hkv), v [Hq + Hkv, Hq + 2·Hkv)
    in_proj_->forward_rows(query, NL, q, 0, Hq);
    in_proj_->forward_rows(key, NS, k, Hq, Hkv);
    in_proj_->forward_rows(value, NS, v, Hq + Hkv, Hkv);
    return;
  }
  q_proj_->forward(query, NL, q);
  k_proj_->forward(key, NS, k);
  v_proj_->forward(value, NS, v);
  if (bias_) {
    ops::add_bias(q, NL, Hq, in_proj_bias_.data());
    ops::add_bias(k, NS, Hkv, in_proj_bias_.data() + Hq);
    ops::add_bias(v, NS, Hkv, in_proj_bias_.data() + Hq + Hkv);
  }
}

template <class T>
void MultiheadAttention<T>::forward(const T* query, const T* key, const T* value, int64_t N, int64_t L, int64_t S,
                                    T* out, const AttentionInputs<T>& in) const {
  const int64_t Hq = q_dim_, Hkv = kv_dim_, D = head_dim_;
  T* context = kernels::workspace<T>(Scratch::kAttnContext,
                                     static_cast<size_t>(ops::checked_product({N, L, Hq}, "query")));  // [N, L, Hq]
  const bool self_attention = packed_ && query == key && key == value && L == S;
  if (in.dropout != 0)
    throw std::invalid_argument("MultiheadAttention: dropout on the attention probabilities needs the training forward");
  if ((in.cache != nullptr || in.rotary != nullptr) && !self_attention)
    throw std::invalid_argument("MultiheadAttention: a KV cache or a rotary embedding needs self-attention "
                                "(key and value the query itself) and packed weights");
  if (self_attention) {
    // qkv [N·L, Hq + 2·Hkv] = query · in_proj_weightᵀ + in_proj_bias   (one GEMM)
    const int64_t width = Hq + 2 * Hkv;
    T* qkv = kernels::workspace<T>(Scratch::kAttnQkv, static_cast<size_t>(ops::checked_product({N, L, width}, "query")));
    in_proj_->forward(query, N * L, qkv);
    attend_self(qkv, N, L, context, in);
  } else {
    T* q = kernels::workspace<T>(Scratch::kAttnQ, static_cast<size_t>(N * L * Hq));
    T* k = kernels::workspace<T>(Scratch::kAttnK, static_cast<size_t>(ops::checked_product({N, S, Hkv}, "key")));
    T* v = kernels::workspace<T>(Scratch::kAttnV, static_cast<size_t>(N * S * Hkv));
    project(query, key, value, N * L, N * S, q, k, v);  // q [N·L, Hq], k, v [N·S, Hkv]
    kernels::AttentionArgs<T> a;
    static_cast<AttentionMasks<T>&>(a) = in.masks;
    a.k = k, a.k_stride_n = S * Hkv, a.k_stride_h = D, a.k_stride_s = Hkv;
    a.v = v, a.v_stride_n = S * Hkv, a.v_stride_h = D, a.v_stride_s = Hkv;
    a.kv_len = S;
    attend(a, q, Hq, N, L, context, in);
  }
  out_proj_.forward(context, N * L, out);  // out [N·L, E] = context · out_proj.weightᵀ + out_proj.bias
}

template <class T>
void MultiheadAttention<T>::forward_packed(const T* x, const PackedTokens& tokens, T* out, AttentionPath path) const {
  if (!packed_) throw std::invalid_argument("MultiheadAttention: forward_packed needs kdim == vdim == embed_dim");
  const int64_t Hq = q_dim_, Hkv = kv_dim_, D = head_dim_, width = Hq + 2 * Hkv, count = tokens.count;
  // qkv [count, width] of the real tokens (one GEMM), attention of each sequence over its own rows
  // (heads are column blocks of width D, as in attend), then the output projection
  T* qkv = kernels::workspace<T>(Scratch::kAttnQkvPacked, static_cast<size_t>(count * width));
  T* context = kernels::workspace<T>(Scratch::kAttnContextPacked, static_cast<size_t>(count * Hq));
  in_proj_->forward(x, count, qkv);
  kernels::AttentionArgs<T> a;
  a.q = qkv, a.q_stride_h = D, a.q_stride_l = width;
  a.k = qkv + Hq, a.k_stride_h = D, a.k_stride_s = width;
  a.v = qkv + Hq + Hkv, a.v_stride_h = D, a.v_stride_s = width;
  a.out = context, a.o_stride_h = D, a.o_stride_l = Hq;
  a.batch = tokens.N, a.num_heads = num_heads_, a.num_kv_heads = num_kv_heads_;
  a.head_dim = D, a.v_head_dim = D;
  a.scale = T(1) / std::sqrt(static_cast<T>(D));
  ops::varlen_self_attention(a, tokens.starts, path);
  out_proj_.forward(context, count, out);
}

template class MultiheadAttention<float>;
template class MultiheadAttention<double>;

}  // namespace transformer_core::layers
