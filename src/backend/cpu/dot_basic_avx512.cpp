// AVX-512 (VL, BW, VNNI) dot products of the basic weight types.
// Q8_0 / Q4_0 / IQ4_NL (Q8_0 activations): each weight block is decoded once into 32 signed bytes; every column then
// multiplies |w| (unsigned) by its activations carrying w's sign (vpsignb) with one vpdpbusd (8 exact int32 sums of 4
// products), converts them to float and adds them, times the product of the two block scales, into one of two
// accumulators (even / odd blocks, so one FMA chain does not limit a column). The scale products of 8 blocks come
// from two gathers of the f16 scales (vpgatherdd, vpmovdw, vcvtph2ps) instead of 16 scalar conversions.
// Activations of -128 would overflow vpsignb; Q8_0 activations from quantize_activations are within +-127.
// IQ4_XS (Q8_K activations): per sub-block of 32, vpmaddubsw (pairs fit int16: at most 2 * 127 * 128) then vpdpwssd
// against the sub-block scale, so a super-block's 8 sub-blocks sum exactly in int32 before the single float multiply.
// Integer kernels use 256-bit registers: one Q8_0 block is one register, and per block the float work (convert, FMA
// with the scale) is the same count of instructions on either width; the k-quant files measured 256-bit
// vpdpbusd faster than 512-bit on this Xeon (512-bit integer multiplies issue on one port).
// F32 / F16 / BF16 (F32 activations): the AVX2 file's algorithm (two 8-lane FMA accumulators per column, 16 elements
// per step), so both give the same bits. Measured here (F32, n = 1024, rows in L2): 512-bit registers (two 16-lane
// accumulators) ran one column at 76 GB/s against 61, but four columns at 26 against 33 GB/s. Keeping a 512-bit
// one-column path bit-identical needs four 8-lane accumulators per column in the multi-column path, and that ran four
// columns at 26 GB/s too. Prompts are the four-column case, and decode streams from memory, where both widths read
// the same (~11 GB/s on the shared machine).
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
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), abs_w, signed_y);
}

// The low 16 bits of each 32-bit word as floats.
inline __m256 halves_to_floats(__m256i words) {
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(words));
}

inline __m256i add_scaled_pairs(__m256i isum, __m256i pairs, __m256i scale) {
    return _mm256_dpwssd_epi32(isum, pairs, scale);
}

#include "backend/cpu/dot_basic_kernels.inc"

}  // namespace

void register_dots_basic_avx512(DotTable& t) {
    register_basic_kernels(t);
}

}  // namespace strata::cpu
