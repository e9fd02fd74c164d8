// Every xtensor of the core starts on a cache line (64 bytes): the layers' weights, the models'
// buffers, the arrays numpy views. xsimd's aligned allocator replaces std::allocator as xtensor's
// default; CMakeLists.txt includes this header first in every file (-include), before any xtensor
// header reads the macro, so that one allocator is seen everywhere.
//
// Why: a 64-byte (AVX-512) load at an address that is not a multiple of 64 touches two cache lines.
// The few-row products (kernels/linear_small.hpp) stream every weight with such loads: on one
// MiniLM sentence (AMD EPYC Zen 5, 2 threads) aligned weights took the encode from 1.67 to 1.21 ms.
#pragma once

#include <xsimd/memory/xsimd_aligned_allocator.hpp>

#define XTENSOR_DEFAULT_ALLOCATOR(T) xsimd::aligned_allocator<T, 64>
