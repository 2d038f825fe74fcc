// Private to the CUDA backend: the activation quantizers' per-value steps, shared by matmul.cu's quantize kernel and
// the kernels that quantize their own output on the way (the hyper-connection read's norm). Each thread holds one
// value; the 32 lanes of a warp hold 32 consecutive values (one Q8_0 block), and for Q8_K the 8 warps of each aligned
// group of 256 threads hold one block. The rules are the CPU's (dtype.cpp quantize_row(Q8_0), quant_k.cpp
// quantize_q8_k), so the device products read the same 8-bit values as the CPU backend.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/activation_device.cuh"

namespace strata::cuda::kernels {

// (|x|, index, x) with the larger |x| winning and the lower index on ties: quant::signed_absmax's "first largest".
struct AbsMax {
    float abs;
    int index;
    float value;
};

__device__ __forceinline__ AbsMax better(const AbsMax& a, const AbsMax& b) {
    return (b.abs > a.abs || (b.abs == a.abs && b.index < a.index)) ? b : a;
}

__device__ __forceinline__ AbsMax warp_absmax(AbsMax m) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        const AbsMax o{__shfl_xor_sync(0xffffffffu, m.abs, offset), __shfl_xor_sync(0xffffffffu, m.index, offset),
                       __shfl_xor_sync(0xffffffffu, m.value, offset)};
        m = better(m, o);
    }
    return m;
}

// Sum of v over each aligned group of 16 lanes, in every lane of the group.
__device__ __forceinline__ int sum16(int v) {
#pragma unroll
    for (int offset = 8; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Q8_0: value v at index e of a row of `in` (a multiple of 32) into q[e], d[e / 32], s16[e / 16]; the whole warp calls
// it for 32 consecutive values. Returns the value as the products read it (d * q).
__device__ __forceinline__ float quantize_q8_0_value(float v, int64_t e, int8_t* q, float* d, float* s16) {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    float amax = fabsf(v);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    const float stored = __half2float(__float2half_rn(scale));
    const int qv = static_cast<int>(roundf(v * inv));
    q[e] = static_cast<int8_t>(qv);
    const int s = sum16(qv);
    if (lane == 0) d[e / 32] = stored;
    if (lane % 16 == 0) s16[e / 16] = stored * static_cast<float>(s);
    return stored * static_cast<float>(qv);
}

// Q8_K: every thread of the block calls it (it synchronizes the block); each aligned group of 256 threads holds the
// 256 values of one block, thread k of the group value k. `best` is shared memory of blockDim.x / 32 entries. A group
// whose values lie past the row passes write = false (it still takes part in the barriers).
__device__ __forceinline__ void quantize_q8_k_value(float v, int64_t e, bool write, int8_t* q, float* d, float* s16,
                                                    AbsMax* best) {
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
    const int first_warp = warp / 8 * 8;
    AbsMax m = warp_absmax({fabsf(v), static_cast<int>(threadIdx.x) % 256, v});
    if (lane == 0) best[warp] = m;
    __syncthreads();
    m = best[first_warp];
#pragma unroll
    for (int w = 1; w < 8; ++w) m = better(m, best[first_warp + w]);
    __syncthreads();  // best is rewritten by the next call
    int qv = 0;
    float scale = 0.0f;
    if (m.value != 0.0f) {
        const float iscale = -127.0f / m.value;
        qv = min(127, __float2int_rn(iscale * v));
        scale = 1.0f / iscale;
    }
    const int s = sum16(qv);
    if (!write) return;
    q[e] = static_cast<int8_t>(qv);
    if (lane == 0) d[e / 32] = scale;
    if (lane % 16 == 0) s16[e / 16] = scale * static_cast<float>(s);
}

// ---- where the values come from ------------------------------------------------------------------------------------
// Value e of row t of `in` values, for the quantize kernel (matmul.cu) and for the matvec kernels that quantize their
// own activations (matvec_kernels.cuh): one code, so both give the same bits.
struct RowSource {
    const float* x;
    __device__ __forceinline__ float operator()(int64_t t, int64_t in, int64_t e) const { return x[t * in + e]; }
};
struct SwiGluSource {
    const float* gate;
    const float* up;
    int64_t stride;  // between rows of gate and of up
    float* hidden;   // [t * in + e], or null
    __device__ __forceinline__ float operator()(int64_t t, int64_t in, int64_t e) const {
        const float g = gate[t * stride + e];
        const float v = __fmul_rn(silu(g), up[t * stride + e]);  // cpu::silu_mul, no contraction
        if (hidden) hidden[t * in + e] = v;
        return v;
    }
};

// silu(x / divisor), as the hyper-connection read's low-rank step (cpu::silu of the quotient).
struct SiluScaledSource {
    const float* x;
    float divisor;
    __device__ __forceinline__ float operator()(int64_t t, int64_t in, int64_t e) const {
        return silu(x[t * in + e] / divisor);
    }
};

}  // namespace strata::cuda::kernels
