// Positional-encoding kernels on raw pointers: the sinusoidal table (Vaswani et al. 2017, §3.5;
// every tutorial), the rotary cos/sin table and the rotary rotation itself (Su et al.
// 2021, RoFormer; the RoPE section of the tutorials). One row per call; the ops above check sizes and parallelise
// over rows. Angles are computed in double and rounded once to T.
#pragma once

#include <cmath>
#include <cstdint>

namespace transformer_core::kernels {

// inv_freq[i] = base^(-2i / dim),  i = 0 .. num_freqs-1
// (the frequencies of both encodings: 1 / 10000^(2i/d_model) in the paper, HF Llama's inv_freq)
// inv_freq: [num_freqs]
inline void inverse_frequencies(double base, int64_t dim, int64_t num_freqs, double* inv_freq) {
  for (int64_t i = 0; i < num_freqs; ++i)
    inv_freq[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
}

// One row of the sinusoidal table, position `pos`:
//   PE(pos, 2i)   = sin(pos · inv_freq[i])
//   PE(pos, 2i+1) = cos(pos · inv_freq[i])
// For an odd d_model the last column (index d_model-1 = 2i, i = (d_model-1)/2) is a sin.
// inv_freq: [(d_model + 1) / 2]   row: [d_model]
template <class T>
inline void sinusoidal_row(double pos, const double* inv_freq, int64_t d_model, T* row) {
  for (int64_t j = 0; j < d_model; ++j) {
    const double angle = pos * inv_freq[j / 2];
    row[j] = static_cast<T>((j % 2 == 0) ? std::sin(angle) : std::cos(angle));
  }
}

// One row of the rotary table in the half-split layout (HF Llama: emb = cat(freqs, freqs)):
//   cos[i] = cos[i + half] = cos(pos · inv_freq[i]),   sin likewise,   i = 0 .. half-1
// inv_freq: [half]   cos, sin: [2 · half]
template <class T>
inline void rotary_row(double pos, const double* inv_freq, int64_t half, T* cos_row, T* sin_row) {
  for (int64_t i = 0; i < half; ++i) {
    const double angle = pos * inv_freq[i];
    const T c = static_cast<T>(std::cos(angle)), s = static_cast<T>(std::sin(angle));
    cos_row[i] = cos_row[i + half] = c;
    sin_row[i] = sin_row[i + half] = s;
  }
}

// Rotary rotation of one row, half-split layout (GPT-NeoX / HF Llama; the tutorials'
// apply_rotary_pos_emb):   y = x · cos + rotate_half(x) · sin,   rotate_half(x) = cat(-x2, x1)
//   y[i]        = x[i]        · cos[i]        - x[i + half] · sin[i]
//   y[i + half] = x[i + half] · cos[i + half] + x[i]        · sin[i + half]
// x: [2 · half] (in place)   cos, sin: [2 · half] (every entry used, exactly as the formula)
template <class T>
inline void rotary_half_row(T* x, int64_t half, const T* cos_row, const T* sin_row) {
  for (int64_t i = 0; i < half; ++i) {
    const T x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos_row[i] - x2 * sin_row[i];
    x[i + half] = x2 * cos_row[i + half] + x1 * sin_row[i + half];
  }
}

// Rotary rotation of one row, interleaved layout (GPT-J / Meta Llama: view_as_complex(x) · e^{iθ}):
// pair i = (x[2i], x[2i+1]) is rotated by θ_i:
//   y[2i]   = x[2i]   · cos[i] - x[2i+1] · sin[i]
//   y[2i+1] = x[2i+1] · cos[i] + x[2i]   · sin[i]
// x: [2 · half] (in place)   cos, sin: [half] (one value per frequency)
template <class T>
inline void rotary_interleaved_row(T* x, int64_t half, const T* cos_row, const T* sin_row) {
  for (int64_t i = 0; i < half; ++i) {
    const T a = x[2 * i], b = x[2 * i + 1], c = cos_row[i], s = sin_row[i];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = b * c + a * s;
  }
}

}  // namespace transformer_core::kernels
