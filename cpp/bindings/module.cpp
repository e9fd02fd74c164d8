// transformer_core._core: the compiled half of the package. Private: the Python package re-exports
// what users need, with docstrings, argument checking and array conversion.
#include <cblas.h>
#include <pthread.h>

#include <memory>

#include "common.hpp"
#include "transformer_core/kernels/blas.hpp"
#include "transformer_core/kernels/packed_weights.hpp"
#include "transformer_core/kernels/parallel.hpp"

#ifndef TC_VERSION
#define TC_VERSION "dev"
#endif

PYBIND11_MODULE(_core, m) {
  m.doc() = "transformer_core C++ core (private; use the transformer_core package)";
  m.attr("__version__") = TC_VERSION;
  pthread_atfork(nullptr, nullptr, transformer_core::bindings::renew_weights_format_locks_in_child);  // common.hpp
  m.def("get_num_threads", &transformer_core::get_num_threads, "Threads used by the C++ core.");
  m.def("set_num_threads", &transformer_core::set_num_threads, py::arg("n"),
        "Sets the threads used by the C++ core, process-wide.");
  m.attr("max_num_threads") = transformer_core::kMaxThreads;
  m.def("set_fixed_teams", &transformer_core::set_fixed_teams, py::arg("fixed"),
        "For bench/threads.py: False sizes each parallel region's team to its tasks, as before "
        "2026-11-26 (kernels/parallel.hpp). Returns the previous setting.");
  m.def("physical_memory_bytes", &transformer_core::ops::physical_memory_bytes,
        "This machine's physical memory: the bound of every allocation check.");
  m.def("blas_config", []() { return std::string(openblas_get_config()); }, "OpenBLAS build configuration.");
  m.def("blas_info", &transformer_core::kernels::blas::info, "The BLAS in use: library, version, kernels.");
  m.def("use_mkl", &transformer_core::kernels::blas::use_mkl, py::arg("path"),
        "Routes every matrix product to MKL's libmkl_rt at path (sequential, CNR AUTO,STRICT); '' or why not.");
  m.def("use_openblas", &transformer_core::kernels::blas::use_openblas, "Routes every matrix product to OpenBLAS.");
  // `with _core.PackedWeightScope():` on one thread: its products pack each weight once
  // (kernels/packed_weights.hpp); SentenceEncoder.encode runs its batches inside one.
  struct PackedWeightScope {
    std::unique_ptr<transformer_core::kernels::PackedWeightScope> scope;
  };
  py::class_<PackedWeightScope>(m, "PackedWeightScope")
      .def(py::init<>())
      .def("__enter__",
           [](PackedWeightScope& self) {
             if (self.scope) throw std::runtime_error("PackedWeightScope: already entered");
             self.scope = std::make_unique<transformer_core::kernels::PackedWeightScope>();
           })
      .def("__exit__", [](PackedWeightScope& self, py::args) { self.scope.reset(); });
  transformer_core::bindings::register_functional(m);
  transformer_core::bindings::register_layers(m);
#ifndef TC_OPS_LAYERS_ONLY  // the reduced core of .ci/sanitize (CMake option TC_OPS_LAYERS_ONLY)
  transformer_core::bindings::register_models(m);
#endif
  transformer_core::bindings::register_positional(m);
  transformer_core::bindings::register_backward(m);
#ifndef TC_OPS_LAYERS_ONLY
  transformer_core::bindings::register_optim(m);
#endif
  transformer_core::bindings::register_quantization(m);
  transformer_core::bindings::register_quantized_layers(m);  // after register_layers / register_models
  transformer_core::bindings::register_training(m);  // after layers and models: adds to their classes
}
