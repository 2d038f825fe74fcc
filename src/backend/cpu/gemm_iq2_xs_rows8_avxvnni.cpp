// IQ2_XS prompts with AVX2 and AVX-VNNI (VEX vpdpbusd; compiled with -mavxvnni, called only when CPUID reports it):
// gemm_iq2_xs_rows8_kernels.inc with kVnni = true.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/byte_loads.h"
#include "backend/cpu/gemm_packed.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {
constexpr bool kVnni = true;
#include "backend/cpu/gemm_iq2_xs_rows8_kernels.inc"
}  // namespace

void gemm_iq2_xs_rows8_avxvnni(const Rows8Gemm& g) { rows8_any(g); }

}  // namespace strata::cpu
