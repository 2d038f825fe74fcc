// AVX-512 sigmoid and SiLU over arrays, for the elementwise gates of a prompt (millions of values per forward, where
// libm's expf one value at a time took ~5% of a prompt). exp is Cephes' single-precision polynomial (range reduction
// by ln 2 in two parts, degree-6 polynomial, 2^n by vscalefps): within 2 ulp of expf, 0 and
// infinity where expf gives them.
// g++ 12 warns inside its own 512-bit intrinsics (their _mm512_undefined_* placeholder; GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/activations_avx512.h"

namespace strata::cpu {

namespace {

inline __m512 exp16(__m512 x) {
    // Past these exp is 0 or overflows to infinity through vscalefps (as expf does); the clamp keeps the reduced
    // argument small.
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(e, n);
}

inline __m512 sigmoid16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

// fn over whole registers, then the tail under a mask.
template <class Fn>
inline void each16(int64_t n, Fn fn) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) fn(i, static_cast<__mmask16>(0xFFFF));
    if (i < n) fn(i, static_cast<__mmask16>((1u << (n - i)) - 1));
}

}  // namespace

void sigmoid_avx512(float* x, int64_t n) {
    each16(n, [&](int64_t i, __mmask16 m) {
        _mm512_mask_storeu_ps(x + i, m, sigmoid16(_mm512_maskz_loadu_ps(m, x + i)));
    });
}

void silu_avx512(float* x, int64_t n) {
    each16(n, [&](int64_t i, __mmask16 m) {
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(v, sigmoid16(v)));
    });
}

void silu_mul_avx512(float* g, const float* u, int64_t n) {
    each16(n, [&](int64_t i, __mmask16 m) {
        const __m512 v = _mm512_maskz_loadu_ps(m, g + i);
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_mul_ps(v, sigmoid16(v)), _mm512_maskz_loadu_ps(m, u + i)));
    });
}

}  // namespace strata::cpu
