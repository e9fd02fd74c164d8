#include "transformer_core/ops/positional.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/kernels/elementwise_backward.hpp"
#include "transformer_core/kernels/positional.hpp"
#include "transformer_core/ops/backward.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

namespace {
void check_nonnegative(int64_t v, const char* name) {
  if (v < 0) throw std::invalid_argument(std::string(name) + ": expected a size >= 0, got " + std::to_string(v));
}
void check_base(double base) {
  if (!(base > 0.0) || !std::isfinite(base))
    throw std::invalid_argument("base: expected a finite value > 0, got " + std::to_string(base));
}
// Rows per task so that a task holds ~16K elements: small tables stay serial.
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }
}  // namespace

template <class T>
void sinusoidal_positional_encoding(T* out, int64_t max_len, int64_t d_model, double base) {
  check_nonnegative(max_len, "max_len");
  if (d_model < 1) throw std::invalid_argument("d_model: expected a size >= 1, got " + std::to_string(d_model));
  check_base(base);
  // inv_freq: [ceil(d_model / 2)], one frequency per (sin, cos) pair; the last pair of an odd
  // d_model has only its sin column.
  std::vector<double> inv_freq(static_cast<size_t>((d_model + 1) / 2));
  kernels::inverse_frequencies(base, d_model, static_cast<int64_t>(inv_freq.size()), inv_freq.data());
  kernels::parallel_for(0, max_len, row_grain(d_model), [&](int64_t b, int64_t e) {
    for (int64_t pos = b; pos < e; ++pos)
      kernels::sinusoidal_row(static_cast<double>(pos), inv_freq.data(), d_model, out + pos * d_model);
  });
}

template <class T>
void rotary_cos_sin(T* cos, T* sin, int64_t seq_len, int64_t head_dim, double base, int64_t offset) {
  check_nonnegative(seq_len, "seq_len");
  check_nonnegative(offset, "offset");
  checked_sum(offset, seq_len, "offset + seq_len");  // the last position must be an int64
  if (head_dim < 2 || head_dim % 2 != 0)
    throw std::invalid_argument("head_dim: expected an even size >= 2, got " + std::to_string(head_dim));
  check_base(base);
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));  // [head_dim / 2]
  kernels::inverse_frequencies(base, head_dim, half, inv_freq.data());
  kernels::parallel_for(0, seq_len, row_grain(2 * head_dim), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      kernels::rotary_row(static_cast<double>(offset + r), inv_freq.data(), half, cos + r * head_dim,
                          sin + r * head_dim);
  });
}

template <class T>
void apply_rotary(T* x, int64_t rows, int64_t head_dim, const T* cos, const T* sin, int64_t table_rows,
                  RotaryLayout layout) {
  check_nonnegative(rows, "apply_rotary: rows");
  if (head_dim < 2 || head_dim % 2 != 0)
    throw std::invalid_argument("apply_rotary: head_dim must be even and >= 2, got " + std::to_string(head_dim));
  if (rows == 0) return;
  if (table_rows < 1 || rows % table_rows != 0)
    throw std::invalid_argument("apply_rotary: rows (" + std::to_string(rows) + ") must be a multiple of the " +
                                "cos/sin table's rows (" + std::to_string(table_rows) + ")");
  const int64_t half = head_dim / 2;
  const int64_t width = layout == RotaryLayout::kHalf ? head_dim : half;  // table row width
  kernels::parallel_for(0, rows, row_grain(head_dim), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = r % table_rows;
      if (layout == RotaryLayout::kHalf)
        kernels::rotary_half_row(x + r * head_dim, half, cos + t * width, sin + t * width);
      else
        kernels::rotary_interleaved_row(x + r * head_dim, half, cos + t * width, sin + t * width);
    }
  });
}

namespace {

// The rotation of `heads` heads of every row by the angles of the row's position (inverse: by minus
// them, the backward — a rotation's transpose is its inverse); shared by apply_rotary_heads and
// rotary_heads_backward, whose argument checks name `op`.
template <class T>
void rotate_heads(const char* op, bool inverse, T* x, int64_t rows, int64_t ld, int64_t col0, int64_t heads,
                  int64_t head_dim, const int64_t* positions, const T* cos, const T* sin, int64_t table_rows,
                  RotaryLayout layout) {
  check_nonnegative(rows, (std::string(op) + ": rows").c_str());
  if (head_dim < 2 || head_dim % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": head_dim must be even and >= 2, got " + std::to_string(head_dim));
  for (int64_t r = 0; r < rows; ++r)
    if (positions[r] < 0 || positions[r] >= table_rows)
      throw std::invalid_argument("position_ids: position " + std::to_string(positions[r]) + " at flat index " +
                                  std::to_string(r) + " is outside the rotary table [0, " +
                                  std::to_string(table_rows) + ")");
  const int64_t half = head_dim / 2;
  const int64_t width = layout == RotaryLayout::kHalf ? head_dim : half;
  const bool half_layout = layout == RotaryLayout::kHalf;
  kernels::parallel_for(0, rows, row_grain(heads * head_dim), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* c = cos + positions[r] * width;
      const T* s = sin + positions[r] * width;
      for (int64_t h = 0; h < heads; ++h) {
        T* xh = x + r * ld + col0 + h * head_dim;
        if (inverse)
          half_layout ? kernels::rotary_half_row_backward(xh, half, c, s)
                      : kernels::rotary_interleaved_row_backward(xh, half, c, s);
        else
          half_layout ? kernels::rotary_half_row(xh, half, c, s) : kernels::rotary_interleaved_row(xh, half, c, s);
      }
    }
  });
}

}  // namespace

template <class T>
void apply_rotary_heads(T* x, int64_t rows, int64_t ld, int64_t col0, int64_t heads, int64_t head_dim,
                        const int64_t* positions, const T* cos, const T* sin, int64_t table_rows,
                        RotaryLayout layout) {
  rotate_heads("apply_rotary_heads", false, x, rows, ld, col0, heads, head_dim, positions, cos, sin, table_rows,
               layout);
}

// Declared in ops/backward.hpp; defined here, beside the forward it inverts.
template <class T>
void rotary_heads_backward(T* d, int64_t rows, int64_t ld, int64_t col0, int64_t heads, int64_t head_dim,
                           const int64_t* positions, const T* cos, const T* sin, int64_t table_rows,
                           RotaryLayout layout) {
  rotate_heads("rotary_heads_backward", true, d, rows, ld, col0, heads, head_dim, positions, cos, sin, table_rows,
               layout);
}

RotaryLayout parse_rotary_layout(const std::string& name) {
  if (name == "half") return RotaryLayout::kHalf;
  if (name == "interleaved") return RotaryLayout::kInterleaved;
  throw std::invalid_argument("layout: expected 'half' or 'interleaved', got '" + name + "'");
}

#define TC_INSTANTIATE(T)                                                                         \
  template void sinusoidal_positional_encoding<T>(T*, int64_t, int64_t, double);                  \
  template void rotary_cos_sin<T>(T*, T*, int64_t, int64_t, double, int64_t);                     \
  template void apply_rotary<T>(T*, int64_t, int64_t, const T*, const T*, int64_t, RotaryLayout);         \
  template void apply_rotary_heads<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, const int64_t*,     \
                                      const T*, const T*, int64_t, RotaryLayout);                         \
  template void rotary_heads_backward<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, const int64_t*,  \
                                         const T*, const T*, int64_t, RotaryLayout);
TC_INSTANTIATE(float)
TC_INSTANTIATE(double)
#undef TC_INSTANTIATE

}  // namespace transformer_core::ops
