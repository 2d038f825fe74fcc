// Q2_K .. Q6_K: super-blocks of 256 with 16- or 32-element sub-blocks; Q8_K activations. Layouts: core/quant_blocks.h
// (ggml's), element positions as core/quant_k.cpp's reference dequantizers read them.
#include "backend/cuda/gemm_tensor_core.cuh"
#include "backend/cuda/matvec_kernels.cuh"
#include "core/quant_blocks.h"

namespace strata::cuda {
namespace kernels {

// 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K scales array (ggml's get_scale_min_k4 packing).
__device__ __forceinline__ void scale_min_k4(const uint8_t* q, int j, int& scale, int& min) {
    if (j < 4) {
        scale = q[j] & 63;
        min = q[j + 4] & 63;
    } else {
        scale = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <>
struct Format<DType::Q2_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 84, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = true;
    // scales[16] at 0, qs[64] at 16, d at 80, dmin at 82. Piece p is sub-block p: element 16p + l has its two bits
    // in qs[32 (p / 8) + 16 (p % 2) + l] at shift 2 ((p % 8) / 2).
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        QuantPiece w;
        uint32_t v[4];
        load_16_bytes(b + 16 + 32 * (piece / 8) + 16 * (piece % 2), v);
        const int shift = 2 * ((piece % 8) / 2);
#pragma unroll
        for (int k = 0; k < 4; ++k) w.q[k] = static_cast<int>((v[k] >> shift) & 0x03030303u);
        const int sc = b[piece];
        w.scale = load_f16(b + 80) * static_cast<float>(sc & 0xf);
        w.offset = -load_f16(b + 82) * static_cast<float>(sc >> 4);
        return w;
    }
};

template <>
struct Format<DType::Q3_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 110, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false;
    // hmask[32] at 0, qs[64] at 32, scales[12] at 96, d at 108. Low two bits as Q2_K; the high bit of element e is
    // bit e / 32 of hmask[e % 32], and a clear bit means "subtract 4".
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        QuantPiece w;
        uint32_t low[4], high[4];
        load_16_bytes(b + 32 + 32 * (piece / 8) + 16 * (piece % 2), low);
        load_16_bytes(b + 16 * (piece % 2), high);
        const int shift = 2 * ((piece % 8) / 2);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t q = ((low[k] >> shift) & 0x03030303u) | (((high[k] >> (piece / 2)) & 0x01010101u) << 2);
            w.q[k] = sub_bytes(q, 4);  // q in 0..7
        }
        const uint8_t* scales = b + 96;
        const int sc_low = piece < 8 ? scales[piece] & 0xf : scales[piece - 8] >> 4;
        const int sc_high = (scales[8 + piece % 4] >> (2 * (piece / 4))) & 3;
        w.scale = load_f16(b + 108) * static_cast<float>((sc_low | (sc_high << 4)) - 32);
        w.offset = 0.0f;
        return w;
    }
};

template <>
struct Format<DType::Q4_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 144, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = true;
    // d, dmin, scales[12] at 4, qs[128] at 16. Sub-block sb (32 elements) = nibble sb % 2 of qs[32 (sb / 2) ..].
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        const int sb = piece / 2, half = piece % 2;
        QuantPiece w;
        uint32_t v[4];
        load_16_bytes(b + 16 + 32 * (sb / 2) + 16 * half, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) w.q[k] = static_cast<int>((v[k] >> (4 * (sb % 2))) & 0x0f0f0f0fu);
        int sc = 0, m = 0;
        scale_min_k4(b + 4, sb, sc, m);
        w.scale = load_f16(b) * static_cast<float>(sc);
        w.offset = -load_f16(b + 2) * static_cast<float>(m);
        return w;
    }
    static constexpr bool kPairSharesScale = true;
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int sb) {
        QuantPair w;
        uint32_t v[8];
        load_words<8>(b + 16 + 32 * (sb / 2), v);
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = static_cast<int>((v[k] >> (4 * (sb % 2))) & 0x0f0f0f0fu);
        int sc = 0, m = 0;
        scale_min_k4(b + 4, sb, sc, m);
        w.scale[0] = w.scale[1] = load_f16(b) * static_cast<float>(sc);
        w.offset[0] = w.offset[1] = -load_f16(b + 2) * static_cast<float>(m);
        return w;
    }
};

template <>
struct Format<DType::Q5_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 176, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = true;
    // d, dmin, scales[12] at 4, qh[32] at 16, qs[128] at 48. As Q4_K; the fifth bit of element l of sub-block sb is
    // bit sb of qh[l].
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        const int sb = piece / 2, half = piece % 2;
        QuantPiece w;
        uint32_t v[4], h[4];
        load_16_bytes(b + 48 + 32 * (sb / 2) + 16 * half, v);
        load_16_bytes(b + 16 + 16 * half, h);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            w.q[k] = static_cast<int>(((v[k] >> (4 * (sb % 2))) & 0x0f0f0f0fu) | (((h[k] >> sb) & 0x01010101u) << 4));
        int sc = 0, m = 0;
        scale_min_k4(b + 4, sb, sc, m);
        w.scale = load_f16(b) * static_cast<float>(sc);
        w.offset = -load_f16(b + 2) * static_cast<float>(m);
        return w;
    }
    static constexpr bool kPairSharesScale = true;
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int sb) {
        QuantPair w;
        uint32_t v[8], h[8];
        load_words<8>(b + 48 + 32 * (sb / 2), v);
        load_words<8>(b + 16, h);
#pragma unroll
        for (int k = 0; k < 8; ++k)
            w.q[k] = static_cast<int>(((v[k] >> (4 * (sb % 2))) & 0x0f0f0f0fu) | (((h[k] >> sb) & 0x01010101u) << 4));
        int sc = 0, m = 0;
        scale_min_k4(b + 4, sb, sc, m);
        w.scale[0] = w.scale[1] = load_f16(b) * static_cast<float>(sc);
        w.offset[0] = w.offset[1] = -load_f16(b + 2) * static_cast<float>(m);
        return w;
    }
};

template <>
struct Format<DType::Q6_K> {
    static constexpr int kBlockElems = 256, kBlockBytes = 210, kPiecesPerLane = kQuantPiecesPerLane;
    static constexpr bool kIsFloat = false, kHasOffset = false;
    // ql[128] at 0, qh[64] at 128, int8 scales[16] at 192, d at 208. Element e: half = e / 128, quarter k =
    // (e % 128) / 32, l = e % 32; low nibble k / 2 of ql[64 half + 32 (k % 2) + l], high bits 2k of qh[32 half + l].
    static __device__ __forceinline__ QuantPiece decode(const uint8_t* b, int piece) {
        const int half = piece / 8, quarter = (piece % 8) / 2, sub = piece % 2;
        QuantPiece w;
        uint32_t lo[4], hi[4];
        load_16_bytes(b + 64 * half + 32 * (quarter % 2) + 16 * sub, lo);
        load_16_bytes(b + 128 + 32 * half + 16 * sub, hi);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t q =
                ((lo[k] >> (4 * (quarter / 2))) & 0x0f0f0f0fu) | (((hi[k] >> (2 * quarter)) & 0x03030303u) << 4);
            w.q[k] = sub_bytes(q, 32);  // q in 0..63
        }
        w.scale = load_f16(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + piece]));
        w.offset = 0.0f;
        return w;
    }
    // A pair is quarter j % 4 of half j / 4: 32 consecutive bytes of ql and of qh, two scales.
    static __device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int j) {
        const int half = j / 4, quarter = j % 4;
        QuantPair w;
        uint32_t lo[8], hi[8];
        load_words<8>(b + 64 * half + 32 * (quarter % 2), lo);
        load_words<8>(b + 128 + 32 * half, hi);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t q =
                ((lo[k] >> (4 * (quarter / 2))) & 0x0f0f0f0fu) | (((hi[k] >> (2 * quarter)) & 0x03030303u) << 4);
            w.q[k] = sub_bytes(q, 32);
        }
        const float d = load_f16(b + 208);
        w.scale[0] = d * static_cast<float>(static_cast<int8_t>(b[192 + 2 * j]));
        w.scale[1] = d * static_cast<float>(static_cast<int8_t>(b[193 + 2 * j]));
        w.offset[0] = w.offset[1] = 0.0f;
        return w;
    }
};

static_assert(Format<DType::Q2_K>::kBlockBytes == sizeof(BlockQ2_K));
static_assert(Format<DType::Q3_K>::kBlockBytes == sizeof(BlockQ3_K));
static_assert(Format<DType::Q4_K>::kBlockBytes == sizeof(BlockQ4_K));
static_assert(Format<DType::Q5_K>::kBlockBytes == sizeof(BlockQ5_K));
static_assert(Format<DType::Q6_K>::kBlockBytes == sizeof(BlockQ6_K));

}  // namespace kernels

bool launch_matvec_kquant(const MatvecLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::Q2_K: launch_matvec_typed<Format<DType::Q2_K>>(l); return true;
        case DType::Q3_K: launch_matvec_typed<Format<DType::Q3_K>>(l); return true;
        case DType::Q4_K: launch_matvec_typed<Format<DType::Q4_K>>(l); return true;
        case DType::Q5_K: launch_matvec_typed<Format<DType::Q5_K>>(l); return true;
        case DType::Q6_K: launch_matvec_typed<Format<DType::Q6_K>>(l); return true;
        default: return false;
    }
}

bool launch_dequantize_kquant(const DequantizeLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::Q2_K: launch_dequantize_typed<Format<DType::Q2_K>>(l); return true;
        case DType::Q3_K: launch_dequantize_typed<Format<DType::Q3_K>>(l); return true;
        case DType::Q4_K: launch_dequantize_typed<Format<DType::Q4_K>>(l); return true;
        case DType::Q5_K: launch_dequantize_typed<Format<DType::Q5_K>>(l); return true;
        case DType::Q6_K: launch_dequantize_typed<Format<DType::Q6_K>>(l); return true;
        default: return false;
    }
}

bool launch_gemm_kquant(const GemmLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::Q2_K: launch_gemm_typed<Format<DType::Q2_K>>(l); return true;
        case DType::Q3_K: launch_gemm_typed<Format<DType::Q3_K>>(l); return true;
        case DType::Q4_K: launch_gemm_typed<Format<DType::Q4_K>>(l); return true;
        case DType::Q5_K: launch_gemm_typed<Format<DType::Q5_K>>(l); return true;
        case DType::Q6_K: launch_gemm_typed<Format<DType::Q6_K>>(l); return true;
        default: return false;
    }
}

bool launch_grouped_gemm_kquant(const GroupedGemmLaunch& l) {
    using namespace kernels;
    switch (l.type) {
        case DType::Q2_K: launch_grouped_gemm_typed<Format<DType::Q2_K>>(l); return true;
        case DType::Q3_K: launch_grouped_gemm_typed<Format<DType::Q3_K>>(l); return true;
        case DType::Q4_K: launch_grouped_gemm_typed<Format<DType::Q4_K>>(l); return true;
        case DType::Q5_K: launch_grouped_gemm_typed<Format<DType::Q5_K>>(l); return true;
        case DType::Q6_K: launch_grouped_gemm_typed<Format<DType::Q6_K>>(l); return true;
        default: return false;
    }
}

}  // namespace strata::cuda
