// AVX2 dot products of IQ3_XXS / IQ3_S weights with Q8_K activations.
// Decoding a weight super-block fetches its 64 grid entries (4 magnitudes each): IQ3_XXS by scalar loads and inserts,
// IQ3_S (whose 9-bit indices are cheaper to build in a vector) by vpgatherdd; each was the faster on our Xeon. Each
// group of 32 gets its 32 sign bits as a byte mask (IQ3_XXS: 7 stored bits plus even parity per group of 8, computed
// for all 32 groups of 8 at once); each signed weight w is stored biased as w + B (B = 64 or 16) so it is an unsigned
// byte for vpmaddubsw (signing the activations instead would get -128 wrong). Every activation column then does per
// 32 weights one vpmaddubsw and one vpmaddwd with the group's odd scale 2 * ls + 1; the bias comes back out through
// the activation's bsums (B * scale * sum of activations). All integer work is exact; per column and super-block one
// FMA adds the float result.
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
    __m256i w[8];        // 256 biased weights w + B as unsigned bytes, one group of 32 per register
    __m256i scale[8];    // int16 scale of group j, for each pair sum vpmaddubsw makes of w[j]
    __m256i bsum_scale;  // int16 factor -B * scale for each of the 16 activation bsums
    float d = 0;
};

constexpr int kBiasXXS = 64;  // IQ3_XXS magnitudes are at most 62
constexpr int kBiasS = 16;    // IQ3_S magnitudes are at most 15

// The odd scales of the 8 groups (int32 lanes) -> the per-pair int16 scale registers and the bsum factors.
template <int Bias>
inline void set_scales(__m256i odd_scales, Decoded& u) {
    const __m256i pairs = _mm256_or_si256(odd_scales, _mm256_slli_epi32(odd_scales, 16));
    for (int j = 0; j < 8; ++j) u.scale[j] = _mm256_permutevar8x32_epi32(pairs, _mm256_set1_epi32(j));
    u.bsum_scale = _mm256_mullo_epi16(pairs, _mm256_set1_epi16(-Bias));
}

// The biased signed weights of every group: magnitudes mag[j], sign bits in 32-bit lane j of sign_words.
template <int Bias>
inline void apply_signs(const __m256i* mag, __m256i sign_words, Decoded& u) {
    // Byte b of a group takes bit b % 8 of sign byte b / 8.
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    const __m256i bias = _mm256_set1_epi8(Bias);
    for (int j = 0; j < 8; ++j) {
        const __m256i word = _mm256_permutevar8x32_epi32(sign_words, _mm256_set1_epi32(j));
        const __m256i negative = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(word, spread), bit), bit);
        // (m ^ neg) - neg is m or -m.
        const __m256i signed_mag = _mm256_sub_epi8(_mm256_xor_si256(mag[j], negative), negative);
        u.w[j] = _mm256_add_epi8(signed_mag, bias);
    }
}

inline void decode(const BlockIQ3_XXS& b, Decoded& u) {
    const uint32_t* grid = quant::kIQ3XXSGrid;
    __m256i mag[8];
    for (int j = 0; j < 8; ++j) {
        const uint8_t* q = b.qs + 8 * j;
        mag[j] = _mm256_setr_epi32(grid[q[0]], grid[q[1]], grid[q[2]], grid[q[3]], grid[q[4]], grid[q[5]], grid[q[6]],
                                   grid[q[7]]);
    }
    // Word k: the 4 x 7 sign bits of group k (bits 0..27) and its scale (bits 28..31).
    const __m256i aux = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + kQK_K / 4));
    const __m256i low7 = _mm256_set1_epi32(0x7F);
    __m256i bits = _mm256_and_si256(aux, low7);
    bits = _mm256_or_si256(bits, _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_slli_epi32(low7, 8)));
    bits = _mm256_or_si256(bits, _mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_slli_epi32(low7, 16)));
    bits = _mm256_or_si256(bits, _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_slli_epi32(low7, 24)));
    // Bit 0 of each byte becomes the parity of that byte; it is the missing eighth sign bit.
    __m256i parity = _mm256_xor_si256(bits, _mm256_srli_epi32(bits, 4));
    parity = _mm256_xor_si256(parity, _mm256_srli_epi32(parity, 2));
    parity = _mm256_xor_si256(parity, _mm256_srli_epi32(parity, 1));
    bits = _mm256_or_si256(bits, _mm256_slli_epi32(_mm256_and_si256(parity, _mm256_set1_epi8(1)), 7));
    apply_signs<kBiasXXS>(mag, bits, u);
    const __m256i ls = _mm256_srli_epi32(aux, 28);
    set_scales<kBiasXXS>(_mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1)), u);
    u.d = _cvtsh_ss(b.d);
}

inline void decode(const BlockIQ3_S& b, Decoded& u) {
    const auto* grid = reinterpret_cast<const int*>(quant::kIQ3SGrid);
    // Entry k of group j takes bit k of qh[j] as its ninth index bit (value 256).
    const __m256i to_bit8 = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1);
    const __m256i bit8 = _mm256_set1_epi32(256);
    __m256i mag[8];
    for (int j = 0; j < 8; ++j) {
        const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * j)));
        const __m256i high = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(b.qh[j]), to_bit8), bit8);
        mag[j] = _mm256_i32gather_epi32(grid, _mm256_or_si256(low, high), 4);
    }
    apply_signs<kBiasS>(mag, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.signs)), u);
    uint32_t packed;  // nibble k: scale of group k
    std::memcpy(&packed, b.scales, 4);
    const __m256i ls = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(packed)),
                                                          _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(0xF));
    set_scales<kBiasS>(_mm256_add_epi32(_mm256_add_epi32(ls, ls), _mm256_set1_epi32(1)), u);
    u.d = _cvtsh_ss(b.d);
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// C activation columns against one weight row; each column's operations are those of C = 1.
template <typename Block, int C>
void dot_kernel_c(int64_t n, const void* w, const void* a, size_t a_stride, float* out, float final_scale) {
    const auto* x = static_cast<const Block*>(w);
    const BlockQ8_K* y[C];
    for (int c = 0; c < C; ++c)
        y[c] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + c * a_stride);
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    Decoded u;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        decode(x[i], u);
        for (int c = 0; c < C; ++c) {
            const BlockQ8_K& b = y[c][i];
            const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
            __m256i sum[2] = {_mm256_madd_epi16(bsums, u.bsum_scale), _mm256_setzero_si256()};
            for (int j = 0; j < 8; ++j) {
                const __m256i act = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * j));
                const __m256i pairs = _mm256_maddubs_epi16(u.w[j], act);
                sum[j & 1] = _mm256_add_epi32(sum[j & 1], _mm256_madd_epi16(pairs, u.scale[j]));
            }
            const __m256i isum = _mm256_add_epi32(sum[0], sum[1]);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(u.d * b.d), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) out[c] = final_scale * hsum(acc[c]);
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

void register_dots_iq3_avx2(DotTable& t) {
    t.set(DType::IQ3_XXS, dot_kernel_any<BlockIQ3_XXS, 4>);  // IQ3_XXS values are d * (2 * ls + 1) / 4 * grid
    t.set(DType::IQ3_S, dot_kernel_any<BlockIQ3_S, 1>);
}

}  // namespace strata::cpu
