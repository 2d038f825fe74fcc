// AVX2 sigmoid and SiLU over arrays: activations_avx512.cpp's exp (Cephes' polynomial) on 8 lanes. Without
// vscalefps, 2^n is applied as two exact powers of two, 2^(n >> 1) then 2^(n - (n >> 1)), each a normal float for the
// clamped range: only the second multiply can round (into a subnormal) or overflow, as vscalefps does once.
#include <immintrin.h>

#include "backend/cpu/activations_avx512.h"

namespace strata::cpu {

namespace {

inline __m256 pow2(__m256i n) {  // n in [-75, 64]
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}

inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-104.0f)), _mm256_set1_ps(89.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(ni, 1);
    return _mm256_mul_ps(_mm256_mul_ps(e, pow2(half)), pow2(_mm256_sub_epi32(ni, half)));
}

inline __m256 sigmoid8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

// fn over whole registers, then the tail under a mask.
template <class Fn>
inline void each8(int64_t n, Fn fn) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) fn(i, _mm256_set1_epi32(-1));
    if (i < n) fn(i, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), lane));
}

}  // namespace

void sigmoid_avx2(float* x, int64_t n) {
    each8(n, [&](int64_t i, __m256i m) { _mm256_maskstore_ps(x + i, m, sigmoid8(_mm256_maskload_ps(x + i, m))); });
}

void silu_avx2(float* x, int64_t n) {
    each8(n, [&](int64_t i, __m256i m) {
        const __m256 v = _mm256_maskload_ps(x + i, m);
        _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(v, sigmoid8(v)));
    });
}

void silu_mul_avx2(float* g, const float* u, int64_t n) {
    each8(n, [&](int64_t i, __m256i m) {
        const __m256 v = _mm256_maskload_ps(g + i, m);
        _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(_mm256_mul_ps(v, sigmoid8(v)), _mm256_maskload_ps(u + i, m)));
    });
}

}  // namespace strata::cpu
