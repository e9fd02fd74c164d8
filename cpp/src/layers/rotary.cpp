#include "transformer_core/layers/rotary.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/layers/module.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::layers {

namespace {
// One thread grows a layer's tables; the others wait, then take its tables. A child forked while
// another thread held it takes a fresh one (the old one is left as it is).
std::mutex*& growth_mutex_slot() {
  static std::mutex* mutex = new std::mutex;
  return mutex;
}
void renew_growth_mutex_in_child() { growth_mutex_slot() = new std::mutex; }
const bool g_growth_fork_handler = pthread_atfork(nullptr, nullptr, renew_growth_mutex_in_child) == 0;
}  // namespace

template <class T>
RotaryEmbedding<T>::RotaryEmbedding(int64_t head_dim, int64_t max_positions, double base, RotaryLayout layout)
    : head_dim_(head_dim), max_positions_(max_positions), base_(base), layout_(layout) {
  ops::require_positive(max_positions, "max_position_embeddings");
  built_.push_back(build(std::min(max_positions, kFirstPositions)));
  tables_.store(built_.back().get());
}

template <class T>
std::unique_ptr<const typename RotaryEmbedding<T>::Tables> RotaryEmbedding<T>::build(int64_t positions) const {
  // both tables at once: one may fit this machine's memory where the two do not
  const int64_t width = layout_ == RotaryLayout::kHalf ? head_dim_ : head_dim_ / 2;
  ops::require_weights({{2, positions, width}}, sizeof(T),
                       "rotary tables (cos and sin of " + std::to_string(positions) + " positions; "
                       "max_position_embeddings " + std::to_string(max_positions_) + ")");
  auto t = std::make_unique<Tables>();
  t->positions = positions;
  if (layout_ == RotaryLayout::kHalf) {  // half-split rows [P, D]
    t->cos = allocate<T, 2>({positions, head_dim_}, "rotary table (positions, head_dim)");
    t->sin = allocate<T, 2>({positions, head_dim_}, "rotary table (positions, head_dim)");
    ops::rotary_cos_sin(t->cos.data(), t->sin.data(), positions, head_dim_, base_, 0);
    return t;
  }
  // one value per frequency: the first half of each half-split row, computed a block of positions
  // at a time (the tables take P · D values in all, never more)
  const int64_t half = head_dim_ / 2;
  t->cos = allocate<T, 2>({positions, half}, "rotary table (positions, head_dim / 2)");
  t->sin = allocate<T, 2>({positions, half}, "rotary table (positions, head_dim / 2)");
  constexpr int64_t kBlock = 256;
  const int64_t block = std::min(kBlock, positions);
  std::vector<T> cos(static_cast<size_t>(block * head_dim_)), sin(cos.size());
  for (int64_t p0 = 0; p0 < positions; p0 += block) {
    const int64_t rows = std::min(block, positions - p0);
    ops::rotary_cos_sin(cos.data(), sin.data(), rows, head_dim_, base_, p0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < half; ++i) {
        t->cos(p0 + r, i) = cos[static_cast<size_t>(r * head_dim_ + i)];
        t->sin(p0 + r, i) = sin[static_cast<size_t>(r * head_dim_ + i)];
      }
  }
  return t;
}

template <class T>
const typename RotaryEmbedding<T>::Tables* RotaryEmbedding<T>::tables_for(const int64_t* positions,
                                                                           int64_t rows) const {
  int64_t needed = 0;  // 1 + the largest position
  for (int64_t r = 0; r < rows; ++r) {
    if (positions[r] < 0 || positions[r] >= max_positions_)
      throw std::invalid_argument("position_ids: position " + std::to_string(positions[r]) + " at flat index " +
                                  std::to_string(r) + " is outside the rotary table [0, " +
                                  std::to_string(max_positions_) + ") (max_position_embeddings)");
    needed = std::max(needed, positions[r] + 1);
  }
  const Tables* t = tables_.load();
  if (t->positions >= needed) return t;
  std::lock_guard<std::mutex> lock(*growth_mutex_slot());
  t = tables_.load();
  if (t->positions >= needed) return t;
  // grow to twice the positions built (fewer rebuilds as a sequence lengthens), or, where that
  // much does not fit in memory, to the positions needed: a call that fits is never refused for
  // the doubling
  const int64_t doubled = std::min(max_positions_, std::max(needed, 2 * t->positions));
  std::unique_ptr<const Tables> grown;
  try {
    grown = build(doubled);
  } catch (const std::exception&) {
    if (doubled == needed) throw;
    grown = build(needed);
  }
  built_.push_back(std::move(grown));
  t = built_.back().get();
  tables_.store(t);
  // The older sets go when this call is their only reader: a call counts itself in readers_ before
  // it loads tables_ (both sequentially consistent), so one that is not counted yet reads the new set.
  if (readers_.load() == 1) built_.erase(built_.begin(), built_.end() - 1);
  return t;
}

template <class T>
int64_t RotaryEmbedding<T>::built_positions() const {
  Reading reading(*this);
  return tables_.load()->positions;
}

template <class T>
void RotaryEmbedding<T>::apply(T* x, int64_t rows, int64_t ld, int64_t col0, int64_t heads,
                               const int64_t* positions) const {
  Reading reading(*this);
  const Tables* t = tables_for(positions, rows);
  ops::apply_rotary_heads(x, rows, ld, col0, heads, head_dim_, positions, t->cos.data(), t->sin.data(), t->positions,
                          layout_);
}

template class RotaryEmbedding<float>;
template class RotaryEmbedding<double>;

}  // namespace transformer_core::layers
