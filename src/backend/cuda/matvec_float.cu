// F32, F16 and BF16 weights: f32 activations (as the CPU backend's float kernels), one piece = 16 weights. A piece is
// read from shared memory with 16-byte loads when it is 16-byte aligned (rows of a multiple of 16 elements in a
// buffer from cudaMalloc): 2-byte loads of pieces 32 bytes apart would hit the same banks 8 times over.
#include "backend/cuda/matvec_kernels.cuh"

namespace strata::cuda {
namespace kernels {

// 32 bytes at a 16-byte aligned address as 8 little-endian words, in two 16-byte loads.
__device__ __forceinline__ void load_aligned_32_bytes(const uint8_t* b, uint32_t words[8]) {
    const uint4 lo = reinterpret_cast<const uint4*>(b)[0], hi = reinterpret_cast<const uint4*>(b)[1];
    words[0] = lo.x, words[1] = lo.y, words[2] = lo.z, words[3] = lo.w;
    words[4] = hi.x, words[5] = hi.y, words[6] = hi.z, words[7] = hi.w;
}

template <>
struct Format<DType::F32> {
    static constexpr int kBlockElems = kPieceElems, kBlockBytes = 64, kPiecesPerLane = 1;
    static constexpr bool kIsFloat = true, kHasOffset = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, float w[kPieceElems]) {
        if ((reinterpret_cast<uintptr_t>(b) & 15) == 0) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float4 v = reinterpret_cast<const float4*>(b)[j];
                w[4 * j] = v.x;
                w[4 * j + 1] = v.y;
                w[4 * j + 2] = v.z;
                w[4 * j + 3] = v.w;
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < kPieceElems; ++i) w[i] = __uint_as_float(load_u32(b + 4 * i));
    }
};

template <>
struct Format<DType::F16> {
    static constexpr int kBlockElems = kPieceElems, kBlockBytes = 32, kPiecesPerLane = 2;
    static constexpr bool kIsFloat = true, kHasOffset = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, float w[kPieceElems]) {
        if ((reinterpret_cast<uintptr_t>(b) & 15) == 0) {
            uint32_t words[8];
            load_aligned_32_bytes(b, words);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&words[i]));
                w[2 * i] = f.x;
                w[2 * i + 1] = f.y;
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < kPieceElems; ++i) w[i] = load_f16(b + 2 * i);
    }
};

template <>
struct Format<DType::BF16> {
    static constexpr int kBlockElems = kPieceElems, kBlockBytes = 32, kPiecesPerLane = 2;
    static constexpr bool kIsFloat = true, kHasOffset = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, float w[kPieceElems]) {
        if ((reinterpret_cast<uintptr_t>(b) & 15) == 0) {
            uint32_t words[8];
            load_aligned_32_bytes(b, words);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                w[2 * i] = __uint_as_float(words[i] << 16);
                w[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < kPieceElems; ++i) w[i] = __uint_as_float(load_u16(b + 2 * i) << 16);
    }
};

// Element-wise conversion of any row length (the GEMM path also takes float rows that are no multiple of 16).
template <DType T>
__global__ void float_to_f32_kernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t in, float* out) {
    kernels::enter_dependent_grid();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * in) return;
    const uint8_t* row = w + (i / in) * row_bytes;
    const int64_t e = i % in;
    if constexpr (T == DType::F32)
        out[i] = __uint_as_float(load_u32(row + 4 * e));
    else if constexpr (T == DType::F16)
        out[i] = load_f16(row + 2 * e);
    else
        out[i] = __uint_as_float(load_u16(row + 2 * e) << 16);
}

template <DType T>
void launch_float_to_f32(const DequantizeLaunch& l) {
    constexpr int kThreads = 256;
    const int64_t n = l.rows * l.in;
    launch_dependent("float_to_f32_kernel", float_to_f32_kernel<T>,
                     dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads)), dim3(kThreads), 0, l.stream, l.w,
                     l.row_bytes, l.rows, l.in, l.out);
}

}  // namespace kernels

bool launch_matvec_float(const MatvecLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::F32: launch_matvec_typed<Format<DType::F32>>(l); return true;
        case DType::F16: launch_matvec_typed<Format<DType::F16>>(l); return true;
        case DType::BF16: launch_matvec_typed<Format<DType::BF16>>(l); return true;
        default: return false;
    }
}

bool launch_dequantize_float(const DequantizeLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::F32: launch_float_to_f32<DType::F32>(l); return true;
        case DType::F16: launch_float_to_f32<DType::F16>(l); return true;
        case DType::BF16: launch_float_to_f32<DType::BF16>(l); return true;
        default: return false;
    }
}

}  // namespace strata::cuda
