// The packed GEMMs with AVX2 and AVX-VNNI (VEX vpdpbusd / vpdpwssd; compiled with -mavxvnni, called only when CPUID
// reports it): gemm_packed_avx2_kernels.inc and
// the per-type gemm_packed_*_avx2_kernels.inc with kVnni = true.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/byte_loads.h"
#include "backend/cpu/gemm_packed.h"
#include "backend/cpu/packed.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

namespace {
constexpr bool kVnni = true;
#include "backend/cpu/gemm_packed_avx2_kernels.inc"
#include "backend/cpu/gemm_packed_iq3_avx2_kernels.inc"
#include "backend/cpu/gemm_packed_iq4_xs_avx2_kernels.inc"
#include "backend/cpu/gemm_packed_q6_k_avx2_kernels.inc"
}  // namespace

void gemm_q8_0_packed_avxvnni(const PackedGemm& g) {
    q8_0_any(g);
}
void gemm_q4_k_packed_avxvnni(const PackedGemm& g) {
    q4_k_any<false>(g);
}
void gemm_q5_k_packed_avxvnni(const PackedGemm& g) {
    q4_k_any<true>(g);
}
void gemm_q6_k_packed_avxvnni(const PackedGemm& g) {
    q6_k_any(g);
}
void gemm_iq4_xs_packed_avxvnni(const PackedGemm& g) {
    iq4_xs_any(g);
}
void gemm_iq3_xxs_packed_avxvnni(const PackedGemm& g) {
    iq3_any<false>(g);
}
void gemm_iq3_s_packed_avxvnni(const PackedGemm& g) {
    iq3_any<true>(g);
}

}  // namespace strata::cpu
