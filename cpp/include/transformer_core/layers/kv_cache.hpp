// The KV cache of a decoder (the KV-cache section of the tutorials): per layer, the keys and values
// of every past position, so that decoding a token attends over the past without recomputing it.
//
//   keys, values of one layer: [N, H_kv, capacity, D];  `length` positions are filled.
//
// A step with L new tokens appends L positions to every layer; when full, the capacity doubles (at
// least to what is needed) and the contents are copied once, so decoding T tokens copies O(T) in
// all. Memory: 2 · layers · N · H_kv · capacity · D values of address space — grouped-query
// attention (H_kv < H) shrinks it by H / H_kv — of which only the positions written are resident
// (ZeroPageAllocator): a cache reserved for 8000 positions and stopped after 20 holds about 20 (a
// page per (n, h) block at least). The storage past what was written reads as zeros.
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/layers/zero_page_allocator.hpp"

namespace transformer_core::layers {

template <class T>
class KVCache {
 public:
  // Throws std::invalid_argument (naming the size) for num_layers < 0, other sizes < 1, or a
  // capacity whose storage exceeds this machine's memory.
  KVCache(int64_t num_layers, int64_t batch, int64_t num_kv_heads, int64_t head_dim, int64_t capacity = 1);

  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t batch() const { return batch_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

  // Makes room for `total` positions (capacity doubles, at least to `total`), keeping the contents.
  void reserve(int64_t total);
  // Forgets every position from `length` on (0 <= length <= this->length(), else invalid_argument).
  void crop(int64_t length);
  // Marks `length` positions filled (0 <= length <= capacity): after a step has appended them, or
  // after they were written through keys() and values().
  void set_length(int64_t length);

  // [N, H_kv, capacity, D] of one layer.
  T* keys(int64_t layer) { return keys_[static_cast<size_t>(layer)].data(); }
  T* values(int64_t layer) { return values_[static_cast<size_t>(layer)].data(); }
  const T* keys(int64_t layer) const { return keys_[static_cast<size_t>(layer)].data(); }
  const T* values(int64_t layer) const { return values_[static_cast<size_t>(layer)].data(); }

  // One call at a time: a forward that reads and extends the cache holds it (the bindings, while the
  // GIL is released). A second call on the same cache meanwhile, from another thread, gets
  // std::invalid_argument, as do reading, loading, cropping or growing it (require_idle): otherwise
  // one would reallocate the storage or move the length under the other's reads. A hold left by a
  // thread of the parent process at a fork does not count in the child (fork_generation).
  class Use {
   public:
    explicit Use(const KVCache* cache) : cache_(cache) {
      if (cache_ == nullptr) return;
      const uint64_t mine = fork_generation() + 1;
      uint64_t seen = cache_->holder_.load();
      do {
        if (seen == mine) {
          cache_ = nullptr;
          throw std::invalid_argument(std::string("past_key_values: this KVCache is ") + kInUseBy);
        }
      } while (!cache_->holder_.compare_exchange_weak(seen, mine));  // free (0), or held before a fork
    }
    ~Use() {
      if (cache_ != nullptr) cache_->holder_.store(0);
    }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    const KVCache* cache_;
  };
  void require_idle() const {
    if (holder_.load() == fork_generation() + 1) throw std::invalid_argument(std::string("KVCache: ") + kInUseBy);
  }

  // Copies positions [past, past + L) of one layer in from rows of a projection buffer:
  // k of token (n, l), head h at k_src[(n·L + l)·ld + h·D], v likewise at v_src.
  void append(int64_t layer, const T* k_src, const T* v_src, int64_t ld, int64_t L);

 private:
  // [N, H_kv, capacity, D], zeros until written, resident only where written
  using Storage = xt::xtensor_container<xt::uvector<T, ZeroPageAllocator<T>>, 4, xt::layout_type::row_major>;

  int64_t batch_, num_kv_heads_, head_dim_, capacity_ = 0, length_ = 0;
  // Positions [0, written_) of a block may have been written (appended, or filled before a
  // set_length); from written_ on, every (n, h) block of every layer is still untouched zeros.
  int64_t written_ = 0;
  std::vector<Storage> keys_, values_;
  mutable std::atomic<uint64_t> holder_{0};  // 0, or fork_generation() + 1 of the process whose call holds it
  static constexpr const char* kInUseBy =
      "in use by another call (a cache holds one sequence of calls at a time; give each thread its own)";
};

}  // namespace transformer_core::layers
