// Multi-head attention, training forward and backward (multihead_attention.hpp has the forward):
//
//   forward:   q|k|v = projections of query, key, value (RoPE on q, k);  context = attention(q, k, v)
//              out = context · out_projᵀ + b
//   backward:  dcontext = dout · out_proj                        (out_proj's weight/bias gradients)
//              dq, dk, dv = FlashAttention-2's backward from the saved log-sum-exp
//                                                     (kernels/attention_backward.hpp; no [L, S] matrix;
//                                                     a dropout's mask regenerated from its seed)
//              RoPE: dq, dk rotated back by -θ;   dquery = dq · W_q,  dkey = dk · W_k,  dvalue = dv · W_v
//
// The training forward makes the same calls as forward (so the same output, bit for bit), into
// buffers it keeps instead of the scratch ones, and asks the attention kernel for the log-sum-exp.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/layers/multihead_attention.hpp"
#include "transformer_core/ops/backward.hpp"
#include "transformer_core/ops/linear.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::layers {

using kernels::Scratch;

template <class T>
kernels::AttentionArgs<T> MultiheadAttention<T>::saved_args() {
  Saved& s = saved_;
  const int64_t Hq = q_dim_, Hkv = kv_dim_, D = head_dim_, N = s.N, L = s.L, S = s.S;
  kernels::AttentionArgs<T> a;
  static_cast<AttentionMasks<T>&>(a) = s.masks;
  if (s.self_attention) {
    const int64_t width = Hq + 2 * Hkv;
    T* qkv = s.qkv.data();
    a.q = qkv, a.q_stride_n = L * width, a.q_stride_h = D, a.q_stride_l = width;
    a.k = qkv + Hq, a.k_stride_n = L * width, a.k_stride_h = D, a.k_stride_s = width;
    a.v = qkv + Hq + Hkv, a.v_stride_n = L * width, a.v_stride_h = D, a.v_stride_s = width;
  } else {
    a.q = s.q.data(), a.q_stride_n = L * Hq, a.q_stride_h = D, a.q_stride_l = Hq;
    a.k = s.k.data(), a.k_stride_n = S * Hkv, a.k_stride_h = D, a.k_stride_s = Hkv;
    a.v = s.v.data(), a.v_stride_n = S * Hkv, a.v_stride_h = D, a.v_stride_s = Hkv;
  }
  a.out = s.context.data(), a.o_stride_n = L * Hq, a.o_stride_h = D, a.o_stride_l = Hq;
  a.batch = N, a.num_heads = num_heads_, a.num_kv_heads = num_kv_heads_;
  a.q_len = L, a.kv_len = S, a.head_dim = D, a.v_head_dim = D;
  a.scale = T(1) / std::sqrt(static_cast<T>(D));
  a.lse = s.lse.data();
  ops::set_attention_dropout(a, s.dropout, s.dropout_seed);
  return a;
}

template <class T>
void MultiheadAttention<T>::forward_train(const T* query, const T* key, const T* value, int64_t N, int64_t L,
                                          int64_t S, T* out, const AttentionInputs<T>& in) {
  const int64_t Hq = q_dim_, Hkv = kv_dim_;
  if (in.cache != nullptr) throw std::invalid_argument("MultiheadAttention: the training forward takes no KV cache");
  if (in.weights != nullptr)
    throw std::invalid_argument("MultiheadAttention: the training forward returns no attention weights");
  const bool self_attention = packed_ && query == key && key == value && L == S;
  if (in.rotary != nullptr && !self_attention)
    throw std::invalid_argument("MultiheadAttention: a rotary embedding needs self-attention (key and value the "
                                "query itself) and packed weights");
  Saved& s = saved_;
  s.valid = false;
  s.query = query, s.key = key, s.value = value, s.N = N, s.L = L, s.S = S;
  s.self_attention = self_attention;
  s.masks = in.masks;
  s.rotary = in.rotary;
  s.path = in.path;
  s.dropout = in.dropout, s.dropout_seed = in.dropout_seed;
  s.context.resize(static_cast<size_t>(ops::checked_product({N, L, Hq}, "query")));
  s.lse.resize(static_cast<size_t>(ops::checked_product({N, num_heads_, L}, "query")));
  if (self_attention) {
    const int64_t width = Hq + 2 * Hkv;
    s.qkv.resize(static_cast<size_t>(ops::checked_product({N, L, width}, "query")));
    in_proj_->forward(query, N * L, s.qkv.data());  // qkv [N·L, Hq + 2·Hkv]   (one GEMM)
    if (in.rotary != nullptr) {
      s.positions.resize(static_cast<size_t>(N * L));
      for (int64_t r = 0; r < N * L; ++r)
        s.positions[static_cast<size_t>(r)] = in.positions != nullptr ? in.positions[r] : r % L;
      in.rotary->apply(s.qkv.data(), N * L, width, 0, num_heads_, s.positions.data());
      in.rotary->apply(s.qkv.data(), N * L, width, Hq, num_kv_heads_, s.positions.data());
    }
  } else {
    s.q.resize(static_cast<size_t>(N * L * Hq));
    s.k.resize(static_cast<size_t>(ops::checked_product({N, S, Hkv}, "key")));
    s.v.resize(static_cast<size_t>(N * S * Hkv));
    project(query, key, value, N * L, N * S, s.q.data(), s.k.data(), s.v.data());
  }
  kernels::AttentionArgs<T> a = saved_args();
  a.weights = nullptr;
  ops::scaled_dot_product_attention(a, in.path);       // context, and lse for the backward
  out_proj_.forward(s.context.data(), N * L, out);     // out = context · out_projᵀ + b
  s.valid = true;
}

template <class T>
void MultiheadAttention<T>::backward(const T* dout, T* dquery, T* dkey, T* dvalue) {
  Saved& s = saved_;
  if (!s.valid) throw std::logic_error("MultiheadAttention: backward without a training forward");
  s.valid = false;
  const int64_t Hq = q_dim_, Hkv = kv_dim_, D = head_dim_, N = s.N, L = s.L, S = s.S, NL = N * L, NS = N * S;
  // dcontext [N·L, Hq] = dout · out_proj.weight   (+ out_proj's gradients)
  T* dctx = kernels::workspace<T>(Scratch::kGradAttnContext, static_cast<size_t>(NL * Hq));
  out_proj_.backward(s.context.data(), dout, NL, dctx);

  kernels::AttentionBackwardArgs<T> b;
  b.fwd = saved_args();
  b.dout = dctx, b.do_stride_n = L * Hq, b.do_stride_h = D, b.do_stride_l = Hq;
  b.lse = s.lse.data();
  if (s.self_attention) {
    // dqkv [N·L, Hq + 2·Hkv]: dq, dk, dv laid out as qkv
    const int64_t width = Hq + 2 * Hkv;
    T* dqkv = kernels::workspace<T>(Scratch::kGradAttnQkv, static_cast<size_t>(NL * width));
    b.dq = dqkv, b.dq_stride_n = L * width, b.dq_stride_h = D, b.dq_stride_l = width;
    b.dk = dqkv + Hq, b.dk_stride_n = L * width, b.dk_stride_h = D, b.dk_stride_s = width;
    b.dv = dqkv + Hq + Hkv, b.dv_stride_n = L * width, b.dv_stride_h = D, b.dv_stride_s = width;
    ops::scaled_dot_product_attention_backward(b);
    if (s.rotary != nullptr) {  // q and k were rotated after the projection: rotate their gradients back
      s.rotary->apply_backward(dqkv, NL, width, 0, num_heads_, s.positions.data());
      s.rotary->apply_backward(dqkv, NL, width, Hq, num_kv_heads_, s.positions.data());
    }
    in_proj_->backward(s.query, dqkv, NL, dquery);  // dquery = dqkv · in_proj_weight
    return;
  }
  // dq [N·L, Hq], dk [N·S, Hkv], dv [N·S, Hkv]
  T* dq = kernels::workspace<T>(Scratch::kGradAttnQkv, static_cast<size_t>(NL * Hq + 2 * NS * Hkv));
  T* dk = dq + NL * Hq;
  T* dv = dk + NS * Hkv;
  b.dq = dq, b.dq_stride_n = L * Hq, b.dq_stride_h = D, b.dq_stride_l = Hq;
  b.dk = dk, b.dk_stride_n = S * Hkv, b.dk_stride_h = D, b.dk_stride_s = Hkv;
  b.dv = dv, b.dv_stride_n = S * Hkv, b.dv_stride_h = D, b.dv_stride_s = Hkv;
  ops::scaled_dot_product_attention_backward(b);
  // input gradients of key and value, added into dkey / dvalue (which may be one buffer)
  T* tmp = (dkey != nullptr || dvalue != nullptr)
               ? kernels::workspace<T>(Scratch::kGradAttnInput, static_cast<size_t>(NS * std::max(kdim_, vdim_)))
               : nullptr;
  auto add_into = [&](T* dst, int64_t count) {
    if (dst != nullptr) ops::add(dst, tmp, count, dst);
  };
  if (packed_) {  // row blocks of in_proj: q [0, Hq), k [Hq, Hq + Hkv), v [Hq + Hkv, Hq + 2·Hkv)
    in_proj_->backward_rows(s.query, dq, NL, dquery, 0, Hq);
    in_proj_->backward_rows(s.key, dk, NS, dkey != nullptr ? tmp : nullptr, Hq, Hkv);
    add_into(dkey, NS * kdim_);
    in_proj_->backward_rows(s.value, dv, NS, dvalue != nullptr ? tmp : nullptr, Hq + Hkv, Hkv);
    add_into(dvalue, NS * vdim_);
    return;
  }
  q_proj_->backward(s.query, dq, NL, dquery);
  k_proj_->backward(s.key, dk, NS, dkey != nullptr ? tmp : nullptr);
  add_into(dkey, NS * kdim_);
  v_proj_->backward(s.value, dv, NS, dvalue != nullptr ? tmp : nullptr);
  add_into(dvalue, NS * vdim_);
  if (bias_) {  // in_proj_bias.grad += column sums of dq | dk | dv
    T* db = this->accumulate_gradient("in_proj_bias");
    ops::linear_backward<T>(nullptr, dq, nullptr, NL, 0, Hq, nullptr, nullptr, db, true, false);
    ops::linear_backward<T>(nullptr, dk, nullptr, NS, 0, Hkv, nullptr, nullptr, db + Hq, true, false);
    ops::linear_backward<T>(nullptr, dv, nullptr, NS, 0, Hkv, nullptr, nullptr, db + Hq + Hkv, true, false);
  }
}

template <class T>
void MultiheadAttention<T>::release_activations() {
  saved_ = Saved{};
}

#define TC_INSTANTIATE(T)                                                                                    \
  template kernels::AttentionArgs<T> MultiheadAttention<T>::saved_args();                                     \
  template void MultiheadAttention<T>::forward_train(const T*, const T*, const T*, int64_t, int64_t, int64_t, T*, \
                                                     const AttentionInputs<T>&);                              \
  template void MultiheadAttention<T>::backward(const T*, T*, T*, T*);                                       \
  template void MultiheadAttention<T>::release_activations();
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::layers
