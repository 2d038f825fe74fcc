// Private to the CUDA backend: one warp's RMS norm of a group, with the CPU reference's rounding (the sum of squares in
// double, each square exact, so only the order of the additions differs; the scale rounded to float). Shared by the
// grouped norm (elementwise.cu) and the head norms of block_ops.cu (norm-then-rope, the gated norm, the indexer's
// pooled keys), so that the fused and separate forms give the same bits.
#pragma once

#include <cstdint>

#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda::kernels {

// Lane-strided sum of x[i] squared over i < n, in double, in every lane (a butterfly over the lanes).
__device__ __forceinline__ double warp_sum_of_squares(const float* x, int64_t n, int lane) {
    double sum = 0.0;
    for (int64_t i = lane; i < n; i += 32) sum += static_cast<double>(x[i]) * x[i];
    return warp_sum(sum);
}

// cpu::rms_norm's scale of a group of n values with that sum of squares.
__device__ __forceinline__ float rms_scale(double sum, int64_t n, float eps) {
    return static_cast<float>(1.0 / sqrt(sum / static_cast<double>(n) + eps));
}

}  // namespace strata::cuda::kernels
