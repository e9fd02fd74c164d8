#include "transformer_core/layers/transformer_layers.hpp"

#include <vector>

#include "transformer_core/kernels/parallel.hpp"

namespace transformer_core::layers {

namespace {
// y[r] = LayerNorm(a[r] + b[r]) for every row: the residual add and the norm in one pass over memory.
template <class T>
void add_layer_norm(const T* a, const T* b, int64_t rows, int64_t n, const T* w, const T* bias, T eps, T* y) {
  kernels::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* yr = y + r * n;
      for (int64_t j = 0; j < n; ++j) yr[j] = a[r * n + j] + b[r * n + j];
      kernels::layer_norm_row(yr, n, w, bias, eps, yr);
    }
  });
}

template <class T>
void layer_norm(const T* x, int64_t rows, int64_t n, const T* w, const T* bias, T eps, T* y) {
  kernels::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) kernels::layer_norm_row(x + r * n, n, w, bias, eps, y + r * n);
  });
}
}  // namespace

template <class T>
TransformerEncoderLayer<T>::TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward,
                                                    Activation activation, T layer_norm_eps, bool norm_first,
                                                    bool bias)
    : d_model_(d_model),
      eps_(layer_norm_eps),
      norm_first_(norm_first),
      bias_(bias),
      self_attn_(d_model, nhead, bias),
      ff_(d_model, dim_feedforward, activation, bias) {
  const size_t E = static_cast<size_t>(d_model);
  norm1_weight_ = xt::ones<T>({E});
  norm2_weight_ = xt::ones<T>({E});
  norm1_bias_ = xt::zeros<T>({E});
  norm2_bias_ = xt::zeros<T>({E});
  this->register_module("self_attn", self_attn_);
  // FeedForward registers linear1.* / linear2.*, torch's names at the top level of the layer.
  for (const auto& p : ff_.parameters()) this->register_parameter(p.name, p.shape, p.data);
  this->register_parameter("norm1.weight", {d_model}, norm1_weight_.data());
  if (bias) this->register_parameter("norm1.bias", {d_model}, norm1_bias_.data());
  this->register_parameter("norm2.weight", {d_model}, norm2_weight_.data());
  if (bias) this->register_parameter("norm2.bias", {d_model}, norm2_bias_.data());
}

template <class T>
void TransformerEncoderLayer<T>::forward(const T* src, int64_t N, int64_t L, T* out, const MaskArgs<T>& masks,
                                         AttentionPath path) const {
  const int64_t rows = N * L, E = d_model_;
  const T* n1b = bias_ ? norm1_bias_.data() : nullptr;
  const T* n2b = bias_ ? norm2_bias_.data() : nullptr;
  std::vector<T> a(static_cast<size_t>(rows * E)), b(static_cast<size_t>(rows * E));
  if (norm_first_) {
    // x = src + SA(LN1(src))
    layer_norm(src, rows, E, norm1_weight_.data(), n1b, eps_, a.data());
    self_attn_.forward(a.data(), a.data(), a.data(), N, L, L, b.data(), masks, nullptr, path);
    std::vector<T> x(static_cast<size_t>(rows * E));
    for (int64_t i = 0; i < rows * E; ++i) x[i] = src[i] + b[i];
    // out = x + FFN(LN2(x))
    layer_norm(x.data(), rows, E, norm2_weight_.data(), n2b, eps_, a.data());
    ff_.forward(a.data(), rows, b.data());
    for (int64_t i = 0; i < rows * E; ++i) out[i] = x[i] + b[i];
  } else {
    // x = LN1(src + SA(src))
    self_attn_.forward(src, src, src, N, L, L, a.data(), masks, nullptr, path);
    add_layer_norm(src, a.data(), rows, E, norm1_weight_.data(), n1b, eps_, a.data());
    // out = LN2(x + FFN(x))
    ff_.forward(a.data(), rows, b.data());
    add_layer_norm(a.data(), b.data(), rows, E, norm2_weight_.data(), n2b, eps_, out);
  }
}

template class TransformerEncoderLayer<float>;
template class TransformerEncoderLayer<double>;

}  // namespace transformer_core::layers
