// Bindings of the functional ops: numpy in, numpy out, the GIL released around compute.
#include "common.hpp"
#include "transformer_core/ops/activation.hpp"
#include "transformer_core/ops/attention.hpp"
#include "transformer_core/ops/backward.hpp"
#include "transformer_core/ops/linear.hpp"
#include "transformer_core/ops/norm.hpp"
#include "transformer_core/ops/positional.hpp"
#include "transformer_core/ops/softmax.hpp"

namespace transformer_core::bindings {

namespace {

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();

  // x [rows, in], weight [out, in], bias [out] or None -> act(x · weightᵀ + bias) [rows, out]
  m.def(
      ("linear" + sfx).c_str(),
      [](const CArray<T>& x, const CArray<T>& weight, const py::object& bias, const std::string& activation) {
        const auto act = activation.empty() ? ops::Activation::kNone : ops::parse_activation(activation);
        const int64_t rows = x.shape(0), in = x.shape(1), out = weight.shape(0);
        auto y = new_array<T>({rows, out}, "the output (rows of x, out_features of weight)");
        const T* b = optional_data<T>(bias);
        T* yp = y.mutable_data();
        {
          CoreCall release;
          ops::linear(x.data(), rows, in, weight.data(), b, out, yp, act);
        }
        return y;
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("activation"));

  // x [outer, n, inner] -> softmax over the middle dim (inner = 1: the last dim), into a new array
  m.def(
      ("softmax" + sfx).c_str(),
      [](const CArray<T>& x) {
        require(x.ndim() == 3, "x: expected 3 dims (outer, n, inner), got " + std::to_string(x.ndim()));
        auto y = new_array<T>({x.shape(0), x.shape(1), x.shape(2)}, "x");
        T* yp = y.mutable_data();
        {
          CoreCall release;
          ops::softmax(x.data(), x.shape(0), x.shape(1), x.shape(2), yp);
        }
        return y;
      },
      py::arg("x"));

  // x [rows, n], weight/bias [n] or None -> LayerNorm ("layer_norm") or RMSNorm ("rms_norm") [rows, n]
  m.def(
      ("norm" + sfx).c_str(),
      [](const CArray<T>& x, const std::string& kind, const py::object& weight, const py::object& bias, double eps) {
        require(kind == "layer_norm" || kind == "rms_norm", "kind: expected 'layer_norm' or 'rms_norm', got '" + kind + "'");
        ops::NormParams<T> p{kind == "layer_norm" ? ops::NormKind::kLayerNorm : ops::NormKind::kRMSNorm,
                             optional_data<T>(weight), optional_data<T>(bias), static_cast<T>(eps)};
        auto y = new_array<T>({x.shape(0), x.shape(1)}, "x");
        T* yp = y.mutable_data();
        {
          CoreCall release;
          ops::norm(x.data(), x.shape(0), x.shape(1), p, yp);
        }
        return y;
      },
      py::arg("x"), py::arg("kind"), py::arg("weight"), py::arg("bias"), py::arg("eps"));

  // x (any shape) -> act(x), same shape
  m.def(
      ("activation" + sfx).c_str(),
      [](const CArray<T>& x, const std::string& name) {
        const auto act = ops::parse_activation(name);
        py::array_t<T> y(x.request().shape);
        T* yp = y.mutable_data();
        {
          CoreCall release;
          ops::activation(x.data(), static_cast<int64_t>(x.size()), act, yp);
        }
        return y;
      },
      py::arg("x"), py::arg("activation"));

  // gate, up (same shape, [..., F]) -> act(gate) · up, same shape
  m.def(
      ("glu" + sfx).c_str(),
      [](const CArray<T>& gate, const CArray<T>& up, const std::string& name) {
        const auto act = ops::parse_activation(name);
        const int64_t F = gate.shape(gate.ndim() - 1), rows = static_cast<int64_t>(gate.size()) / F;
        py::array_t<T> h(gate.request().shape);
        T* hp = h.mutable_data();
        {
          CoreCall release;
          ops::gated_activation(gate.data(), up.data(), rows, F, F, act, hp);
        }
        return h;
      },
      py::arg("gate"), py::arg("up"), py::arg("activation"));

  // query [N, H, L, D], key [N, H_kv, S, D], value [N, H_kv, S, Dv] (any strides, last dim contiguous)
  // -> out [N, H, L, Dv]; with return_weights and/or return_lse a tuple (out[, weights [N, H, L, S]]
  // [, lse [N, H, L]]), in that order
  m.def(("scaled_dot_product_attention" + sfx).c_str(),
        [](const py::array& query, const py::array& key, const py::array& value, const py::object& bool_mask,
           const py::object& float_mask, const py::object& key_mask, bool is_causal, int64_t causal_offset,
           double scale, bool return_weights, const std::string& path, bool return_lse, double dropout_p,
           uint64_t seed) -> py::object {
          const auto q = view4<T>(query, "query"), k = view4<T>(key, "key"), v = view4<T>(value, "value");
          const auto masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, causal_offset);
          const int64_t N = q.shape[0], H = q.shape[1], L = q.shape[2], D = q.shape[3];
          const int64_t Hkv = k.shape[1], S = k.shape[2], Dv = v.shape[3];
          require(k.shape[0] == N && v.shape[0] == N && v.shape[1] == Hkv && v.shape[2] == S && k.shape[3] == D,
                  "scaled_dot_product_attention: inconsistent query/key/value shapes");
          auto out = new_array<T>({N, H, L, Dv}, "the output (query heads, lengths, value width)");
          py::object weights = py::none();
          kernels::AttentionArgs<T> a;
          a.q = q.data;
          a.q_stride_n = q.stride[0], a.q_stride_h = q.stride[1], a.q_stride_l = q.stride[2];
          a.k = k.data;
          a.k_stride_n = k.stride[0], a.k_stride_h = k.stride[1], a.k_stride_s = k.stride[2];
          a.v = v.data;
          a.v_stride_n = v.stride[0], a.v_stride_h = v.stride[1], a.v_stride_s = v.stride[2];
          a.out = out.mutable_data();
          a.o_stride_n = H * L * Dv, a.o_stride_h = L * Dv, a.o_stride_l = Dv;
          a.batch = N, a.num_heads = H, a.num_kv_heads = Hkv, a.q_len = L, a.kv_len = S;
          a.head_dim = D, a.v_head_dim = Dv;
          a.scale = static_cast<T>(scale);
          static_cast<kernels::AttentionMasks<T>&>(a) = masks;
          ops::set_attention_dropout(a, dropout_p, seed);
          if (return_weights) {
            auto w = new_array<T>({N, H, L, S}, "return_weights: the weights (N, H, L, S)");
            a.weights = w.mutable_data();
            weights = w;
          }
          py::object lse = py::none();
          if (return_lse) {
            auto e = new_array<T>({N, H, L}, "return_lse: the lse (N, H, L)");
            a.lse = e.mutable_data();
            lse = e;
          }
          const auto p = ops::parse_attention_path(path);
          {
            CoreCall release;
            ops::scaled_dot_product_attention(a, p);
          }
          if (return_weights && return_lse) return py::make_tuple(out, weights, lse);
          if (return_weights) return py::make_tuple(out, weights);
          if (return_lse) return py::make_tuple(out, lse);
          return std::move(out);
        },
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("bool_mask"), py::arg("float_mask"),
        py::arg("key_mask"), py::arg("is_causal"), py::arg("causal_offset"), py::arg("scale"),
        py::arg("return_weights"), py::arg("path"), py::arg("return_lse") = false, py::arg("dropout_p") = 0.0,
        py::arg("seed") = 0);

  // Sequences packed end to end: query [T, H, D], key [T, H_kv, D], value [T, H_kv, Dv] (rows of
  // sequence n: [cu_seqlens[n], cu_seqlens[n + 1])) -> out [T, H, Dv]. Checked in functional.py.
  m.def(("varlen_attention" + sfx).c_str(),
        [](const py::array& query, const py::array& key, const py::array& value, const CArray<int64_t>& cu_seqlens,
           bool is_causal, double scale, const std::string& path) {
          auto rows_of = [](const py::array& a, const char* name) {  // [T, heads, width], width contiguous
            require(a.ndim() == 3, std::string(name) + ": expected a 3-D array");
            require(has_dtype<T>(a), std::string(name) + ": dtype differs from query's");
            const auto st = element_strides(a, name);
            require(a.size() == 0 || a.shape(2) <= 1 || st[2] == 1, std::string(name) + ": the last dim must be contiguous");
            return st;
          };
          require(cu_seqlens.ndim() == 1 && cu_seqlens.size() >= 1, "cu_seqlens: expected a 1-D array (N + 1,)");
          const auto qs = rows_of(query, "query"), ks = rows_of(key, "key"), vs = rows_of(value, "value");
          const int64_t T_ = query.shape(0), H = query.shape(1), D = query.shape(2);
          const int64_t Hkv = key.shape(1), Dv = value.shape(2), N = cu_seqlens.size() - 1;
          require(key.shape(0) == T_ && value.shape(0) == T_ && value.shape(1) == Hkv && key.shape(2) == D &&
                      cu_seqlens.data()[N] == T_,
                  "varlen_attention: inconsistent query/key/value/cu_seqlens shapes");
          auto out = new_array<T>({T_, H, Dv}, "the output (tokens, query heads, value width)");
          kernels::AttentionArgs<T> a;
          a.q = static_cast<const T*>(query.data()), a.q_stride_h = qs[1], a.q_stride_l = qs[0];
          a.k = static_cast<const T*>(key.data()), a.k_stride_h = ks[1], a.k_stride_s = ks[0];
          a.v = static_cast<const T*>(value.data()), a.v_stride_h = vs[1], a.v_stride_s = vs[0];
          a.out = out.mutable_data(), a.o_stride_h = Dv, a.o_stride_l = H * Dv;
          a.batch = N, a.num_heads = H, a.num_kv_heads = Hkv, a.head_dim = D, a.v_head_dim = Dv;
          a.scale = static_cast<T>(scale);
          a.is_causal = is_causal;
          const auto p = ops::parse_attention_path(path);
          {
            CoreCall release;
            ops::varlen_self_attention(a, cu_seqlens.data(), p);
          }
          return out;
        },
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("cu_seqlens"), py::arg("is_causal"),
        py::arg("scale"), py::arg("path"));
}

}  // namespace

void register_functional(py::module_& m) {
  py::enum_<ops::Activation>(m, "Activation")
      .value("none", ops::Activation::kNone)
      .value("relu", ops::Activation::kRelu)
      .value("gelu", ops::Activation::kGelu)
      .value("gelu_tanh", ops::Activation::kGeluTanh)
      .value("silu", ops::Activation::kSilu)
      .value("tanh", ops::Activation::kTanh);
  m.def("activation_names", &ops::activation_names, "Every activation name the library accepts (one table).");
  m.def("parse_activation", &ops::parse_activation, py::arg("name"),
        "The Activation a name stands for; ValueError naming the accepted ones otherwise.");
  // The other tables of names (one each, in C++): Python checks a name by asking them, and gets
  // the table's ValueError (naming the accepted names) for an unknown one.
  m.def("parse_attention_path", [](const std::string& name) { return static_cast<int>(ops::parse_attention_path(name)); },
        py::arg("name"), "Checks an attention path name ('auto', 'flash', 'reference'); ValueError otherwise.");
  m.def("parse_rotary_layout", [](const std::string& name) { return static_cast<int>(ops::parse_rotary_layout(name)); },
        py::arg("name"), "Checks a rotary layout name ('half', 'interleaved'); ValueError otherwise.");
  m.def("parse_reduction", [](const std::string& name) { return static_cast<int>(ops::parse_reduction(name)); },
        py::arg("name"), "Checks a loss reduction name ('mean', 'sum', 'none'); ValueError otherwise.");
  register_dtype<float>(m);
  register_dtype<double>(m);
  // For tests: the flash kernel's plan for these sizes, as a dict of FlashPlan's fields.
  m.def(
      "flash_attention_plan",
      [](int64_t batch, int64_t num_heads, int64_t q_len, int64_t kv_len, int64_t head_dim, int64_t v_head_dim) {
        const auto p = ops::flash_attention_plan(batch, num_heads, q_len, kv_len, head_dim, v_head_dim);
        py::dict d;
        d["small"] = p.small;
        d["serial"] = p.serial;
        d["block_rows"] = p.block_rows;
        d["block_keys"] = p.block_keys;
        d["query_blocks"] = p.query_blocks;
        d["kv_chunks"] = p.kv_chunks;
        d["kv_chunk_len"] = p.kv_chunk_len;
        d["tasks"] = p.tasks;
        return d;
      },
      py::arg("batch"), py::arg("num_heads"), py::arg("q_len"), py::arg("kv_len"), py::arg("head_dim"),
      py::arg("v_head_dim"));
}

}  // namespace transformer_core::bindings
