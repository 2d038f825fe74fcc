// AVX2 dot products of IQ2_XS / IQ1_M weights with Q8_K activations.
// Decoding a weight super-block turns its 256 weights into signed integers w stored biased as w + B (unsigned bytes
// for vpmaddubsw) plus one int16 scale per group of 16:
//   IQ2_XS: w = +-grid magnitude (8, 25 or 43); grid entries come from a table holding B + magnitude, and the
//           negative ones become B - magnitude = 2B - (B + magnitude). The sign byte of each group (7 stored bits
//           plus even parity) is computed for all 32 groups at once.
//   IQ1_M:  w = 8 * grid value (-1, 0, 1) +- 1, the group's 1/8 shift folded in, so the integer total is 8x the dot.
// Every activation column then does per 32 weights one vpmaddubsw, one vpmaddwd with the two groups' odd scales
// 2 * ls + 1 and one add; the bias comes back out through the activation's bsums (-B * scale * sum of 16
// activations), which start the column's integer sum. All integer work is exact; per column and super-block the 8
// lanes are summed (still exact) and one scalar FMA adds the float result:
//   acc = fma(float(S_b), d_w * d_a, acc) over the super-blocks b in order, out = 0.125 * acc,
// S_b the super-block's exact integer dot (8x the value dot). That definition is shared with the prompt kernel over
// 8 rows at once (gemm_iq2_xs_rows8_kernels.inc over gemm_iq2_xs_rows8_decode_avx2.cpp's layout), so a column's
// result never depends on how many columns or rows share the work.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/gemm_packed.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

namespace {

constexpr int kBiasXS = 64;  // IQ2_XS magnitudes are at most 43: biased weights 21..107
constexpr int kBiasM = 16;   // IQ1_M weights are -9..9: biased 7..25

// One decoded weight super-block.
struct Decoded {
    __m256i w[8];        // 256 biased weights; w[j] holds groups of 16 number 2j and 2j + 1 (one per 128-bit lane)
    __m256i scale[8];    // int16 odd scale of each pair sum vpmaddubsw makes of w[j]
    __m256i bsum_scale;  // int16 factor -B * scale for each of the 16 activation bsums
    float d = 0;
};

// Grid tables with the bias (and for IQ1_M the 8x) applied, built on first use by the kernels (which run only on
// CPUs with AVX2), so building them never runs wide code on a CPU without it.
struct BiasedGrids {
    uint64_t xs[512];  // IQ2_XS: bytes B + magnitude
    uint64_t m[2048];  // IQ1_M: bytes B + 8 v + 1 for grid value v (a negative shift subtracts 2 later)
};
alignas(64) BiasedGrids g_grids;

bool build_grids() {
    for (int e = 0; e < 512; ++e) {
        uint64_t v = 0;
        for (int j = 0; j < 8; ++j)
            v |= static_cast<uint64_t>(kBiasXS + quant::grid_byte(quant::kIQ2XSGrid[e], j)) << (8 * j);
        g_grids.xs[e] = v;
    }
    for (int e = 0; e < 2048; ++e) {
        uint64_t v = 0;
        for (int j = 0; j < 8; ++j) {
            const int value = static_cast<int8_t>(quant::grid_byte(quant::kIQ1SGrid[e], j));
            v |= static_cast<uint64_t>(kBiasM + 8 * value + 1) << (8 * j);
        }
        g_grids.m[e] = v;
    }
    return true;
}

const BiasedGrids& grids() {
    static const bool built = build_grids();
    (void)built;
    return g_grids;
}

// 16 fields (nibbles or 3-bit, already spread one per byte in lo8 / hi8) -> 2 v + 1 -> the per-pair int16 scale
// registers and the bsum factors.
template <int Bias>
inline void set_scales(uint64_t lo8, uint64_t hi8, Decoded& u) {
    const uint64_t ones = 0x0101010101010101ULL;
    const __m128i odd = _mm_set_epi64x(static_cast<long long>(2 * hi8 + ones), static_cast<long long>(2 * lo8 + ones));
    const __m256i both = _mm256_broadcastsi128_si256(odd);
    // Word k of scale[j]: group 2j + (k >= 8), zero-extended.
    const __m256i pick = _mm256_setr_epi8(0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1,  //
                                          1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    const __m256i step = _mm256_setr_epi8(2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0,  //
                                          2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0);
    __m256i idx = pick;
    for (int j = 0; j < 8; ++j, idx = _mm256_add_epi8(idx, step)) u.scale[j] = _mm256_shuffle_epi8(both, idx);
    u.bsum_scale = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(odd), _mm256_set1_epi16(-Bias));
}

// Four grid entries (8 bytes each) for the 32-bit indices in idx.
inline __m256i gather4(const long long* table, __m128i idx) {
    return _mm256_i32gather_epi64(table, idx, 8);
}

// Byte k of rep (a group's byte replicated 8 times) has bit k % 8 set -> 0xFF.
inline __m256i bit_mask(__m256i rep) {
    const __m256i bits = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    return _mm256_cmpeq_epi8(_mm256_and_si256(rep, bits), bits);
}

// Broadcast 4 bytes and replicate byte g to bytes 8g..8g+7.
inline __m256i replicate4(const uint8_t* four) {
    uint32_t v;
    std::memcpy(&v, four, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    return _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(v)), spread);
}

inline void decode(const BlockIQ2_XS& b, Decoded& u, const BiasedGrids& tables) {
    const auto* grid = reinterpret_cast<const long long*>(tables.xs);
    // Sign byte of each group: the 7 stored bits (q >> 9) and their parity as bit 7. The low nibble of
    // (q >> 9) ^ (q >> 13) has the same parity; a 16-entry table gives 0x80 for odd.
    const __m256i odd_table = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));
    __m256i full[2];
    for (int h = 0; h < 2; ++h) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16 * h));
        const __m256i seven = _mm256_srli_epi16(q, 9);
        const __m256i folded = _mm256_xor_si256(seven, _mm256_srli_epi16(q, 13));
        full[h] = _mm256_or_si256(seven, _mm256_shuffle_epi8(odd_table, folded));
    }
    // packus interleaves lanes: bytes 0-7 groups 0-7, 8-15 groups 16-23, 16-23 groups 8-15, 24-31 groups 24-31.
    alignas(32) uint8_t signs[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(signs), _mm256_packus_epi16(full[0], full[1]));
    constexpr int kSignOffset[8] = {0, 4, 16, 20, 8, 12, 24, 28};  // of the 4 sign bytes of groups 4j..4j+3
    const __m256i twice_bias = _mm256_set1_epi8(static_cast<char>(static_cast<uint8_t>(2 * kBiasXS)));
    for (int k = 0; k < 4; ++k) {
        for (int half = 0; half < 2; ++half) {
            const int j = 2 * k + half;
            // Four scalar loads: cheaper than vpgatherqq for 4 entries (bench_expert_kernels, one token).
            const uint16_t* q = b.qs + 8 * k + 4 * half;
            const __m256i x = _mm256_set_epi64x(grid[q[3] & 511], grid[q[2] & 511], grid[q[1] & 511], grid[q[0] & 511]);
            const __m256i negative = bit_mask(replicate4(signs + kSignOffset[j]));
            u.w[j] = _mm256_blendv_epi8(x, _mm256_sub_epi8(twice_bias, x), negative);
        }
    }
    uint64_t raw;
    std::memcpy(&raw, b.scales, 8);
    const uint64_t nibbles = 0x0F0F0F0F0F0F0F0FULL;
    set_scales<kBiasXS>(_pdep_u64(raw, nibbles), _pdep_u64(raw >> 32, nibbles), u);
    u.d = _cvtsh_ss(b.d);
}

inline void decode(const BlockIQ1_M& b, Decoded& u, const BiasedGrids& tables) {
    const auto* grid = reinterpret_cast<const long long*>(tables.m);
    // Nibble l of qh (low nibble first): bits 0-2 are index bits 8-10 of group l, bit 3 the sign of its shift.
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh));
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_and_si128(qh, m4), hi = _mm_and_si128(_mm_srli_epi16(qh, 4), m4);
    alignas(32) uint8_t nib[32];
    _mm_store_si128(reinterpret_cast<__m128i*>(nib), _mm_unpacklo_epi8(lo, hi));
    _mm_store_si128(reinterpret_cast<__m128i*>(nib + 16), _mm_unpackhi_epi8(lo, hi));
    const __m256i seven = _mm256_set1_epi32(7);
    for (int k = 0; k < 4; ++k) {
        // Indices of groups 8k..8k+7: qs byte | (nibble & 7) << 8.
        const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * k)));
        const __m256i high = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(nib + 8 * k)));
        const __m256i idx = _mm256_or_si256(low, _mm256_slli_epi32(_mm256_and_si256(high, seven), 8));
        for (int half = 0; half < 2; ++half) {
            const int j = 2 * k + half;
            const __m256i x = gather4(grid, half ? _mm256_extracti128_si256(idx, 1) : _mm256_castsi256_si128(idx));
            // Subtract 2 where bit 3 of the group's nibble is set: (nibble & 8) >> 2.
            const __m256i shift_bit = _mm256_and_si256(replicate4(nib + 4 * j), _mm256_set1_epi8(8));
            u.w[j] = _mm256_sub_epi8(x, _mm256_srli_epi16(shift_bit, 2));
        }
    }
    uint64_t raw;
    std::memcpy(&raw, b.scales, 8);
    // Scale fields: 4 x 3 bits at the bottom of each uint16; the f16 super-block scale is the 4 top nibbles.
    const uint64_t fields = _pext_u64(raw, 0x0FFF0FFF0FFF0FFFULL);
    const uint64_t three = 0x0707070707070707ULL;
    set_scales<kBiasM>(_pdep_u64(fields, three), _pdep_u64(fields >> 24, three), u);
    u.d = _cvtsh_ss(static_cast<unsigned short>(_pext_u64(raw, 0xF000F000F000F000ULL)));
}

inline int32_t sum_of(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

// acc + float(S) * (d_w * d_a), one rounding (the definition above).
inline __m128 add_block(__m128 acc, __m256i isum, float d_w, float d_a) {
    return _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), sum_of(isum)), _mm_set_ss(d_w * d_a), acc);
}

// How far ahead of the block being decoded the weight row is prefetched: the grid work keeps the loop too busy for
// the hardware prefetcher alone to keep a streamed row ahead (measured: 2 KB brings streaming rows to L2 speed).
constexpr int kPrefetchBytes = 2048;

// C activation columns against one weight row; each column's operations are those of C = 1.
template <typename Block, int C>
void dot_kernel_c(int64_t n, const void* w, const void* a, size_t a_stride, float* out) {
    const auto* x = static_cast<const Block*>(w);
    const BlockQ8_K* y[C];
    for (int c = 0; c < C; ++c)
        y[c] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + c * a_stride);
    __m128 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm_setzero_ps();
    const BiasedGrids& tables = grids();
    Decoded u;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
        decode(x[i], u, tables);
        for (int c = 0; c < C; ++c) {
            const BlockQ8_K& b = y[c][i];
            const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
            __m256i isum = _mm256_madd_epi16(bsums, u.bsum_scale);
            for (int j = 0; j < 8; ++j) {
                const __m256i act = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * j));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(u.w[j], act), u.scale[j]));
            }
            acc[c] = add_block(acc[c], isum, u.d, b.d);
        }
    }
    // Both types' integer totals are 8x the dot: IQ2_XS values are d * (2 ls + 1) / 8 * grid, IQ1_M's shift is 1/8.
    for (int c = 0; c < C; ++c) out[c] = 0.125f * _mm_cvtss_f32(acc[c]);
}

template <typename Block>
void dot_kernel_any(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    switch (n_cols) {
        case 1:
            dot_kernel_c<Block, 1>(n, w, a, a_stride, out);
            break;
        case 2:
            dot_kernel_c<Block, 2>(n, w, a, a_stride, out);
            break;
        case 3:
            dot_kernel_c<Block, 3>(n, w, a, a_stride, out);
            break;
        default:
            dot_kernel_c<Block, 4>(n, w, a, a_stride, out);
            break;
    }
}

}  // namespace

void register_dots_iq2_avx2(DotTable& t) {
    t.set(DType::IQ2_XS, dot_kernel_any<BlockIQ2_XS>);
    t.set(DType::IQ1_M, dot_kernel_any<BlockIQ1_M>);
}

}  // namespace strata::cpu
