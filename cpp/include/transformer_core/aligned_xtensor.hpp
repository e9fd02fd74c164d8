// Every xtensor of the core starts on a cache line (64 bytes): the layers' weights and the buffers
// numpy views of them. xsimd's aligned allocator replaces std::allocator as xtensor's default;
// CMakeLists.txt includes this header first in every file that may use xtensor (-include), before any
// xtensor header reads the macro, so that every file sees the same xt::xtensor types
// (layers/module.hpp asserts it).
//
// Why: a 64-byte (AVX-512) load at an address that is not a multiple of 64 touches two cache lines.
// The few-row products (kernels/linear_small.hpp) stream every weight with such loads: on one
// MiniLM sentence (AMD EPYC Zen 5, 2 threads) aligned weights took the encode from 1.67 to 1.21 ms.
#pragma once

#if defined(XTENSOR_DEFAULT_ALLOCATOR) || defined(XTENSOR_CONFIG_HPP)
#error "aligned_xtensor.hpp must come before any xtensor header, and define xtensor's allocator alone"
#endif

#include <xsimd/memory/xsimd_aligned_allocator.hpp>

#define XTENSOR_DEFAULT_ALLOCATOR(T) xsimd::aligned_allocator<T, 64>
