// AVX-512 VNNI GEMMs over packed weights (packed.h): 16 rows x a few tokens per call, and the activation layouts
// they read.
// Q8_0, up to 8 tokens: per block, the 16 rows' quants sit in 8 registers; each token broadcasts 4 activation bytes
// per register and one vpdpbusd advances all 16 rows, so the weights are read once per 8 tokens and no sign fix-up is
// needed per product (the activations carry a +128 bias, removed by starting each block's sum at -128 x the row's
// quant sum). Per row and token the float work is one convert and one FMA per block, always in block order.
// Q4_K, up to 4 tokens: the nibbles are unsigned, so vpdpbusd takes them directly against the signed Q8_K
// activations; per sub-block the exact sum is multiplied by the row's scale (vpmulld), the mins go through the
// activation's sub-block sums (vpdpwssd), and per super-block two FMAs take the float scales.
// g++ 12 warns inside its own 512-bit intrinsics (their _mm512_undefined_* placeholder; GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/byte_loads.h"
#include "backend/cpu/gemm_packed.h"
#include "backend/cpu/packed.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {

template <int C>
void gemm_cols(const PackedGemm& g) {
    const uint8_t* act[C];
    __m512 acc[C];
    for (int c = 0; c < C; ++c) {
        act[c] = g.act + static_cast<size_t>(c) * g.act_stride;
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < g.n_blocks; ++b) {
        const uint8_t* block = g.group + static_cast<size_t>(b) * kPackedQ8_0BlockBytes;
        const size_t a_off = static_cast<size_t>(b) * kBiasedBlockBytes;
        const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(block)));
        const __m512i sums = _mm512_cvtepi16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(block + 32)));
        const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 7));
        // Two integer chains per token (even and odd k) halve the vpdpbusd latency chain; the sum is exact either way.
        __m512i isum[C], odd[C];
        for (int c = 0; c < C; ++c) {
            isum[c] = start;
            odd[c] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int k = 0; k < 8; k += 2) {
            const __m512i w0 = _mm512_load_si512(block + 64 + 64 * k);
            const __m512i w1 = _mm512_load_si512(block + 128 + 64 * k);
            for (int c = 0; c < C; ++c) {
                isum[c] = _mm512_dpbusd_epi32(isum[c], _mm512_set1_epi32(load4(act[c] + a_off + 4 * k)), w0);
                odd[c] = _mm512_dpbusd_epi32(odd[c], _mm512_set1_epi32(load4(act[c] + a_off + 4 * k + 4)), w1);
            }
        }
        for (int c = 0; c < C; ++c) isum[c] = _mm512_add_epi32(isum[c], odd[c]);
        for (int c = 0; c < C; ++c) {
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(load_float(act[c] + a_off + 32)));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), scale, acc[c]);
        }
    }
    const __mmask16 rows = static_cast<__mmask16>((1u << g.n_rows) - 1);
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(g.y + static_cast<size_t>(c) * g.y_stride, rows, acc[c]);
}

template <int C>
void gemm_q4_k_cols(const PackedGemm& g) {
    const uint8_t* act[C];
    __m512 acc[C];
    for (int c = 0; c < C; ++c) {
        act[c] = g.act + static_cast<size_t>(c) * g.act_stride;
        acc[c] = _mm512_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < g.n_blocks; ++b) {
        const uint8_t* block = g.group + static_cast<size_t>(b) * kPackedQ4_KBlockBytes;
        const size_t a_off = static_cast<size_t>(b) * kQ8KSumsBlockBytes;
        __m512i scaled[C], mins[C];
        for (int c = 0; c < C; ++c) scaled[c] = mins[c] = _mm512_setzero_si512();
        for (int p = 0; p < 4; ++p) {
            __m512i lo[C], hi[C];
            for (int c = 0; c < C; ++c) lo[c] = hi[c] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < 8; ++k) {
                const __m512i q = _mm512_load_si512(block + 448 + 512 * p + 64 * k);
                const __m512i q_lo = _mm512_and_si512(q, m4);
                const __m512i q_hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                for (int c = 0; c < C; ++c) {
                    const uint8_t* a = act[c] + a_off + 64 * p + 4 * k;
                    lo[c] = _mm512_dpbusd_epi32(lo[c], q_lo, _mm512_set1_epi32(load4(a)));
                    hi[c] = _mm512_dpbusd_epi32(hi[c], q_hi, _mm512_set1_epi32(load4(a + 32)));
                }
            }
            const __m512i scale_lo = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(block + 64 + 32 * p)));
            const __m512i scale_hi =
                _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(block + 64 + 32 * p + 16)));
            const __m512i min_pair = _mm512_load_si512(block + 192 + 64 * p);
            for (int c = 0; c < C; ++c) {
                scaled[c] = _mm512_add_epi32(scaled[c], _mm512_add_epi32(_mm512_mullo_epi32(lo[c], scale_lo),
                                                                         _mm512_mullo_epi32(hi[c], scale_hi)));
                mins[c] = _mm512_dpwssd_epi32(mins[c], min_pair,
                                              _mm512_set1_epi32(load4(act[c] + a_off + kQK_K + 4 + 4 * p)));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(block)));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(block + 32)));
        for (int c = 0; c < C; ++c) {
            const __m512 da = _mm512_set1_ps(load_float(act[c] + a_off + kQK_K));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(scaled[c]), _mm512_mul_ps(d, da), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins[c]), _mm512_mul_ps(dmin, da), acc[c]);
        }
    }
    const __mmask16 rows = static_cast<__mmask16>((1u << g.n_rows) - 1);
    for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(g.y + static_cast<size_t>(c) * g.y_stride, rows, acc[c]);
}

}  // namespace

void gemm_q4_k_packed(const PackedGemm& g) {
    switch (g.n_cols) {
        case 1: return gemm_q4_k_cols<1>(g);
        case 2: return gemm_q4_k_cols<2>(g);
        case 3: return gemm_q4_k_cols<3>(g);
        default: return gemm_q4_k_cols<4>(g);
    }
}

void gemm_q8_0_packed(const PackedGemm& g) {
    switch (g.n_cols) {
        case 1: return gemm_cols<1>(g);
        case 2: return gemm_cols<2>(g);
        case 3: return gemm_cols<3>(g);
        case 4: return gemm_cols<4>(g);
        case 5: return gemm_cols<5>(g);
        case 6: return gemm_cols<6>(g);
        case 7: return gemm_cols<7>(g);
        default: return gemm_cols<8>(g);
    }
}

}  // namespace strata::cpu
