#include "transformer_core/layers/multihead_attention.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/gemm.hpp"
#include "transformer_core/kernels/workspace.hpp"

namespace transformer_core::layers {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

template <class T>
MultiheadAttention<T>::MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool bias, int64_t kdim,
                                          int64_t vdim, int64_t num_kv_heads)
    : embed_dim_(embed_dim),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads > 0 ? num_kv_heads : num_heads),
      kdim_(kdim > 0 ? kdim : embed_dim),
      vdim_(vdim > 0 ? vdim : embed_dim),
      bias_(bias) {
  if (embed_dim < 1) throw std::invalid_argument("embed_dim must be >= 1, got " + str(embed_dim));
  if (num_heads < 1) throw std::invalid_argument("num_heads must be >= 1, got " + str(num_heads));
  if (embed_dim % num_heads != 0)
    throw std::invalid_argument("embed_dim (" + str(embed_dim) + ") must be divisible by num_heads (" +
                                str(num_heads) + ")");
  if (num_heads % num_kv_heads_ != 0)
    throw std::invalid_argument("num_heads (" + str(num_heads) + ") must be divisible by num_kv_heads (" +
                                str(num_kv_heads_) + ")");
  head_dim_ = embed_dim / num_heads;
  kv_dim_ = num_kv_heads_ * head_dim_;
  packed_ = kdim_ == embed_dim && vdim_ == embed_dim;
  const size_t E = static_cast<size_t>(embed_dim), Ekv = static_cast<size_t>(kv_dim_);
  if (packed_) {
    in_proj_weight_ = xt::zeros<T>({E + 2 * Ekv, E});
    this->register_parameter("in_proj_weight", {embed_dim + 2 * kv_dim_, embed_dim}, in_proj_weight_.data());
  } else {
    q_proj_weight_ = xt::zeros<T>({E, E});
    k_proj_weight_ = xt::zeros<T>({Ekv, static_cast<size_t>(kdim_)});
    v_proj_weight_ = xt::zeros<T>({Ekv, static_cast<size_t>(vdim_)});
    this->register_parameter("q_proj_weight", {embed_dim, embed_dim}, q_proj_weight_.data());
    this->register_parameter("k_proj_weight", {kv_dim_, kdim_}, k_proj_weight_.data());
    this->register_parameter("v_proj_weight", {kv_dim_, vdim_}, v_proj_weight_.data());
  }
  if (bias) {
    in_proj_bias_ = xt::zeros<T>({E + 2 * Ekv});
    this->register_parameter("in_proj_bias", {embed_dim + 2 * kv_dim_}, in_proj_bias_.data());
  }
  out_proj_weight_ = xt::zeros<T>({E, E});
  this->register_parameter("out_proj.weight", {embed_dim, embed_dim}, out_proj_weight_.data());
  if (bias) {
    out_proj_bias_ = xt::zeros<T>({E});
    this->register_parameter("out_proj.bias", {embed_dim}, out_proj_bias_.data());
  }
}

template <class T>
void MultiheadAttention<T>::attend(const T* q, int64_t q_ld, const T* k, const T* v, int64_t kv_ld, int64_t N,
                                   int64_t L, int64_t S, T* context, const MaskArgs<T>& masks, T* weights,
                                   AttentionPath path) const {
  // Heads are column blocks of width D: [N, L, H·D] read as [N, H, L, D], a stride and no copy.
  const int64_t E = embed_dim_, D = head_dim_;
  kernels::AttentionArgs<T> a;
  a.q = q, a.q_stride_n = L * q_ld, a.q_stride_h = D, a.q_stride_l = q_ld;
  a.k = k, a.k_stride_n = S * kv_ld, a.k_stride_h = D, a.k_stride_s = kv_ld;
  a.v = v, a.v_stride_n = S * kv_ld, a.v_stride_h = D, a.v_stride_s = kv_ld;
  a.out = context, a.o_stride_n = L * E, a.o_stride_h = D, a.o_stride_l = E;
  a.batch = N, a.num_heads = num_heads_, a.num_kv_heads = num_kv_heads_;
  a.q_len = L, a.kv_len = S, a.head_dim = D, a.v_head_dim = D;
  a.scale = T(1) / std::sqrt(static_cast<T>(D));
  masks.copy_to(a);
  a.weights = weights;
  ops::scaled_dot_product_attention(a, path);
}

template <class T>
void MultiheadAttention<T>::forward(const T* query, const T* key, const T* value, int64_t N, int64_t L, int64_t S,
                                    T* out, const MaskArgs<T>& masks, T* weights, AttentionPath path) const {
  const int64_t E = embed_dim_, Ekv = kv_dim_;
  const T* bq = bias_ ? in_proj_bias_.data() : nullptr;
  const T* bk = bias_ ? in_proj_bias_.data() + E : nullptr;
  const T* bv = bias_ ? in_proj_bias_.data() + E + Ekv : nullptr;
  T* context = kernels::workspace<T, 14>(static_cast<size_t>(N * L * E));  // [N, L, H·D]

  if (packed_ && query == key && key == value && L == S) {
    // Self-attention: qkv [N·L, E + 2·E_kv] = query · in_proj_weightᵀ + in_proj_bias   (one GEMM)
    const int64_t width = E + 2 * Ekv;
    T* qkv = kernels::workspace<T, 10>(static_cast<size_t>(N * L * width));
    kernels::linear(query, N * L, E, in_proj_weight_.data(), bq, width, qkv);
    attend(qkv, width, qkv + E, qkv + E + Ekv, width, N, L, S, context, masks, weights, path);
  } else {
    const T* wq = packed_ ? in_proj_weight_.data() : q_proj_weight_.data();
    const T* wk = packed_ ? in_proj_weight_.data() + E * E : k_proj_weight_.data();
    const T* wv = packed_ ? in_proj_weight_.data() + (E + Ekv) * E : v_proj_weight_.data();
    T* q = kernels::workspace<T, 11>(static_cast<size_t>(N * L * E));
    T* k = kernels::workspace<T, 12>(static_cast<size_t>(N * S * Ekv));
    T* v = kernels::workspace<T, 13>(static_cast<size_t>(N * S * Ekv));
    kernels::linear(query, N * L, E, wq, bq, E, q);      // q [N·L, E]
    kernels::linear(key, N * S, kdim_, wk, bk, Ekv, k);  // k [N·S, E_kv]
    kernels::linear(value, N * S, vdim_, wv, bv, Ekv, v);  // v [N·S, E_kv]
    attend(q, E, k, v, Ekv, N, L, S, context, masks, weights, path);
  }
  // out [N·L, E] = context · out_proj.weightᵀ + out_proj.bias
  kernels::linear(context, N * L, E, out_proj_weight_.data(), bias_ ? out_proj_bias_.data() : nullptr, E, out);
}

template <class T>
void MultiheadAttention<T>::forward_packed(const T* x, const PackedTokens& tokens, T* out, const MaskArgs<T>& masks,
                                           AttentionPath path) const {
  if (!packed_) throw std::invalid_argument("forward_packed needs kdim == vdim == embed_dim");
  const int64_t E = embed_dim_, Ekv = kv_dim_, width = E + 2 * Ekv;
  const int64_t N = tokens.N, L = tokens.L, count = tokens.count, rows = N * L;
  // qkv of the real tokens only [count, width] (one GEMM, padding rows skipped) ...
  T* qkv_packed = kernels::workspace<T, 15>(static_cast<size_t>(count * width));
  kernels::linear(x, count, E, in_proj_weight_.data(), bias_ ? in_proj_bias_.data() : nullptr, width, qkv_packed);
  // ... scattered to the padded layout [N·L, width] for attention; padding rows are zeros (their keys
  // are masked, their queries' outputs dropped).
  T* qkv = kernels::workspace<T, 10>(static_cast<size_t>(rows * width));
  T* context = kernels::workspace<T, 14>(static_cast<size_t>(rows * E));
  std::fill(qkv, qkv + rows * width, T(0));
  for (int64_t t = 0; t < count; ++t)
    std::copy(qkv_packed + t * width, qkv_packed + (t + 1) * width, qkv + tokens.index[t] * width);
  attend(qkv, width, qkv + E, qkv + E + Ekv, width, N, L, L, context, masks, nullptr, path);
  // context rows of the real tokens [count, E], then the output projection on them alone
  T* context_packed = kernels::workspace<T, 16>(static_cast<size_t>(count * E));
  for (int64_t t = 0; t < count; ++t)
    std::copy(context + tokens.index[t] * E, context + (tokens.index[t] + 1) * E, context_packed + t * E);
  kernels::linear(context_packed, count, E, out_proj_weight_.data(), bias_ ? out_proj_bias_.data() : nullptr, E,
                  out);
}

template class MultiheadAttention<float>;
template class MultiheadAttention<double>;

}  // namespace transformer_core::layers
