// decode_iq2_xs_rows8 (gemm_packed.h): 8 evenly strided IQ2_XS rows straight into the 8-row layout that
// gemm_iq2_xs_rows8_kernels.inc reads, for prompts (each super-block decoded once for all of a unit's tokens).
//
// A register of that layout is 4 weights x 8 rows, i.e. one half of a grid entry per row, so one vpgatherdd from the
// grid table (as 1,024 dwords) fills it; the rows' indices come 2 per gather (qs[2g] and qs[2g + 1], the two entries of
// group g). Signs: the 7 stored bits and their parity for 16 indices at once, then per register the 4 bits of its half
// spread to byte masks and applied as (m ^ mask) - mask. The integers are those of the format's definition, so the
// kernels' exact sums do not change.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/gemm_packed.h"
#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

void decode_iq2_xs_rows8(int64_t n, const void* row0, size_t row_stride, int n_rows, void* decoded) {
    STRATA_ASSERT(n_rows >= 1 && n_rows <= 8 && row_stride * 7 < (size_t{1} << 31));
    const auto* grid = reinterpret_cast<const int*>(quant::kIQ2XSGrid);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n_rows), lane);  // rows past n_rows read nothing
    const __m256i offsets = _mm256_mullo_epi32(lane, _mm256_set1_epi32(static_cast<int>(row_stride)));
    const __m256i zero = _mm256_setzero_si256();
    // 0x80 where a 4-bit value has odd parity: the low nibble of (q >> 9) ^ (q >> 13) has the 7 sign bits' parity.
    const __m256i odd_table = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));
    // Sign byte of qs[2g] (byte 0 of each row's dword) or qs[2g + 1] (byte 2) spread over the dword's 4 bytes.
    const __m256i spread_lo = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,  //
                                               0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i spread_hi = _mm256_add_epi8(spread_lo, _mm256_set1_epi8(2));
    // Bit k of the sign byte for weight k of the entry: weights 0-3 in the first register, 4-7 in the second.
    const __m256i bits[2] = {_mm256_set1_epi32(0x08040201), _mm256_set1_epi32(static_cast<int>(0x80402010u))};
    const __m256i ones = _mm256_set1_epi8(1);
    const auto* base = static_cast<const uint8_t*>(row0);
    // The gathers would otherwise wait on memory once per super-block (perf: the first gather of each took a fifth of
    // the decode): ask for this group's lines and the next 8 rows' (usually the unit's next group; prefetches never
    // fault, so reading past the tensor is harmless).
    const size_t bytes = row_stride * static_cast<size_t>(n_rows);
    for (size_t off = 0; off < bytes + 8 * row_stride; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(base + off), _MM_HINT_T0);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const auto* blk = reinterpret_cast<const int*>(base + static_cast<size_t>(i) * sizeof(BlockIQ2_XS));
        const auto* at = reinterpret_cast<const uint8_t*>(blk);
        auto* out = static_cast<uint8_t*>(decoded) + static_cast<size_t>(i) * kIq2XsRows8BlockBytes;
        const __m256i scales_lo =
            _mm256_mask_i32gather_epi32(zero, reinterpret_cast<const int*>(at + 66), offsets, live, 1);
        const __m256i scales_hi =
            _mm256_mask_i32gather_epi32(zero, reinterpret_cast<const int*>(at + 70), offsets, live, 1);
        __m256i weighted = zero;  // per row: sum over g of scale_g x (group g's weight sum)
        for (int g = 0; g < 16; ++g) {
            const __m256i q2 =
                _mm256_mask_i32gather_epi32(zero, reinterpret_cast<const int*>(at + 2 + 4 * g), offsets, live, 1);
            const __m256i seven = _mm256_srli_epi16(q2, 9);
            const __m256i folded = _mm256_xor_si256(seven, _mm256_srli_epi16(q2, 13));
            const __m256i signs = _mm256_or_si256(seven, _mm256_shuffle_epi8(odd_table, folded));
            const __m256i index[2] = {_mm256_and_si256(q2, _mm256_set1_epi32(511)),
                                      _mm256_and_si256(_mm256_srli_epi32(q2, 16), _mm256_set1_epi32(511))};
            const __m256i rep[2] = {_mm256_shuffle_epi8(signs, spread_lo), _mm256_shuffle_epi8(signs, spread_hi)};
            __m256i w[4];
            for (int e = 0; e < 2; ++e)
                for (int h = 0; h < 2; ++h) {
                    const __m256i m = _mm256_i32gather_epi32(grid + h, index[e], 8);
                    const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(rep[e], bits[h]), bits[h]);
                    w[2 * e + h] = _mm256_sub_epi8(_mm256_xor_si256(m, neg), neg);
                    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * (4 * g + 2 * e + h)), w[2 * e + h]);
                }
            // Odd scale 2 ls + 1 (nibble g of the row's 8 scale bytes) in both words of the row's dword.
            const __m256i nibble =
                _mm256_and_si256(_mm256_srli_epi32(g < 8 ? scales_lo : scales_hi, 4 * (g % 8)), _mm256_set1_epi32(15));
            const __m256i odd =
                _mm256_and_si256(_mm256_or_si256(_mm256_slli_epi32(nibble, 1), _mm256_set1_epi32(1)), live);
            const __m256i pair = _mm256_or_si256(odd, _mm256_slli_epi32(odd, 16));
            _mm256_store_si256(reinterpret_cast<__m256i*>(out + 2048 + 32 * g), pair);
            // Two registers' bytes add without overflow (|w| <= 43); vpmaddubsw against ones makes the word sums.
            const __m256i sum16 = _mm256_add_epi16(_mm256_maddubs_epi16(ones, _mm256_add_epi8(w[0], w[1])),
                                                   _mm256_maddubs_epi16(ones, _mm256_add_epi8(w[2], w[3])));
            weighted = _mm256_add_epi32(weighted, _mm256_madd_epi16(sum16, pair));
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + 2560), _mm256_slli_epi32(weighted, 7));
        // d: the f16 in the low half of each row's first dword.
        const __m256i d16 =
            _mm256_and_si256(_mm256_mask_i32gather_epi32(zero, blk, offsets, live, 1), _mm256_set1_epi32(0xFFFF));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(d16, d16), 0x08);
        _mm256_store_ps(reinterpret_cast<float*>(out + 2592), _mm256_cvtph_ps(_mm256_castsi256_si128(packed)));
    }
}

}  // namespace strata::cpu
