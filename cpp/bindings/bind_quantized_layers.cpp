// Bindings of the quantized layers (layers/quantization.hpp): methods added to the float32 Module
// base class (so every layer and model has them) and to the decoder models. The Python layer
// (quantization.py, llama.py) checks the arguments; the GIL is released around quantization.
#include <algorithm>

#include "common.hpp"
#include "transformer_core/kernels/quant/formats.hpp"
#include "transformer_core/layers/embedding.hpp"
#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/quantization.hpp"
#ifndef TC_OPS_LAYERS_ONLY
#include "transformer_core/models/decoder.hpp"
#endif

namespace transformer_core::bindings {

namespace {

using layers::Module;

// A shared_ptr that keeps a Python object (a buffer's exporter: a numpy memmap view, bytes) alive
// for as long as a C++ layer reads its memory; released with the GIL held.
std::shared_ptr<const void> keep_alive(const py::object& o) {
  auto* held = new py::object(o);
  return std::shared_ptr<const void>(held, [](const void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<const py::object*>(p);
  });
}

}  // namespace

void register_quantized_layers(py::module_& m) {
  namespace q = kernels::quant;
  m.def("defer_weight_init", [](bool on) { layers::weight_init_deferred() = on; }, py::arg("on"),
        "Layers built on this thread while on leave their weight matrices uninitialised (see module.hpp).");
  auto module_f32 = py::reinterpret_borrow<py::class_<Module<float>>>(py::type::of<Module<float>>());
  module_f32
      // Every fp32 Linear inside -> int8 per output channel, but those whose weight is named in
      // keep_float; returns how many were converted.
      .def(
          "quantize_int8",
          [](Module<float>& self, const std::vector<std::string>& keep_float) {
            WeightsFormatChange change;  // frees the float32 weights a call in another thread may read
            return layers::quantize_linears_int8(self, keep_float);
          },
          py::arg("keep_float") = std::vector<std::string>{})
      // tensors: [(name, ggml_type "Q8_0" | "Q4_0" | "Q4_1", blocks: a C-contiguous uint8 buffer)]
      .def(
          "load_gguf_weights",
          [](Module<float>& self, const std::vector<std::tuple<std::string, std::string, py::buffer>>& tensors,
             bool check_only) {
            std::vector<layers::GgufTensor> ts;
            for (const auto& [name, type, blocks] : tensors) {
              py::buffer_info info = blocks.request();
              require(info.itemsize == 1, name + ": blocks: expected a buffer of bytes (uint8)");
              py::ssize_t expected = 1;
              for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
                const auto i = static_cast<size_t>(d);
                require(info.shape[i] <= 1 || info.strides[i] == expected, name + ": blocks: expected a C-contiguous buffer");
                expected *= info.shape[i];
              }
              ts.push_back({name, q::parse_ggml_type(type), static_cast<const uint8_t*>(info.ptr),
                            static_cast<size_t>(info.size), keep_alive(blocks)});
            }
            WeightsFormatChange change;
            layers::load_gguf_weights(self, ts, check_only);
          },
          py::arg("tensors"), py::arg("check_only") = false)
      // Q8 activation blocks (true) or fp32 activations (false) for every GGUF weight inside.
      .def(
          "set_quantize_activations",
          [](Module<float>& self, bool on) {
            WeightsFormatChange change;  // a flag the layers read in a call
            return layers::set_quantize_activations(self, on);
          },
          py::arg("on"))
      // int8 activations in two passes, value and rounding residual (true), or one (false).
      .def(
          "set_residual_activations",
          [](Module<float>& self, bool on) {
            WeightsFormatChange change;
            return layers::set_residual_activations(self, on);
          },
          py::arg("on"))
      // [(name, storage)] over the registry: "float32", "int8", "Q4_1", "Q8_0+Q4_1", ...; then, for
      // each Embedding whose table a tied LM head multiplies by through an int8 copy
      // (Embedding::quantize_output_int8), one more entry for the copy: (the table's first name +
      // ":tied_lm_head", "int8"), the copy having the table's shape (quantization.weight_bytes).
      .def("parameter_storage", [](const Module<float>& self) {
        py::list out;
        std::vector<const Module<float>*> tables;
        for (const auto& p : self.parameters()) {
          out.append(py::make_tuple(p.name, Module<float>::storage(p)));
          const auto* table = dynamic_cast<const layers::Embedding<float>*>(p.owner);
          if (table != nullptr && table->output_int8() != nullptr && p.owner_name == "weight" &&
              std::find(tables.begin(), tables.end(), p.owner) == tables.end()) {
            tables.push_back(p.owner);
            out.append(py::make_tuple(p.name + ":tied_lm_head", std::string("int8")));
          }
        }
        return out;
      })
      // [[name, ...]]: one list per Linear layer inside, in registry order: the names its weight is
      // registered under (one, or the row slices of a packed matrix in row order: q|k|v, gate|up).
      // quantize_int8 converts or keeps a Linear's weight whole (quantization.quantize checks that
      // keep_float names all of a packed matrix).
      .def("linear_weight_groups", [](const Module<float>& self) {
        std::vector<const Module<float>*> owners;
        std::vector<std::vector<std::string>> groups;
        for (const auto& p : self.parameters()) {
          if (p.owner_name != "weight" || dynamic_cast<const layers::Linear<float>*>(p.owner) == nullptr) continue;
          const auto at = std::find(owners.begin(), owners.end(), p.owner);
          if (at == owners.end()) {
            owners.push_back(p.owner);
            groups.push_back({p.name});
          } else {
            groups[static_cast<size_t>(at - owners.begin())].push_back(p.name);
          }
        }
        return groups;
      });
  auto module_f64 = py::reinterpret_borrow<py::class_<Module<double>>>(py::type::of<Module<double>>());
  module_f64.def("parameter_storage", [](const Module<double>& self) {
    py::list out;
    for (const auto& p : self.parameters()) out.append(py::make_tuple(p.name, Module<double>::storage(p)));
    return out;
  });

#ifndef TC_OPS_LAYERS_ONLY  // the reduced core of .ci/sanitize has no models
  auto decoder_f32 =
      py::reinterpret_borrow<py::class_<models::DecoderModel<float>>>(py::type::of<models::DecoderModel<float>>());
  // The tied LM head as an int8 copy of embed_tokens (lookups stay fp32); no-op when untied.
  decoder_f32.def("quantize_tied_lm_head_int8", [](models::DecoderModel<float>& self) {
    WeightsFormatChange change;
    self.quantize_tied_lm_head_int8();
  });
#endif
}

}  // namespace transformer_core::bindings
