// AVX-512 (VNNI) dot products of IQ2_XS / IQ1_M weights with Q8_K activations.
// Decoding a weight super-block turns its 256 weights into signed integers w stored biased as w + B (unsigned bytes
// for vpmaddubsw) plus one int16 scale per group of 16:
//   IQ2_XS: w = +-grid magnitude (8, 25 or 43); 16-wide gathers fetch B + magnitude from a biased copy of the grid;
//           the 7 stored sign bits plus even parity of all 32 groups are computed at once and packed into four 64-bit
//           masks, and one masked subtract per 64 weights turns B + m into B - m = 2B - (B + m).
//   IQ1_M:  w = 8 * grid value (-1, 0, 1) +- 1, the group's 1/8 shift folded in, so the integer total is 8x the dot.
// Every activation column then does per 64 weights one vpmaddubsw and one vpdpwssd with the groups' odd scales
// 2 * ls + 1; the bias comes back out through the activation's bsums (-B * scale * sum of 16 activations), which
// start the column's integer sum. All integer work is exact; per column and super-block one FMA adds the float
// result, so a column's operations never depend on how many columns share the decode.
// 512-bit registers: on this Xeon the same kernel with 256-bit VNNI registers was about 2x slower for one column and
// 1.4x slower for four (vector work only issues on two ports either way), so the wide form is kept.
// GCC 12's AVX-512 intrinsics build their unused source operands from a self-initialized variable, which
// -Wuninitialized reports at every use; the operand is fully masked away, so the warning is noise here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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

// One decoded weight super-block.
struct Decoded {
    __m512i w[4];        // 256 biased weights; w[j] holds groups of 16 number 4j..4j+3 (one per 128-bit lane)
    __m512i scale[4];    // int16 odd scale of each pair sum vpmaddubsw makes of w[j]
    __m256i bsum_scale;  // int16 factor -B * scale for each of the 16 activation bsums
    float d = 0;
};

// 16 odd scales (bytes, group order) -> the per-pair int16 scale registers and the bsum factors.
template <int Bias>
inline void set_scales(__m128i odd_scales, Decoded& u) {
    const __m256i s16 = _mm256_cvtepu8_epi16(odd_scales);
    const __m512i wide = _mm512_castsi256_si512(s16);
    // Word k of scale[j] covers weights 2k, 2k + 1 of the 64, i.e. group 4j + k / 8.
    const __m512i lane_group = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1,
                                                0, 0, 0, 0, 0, 0, 0, 0);
    for (int j = 0; j < 4; ++j)
        u.scale[j] = _mm512_permutexvar_epi16(_mm512_add_epi16(lane_group, _mm512_set1_epi16(4 * j)), wide);
    u.bsum_scale = _mm256_mullo_epi16(s16, _mm256_set1_epi16(-Bias));
}

// 16 nibbles (8 bytes, low nibble first) or 3-bit fields -> one byte each, then 2 * v + 1.
inline __m128i odd_from_fields(uint64_t lo8, uint64_t hi8) {
    const uint64_t ones = 0x0101010101010101ULL;  // 2 v + 1 <= 31 never carries into the next byte
    return _mm_set_epi64x(static_cast<long long>(2 * hi8 + ones), static_cast<long long>(2 * lo8 + ones));
}

constexpr int kBiasXS = 64;  // IQ2_XS magnitudes are at most 43: biased weights 21..107
constexpr int kBiasM = 16;   // IQ1_M weights are -9..9: biased 7..25

// Grid tables with the bias (and for IQ1_M the 8x) applied, built on first use: the kernels are the only readers and
// run only on CPUs with AVX-512, so building them here never runs wide code on a CPU without it.
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

// The 16 group scales 2 ls + 1 of an IQ2_XS super-block as bytes, in group order (low nibble first).
inline __m128i odd_scales(const BlockIQ2_XS& b) {
    uint64_t raw;
    std::memcpy(&raw, b.scales, 8);
    const uint64_t nibbles = 0x0F0F0F0F0F0F0F0FULL;
    return odd_from_fields(_pdep_u64(raw, nibbles), _pdep_u64(raw >> 32, nibbles));
}

// The 256 weights of an IQ2_XS super-block as biased bytes B + w into w[0..3] (Decoded's layout).
inline void decode_weights(const BlockIQ2_XS& b, __m512i (&w)[4], const BiasedGrids& tables) {
    const auto* grid = reinterpret_cast<const long long*>(tables.xs);
    const __m512i q = _mm512_loadu_si512(b.qs);
    // Sign byte of each group: the 7 stored bits (q >> 9) and the parity of those bits as bit 7. The low nibble of
    // (q >> 9) ^ (q >> 13) has the same parity; a 16-entry table gives 0x80 for odd.
    const __m512i seven = _mm512_srli_epi16(q, 9);
    const __m512i folded = _mm512_xor_si512(seven, _mm512_srli_epi16(q, 13));
    const __m512i odd_table =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));
    const __m512i full = _mm512_or_si512(seven, _mm512_shuffle_epi8(odd_table, folded));
    // The low byte of each word to the bottom 8 bytes of its 128-bit lane: qword 2j holds the 64 sign bits of w[j].
    const __m512i low_bytes =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1));
    alignas(64) uint64_t signs[8];
    _mm512_store_si512(signs, _mm512_shuffle_epi8(full, low_bytes));
    const __m512i index_mask = _mm512_set1_epi32(511);
    const __m512i twice_bias = _mm512_set1_epi8(static_cast<char>(static_cast<uint8_t>(2 * kBiasXS)));
    for (int h = 0; h < 2; ++h) {
        const __m512i idx = _mm512_and_si512(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16 * h))), index_mask);
        const __m512i lo = _mm512_i32gather_epi64(_mm512_castsi512_si256(idx), grid, 8);
        const __m512i hi = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(idx, 1), grid, 8);
        // B - magnitude = 2B - (B + magnitude) for the negative ones.
        w[2 * h] =
            _mm512_mask_sub_epi8(lo, _load_mask64(reinterpret_cast<__mmask64*>(signs + 4 * h)), twice_bias, lo);
        w[2 * h + 1] =
            _mm512_mask_sub_epi8(hi, _load_mask64(reinterpret_cast<__mmask64*>(signs + 4 * h + 2)), twice_bias, hi);
    }
}

inline void decode(const BlockIQ2_XS& b, Decoded& u, const BiasedGrids& tables) {
    decode_weights(b, u.w, tables);
    set_scales<kBiasXS>(odd_scales(b), u);
    u.d = _cvtsh_ss(b.d);
}



inline void decode(const BlockIQ1_M& b, Decoded& u, const BiasedGrids& tables) {
    const auto* grid = reinterpret_cast<const long long*>(tables.m);
    // Nibble l of qh (low nibble first): bits 0-2 are index bits 8-10 of group l, bit 3 the sign of its shift.
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh));
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_and_si128(qh, m4), hi = _mm_and_si128(_mm_srli_epi16(qh, 4), m4);
    const __m256i nib = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    const __m256i high3 = _mm256_and_si256(nib, _mm256_set1_epi8(7));
    const uint32_t negative_shift = _mm256_movemask_epi8(_mm256_slli_epi16(nib, 4));  // bit l: group l
    __m512i g[4];
    for (int h = 0; h < 2; ++h) {
        // 11-bit indices of groups 16h..16h+15: qs byte | (nibble & 7) << 8.
        const __m512i low = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * h)));
        const __m128i high = h ? _mm256_extracti128_si256(high3, 1) : _mm256_castsi256_si128(high3);
        const __m512i idx = _mm512_or_si512(low, _mm512_slli_epi32(_mm512_cvtepu8_epi32(high), 8));
        g[2 * h] = _mm512_i32gather_epi64(_mm512_castsi512_si256(idx), grid, 8);
        g[2 * h + 1] = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(idx, 1), grid, 8);
    }
    const __m512i two = _mm512_set1_epi8(2);
    for (int j = 0; j < 4; ++j) {
        const uint64_t shift_mask = _pdep_u64((negative_shift >> (8 * j)) & 0xFF, 0x0101010101010101ULL) * 0xFF;
        u.w[j] = _mm512_mask_sub_epi8(g[j], _cvtu64_mask64(shift_mask), g[j], two);
    }
    uint64_t raw;
    std::memcpy(&raw, b.scales, 8);
    // Scale fields: 4 x 3 bits at the bottom of each uint16; the f16 super-block scale is the 4 top nibbles.
    const uint64_t fields = _pext_u64(raw, 0x0FFF0FFF0FFF0FFFULL);
    const uint64_t three = 0x0707070707070707ULL;
    set_scales<kBiasM>(odd_from_fields(_pdep_u64(fields, three), _pdep_u64(fields >> 24, three)), u);
    u.d = _cvtsh_ss(static_cast<unsigned short>(_pext_u64(raw, 0xF000F000F000F000ULL)));
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
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    const BiasedGrids& tables = grids();
    Decoded u;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
        decode(x[i], u, tables);
        const __m512 weight_d = _mm512_set1_ps(u.d);
        for (int c = 0; c < C; ++c) {
            const BlockQ8_K& b = y[c][i];
            const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
            __m512i isum = _mm512_zextsi256_si512(_mm256_madd_epi16(bsums, u.bsum_scale));
            for (int j = 0; j < 4; ++j) {
                const __m512i act = _mm512_loadu_si512(b.qs + 64 * j);
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(u.w[j], act), u.scale[j]);
            }
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), weight_d), _mm512_set1_ps(b.d), acc[c]);
        }
    }
    // Both types' integer totals are 8x the dot: IQ2_XS values are d * (2 ls + 1) / 8 * grid, IQ1_M's shift is 1/8.
    for (int c = 0; c < C; ++c) out[c] = 0.125f * _mm512_reduce_add_ps(acc[c]);
}

// Up to 16 columns per call: decoding a super-block (four 8-wide gathers, the sign masks) costs about as much as
// eight columns' arithmetic, so prompts amortize it over more tokens; 16 accumulators still fit the registers.
template <typename Block, int C>
void dot_kernel_up_to(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    if constexpr (C > 1) {
        if (n_cols < C) return dot_kernel_up_to<Block, C - 1>(n, w, a, a_stride, out, n_cols);
    }
    dot_kernel_c<Block, C>(n, w, a, a_stride, out);
}

template <typename Block>
void dot_kernel_any(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    dot_kernel_up_to<Block, kMaxDotCols>(n, w, a, a_stride, out, n_cols);
}

// ---- IQ2_XS by group: the matmul's kernel (gemm_packed.h) -----------------------------------------------------

// w[0..3] (groups 4j..4j+3, one per 128-bit lane) rearranged by position: t[k] holds dword k (weights 4k..4k+3) of
// each of the 16 groups of 16 weights, group g in lane g.
inline void by_group(const __m512i (&w)[4], __m512i (&t)[4]) {
    for (int k = 0; k < 4; ++k) {
        const __m512i idx = _mm512_setr_epi32(k, 4 + k, 8 + k, 12 + k, 16 + k, 20 + k, 24 + k, 28 + k, 0, 0, 0, 0, 0,
                                              0, 0, 0);
        const __m512i first = _mm512_permutex2var_epi32(w[0], idx, w[1]);   // groups 0-7
        const __m512i second = _mm512_permutex2var_epi32(w[2], idx, w[3]);  // groups 8-15
        t[k] = _mm512_inserti64x4(first, _mm512_castsi512_si256(second), 1);
    }
}

// The 16 lanes summed in a fixed order: g + (g + 8), then + 4, + 2, + 1 (gemm_packed.h).
inline float sum_lanes(__m512 v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

// Column c's 16 lanes summed as sum_lanes does, for 16 columns at once: each step adds the halves of two registers'
// pieces, so the additions per column (and so the bits) are sum_lanes', at 15 additions instead of 60. Lane c of the
// result is 0.125 x column c's sum (IQ2_XS's 1/8).
inline __m512 lane_sums_16(const __m512 (&acc)[16]) {
    __m512 h[8], q[4], r[2];
    for (int p = 0; p < 8; ++p) {  // g + (g + 8): columns 2p, 2p + 1 in the low and high 256 bits
        const __m512 lo = _mm512_insertf32x8(acc[2 * p], _mm512_castps512_ps256(acc[2 * p + 1]), 1);
        h[p] = _mm512_add_ps(lo, _mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int p = 0; p < 4; ++p)  // + 4: column 4p + k in 128-bit piece k
        q[p] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * p], h[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(h[2 * p], h[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int p = 0; p < 2; ++p)  // + 2: piece k holds columns 8p + k and 8p + 4 + k, two lanes each
        r[p] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * p], q[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(q[2 * p], q[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    // + 1: lane 4k + m holds column 4m + k.
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_ps(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i by_column = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_mul_ps(_mm512_permutexvar_ps(by_column, sums), _mm512_set1_ps(0.125f));
}

// One decoded IQ2_XS super-block as the by-group kernels read it: the 4 registers of by_group, then the 16 group
// scales (2 ls + 1) * d_w as f32.
struct DecodedGroups {
    __m512i t[4];
    __m512 group_scale;
};
static_assert(sizeof(DecodedGroups) == kIq2XsDecodedBlockBytes);

inline void decode_groups(const BlockIQ2_XS& b, DecodedGroups& u, const BiasedGrids& tables) {
    __m512i biased[4];
    decode_weights(b, biased, tables);
    by_group(biased, u.t);
    u.group_scale = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(odd_scales(b))), _mm512_set1_ps(_cvtsh_ss(b.d)));
}

// Column c's accumulator over super-block i: the 16 group dot products (4 vpdpbusd, started at -64 x the group sums)
// times the group scales and d_a.
// Column c's accumulator over super-block i: the 16 group dot products (4 vpdpbusd, started at -64 x the group sums)
// times the group scales and d_a. Fully unrolled, so the accumulators stay in registers.
// Where block i's f32 scale sits, counted from the block (the scales follow a row's blocks: gemm_packed.h).
inline size_t to_scale(int64_t n, int64_t i) {
    return static_cast<size_t>(n / kQK_K - i) * kQ8KGroupsBlockBytes + 4 * static_cast<size_t>(i);
}

// Column c's accumulator over super-block i: the 16 group dot products (4 vpdpbusd, started at -64 x the group sums)
// times the group scales and d_a. Fully unrolled, so the accumulators stay in registers.
template <int C>
inline void add_groups(const DecodedGroups& u, const uint8_t* act, size_t a_stride, int64_t n, int64_t i,
                       __m512 (&acc)[C]) {
    const uint8_t* block = act + static_cast<size_t>(i) * kQ8KGroupsBlockBytes;
    const size_t scale_at = to_scale(n, i);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
        __m512i sum = _mm512_load_si512(block + 256);  // -B times each group's activation sum
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) sum = _mm512_dpbusd_epi32(sum, u.t[k], _mm512_load_si512(block + 64 * k));
        float da;
        std::memcpy(&da, block + scale_at, 4);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(u.group_scale, _mm512_set1_ps(da)), acc[c]);
        block += a_stride;
    }
}

// IQ2_XS values are d * (2 ls + 1) / 8 * grid: the 1/8 is applied with the lane sums.
template <int C>
inline void store_sums(__m512 (&acc)[C], float* out) {
    if constexpr (C >= 8) {
        __m512 all[16];
        for (int c = 0; c < 16; ++c) all[c] = c < C ? acc[c] : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << C) - 1), lane_sums_16(all));
    } else {
        for (int c = 0; c < C; ++c) out[c] = 0.125f * sum_lanes(acc[c]);
    }
}

template <int C>
void iq2_xs_groups_c(int64_t n, const void* w, const void* a, size_t a_stride, float* out) {
    const auto* x = static_cast<const BlockIQ2_XS*>(w);
    __m512 acc[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    const BiasedGrids& tables = grids();
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
        DecodedGroups u;
        decode_groups(x[i], u, tables);
        add_groups<C>(u, static_cast<const uint8_t*>(a), a_stride, n, i, acc);
    }
    store_sums<C>(acc, out);
}

// Two decoded rows against C <= 8 columns: each activation load feeds both rows' vpdpbusd, which halves the
// activation traffic per product (the kernel otherwise streams activations from L2 faster than it can use them).
// Each (row, column) does exactly the operations of the single-row kernel (add_groups).
template <int C>
void iq2_xs_decoded_pair_c(int64_t n, const DecodedGroups* u0, const DecodedGroups* u1, const uint8_t* a,
                           size_t a_stride, float* y, size_t y_stride) {
    static_assert(C <= 8);
    __m512 acc0[C], acc1[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc0[c] = acc1[c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const uint8_t* block = a + static_cast<size_t>(i) * kQ8KGroupsBlockBytes;
        const size_t scale_at = to_scale(n, i);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
            __m512i sum0 = _mm512_load_si512(block + 256), sum1 = sum0;
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) {
                const __m512i act = _mm512_load_si512(block + 64 * k);
                sum0 = _mm512_dpbusd_epi32(sum0, u0[i].t[k], act);
                sum1 = _mm512_dpbusd_epi32(sum1, u1[i].t[k], act);
            }
            float da;
            std::memcpy(&da, block + scale_at, 4);
            const __m512 d = _mm512_set1_ps(da);
            acc0[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum0), _mm512_mul_ps(u0[i].group_scale, d), acc0[c]);
            acc1[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum1), _mm512_mul_ps(u1[i].group_scale, d), acc1[c]);
            block += a_stride;
        }
    }
    __m512 all[16];
    for (int c = 0; c < 8; ++c) {
        all[c] = c < C ? acc0[c] : _mm512_setzero_ps();
        all[8 + c] = c < C ? acc1[c] : _mm512_setzero_ps();
    }
    // Row 0's and row 1's result for a column side by side: one 8-byte store per column.
    const __m512i pairs = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    const __m512 both = _mm512_permutexvar_ps(pairs, lane_sums_16(all));
    // Through memory: _mm512_extractf32x4_ps needs a constant lane index, which only full unrolling (-O3) gives.
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, both);
    for (int c = 0; c < C; ++c) std::memcpy(y + static_cast<size_t>(c) * y_stride, lanes + 2 * c, 8);
}

template <int C>
void iq2_xs_decoded_pair_up_to(int64_t n, const DecodedGroups* u0, const DecodedGroups* u1, const uint8_t* a,
                               size_t a_stride, float* y, size_t y_stride, int n_cols) {
    if constexpr (C > 1) {
        if (n_cols < C) return iq2_xs_decoded_pair_up_to<C - 1>(n, u0, u1, a, a_stride, y, y_stride, n_cols);
    }
    iq2_xs_decoded_pair_c<C>(n, u0, u1, a, a_stride, y, y_stride);
}

template <int C>
void iq2_xs_groups_up_to(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    if constexpr (C > 1) {
        if (n_cols < C) return iq2_xs_groups_up_to<C - 1>(n, w, a, a_stride, out, n_cols);
    }
    iq2_xs_groups_c<C>(n, w, a, a_stride, out);
}

}  // namespace

void dot_iq2_xs_groups(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    static_assert(kBiasXS == 64, "the activation layout carries -64 x the group sums");
    iq2_xs_groups_up_to<kMaxDotCols>(n, w, a, a_stride, out, n_cols);
}

void decode_iq2_xs_groups(int64_t n, const void* w, void* decoded) {
    const auto* x = static_cast<const BlockIQ2_XS*>(w);
    auto* u = static_cast<DecodedGroups*>(decoded);
    const BiasedGrids& tables = grids();
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
        DecodedGroups block;
        decode_groups(x[i], block, tables);
        std::memcpy(static_cast<void*>(u + i), &block, sizeof block);
    }
}

void dot_iq2_xs_decoded_pair(const DecodedPair& p) {
    iq2_xs_decoded_pair_up_to<kIq2XsPairCols>(p.n, static_cast<const DecodedGroups*>(p.row0),
                                              static_cast<const DecodedGroups*>(p.row1),
                                              static_cast<const uint8_t*>(p.act), p.act_stride, p.y, p.y_stride,
                                              p.n_cols);
}

void register_dots_iq2_avx512(DotTable& t) {
    t.set(DType::IQ2_XS, dot_kernel_any<BlockIQ2_XS>, kMaxDotCols);
    t.set(DType::IQ1_M, dot_kernel_any<BlockIQ1_M>, kMaxDotCols);
}

}  // namespace strata::cpu
