// Bindings of the optimizer ops (ops/optim.hpp): in-place updates of numpy arrays, the GIL released
// around compute. Every array is checked here (dtype, size, C-contiguous, writeable where written):
// an update of a silent converted copy would be lost.
#include "common.hpp"
#include "transformer_core/ops/optim.hpp"

namespace transformer_core::bindings {

namespace {

// The data of `o` as T*, which must be a C-contiguous array of T with n elements (writeable if
// `write`); None → nullptr. Each message is built only when its check fails: an optimizer step calls
// this for every array of every parameter, and building them all (numpy's dtype names) cost more than
// the update of a small parameter.
template <class T>
T* flat(const py::object& o, int64_t n, bool write, const char* name) {
  if (o.is_none()) return nullptr;
  const auto fail = [&](const std::string& what) { throw std::invalid_argument(name + (": " + what)); };
  if (!py::isinstance<py::array>(o)) fail("expected a numpy array");
  py::array a = py::reinterpret_borrow<py::array>(o);
  if (!has_dtype<T>(a))
    fail("expected dtype " + std::string(py::str(py::dtype::of<T>())) + ", got " + std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style)) fail("expected a C-contiguous array");
  if (write && !a.writeable()) fail("expected a writeable array");
  if (n >= 0 && static_cast<int64_t>(a.size()) != n)
    fail("expected " + std::to_string(n) + " elements, got " + std::to_string(a.size()));
  return static_cast<T*>(a.mutable_data());
}

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();

  m.def(("adam_update" + sfx).c_str(),
        [](const py::array& param, const py::array& grad, const py::array& exp_avg, const py::array& exp_avg_sq,
           const py::object& max_exp_avg_sq, double lr, double beta1, double beta2, double eps, double weight_decay,
           bool decoupled_weight_decay, bool amsgrad, bool maximize, int64_t step) {
          const int64_t n = static_cast<int64_t>(param.size());
          T* p = flat<T>(param, n, true, "param");
          const T* g = flat<T>(grad, n, false, "grad");
          T* m1 = flat<T>(exp_avg, n, true, "exp_avg");
          T* m2 = flat<T>(exp_avg_sq, n, true, "exp_avg_sq");
          T* mx = flat<T>(max_exp_avg_sq, n, true, "max_exp_avg_sq");
          ops::AdamHyper h;
          h.lr = lr, h.beta1 = beta1, h.beta2 = beta2, h.eps = eps, h.weight_decay = weight_decay;
          h.decoupled_weight_decay = decoupled_weight_decay, h.amsgrad = amsgrad, h.maximize = maximize;
          h.step = step;
          CoreCall release;
          ops::adam_update(p, g, m1, m2, mx, n, h);
        },
        py::arg("param"), py::arg("grad"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("max_exp_avg_sq"),
        py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
        py::arg("decoupled_weight_decay"), py::arg("amsgrad"), py::arg("maximize"), py::arg("step"));

  m.def(("sgd_update" + sfx).c_str(),
        [](const py::array& param, const py::array& grad, const py::object& momentum_buffer, double lr,
           double momentum, double dampening, double weight_decay, bool nesterov, bool maximize, bool first_step) {
          const int64_t n = static_cast<int64_t>(param.size());
          T* p = flat<T>(param, n, true, "param");
          const T* g = flat<T>(grad, n, false, "grad");
          T* buf = flat<T>(momentum_buffer, n, true, "momentum_buffer");
          ops::SgdHyper h;
          h.lr = lr, h.momentum = momentum, h.dampening = dampening, h.weight_decay = weight_decay;
          h.nesterov = nesterov, h.maximize = maximize, h.first_step = first_step;
          CoreCall release;
          ops::sgd_update(p, g, buf, n, h);
        },
        py::arg("param"), py::arg("grad"), py::arg("momentum_buffer"), py::arg("lr"), py::arg("momentum"),
        py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"), py::arg("maximize"),
        py::arg("first_step"));

  m.def(("count_nonfinite" + sfx).c_str(),
        [](const py::array& x) {
          const T* p = flat<T>(x, -1, false, "x");
          const int64_t n = static_cast<int64_t>(x.size());
          CoreCall release;
          return ops::count_nonfinite(p, n);
        },
        py::arg("x"));

  m.def(("vector_norm" + sfx).c_str(),
        [](const py::array& x, double ord, bool power) {
          const T* p = flat<T>(x, -1, false, "x");
          const int64_t n = static_cast<int64_t>(x.size());
          CoreCall release;
          return ops::vector_norm(p, n, ord, power);
        },
        py::arg("x"), py::arg("ord"), py::arg("power"));
}

}  // namespace

void register_optim(py::module_& m) {
  register_dtype<float>(m);
  register_dtype<double>(m);
}

}  // namespace transformer_core::bindings
