// AVX-512 (VNNI) dot products of IQ3_XXS / IQ3_S weights with Q8_K activations.
// Decoding a weight super-block: four 16-wide gathers fetch its 64 grid entries (4 magnitudes each) from grids whose
// bytes carry a bias B (64 or 16); the sign bits become four 64-bit masks (IQ3_XXS: 7 stored bits plus even parity
// per group of 8, computed in scalar registers so the work runs beside the vector ports), and one masked subtract
// turns m + B into B - m where the sign is negative. So each signed weight w is stored as the unsigned byte w + B for
// vpmaddubsw (signing the activations instead would get -128 wrong). Every activation column then does per 64
// weights one vpmaddubsw and one vpdpwssd with the groups' odd scales 2 * ls + 1; the bias comes back out through
// the activation's bsums (B * scale * sum of activations). All integer work is exact; per column and super-block one
// FMA adds the float result. 512-bit registers measured as fast as 256-bit ones here (the gathers dominate) and need
// half the instructions, so they stay.
// GCC 12's AVX-512 intrinsics build their unused source operands from a self-initialized variable, which
// -Wuninitialized reports at every use; the operand is fully masked away, so the warning is noise here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

namespace {

// One decoded weight super-block.
struct Decoded {
    __m512i w[4];         // 256 biased weights w + B as unsigned bytes; w[j] holds groups of 32 number 2j and 2j+1
    __m512i scale[4];     // int16 scale of each pair sum vpmaddubsw makes of w[j]
    __m256i bsum_scale;   // int16 factor -B * scale for each of the 16 activation bsums
    float d = 0;
};

// The odd scales of the 8 groups (int32 lanes) -> the per-pair int16 scale registers and the bsum factors.
template <int Bias>
inline void set_scales(__m256i odd_scales, Decoded& u) {
    const __m256i pairs = _mm256_or_si256(odd_scales, _mm256_slli_epi32(odd_scales, 16));
    const __m512i wide = _mm512_zextsi256_si512(pairs);
    for (int j = 0; j < 4; ++j) {
        const __m512i idx = _mm512_set_epi32(2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                             2 * j + 1, 2 * j + 1, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j,
                                             2 * j);
        u.scale[j] = _mm512_permutexvar_epi32(idx, wide);
    }
    u.bsum_scale = _mm256_mullo_epi16(pairs, _mm256_set1_epi16(-Bias));
}

constexpr int kBiasXXS = 64;  // IQ3_XXS magnitudes are at most 62
constexpr int kBiasS = 16;    // IQ3_S magnitudes are at most 15

// The grids with the bias added to every magnitude byte (no carries: 62 + 64 and 15 + 16 fit in 7 bits), so a
// gathered entry is already w + B for a positive sign. Built on first use by a kernel, never at registration: this
// file's code may only run on a CPU with AVX-512.
struct BiasedGrids {
    uint32_t xxs[256];
    uint32_t s[512];
};

const BiasedGrids& biased_grids() {
    static const BiasedGrids grids = [] {
        BiasedGrids g{};
        for (int i = 0; i < 256; ++i) g.xxs[i] = quant::kIQ3XXSGrid[i] + 0x01010101u * kBiasXXS;
        for (int i = 0; i < 512; ++i) g.s[i] = quant::kIQ3SGrid[i] + 0x01010101u * kBiasS;
        return g;
    }();
    return grids;
}

// Biased signed weights from 16 biased grid entries (64 values m + B) and their 64 sign bits: a negative weight is
// B - m = 2B - (m + B).
template <int Bias>
inline __m512i apply_signs(__m512i biased, uint64_t sign_bits) {
    const __m512i twice_bias = _mm512_set1_epi8(static_cast<char>(2 * Bias));
    return _mm512_mask_sub_epi8(biased, _cvtu64_mask64(sign_bits), twice_bias, biased);
}

// The 64 sign bits of two IQ3_XXS groups of 32 from their scale-and-sign words: per group of 8 the 7 stored bits and
// an eighth that makes the count of negatives even. Scalar work, so it runs beside the vector ports.
inline uint64_t xxs_sign_bits(uint32_t aux0, uint32_t aux1) {
    constexpr uint32_t low28 = 0x0FFFFFFF;
    const uint64_t stored = (aux0 & low28) | (static_cast<uint64_t>(aux1 & low28) << 28);
    const uint64_t bits = _pdep_u64(stored, 0x7F7F7F7F7F7F7F7FULL);
    uint64_t parity = bits ^ (bits >> 4);  // bit 0 of each byte ends up as the parity of that byte
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    return bits | ((parity & 0x0101010101010101ULL) << 7);
}

inline void decode(const BlockIQ3_XXS& b, const uint32_t* grid, Decoded& u) {
    uint32_t aux[8];  // word k: the 4 x 7 sign bits of group k (bits 0..27) and its scale (bits 28..31)
    std::memcpy(aux, b.qs + kQK_K / 4, 32);
    for (int j = 0; j < 4; ++j) {
        const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * j)));
        const __m512i biased = _mm512_i32gather_epi32(idx, reinterpret_cast<const int*>(grid), 4);
        u.w[j] = apply_signs<kBiasXXS>(biased, xxs_sign_bits(aux[2 * j], aux[2 * j + 1]));
    }
    const __m256i ls = _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(aux)), 28);
    set_scales<kBiasXXS>(_mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1)), u);
    u.d = _cvtsh_ss(b.d);
}

inline void decode(const BlockIQ3_S& b, const uint32_t* grid, Decoded& u) {
    uint64_t high_bits;  // bit e: the ninth index bit of grid entry e
    std::memcpy(&high_bits, b.qh, 8);
    uint64_t signs[4];
    std::memcpy(signs, b.signs, 32);
    const __m512i bit8 = _mm512_set1_epi32(256);
    for (int j = 0; j < 4; ++j) {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * j)));
        idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(high_bits >> (16 * j)), idx, bit8);
        const __m512i biased = _mm512_i32gather_epi32(idx, reinterpret_cast<const int*>(grid), 4);
        u.w[j] = apply_signs<kBiasS>(biased, signs[j]);
    }
    uint32_t packed;  // nibble k: scale of group k
    std::memcpy(&packed, b.scales, 4);
    const __m256i ls = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(packed)),
                                                          _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(0xF));
    set_scales<kBiasS>(_mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1)), u);
    u.d = _cvtsh_ss(b.d);
}

inline const uint32_t* grid_of(const BlockIQ3_XXS*) { return biased_grids().xxs; }
inline const uint32_t* grid_of(const BlockIQ3_S*) { return biased_grids().s; }

// C activation columns against one weight row; each column's operations are those of C = 1.
template <typename Block, int C>
void dot_kernel_c(int64_t n, const void* w, const void* a, size_t a_stride, float* out, float final_scale) {
    const auto* x = static_cast<const Block*>(w);
    const BlockQ8_K* y[C];
    for (int c = 0; c < C; ++c)
        y[c] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + c * a_stride);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    const uint32_t* grid = grid_of(x);
    Decoded u;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        decode(x[i], grid, u);
        for (int c = 0; c < C; ++c) {
            const BlockQ8_K& b = y[c][i];
            const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
            __m512i isum = _mm512_zextsi256_si512(_mm256_madd_epi16(bsums, u.bsum_scale));
            for (int j = 0; j < 4; ++j) {
                const __m512i act = _mm512_loadu_si512(b.qs + 64 * j);
                isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(u.w[j], act), u.scale[j]);
            }
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(u.d * b.d), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) out[c] = final_scale * _mm512_reduce_add_ps(acc[c]);
}

template <typename Block, int FinalScaleInv>
void dot_kernel_any(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    constexpr float s = 1.0f / FinalScaleInv;
    switch (n_cols) {
        case 1: dot_kernel_c<Block, 1>(n, w, a, a_stride, out, s); break;
        case 2: dot_kernel_c<Block, 2>(n, w, a, a_stride, out, s); break;
        case 3: dot_kernel_c<Block, 3>(n, w, a, a_stride, out, s); break;
        default: dot_kernel_c<Block, 4>(n, w, a, a_stride, out, s); break;
    }
}

}  // namespace

void register_dots_iq3_avx512(DotTable& t) {
    t.set(DType::IQ3_XXS, dot_kernel_any<BlockIQ3_XXS, 4>);  // IQ3_XXS values are d * (2 * ls + 1) / 4 * grid
    t.set(DType::IQ3_S, dot_kernel_any<BlockIQ3_S, 1>);
}

}  // namespace strata::cpu
