// Scratch buffers reused across calls. Each call site names its buffer with a distinct Scratch tag,
// and each thread gets its own set (thread_local), so concurrent calls from several Python threads
// never share one. A buffer grows to the largest size asked for; at the end of each call from
// Python, the calling thread's buffers above kWorkspaceKeepBytes are freed (release_large_workspaces:
// one large batch kept its activations' size for the thread's whole life, hundreds of MB after the
// model was gone), and the smaller ones stay for the next call.
//
// Two buffers that are alive at the same time must have different tags: a layer's tags are listed
// here beside the layer that uses them, and a layer never calls itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>
#include <xsimd/memory/xsimd_aligned_allocator.hpp>

namespace transformer_core::kernels {

enum class Scratch : int {
  // FeedForward / GatedFeedForward: the hidden activations [rows, F] (or [rows, 2F] gate|up)
  kFfnHidden,
  // MultiheadAttention: projected q|k|v, separate q, k, v, the context before out_proj, and the
  // packed (padding-free) rows of qkv and context
  kAttnQkv,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnContext,
  kAttnQkvPacked,
  kAttnContextPacked,
  // TransformerEncoderLayer / TransformerDecoderLayer / DecoderBlock: residual-stream temporaries
  kLayerA,
  kLayerB,
  kLayerX,
  // quantized linear (ops/quantized_linear.cpp): quantized activations, their scales and sums, and
  // one decoded tile of weights; the int8 residual mode's quantized rounding residual, its scales
  // and sums
  kQuantActivations,
  kQuantScales,
  kQuantSums,
  kQuantTile,
  kQuantResidualActivations,
  kQuantResidualScales,
  kQuantResidualSums,
  // the int8 weights packed into the panels of the many-rows product (outside a PackedWeightScope)
  kQuantPackedWeights,
  // Training (the layers' backward passes, *_backward.cpp; a layer's backward runs after its
  // children's have returned or before they start, never beside them):
  //   the residual-stream gradients of an encoder / decoder layer or a decoder block
  kGradLayerA,
  kGradLayerB,
  kGradLayerC,
  //   FeedForward / GatedFeedForward: d hidden [rows, F] and d [gate | up] [rows, 2F]
  kGradFfnHidden,
  kGradFfnGateUp,
  //   MultiheadAttention: d context [N·L, Hq], d q|k|v (or d q, d k, d v), and the input gradient of
  //   a projection added to another's
  kGradAttnContext,
  kGradAttnQkv,
  kGradAttnInput,
  //   a model's output layer fused with the loss: rows of hidden, their logits, d hidden
  kHeadRows,
  kHeadLogits,
  kHeadGradRows,
  // kernels::linear (kernels/linear.hpp): the weight packed for our GEMM (sgemm.hpp), alive only
  // inside one linear call
  kGemmPackedB,
  // kernels::linear on AMX (sgemm.hpp, split): x's and w's tiles of bf16 parts, alive inside one
  // linear call, which rows and column tiles are finite, and one task's fp32 panel for those that
  // are not
  kGemmSplitA,
  kGemmSplitB,
  kGemmSplitFinite,
  kGemmSplitFallback,
  // gemm_on_thread (kernels/gemm.hpp): the right operand packed by one task, on that task's thread,
  // and a transposed left operand's block copied into row groups
  kGemmPackedTask,
  kGemmPackedA,
  kCount
};

// A vector whose data starts on a cache line (64 bytes): a 64-byte load at an address that is not a
// multiple of 64 touches two lines.
template <class T>
using AlignedVector = std::vector<T, xsimd::aligned_allocator<T, 64>>;

// A buffer up to this size outlives the call that grew it. The largest of MiniLM's for a batch of 32
// texts of 128 tokens (its feed-forward's hidden rows) is 25 MB; a call that needs more allocates
// again each time, a cost small beside its work (a 64 MiB buffer's pages: a few ms against a second
// of products).
constexpr size_t kWorkspaceKeepBytes = size_t{64} << 20;

// This thread's functions that free its buffers of one element type above a size in bytes (one
// registered per type the thread has used).
inline std::vector<void (*)(size_t)>& workspace_releasers() {
  thread_local std::vector<void (*)(size_t)> releasers;
  return releasers;
}

template <class T>
void release_workspaces_above(size_t keep_bytes);

// This thread's buffers of T, one per tag; registered for release on first use.
template <class T>
AlignedVector<T>* workspace_buffers() {
  thread_local AlignedVector<T> buffers[static_cast<int>(Scratch::kCount)];
  thread_local const bool registered = (workspace_releasers().push_back(&release_workspaces_above<T>), true);
  (void)registered;
  return buffers;
}

template <class T>
void release_workspaces_above(size_t keep_bytes) {
  AlignedVector<T>* buffers = workspace_buffers<T>();
  for (int tag = 0; tag < static_cast<int>(Scratch::kCount); ++tag)
    if (buffers[tag].capacity() * sizeof(T) > keep_bytes) AlignedVector<T>().swap(buffers[tag]);
}

// Frees the calling thread's buffers above kWorkspaceKeepBytes. Called when a call from Python ends
// (the bindings' CoreCall and ModuleCall), never while one runs: a pointer from workspace() is
// valid until then.
inline void release_large_workspaces() {
  for (auto release : workspace_releasers()) release(kWorkspaceKeepBytes);
}

// The buffer of tag for n values of T, on this thread (an AlignedVector).
template <class T>
T* workspace(Scratch tag, size_t n) {
  AlignedVector<T>& buffer = workspace_buffers<T>()[static_cast<int>(tag)];
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace transformer_core::kernels
