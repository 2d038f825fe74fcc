#include "model/dense_ffn.h"

#include "backend/cpu/ops.h"

namespace strata {

DenseFfnWeights bind_dense_ffn(const TensorBinder& binder, int64_t block, int64_t H, int64_t n_ff) {
    DenseFfnWeights w;
    w.n_ff = n_ff;
    w.gate = binder.require(block_tensor(block, "ffn_gate.weight"), {H, n_ff});
    w.up = binder.require(block_tensor(block, "ffn_up.weight"), {H, n_ff});
    w.down = binder.require(block_tensor(block, "ffn_down.weight"), {n_ff, H});
    return w;
}

void dense_ffn_forward(const DenseFfnForwardArgs& a) {
    const int64_t T = a.n_tokens, F = a.weights.n_ff;
    float* g = a.scratch.take<float>(T * F);
    float* u = a.scratch.take<float>(T * F);
    const cpu::MatmulJob jobs[] = {{.w = &a.weights.gate, .x = a.x, .y = g, .n_tokens = T},
                                   {.w = &a.weights.up, .x = a.x, .y = u, .n_tokens = T}};
    cpu::matmul_many(jobs, a.pool);
    parallel_each(a.pool, T, [&](int64_t t) { cpu::silu_mul(g + t * F, u + t * F, F); });
    cpu::matmul({.w = a.weights.down, .x = g, .y = a.out, .n_tokens = T, .pool = a.pool});
}

}  // namespace strata
