#include "transformer_core/layers/linear.hpp"

#include <stdexcept>
#include <string>

#include "transformer_core/ops/linear.hpp"

namespace transformer_core::layers {

template <class T>
Linear<T>::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_(in_features), out_(out_features), has_bias_(bias) {
  weight_ = allocate<T, 2>({out_features, in_features}, "Linear: (out_features, in_features)");
  this->register_parameter("weight", {out_, in_}, weight_.data());
  if (bias) {
    bias_ = allocate<T, 1>({out_features}, "Linear: out_features");
    this->register_parameter("bias", {out_}, bias_.data());
  }
}

template <class T>
void Linear<T>::forward(const T* x, int64_t rows, T* y, Activation act) const {
  ops::linear(x, rows, in_, weight_.data(), has_bias_ ? bias_.data() : nullptr, out_, y, act);
}

template <class T>
void Linear<T>::forward_rows(const T* x, int64_t rows, T* y, int64_t out_begin, int64_t out_count,
                             Activation act) const {
  if (out_begin < 0 || out_count < 0 || out_begin + out_count > out_)
    throw std::invalid_argument("Linear: output rows [" + std::to_string(out_begin) + ", " +
                                std::to_string(out_begin + out_count) + ") outside [0, " + std::to_string(out_) + ")");
  ops::linear(x, rows, in_, weight_.data() + out_begin * in_, has_bias_ ? bias_.data() + out_begin : nullptr, out_count,
              y, act);
}

template class Linear<float>;
template class Linear<double>;

}  // namespace transformer_core::layers
