// IQ2_XS, IQ3_XXS, IQ3_S and IQ1_M: grid i-quants (super-blocks of 256, Q8_K activations). Layouts:
// core/quant_blocks.h; element positions and scales as core/quant_iq.cpp's reference dequantizers read them. The grids
// live in global memory (read through the L1 cache): lanes look up different entries, which __constant__ memory
// would serialize.
#include "backend/cuda/gemm_tensor_core.cuh"
#include "backend/cuda/matvec_kernels.cuh"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cuda {
namespace kernels {

__device__ uint64_t g_iq2xs_grid[512];
__device__ uint32_t g_iq3xxs_grid[256];
__device__ uint32_t g_iq3s_grid[512];
__device__ uint64_t g_iq1s_grid[2048];

// The grid formats decode 8 weights at a time (a group: one grid entry and its signs); a piece is two groups, a pair
// four. group() writes group l (0..3) of the 32 elements ib32 as two words. Where those 32 elements share one scale,
// decode_grid_piece and decode_grid_pair do the rest: F::context(b, ib32) reads what the groups and the scale of the
// 32 elements share, and F::group and F::scale take it.
template <typename F>
__device__ __forceinline__ QuantPiece decode_grid_piece(const uint8_t* b, int piece) {
    const int ib32 = piece / 2, half = piece % 2;
    const uint32_t context = F::context(b, ib32);
    QuantPiece w;
#pragma unroll
    for (int k = 0; k < 2; ++k) F::group(b, ib32, context, 2 * half + k, &w.q[2 * k]);
    w.scale = F::scale(b, ib32, context);
    w.offset = 0.0f;
    return w;
}
template <typename F>
__device__ __forceinline__ QuantPair decode_grid_pair(const uint8_t* b, int ib32) {
    const uint32_t context = F::context(b, ib32);
    QuantPair w;
#pragma unroll
    for (int l = 0; l < 4; ++l) F::group(b, ib32, context, l, &w.q[2 * l]);
    w.scale[0] = w.scale[1] = F::scale(b, ib32, context);
    w.offset[0] = w.offset[1] = 0.0f;
    return w;
}

template <>
struct Format<DType::IQ2_XS> {
    static constexpr int kBlockElems = 256, kBlockBytes = 74, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false;
    // d, qs[32] (uint16: 9-bit grid index, 7 sign bits) at 2, scales[8] at 66 (a nibble per 16 elements).
    static __device__ __forceinline__ void group(const uint8_t* b, int ib32, int l, int* q) {
        const uint32_t code = load_u16(b + 2 + 2 * (4 * ib32 + l));
        const uint64_t grid = __ldg(&g_iq2xs_grid[code & 511]);
        const uint32_t signs = even_signs(code >> 9);
        q[0] = apply_signs(static_cast<uint32_t>(grid), signs & 0xf);
        q[1] = apply_signs(static_cast<uint32_t>(grid >> 32), signs >> 4);
    }
    // The scale of 16 elements from its nibble: d * (0.5 + nibble) / 4, with the exact / 4 taken first.
    static __device__ __forceinline__ float scale(float d_quarter, uint32_t nibble) {
        return d_quarter * (0.5f + static_cast<float>(nibble));
    }
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        const int ib32 = piece / 2, half = piece % 2;
        QuantPiece w;
#pragma unroll
        for (int k = 0; k < 2; ++k) group(b, ib32, 2 * half + k, &w.q[2 * k]);
        w.scale = scale(load_f16(b) * 0.25f, (b[66 + ib32] >> (4 * half)) & 0xf);
        w.offset = 0.0f;
        return w;
    }
    // A pair has its own scale for each half (the two nibbles of one byte).
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int ib32) {
        QuantPair w;
#pragma unroll
        for (int l = 0; l < 4; ++l) group(b, ib32, l, &w.q[2 * l]);
        const uint32_t nibbles = b[66 + ib32];
        const float d_quarter = load_f16(b) * 0.25f;
        w.scale[0] = scale(d_quarter, nibbles & 0xf);
        w.scale[1] = scale(d_quarter, nibbles >> 4);
        w.offset[0] = w.offset[1] = 0.0f;
        return w;
    }
};

template <>
struct Format<DType::IQ3_XXS> {
    static constexpr int kBlockElems = 256, kBlockBytes = 98, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false, kPairSharesScale = true;
    // d, qs[64] grid indices at 2, then per 32 elements a uint32 at 66 + 4 ib32: four 7-bit signs and a 4-bit scale.
    static __device__ __forceinline__ void group(const uint8_t* b, int ib32, uint32_t aux, int l, int* q) {
        const uint32_t signs = even_signs((aux >> (7 * l)) & 127);
        q[0] = apply_signs(__ldg(&g_iq3xxs_grid[b[2 + 8 * ib32 + 2 * l]]), signs & 0xf);
        q[1] = apply_signs(__ldg(&g_iq3xxs_grid[b[2 + 8 * ib32 + 2 * l + 1]]), signs >> 4);
    }
    static __device__ __forceinline__ uint32_t context(const uint8_t* b, int ib32) {
        return load_u32(b + 66 + 4 * ib32);  // aux
    }
    static __device__ __forceinline__ float scale(const uint8_t* b, int, uint32_t aux) {
        return load_f16(b) * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    }
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        return decode_grid_piece<Format>(b, piece);
    }
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int ib32) {
        return decode_grid_pair<Format>(b, ib32);
    }
};

template <>
struct Format<DType::IQ3_S> {
    static constexpr int kBlockElems = 256, kBlockBytes = 110, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false, kPairSharesScale = true;
    // d, qs[64] at 2 (low 8 index bits), qh[8] at 66 (9th bits), signs[32] at 74, scales[4] at 106.
    static __device__ __forceinline__ void group(const uint8_t* b, int ib32, uint32_t qh, int l, int* q) {
        const uint32_t i1 = b[2 + 8 * ib32 + 2 * l] | (((qh >> (2 * l)) & 1) << 8);
        const uint32_t i2 = b[2 + 8 * ib32 + 2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
        const uint32_t signs = b[74 + 4 * ib32 + l];
        q[0] = apply_signs(__ldg(&g_iq3s_grid[i1]), signs & 0xf);
        q[1] = apply_signs(__ldg(&g_iq3s_grid[i2]), signs >> 4);
    }
    static __device__ __forceinline__ uint32_t context(const uint8_t* b, int ib32) {
        return b[66 + ib32];  // qh
    }
    static __device__ __forceinline__ float scale(const uint8_t* b, int ib32, uint32_t) {
        const int sc = (b[106 + ib32 / 2] >> (4 * (ib32 % 2))) & 0xf;
        return load_f16(b) * static_cast<float>(1 + 2 * sc);
    }
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        return decode_grid_piece<Format>(b, piece);
    }
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int ib32) {
        return decode_grid_pair<Format>(b, ib32);
    }
};

template <>
struct Format<DType::IQ1_M> {
    static constexpr int kBlockElems = 256, kBlockBytes = 56, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false;
    // qs[32] at 0 (low 8 index bits), qh[16] at 32 (per group of 8 a nibble: 3 index bits and the delta sign),
    // scales at 48: four uint16 holding 3-bit scales and, in their top nibbles, the f16 super-block scale.
    // A weight is dl * (g + delta) with g in {-1, 0, 1} and delta = +-1/8: as an integer, (dl / 8) * (8 g +- 1).
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        const int ib = piece / 2, half = piece % 2;
        uint32_t sc[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) sc[k] = load_u16(b + 48 + 2 * k);
        const uint32_t d_bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(d_bits)));
        const int scale3 = (sc[ib / 2] >> (6 * (ib % 2) + 3 * half)) & 7;
        const uint32_t qh = b[32 + 2 * ib + half];
        QuantPiece w;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint32_t nibble = (qh >> (4 * k)) & 0xf;
            const uint64_t grid = __ldg(&g_iq1s_grid[b[4 * ib + 2 * half + k] | ((nibble & 7) << 8)]);
            const uint32_t delta = nibble & 8 ? 0xffffffffu : 0x01010101u;  // -1 or +1 per byte
            // 8 g per byte: shift the word, then drop the bits that crossed in from the byte below.
            w.q[2 * k] = static_cast<int>(__vadd4((static_cast<uint32_t>(grid) << 3) & 0xf8f8f8f8u, delta));
            w.q[2 * k + 1] = static_cast<int>(__vadd4((static_cast<uint32_t>(grid >> 32) << 3) & 0xf8f8f8f8u, delta));
        }
        w.scale = d * static_cast<float>(2 * scale3 + 1) * 0.125f;
        w.offset = 0.0f;
        return w;
    }
};

static_assert(Format<DType::IQ2_XS>::kBlockBytes == sizeof(BlockIQ2_XS));
static_assert(Format<DType::IQ3_XXS>::kBlockBytes == sizeof(BlockIQ3_XXS));
static_assert(Format<DType::IQ3_S>::kBlockBytes == sizeof(BlockIQ3_S));
static_assert(Format<DType::IQ1_M>::kBlockBytes == sizeof(BlockIQ1_M));

}  // namespace kernels

void upload_iq_tables() {
    using namespace kernels;
    STRATA_CUDA_CHECK(cudaMemcpyToSymbol(g_iq2xs_grid, quant::kIQ2XSGrid, sizeof(quant::kIQ2XSGrid)));
    STRATA_CUDA_CHECK(cudaMemcpyToSymbol(g_iq3xxs_grid, quant::kIQ3XXSGrid, sizeof(quant::kIQ3XXSGrid)));
    STRATA_CUDA_CHECK(cudaMemcpyToSymbol(g_iq3s_grid, quant::kIQ3SGrid, sizeof(quant::kIQ3SGrid)));
    STRATA_CUDA_CHECK(cudaMemcpyToSymbol(g_iq1s_grid, quant::kIQ1SGrid, sizeof(quant::kIQ1SGrid)));
}

bool launch_matvec_iq(const MatvecLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::IQ2_XS: launch_matvec_typed<Format<DType::IQ2_XS>>(l); return true;
        case DType::IQ3_XXS: launch_matvec_typed<Format<DType::IQ3_XXS>>(l); return true;
        case DType::IQ3_S: launch_matvec_typed<Format<DType::IQ3_S>>(l); return true;
        case DType::IQ1_M: launch_matvec_typed<Format<DType::IQ1_M>>(l); return true;
        default: return false;
    }
}

bool launch_dequantize_iq(const DequantizeLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::IQ2_XS: launch_dequantize_typed<Format<DType::IQ2_XS>>(l); return true;
        case DType::IQ3_XXS: launch_dequantize_typed<Format<DType::IQ3_XXS>>(l); return true;
        case DType::IQ3_S: launch_dequantize_typed<Format<DType::IQ3_S>>(l); return true;
        case DType::IQ1_M: launch_dequantize_typed<Format<DType::IQ1_M>>(l); return true;
        default: return false;
    }
}

bool launch_gemm_iq(const GemmLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::IQ2_XS: launch_gemm_typed<Format<DType::IQ2_XS>>(l); return true;
        case DType::IQ3_XXS: launch_gemm_typed<Format<DType::IQ3_XXS>>(l); return true;
        case DType::IQ3_S: launch_gemm_typed<Format<DType::IQ3_S>>(l); return true;
        case DType::IQ1_M: launch_gemm_typed<Format<DType::IQ1_M>>(l); return true;
        default: return false;
    }
}

bool launch_grouped_gemm_iq(const GroupedGemmLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::IQ2_XS: launch_grouped_gemm_typed<Format<DType::IQ2_XS>>(l); return true;
        case DType::IQ3_XXS: launch_grouped_gemm_typed<Format<DType::IQ3_XXS>>(l); return true;
        case DType::IQ3_S: launch_grouped_gemm_typed<Format<DType::IQ3_S>>(l); return true;
        case DType::IQ1_M: launch_grouped_gemm_typed<Format<DType::IQ1_M>>(l); return true;
        default: return false;
    }
}

}  // namespace strata::cuda
