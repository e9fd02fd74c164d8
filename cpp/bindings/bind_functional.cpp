// Bindings of the functional ops: numpy in, numpy out, the GIL released around compute.
#include "common.hpp"
#include "transformer_core/ops/attention.hpp"
#include "transformer_core/ops/functional.hpp"

namespace transformer_core::bindings {

namespace {

template <class T>
const T* optional_data(const py::object& o) {
  return o.is_none() ? nullptr : o.cast<CArray<T>>().data();
}

// A 4-D view [d0, d1, d2, d3] with a contiguous last dim, as the attention kernel reads it.
template <class T>
struct View4 {
  const T* data;
  int64_t shape[4];
  int64_t stride[3];
};

template <class T>
View4<T> view4(const py::array& a, const char* name) {
  require(a.ndim() == 4, std::string(name) + ": expected a 4-D array");
  require(a.dtype().is(py::dtype::of<T>()), std::string(name) + ": dtype differs from query's");
  auto s = element_strides(a);
  require(a.shape(3) <= 1 || s[3] == 1, std::string(name) + ": the last dim must be contiguous");
  View4<T> v{static_cast<const T*>(a.data()), {a.shape(0), a.shape(1), a.shape(2), a.shape(3)}, {s[0], s[1], s[2]}};
  return v;
}

template <class T>
void register_dtype(py::module_& m) {
  const std::string sfx = dtype_suffix<T>();

  m.def(("linear" + sfx).c_str(), [](const CArray<T>& x, const CArray<T>& w, const py::object& b) {
    // x [rows, in], w [out, in], b [out] -> [rows, out]
    const int64_t rows = x.shape(0), in = x.shape(1), out = w.shape(0);
    py::array_t<T> y({rows, out});
    const T* bias = optional_data<T>(b);
    T* yp = y.mutable_data();
    {
      py::gil_scoped_release release;
      ops::linear(x.data(), rows, in, w.data(), bias, out, yp);
    }
    return y;
  });

  m.def(("softmax" + sfx).c_str(), [](const CArray<T>& x) {
    // x [rows, n]: softmax over the last dim, into a new array
    py::array_t<T> y({x.shape(0), x.shape(1)});
    std::copy(x.data(), x.data() + x.size(), y.mutable_data());
    T* yp = y.mutable_data();
    {
      py::gil_scoped_release release;
      ops::softmax(yp, x.shape(0), x.shape(1));
    }
    return y;
  });

  m.def(("layer_norm" + sfx).c_str(), [](const CArray<T>& x, const py::object& w, const py::object& b, double eps) {
    py::array_t<T> y({x.shape(0), x.shape(1)});
    const T* wp = optional_data<T>(w);
    const T* bp = optional_data<T>(b);
    T* yp = y.mutable_data();
    {
      py::gil_scoped_release release;
      ops::layer_norm(x.data(), x.shape(0), x.shape(1), wp, bp, static_cast<T>(eps), yp);
    }
    return y;
  });

  m.def(("activation" + sfx).c_str(), [](const CArray<T>& x, const std::string& name) {
    const auto act = ops::parse_activation(name);
    py::array_t<T> y(x.request().shape);
    std::copy(x.data(), x.data() + x.size(), y.mutable_data());
    T* yp = y.mutable_data();
    {
      py::gil_scoped_release release;
      ops::activation(yp, static_cast<int64_t>(x.size()), act);
    }
    return y;
  });

  // query [N, H, L, D], key [N, H_kv, S, D], value [N, H_kv, S, Dv] (any strides, last dim contiguous)
  // -> out [N, H, L, Dv]; with return_weights and/or return_lse a tuple (out[, weights [N, H, L, S]]
  // [, lse [N, H, L]]), in that order
  m.def(("scaled_dot_product_attention" + sfx).c_str(),
        [](const py::array& query, const py::array& key, const py::array& value, const py::object& bool_mask,
           const py::object& float_mask, const py::object& key_mask, bool is_causal, int64_t causal_offset,
           double scale, bool return_weights, const std::string& path, bool return_lse) -> py::object {
          const auto q = view4<T>(query, "query"), k = view4<T>(key, "key"), v = view4<T>(value, "value");
          const auto masks = make_masks<T>(bool_mask, float_mask, key_mask, is_causal, causal_offset);
          const int64_t N = q.shape[0], H = q.shape[1], L = q.shape[2], D = q.shape[3];
          const int64_t Hkv = k.shape[1], S = k.shape[2], Dv = v.shape[3];
          require(k.shape[0] == N && v.shape[0] == N && v.shape[1] == Hkv && v.shape[2] == S && k.shape[3] == D,
                  "scaled_dot_product_attention: inconsistent query/key/value shapes");
          py::array_t<T> out({N, H, L, Dv});
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
          masks.copy_to(a);
          if (return_weights) {
            py::array_t<T> w({N, H, L, S});
            a.weights = w.mutable_data();
            weights = w;
          }
          py::object lse = py::none();
          if (return_lse) {
            py::array_t<T> e({N, H, L});
            a.lse = e.mutable_data();
            lse = e;
          }
          const auto p = ops::parse_attention_path(path);
          {
            py::gil_scoped_release release;
            ops::scaled_dot_product_attention(a, p);
          }
          if (return_weights && return_lse) return py::make_tuple(out, weights, lse);
          if (return_weights) return py::make_tuple(out, weights);
          if (return_lse) return py::make_tuple(out, lse);
          return std::move(out);
        },
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("bool_mask"), py::arg("float_mask"),
        py::arg("key_mask"), py::arg("is_causal"), py::arg("causal_offset"), py::arg("scale"),
        py::arg("return_weights"), py::arg("path"), py::arg("return_lse") = false);
}

}  // namespace

void register_functional(py::module_& m) {
  register_dtype<float>(m);
  register_dtype<double>(m);
  // For tests: the flash kernel's plan for these sizes, as a dict of FlashPlan's fields.
  m.def(
      "flash_attention_plan",
      [](int64_t batch, int64_t num_heads, int64_t q_len, int64_t kv_len, int64_t head_dim, int64_t v_head_dim) {
        const auto p = ops::flash_attention_plan(batch, num_heads, q_len, kv_len, head_dim, v_head_dim);
        py::dict d;
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
