// transformer_core._core: the compiled half of the package. Private: the Python package re-exports
// what users need, with docstrings, argument checking and array conversion.
#include <cblas.h>

#include "common.hpp"
#include "transformer_core/kernels/parallel.hpp"

#ifndef TC_VERSION
#define TC_VERSION "dev"
#endif

PYBIND11_MODULE(_core, m) {
  m.doc() = "transformer_core C++ core (private; use the transformer_core package)";
  m.attr("__version__") = TC_VERSION;
  m.def("get_num_threads", &transformer_core::get_num_threads, "Threads used by the C++ core.");
  m.def("set_num_threads", &transformer_core::set_num_threads, py::arg("n"), "Sets the threads used by the C++ core.");
  m.def("blas_config", []() { return std::string(openblas_get_config()); }, "OpenBLAS build configuration.");
  transformer_core::bindings::register_functional(m);
  transformer_core::bindings::register_layers(m);
  transformer_core::bindings::register_models(m);
  transformer_core::bindings::register_positional(m);
  transformer_core::bindings::register_backward(m);
  transformer_core::bindings::register_optim(m);
  transformer_core::bindings::register_quantization(m);
  transformer_core::bindings::register_quantized_layers(m);  // after register_layers / register_models
}
