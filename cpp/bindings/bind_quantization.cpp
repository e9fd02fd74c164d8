// Bindings of the quantized ops and of the kernels' ISA choice: numpy in, numpy out, the GIL
// released around compute. The Python layer (quantization.py) has validated dtypes and shapes.
#include "common.hpp"
#include "transformer_core/kernels/quant/isa.hpp"
#include "transformer_core/ops/quantized_linear.hpp"

namespace transformer_core::bindings {

namespace {

namespace q = kernels::quant;

const float* optional_bias(const py::object& b) { return optional_data<float>(b); }

// A read-only byte view of any buffer (numpy uint8 array, bytes, memoryview, mmap): no copy.
struct Bytes {
  py::buffer_info info;
  const uint8_t* data() const { return static_cast<const uint8_t*>(info.ptr); }
  size_t size() const { return static_cast<size_t>(info.size * info.itemsize); }
};

Bytes bytes_of(const py::buffer& b) {
  Bytes out{b.request()};
  require(out.info.itemsize == 1, "blocks: expected a buffer of bytes (uint8)");
  py::ssize_t expected = 1;  // C-contiguous: the bytes of row r follow those of row r - 1
  for (py::ssize_t d = out.info.ndim - 1; d >= 0; --d) {
    const auto i = static_cast<size_t>(d);
    require(out.info.shape[i] <= 1 || out.info.strides[i] == expected, "blocks: expected a C-contiguous buffer");
    expected *= out.info.shape[i];
  }
  return out;
}

}  // namespace

void register_quantization(py::module_& m) {
  m.def("isa", []() { return std::string(q::isa_name(q::active_isa())); },
        "The instruction set the quantized kernels use now.");
  m.def("set_isa", [](const std::string& name) { q::set_active_isa(q::parse_isa(name)); }, py::arg("name"),
        "Chooses the quantized kernels' instruction set; ValueError if unknown or not supported here.");
  m.def("supported_isas",
        []() {
          std::vector<std::string> out;
          for (q::Isa isa : q::supported_isas()) out.emplace_back(q::isa_name(isa));
          return out;
        },
        "The instruction sets this CPU and build can run, slowest first.");

  // weight [out, in] fp32 -> (qweight [out, in] int8, scales [out] fp32)
  m.def("quantize_int8",
        [](const CArray<float>& weight) {
          const int64_t out = weight.shape(0), in = weight.shape(1);
          py::array_t<int8_t> qw({out, in});
          py::array_t<float> scales(out);
          int8_t* qp = qw.mutable_data();
          float* sp = scales.mutable_data();
          {
            CoreCall release;
            ops::quantize_int8(weight.data(), out, in, qp, sp);
          }
          return py::make_tuple(qw, scales);
        },
        py::arg("weight"));

  // x [rows, in] fp32, qweight [out, in] int8, scales [out], bias [out] | None -> [rows, out]
  m.def("linear_int8",
        [](const CArray<float>& x, const CArray<int8_t>& qweight, const CArray<float>& scales, const py::object& bias,
           bool residual_activations) {
          const int64_t rows = x.shape(0), in = x.shape(1), out = qweight.shape(0);
          require(qweight.shape(1) == in && scales.size() == out, "linear_int8: inconsistent shapes");
          const float* bp = optional_bias(bias);
          py::array_t<float> y = new_array<float>({rows, out}, "linear_int8: the output (rows of x, out_features)");
          float* yp = y.mutable_data();
          {
            CoreCall release;
            ops::linear_int8(x.data(), rows, in, qweight.data(), scales.data(), bp, out, yp, residual_activations);
          }
          return y;
        },
        py::arg("x"), py::arg("qweight"), py::arg("scales"), py::arg("bias"), py::arg("residual_activations"));

  // x [rows, in] fp32, blocks: bytes of out rows of in / 32 blocks -> [rows, out]
  m.def("linear_gguf",
        [](const CArray<float>& x, const py::buffer& blocks, const std::string& ggml_type, int64_t out_features,
           int64_t in_features, const py::object& bias, bool quantize_activations) {
          const auto type = q::parse_ggml_type(ggml_type);
          require(x.shape(1) == in_features, "linear_gguf: x's last dim differs from in_features");
          const Bytes b = bytes_of(blocks);
          const float* bp = optional_bias(bias);
          const int64_t rows = x.shape(0);
          py::array_t<float> y = new_array<float>({rows, out_features}, "linear_gguf: the output (rows of x, out_features)");
          float* yp = y.mutable_data();
          {
            CoreCall release;
            ops::linear_gguf(x.data(), rows, in_features, b.data(), b.size(), type, bp, out_features, yp,
                             quantize_activations);
          }
          return y;
        },
        py::arg("x"), py::arg("blocks"), py::arg("ggml_type"), py::arg("out_features"), py::arg("in_features"),
        py::arg("bias"), py::arg("quantize_activations"));

  // x [rows, in] fp32, parts: [(blocks, ggml_type, rows)] (runs of rows, stacked) -> [rows, Σ part rows]
  m.def("linear_gguf_parts",
        [](const CArray<float>& x, const std::vector<std::tuple<py::buffer, std::string, int64_t>>& parts,
           int64_t in_features, const py::object& bias, bool quantize_activations) {
          require(x.shape(1) == in_features, "linear_gguf_parts: x's last dim differs from in_features");
          std::vector<Bytes> held;  // the buffers stay requested while the kernels read them
          std::vector<ops::GgufRows> runs;
          int64_t out = 0;
          for (const auto& [blocks, type, rows] : parts) {
            held.push_back(bytes_of(blocks));
            runs.push_back({held.back().data(), held.back().size(), rows, q::parse_ggml_type(type)});
            out += rows;
          }
          const float* bp = optional_bias(bias);
          const int64_t rows = x.shape(0);
          py::array_t<float> y = new_array<float>({rows, out}, "linear_gguf_parts: the output (rows of x, the parts' rows)");
          float* yp = y.mutable_data();
          {
            CoreCall release;
            ops::linear_gguf_parts(x.data(), rows, in_features, runs.data(), static_cast<int64_t>(runs.size()), bp, yp,
                                   quantize_activations);
          }
          return y;
        },
        py::arg("x"), py::arg("parts"), py::arg("in_features"), py::arg("bias"), py::arg("quantize_activations"));

  // blocks: bytes of rows × cols / 32 blocks -> [rows, cols] fp32
  m.def("dequantize_gguf",
        [](const py::buffer& blocks, const std::string& ggml_type, int64_t rows, int64_t cols) {
          const auto type = q::parse_ggml_type(ggml_type);
          const Bytes b = bytes_of(blocks);
          require(rows >= 1 && cols >= 1, "dequantize_gguf: rows and cols must be >= 1");
          py::array_t<float> out = new_array<float>({rows, cols}, "dequantize_gguf: the output (rows, cols)");
          float* op = out.mutable_data();
          {
            CoreCall release;
            ops::dequantize_gguf(b.data(), b.size(), type, rows, cols, op);
          }
          return out;
        },
        py::arg("blocks"), py::arg("ggml_type"), py::arg("rows"), py::arg("cols"));

  // x [rows, cols] fp32 -> (q [rows, cols] int8, d [rows, cols / 32] fp32)
  m.def("quantize_q8_blocks",
        [](const CArray<float>& x) {
          const int64_t rows = x.shape(0), cols = x.shape(1);
          require(cols % 32 == 0, "quantize_q8_blocks: cols: expected a multiple of 32");
          py::array_t<int8_t> qv({rows, cols});
          py::array_t<float> d({rows, cols / 32});
          int8_t* qp = qv.mutable_data();
          float* dp = d.mutable_data();
          {
            CoreCall release;
            ops::quantize_q8_blocks(x.data(), rows, cols, qp, dp);
          }
          return py::make_tuple(qv, d);
        },
        py::arg("x"));
}

}  // namespace transformer_core::bindings
