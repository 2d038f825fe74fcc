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
    std::vector<float> xn(static_cast<size_t>(T * HC));
    for (int64_t t = 0; t < T; ++t)
        cpu::rms_norm_grouped(a.residual + t * HC, hc, H, a.weights.norm.data(), a.shape.eps, xn.data() + t * HC);

    std::vector<float> low(static_cast<size_t>(T * a.shape.low_rank));
    cpu::matmul({.w = a.weights.down, .x = xn.data(), .y = low.data(), .n_tokens = T, .pool = a.pool});
    for (float& v : low) v = cpu::silu(v / static_cast<float>(hc));
    std::vector<float> gate(static_cast<size_t>(T * HC));
    cpu::matmul({.w = a.weights.up, .x = low.data(), .y = gate.data(), .n_tokens = T, .pool = a.pool});

    for (int64_t t = 0; t < T; ++t) {
        const float* g = gate.data() + t * HC;
        const float* x = xn.data() + t * HC;
        float* m = a.mixed + t * H;
        for (int64_t j = 0; j < H; ++j) {
            float sum = 0.0f;
            for (int64_t s = 0; s < hc; ++s) sum += cpu::sigmoid(g[s * H + j]) * x[s * H + j];
            m[j] = sum / static_cast<float>(hc);
        }
    }
    if (a.inject) {
        STRATA_ASSERT(a.weights.inject.has_value());
        cpu::matmul({.w = *a.weights.inject, .x = xn.data(), .y = a.inject, .n_tokens = T, .pool = a.pool});
        for (int64_t i = 0; i < T * hc; ++i) a.inject[i] = 2.0f * cpu::sigmoid(a.inject[i] / static_cast<float>(hc));
    }
}

void hyper_connection_write(const HyperConnectionShape& shape, float* residual, const float* block_out,
                            const float* inject, int64_t n_tokens) {
    const int64_t hc = shape.n_streams;
    const int64_t H = shape.n_embd;
    for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t s = 0; s < hc; ++s) {
            float* r = residual + (t * hc + s) * H;
            const float w = inject[t * hc + s];
            for (int64_t j = 0; j < H; ++j) r[j] += w * block_out[t * H + j];
        }
}

}  // namespace strata
