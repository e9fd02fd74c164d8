// The norms' backward (kernels/norm_backward.hpp has the formulas): dx from the forward's input,
// weight.grad (and LayerNorm's bias.grad) added.
#include "transformer_core/layers/norm.hpp"
#include "transformer_core/ops/backward.hpp"

namespace transformer_core::layers {

template <class T>
void Norm<T>::backward(const T* x, const T* dy, int64_t rows, T* dx) {
  T* dw = params_.weight != nullptr ? this->accumulate_gradient("weight") : nullptr;
  if (params_.kind == ops::NormKind::kLayerNorm) {
    T* db = params_.bias != nullptr ? this->accumulate_gradient("bias") : nullptr;
    ops::layer_norm_backward(x, dy, params_.weight, rows, size_, static_cast<double>(params_.eps), dx, dw, db,
                             /*accumulate=*/true);
  } else {
    ops::rms_norm_backward(x, dy, params_.weight, rows, size_, static_cast<double>(params_.eps), dx, dw,
                           /*accumulate=*/true);
  }
}

template void Norm<float>::backward(const float*, const float*, int64_t, float*);
template void Norm<double>::backward(const double*, const double*, int64_t, double*);

}  // namespace transformer_core::layers
