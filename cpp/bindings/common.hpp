// Shared helpers of the bindings: numpy views for the C++ core, masks from numpy arrays, the
// state_dict plumbing of every bound module. The Python layer has already validated shapes and
// dtypes (see _validation.py); these only read buffers and strides, and the ops check sizes.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "transformer_core/kernels/attention_masks.hpp"
#include "transformer_core/kernels/workspace.hpp"
#include "transformer_core/layers/module.hpp"
#include "transformer_core/ops/checks.hpp"

namespace py = pybind11;

namespace transformer_core::bindings {

template <class T>
using CArray = py::array_t<T, py::array::c_style>;

// Calls that run a module (a forward, a backward, a training step) release the GIL, and quantizing
// a module in place frees the float32 storage its layers read (Linear / Embedding::set_quantized).
// One process-wide lock keeps the two apart: a module call holds it shared (calls still run side by
// side); a change of the weights' format holds it exclusive, and the GIL while it changes them, so
// it waits for the calls in flight and no call starts before it is done. No thread waits for a lock
// while holding the GIL. (Values copied into the same storage, as load_state_dict's, free nothing
// and take no lock.)
//
// A change waiting for the lock holds the turnstile, which every call passes before taking the
// lock shared: calls that start meanwhile wait behind the change instead of keeping the lock shared
// for ever (glibc's shared_mutex lets new readers pass a waiting writer).
struct WeightsFormatLocks {
  std::shared_mutex lock;
  std::mutex turnstile;
};
inline WeightsFormatLocks*& weights_format_locks_slot() {
  static WeightsFormatLocks* locks = new WeightsFormatLocks;
  return locks;
}
inline WeightsFormatLocks& weights_format_locks() { return *weights_format_locks_slot(); }
// A process forked while another thread held the locks has them held by a thread that does not
// exist there: the child takes fresh ones (the old ones are left as they are; module.cpp registers
// this).
inline void renew_weights_format_locks_in_child() { weights_format_locks_slot() = new WeightsFormatLocks; }

// In place of py::gil_scoped_release in a binding that computes: the GIL released for the call, and
// at its end, before the GIL is taken back, the calling thread's scratch buffers above
// kernels::kWorkspaceKeepBytes freed (workspace.hpp), so that one large call does not keep its size.
class CoreCall {
 public:
  CoreCall() = default;
  CoreCall(const CoreCall&) = delete;
  CoreCall& operator=(const CoreCall&) = delete;
  ~CoreCall() { kernels::release_large_workspaces(); }

 private:
  py::gil_scoped_release release_;
};

// In place of py::gil_scoped_release in a binding that runs a module: the GIL released, the
// turnstile passed, then the lock taken shared; on the way out the large scratch buffers are freed
// (as CoreCall's), then the lock is dropped before the GIL is taken back.
class ModuleCall {
 public:
  ModuleCall() : lock_(passed_turnstile().lock) {}
  ModuleCall(const ModuleCall&) = delete;
  ModuleCall& operator=(const ModuleCall&) = delete;
  ~ModuleCall() { kernels::release_large_workspaces(); }

 private:
  static WeightsFormatLocks& passed_turnstile() {
    WeightsFormatLocks& locks = weights_format_locks();
    std::lock_guard<std::mutex> pass(locks.turnstile);
    return locks;
  }
  py::gil_scoped_release release_;  // first: released before the locks are taken, taken back after
  std::shared_lock<std::shared_mutex> lock_;
};

// Held by a binding that changes the format of a module's weights: the locks are waited for with
// the GIL released (other Python threads run meanwhile), then the change runs with the GIL too.
class WeightsFormatChange {
 public:
  WeightsFormatChange() {
    py::gil_scoped_release release;
    WeightsFormatLocks& locks = weights_format_locks();
    std::lock_guard<std::mutex> turnstile(locks.turnstile);  // calls that start now wait
    lock_ = std::unique_lock<std::shared_mutex>(locks.lock);  // for the calls in flight
  }

 private:
  std::unique_lock<std::shared_mutex> lock_;
};

inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// Element strides of a numpy array (numpy gives bytes; a stride that is not a whole number of
// elements, a record array's field, is refused: the Python side copies such arrays first).
inline std::vector<int64_t> element_strides(const py::array& a, const std::string& name) {
  std::vector<int64_t> s(static_cast<size_t>(a.ndim()));
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    require(a.strides(i) % a.itemsize() == 0, name + ": expected strides of whole elements, got " +
                                                  std::to_string(a.strides(i)) + " bytes for items of " +
                                                  std::to_string(a.itemsize()));
    s[static_cast<size_t>(i)] = a.strides(i) / a.itemsize();
  }
  return s;
}

// True when `a` holds T in native byte order. Compared by value, never by identity: numpy can hold
// several equal dtype objects (an unpickled array, such as one a Dask worker received, has its own).
template <class T>
bool has_dtype(const py::array& a) {
  return a.dtype().equal(py::dtype::of<T>());
}

// A 4-D view [d0, d1, d2, d3] with a contiguous last dim, as the attention kernels and their
// backward read it (strides in elements; an empty array is accepted whatever numpy made its strides).
template <class T>
struct View4 {
  const T* data;
  int64_t shape[4];
  int64_t stride[3];
};

template <class T>
View4<T> view4(const py::array& a, const char* name) {
  require(a.ndim() == 4, std::string(name) + ": expected a 4-D array");
  require(has_dtype<T>(a), std::string(name) + ": dtype differs from query's");
  auto s = element_strides(a, name);
  require(a.size() == 0 || a.shape(3) <= 1 || s[3] == 1, std::string(name) + ": the last dim must be contiguous");
  return View4<T>{static_cast<const T*>(a.data()), {a.shape(0), a.shape(1), a.shape(2), a.shape(3)}, {s[0], s[1], s[2]}};
}

// A new array of `shape` for an op's output, after checking (naming `name`) that its size is
// representable and fits in this machine's memory: the code that allocates checks the size.
template <class T>
py::array_t<T> new_array(const std::vector<int64_t>& shape, const std::string& name) {
  int64_t count = 1;
  for (int64_t d : shape) count = ops::checked_product({count, d}, name);
  ops::require_allocatable(count, static_cast<int64_t>(sizeof(T)), name);
  return py::array_t<T>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

// Pointer to the data of an optional array (None -> nullptr). The array must already be C-contiguous
// of T: a converted copy would be a temporary, freed before the pointer is read.
template <class T>
const T* optional_data(const py::object& o) {
  if (o.is_none()) return nullptr;
  if (!py::isinstance<CArray<T>>(o)) {
    std::string got = std::string(py::str(py::type::of(o)));
    if (py::isinstance<py::array>(o)) {
      const auto a = o.cast<py::array>();
      got = std::string(py::str(a.dtype())) + (a.flags() & py::array::c_style ? "" : ", not C-contiguous");
    }
    throw std::invalid_argument("an optional array (bias, weight, ids, key, value): expected a C-contiguous array of " +
                                std::string(py::str(py::dtype::of<T>())) + ", got " + got);
  }
  return static_cast<const T*>(o.cast<py::array>().data());
}

// Masks given from Python, each None or an array already broadcast to its documented shape:
//   bool_mask  (N, H, L, S) numpy bool, any strides      float_mask (N, H, L, S) of T, any strides
//   key_mask   (N, S)       numpy bool, any strides
template <class T>
kernels::AttentionMasks<T> make_masks(const py::object& bool_mask, const py::object& float_mask,
                                      const py::object& key_mask, bool is_causal, int64_t causal_offset) {
  kernels::AttentionMasks<T> m;
  if (!bool_mask.is_none()) {
    py::array a = bool_mask.cast<py::array>();
    require(a.ndim() == 4 && a.itemsize() == 1, "bool_mask: expected a 4-D bool array");
    m.bool_mask = static_cast<const uint8_t*>(a.data());
    auto s = element_strides(a, "attn_mask");
    for (int i = 0; i < 4; ++i) m.bool_mask_strides[i] = s[static_cast<size_t>(i)];
  }
  if (!float_mask.is_none()) {
    py::array a = float_mask.cast<py::array>();
    require(a.ndim() == 4 && has_dtype<T>(a), "float_mask: expected a 4-D array of the input dtype");
    m.float_mask = static_cast<const T*>(a.data());
    auto s = element_strides(a, "attn_mask");
    for (int i = 0; i < 4; ++i) m.float_mask_strides[i] = s[static_cast<size_t>(i)];
  }
  if (!key_mask.is_none()) {
    py::array a = key_mask.cast<py::array>();
    require(a.ndim() == 2 && a.itemsize() == 1, "key_mask: expected a 2-D bool array");
    m.key_mask = static_cast<const uint8_t*>(a.data());
    auto s = element_strides(a, "key_mask");
    m.key_mask_stride_n = s[0];
    m.key_mask_stride_s = s[1];
  }
  m.is_causal = is_causal;
  m.causal_offset = causal_offset;
  return m;
}

template <class T>
const char* dtype_suffix();
template <>
inline const char* dtype_suffix<float>() { return "_f32"; }
template <>
inline const char* dtype_suffix<double>() { return "_f64"; }

// A weight held quantized (layers/quantized_matrix.hpp) has no fp32 storage to write or view.
template <class T>
void require_not_quantized(const layers::ParamRef<T>& p, const std::string& name) {
  require(!layers::Module<T>::quantized(p), name + ": the weight is held quantized (" + layers::Module<T>::storage(p) +
                                                "); it can be read (dequantized) but not written or viewed");
}

// The state_dict plumbing of Module<T>, bound once as the base class of every layer and model:
//   parameter_shapes() -> [(name, shape)]        get_parameter(name) -> copy
//   set_parameter(name, value)                   parameter_view(name) -> zero-copy view (lives
//                                                with the module)
template <class T>
void register_module_base(py::module_& m) {
  using layers::Module;
  py::class_<Module<T>>(m, (std::string("Module") + dtype_suffix<T>()).c_str())
      .def("parameter_shapes",
           [](const Module<T>& self) {
             py::list out;
             for (const auto& p : self.parameters()) out.append(py::make_tuple(p.name, py::tuple(py::cast(p.shape))));
             return out;
           })
      .def(
          "get_parameter",
          [](const Module<T>& self, const std::string& name) {
            const auto& p = self.parameter(name);
            py::array_t<T> out(std::vector<py::ssize_t>(p.shape.begin(), p.shape.end()));
            Module<T>::read_parameter(p, out.mutable_data());  // dequantized when held quantized
            return out;
          },
          py::arg("name"))
      .def(
          "set_parameter",
          [](Module<T>& self, const std::string& name, const CArray<T>& value) {
            const auto& p = self.parameter(name);
            require_not_quantized(p, name);
            require(static_cast<size_t>(value.ndim()) == p.shape.size(), name + ": wrong rank");
            for (size_t i = 0; i < p.shape.size(); ++i)
              require(value.shape(static_cast<py::ssize_t>(i)) == p.shape[i], name + ": wrong shape");
            std::copy(value.data(), value.data() + value.size(), p.data);
          },
          py::arg("name"), py::arg("value"))
      .def(
          "parameter_view",
          [](py::object self, const std::string& name) {
            const auto& p = self.cast<const Module<T>&>().parameter(name);
            require_not_quantized(p, name);
            // The view's base: a capsule that keeps the module alive and, when Python frees the
            // view, tells the storage's owner (a storage quantized meanwhile is freed then).
            struct ViewBase {
              py::object module;
              Module<T>* owner;
              std::string owner_name;
            };
            auto* base = new ViewBase{self, p.owner, p.owner_name};
            Module<T>::view_opened(p);
            py::capsule keeper(base, [](void* ptr) {
              auto* b = static_cast<ViewBase*>(ptr);
              if (b->owner != nullptr) Module<T>::view_closed(b->owner, b->owner_name);
              delete b;  // and with it the module reference
            });
            return py::array_t<T>(std::vector<py::ssize_t>(p.shape.begin(), p.shape.end()), p.data, keeper);
          },
          py::arg("name"));
}

void register_functional(py::module_& m);
void register_positional(py::module_& m);
void register_layers(py::module_& m);
void register_models(py::module_& m);
void register_backward(py::module_& m);
void register_optim(py::module_& m);
void register_quantization(py::module_& m);
void register_training(py::module_& m);
void register_quantized_layers(py::module_& m);

}  // namespace transformer_core::bindings
