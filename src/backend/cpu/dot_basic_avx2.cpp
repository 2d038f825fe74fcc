// AVX2 dot products of the basic weight types.
// Q8_0 / Q4_0 / IQ4_NL (Q8_0 activations): each weight block is decoded once into 32 signed bytes; every column then
// multiplies |w| (unsigned) by its activations carrying w's sign (vpsignb) with vpmaddubsw (pairs fit int16: at most
// 2 * 128 * 127) and vpmaddwd against ones, converts the 8 exact int32 sums to float and adds them, times the product
// of the two block scales, into one of two accumulators (even / odd blocks, so one FMA chain does not limit a column).
// The scale products of 8 blocks come from two gathers of the f16 scales instead of 16 scalar conversions.
// Activations of -128 would overflow vpsignb; Q8_0 activations from quantize_activations are within +-127.
// IQ4_XS (Q8_K activations): the same per sub-block of 32, with vpmaddwd against the sub-block scale instead of ones,
// so a super-block's 8 sub-blocks sum exactly in int32 before the single float multiply.
// F32 / F16 / BF16 (F32 activations): FMAs into two 8-lane accumulators per column, 16 elements per step, then one
// 8-element step, then the remaining elements one by one after the horizontal sum.
// Every column runs the same float operations in the same order whatever n_cols is (template<int C>).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

namespace {

// 8 int32 sums of 4 products w * y each, from |w| and y carrying w's sign.
inline __m256i dot_bytes(__m256i abs_w, __m256i signed_y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, signed_y), _mm256_set1_epi16(1));
}

// The low 16 bits of each 32-bit word, packed into 8 halves, as floats.
inline __m256 halves_to_floats(__m256i words) {
    const __m256i packed = _mm256_shuffle_epi8(
        words, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1,
                                -1, -1, -1, -1, -1, -1, -1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
}

inline __m256i add_scaled_pairs(__m256i isum, __m256i pairs, __m256i scale) {
    return _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, scale));
}

#include "backend/cpu/dot_basic_kernels.inc"

}  // namespace

void register_dots_basic_avx2(DotTable& t) {
    register_basic_kernels(t);
}

}  // namespace strata::cpu
