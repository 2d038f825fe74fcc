// AVX2 attention of one query head over selected cells (ops.h's attend), for head sizes a multiple of 64: scores four
// cells at a time (their lane sums share the shuffles), then the output 64 dimensions at a time in registers over all
// cells. The softmax is ops.h's, so only the summation order of the two products differs from the scalar loop.
#include <immintrin.h>

#include <vector>

#include "backend/cpu/activations_avx512.h"
#include "backend/cpu/ops.h"

namespace strata::cpu {

namespace {

constexpr int kOutRegs = 8;  // ymm registers of output per pass over the cells: 64 dimensions

// Lane i of the result: the total of register i's 8 lanes.
inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

void scores_of(const AttendArgs& a, float* scores) {
    const int64_t n = static_cast<int64_t>(a.cells.size()), d8 = a.head_dim / 8;
    auto key = [&](int64_t c) { return a.keys + static_cast<int64_t>(a.cells[c]) * a.row_stride; };
    const __m128 scale = _mm_set1_ps(a.scale);
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        const float* k[4] = {key(c), key(c + 1), key(c + 2), key(c + 3)};
        __m256 acc[4];
        const __m256 q0 = _mm256_loadu_ps(a.q);
        for (int i = 0; i < 4; ++i) acc[i] = _mm256_mul_ps(q0, _mm256_loadu_ps(k[i]));
        for (int64_t j = 1; j < d8; ++j) {
            const __m256 q = _mm256_loadu_ps(a.q + 8 * j);
            for (int i = 0; i < 4; ++i) acc[i] = _mm256_fmadd_ps(q, _mm256_loadu_ps(k[i] + 8 * j), acc[i]);
        }
        _mm_storeu_ps(scores + c, _mm_mul_ps(scale, sum4(acc[0], acc[1], acc[2], acc[3])));
    }
    for (; c < n; ++c) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(a.q), _mm256_loadu_ps(key(c)));
        for (int64_t j = 1; j < d8; ++j)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.q + 8 * j), _mm256_loadu_ps(key(c) + 8 * j), acc);
        scores[c] = a.scale * _mm_cvtss_f32(sum4(acc, acc, acc, acc));
    }
}

}  // namespace

bool attend_avx2(const AttendArgs& a) {
    if (a.head_dim % (8 * kOutRegs) != 0) return false;
    thread_local std::vector<float> scores;  // grows with the context; no allocation per token after that
    const int64_t n = static_cast<int64_t>(a.cells.size());
    scores.resize(static_cast<size_t>(n));
    scores_of(a, scores.data());
    softmax(scores.data(), n);
    for (int64_t d0 = 0; d0 < a.head_dim; d0 += 8 * kOutRegs) {
        __m256 out[kOutRegs];
        for (int j = 0; j < kOutRegs; ++j) out[j] = _mm256_setzero_ps();
        for (int64_t c = 0; c < n; ++c) {
            const float* v = a.values + static_cast<int64_t>(a.cells[c]) * a.row_stride + d0;
            const __m256 s = _mm256_broadcast_ss(scores.data() + c);
            for (int j = 0; j < kOutRegs; ++j) out[j] = _mm256_fmadd_ps(s, _mm256_loadu_ps(v + 8 * j), out[j]);
        }
        for (int j = 0; j < kOutRegs; ++j) _mm256_storeu_ps(a.out + d0 + 8 * j, out[j]);
    }
    return true;
}

}  // namespace strata::cpu
