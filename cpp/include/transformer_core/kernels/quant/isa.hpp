// Which instruction set the quantized kernels use, chosen at RUN time.
//
// One build runs on any x86-64: every ISA variant of the kernels is compiled in its own translation
// unit with its own flags (cpp/src/kernels/quant_<isa>.cpp), and the CPU's features (cpuid, and
// xgetbv for the register state the OS saves) decide which variants may run:
//   scalar      portable C++, the reference and the fallback (any CPU)
//   avx2        AVX2 + FMA + F16C, vpmaddubsw integer dots (Intel Haswell+, AMD Zen+)
//   avx512vnni  AVX-512 F/BW/VL/DQ + VNNI, vpdpbusd integer dots (Intel Ice Lake+, AMD Zen 4+)
//   amx         avx512vnni + AMX-TILE/INT8/BF16: the int8 product on tiles, tdpbssd, and the fp32
//               linear layer as six bf16 products, tdpbf16ps (sgemm.hpp; Intel Sapphire Rapids+);
//               on Linux, once the kernel grants the process the tile state (arch_prctl)
// The default is the best one the CPU has; the environment variable TC_ISA=scalar|avx2|avx512vnni|amx,
// read once, overrides it, and set_active_isa() changes it at run time (tests run every path).
//
// Every ISA gives the same bits in the quantized kernels: they fix the order of every floating-point
// operation (see kernels.hpp), so the choice changes the speed, never the result. The fp32 GEMM
// follows the same switch (sgemm.hpp): avx2 and avx512vnni give the same bits; amx's fp32 linear
// layer sums in another order (same accuracy, other bits).
#pragma once

#include <string>
#include <vector>

namespace transformer_core::kernels::quant {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2, kAmx = 3 };

// "scalar", "avx2", "avx512vnni", "amx".
const char* isa_name(Isa isa);
// Parses an ISA name; throws std::invalid_argument naming the known ones otherwise.
Isa parse_isa(const std::string& name);
// Whether this CPU (and its OS) can run the ISA's kernels, and whether this build has them.
bool isa_supported(Isa isa);
// The ISAs isa_supported() accepts, slowest first.
std::vector<Isa> supported_isas();
// The fastest supported ISA.
Isa best_isa();
// The ISA the kernels use now: set_active_isa()'s, else TC_ISA's (read at the first call), else
// best_isa(). Throws std::invalid_argument while TC_ISA names an unknown or unsupported ISA and
// set_active_isa() has not been called.
Isa active_isa();
// Throws std::invalid_argument if the ISA is not supported here.
void set_active_isa(Isa isa);

}  // namespace transformer_core::kernels::quant
