// Quantizing the layers inside a module (a whole model, or one layer), found through its registry:
// every registry entry names the layer that owns the storage (module.hpp), so the Linear and
// Embedding layers of any composition are reached without the composition knowing it.
//
//   quantize_linears_int8   every fp32 Linear → int8 per output channel (torch's quantize_dynamic)
//   load_gguf_weights       weights given as GGUF blocks (a memory-mapped GGUF file), installed in
//                           the layers that own them; a packed matrix ([q; k; v], [gate; up]) gets
//                           one run of rows per tensor
//   set_quantize_activations  the activation mode of every GGUF matrix (fp32, or Q8 blocks)
//   set_residual_activations  the activation mode of every int8 matrix (one int8 pass, or two)
// float32 only: the quantized kernels compute in float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transformer_core/layers/embedding.hpp"
#include "transformer_core/layers/linear.hpp"
#include "transformer_core/layers/module.hpp"

namespace transformer_core::layers {

// Every Linear<float> that owns a weight root registers, each once, in registration order.
std::vector<Linear<float>*> linear_layers(const Module<float>& root);

// Quantizes every fp32 Linear inside root to int8 (those already quantized are left as they are,
// and those whose weight is named in keep_float, root's registry names, stay fp32) and refreshes
// root's registry. Returns how many were converted. Throws std::invalid_argument (root unchanged)
// for a keep_float name that is unknown or not a Linear's weight, or a layer to convert with more
// than kInt8MaxK in_features.
int64_t quantize_linears_int8(Module<float>& root, const std::vector<std::string>& keep_float = {});

// One weight of root, by its name in root's registry, given as GGUF blocks.
struct GgufTensor {
  std::string name;                   // e.g. "layers.0.self_attn.q_proj.weight"
  GgmlType type = GgmlType::kQ8_0;
  const uint8_t* blocks = nullptr;    // the entry's rows × cols / 32 blocks, C-contiguous
  size_t num_bytes = 0;
  std::shared_ptr<const void> owner;  // keeps `blocks` alive
};

// Installs GGUF blocks as the weights they name: groups them by the layer that owns the storage
// (a Linear, or an Embedding's table), checks that each such layer's rows are covered exactly once
// (a packed matrix needs all its slices) and that the byte counts fit, and only then replaces the
// layers' fp32 weights (freed) by the blocks; refreshes root's registry. Throws std::invalid_argument
// naming the weight (unknown name, not a Linear/Embedding weight, missing rows, wrong size) with
// root unchanged. check_only: all the checks, nothing installed (to check the tensors of several
// roots before installing any).
void load_gguf_weights(Module<float>& root, const std::vector<GgufTensor>& tensors, bool check_only = false);

// Sets the activation mode of every GGUF-block weight inside root (Linear weights and embedding
// tables used as LM heads): Q8 activation blocks and integer dots (true) or fp32 activations (false).
// Returns how many weights it set.
int64_t set_quantize_activations(Module<float>& root, bool on);

// Sets the activation mode of every int8 weight inside root: activations in two int8 passes, value
// and rounding residual (true; ops::linear_int8), or one (false). Returns how many weights it set.
int64_t set_residual_activations(Module<float>& root, bool on);

}  // namespace transformer_core::layers
