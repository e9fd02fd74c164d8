#include "transformer_core/layers/transformer_layers.hpp"

#include <vector>

#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/kernels/workspace.hpp"

namespace transformer_core::layers {

namespace {
// A workspace pointer with .data(), so the layer code reads like vector code.
template <class T>
struct BufferT {
  T* ptr;
  T* data() const { return ptr; }
};

int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

}  // namespace

template <class T>
LayerNorm<T>::LayerNorm(int64_t n, T eps, bool bias) : size_(n), eps_(eps), bias_(bias) {
  weight_ = xt::ones<T>({static_cast<size_t>(n)});
  this->register_parameter("weight", {n}, weight_.data());
  if (bias) {
    bias_values_ = xt::zeros<T>({static_cast<size_t>(n)});
    this->register_parameter("bias", {n}, bias_values_.data());
  }
}

template <class T>
void LayerNorm<T>::forward(const T* x, int64_t rows, T* y) const {
  const T* b = bias_ ? bias_values_.data() : nullptr;
  kernels::parallel_for(0, rows, row_grain(size_), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) kernels::layer_norm_row(x + r * size_, size_, weight_.data(), b, eps_, y + r * size_);
  });
}

template <class T>
void LayerNorm<T>::forward_add(const T* a, const T* b, int64_t rows, T* y) const {
  const T* bias = bias_ ? bias_values_.data() : nullptr;
  const int64_t n = size_;
  kernels::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* yr = y + r * n;
      for (int64_t j = 0; j < n; ++j) yr[j] = a[r * n + j] + b[r * n + j];
      kernels::layer_norm_row(yr, n, weight_.data(), bias, eps_, yr);
    }
  });
}

namespace {
// y = a + b element-wise over n values (y may alias a or b).
template <class T>
void add(const T* a, const T* b, int64_t n, T* y) {
  kernels::parallel_for(0, n, 65536, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
  });
}
}  // namespace

template <class T>
TransformerEncoderLayer<T>::TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                    Activation activation, T layer_norm_eps, bool norm_first,
                                                    bool bias)
    : d_model_(d_model),
      norm_first_(norm_first),
      self_attn_(d_model, nhead, bias),
      ff_(d_model, dim_feedforward, activation, bias),
      norm1_(d_model, layer_norm_eps, bias),
      norm2_(d_model, layer_norm_eps, bias) {
  this->register_module("self_attn", self_attn_);
  // FeedForward registers linear1.* / linear2.*, torch's names at the top level of the layer.
  for (const auto& p : ff_.parameters()) this->register_parameter(p.name, p.shape, p.data);
  this->register_module("norm1", norm1_);
  this->register_module("norm2", norm2_);
}

template <class T>
template <class Attend>
void TransformerEncoderLayer<T>::run(const T* src, int64_t rows, T* out, const Attend& attend) const {
  using Buffer = BufferT<T>;
  const int64_t E = d_model_;
  const size_t size = static_cast<size_t>(rows * E);
  Buffer a{kernels::workspace<T, 20>(size)}, b{kernels::workspace<T, 21>(size)};
  if (norm_first_) {
    Buffer x{kernels::workspace<T, 22>(size)};
    norm1_.forward(src, rows, a.data());                                           // a = LN1(src)
    attend(a.data(), b.data());
    add(src, b.data(), rows * E, x.data());                                         // x = src + SA(a)
    norm2_.forward(x.data(), rows, a.data());                                       // a = LN2(x)
    ff_.forward(a.data(), rows, b.data());
    add(x.data(), b.data(), rows * E, out);                                         // out = x + FFN(a)
  } else {
    attend(src, a.data());
    norm1_.forward_add(src, a.data(), rows, a.data());                              // a = LN1(src + SA(src))
    ff_.forward(a.data(), rows, b.data());
    norm2_.forward_add(a.data(), b.data(), rows, out);                              // out = LN2(a + FFN(a))
  }
}

template <class T>
void TransformerEncoderLayer<T>::forward(const T* src, int64_t N, int64_t L, T* out, const MaskArgs<T>& masks,
                                         AttentionPath path) const {
  run(src, N * L, out, [&](const T* in, T* sa) { self_attn_.forward(in, in, in, N, L, L, sa, masks, nullptr, path); });
}

template <class T>
void TransformerEncoderLayer<T>::forward_packed(const T* x, const PackedTokens& tokens, T* out,
                                                const MaskArgs<T>& masks, AttentionPath path) const {
  run(x, tokens.count, out, [&](const T* in, T* sa) { self_attn_.forward_packed(in, tokens, sa, masks, path); });
}

template <class T>
TransformerDecoderLayer<T>::TransformerDecoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                    Activation activation, T layer_norm_eps, bool norm_first,
                                                    bool bias)
    : d_model_(d_model),
      norm_first_(norm_first),
      self_attn_(d_model, nhead, bias),
      cross_attn_(d_model, nhead, bias),
      ff_(d_model, dim_feedforward, activation, bias),
      norm1_(d_model, layer_norm_eps, bias),
      norm2_(d_model, layer_norm_eps, bias),
      norm3_(d_model, layer_norm_eps, bias) {
  this->register_module("self_attn", self_attn_);
  this->register_module("multihead_attn", cross_attn_);
  for (const auto& p : ff_.parameters()) this->register_parameter(p.name, p.shape, p.data);
  this->register_module("norm1", norm1_);
  this->register_module("norm2", norm2_);
  this->register_module("norm3", norm3_);
}

template <class T>
void TransformerDecoderLayer<T>::forward(const T* tgt, int64_t N, int64_t Tq, const T* memory, int64_t S, T* out,
                                         const MaskArgs<T>& self_masks, const MaskArgs<T>& cross_masks,
                                         AttentionPath path) const {
  using Buffer = BufferT<T>;
  const int64_t rows = N * Tq, E = d_model_;
  const size_t size = static_cast<size_t>(rows * E);
  Buffer x{kernels::workspace<T, 30>(size)}, a{kernels::workspace<T, 31>(size)}, b{kernels::workspace<T, 32>(size)};
  if (norm_first_) {
    norm1_.forward(tgt, rows, a.data());                                            // a = LN1(tgt)
    self_attn_.forward(a.data(), a.data(), a.data(), N, Tq, Tq, b.data(), self_masks, nullptr, path);
    add(tgt, b.data(), rows * E, x.data());                                         // x = tgt + SA(a)
    norm2_.forward(x.data(), rows, a.data());                                       // a = LN2(x)
    cross_attn_.forward(a.data(), memory, memory, N, Tq, S, b.data(), cross_masks, nullptr, path);
    add(x.data(), b.data(), rows * E, x.data());                                    // x = x + CA(a, memory)
    norm3_.forward(x.data(), rows, a.data());                                       // a = LN3(x)
    ff_.forward(a.data(), rows, b.data());
    add(x.data(), b.data(), rows * E, out);                                         // out = x + FFN(a)
  } else {
    self_attn_.forward(tgt, tgt, tgt, N, Tq, Tq, a.data(), self_masks, nullptr, path);
    norm1_.forward_add(tgt, a.data(), rows, x.data());                              // x = LN1(tgt + SA(tgt))
    cross_attn_.forward(x.data(), memory, memory, N, Tq, S, a.data(), cross_masks, nullptr, path);
    norm2_.forward_add(x.data(), a.data(), rows, x.data());                         // x = LN2(x + CA(x, memory))
    ff_.forward(x.data(), rows, b.data());
    norm3_.forward_add(x.data(), b.data(), rows, out);                              // out = LN3(x + FFN(x))
  }
}

template class LayerNorm<float>;
template class LayerNorm<double>;
template class TransformerEncoderLayer<float>;
template class TransformerEncoderLayer<double>;
template class TransformerDecoderLayer<float>;
template class TransformerDecoderLayer<double>;

}  // namespace transformer_core::layers
