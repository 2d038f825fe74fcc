// Private to the CUDA backend: the hyper-connection read's last per-value steps, shared by hyper_connection.cu's mix
// kernel and the up product that forms them in its epilogue (matvec_kernels.cuh), so both give the same bits.
// Products and sums are rounded step by step (no contraction), as the CPU (model/hyper_connection.cpp).
#pragma once

#include <cstdint>

#include "backend/cuda/activation_device.cuh"

namespace strata::cuda::kernels {

// (sum over streams s < hc, in order, of sigmoid(gate(s)) * x(s)) / hc.
template <typename Gate, typename X>
__device__ __forceinline__ float hc_mix_value(int64_t hc, Gate gate, X x) {
    float sum = 0.0f;
    for (int64_t s = 0; s < hc; ++s) {
        sum = __fadd_rn(sum, __fmul_rn(sigmoid(gate(s)), x(s)));
    }
    return sum / static_cast<float>(hc);
}

// The raw inject product of row r from the streams' shares (shares[s * hc + r]), added in stream order.
__device__ __forceinline__ float hc_inject_from_shares(const float* shares, int64_t hc, int64_t r) {
    float raw = 0.0f;
    for (int64_t s = 0; s < hc; ++s) raw += shares[s * hc + r];
    return raw;
}

// The transformed inject of one row: 2 * sigmoid(raw / hc).
__device__ __forceinline__ float hc_inject_value(float raw, int64_t hc) {
    const float v = raw / static_cast<float>(hc);
    return 2.0f * sigmoid(v);
}

}  // namespace strata::cuda::kernels
