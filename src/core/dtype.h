// Element types with ggml's ids (GGUF stores them), block sizes, and scalar reference (de)quantizers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

enum class DType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
};

struct DTypeTraits {
    const char* name;
    int64_t block_size;   // elements per block
    size_t block_bytes;   // bytes per block
    bool can_compute;     // this build can dequantize it
};

// Traits of a ggml type id, or nullopt for an id GGUF does not define.
std::optional<DTypeTraits> dtype_traits(uint32_t id);
const DTypeTraits& traits(DType t);  // t must be a known type
const char* dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // "f32", "q8_0", ... (case-insensitive)

// Bytes of a row of n elements; n must be a multiple of the block size.
size_t row_bytes(DType t, int64_t n);

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even, NaN stays NaN

// Scalar reference conversions of n elements (n a multiple of the block size). Throws Error for a type this build
// cannot compute.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// quantize_row: F32, F16, BF16, Q8_0, Q4_0, Q2_K..Q6_K, Q8_K, IQ4_NL, IQ4_XS (llama.cpp's reference quantizers) and
// the grid i-quants IQ2_XS, IQ3_XXS, IQ3_S, IQ1_M (llama.cpp's search with uniform importance; not byte-identical).
// Layouts: core/quant_blocks.h.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Q8_0: 32 int8 values sharing one f16 scale.
constexpr int64_t kQ8_0Block = 32;
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[kQ8_0Block];
};
static_assert(sizeof(BlockQ8_0) == 34);

}  // namespace strata
