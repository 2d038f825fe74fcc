// AVX-512 form of ops.h's gated_delta_step for value heads of 64 or 128: the delta and the output stay in registers
// across the state's rows (the generic loop keeps them in memory, since they may alias the state). Per value the
// operations are the generic loop's, with its multiply-adds as FMAs (what the x86-64-v4 clone of it does).
// g++ 12 warns inside its own 512-bit intrinsics (their _mm512_undefined_* placeholder; GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "backend/cpu/activations_avx512.h"

namespace strata::cpu {

namespace {

template <int N>  // dv = 16 N
void delta_step(const DeltaStepArgs& a) {
    const __m512 decay = _mm512_set1_ps(std::exp(a.g));
    __m512 delta[N];
    for (int j = 0; j < N; ++j) delta[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < a.dk; ++i) {
        float* row = a.state + i * 16 * N;
        const __m512 k = _mm512_set1_ps(a.k[i]);
        for (int j = 0; j < N; ++j) {
            const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * j), decay);
            _mm512_storeu_ps(row + 16 * j, s);
            delta[j] = _mm512_fmadd_ps(s, k, delta[j]);
        }
    }
    const __m512 beta = _mm512_set1_ps(a.beta);
    for (int j = 0; j < N; ++j) delta[j] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(a.v + 16 * j), delta[j]), beta);
    __m512 out[N];
    for (int j = 0; j < N; ++j) out[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < a.dk; ++i) {
        float* row = a.state + i * 16 * N;
        const __m512 k = _mm512_set1_ps(a.k[i]), q = _mm512_set1_ps(a.q[i]);
        for (int j = 0; j < N; ++j) {
            const __m512 s = _mm512_fmadd_ps(k, delta[j], _mm512_loadu_ps(row + 16 * j));
            _mm512_storeu_ps(row + 16 * j, s);
            out[j] = _mm512_fmadd_ps(s, q, out[j]);
        }
    }
    for (int j = 0; j < N; ++j) _mm512_storeu_ps(a.out + 16 * j, out[j]);
}

}  // namespace

bool gated_delta_step_avx512(const DeltaStepArgs& a) {
    switch (a.dv) {
        case 64:
            delta_step<4>(a);
            return true;
        case 128:
            delta_step<8>(a);
            return true;
        default:
            return false;
    }
}

}  // namespace strata::cpu
