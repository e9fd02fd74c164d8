// Rotary position embedding, RoPE (Su et al. 2021, RoFormer; the RoPE section of the tutorials):
//
//   θ_i = base^(-2i / head_dim),   RoPE(x, m) = x · cos(m θ) + rotate_half(x) · sin(m θ)
//
// The cos/sin tables of the positions (computed in double, rounded to T); an attention layer rotates
// its q and k heads with them, each token at its own position. The tables are built for the first
// kFirstPositions positions, and grow (doubling) when a longer sequence comes: a model's
// max_position_embeddings (131,072 for Llama 3.1, anything a GGUF file claims) costs no memory until
// a sequence that long runs. Hugging Face computes the angles per call instead; llama.cpp too.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "transformer_core/ops/positional.hpp"

namespace transformer_core::layers {

using ops::RotaryLayout;

template <class T>
class RotaryEmbedding {
 public:
  // layout: kHalf (GPT-NeoX, Hugging Face Llama) or kInterleaved (GPT-J, Meta's Llama).
  RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base, RotaryLayout layout);

  // Positions whose tables are built with the layer (fewer if max_positions is smaller).
  static constexpr int64_t kFirstPositions = 4096;

  // Rotates, in each row r of x [rows, ld], the `heads` heads of head_dim values that start at
  // column col0, by position positions[r] (in [0, max_positions), else std::invalid_argument).
  // Safe to call from several threads at once, also while the tables grow.
  void apply(T* x, int64_t rows, int64_t ld, int64_t col0, int64_t heads, const int64_t* positions) const;

  // The transpose of apply (a rotation by -θ), for the backward pass (rotary_backward.cpp).
  void apply_backward(T* d, int64_t rows, int64_t ld, int64_t col0, int64_t heads, const int64_t* positions) const;

  int64_t head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  double base() const { return base_; }
  RotaryLayout layout() const { return layout_; }

  // Positions whose tables are built now (kFirstPositions or more, at most max_positions).
  int64_t built_positions() const;
  // Grows the tables to cover positions[0 … rows − 1], as apply would, or throws as apply would
  // (std::invalid_argument: a position outside [0, max_positions), or tables that do not fit in
  // memory): for a caller that must fail before it changes anything else (a KV cache's reserve).
  void prepare(const int64_t* positions, int64_t rows) const {
    Reading reading(*this);
    tables_for(positions, rows);
  }

 private:
  // cos and sin [positions, W] (W = head_dim for kHalf, head_dim / 2 for kInterleaved) of positions
  // 0 … positions − 1. Never changed once built: a larger set replaces it, and a call that took the
  // old one reads it to its end.
  struct Tables {
    xt::xtensor<T, 2> cos, sin;
    int64_t positions = 0;
  };
  std::unique_ptr<const Tables> build(int64_t positions) const;
  // The tables, checked to cover positions[0 … rows − 1] (grown first if they do not); throws
  // std::invalid_argument for a position outside [0, max_positions). The caller holds a Reading
  // for as long as it reads them.
  const Tables* tables_for(const int64_t* positions, int64_t rows) const;

  // A call that reads a set of tables counts itself in readers_ from before it loads tables_ until
  // it is done: the call that grows the tables frees the older sets when it is their only reader.
  class Reading {
   public:
    explicit Reading(const RotaryEmbedding& rotary) : readers_(rotary.readers_) { readers_.fetch_add(1); }
    ~Reading() { readers_.fetch_sub(1); }
    Reading(const Reading&) = delete;
    Reading& operator=(const Reading&) = delete;

   private:
    std::atomic<int64_t>& readers_;
  };

  int64_t head_dim_, max_positions_;
  double base_;
  RotaryLayout layout_;
  // The sets built that a call may still read, the newest last; tables_ is the newest, read
  // through a lock-free atomic. (A shared_ptr's atomic_load takes a lock of libstdc++'s, which a
  // fork while another thread held it left locked in the child.)
  mutable std::vector<std::unique_ptr<const Tables>> built_;  // changed under growth_mutex() (rotary.cpp)
  mutable std::atomic<const Tables*> tables_{nullptr};
  mutable std::atomic<int64_t> readers_{0};
};

}  // namespace transformer_core::layers
