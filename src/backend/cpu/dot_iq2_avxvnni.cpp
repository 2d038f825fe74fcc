// IQ2_XS prompts with AVX-VNNI: 8 decoded rows (decode_iq2_xs_rows8, gemm_packed.h) against up to 4 tokens. Per
// group of 16 weights, 4 vpdpbusd of the broadcast biased activations with the 8 rows' signed weights give each row's
// exact biased group dot; vpmulld by the rows' odd scales adds it to the super-block's sum, which starts at minus the
// bias term. Per output and super-block the float work is the AVX2 row kernel's (dot_iq2_avx2.cpp): one FMA of the
// exact super-block integer, then 0.125x at the end, so its bits.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/gemm_packed.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {

inline int32_t load4(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

template <int C>
void rows8_c(const Rows8Gemm& g) {
    const uint8_t* act[C];
    __m256 acc[C];
    for (int c = 0; c < C; ++c) {
        act[c] = g.act + static_cast<size_t>(c) * g.act_stride;
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < g.n / kQK_K; ++i) {
        const uint8_t* blk = static_cast<const uint8_t*>(g.decoded) + static_cast<size_t>(i) * kIq2XsRows8BlockBytes;
        const size_t a_off = static_cast<size_t>(i) * kBiasedQ8KBlockBytes;
        const __m256i start =
            _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + 2560)));
        __m256i sum[C];
        for (int c = 0; c < C; ++c) sum[c] = start;
        for (int grp = 0; grp < 16; ++grp) {
            __m256i dot[C];
            for (int c = 0; c < C; ++c) dot[c] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) {
                const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + 32 * (4 * grp + k)));
                for (int c = 0; c < C; ++c)
                    dot[c] = _mm256_dpbusd_avx_epi32(
                        dot[c], _mm256_set1_epi32(load4(act[c] + a_off + 16 * grp + 4 * k)), w);
            }
            const __m256i scale = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + 2048 + 32 * grp));
            for (int c = 0; c < C; ++c) sum[c] = _mm256_add_epi32(sum[c], _mm256_mullo_epi32(dot[c], scale));
        }
        const __m256 dw = _mm256_load_ps(reinterpret_cast<const float*>(blk + 2592));
        for (int c = 0; c < C; ++c) {
            float da;
            std::memcpy(&da, act[c] + a_off + kQK_K, 4);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[c]), _mm256_mul_ps(dw, _mm256_set1_ps(da)), acc[c]);
        }
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i rows = _mm256_cmpgt_epi32(_mm256_set1_epi32(g.n_rows), lane);
    for (int c = 0; c < C; ++c)
        _mm256_maskstore_ps(g.y + static_cast<size_t>(c) * g.y_stride, rows,
                            _mm256_mul_ps(acc[c], _mm256_set1_ps(0.125f)));
}

}  // namespace

void gemm_iq2_xs_rows8_avxvnni(const Rows8Gemm& g) {
    switch (g.n_cols) {
        case 1: return rows8_c<1>(g);
        case 2: return rows8_c<2>(g);
        case 3: return rows8_c<3>(g);
        default: return rows8_c<4>(g);
    }
}

}  // namespace strata::cpu
