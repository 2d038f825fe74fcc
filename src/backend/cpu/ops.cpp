#include "backend/cpu/ops.h"

#include <algorithm>
#include <numeric>

#include "backend/cpu/activations_avx512.h"
#include "backend/cpu/isa_clones.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/quant_dot.h"
#include "core/error.h"

namespace strata::cpu {

float dot(const float* a, const float* b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

Tensor matrix_view(const Tensor& w, int64_t slice, int64_t row_begin, int64_t n_rows) {
    STRATA_ASSERT(slice >= 0 && slice < w.ne[2] && w.ne[3] == 1);
    STRATA_ASSERT(row_begin >= 0 && n_rows >= 0 && row_begin + n_rows <= w.ne[1]);
    Tensor v = w;
    v.n_dims = 2;
    v.ne[1] = n_rows;
    v.ne[2] = 1;
    v.ne[3] = 1;
    v.nb[2] = v.nb[1] * static_cast<size_t>(n_rows);
    v.nb[3] = v.nb[2];
    v.data = static_cast<const uint8_t*>(w.data) + w.nb[2] * static_cast<size_t>(slice) +
             w.nb[1] * static_cast<size_t>(row_begin);
    v.packed = packed_rows(w, slice, row_begin);
    return v;
}

void get_row(const Tensor& t, int64_t row, float* out) {
    STRATA_ASSERT(row >= 0 && row < t.n_rows());
    dequantize_row(t.type, t.row(row), out, t.ne[0]);
}

std::vector<float> to_f32(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    for (int64_t r = 0; r < t.n_rows(); ++r) dequantize_row(t.type, t.row(r), v.data() + r * t.ne[0], t.ne[0]);
    return v;
}

namespace {

// The sum of squares in double, in eight interleaved partial sums combined in a fixed order: one chain of dependent
// additions took four cycles per element.
__attribute__((always_inline)) static inline double sum_of_squares_body(const float* x, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]) * x[i + j];
    for (int j = 0; i < n; ++i, ++j) acc[j] += static_cast<double>(x[i]) * x[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

__attribute__((always_inline)) static inline void scale_rows_body(const float* x, int64_t n, float scale,
                                                                  const float* gamma, float* out) {
    if (gamma) {
        for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * gamma[i];
    } else {
        for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
    }
}

STRATA_ISA_CLONES(double, sum_of_squares, (const float* x, int64_t n), (x, n))
STRATA_ISA_CLONES(void, scale_rows, (const float* x, int64_t n, float scale, const float* gamma, float* out),
                  (x, n, scale, gamma, out))

}  // namespace

void rms_norm(const float* x, int64_t n, const float* gamma, float eps, float* out) {
    const double sum = sum_of_squares(x, n);
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
    scale_rows(x, n, scale, gamma, out);
}

void rms_norm_grouped(const float* x, int64_t n_groups, int64_t group, const float* gamma, float eps, float* out) {
    for (int64_t g = 0; g < n_groups; ++g)
        rms_norm(x + g * group, group, gamma ? gamma + g * group : nullptr, eps, out + g * group);
}

void l2_norm(const float* x, int64_t n, float eps, float* out) {
    const double sum = sum_of_squares(x, n);
    const float scale = static_cast<float>(1.0 / std::sqrt(sum + eps));
    scale_rows(x, n, scale, nullptr, out);
}

void rope_neox(float* x, int64_t n_rot, int64_t pos, float freq_base) {
    STRATA_ASSERT(n_rot % 2 == 0);
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
        const double inv_freq = std::pow(static_cast<double>(freq_base), -2.0 * static_cast<double>(i) / n_rot);
        const double angle = static_cast<double>(pos) * inv_freq;
        const float c = static_cast<float>(std::cos(angle));
        const float s = static_cast<float>(std::sin(angle));
        const float x0 = x[i];
        const float x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x0 * s + x1 * c;
    }
}

void softmax(float* x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

std::vector<int32_t> top_k(const float* values, int64_t n, int64_t k) {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    k = std::clamp<int64_t>(k, 0, n);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return values[a] > values[b] || (values[a] == values[b] && a < b); });
    idx.resize(static_cast<size_t>(k));
    return idx;
}

namespace {
// Tap by tap over all channels, so the inner loops run along the channels; each channel still sums its taps in the
// same order (the current input first, then the history from the oldest row).
__attribute__((always_inline)) static inline void causal_conv_step_body(const ConvStepArgs& a) {
    const int64_t hist_rows = (a.kernel - 1) * a.dilation;
    const int64_t K = a.kernel;
    for (int64_t c = 0; c < a.channels; ++c) a.out[c] = a.w[c * K + K - 1] * a.x[c];
    for (int64_t j = 0; j < K - 1; ++j) {
        const float* row = a.history + (hist_rows - (K - 1 - j) * a.dilation) * a.channels;  // rows before the input
        for (int64_t c = 0; c < a.channels; ++c) a.out[c] += a.w[c * K + j] * row[c];
    }
    conv_history_push(a.history, hist_rows, a.channels, a.x, 1);
}
}  // namespace

void conv_history_push(float* history, int64_t rows, int64_t channels, const float* x, int64_t n) {
    if (rows <= 0 || n <= 0) return;
    if (n >= rows) {
        std::copy_n(x + (n - rows) * channels, rows * channels, history);
        return;
    }
    // The rows that stay move up by n (a copy to lower addresses, which std::copy allows), then x goes last.
    std::copy(history + n * channels, history + rows * channels, history);
    std::copy_n(x, n * channels, history + (rows - n) * channels);
}

STRATA_ISA_CLONES(void, causal_conv_step, (const ConvStepArgs& a), (a))

void sigmoid_inplace(float* x, int64_t n) {
    if (active_isa() == Isa::Avx512) return sigmoid_avx512(x, n);
    if (active_isa() != Isa::Scalar) return sigmoid_avx2(x, n);
    for (int64_t i = 0; i < n; ++i) x[i] = sigmoid(x[i]);
}

void silu_inplace(float* x, int64_t n) {
    if (active_isa() == Isa::Avx512) return silu_avx512(x, n);
    if (active_isa() != Isa::Scalar) return silu_avx2(x, n);
    for (int64_t i = 0; i < n; ++i) x[i] = silu(x[i]);
}

void silu_mul(float* g, const float* u, int64_t n) {
    if (active_isa() == Isa::Avx512) return silu_mul_avx512(g, u, n);
    if (active_isa() != Isa::Scalar) return silu_mul_avx2(g, u, n);
    for (int64_t i = 0; i < n; ++i) g[i] = silu(g[i]) * u[i];
}

namespace {
// Two passes over the state instead of four: decay a row, then add its share of S^T k; update a row, then add its
// share of S^T q. Every value sees the same operations in the same order as in four separate loops. Cloned per
// instruction set (the library is built for baseline x86-64; isa_clones.h). g++ contracts multiply-adds into FMAs in
// the clones that have FMA, so the baseline copy (no AVX2, or STRATA_ISA=scalar) rounds differently in the last bit;
// one process always runs the same copy, so results still never depend on batching or threads.
__attribute__((always_inline)) static inline void gated_delta_step_generic_body(const DeltaStepArgs& a) {
    const float decay = std::exp(a.g);
    thread_local std::vector<float> delta_buffer;  // grows once; no allocation per token
    delta_buffer.assign(static_cast<size_t>(a.dv), 0.0f);
    float* delta = delta_buffer.data();
    for (int64_t i = 0; i < a.dk; ++i) {
        float* row = a.state + i * a.dv;
        for (int64_t j = 0; j < a.dv; ++j) row[j] *= decay;
        for (int64_t j = 0; j < a.dv; ++j) delta[j] += row[j] * a.k[i];
    }
    for (int64_t j = 0; j < a.dv; ++j) delta[j] = (a.v[j] - delta[j]) * a.beta;
    for (int64_t j = 0; j < a.dv; ++j) a.out[j] = 0.0f;
    for (int64_t i = 0; i < a.dk; ++i) {
        float* row = a.state + i * a.dv;
        for (int64_t j = 0; j < a.dv; ++j) row[j] += a.k[i] * delta[j];
        for (int64_t j = 0; j < a.dv; ++j) a.out[j] += row[j] * a.q[i];
    }
}
STRATA_ISA_CLONES(void, gated_delta_step_generic, (const DeltaStepArgs& a), (a))
}  // namespace

void gated_delta_step(const DeltaStepArgs& a) {
    if (active_isa() == Isa::Avx512 && gated_delta_step_avx512(a)) return;
    if ((active_isa() == Isa::Avx2 || active_isa() == Isa::Avx2Vnni) && gated_delta_step_avx2(a)) return;
    gated_delta_step_generic(a);
}

void attend(const AttendArgs& a) {
    if (active_isa() == Isa::Avx512 && attend_avx512(a)) return;
    if ((active_isa() == Isa::Avx2 || active_isa() == Isa::Avx2Vnni) && attend_avx2(a)) return;
    const int64_t n = static_cast<int64_t>(a.cells.size());
    thread_local std::vector<float> scores;  // grows with the context; no allocation per token after that
    scores.resize(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c)
        scores[c] = a.scale * dot(a.q, a.keys + static_cast<int64_t>(a.cells[c]) * a.row_stride, a.head_dim);
    softmax(scores.data(), n);
    for (int64_t d = 0; d < a.head_dim; ++d) a.out[d] = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
        const float* v = a.values + static_cast<int64_t>(a.cells[c]) * a.row_stride;
        for (int64_t d = 0; d < a.head_dim; ++d) a.out[d] += scores[c] * v[d];
    }
}

}  // namespace strata::cpu
