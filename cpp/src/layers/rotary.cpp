#include "transformer_core/layers/rotary.hpp"

#include <algorithm>
#include <vector>

#include "transformer_core/layers/module.hpp"

namespace transformer_core::layers {

template <class T>
RotaryEmbedding<T>::RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base, RotaryLayout layout)
    : head_dim_(head_dim), max_positions_(max_positions), base_(base), layout_(layout) {
  ops::require_positive(max_positions, "max_position_embeddings");
  if (layout == RotaryLayout::kHalf) {  // half-split rows [P, D]
    cos_ = allocate<T, 2>({max_positions, head_dim}, "rotary table (max_position_embeddings, head_dim)");
    sin_ = allocate<T, 2>({max_positions, head_dim}, "rotary table (max_position_embeddings, head_dim)");
    ops::rotary_cos_sin(cos_.data(), sin_.data(), max_positions, head_dim, base, 0);
    return;
  }
  // one value per frequency: the first half of each half-split row, computed a block of positions
  // at a time (the tables take P · D values in all, never more)
  const int64_t half = head_dim / 2;
  cos_ = allocate<T, 2>({max_positions, half}, "rotary table (max_position_embeddings, head_dim / 2)");
  sin_ = allocate<T, 2>({max_positions, half}, "rotary table (max_position_embeddings, head_dim / 2)");
  constexpr int64_t kBlock = 256;
  const int64_t block = std::min(kBlock, max_positions);
  std::vector<T> cos(static_cast<size_t>(block * head_dim)), sin(cos.size());
  for (int64_t p0 = 0; p0 < max_positions; p0 += block) {
    const int64_t rows = std::min(block, max_positions - p0);
    ops::rotary_cos_sin(cos.data(), sin.data(), rows, head_dim, base, p0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < half; ++i) {
        cos_(p0 + r, i) = cos[static_cast<size_t>(r * head_dim + i)];
        sin_(p0 + r, i) = sin[static_cast<size_t>(r * head_dim + i)];
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
