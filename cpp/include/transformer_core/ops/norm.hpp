// Normalisation over the last dim of x viewed as [rows, n], and its fusions with the residual add.
//
//   LayerNorm (Ba et al. 2016):        y = (x - mean) / sqrt(var + eps) · weight + bias
//   RMSNorm (Zhang & Sennrich 2019):   y = x / sqrt(mean(x²) + eps) · weight
//
// The residual stream of a Transformer layer meets a norm in two ways (Xiong et al. 2020):
//   post-LN (the paper, BERT):   y = norm(a + b)                       -> add_norm
//   pre-LN (GPT-2, Llama):       h = h + delta;  y = norm(h)           -> residual_norm
#pragma once

#include <cstdint>

namespace transformer_core::ops {

enum class NormKind { kLayerNorm, kRMSNorm };

// A norm's parameters: weight [n] (or nullptr), bias [n] (LayerNorm only, or nullptr), eps.
template <class T>
struct NormParams {
  NormKind kind = NormKind::kLayerNorm;
  const T* weight = nullptr;
  const T* bias = nullptr;
  T eps = T(1e-5);
};

// y[rows, n] = norm(x[rows, n]); y may alias x. Throws for n < 1, rows < 0, eps < 0 or NaN.
template <class T>
void norm(const T* x, int64_t rows, int64_t n, const NormParams<T>& p, T* y);

// y = norm(a + b); y may alias a or b.
template <class T>
void add_norm(const T* a, const T* b, int64_t rows, int64_t n, const NormParams<T>& p, T* y);

// h = h + delta (in place), then y = norm(h); y must not alias h.
template <class T>
void residual_norm(T* h, const T* delta, int64_t rows, int64_t n, const NormParams<T>& p, T* y);

// y[i] = a[i] + b[i], i < count; y may alias a or b.
template <class T>
void add(const T* a, const T* b, int64_t count, T* y);

}  // namespace transformer_core::ops
