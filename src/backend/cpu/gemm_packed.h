// Private to the CPU backend: the kernels over packed weights (packed.h) and the activation layouts they read.
// AVX-512: gemm_packed_avx512.cpp and quantize_avx512.cpp, called only when active_isa() is AVX-512; AVX2 (with and
// without AVX-VNNI): gemm_packed_avx2.cpp, gemm_packed_avxvnni.cpp (for Q8_0 and Q4_K the same bits as AVX-512's;
// Q5_K, Q6_K, IQ4_XS, IQ3_XXS and IQ3_S are packed for the AVX2 class only) and the portable quantizers in packed.cpp.
//
// Numerics, per output (row r, token t), over the weight's blocks b in order, acc starting at 0:
//   Q8_0: acc = fma(float(s_b), d_w * d_a, acc), s_b the exact integer dot of the block's quants.
//   Q4_K (and Q5_K): acc = fma(float(S_b), d_w * d_a, acc); acc = fma(-float(M_b), dmin_w * d_a, acc), where S_b is
//         the sum over sub-blocks j of scale_j times the exact value-activation dot, M_b the sum of min_j times the
//         sub-block's activation sum (Q8_K's bsums), both exact int32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::cpu {

// Per 32 activations: the 32 Q8_0 quants plus 128 (as unsigned bytes, what vpdpbusd multiplies) and the block scale
// as f32. The bias is taken back out with the weights' quant sums.
constexpr size_t kBiasedBlockBytes = 36;
// llama.cpp's reference Q8_0 quantization (byte for byte the same quants and f16 scale) in that layout.
void quantize_q8_0_biased(const float* x, uint8_t* dst, int64_t n);
// The same bytes with AVX2 (quantize_avx2.cpp) and from the reference quantizer (packed.cpp).
void quantize_q8_0_biased_avx2(const float* x, uint8_t* dst, int64_t n);
void quantize_q8_0_biased_portable(const float* x, uint8_t* dst, int64_t n);
// The same without the bias (signed quants, then the f32 scale): what the Q8_0 GEMM with AVX2 alone reads.
void quantize_q8_0_signed_avx2(const float* x, uint8_t* dst, int64_t n);

// y[c * y_stride + r] = row r of one packed group times activation column c, for r < n_rows (<= 16) and
// c < n_cols (<= 8); activation column c starts at act + c * act_stride.
struct PackedGemm {
    const uint8_t* group;
    int64_t n_blocks;
    const uint8_t* act;
    size_t act_stride;
    int n_cols;
    float* y;
    size_t y_stride;
    int n_rows;
};
constexpr int kPackedCols = 8;
void gemm_q8_0_packed(const PackedGemm& g);  // n_cols <= 8
constexpr int kPackedColsQ4_K = 4;
void gemm_q4_k_packed(const PackedGemm& g);  // n_cols <= 4
// The same outputs, bit for bit, with AVX2 alone and with AVX2 + AVX-VNNI.
void gemm_q8_0_packed_avx2(const PackedGemm& g);
void gemm_q4_k_packed_avx2(const PackedGemm& g);
void gemm_q8_0_packed_avxvnni(const PackedGemm& g);
void gemm_q4_k_packed_avxvnni(const PackedGemm& g);
// Q8_0 prompts with AVX2 alone (gemm_q8_0_i16_avx2.cpp): the same outputs, bit for bit, from int16 products. A
// unit's packed group is widened once (widen_q8_0_group_avx2) into 2 halves of n_blocks blocks of
// kI16HalfBlockBytes: the 8 rows' f32 d, then for k < 16 quants 2k, 2k+1 of row r as int16 at 32 + 32k + 4r. The
// activations are the reference quants as int16, then the f32 scale (kI16BlockBytes per 32). The GEMM writes
// y[c * y_stride + r] for every c < n_cols (any count, the 8-token passes looped inside) and r < n_rows (<= 16).
constexpr size_t kI16BlockBytes = 64 + 4;
constexpr size_t kI16HalfBlockBytes = 32 + 16 * 32;
void quantize_q8_0_i16_avx2(const float* x, uint8_t* dst, int64_t n);
void widen_q8_0_group_avx2(const uint8_t* group, int64_t n_blocks, uint8_t* wide);
// g.group: the widened group; n_cols any count.
void gemm_q8_0_i16_avx2(const PackedGemm& g);
// Q5_K, AVX2 only: the numerics of Q4_K (the values 5 bits), over the same activations.
void gemm_q5_k_packed_avx2(const PackedGemm& g);     // n_cols <= 4
void gemm_q5_k_packed_avxvnni(const PackedGemm& g);  // n_cols <= 4
// Q6_K, AVX2 only (gemm_packed_q6_k_avx2_kernels.inc), over activations biased by 128 (kBiasedQ8KBlockBytes per 256,
// quantize_q8_k_biased_avx2): acc = fma(float(S_b), d_w * d_a, acc), S_b the sum over sub-blocks j of scale_j times
// the exact dot of (q - 32) with the Q8_K quants. The same bits with and without AVX-VNNI.
constexpr int kPackedColsQ6_K = 8;
void gemm_q6_k_packed_avx2(const PackedGemm& g);     // n_cols <= 8
void gemm_q6_k_packed_avxvnni(const PackedGemm& g);  // n_cols <= 8
// IQ4_XS, AVX2 only (gemm_packed_iq4_xs_avx2_kernels.inc): acc = fma(float(S_b), d_w * d_a, acc), S_b the sum over
// sub-blocks j of (ls_j - 32) times the exact dot of the table values with the Q8_K quants. With AVX-VNNI over
// activations biased by 128 (kBiasedQ8KBlockBytes per 256), without over the signed ones (kQ8KSumsBlockBytes).
constexpr int kPackedColsIQ4_XS = 8;
void gemm_iq4_xs_packed_avx2(const PackedGemm& g);     // n_cols <= 8
void gemm_iq4_xs_packed_avxvnni(const PackedGemm& g);  // n_cols <= 8
// IQ3_XXS, AVX2 only (gemm_packed_iq3_avx2_kernels.inc), over activations biased by 128 (kBiasedQ8KBlockBytes
// per 256): acc = fma(float(S_b), d_w * d_a, acc), S_b the sum over sub-blocks j of (2 ls_j + 1) times the exact dot of
// the signed grid values with the Q8_K quants, then y = 0.25 x acc. The same bits with and without AVX-VNNI.
constexpr int kPackedColsIQ3_XXS = 8;
void gemm_iq3_xxs_packed_avx2(const PackedGemm& g);     // n_cols <= 8
void gemm_iq3_xxs_packed_avxvnni(const PackedGemm& g);  // n_cols <= 8
// IQ3_S, AVX2 only: the same with its 9-bit indices and grid, and no 0.25 (its scale is 2 ls + 1).
void gemm_iq3_s_packed_avx2(const PackedGemm& g);     // n_cols <= 8
void gemm_iq3_s_packed_avxvnni(const PackedGemm& g);  // n_cols <= 8

// Per 256 activations: llama.cpp's Q8_K quants (the reference quantizer's), its f32 scale, then the 8 sums of each
// 32 quants (a sub-block) as int16.
constexpr size_t kQ8KSumsBlockBytes = 256 + 4 + 16;
void quantize_q8_k_sums(const float* x, uint8_t* dst, int64_t n);
void quantize_q8_k_sums_avx2(const float* x, uint8_t* dst, int64_t n);
void quantize_q8_k_sums_portable(const float* x, uint8_t* dst, int64_t n);
// llama.cpp's reference Q8_K quantization (quant::quantize_q8_k), byte for byte, in its own layout (BlockQ8_K).
void quantize_q8_k_avx512(const float* x, void* dst, int64_t n);
void quantize_q8_k_avx2(const float* x, void* dst, int64_t n);

// IQ2_XS with AVX-512 (dot_iq2_avx512.cpp): a row kernel (a DotFn, up to kMaxDotCols tokens) over activations laid
// out by group of 16. Per 256 activations (a block of kQ8KGroupsBlockBytes): at 64k + 4g the Q8_K quants
// 16g + 4k .. + 3 (k < 4, g < 16), at 256 + 4g the int32 -64 x group g's quant sum (the weights are decoded biased
// by 64). The blocks' f32 scales follow all the blocks of a row, so that every block starts a cache line (a row is
// q8_k_groups_row_bytes, a multiple of 64). Numerics per output: 16 lane accumulators, lane g over the super-blocks
// in order:
//   lane_g = fma(float(s_g), (float(2 ls_g + 1) * d_w) * d_a, lane_g), s_g the exact dot of group g,
// then 0.125 x the lanes summed as g + (g + 8), + 4, + 2, + 1.
constexpr size_t kQ8KGroupsBlockBytes = 256 + 64;
constexpr size_t q8_k_groups_row_bytes(int64_t n) {
    const auto blocks = static_cast<size_t>(n / 256);
    return blocks * kQ8KGroupsBlockBytes + (blocks * 4 + 63) / 64 * 64;
}
void quantize_q8_k_groups(const float* x, uint8_t* dst, int64_t n);
void dot_iq2_xs_groups(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols);
// The same kernel split in two, for prompts: a row's super-blocks decoded once into a scratch (n / 256 blocks of
// kIq2XsDecodedBlockBytes, 64-byte aligned) that all of a unit's token chunks then read, two rows against up to
// kIq2XsPairCols columns per pass (each activation load serves both rows): y[c * y_stride] and y[c * y_stride + 1]
// are what dot_iq2_xs_groups gives for the two rows, bit for bit.
constexpr size_t kIq2XsDecodedBlockBytes = 5 * 64;
void decode_iq2_xs_groups(int64_t n, const void* w, void* decoded);
constexpr int kIq2XsPairCols = 8;
struct DecodedPair {
    int64_t n;
    const void* row0;
    const void* row1;
    const void* act;
    size_t act_stride;
    float* y;
    size_t y_stride;
    int n_cols;
};
void dot_iq2_xs_decoded_pair(const DecodedPair& p);

// IQ2_XS with AVX2, for prompts: out[c] is what the AVX2 row kernel (dot_iq2_avx2.cpp) gives for that row and column,
// bit for bit, computed 8 rows at a time (gemm_iq2_xs_rows8_kernels.inc: vpmaddubsw sums with AVX2 alone, vpdpbusd
// with AVX-VNNI). decode_iq2_xs_rows8 (gemm_iq2_xs_rows8_decode_avx2.cpp) writes n_rows <= 8 rows (row r at
// row0 + r * row_stride, n / 256 blocks each) as n / 256 blocks of kIq2XsRows8BlockBytes: at 32s + 4r the signed
// weights 4s..4s+3 of row r (s < 64); at 2048 + 32g + 4r row r's odd scale 2 ls + 1 of group g in both int16 halves;
// at 2560 + 4r the int32 128 x sum over g of scale x the group's weight sum (the bias of the activations, taken back
// out); at 2592 + 4r the f32 d. Rows past n_rows have scale and d zero (their weights are not meaningful). The
// kernels read activations biased by 128 (kBiasedQ8KBlockBytes per 256: the Q8_K quants + 128, then d) and write
// y[c * y_stride + r] for every c < n_cols (up to 64 tokens per call, the passes looped inside), r < n_rows.
constexpr size_t kIq2XsRows8BlockBytes = 2624;
constexpr size_t kBiasedQ8KBlockBytes = 256 + 4;
void decode_iq2_xs_rows8(int64_t n, const void* row0, size_t row_stride, int n_rows, void* decoded);
void quantize_q8_k_biased_avx2(const float* x, uint8_t* dst, int64_t n);
struct Rows8Gemm {
    int64_t n;
    const void* decoded;
    const uint8_t* act;
    size_t act_stride;
    int n_cols;
    float* y;
    size_t y_stride;
    int n_rows;
};
void gemm_iq2_xs_rows8_avx2(const Rows8Gemm& g);
void gemm_iq2_xs_rows8_avxvnni(const Rows8Gemm& g);

}  // namespace strata::cpu
