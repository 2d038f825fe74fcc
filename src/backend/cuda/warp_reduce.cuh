// Private to the CUDA backend: the warp and thread-block reductions its kernels share. Each combines values in one
// fixed order, so a kernel that uses them gives the same bits on every run.
#pragma once

#include <cstdint>

namespace strata::cuda {

// The sum (max) of v over the 32 lanes of a warp, in every lane: a butterfly, offsets 16, 8, 4, 2, 1.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
// The max (kMax) or min of an unsigned v over the 32 lanes, in every lane: one instruction on sm_80+.
template <bool kMax>
__device__ __forceinline__ unsigned warp_extreme_u32(unsigned v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return kMax ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        const unsigned o = __shfl_xor_sync(0xffffffffu, v, offset);
        v = kMax ? max(v, o) : min(v, o);
    }
    return v;
#endif
}

// Inclusive prefix sum of v over the thread block (blockDim.x a multiple of 32); *total, when given, gets the sum of
// all. warp_sums: 32 ints of shared memory, free for other use again when the call returns (every thread calls it).
__device__ __forceinline__ int32_t block_inclusive_sum(int32_t v, int32_t* warp_sums, int32_t* total) {
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
    const int n_warps = static_cast<int>(blockDim.x) / 32;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
        const int32_t o = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset) v += o;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int32_t w = lane < n_warps ? warp_sums[lane] : 0;
#pragma unroll
        for (int offset = 1; offset < 32; offset *= 2) {
            const int32_t o = __shfl_up_sync(0xffffffffu, w, offset);
            if (lane >= offset) w += o;
        }
        warp_sums[lane] = w;
    }
    __syncthreads();
    if (warp > 0) v += warp_sums[warp - 1];
    const int32_t all = warp_sums[31];
    __syncthreads();  // every thread has read warp_sums before anyone reuses it
    if (total) *total = all;
    return v;
}

}  // namespace strata::cuda
