// Private to the CUDA backend: the MoE combine's arithmetic (model_ops.h, MoeCombine), shared by moe.cu's combine
// kernel and the hyper-connection read's first kernel, which forms the same values where a combine is pending.
#pragma once

#include <cstdint>

#include "backend/cuda/activation_device.cuh"
#include "backend/cuda/model_ops.h"
#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda::kernels {

// The shared expert's gate dot is formed as 256 partial sums (value i in sum i % 256), eight warp butterflies and the
// eight warp sums added in order, whatever the block's size.
constexpr int kCombineGateSums = 256;
constexpr int kCombineGateWarps = kCombineGateSums / 32;

// sigmoid(gate_w . x) over H values. Every thread of the block calls it (it holds a barrier); blockDim.x is a multiple
// of 32. warp_sums: kCombineGateWarps floats of shared memory, read after the barrier (reuse needs another).
__device__ __forceinline__ float moe_shared_gate(const float* gate_w, const float* x, int64_t H, float* warp_sums) {
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
    const int n_warps = static_cast<int>(blockDim.x) / 32;
    for (int w = warp; w < kCombineGateWarps; w += n_warps) {
        float s = 0.0f;
        for (int64_t i = w * 32 + lane; i < H; i += kCombineGateSums) s = fmaf(gate_w[i], x[i], s);
        s = warp_sum(s);
        if (lane == 0) warp_sums[w] = s;
    }
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < kCombineGateWarps; ++w) s += warp_sums[w];
    return sigmoid(s);
}

// Value j of token t's combine, rounded step by step as moe_forward's loop: the routed experts' sum, which needs no
// gate (so its loads can go before moe_shared_gate's barrier), then the shared expert's term with the gate.
__device__ __forceinline__ float moe_routed_sum(const MoeCombine& c, int64_t t, int64_t j) {
    float o = 0.0f;
    for (int k = 0; k < c.n_used; ++k)
        o = __fadd_rn(o, __fmul_rn(c.weights[t * c.n_used + k], c.expert_out[(t * c.n_used + k) * c.H + j]));
    return o;
}
__device__ __forceinline__ float moe_add_shared(const MoeCombine& c, int64_t t, int64_t j, float routed, float gate) {
    return c.shared_gate ? __fadd_rn(routed, __fmul_rn(gate, c.shared[t * c.H + j])) : routed;
}

}  // namespace strata::cuda::kernels
