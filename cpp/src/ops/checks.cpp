#include "transformer_core/ops/checks.hpp"

#include <unistd.h>

#include <limits>
#include <stdexcept>

namespace transformer_core::ops {

std::string to_string(int64_t v) { return std::to_string(v); }

void require_nonnegative(int64_t v, const std::string& name) {
  if (v < 0) throw std::invalid_argument(name + ": expected a size >= 0, got " + to_string(v));
}

void require_positive(int64_t v, const std::string& name) {
  if (v < 1) throw std::invalid_argument(name + ": expected a size >= 1, got " + to_string(v));
}

int64_t checked_product(std::initializer_list<int64_t> dims, const std::string& name) {
  int64_t p = 1;
  for (int64_t d : dims) {
    require_nonnegative(d, name);
    if (d != 0 && p > std::numeric_limits<int64_t>::max() / d)
      throw std::invalid_argument(name + ": the sizes' product overflows 64 bits");
    p *= d;
  }
  return p;
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * static_cast<int64_t>(page);
}

void require_allocatable(int64_t elements, int64_t element_size, const std::string& name) {
  require_nonnegative(elements, name);
  const int64_t limit = physical_memory_bytes();
  if (elements > limit / element_size)
    throw std::invalid_argument(name + ": " + to_string(elements) + " values of " + to_string(element_size) +
                                " bytes exceed this machine's memory (" + to_string(limit) + " bytes)");
}

int64_t checked_sum(int64_t a, int64_t b, const std::string& name) {
  if (a > std::numeric_limits<int64_t>::max() - b)
    throw std::invalid_argument(name + ": the sizes' sum overflows 64 bits");
  return a + b;
}

void require_weights(std::initializer_list<std::initializer_list<int64_t>> shapes, int64_t element_size,
                     const std::string& names) {
  int64_t total = 0;
  for (const auto& dims : shapes) total = checked_sum(total, checked_product(dims, names), names);
  require_allocatable(total, element_size, names);
}

}  // namespace transformer_core::ops
