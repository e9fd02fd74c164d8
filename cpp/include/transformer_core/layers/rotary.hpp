// Rotary position embedding, RoPE (Su et al. 2021, RoFormer; the RoPE section of the tutorials):
//
//   θ_i = base^(-2i / head_dim),   RoPE(x, m) = x · cos(m θ) + rotate_half(x) · sin(m θ)
//
// The cos/sin tables of every position up to max_positions, computed once (in double, rounded to T);
// an attention layer rotates its q and k heads with them, each token at its own position.
#pragma once

#include <cstdint>
#include <xtensor/xtensor.hpp>

#include "transformer_core/ops/positional.hpp"

namespace transformer_core::layers {

using ops::RotaryLayout;

template <class T>
class RotaryEmbedding {
 public:
  // layout: kHalf (GPT-NeoX, Hugging Face Llama) or kInterleaved (GPT-J, Meta's Llama).
  RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base, RotaryLayout layout);

  // Rotates, in each row r of x [rows, ld], the `heads` heads of head_dim values that start at
  // column col0, by position positions[r] (< max_positions, else std::invalid_argument).
  void apply(T* x, int64_t rows, int64_t ld, int64_t col0, int64_t heads, const int64_t* positions) const;

  // The transpose of apply (a rotation by -θ), for the backward pass (rotary_backward.cpp).
  void apply_backward(T* d, int64_t rows, int64_t ld, int64_t col0, int64_t heads, const int64_t* positions) const;

  int64_t head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  double base() const { return base_; }
  RotaryLayout layout() const { return layout_; }

 private:
  int64_t head_dim_, max_positions_;
  double base_;
  RotaryLayout layout_;
  xt::xtensor<T, 2> cos_, sin_;  // [max_positions, W]: W = head_dim (kHalf) or head_dim / 2
};

}  // namespace transformer_core::layers
