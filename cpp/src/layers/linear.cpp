#include "transformer_core/layers/linear.hpp"

#include <stdexcept>
#include <string>
#include <type_traits>

#include "transformer_core/ops/linear.hpp"

namespace transformer_core::layers {

template <class T>
Linear<T>::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_(in_features), out_(out_features), has_bias_(bias) {
  weight_ = allocate_weight<T, 2>({out_features, in_features}, "Linear: (out_features, in_features)");
  this->register_parameter("weight", {out_, in_}, weight_.data());
  if (bias) {
    bias_ = allocate<T, 1>({out_features}, "Linear: out_features");
    this->register_parameter("bias", {out_}, bias_.data());
  }
}

namespace {
// y [rows, count] = act(x · W[begin : begin + count]ᵀ + bias[begin : ...]) with a quantized W.
template <class T>
void forward_quantized(const QuantizedMatrix& w, const T* x, int64_t rows, T* y, const T* bias, int64_t begin,
                       int64_t count, Activation act) {
  if constexpr (std::is_same_v<T, float>) {
    w.forward(x, rows, y, bias, begin, count);
    if (act != Activation::kNone) ops::activation(y, rows * count, act);
  } else {
    (void)w, (void)x, (void)rows, (void)y, (void)bias, (void)begin, (void)count, (void)act;
    throw std::logic_error("Linear: a float64 layer cannot hold quantized weights");
  }
}
}  // namespace

template <class T>
void Linear<T>::forward(const T* x, int64_t rows, T* y, Activation act) const {
  if (quantized_ != nullptr) {
    forward_quantized(*quantized_, x, rows, y, has_bias_ ? bias_.data() : nullptr, 0, out_, act);
    return;
  }
  ops::linear(x, rows, in_, weight_.data(), has_bias_ ? bias_.data() : nullptr, out_, y, act);
}

template <class T>
void Linear<T>::forward_rows(const T* x, int64_t rows, T* y, int64_t out_begin, int64_t out_count,
                             Activation act) const {
  if (out_begin < 0 || out_count < 0 || out_begin + out_count > out_)
    throw std::invalid_argument("Linear: output rows [" + std::to_string(out_begin) + ", " +
                                std::to_string(out_begin + out_count) + ") outside [0, " + std::to_string(out_) + ")");
  if (quantized_ != nullptr) {
    if (out_count > 0)
      forward_quantized(*quantized_, x, rows, y, has_bias_ ? bias_.data() : nullptr, out_begin, out_count, act);
    return;
  }
  ops::linear(x, rows, in_, weight_.data() + out_begin * in_, has_bias_ ? bias_.data() + out_begin : nullptr, out_count,
              y, act);
}

template <class T>
void Linear<T>::quantize_int8() {
  if constexpr (std::is_same_v<T, float>) {
    if (quantized_ != nullptr)
      throw std::invalid_argument("Linear: the weight is already quantized (" + quantized_->format_name() + ")");
    set_quantized(QuantizedMatrix::int8(weight_.data(), out_, in_));
  } else {
    throw std::invalid_argument("Linear: int8 weights need a float32 layer (the kernels compute in float32), "
                                "got float64");
  }
}

template <class T>
void Linear<T>::set_quantized(std::unique_ptr<QuantizedMatrix> weight) {
  if constexpr (std::is_same_v<T, float>) {
    if (weight == nullptr) throw std::invalid_argument("Linear: set_quantized: expected a matrix, got null");
    if (weight->out_features() != out_ || weight->in_features() != in_)
      throw std::invalid_argument("Linear: quantized weight: expected shape (" + std::to_string(out_) + ", " +
                                  std::to_string(in_) + "), got (" + std::to_string(weight->out_features()) + ", " +
                                  std::to_string(weight->in_features()) + ")");
    quantized_ = std::move(weight);
    this->retire_storage("weight", weight_);  // frees the fp32 weight (unless a numpy view holds it)
    this->set_parameter_data("weight", nullptr);
  } else {
    (void)weight;
    throw std::invalid_argument("Linear: quantized weights need a float32 layer (the kernels compute in float32), "
                                "got float64");
  }
}

template <class T>
bool Linear<T>::quantized(const std::string& name) const {
  return quantized_ != nullptr && name == "weight";
}

template <class T>
std::string Linear<T>::storage(const std::string& name, int64_t row0, int64_t rows) const {
  return quantized(name) ? quantized_->format_name(row0, rows) : Module<T>::storage(name, row0, rows);
}

template <class T>
void Linear<T>::dequantize_rows(const std::string& name, int64_t row0, int64_t rows, T* out) const {
  if (!quantized(name)) Module<T>::dequantize_rows(name, row0, rows, out);
  if constexpr (std::is_same_v<T, float>) quantized_->dequantize_rows(row0, rows, out);
}

template class Linear<float>;
template class Linear<double>;

}  // namespace transformer_core::layers
