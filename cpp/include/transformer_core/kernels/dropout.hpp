// Dropout (Srivastava et al. 2014) driven by a seed, with a counter-based random number generator:
//
//   keep_i = u_i >= p,   u_i = Philox4x32-10(counter = i / 4, key = seed)[i mod 4] · 2⁻³²  ∈ [0, 1)
//   y_i = keep_i ? x_i · scale : 0,      scale = 1 / (1 - p)      (torch's inverted dropout)
//   dx_i = keep_i ? dy_i · scale : 0     (the same mask: regenerated from (seed, i))
//
// Philox4x32-10 (Salmon, Moraes, Dror & Shaw 2011, "Parallel random numbers: as easy as 1, 2, 3"):
// ten rounds of two 32×32→64-bit multiplies on a 128-bit counter under a 64-bit key bumped by the
// Weyl constants each round. The bits of element i depend only on (seed, i), not on the thread that
// computes them or on how the work is split: the forward and the backward regenerate the same mask,
// which is never stored. (The mask is NOT torch's: torch draws from its own generator.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace transformer_core::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

// Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1).
inline Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (golden ratio, √3 - 1)
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = kM0 * c0, p1 = kM1 * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// The 32 random bits of element i under `seed`.
inline uint32_t dropout_bits(uint64_t seed, int64_t i) {
  const uint64_t block = static_cast<uint64_t>(i) >> 2;
  const Philox4x32 r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), 0u, 0u, uint32_t(seed),
                                     uint32_t(seed >> 32));
  return r.v[i & 3];
}

// keep_i ⇔ bits_i >= threshold, threshold = ceil(p · 2³²) (so that P(keep) = 1 - p to 2⁻³²).
inline uint64_t dropout_threshold(double p) {
  const double t = std::ceil(p * 4294967296.0);
  return t <= 0 ? 0 : static_cast<uint64_t>(t);
}

// y[i] = keep_i ? x[i] · scale : 0 for i in [begin, end).   x, y: indexed by the global i (may alias)
// Four elements per Philox call: the block of i is i / 4.
template <class T>
inline void dropout_apply(const T* x, T* y, int64_t begin, int64_t end, uint64_t seed, uint64_t threshold, T scale) {
  int64_t i = begin;
  while (i < end) {
    const uint64_t block = static_cast<uint64_t>(i) >> 2;
    const Philox4x32 r = philox4x32_10(uint32_t(block), uint32_t(block >> 32), 0u, 0u, uint32_t(seed),
                                       uint32_t(seed >> 32));
    const int64_t stop = std::min<int64_t>(end, static_cast<int64_t>(block * 4 + 4));
    for (; i < stop; ++i) y[i] = r.v[i & 3] >= threshold ? x[i] * scale : T(0);
  }
}

}  // namespace transformer_core::kernels
