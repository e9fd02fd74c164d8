#include "transformer_core/layers/quantization.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "transformer_core/kernels/quant/formats.hpp"

namespace transformer_core::layers {

namespace {
// Owners of root's entries, each once, in registration order.
std::vector<Module<float>*> owners(const Module<float>& root) {
  std::vector<Module<float>*> out;
  for (const auto& p : root.parameters())
    if (p.owner != nullptr && std::find(out.begin(), out.end(), p.owner) == out.end()) out.push_back(p.owner);
  return out;
}
}  // namespace

std::vector<Linear<float>*> linear_layers(const Module<float>& root) {
  std::vector<Linear<float>*> out;
  for (Module<float>* m : owners(root))
    if (auto* linear = dynamic_cast<Linear<float>*>(m)) out.push_back(linear);
  return out;
}

int64_t quantize_linears_int8(Module<float>& root, const std::vector<std::string>& keep_float) {
  std::vector<const Module<float>*> kept;
  for (const std::string& name : keep_float) {
    const ParamRef<float>& p = root.parameter(name);  // throws for an unknown name
    if (dynamic_cast<Linear<float>*>(p.owner) == nullptr || p.owner_name != "weight")
      throw std::invalid_argument("keep_float: '" + name + "' is not the weight of a Linear layer");
    kept.push_back(p.owner);
  }
  // Check every layer before converting any (int8 products are exact up to kInt8MaxK features).
  std::vector<Linear<float>*> targets;
  for (Linear<float>* linear : linear_layers(root)) {
    if (linear->quantized_weight() != nullptr) continue;
    if (std::find(kept.begin(), kept.end(), linear) != kept.end()) continue;
    if (linear->in_features() > kernels::quant::kInt8MaxK) {
      std::string name;
      for (const auto& p : root.parameters())
        if (p.owner == linear && p.owner_name == "weight") name += (name.empty() ? "" : ", ") + p.name;
      throw std::invalid_argument(name + ": in_features: expected <= " + std::to_string(kernels::quant::kInt8MaxK) +
                                  " for int8 (the int32 sums stay exact), got " + std::to_string(linear->in_features()) +
                                  "; keep it float (keep_float); nothing was converted");
    }
    targets.push_back(linear);
  }
  for (Linear<float>* linear : targets) linear->quantize_int8();
  root.refresh_parameters();
  return static_cast<int64_t>(targets.size());
}

void load_gguf_weights(Module<float>& root, const std::vector<GgufTensor>& tensors, bool check_only) {
  struct Target {
    Linear<float>* linear = nullptr;
    Embedding<float>* embedding = nullptr;
    int64_t out = 0, in = 0;
    std::vector<GgufRun> runs;
  };
  std::map<Module<float>*, Target> targets;
  std::vector<Module<float>*> order;
  for (const GgufTensor& t : tensors) {
    const ParamRef<float>& p = root.parameter(t.name);  // throws for an unknown name
    auto* linear = dynamic_cast<Linear<float>*>(p.owner);
    auto* embedding = dynamic_cast<Embedding<float>*>(p.owner);
    if ((linear == nullptr && embedding == nullptr) || p.owner_name != "weight" || p.shape.size() != 2)
      throw std::invalid_argument("name: '" + t.name + "' is not the weight of a Linear or an Embedding "
                                  "(GGUF blocks replace those only)");
    if (Module<float>::quantized(p))
      throw std::invalid_argument("name: '" + t.name + "' is already quantized (" + Module<float>::storage(p) + ")");
    Target& target = targets[p.owner];
    if (target.linear == nullptr && target.embedding == nullptr) {
      order.push_back(p.owner);
      target.linear = linear;
      target.embedding = embedding;
      target.out = linear != nullptr ? linear->out_features() : embedding->num_embeddings();
      target.in = linear != nullptr ? linear->in_features() : embedding->embedding_dim();
    }
    target.runs.push_back({p.row0, p.shape[0], t.type, t.blocks, t.num_bytes, t.owner});
  }
  // Check every layer's matrix before touching any layer.
  std::vector<std::pair<Module<float>*, std::unique_ptr<QuantizedMatrix>>> built;
  for (Module<float>* m : order) {
    Target& target = targets[m];
    try {
      built.emplace_back(m, QuantizedMatrix::gguf(target.out, target.in, target.runs));
    } catch (const std::invalid_argument& e) {
      std::string names;
      for (const GgufTensor& t : tensors)
        if (root.parameter(t.name).owner == m) names += (names.empty() ? "" : ", ") + t.name;
      throw std::invalid_argument("GGUF weights of the layer holding " + names + ": " + e.what());
    }
  }
  if (check_only) return;
  for (auto& [m, matrix] : built) {
    Target& target = targets[m];
    if (target.linear != nullptr) {
      target.linear->set_quantized(std::move(matrix));
    } else {
      target.embedding->set_quantized(std::move(matrix));
    }
  }
  root.refresh_parameters();
}

namespace {

// Every quantized matrix of a given format inside root (Linear weights, embedding tables, and the
// int8 copy of a float table that a tied LM head multiplies by).
std::vector<QuantizedMatrix*> quantized_matrices(Module<float>& root, QuantizedMatrix::Format format) {
  std::vector<QuantizedMatrix*> out;
  for (Module<float>* m : owners(root)) {
    QuantizedMatrix* w = nullptr;
    if (auto* linear = dynamic_cast<Linear<float>*>(m)) w = linear->quantized_weight();
    if (auto* embedding = dynamic_cast<Embedding<float>*>(m))
      w = embedding->quantized_weight() != nullptr ? embedding->quantized_weight() : embedding->output_int8();
    if (w != nullptr && w->format() == format) out.push_back(w);
  }
  return out;
}

}  // namespace

int64_t set_quantize_activations(Module<float>& root, bool on) {
  const auto ws = quantized_matrices(root, QuantizedMatrix::Format::kGguf);
  for (QuantizedMatrix* w : ws) w->set_quantize_activations(on);
  return static_cast<int64_t>(ws.size());
}

int64_t set_residual_activations(Module<float>& root, bool on) {
  const auto ws = quantized_matrices(root, QuantizedMatrix::Format::kInt8);
  for (QuantizedMatrix* w : ws) w->set_residual_activations(on);
  return static_cast<int64_t>(ws.size());
}

}  // namespace transformer_core::layers
