// scaled_dot_product_attention: validates an AttentionArgs, then runs the tiled (flash) kernel or
// the reference kernel.
//   q: [N, H, L, D]   k: [N, H_kv, S, D]   v: [N, H_kv, S, D_v]   out: [N, H, L, D_v]
#pragma once

#include <string>

#include "transformer_core/kernels/attention.hpp"
#include "transformer_core/kernels/flash_attention.hpp"

namespace transformer_core::ops {

using kernels::AttentionArgs;
using kernels::FlashPlan;

enum class AttentionPath {
  kAuto,       // flash kernel, or the reference when weights are requested
  kReference,  // full [L, S] scores per head: the oracle
  kFlash,      // tiled online softmax, no [L, S] buffer
};

// Throws std::invalid_argument if the sizes are inconsistent (H % H_kv, negative sizes, ...).
template <class T>
void scaled_dot_product_attention(const AttentionArgs<T>& args, AttentionPath path = AttentionPath::kAuto);

// Dropout of probability p on the attention probabilities of `args` (kernels/attention.hpp), its
// mask drawn from `seed`; p = 0: none, p = 1: every probability dropped. Throws
// std::invalid_argument unless 0 <= p <= 1.
template <class T>
void set_attention_dropout(AttentionArgs<T>& args, double p, uint64_t seed);

// Self-attention over a.batch sequences packed end to end without padding: sequence n is rows
// [starts[n], starts[n + 1]) of q, k, v and out and attends to its own rows only (causally with
// a.is_causal). starts [a.batch + 1], starts[0] = 0, non-decreasing. The flash path runs one
// parallel region (kernels::attention_flash_varlen); the reference path runs each sequence as a
// batch of one. Throws std::invalid_argument on bad sizes or starts, or when a mask other than
// is_causal, weights or lse are given.
template <class T>
void varlen_self_attention(const AttentionArgs<T>& args, const int64_t* starts, AttentionPath path = AttentionPath::kAuto);

// How the flash kernel cuts a call of these sizes into tiles, tasks and key chunks (a function of the
// sizes alone; kv_chunks > 1: the split-KV merge runs). For tests and benchmarks.
// Throws std::invalid_argument if a size is negative.
FlashPlan flash_attention_plan(int64_t batch, int64_t num_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                               int64_t v_head_dim);

AttentionPath parse_attention_path(const std::string& name);

}  // namespace transformer_core::ops
