// AVX-512 activation quantizers, byte for byte llama.cpp's reference quantizers (quantize_row; compared in
// tests/test_packed_gemm.cpp): the packed GEMMs' layouts and plain Q8_K for the dot kernels. A prompt quantizes every
// matmul input once, and the scalar reference took 4-6% of a prompt.
// g++ 12 warns inside its own 512-bit intrinsics (their _mm512_undefined_* placeholder; GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/gemm_packed.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {

// One Q8_K super-block of x: the quants (16 per register, in order), the scale d and the sum of each 16 quants, as
// quant::quantize_q8_k: iscale = -127 / (the value of largest magnitude, the first on ties), quants rounded to
// nearest even and capped at 127, d = 1 / iscale; an all-zero block is all zeros.
struct Q8KBlock {
    __m128i q[16];
    int32_t sums[16];
    float d;
};

inline void quantize_q8_k_block(const float* x, Q8KBlock& out) {
    const __m512 sign_mask = _mm512_set1_ps(-0.0f);
    __m512 amax_v = _mm512_setzero_ps();
    for (int k = 0; k < 16; ++k) amax_v = _mm512_max_ps(amax_v, _mm512_andnot_ps(sign_mask, _mm512_loadu_ps(x + 16 * k)));
    const float amax = _mm512_reduce_max_ps(amax_v);
    if (amax == 0.0f) {
        std::memset(&out, 0, sizeof out);
        return;
    }
    float max = 0.0f;
    for (int k = 0; k < 16; ++k) {
        const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign_mask, _mm512_loadu_ps(x + 16 * k)),
                                                 _mm512_set1_ps(amax), _CMP_EQ_OQ);
        if (hit) {
            max = x[16 * k + __builtin_ctz(hit)];
            break;
        }
    }
    const float iscale = -127.f / max;
    const __m512 scale = _mm512_set1_ps(iscale);
    for (int k = 0; k < 16; ++k) {
        // vcvtps2dq rounds to nearest even, as nearest_int does for these magnitudes.
        const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(scale, _mm512_loadu_ps(x + 16 * k))),
                                           _mm512_set1_epi32(127));
        out.q[k] = _mm512_cvtepi32_epi8(q);
        out.sums[k] = _mm512_reduce_add_epi32(q);
    }
    out.d = 1 / iscale;
}

}  // namespace

void quantize_q8_0_biased(const float* x, uint8_t* dst, int64_t n) {
    const __m512 sign_mask = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / 32; ++i, x += 32, dst += kBiasedBlockBytes) {
        const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign_mask, x0),
                                                               _mm512_andnot_ps(sign_mask, x1)));
        // The reference: d = amax / 127 stored as f16 (round to nearest even), quants round(x / d) computed with the
        // unrounded d, rounding half away from zero.
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const float d16 = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        __m128i q8[2];
        const __m512 xs[2] = {x0, x1};
        for (int h = 0; h < 2; ++h) {
            const __m512 v = _mm512_mul_ps(xs[h], _mm512_set1_ps(id));
            const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m512 frac = _mm512_sub_ps(v, t);
            __m512i q = _mm512_cvttps_epi32(t);
            q = _mm512_mask_add_epi32(q, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ), q,
                                      _mm512_set1_epi32(1));
            q = _mm512_mask_sub_epi32(q, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), q,
                                      _mm512_set1_epi32(1));
            q8[h] = _mm512_cvtepi32_epi8(_mm512_add_epi32(q, _mm512_set1_epi32(128)));
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), q8[0]);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), q8[1]);
        std::memcpy(dst + 32, &d16, 4);
    }
}


void quantize_q8_k_sums(const float* x, uint8_t* dst, int64_t n) {
    Q8KBlock b;
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K, dst += kQ8KSumsBlockBytes) {
        quantize_q8_k_block(x, b);
        for (int k = 0; k < 16; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * k), b.q[k]);
        std::memcpy(dst + kQK_K, &b.d, 4);
        for (int j = 0; j < 8; ++j) {
            const auto sum = static_cast<int16_t>(b.sums[2 * j] + b.sums[2 * j + 1]);
            std::memcpy(dst + kQK_K + 4 + 2 * j, &sum, 2);
        }
    }
}

void quantize_q8_k_groups(const float* x, uint8_t* dst, int64_t n) {
    Q8KBlock b;
    uint8_t* scales = dst + static_cast<size_t>(n / kQK_K) * kQ8KGroupsBlockBytes;
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K, dst += kQ8KGroupsBlockBytes) {
        quantize_q8_k_block(x, b);
        for (int g = 0; g < 16; ++g) {
            // b.q[g] is group g's 16 quants: its dword k goes to lane g of register k.
            alignas(16) uint8_t q[16];
            _mm_store_si128(reinterpret_cast<__m128i*>(q), b.q[g]);
            for (int k = 0; k < 4; ++k) std::memcpy(dst + 64 * k + 4 * g, q + 4 * k, 4);
            const int32_t start = -64 * b.sums[g];
            std::memcpy(dst + 256 + 4 * g, &start, 4);
        }
        std::memcpy(scales + 4 * i, &b.d, 4);
    }
}

void quantize_q8_k_avx512(const float* x, void* dst, int64_t n) {
    auto* out = static_cast<BlockQ8_K*>(dst);
    Q8KBlock b;
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
        quantize_q8_k_block(x, b);
        for (int k = 0; k < 16; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(out[i].qs + 16 * k), b.q[k]);
        out[i].d = b.d;
        for (int k = 0; k < 16; ++k) out[i].bsums[k] = static_cast<int16_t>(b.sums[k]);
    }
}

}  // namespace strata::cpu
