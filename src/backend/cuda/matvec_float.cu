// F32, F16 and BF16 weights: f32 activations (as the CPU backend's float kernels), one piece = 16 weights. A piece is
// read from shared memory with 16-byte loads when it is 16-byte aligned (rows of a multiple of 16 elements in a
// buffer from cudaMalloc): 2-byte loads of pieces 32 bytes apart would hit the same banks 8 times over. Rows of
// other lengths (which pieces of 16 do not divide) go through a plain kernel of their own (matvec_float_rows_kernel).
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

// Element e of a float row (rows start at even addresses: 16-bit reads are aligned).
template <DType T>
__device__ __forceinline__ float float_weight(const uint8_t* row, int64_t e) {
    if constexpr (T == DType::F32)
        return __uint_as_float(load_u32(row + 4 * e));
    else if constexpr (T == DType::F16)
        return load_f16(row + 2 * e);
    else
        return __uint_as_float(load_u16(row + 2 * e) << 16);
}

// Element-wise conversion of any row length (the GEMM path also takes float rows that are no multiple of 16).
template <DType T>
__global__ void float_to_f32_kernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t in, float* out) {
    kernels::enter_dependent_grid();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * in) return;
    out[i] = float_weight<T>(w + (i / in) * row_bytes, i % in);
}

// Float rows of any length (in no multiple of 16: a small model's hidden or expert width, and what a quantized
// conversion writes as f16 when a row holds no whole block), which matvec_kernel's pieces of 16 cannot walk: one warp
// a row, lane l taking elements l, l + 32, ...; each (row, token) sum is formed in the same order whatever the batch.
// Segments and the expert gather as in matvec_kernel. No measured model has such rows, so plain loads do.
template <DType T, int kTokens>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize) matvec_float_rows_kernel(const MatvecParams p) {
    enter_dependent_grid();  // the expert ids and the activations come from the kernels before
    const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
    const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
    int s = 0;  // this block's segment
    while (s + 1 < p.n_segments && static_cast<int64_t>(blockIdx.x) >= p.first_block[s + 1]) ++s;
    const MatvecSegment seg = p.segment[s];
    const int64_t row = (static_cast<int64_t>(blockIdx.x) - p.first_block[s]) * kWarpsPerBlock + warp;
    if (row >= seg.rows) return;
    const uint8_t* w = seg.w;
    const float* x = p.x;
    float* y = seg.y;
    if (p.gather.ids) {
        const int64_t pair = blockIdx.y;
        int64_t slot = pair;
        const bool second = p.gather.second_from > 0 && pair >= p.gather.second_from;
        if (second) slot = pair - p.gather.second_from;
        const int32_t expert = p.gather.ids[slot];
        if (p.gather.at) {
            w = (second ? p.gather.second_at : p.gather.at)[expert];
            if (w == nullptr) return;  // a CPU expert worker computes this pair
        } else
            w += (second ? p.gather.second_offset : 0) + static_cast<size_t>(expert) * p.gather.expert_bytes;
        x += slot / p.gather.pairs_per_act_row * p.in;
        y += pair * seg.rows;
    }
    const uint8_t* w_row = w + row * seg.row_bytes;
    float acc[kTokens];
#pragma unroll
    for (int t = 0; t < kTokens; ++t) acc[t] = 0.0f;
    for (int64_t e = lane; e < p.in; e += kWarpSize) {
        const float wv = float_weight<T>(w_row, e);
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[t] = fmaf(wv, __ldg(x + t * p.in + e), acc[t]);
    }
#pragma unroll
    for (int t = 0; t < kTokens; ++t) acc[t] = warp_sum(acc[t]);
    if (lane == 0)
#pragma unroll
        for (int t = 0; t < kTokens; ++t) y[t * seg.rows + row] = acc[t];
}

template <DType T, int kTokens>
void launch_float_rows_tokens(const MatvecLaunch& l) {
    MatvecParams p{.segment = {}, .first_block = {}, .n_segments = 1 + l.n_more, .in = l.in, .act = l.act, .x = l.x,
                   .y = l.y, .warps_per_row = 1, .gather = l.gather, .own = {}, .mix = {}};
    p.segment[0] = {.w = l.w, .row_bytes = l.row_bytes, .rows = l.rows, .y = l.y};
    for (int i = 0; i < l.n_more; ++i) p.segment[i + 1] = l.more[i];
    int64_t blocks = 0;
    for (int i = 0; i < p.n_segments; ++i) {
        p.first_block[i] = blocks;
        blocks += (p.segment[i].rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    }
    const dim3 grid(static_cast<unsigned>(blocks), l.gather.ids ? static_cast<unsigned>(l.gather.n_pairs) : 1u);
    launch_dependent("matvec_float_rows_kernel", matvec_float_rows_kernel<T, kTokens>, grid,
                     dim3(kWarpsPerBlock * kWarpSize), 0, l.stream, p);
}

template <DType T>
void launch_float_rows(const MatvecLaunch& l) {
    STRATA_ASSERT(!l.own.silu_of && !l.mix.xn && l.n_more >= 0 && l.n_more < kMaxMatvecSegments &&
                  (!l.gather.ids || (l.n_tokens == 1 && l.n_more == 0)));
    switch (l.n_tokens) {
        case 1: return launch_float_rows_tokens<T, 1>(l);
        case 2: return launch_float_rows_tokens<T, 2>(l);
        case 3: return launch_float_rows_tokens<T, 3>(l);
        case 4: return launch_float_rows_tokens<T, 4>(l);
        case 5: return launch_float_rows_tokens<T, 5>(l);
        case 6: return launch_float_rows_tokens<T, 6>(l);
        case 7: return launch_float_rows_tokens<T, 7>(l);
        case 8: return launch_float_rows_tokens<T, 8>(l);
        default: STRATA_ASSERT(!"matvec takes 1..8 tokens");
    }
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
    if (l.in % kPieceElems != 0) {
        switch (l.type) {
            case DType::F32: launch_float_rows<DType::F32>(l); return true;
            case DType::F16: launch_float_rows<DType::F16>(l); return true;
            case DType::BF16: launch_float_rows<DType::BF16>(l); return true;
            default: return false;
        }
    }
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
