#include "transformer_core/layers/rotary.hpp"

#include "transformer_core/layers/module.hpp"

namespace transformer_core::layers {

template <class T>
RotaryEmbedding<T>::RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base, RotaryLayout layout)
    : head_dim_(head_dim), max_positions_(max_positions), base_(base), layout_(layout) {
  ops::require_positive(max_positions, "max_position_embeddings");
  auto cos = allocate<T, 2>({max_positions, head_dim}, "rotary table (max_position_embeddings, head_dim)");
  auto sin = allocate<T, 2>({max_positions, head_dim}, "rotary table (max_position_embeddings, head_dim)");
  ops::rotary_cos_sin(cos.data(), sin.data(), max_positions, head_dim, base, 0);  // half-split rows [P, D]
  if (layout == RotaryLayout::kHalf) {
    cos_ = std::move(cos);
    sin_ = std::move(sin);
  } else {  // one value per frequency: the first half of each half-split row
    const int64_t half = head_dim / 2;
    cos_ = allocate<T, 2>({max_positions, half}, "rotary table");
    sin_ = allocate<T, 2>({max_positions, half}, "rotary table");
    for (int64_t p = 0; p < max_positions; ++p)
      for (int64_t i = 0; i < half; ++i) {
        cos_(p, i) = cos(p, i);
        sin_(p, i) = sin(p, i);
      }
  }
}

template <class T>
void RotaryEmbedding<T>::apply(T* x, int64_t rows, int64_t ld, int64_t col0, int64_t heads,
                               const int64_t* positions) const {
  ops::apply_rotary_heads(x, rows, ld, col0, heads, head_dim_, positions, cos_.data(), sin_.data(), max_positions_,
                          layout_);
}

template class RotaryEmbedding<float>;
template class RotaryEmbedding<double>;

}  // namespace transformer_core::layers
