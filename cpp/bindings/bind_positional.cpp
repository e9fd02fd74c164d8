// Bindings of the positional-encoding ops: numpy in, numpy out, the GIL released around compute.
// The Python layer (positional.py) has validated types and dtypes and made the arrays contiguous;
// the ops check sizes and values.
#include "common.hpp"
#include "transformer_core/ops/positional.hpp"

namespace transformer_core::bindings {

namespace {

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();

  // -> pe [max_len, d_model]
  m.def(
      ("sinusoidal_positional_encoding" + sfx).c_str(),
      [](int64_t max_len, int64_t d_model, double base) {
        auto pe = new_array<T>({max_len, d_model}, "(max_len, d_model)");
        T* p = pe.mutable_data();
        {
          CoreCall release;
          ops::sinusoidal_positional_encoding(p, max_len, d_model, base);
        }
        return pe;
      },
      py::arg("max_len"), py::arg("d_model"), py::arg("base"));

  // -> (cos [seq_len, head_dim], sin [seq_len, head_dim]), half-split layout
  m.def(
      ("rotary_cos_sin" + sfx).c_str(),
      [](int64_t seq_len, int64_t head_dim, double base, int64_t offset) {
        // both tables together against memory, before the first is allocated (each alone may fit)
        ops::require_weights({{2, seq_len, head_dim}}, static_cast<int64_t>(sizeof(T)), "(seq_len, head_dim)");
        auto cos = new_array<T>({seq_len, head_dim}, "(seq_len, head_dim)");
        auto sin = new_array<T>({seq_len, head_dim}, "(seq_len, head_dim)");
        T* c = cos.mutable_data();
        T* s = sin.mutable_data();
        {
          CoreCall release;
          ops::rotary_cos_sin(c, s, seq_len, head_dim, base, offset);
        }
        return py::make_tuple(cos, sin);
      },
      py::arg("seq_len"), py::arg("head_dim"), py::arg("base"), py::arg("offset"));

  // x [..., D] (rows = size / D), cos/sin [table_rows, W] (W = D for "half", D/2 for "interleaved")
  // -> rotated copy of x, same shape
  m.def(
      ("apply_rotary" + sfx).c_str(),
      [](const CArray<T>& x, const CArray<T>& cos, const CArray<T>& sin, const std::string& layout_name) {
        const auto layout = ops::parse_rotary_layout(layout_name);
        const int64_t D = x.shape(x.ndim() - 1);
        const int64_t rows = static_cast<int64_t>(x.size()) / D;
        py::array_t<T> y(x.request().shape);
        std::copy(x.data(), x.data() + x.size(), y.mutable_data());
        T* yp = y.mutable_data();
        const int64_t table_rows = cos.shape(0);
        {
          CoreCall release;
          ops::apply_rotary(yp, rows, D, cos.data(), sin.data(), table_rows, layout);
        }
        return y;
      },
      py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("layout"));
}

}  // namespace

void register_positional(py::module_& m) {
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
