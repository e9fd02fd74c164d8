#include "transformer_core/ops/attention.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

namespace {
std::string str(int64_t v) { return std::to_string(v); }

template <class T>
void check_sizes(const AttentionArgs<T>& a) {
  if (a.batch < 0 || a.num_heads < 1 || a.num_kv_heads < 1 || a.q_len < 0 || a.kv_len < 0 ||
      a.head_dim < 0 || a.v_head_dim < 0)
    throw std::invalid_argument("scaled_dot_product_attention: invalid sizes N=" + str(a.batch) +
                                " H=" + str(a.num_heads) + " H_kv=" + str(a.num_kv_heads) +
                                " L=" + str(a.q_len) + " S=" + str(a.kv_len) + " D=" + str(a.head_dim) +
                                " Dv=" + str(a.v_head_dim));
  if (a.num_heads % a.num_kv_heads != 0)
    throw std::invalid_argument("scaled_dot_product_attention: num_heads (" + str(a.num_heads) +
                                ") must be a multiple of num_kv_heads (" + str(a.num_kv_heads) + ")");
}

// The reference path holds one (L, S) score matrix per thread at work, or, averaging the weights
// over the heads, one per head of a round (kernels::averaged_weights_round): checked against
// memory before the region starts (a bad_alloc inside it, or the OOM killer, otherwise).
template <class T>
void check_reference_scratch(const AttentionArgs<T>& a) {
  const int64_t tasks = checked_product({a.batch, a.num_heads}, "query");
  checked_product({a.q_len, a.kv_len}, "query, key: (L, S) scores");  // before the round's L · S
  const int64_t matrices = a.weights != nullptr && a.average_weights
                               ? kernels::averaged_weights_round(a, std::max(1, get_num_threads()))
                               : std::min<int64_t>(get_num_threads(), tasks);
  require_allocatable(checked_product({matrices, a.q_len, a.kv_len}, "query, key: (L, S) scores per thread"),
                      sizeof(T), "query, key: the reference path's (L, S) scores, one matrix per thread (averaged "
                      "weights: per head of a round)");
}
}  // namespace

template <class T>
void scaled_dot_product_attention(const AttentionArgs<T>& a, AttentionPath path) {
  check_sizes(a);
  if (a.batch == 0 || a.q_len == 0) return;
  if (path == AttentionPath::kReference || a.weights != nullptr) {
    check_reference_scratch(a);
    kernels::attention_reference(a);
  } else {
    kernels::attention_flash(a);
  }
}

template <class T>
void set_attention_dropout(AttentionArgs<T>& a, double p, uint64_t seed) {
  if (!(p >= 0.0 && p <= 1.0))
    throw std::invalid_argument("attention dropout: p must be in [0, 1], got " + std::to_string(p));
  a.dropout_threshold = p > 0.0 ? kernels::dropout_threshold(p) : 0;  // p = 1: 2^32, above every draw
  a.dropout_seed = seed;
  a.dropout_scale = p > 0.0 && p < 1.0 ? T(1) / static_cast<T>(1.0 - p) : T(1);  // as ops::dropout (torch's)
}

template <class T>
void varlen_self_attention(const AttentionArgs<T>& a, const int64_t* starts, AttentionPath path) {
  check_sizes(a);
  if (a.bool_mask != nullptr || a.float_mask != nullptr || a.key_mask != nullptr || a.weights != nullptr ||
      a.lse != nullptr || a.has_dropout())
    throw std::invalid_argument("varlen_self_attention: sequences packed end to end take no mask but is_causal, "
                                "no dropout, and give no weights or lse");
  if (starts == nullptr || starts[0] != 0)
    throw std::invalid_argument("varlen_self_attention: starts must begin at 0");
  for (int64_t n = 0; n < a.batch; ++n)
    if (starts[n + 1] < starts[n])
      throw std::invalid_argument("varlen_self_attention: starts must not decrease, got " + str(starts[n]) +
                                  " then " + str(starts[n + 1]));
  if (path != AttentionPath::kReference) return kernels::attention_flash_varlen(a, starts);
  for (int64_t n = 0; n < a.batch; ++n) {  // the oracle: each sequence a batch of one
    const AttentionArgs<T> s = kernels::varlen_sequence(a, starts, n);
    if (s.q_len > 0) {
      check_reference_scratch(s);
      kernels::attention_reference(s);
    }
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
template void set_attention_dropout<float>(AttentionArgs<float>&, double, uint64_t);
template void set_attention_dropout<double>(AttentionArgs<double>&, double, uint64_t);
template void varlen_self_attention<float>(const AttentionArgs<float>&, const int64_t*, AttentionPath);
template void varlen_self_attention<double>(const AttentionArgs<double>&, const int64_t*, AttentionPath);

}  // namespace transformer_core::ops
