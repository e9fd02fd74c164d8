// Scratch buffers reused across calls: each call site names its buffer with a distinct Tag, and
// each thread gets its own (thread_local), so concurrent calls from several Python threads never
// share one. A buffer grows to the largest size asked for and is never shrunk.
#pragma once

#include <cstddef>
#include <vector>

namespace transformer_core::kernels {

template <class T, int Tag>
T* workspace(size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace transformer_core::kernels
