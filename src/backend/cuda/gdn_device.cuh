// Private to the CUDA backend: the per-value steps of the GDN block around its recurrence, shared by the separate
// kernels (gdn.cu's causal conv, block_ops.cu's activations and gates) and the decode kernel that fuses them
// (block_ops.cu, gdn_conv_activate), so both give the same bits.
#pragma once

#include <cstdint>

#include "backend/cuda/activation_device.cuh"
#include "backend/cuda/block_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda::kernels {

// Channel c of the causal conv over a window: its thread walks the window's tokens in order. Input at time t - m comes
// from x when it lies inside the window, else from the history (row H - (m - t), H = (kernel - 1) * dilation). The
// operations of cpu::causal_conv_step as the host compiler emits them for any x86-64 with FMA (its x86-64-v3/v4
// clones: GCC contracts `out += w * in` in C++ mode): the current input's product rounded, then one fused
// multiply-add per tap from the oldest row.
// causal_conv_outputs does the outputs of tokens [first, end) alone (the history left as it is), and
// causal_conv_history the new history alone, after every output has read the old one.
__device__ __forceinline__ void causal_conv_outputs(const ConvWindowArgs& a, int64_t c, int64_t first, int64_t end) {
    const int64_t K = a.kernel, C = a.channels, H = (K - 1) * a.dilation;
    const float* w = a.w + c * K;
    for (int64_t t = first; t < end; ++t) {
        float acc = __fmul_rn(w[K - 1], a.x[t * a.x_stride + c]);  // _rn: never contracted with the first tap
        for (int64_t j = 0; j < K - 1; ++j) {
            const int64_t m = (K - 1 - j) * a.dilation;
            const float in = t >= m ? a.x[(t - m) * a.x_stride + c] : a.history[(H - (m - t)) * C + c];
            acc = fmaf(w[j], in, acc);
        }
        a.out[t * a.out_stride + c] = acc;
    }
}

// Row r of the new history is time T - H + r: from x inside the window, else the old row r + T (ascending r only
// reads rows not yet rewritten).
__device__ __forceinline__ void causal_conv_history(const ConvWindowArgs& a, int64_t c) {
    const int64_t K = a.kernel, C = a.channels, H = (K - 1) * a.dilation;
    const int64_t T = a.n_tokens;
    for (int64_t r = 0; r < H; ++r) {
        const int64_t time = T - H + r;
        a.history[r * C + c] = time >= 0 ? a.x[time * a.x_stride + c] : a.history[(r + T) * C + c];
    }
}

__device__ __forceinline__ void causal_conv_channel(const ConvWindowArgs& a, int64_t c) {
    causal_conv_outputs(a, c, 0, a.n_tokens);
    causal_conv_history(a, c);
}

// One q or k head of head_dim values at x, by one warp: silu, then cpu::l2_norm (sum of squares in double), then for
// q the q_scale (a second rounding, as the CPU's separate loop). Each lane rewrites only the values it read itself.
__device__ __forceinline__ void gdn_activate_head(float* x, int64_t head_dim, bool is_q, float q_scale) {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    double sum = 0.0;
    for (int64_t i = lane; i < head_dim; i += 32) {
        const float v = silu(x[i]);
        x[i] = v;
        sum += static_cast<double>(v) * v;
    }
    sum = warp_sum(sum);
    const float scale = static_cast<float>(1.0 / sqrt(sum + static_cast<double>(1e-6f)));
    for (int64_t i = lane; i < head_dim; i += 32) {
        const float v = __fmul_rn(x[i], scale);
        x[i] = is_q ? __fmul_rn(v, q_scale) : v;
    }
}

// The gates of item i = t * n_heads + h (gdn_gates), in place.
__device__ __forceinline__ void gdn_gate_item(const GdnGatesArgs& a, int64_t i) {
    const int64_t h = i % a.n_heads;
    a.beta[i] = sigmoid(a.beta[i]);
    a.alpha[i] = __fmul_rn(a.a[h], softplus(__fadd_rn(a.alpha[i], a.dt_bias[h])));
}

}  // namespace strata::cuda::kernels
