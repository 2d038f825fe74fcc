// Block layouts of ggml's quant formats (format facts from ggml-common.h) and their scalar reference
// (de)quantizers. dequantize_row / quantize_row in dtype.h dispatch here; these are the definitions SIMD kernels
// must agree with.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace strata {

constexpr int64_t kQK_K = 256;  // elements of a k-quant / i-quant super-block
constexpr int64_t kQ4_0Block = 32;
constexpr int64_t kIQ4NLBlock = 32;

// Q4_0: 32 4-bit values, x = d * (q - 8); byte j holds element j (low nibble) and j + 16 (high nibble).
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[kQ4_0Block / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q2_K: 16 sub-blocks of 16; x = d * (sc & 15) * q - dmin * (sc >> 4), q in 0..3.
struct BlockQ2_K {
    uint8_t scales[kQK_K / 16];  // low nibble scale, high nibble min
    uint8_t qs[kQK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// Q3_K: 16 sub-blocks of 16; x = d * (sc - 32) * (q - 4), q 3 bits (2 in qs, the high one in hmask), sc 6 bits.
struct BlockQ3_K {
    uint8_t hmask[kQK_K / 8];
    uint8_t qs[kQK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// Q4_K: 8 sub-blocks of 32; x = d * sc * q - dmin * m, q 4 bits, sc and m 6 bits packed in 12 bytes.
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K: as Q4_K with a fifth bit per value in qh.
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[kQK_K / 8];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K: 16 sub-blocks of 16; x = d * sc * (q - 32), q 6 bits (4 in ql, 2 in qh), sc int8.
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];
    uint8_t qh[kQK_K / 4];
    int8_t scales[kQK_K / 16];
    uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Q8_K: the activation format of k-quant dot products; float scale, int8 values, sums of each 16.
struct BlockQ8_K {
    float d;
    int8_t qs[kQK_K];
    int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// IQ4_NL: 32 4-bit indices into kIQ4NLValues, x = d * value; nibble layout as Q4_0.
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[kIQ4NLBlock / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (low 4 bits in scales_l, high 2 in scales_h), x = d * (ls - 32) * value.
struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[kQK_K / 64];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// IQ2_XS: 32 groups of 8; each uint16 is a 9-bit grid index and a 7-bit sign index; 4-bit scale per 16 values.
struct BlockIQ2_XS {
    uint16_t d;
    uint16_t qs[kQK_K / 8];
    uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_XS) == 74);

// IQ3_XXS: 64 8-bit grid indices (4 values each), then per 32 values a uint32 of 4 x 7 sign bits and a 4-bit scale.
struct BlockIQ3_XXS {
    uint16_t d;
    uint8_t qs[3 * kQK_K / 8];
};
static_assert(sizeof(BlockIQ3_XXS) == 98);

// IQ3_S: 64 9-bit grid indices (low 8 in qs, 9th in qh), explicit sign bits, 4-bit scale per 32 values.
struct BlockIQ3_S {
    uint16_t d;
    uint8_t qs[kQK_K / 4];
    uint8_t qh[kQK_K / 32];
    uint8_t signs[kQK_K / 8];
    uint8_t scales[kQK_K / 64];
};
static_assert(sizeof(BlockIQ3_S) == 110);

// IQ1_M: 32 11-bit indices into the {-1,0,1} grid, a +-1/8 shift per group of 8, 3-bit scales per 16 values and an
// f16 super-block scale spread over the top nibbles of the four uint16 of scales.
struct BlockIQ1_M {
    uint8_t qs[kQK_K / 8];
    uint8_t qh[kQK_K / 16];
    uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_M) == 56);

namespace quant {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);

struct RowFunctions {
    DequantizeFn to_f32 = nullptr;
    QuantizeFn from_f32 = nullptr;
};

// The reference row functions of the quant types in this file; both null for any other type.
RowFunctions row_functions(DType t);

// k-quants (quant_k.cpp)
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q2_k(const void* src, float* dst, int64_t n);
void dequantize_q3_k(const void* src, float* dst, int64_t n);
void dequantize_q4_k(const void* src, float* dst, int64_t n);
void dequantize_q5_k(const void* src, float* dst, int64_t n);
void dequantize_q6_k(const void* src, float* dst, int64_t n);
void dequantize_q8_k(const void* src, float* dst, int64_t n);
void quantize_q4_0(const float* src, void* dst, int64_t n);
void quantize_q2_k(const float* src, void* dst, int64_t n);
void quantize_q3_k(const float* src, void* dst, int64_t n);
void quantize_q4_k(const float* src, void* dst, int64_t n);
void quantize_q5_k(const float* src, void* dst, int64_t n);
void quantize_q6_k(const float* src, void* dst, int64_t n);
void quantize_q8_k(const float* src, void* dst, int64_t n);

// i-quants (quant_iq.cpp)
void dequantize_iq4_nl(const void* src, float* dst, int64_t n);
void dequantize_iq4_xs(const void* src, float* dst, int64_t n);
void dequantize_iq2_xs(const void* src, float* dst, int64_t n);
void dequantize_iq3_xxs(const void* src, float* dst, int64_t n);
void dequantize_iq3_s(const void* src, float* dst, int64_t n);
void dequantize_iq1_m(const void* src, float* dst, int64_t n);
void quantize_iq4_nl(const float* src, void* dst, int64_t n);
void quantize_iq4_xs(const float* src, void* dst, int64_t n);
// grid i-quants (quant_iq_grid.cpp): llama.cpp's search with an all-ones importance matrix, not byte-identical
void quantize_iq2_xs(const float* src, void* dst, int64_t n);
void quantize_iq3_xxs(const float* src, void* dst, int64_t n);
void quantize_iq3_s(const float* src, void* dst, int64_t n);
void quantize_iq1_m(const float* src, void* dst, int64_t n);

// 6-bit scale j (0..7) and min of a Q4_K / Q5_K scales array (ggml's get_scale_min_k4 packing).
void unpack_scale_min_k4(const uint8_t* scales, int j, uint8_t* scale, uint8_t* min);
// 6-bit scale j (0..15) of a Q3_K scales array, before the -32 offset.
int unpack_scale_q3_k(const uint8_t* scales, int j);

// Round to nearest, ties to even, as ggml's nearest_int (valid for |x| < 2^22).
inline int nearest_int(float x) {
    const float shifted = x + 12582912.0f;
    uint32_t bits = 0;
    __builtin_memcpy(&bits, &shifted, 4);
    return static_cast<int>(bits & 0x007fffff) - 0x00400000;
}

// The value of largest magnitude (the first one on ties, sign kept): ggml's quantizers start their scales from it.
inline float signed_absmax(const float* x, int n) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    return max;
}

}  // namespace quant
}  // namespace strata
