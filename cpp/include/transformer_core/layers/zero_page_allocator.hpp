// ZeroPageAllocator: zero-filled memory that becomes resident only where it is written.
//
// For storage reserved far beyond what is used at first (a KV cache reserved for the longest
// generation, which an end token may stop after a few positions). A block of kLazyBytes or more is
// an anonymous private mapping (mmap): the kernel gives each 4 KiB page as zeros on its first
// write, and a read of a page never written sees the shared zero page. So the block reads as zeros
// everywhere, as a zero-filled one, but costs only address space until written: its resident
// memory follows the pages written. (calloc does not do this: glibc serves blocks under its mmap
// threshold, which grows up to 32 MiB as blocks are freed, from its heap, and memsets them there.)
// A smaller block comes from the aligned heap and is zero-filled: at most kLazyBytes made resident
// early, where a mapping would cost a system call and a page of its own.
//
// Transparent huge pages are turned off for the mappings (madvise): in the kernel's "always" mode a
// first write would make 2 MiB resident instead of 4 KiB, and khugepaged may fill a sparsely
// written range into huge pages later.
//
// Alignment: mappings start on a page (4096 bytes), heap blocks on 64 bytes, as the project's
// other buffers (aligned_xtensor.hpp). A fork shares the pages copy-on-write, as heap memory.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstring>
#include <new>
#include <xsimd/memory/xsimd_aligned_allocator.hpp>

namespace transformer_core::layers {

template <class T>
class ZeroPageAllocator {
 public:
  using value_type = T;
  // Blocks of this many bytes or more are mappings: 16 pages.
  static constexpr size_t kLazyBytes = size_t{64} << 10;

  ZeroPageAllocator() noexcept = default;
  template <class U>
  ZeroPageAllocator(const ZeroPageAllocator<U>&) noexcept {}

  // `count` values of T, all zero (std::bad_alloc when the memory cannot be had).
  T* allocate(size_t count) {
    if (count > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    const size_t bytes = count * sizeof(T);
    if (bytes < kLazyBytes) {
      void* p = xsimd::aligned_malloc(bytes == 0 ? 1 : bytes, 64);
      if (p == nullptr) throw std::bad_alloc();
      std::memset(p, 0, bytes);
      return static_cast<T*>(p);
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    madvise(p, bytes, MADV_NOHUGEPAGE);  // advice only: a kernel without THP refuses it, harmlessly
    return static_cast<T*>(p);
  }

  // `count`: as given to allocate, which it decides the kind of block by.
  void deallocate(T* p, size_t count) noexcept {
    const size_t bytes = count * sizeof(T);
    if (bytes < kLazyBytes)
      xsimd::aligned_free(p);
    else
      munmap(p, bytes);
  }
};

template <class T, class U>
bool operator==(const ZeroPageAllocator<T>&, const ZeroPageAllocator<U>&) noexcept {
  return true;
}
template <class T, class U>
bool operator!=(const ZeroPageAllocator<T>&, const ZeroPageAllocator<U>&) noexcept {
  return false;
}

}  // namespace transformer_core::layers
