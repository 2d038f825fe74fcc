// Private to the CUDA backend: cpu::silu, cpu::sigmoid and cpu::softplus as every kernel computes them, with the
// device's expf and IEEE division (no fast math in this backend), so that all give the CPU's formula's bits.
#pragma once

namespace strata::cuda::kernels {

__device__ __forceinline__ float silu(float x) {
    return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}
// Linear above 20.
__device__ __forceinline__ float softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

}  // namespace strata::cuda::kernels
