#include "transformer_core/ops/embedding.hpp"

#include <stdexcept>

#include "transformer_core/kernels/parallel.hpp"
#include "transformer_core/ops/checks.hpp"

namespace transformer_core::ops {

void check_ids(const int64_t* ids, int64_t count, int64_t V, const std::string& name) {
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= V)
      throw std::invalid_argument(name + ": id " + to_string(ids[i]) + " at flat index " + to_string(i) +
                                  " is outside [0, " + to_string(V) + ")");
}

template <class T>
void embedding(const int64_t* ids, int64_t rows, const T* table, int64_t H, T* out) {
  kernels::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* src = table + ids[r] * H;
      T* dst = out + r * H;
      for (int64_t j = 0; j < H; ++j) dst[j] = src[j];
    }
  });
}

template <class T>
void embedding_add(const int64_t* ids, int64_t rows, const T* table, int64_t H, T* out) {
  kernels::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(H, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* src = table + ids[r] * H;
      T* dst = out + r * H;
      for (int64_t j = 0; j < H; ++j) dst[j] += src[j];
    }
  });
}

template void embedding<float>(const int64_t*, int64_t, const float*, int64_t, float*);
template void embedding<double>(const int64_t*, int64_t, const double*, int64_t, double*);
template void embedding_add<float>(const int64_t*, int64_t, const float*, int64_t, float*);
template void embedding_add<double>(const int64_t*, int64_t, const double*, int64_t, double*);

}  // namespace transformer_core::ops
