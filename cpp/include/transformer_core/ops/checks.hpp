// Argument checks shared by the ops and the layers. Each throws std::invalid_argument whose message
// names the argument and says what was expected and what was given; the bindings turn it into
// Python's ValueError. Sizes are checked before anything is allocated: for sign, for overflow of
// their product (in checked 64-bit arithmetic), and against the memory this machine has.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace transformer_core::ops {

// Throws unless v >= 0 (resp. v >= 1).
void require_nonnegative(int64_t v, const std::string& name);
void require_positive(int64_t v, const std::string& name);

// Π dims, or throws (naming `name`) if a dim is negative or the product overflows int64.
int64_t checked_product(std::initializer_list<int64_t> dims, const std::string& name);

// Throws if `elements` values of `element_size` bytes exceed this machine's physical memory: a size
// no allocation here can satisfy is a ValueError, not a MemoryError or the OOM killer.
void require_allocatable(int64_t elements, int64_t element_size, const std::string& name);

// The machine's physical memory in bytes (the bound of require_allocatable).
int64_t physical_memory_bytes();

// Σ over `shapes` of Π dims, in checked 64-bit arithmetic, then require_allocatable: the weights of a
// layer or model, checked before the first of them is allocated. `names` names the arguments the
// sizes come from ("d_model, dim_feedforward"), so the error names what the caller gave.
void require_weights(std::initializer_list<std::initializer_list<int64_t>> shapes, int64_t element_size,
                     const std::string& names);

// a + b, or throws (naming `name`) if the sum overflows int64 (both >= 0).
int64_t checked_sum(int64_t a, int64_t b, const std::string& name);

// The first member of a layer that owns weights: constructing it runs require_weights, so a size no
// machine can hold is a std::invalid_argument before any member allocates (members are built in
// declaration order).
struct WeightsCheck {
  WeightsCheck(std::initializer_list<std::initializer_list<int64_t>> shapes, int64_t element_size,
               const std::string& names) {
    require_weights(shapes, element_size, names);
  }
};

std::string to_string(int64_t v);

}  // namespace transformer_core::ops
