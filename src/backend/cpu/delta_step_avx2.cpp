// AVX2 form of ops.h's gated_delta_step for value heads a multiple of 32 wide: 32 value columns at a time, their
// delta and output in registers across the state's rows (16 ymm registers cannot hold a 64-wide head's delta, output,
// k and q at once). Each column only ever reads its own delta, so the column blocks are independent; per value the
// operations are the generic loop's with its multiply-adds as FMAs: the bits of its x86-64-v3 copy and of the
// AVX-512 kernel.
#include <immintrin.h>

#include <cmath>

#include "backend/cpu/activations_avx512.h"

namespace strata::cpu {

namespace {

constexpr int kRegs = 4;  // ymm registers of delta (and of output) per column block: 32 columns

void delta_columns(const DeltaStepArgs& a, int64_t col, __m256 decay) {
    __m256 delta[kRegs], out[kRegs];
    for (int j = 0; j < kRegs; ++j) delta[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < a.dk; ++i) {
        float* row = a.state + i * a.dv + col;
        const __m256 k = _mm256_broadcast_ss(a.k + i);
        for (int j = 0; j < kRegs; ++j) {
            const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(row + 8 * j), decay);
            _mm256_storeu_ps(row + 8 * j, s);
            delta[j] = _mm256_fmadd_ps(s, k, delta[j]);
        }
    }
    const __m256 beta = _mm256_set1_ps(a.beta);
    for (int j = 0; j < kRegs; ++j) {
        delta[j] = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(a.v + col + 8 * j), delta[j]), beta);
        out[j] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < a.dk; ++i) {
        float* row = a.state + i * a.dv + col;
        const __m256 k = _mm256_broadcast_ss(a.k + i), q = _mm256_broadcast_ss(a.q + i);
        for (int j = 0; j < kRegs; ++j) {
            const __m256 s = _mm256_fmadd_ps(k, delta[j], _mm256_loadu_ps(row + 8 * j));
            _mm256_storeu_ps(row + 8 * j, s);
            out[j] = _mm256_fmadd_ps(s, q, out[j]);
        }
    }
    for (int j = 0; j < kRegs; ++j) _mm256_storeu_ps(a.out + col + 8 * j, out[j]);
}

}  // namespace

bool gated_delta_step_avx2(const DeltaStepArgs& a) {
    if (a.dv % (8 * kRegs) != 0) return false;
    const __m256 decay = _mm256_set1_ps(std::exp(a.g));
    for (int64_t col = 0; col < a.dv; col += 8 * kRegs) delta_columns(a, col, decay);
    return true;
}

}  // namespace strata::cpu
