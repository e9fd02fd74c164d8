// Shared helpers of the bindings: numpy views for the C++ core, masks from numpy arrays.
// The Python layer has already validated shapes and dtypes; these only read buffers and strides.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/layers/module.hpp"
#include "transformer_core/layers/multihead_attention.hpp"

namespace py = pybind11;

namespace transformer_core::bindings {

template <class T>
using CArray = py::array_t<T, py::array::c_style>;

// Element strides of a numpy array (numpy gives bytes).
inline std::vector<int64_t> element_strides(const py::array& a) {
  std::vector<int64_t> s(static_cast<size_t>(a.ndim()));
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s[static_cast<size_t>(i)] = a.strides(i) / a.itemsize();
  return s;
}

inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// Masks given from Python, each None or an array already broadcast to its documented shape:
//   bool_mask  (N, H, L, S) numpy bool, any strides      float_mask (N, H, L, S) of T, any strides
//   key_mask   (N, S)       numpy bool, any strides
template <class T>
layers::MaskArgs<T> make_masks(const py::object& bool_mask, const py::object& float_mask, const py::object& key_mask,
                               bool is_causal, int64_t causal_offset) {
  layers::MaskArgs<T> m;
  if (!bool_mask.is_none()) {
    py::array a = bool_mask.cast<py::array>();
    require(a.ndim() == 4 && a.itemsize() == 1, "bool_mask: expected a 4-D bool array");
    m.bool_mask = static_cast<const uint8_t*>(a.data());
    auto s = element_strides(a);
    for (int i = 0; i < 4; ++i) m.bool_mask_strides[i] = s[static_cast<size_t>(i)];
  }
  if (!float_mask.is_none()) {
    py::array a = float_mask.cast<py::array>();
    require(a.ndim() == 4 && a.dtype().is(py::dtype::of<T>()), "float_mask: expected a 4-D array of the input dtype");
    m.float_mask = static_cast<const T*>(a.data());
    auto s = element_strides(a);
    for (int i = 0; i < 4; ++i) m.float_mask_strides[i] = s[static_cast<size_t>(i)];
  }
  if (!key_mask.is_none()) {
    py::array a = key_mask.cast<py::array>();
    require(a.ndim() == 2 && a.itemsize() == 1, "key_mask: expected a 2-D bool array");
    m.key_mask = static_cast<const uint8_t*>(a.data());
    auto s = element_strides(a);
    m.key_mask_stride_n = s[0];
    m.key_mask_stride_s = s[1];
  }
  m.is_causal = is_causal;
  m.causal_offset = causal_offset;
  return m;
}

// state_dict plumbing shared by every bound module.
template <class T>
py::list parameter_shapes(const layers::Module<T>& m) {
  py::list out;
  for (const auto& p : m.parameters()) out.append(py::make_tuple(p.name, py::tuple(py::cast(p.shape))));
  return out;
}

template <class T>
py::array_t<T> get_parameter(const layers::Module<T>& m, const std::string& name) {
  const auto& p = m.parameter(name);
  std::vector<py::ssize_t> shape(p.shape.begin(), p.shape.end());
  py::array_t<T> out(shape);
  std::copy(p.data, p.data + out.size(), out.mutable_data());
  return out;
}

template <class T>
void set_parameter(layers::Module<T>& m, const std::string& name, const CArray<T>& value) {
  const auto& p = m.parameter(name);
  require(static_cast<size_t>(value.ndim()) == p.shape.size(), name + ": wrong rank");
  for (size_t i = 0; i < p.shape.size(); ++i)
    require(value.shape(static_cast<py::ssize_t>(i)) == p.shape[i], name + ": wrong shape");
  std::copy(value.data(), value.data() + value.size(), p.data);
}

template <class T>
const char* dtype_suffix();
template <>
inline const char* dtype_suffix<float>() { return "_f32"; }
template <>
inline const char* dtype_suffix<double>() { return "_f64"; }

// Adds parameter_shapes / get_parameter / set_parameter to a bound Module subclass.
template <class T, class Class>
void def_state(Class& cls) {
  cls.def("parameter_shapes", [](const layers::Module<T>& m) { return parameter_shapes<T>(m); })
      .def("get_parameter", [](const layers::Module<T>& m, const std::string& n) { return get_parameter<T>(m, n); })
      .def("set_parameter",
           [](layers::Module<T>& m, const std::string& n, const CArray<T>& v) { set_parameter<T>(m, n, v); });
}

void register_functional(py::module_& m);
void register_layers(py::module_& m);
void register_models(py::module_& m);
void register_positional(py::module_& m);
void register_quantization(py::module_& m);

}  // namespace transformer_core::bindings
