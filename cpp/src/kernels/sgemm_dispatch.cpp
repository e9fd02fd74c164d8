// Which fp32 GEMM kernels run (sgemm.hpp): the active ISA's (quant/isa.hpp). Compiled for the
// baseline x86-64, like quant_dispatch.cpp.
#include <stdexcept>

#include "transformer_core/kernels/quant/isa.hpp"
#include "transformer_core/kernels/sgemm.hpp"

namespace transformer_core::kernels::sgemm {

#if defined(__x86_64__) || defined(_M_X64)
namespace {

// The active ISA; with a bad TC_ISA the quantized ops say so, and fp32 runs on the best one.
quant::Isa fp32_isa() {
  try {
    return quant::active_isa();
  } catch (const std::invalid_argument&) {
    return quant::best_isa();
  }
}

}  // namespace
#endif

const Kernels* active() {
#if defined(__x86_64__) || defined(_M_X64)
  using quant::Isa;
  const Isa isa = fp32_isa();
  if (isa == Isa::kAvx512Vnni || isa == Isa::kAmx) return &avx512_kernels();
  if (quant::isa_supported(Isa::kAvx2)) return &avx2_kernels();  // "avx2", and "scalar": the same bits
#endif
  return nullptr;
}

namespace split {

const Kernels* active() {
#if defined(__x86_64__) || defined(_M_X64)
  if (fp32_isa() == quant::Isa::kAmx) return &amx_kernels();
#endif
  return nullptr;
}

}  // namespace split

}  // namespace transformer_core::kernels::sgemm
