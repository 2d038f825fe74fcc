// Q8_0, Q4_0, IQ4_NL (blocks of 32, Q8_0 activations) and IQ4_XS (super-blocks of 256, Q8_K activations).
// Layouts: core/quant_blocks.h.
#include "backend/cuda/gemm_tensor_core.cuh"
#include "backend/cuda/matvec_kernels.cuh"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cuda {
namespace kernels {

// kIQ4NLValues as four little-endian words: every lane reads the same word, which __constant__ serves in one go.
__constant__ uint32_t c_iq4nl_levels[4];

// Byte k of the result is kIQ4NLValues[byte k of nibbles] (each byte 0..15): two 8-entry byte permutes and a select.
__device__ __forceinline__ int iq4nl_lookup(uint32_t nibbles) {
    const uint32_t low3 = nibbles & 0x07070707u;
    const uint32_t packed = low3 | (low3 >> 4);  // selector nibbles: byte 0 = b0 | b1 << 4, byte 2 = b2 | b3 << 4
    const uint32_t selector = (packed & 0xffu) | ((packed >> 8) & 0xff00u);
    const uint32_t from_low = __byte_perm(c_iq4nl_levels[0], c_iq4nl_levels[1], selector);
    const uint32_t from_high = __byte_perm(c_iq4nl_levels[2], c_iq4nl_levels[3], selector);
    const uint32_t use_high = bit3_mask(nibbles);
    return static_cast<int>((from_low & ~use_high) | (from_high & use_high));
}

// The pair of a 32-element block stored as 16 bytes of nibbles (low nibbles first, then high), each byte of nibbles
// mapped to its weight by `level`.
template <typename Level>
__device__ __forceinline__ void decode_nibble_pair(const uint8_t* p, Level level, QuantPair& w) {
    uint32_t v[4];
    load_16_bytes(p, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        w.q[k] = level(v[k] & 0x0f0f0f0fu);
        w.q[4 + k] = level((v[k] >> 4) & 0x0f0f0f0fu);
    }
}

template <>
struct Format<DType::Q8_0> {
    static constexpr int kBlockElems = 32, kBlockBytes = 34, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false;
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        QuantPiece w;
        uint32_t v[4];
        load_16_bytes(b + 2 + 16 * piece, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) w.q[k] = static_cast<int>(v[k]);
        w.scale = load_f16(b);
        w.offset = 0.0f;
        return w;
    }
    static constexpr bool kPairSharesScale = true;
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int) {
        QuantPair w;
        uint32_t v[8];
        load_words<8>(b + 2, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = static_cast<int>(v[k]);
        w.scale[0] = w.scale[1] = load_f16(b);
        w.offset[0] = w.offset[1] = 0.0f;
        return w;
    }
};

template <>
struct Format<DType::Q4_0> {
    static constexpr int kBlockElems = 32, kBlockBytes = 18, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false;
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        // Piece 0: the low nibbles of qs[0..15] (elements 0..15); piece 1: the high nibbles.
        QuantPiece w;
        uint32_t v[4];
        load_16_bytes(b + 2, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) w.q[k] = sub_bytes((v[k] >> (4 * piece)) & 0x0f0f0f0fu, 8);
        w.scale = load_f16(b);
        w.offset = 0.0f;
        return w;
    }
    static constexpr bool kPairSharesScale = true;
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int) {
        QuantPair w;
        decode_nibble_pair(
            b + 2, [](uint32_t nibbles) { return sub_bytes(nibbles, 8); }, w);
        w.scale[0] = w.scale[1] = load_f16(b);
        w.offset[0] = w.offset[1] = 0.0f;
        return w;
    }
};

template <>
struct Format<DType::IQ4_NL> {
    static constexpr int kBlockElems = 32, kBlockBytes = 18, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false;
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        QuantPiece w;
        uint32_t v[4];
        load_16_bytes(b + 2, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) w.q[k] = iq4nl_lookup((v[k] >> (4 * piece)) & 0x0f0f0f0fu);
        w.scale = load_f16(b);
        w.offset = 0.0f;
        return w;
    }
    static constexpr bool kPairSharesScale = true;
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int) {
        QuantPair w;
        decode_nibble_pair(b + 2, iq4nl_lookup, w);
        w.scale[0] = w.scale[1] = load_f16(b);
        w.offset[0] = w.offset[1] = 0.0f;
        return w;
    }
};

template <>
struct Format<DType::IQ4_XS> {
    static constexpr int kBlockElems = 256, kBlockBytes = 136, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false;
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        // d (2 bytes), scales_h (2), scales_l (4), qs (128); sub-block ib of 32 = qs[16 ib ..], low then high nibbles.
        const int ib = piece / 2, half = piece % 2;
        const uint32_t scales_h = load_u16(b + 2);
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
        QuantPiece w;
        uint32_t v[4];
        load_16_bytes(b + 8 + 16 * ib, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) w.q[k] = iq4nl_lookup((v[k] >> (4 * half)) & 0x0f0f0f0fu);
        w.scale = load_f16(b) * static_cast<float>(ls - 32);
        w.offset = 0.0f;
        return w;
    }
    static constexpr bool kPairSharesScale = true;
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int ib) {
        const uint32_t scales_h = load_u16(b + 2);
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
        QuantPair w;
        decode_nibble_pair(b + 8 + 16 * ib, iq4nl_lookup, w);
        w.scale[0] = w.scale[1] = load_f16(b) * static_cast<float>(ls - 32);
        w.offset[0] = w.offset[1] = 0.0f;
        return w;
    }
};

static_assert(Format<DType::Q8_0>::kBlockBytes == sizeof(BlockQ8_0));
static_assert(Format<DType::Q4_0>::kBlockBytes == sizeof(BlockQ4_0));
static_assert(Format<DType::IQ4_NL>::kBlockBytes == sizeof(BlockIQ4_NL));
static_assert(Format<DType::IQ4_XS>::kBlockBytes == sizeof(BlockIQ4_XS));

}  // namespace kernels

void upload_basic_tables() {
    uint32_t words[4];
    static_assert(sizeof words == sizeof quant::kIQ4NLValues);
    __builtin_memcpy(words, quant::kIQ4NLValues, sizeof words);
    STRATA_CUDA_CHECK(cudaMemcpyToSymbol(kernels::c_iq4nl_levels, words, sizeof words));
}

bool launch_matvec_basic(const MatvecLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::Q8_0: launch_matvec_typed<Format<DType::Q8_0>>(l); return true;
        case DType::Q4_0: launch_matvec_typed<Format<DType::Q4_0>>(l); return true;
        case DType::IQ4_NL: launch_matvec_typed<Format<DType::IQ4_NL>>(l); return true;
        case DType::IQ4_XS: launch_matvec_typed<Format<DType::IQ4_XS>>(l); return true;
        default: return false;
    }
}

bool launch_dequantize_basic(const DequantizeLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::Q8_0: launch_dequantize_typed<Format<DType::Q8_0>>(l); return true;
        case DType::Q4_0: launch_dequantize_typed<Format<DType::Q4_0>>(l); return true;
        case DType::IQ4_NL: launch_dequantize_typed<Format<DType::IQ4_NL>>(l); return true;
        case DType::IQ4_XS: launch_dequantize_typed<Format<DType::IQ4_XS>>(l); return true;
        default: return false;
    }
}

bool launch_gemm_basic(const GemmLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::Q8_0: launch_gemm_typed<Format<DType::Q8_0>>(l); return true;
        case DType::Q4_0: launch_gemm_typed<Format<DType::Q4_0>>(l); return true;
        case DType::IQ4_NL: launch_gemm_typed<Format<DType::IQ4_NL>>(l); return true;
        case DType::IQ4_XS: launch_gemm_typed<Format<DType::IQ4_XS>>(l); return true;
        default: return false;
    }
}

bool launch_grouped_gemm_basic(const GroupedGemmLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::Q8_0: launch_grouped_gemm_typed<Format<DType::Q8_0>>(l); return true;
        case DType::Q4_0: launch_grouped_gemm_typed<Format<DType::Q4_0>>(l); return true;
        case DType::IQ4_NL: launch_grouped_gemm_typed<Format<DType::IQ4_NL>>(l); return true;
        case DType::IQ4_XS: launch_grouped_gemm_typed<Format<DType::IQ4_XS>>(l); return true;
        default: return false;
    }
}

}  // namespace strata::cuda
