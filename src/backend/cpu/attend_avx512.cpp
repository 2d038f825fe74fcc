// AVX-512 attention of one query head over selected cells (ops.h's attend): the query and the output stay in
// registers (head_dim / 16 of each); scores are made four cells at a time so that their lane sums share the
// shuffles. The softmax is ops.h's, so only the summation order of the two products differs from the scalar loop.
// g++ 12 warns inside its own 512-bit intrinsics (their _mm512_undefined_* placeholder; GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <vector>

#include "backend/cpu/activations_avx512.h"
#include "backend/cpu/ops.h"

namespace strata::cpu {

namespace {

// The 16 lanes of four registers summed: lane i of the result is register i's total.
inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    auto half = [](__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); };
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(half(a), half(b)), _mm256_hadd_ps(half(c), half(d)));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

template <int N>  // head_dim = 16 N
void attend_n(const AttendArgs& a, float* scores) {
    const int64_t n = static_cast<int64_t>(a.cells.size());
    __m512 q[N];
    for (int j = 0; j < N; ++j) q[j] = _mm512_loadu_ps(a.q + 16 * j);
    auto key = [&](int64_t c) { return a.keys + static_cast<int64_t>(a.cells[c]) * a.row_stride; };
    const __m128 scale = _mm_set1_ps(a.scale);
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        const float* k[4] = {key(c), key(c + 1), key(c + 2), key(c + 3)};
        __m512 acc[4];
        for (int i = 0; i < 4; ++i) {
            acc[i] = _mm512_mul_ps(q[0], _mm512_loadu_ps(k[i]));
            for (int j = 1; j < N; ++j) acc[i] = _mm512_fmadd_ps(q[j], _mm512_loadu_ps(k[i] + 16 * j), acc[i]);
        }
        _mm_storeu_ps(scores + c, _mm_mul_ps(scale, sum4(acc[0], acc[1], acc[2], acc[3])));
    }
    for (; c < n; ++c) {
        __m512 acc = _mm512_mul_ps(q[0], _mm512_loadu_ps(key(c)));
        for (int j = 1; j < N; ++j) acc = _mm512_fmadd_ps(q[j], _mm512_loadu_ps(key(c) + 16 * j), acc);
        scores[c] = a.scale * _mm512_reduce_add_ps(acc);
    }
    softmax(scores, n);
    __m512 out[N];
    for (int j = 0; j < N; ++j) out[j] = _mm512_setzero_ps();
    for (c = 0; c < n; ++c) {
        const float* v = a.values + static_cast<int64_t>(a.cells[c]) * a.row_stride;
        const __m512 s = _mm512_set1_ps(scores[c]);
        for (int j = 0; j < N; ++j) out[j] = _mm512_fmadd_ps(s, _mm512_loadu_ps(v + 16 * j), out[j]);
    }
    for (int j = 0; j < N; ++j) _mm512_storeu_ps(a.out + 16 * j, out[j]);
}

}  // namespace

bool attend_avx512(const AttendArgs& a) {
    thread_local std::vector<float> scores;  // grows with the context; no allocation per token after that
    scores.resize(a.cells.size());
    switch (a.head_dim) {
        case 64:
            attend_n<4>(a, scores.data());
            return true;
        case 128:
            attend_n<8>(a, scores.data());
            return true;
        case 256:
            attend_n<16>(a, scores.data());
            return true;
        default:
            return false;
    }
}

}  // namespace strata::cpu
