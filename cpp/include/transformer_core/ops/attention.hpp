// scaled_dot_product_attention: validates an AttentionArgs, then runs the tiled (flash) kernel or
// the reference kernel.
//   q: [N, H, L, D]   k: [N, H_kv, S, D]   v: [N, H_kv, S, D_v]   out: [N, H, L, D_v]
#pragma once

#include <string>

#include "transformer_core/kernels/attention.hpp"

namespace transformer_core::ops {

using kernels::AttentionArgs;

enum class AttentionPath {
  kAuto,       // flash kernel, or the reference when weights are requested
  kReference,  // full [L, S] scores per head: the oracle
  kFlash,      // tiled online softmax, no [L, S] buffer
};

// Throws std::invalid_argument if the sizes are inconsistent (H % H_kv, negative sizes, ...).
template <class T>
void scaled_dot_product_attention(const AttentionArgs<T>& args, AttentionPath path = AttentionPath::kAuto);

AttentionPath parse_attention_path(const std::string& name);

}  // namespace transformer_core::ops
