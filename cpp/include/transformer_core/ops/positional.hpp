// Positional-encoding ops: check the sizes, then fill / rotate rows in parallel.
// Every op takes raw, C-contiguous buffers and throws std::invalid_argument (the bindings turn it
// into Python's ValueError).
//
//   sinusoidal:  PE(pos, 2i) = sin(pos / base^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / base^(2i/d_model))
//                (Vaswani et al. 2017, §3.5; every tutorial)
//   rotary:      RoPE(x, m) = x · cos(m θ) + rotate_half(x) · sin(m θ),  θ_i = base^(-2i/head_dim)
//                (Su et al. 2021, RoFormer; the RoPE section of the tutorials)
#pragma once

#include <cstdint>
#include <string>

namespace transformer_core::ops {

enum class RotaryLayout {
  kHalf,         // pairs (x[i], x[i + D/2]): GPT-NeoX, HF Llama; cos/sin tables [rows, D]
  kInterleaved,  // pairs (x[2i], x[2i+1]): GPT-J, Meta Llama; cos/sin tables [rows, D/2]
};

// out: [max_len, d_model], row pos = PE(pos, ·). Odd d_model: the last column is a sin.
template <class T>
void sinusoidal_positional_encoding(T* out, int64_t max_len, int64_t d_model, double base);

// cos, sin: [seq_len, head_dim], half-split layout, positions offset .. offset + seq_len - 1.
// head_dim must be even.
template <class T>
void rotary_cos_sin(T* cos, T* sin, int64_t seq_len, int64_t head_dim, double base, int64_t offset);

// Rotates x in place.  x: [rows, head_dim];  cos, sin: [table_rows, W] with W = head_dim (kHalf)
// or head_dim / 2 (kInterleaved); row r of x uses table row r % table_rows (so a [L, W] table
// serves x viewed as [..., L, head_dim]). rows must be a multiple of table_rows.
template <class T>
void apply_rotary(T* x, int64_t rows, int64_t head_dim, const T* cos, const T* sin, int64_t table_rows,
                  RotaryLayout layout);

// Rotates, in every row r of x (viewed as [rows, ld]), the `heads` heads of head_dim values that
// start at column col0, by the angles of position positions[r]:   cos, sin: [table_rows, W]
// (W as for apply_rotary). How an attention layer rotates q and k inside its projected [N·L, ·]
// buffer, each token at its own position (a KV cache's offset, left padding). Throws if a position
// is outside [0, table_rows).
template <class T>
void apply_rotary_heads(T* x, int64_t rows, int64_t ld, int64_t col0, int64_t heads, int64_t head_dim,
                        const int64_t* positions, const T* cos, const T* sin, int64_t table_rows,
                        RotaryLayout layout);

// Parses "half" or "interleaved"; throws otherwise.
RotaryLayout parse_rotary_layout(const std::string& name);

}  // namespace transformer_core::ops
