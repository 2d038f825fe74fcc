#include "model/hyper_connection.h"

#include "backend/cpu/ops.h"
#include "core/error.h"

namespace strata {

HyperConnectionWeights bind_hyper_connection(const TensorBinder& binder, const std::string& prefix,
                                             const HyperConnectionShape& shape, bool with_inject) {
    const int64_t hc_width = shape.n_streams * shape.n_embd;
    HyperConnectionWeights w;
    w.norm = binder.require_f32(prefix + "_norm.weight", {hc_width});
    w.down = binder.require(prefix + "_down.weight", {hc_width, shape.low_rank});
    w.up = binder.require(prefix + "_up.weight", {shape.low_rank, hc_width});
    if (with_inject) w.inject = binder.require(prefix + "_inject.weight", {hc_width, shape.n_streams});
    return w;
}

void hyper_connection_read(const HyperConnectionReadArgs& a) {
    const int64_t hc = a.shape.n_streams;
    const int64_t H = a.shape.n_embd;
    const int64_t HC = hc * H;
    const int64_t T = a.n_tokens;
    const int64_t R = a.shape.low_rank;
    float* xn = a.scratch.take<float>(T * HC);
    parallel_each(a.pool, T, [&](int64_t t) {
        cpu::rms_norm_grouped(a.residual + t * HC, hc, H, a.weights.norm.data(), a.shape.eps, xn + t * HC);
    });

    // down and inject read the same normalized streams: one pass quantizes them once for both.
    float* low = a.scratch.take<float>(T * R);
    if (a.inject) {
        STRATA_ASSERT(a.weights.inject.has_value());
        const cpu::MatmulJob jobs[] = {{.w = &a.weights.down, .x = xn, .y = low, .n_tokens = T},
                                       {.w = &*a.weights.inject, .x = xn, .y = a.inject, .n_tokens = T}};
        cpu::matmul_many(jobs, a.pool);
    } else {
        cpu::matmul({.w = a.weights.down, .x = xn, .y = low, .n_tokens = T, .pool = a.pool});
    }
    parallel_each(a.pool, T, [&](int64_t t) {
        for (int64_t i = t * R; i < (t + 1) * R; ++i) low[i] /= static_cast<float>(hc);
        cpu::silu_inplace(low + t * R, R);
    });
    float* gate = a.scratch.take<float>(T * HC);
    cpu::matmul({.w = a.weights.up, .x = low, .y = gate, .n_tokens = T, .pool = a.pool});

    parallel_each(a.pool, T, [&](int64_t t) {
        float* g = gate + t * HC;
        const float* x = xn + t * HC;
        float* m = a.mixed + t * H;
        cpu::sigmoid_inplace(g, HC);
        // Stream by stream over the whole row, so each loop vectorizes (with the streams innermost it ran scalar, ~2%
        // of a prompt); per element the same sum from 0 in stream order, then the same division.
        for (int64_t j = 0; j < H; ++j) m[j] = 0.0f;
        for (int64_t s = 0; s < hc; ++s)
            for (int64_t j = 0; j < H; ++j) m[j] += g[s * H + j] * x[s * H + j];
        for (int64_t j = 0; j < H; ++j) m[j] /= static_cast<float>(hc);
    });
    if (a.inject)
        for (int64_t i = 0; i < T * hc; ++i) a.inject[i] = 2.0f * cpu::sigmoid(a.inject[i] / static_cast<float>(hc));
}

void hyper_connection_write(const HyperConnectionShape& shape, float* residual, const float* block_out,
                            const float* inject, int64_t n_tokens, ThreadPool* pool) {
    const int64_t hc = shape.n_streams;
    const int64_t H = shape.n_embd;
    parallel_each(pool, n_tokens, [&](int64_t t) {
        for (int64_t s = 0; s < hc; ++s) {
            float* r = residual + (t * hc + s) * H;
            const float w = inject[t * hc + s];
            for (int64_t j = 0; j < H; ++j) r[j] += w * block_out[t * H + j];
        }
    });
}

}  // namespace strata
