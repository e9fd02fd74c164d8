// Linear's backward (llm.c's matmul_backward; torch's nn.Linear):
//   dx = dy · W,   weight.grad += dyᵀ · x,   bias.grad += Σ_rows dy
#include <stdexcept>
#include <string>

#include "transformer_core/layers/linear.hpp"
#include "transformer_core/ops/backward.hpp"

namespace transformer_core::layers {

template <class T>
void Linear<T>::backward(const T* x, const T* dy, int64_t rows, T* dx) {
  backward_rows(x, dy, rows, dx, 0, out_);
}

template <class T>
void Linear<T>::backward_rows(const T* x, const T* dy, int64_t rows, T* dx, int64_t out_begin, int64_t out_count) {
  if (quantized_)
    throw std::invalid_argument("Linear: the weight is quantized (" + quantized_->format_name() +
                                "): only float weights train; train the float model, then quantize it");
  if (out_begin < 0 || out_count < 0 || out_begin + out_count > out_)
    throw std::invalid_argument("Linear: output rows [" + std::to_string(out_begin) + ", " +
                                std::to_string(out_begin + out_count) + ") outside [0, " + std::to_string(out_) + ")");
  T* dw = this->accumulate_gradient("weight") + out_begin * in_;
  T* db = has_bias_ ? this->accumulate_gradient("bias") + out_begin : nullptr;
  ops::linear_backward(x, dy, weight_.data() + out_begin * in_, rows, in_, out_count, dx, dw, db,
                       /*accumulate=*/true, /*w_in_out=*/false);
}

template void Linear<float>::backward(const float*, const float*, int64_t, float*);
template void Linear<double>::backward(const double*, const double*, int64_t, double*);
template void Linear<float>::backward_rows(const float*, const float*, int64_t, float*, int64_t, int64_t);
template void Linear<double>::backward_rows(const double*, const double*, int64_t, double*, int64_t, int64_t);

}  // namespace transformer_core::layers
