// RoPE's backward: the rotation is orthogonal, so the gradient is rotated back by -θ
// (ops::rotary_heads_backward, the exact transpose of the forward's rotation).
#include "transformer_core/layers/rotary.hpp"
#include "transformer_core/ops/backward.hpp"

namespace transformer_core::layers {

template <class T>
void RotaryEmbedding<T>::apply_backward(T* d, int64_t rows, int64_t ld, int64_t col0, int64_t heads,
                                        const int64_t* positions) const {
  Reading reading(*this);
  const Tables* t = tables_for(positions, rows);
  ops::rotary_heads_backward(d, rows, ld, col0, heads, head_dim_, positions, t->cos.data(), t->sin.data(),
                             t->positions, layout_);
}

template void RotaryEmbedding<float>::apply_backward(float*, int64_t, int64_t, int64_t, int64_t, const int64_t*) const;
template void RotaryEmbedding<double>::apply_backward(double*, int64_t, int64_t, int64_t, int64_t,
                                                      const int64_t*) const;

}  // namespace transformer_core::layers
