#include "transformer_core/layers/norm.hpp"

#include "transformer_core/ops/checks.hpp"

#include <stdexcept>
#include <string>

namespace transformer_core::layers {

template <class T>
Norm<T>::Norm(ops::NormKind kind, int64_t size, T eps, bool bias) : size_(size) {
  if (!(eps >= T(0))) throw std::invalid_argument("eps: expected a value >= 0, got " + std::to_string(eps));
  if (bias) ops::require_weights({{size}, {size}}, sizeof(T), "normalized_shape: weight and bias");  // together
  weight_ = allocate<T, 1>({size}, "normalized_shape");
  weight_.fill(T(1));
  this->register_parameter("weight", {size}, weight_.data());
  if (bias) {
    bias_ = allocate<T, 1>({size}, "normalized_shape");
    this->register_parameter("bias", {size}, bias_.data());
  }
  params_ = {kind, weight_.data(), bias ? bias_.data() : nullptr, eps};
}

template <class T>
void Norm<T>::forward(const T* x, int64_t rows, T* y) const {
  ops::norm(x, rows, size_, params_, y);
}

template <class T>
void Norm<T>::forward_add(const T* a, const T* b, int64_t rows, T* y) const {
  ops::add_norm(a, b, rows, size_, params_, y);
}

template <class T>
void Norm<T>::forward_residual(T* h, const T* delta, int64_t rows, T* y) const {
  ops::residual_norm(h, delta, rows, size_, params_, y);
}

template class Norm<float>;
template class Norm<double>;

}  // namespace transformer_core::layers
