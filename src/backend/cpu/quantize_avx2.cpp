// AVX2 activation quantizers, byte for byte llama.cpp's reference quantizers (quantize_row; compared in
// tests/test_packed_gemm.cpp and tests/test_backend_ops.cpp): the packed GEMMs' layouts and plain Q8_K for the dot
// kernels, as quantize_avx512.cpp does for AVX-512 (the reference took 5-8% of an AVX2 prompt).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/gemm_packed.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {

inline float max_of(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

inline int32_t sum_of(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

// 16 int32 in order (a: 0-7, b: 8-15), each within int8 (Signed) or uint8 range, as 16 bytes in order.
template <bool Signed>
inline __m128i pack16(__m256i a, __m256i b) {
    // packs interleave the 128-bit lanes: [a0-3, b0-3, a4-7, b4-7]; the permute puts them back in order.
    const __m256i words = _mm256_permute4x64_epi64(Signed ? _mm256_packs_epi32(a, b) : _mm256_packus_epi32(a, b), 0xD8);
    const __m128i lo = _mm256_castsi256_si128(words), hi = _mm256_extracti128_si256(words, 1);
    return Signed ? _mm_packs_epi16(lo, hi) : _mm_packus_epi16(lo, hi);
}

// One Q8_K super-block of x, as quant::quantize_q8_k: iscale = -127 / (the value of largest magnitude, the first on
// ties), quants rounded to nearest even and capped at 127, d = 1 / iscale; an all-zero block is all zeros.
struct Q8KBlock {
    __m128i q[16];
    int32_t sums[16];
    float d;
};

inline void quantize_q8_k_block(const float* x, Q8KBlock& out) {
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    __m256 amax_v = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k) amax_v = _mm256_max_ps(amax_v, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + 8 * k)));
    const float amax = max_of(amax_v);
    if (amax == 0.0f) {
        std::memset(&out, 0, sizeof out);
        return;
    }
    float max = 0.0f;
    for (int k = 0; k < 32; ++k) {
        const int hit = _mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + 8 * k)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
        if (hit) {
            max = x[8 * k + __builtin_ctz(static_cast<unsigned>(hit))];
            break;
        }
    }
    const float iscale = -127.f / max;
    const __m256 scale = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127);
    for (int k = 0; k < 16; ++k) {
        // vcvtps2dq rounds to nearest even, as nearest_int does for these magnitudes.
        const __m256i a = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(scale, _mm256_loadu_ps(x + 16 * k))), cap);
        const __m256i b =
            _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(scale, _mm256_loadu_ps(x + 16 * k + 8))), cap);
        out.q[k] = pack16<true>(a, b);
        out.sums[k] = sum_of(_mm256_add_epi32(a, b));
    }
    out.d = 1 / iscale;
}

}  // namespace

namespace {

// Biased: the quants + 128 as bytes; Wide: as int16 (kI16BlockBytes a block); neither: as signed bytes.
template <bool Biased, bool Wide = false>
void quantize_q8_0_f32_scale(const float* x, uint8_t* dst, int64_t n) {
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / 32; ++i, x += 32, dst += Wide ? kI16BlockBytes : kBiasedBlockBytes) {
        __m256 xs[4];
        __m256 amax_v = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            xs[k] = _mm256_loadu_ps(x + 8 * k);
            amax_v = _mm256_max_ps(amax_v, _mm256_andnot_ps(sign_mask, xs[k]));
        }
        const float amax = max_of(amax_v);
        // The reference: d = amax / 127 stored as f16 (round to nearest even), quants round(x / d) computed with the
        // unrounded d, rounding half away from zero.
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const float d16 = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        __m256i q[4];
        for (int k = 0; k < 4; ++k) {
            const __m256 v = _mm256_mul_ps(xs[k], _mm256_set1_ps(id));
            const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 frac = _mm256_sub_ps(v, t);
            __m256i qk = _mm256_cvttps_epi32(t);
            // The compares give -1 where true: subtracting the first adds 1, adding the second subtracts 1.
            qk = _mm256_sub_epi32(qk, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
            qk = _mm256_add_epi32(qk, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
            q[k] = Biased ? _mm256_add_epi32(qk, _mm256_set1_epi32(128)) : qk;
        }
        if constexpr (Wide) {
            // packs interleave the 128-bit lanes; the permute puts the 16 int16 back in order.
            for (int k = 0; k < 2; ++k)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * k),
                                    _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2 * k], q[2 * k + 1]), 0xD8));
            std::memcpy(dst + 64, &d16, 4);
        } else {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), pack16<!Biased>(q[0], q[1]));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), pack16<!Biased>(q[2], q[3]));
            std::memcpy(dst + 32, &d16, 4);
        }
    }
}

}  // namespace

void quantize_q8_0_biased_avx2(const float* x, uint8_t* dst, int64_t n) { quantize_q8_0_f32_scale<true>(x, dst, n); }
void quantize_q8_0_signed_avx2(const float* x, uint8_t* dst, int64_t n) { quantize_q8_0_f32_scale<false>(x, dst, n); }

void quantize_q8_0_i16_avx2(const float* x, uint8_t* dst, int64_t n) {
    quantize_q8_0_f32_scale<false, true>(x, dst, n);
}

void quantize_q8_k_sums_avx2(const float* x, uint8_t* dst, int64_t n) {
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

void quantize_q8_k_biased_avx2(const float* x, uint8_t* dst, int64_t n) {
    Q8KBlock b;
    const __m128i bias = _mm_set1_epi8(static_cast<char>(0x80));
    for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K, dst += kBiasedQ8KBlockBytes) {
        quantize_q8_k_block(x, b);
        for (int k = 0; k < 16; ++k)
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * k), _mm_xor_si128(b.q[k], bias));
        std::memcpy(dst + kQK_K, &b.d, 4);
    }
}

void quantize_q8_k_avx2(const float* x, void* dst, int64_t n) {
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
