// The Q8_0 GEMM for prompts with AVX2 alone (no AVX-VNNI): a unit's 16-row group widened once to int16, then each
// half against the tokens' int16 activations, per 2 quants x 8 rows and token one vpmaddwd and one vpaddd. The int8
// form (gemm_packed_avx2_kernels.inc) needs vpsignb, vpmaddubsw and vpmaddwd per 4 quants, all three on the two
// multiply ports; here half of the operations are adds, which the third vector port takes too (bench/NOTES.md,
// 2026-12-08). Same exact integer per block and the same FMA with d_w x d_a, so the bits of the other Q8_0 GEMMs.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/byte_loads.h"
#include "backend/cpu/gemm_packed.h"
#include "backend/cpu/packed.h"

namespace strata::cpu {

namespace {

inline void store_rows(float* y, __m256 v, int n) {
    if (n >= 8) {
        _mm256_storeu_ps(y, v);
        return;
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane), v);
}

// C tokens against half h. The float accumulators live in memory (one load and store per block and token) so that
// the C int32 sums keep registers; the empty asm keeps each sum a chain (GCC otherwise reassociates them into trees
// and spills, as in q8_0_tokens).
template <int C>
void i16_pass(const PackedGemm& g, int h, int t0) {
    // Zeroed by vector stores of an opaque zero: GCC turns a zeroing loop into rep stos, 4% of this kernel's samples.
    alignas(32) float acc[C][8];
    __m256 zero = _mm256_setzero_ps();
    asm("" : "+x"(zero));
    for (int c = 0; c < C; ++c) _mm256_store_ps(acc[c], zero);
    const uint8_t* half = g.group + static_cast<size_t>(h) * static_cast<size_t>(g.n_blocks) * kI16HalfBlockBytes;
    const uint8_t* act = g.act + static_cast<size_t>(t0) * g.act_stride;
    for (int64_t b = 0; b < g.n_blocks; ++b) {
        const uint8_t* block = half + static_cast<size_t>(b) * kI16HalfBlockBytes;
        const size_t a_off = static_cast<size_t>(b) * kI16BlockBytes;
        __m256i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
#pragma GCC unroll 16
        for (int k = 0; k < 16; ++k) {
            const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + 32 + 32 * k));
            for (int c = 0; c < C; ++c) {
                const __m256i a = _mm256_set1_epi32(load4(act + static_cast<size_t>(c) * g.act_stride + a_off + 4 * k));
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(w, a));
                asm("" : "+x"(isum[c]));
            }
        }
        const __m256 dw = _mm256_load_ps(reinterpret_cast<const float*>(block));
        for (int c = 0; c < C; ++c) {
            const float da = load_float(act + static_cast<size_t>(c) * g.act_stride + a_off + 64);
            const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(da));
            _mm256_store_ps(acc[c], _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), scale, _mm256_load_ps(acc[c])));
        }
    }
    for (int c = 0; c < C; ++c)
        store_rows(g.y + static_cast<size_t>(t0 + c) * g.y_stride + 8 * h, _mm256_load_ps(acc[c]), g.n_rows - 8 * h);
}

template <int C>
void i16_tokens(const PackedGemm& g, int t0) {
    for (int h = 0; h < 2 && 8 * h < g.n_rows; ++h) i16_pass<C>(g, h, t0);
}

}  // namespace

void widen_q8_0_group_avx2(const uint8_t* group, int64_t n_blocks, uint8_t* wide) {
    // Within each 128-bit lane (4 rows x 4 quants): quants 0-1 of the 4 rows, then quants 2-3.
    const __m256i pairs = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                                           13, 2, 3, 6, 7, 10, 11, 14, 15);
    for (int h = 0; h < 2; ++h) {
        uint8_t* half = wide + static_cast<size_t>(h) * static_cast<size_t>(n_blocks) * kI16HalfBlockBytes;
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* src = group + static_cast<size_t>(b) * kPackedQ8_0BlockBytes;
            uint8_t* dst = half + static_cast<size_t>(b) * kI16HalfBlockBytes;
            _mm256_store_ps(reinterpret_cast<float*>(dst),
                            _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(src + 16 * h))));
            for (int k = 0; k < 8; ++k) {
                const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + 64 + 64 * k + 32 * h));
                // [quants 0-1 of rows 0-7 | quants 2-3 of rows 0-7]
                const __m256i by_pair = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(q, pairs), 0xD8);
                _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32 + 64 * k),
                                   _mm256_cvtepi8_epi16(_mm256_castsi256_si128(by_pair)));
                _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 64 + 64 * k),
                                   _mm256_cvtepi8_epi16(_mm256_extracti128_si256(by_pair, 1)));
            }
        }
    }
}

void gemm_q8_0_i16_avx2(const PackedGemm& g) {
    int t = 0;
    for (; t + 8 <= g.n_cols; t += 8) i16_tokens<8>(g, t);
    switch (g.n_cols - t) {
        case 1:
            return i16_tokens<1>(g, t);
        case 2:
            return i16_tokens<2>(g, t);
        case 3:
            return i16_tokens<3>(g, t);
        case 4:
            return i16_tokens<4>(g, t);
        case 5:
            return i16_tokens<5>(g, t);
        case 6:
            return i16_tokens<6>(g, t);
        case 7:
            return i16_tokens<7>(g, t);
        default:
            return;
    }
}

}  // namespace strata::cpu
