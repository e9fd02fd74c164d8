// Normalisation layers over the last dim (ops/norm.hpp has the formulas):
//   LayerNorm (Ba et al. 2016): weight [E] (ones), bias [E] (zeros; absent if !bias)
//   RMSNorm (Zhang & Sennrich 2019; torch.nn.RMSNorm, Hugging Face's LlamaRMSNorm): weight [E] (ones)
#pragma once

#include <cstdint>
#include <xtensor/xtensor.hpp>

#include "transformer_core/layers/module.hpp"
#include "transformer_core/ops/norm.hpp"

namespace transformer_core::layers {

template <class T>
class Norm : public Module<T> {
 public:
  // x [rows, E] -> y [rows, E]; y may alias x.
  void forward(const T* x, int64_t rows, T* y) const;
  // y = norm(a + b): post-LN's residual add fused into the norm; y may alias a or b.
  void forward_add(const T* a, const T* b, int64_t rows, T* y) const;
  // h += delta, then y = norm(h): pre-LN's residual add fused with the next norm; y must not alias h.
  void forward_residual(T* h, const T* delta, int64_t rows, T* y) const;

  // ---- training (norm_backward.cpp) ----
  // x [rows, E]: the forward's input; dy [rows, E] -> dx [rows, E] (overwritten; must not alias dy);
  // weight.grad += Σ dy · x̂, bias.grad += Σ dy.
  void backward(const T* x, const T* dy, int64_t rows, T* dx);

  int64_t size() const { return size_; }
  ops::NormKind kind() const { return params_.kind; }

 protected:
  Norm(ops::NormKind kind, int64_t size, T eps, bool bias);

 private:
  int64_t size_;
  xt::xtensor<T, 1> weight_, bias_;
  ops::NormParams<T> params_;
};

template <class T>
class LayerNorm : public Norm<T> {
 public:
  LayerNorm(int64_t normalized_size, T eps, bool bias = true) : Norm<T>(ops::NormKind::kLayerNorm, normalized_size, eps, bias) {}
};

template <class T>
class RMSNorm : public Norm<T> {
 public:
  RMSNorm(int64_t normalized_size, T eps) : Norm<T>(ops::NormKind::kRMSNorm, normalized_size, eps, false) {}
};

}  // namespace transformer_core::layers
