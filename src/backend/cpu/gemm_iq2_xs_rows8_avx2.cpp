// IQ2_XS prompts with AVX2 alone (vpmaddubsw and vpmaddwd):
// gemm_iq2_xs_rows8_kernels.inc with kVnni = false.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/byte_loads.h"
#include "backend/cpu/gemm_packed.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {
constexpr bool kVnni = false;
#include "backend/cpu/gemm_iq2_xs_rows8_kernels.inc"
}  // namespace

void gemm_iq2_xs_rows8_avx2(const Rows8Gemm& g) { rows8_any(g); }

}  // namespace strata::cpu
