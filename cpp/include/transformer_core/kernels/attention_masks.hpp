// The masks of one attention call, broadcast to (n, h, l, s) through strides (stride 0 = broadcast).
// Each is optional; a key s is visible to query l only if every given mask allows it:
//   bool_mask  (n, h, l, s):  nonzero = may attend
//   float_mask (n, h, l, s):  added to the scores
//   key_mask   (n, s):        nonzero = a real key (a padding mask; Hugging Face's attention_mask)
//   is_causal:                s <= l + causal_offset   (top-left alignment: offset 0; bottom-right,
//                             as for a KV cache: offset S - L)
#pragma once

#include <cstdint>

namespace transformer_core::kernels {

template <class T>
struct AttentionMasks {
  const uint8_t* bool_mask = nullptr;
  int64_t bool_mask_strides[4] = {0, 0, 0, 0};
  const T* float_mask = nullptr;
  int64_t float_mask_strides[4] = {0, 0, 0, 0};
  const uint8_t* key_mask = nullptr;
  int64_t key_mask_stride_n = 0, key_mask_stride_s = 0;
  bool is_causal = false;
  int64_t causal_offset = 0;

  bool has_any_mask() const {
    return bool_mask != nullptr || float_mask != nullptr || key_mask != nullptr || is_causal;
  }
};

}  // namespace transformer_core::kernels
