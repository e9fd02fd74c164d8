#include "transformer_core/ops/attention.hpp"

#include <stdexcept>
#include <string>

namespace transformer_core::ops {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

template <class T>
void scaled_dot_product_attention(const AttentionArgs<T>& a, AttentionPath path) {
  if (a.batch < 0 || a.num_heads < 1 || a.num_kv_heads < 1 || a.q_len < 0 || a.kv_len < 0 ||
      a.head_dim < 0 || a.v_head_dim < 0)
    throw std::invalid_argument("scaled_dot_product_attention: invalid sizes N=" + str(a.batch) +
                                " H=" + str(a.num_heads) + " H_kv=" + str(a.num_kv_heads) +
                                " L=" + str(a.q_len) + " S=" + str(a.kv_len) + " D=" + str(a.head_dim) +
                                " Dv=" + str(a.v_head_dim));
  if (a.num_heads % a.num_kv_heads != 0)
    throw std::invalid_argument("scaled_dot_product_attention: num_heads (" + str(a.num_heads) +
                                ") must be a multiple of num_kv_heads (" + str(a.num_kv_heads) + ")");
  if (a.batch == 0 || a.q_len == 0) return;
  if (path == AttentionPath::kReference || a.weights != nullptr) {
    kernels::attention_reference(a);
  } else {
    kernels::attention_flash(a);
  }
}

FlashPlan flash_attention_plan(int64_t batch, int64_t num_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                               int64_t v_head_dim) {
  if (batch < 0 || num_heads < 0 || q_len < 0 || kv_len < 0 || head_dim < 0 || v_head_dim < 0)
    throw std::invalid_argument("flash_attention_plan: sizes must be >= 0, got N=" + str(batch) + " H=" +
                                str(num_heads) + " L=" + str(q_len) + " S=" + str(kv_len) + " D=" + str(head_dim) +
                                " Dv=" + str(v_head_dim));
  return kernels::flash_plan(batch, num_heads, q_len, kv_len, head_dim, v_head_dim);
}

AttentionPath parse_attention_path(const std::string& name) {
  if (name == "auto") return AttentionPath::kAuto;
  if (name == "reference") return AttentionPath::kReference;
  if (name == "flash") return AttentionPath::kFlash;
  throw std::invalid_argument("path: expected 'auto', 'flash' or 'reference', got '" + name + "'");
}

template void scaled_dot_product_attention<float>(const AttentionArgs<float>&, AttentionPath);
template void scaled_dot_product_attention<double>(const AttentionArgs<double>&, AttentionPath);

}  // namespace transformer_core::ops
