// AVX2 dot products of Q2_K / Q3_K weights with Q8_K activations. Each weight super-block is decoded once into
// registers (eight vectors of 32 unsigned weights, vector j holding elements 32j..32j+31: sub-block 2j in its low
// 128-bit lane, 2j+1 in its high lane); every activation column then runs the same integer sequence on them.
// Q2_K: the 4-bit sub-block scale is multiplied into the 2-bit values while decoding (q * scale <= 45 fits a byte);
// vpmaddubsw pairs (<= 11520) of two vectors add up in int16 without overflow before vpmaddwd widens them. The mins
// go through the activation's bsums.
// Q3_K: weights decode to u = q + 4 * high bit in 0..7; vpmaddubsw, then vpmaddwd with the signed 6-bit scale of
// each lane's sub-block; the "- 4" becomes -4 * scale * bsum per sub-block.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "core/quant_blocks.h"

namespace strata::cpu {

namespace {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The 16 signed scales (6-bit value - 32) of a Q3_K super-block as bytes. Low nibbles: bytes 0-7 give scales 0-7,
// their high nibbles scales 8-15; the top 2 bits of scale j are bits 2 * (j / 4) of byte 8 + j % 4.
inline __m128i q3_k_scales(const uint8_t* packed) {
    uint64_t low;
    uint32_t high;
    std::memcpy(&low, packed, 8);
    std::memcpy(&high, packed + 8, 4);
    const uint64_t h = high;
    constexpr uint64_t kTwoBits = 0x0303030303030303ull, kNibble = 0x0F0F0F0F0F0F0F0Full;
    // Bytes of (h >> 0) then (h >> 2) for scales 0-7; (h >> 4) then (h >> 6) for scales 8-15.
    const uint64_t top_lo = ((h | (h << 30)) & kTwoBits) << 4;
    const uint64_t top_hi = (((h >> 4) | (h << 26)) & kTwoBits) << 4;
    const __m128i sc = _mm_set_epi64x(static_cast<long long>(((low >> 4) & kNibble) | top_hi),
                                      static_cast<long long>((low & kNibble) | top_lo));
    return _mm_sub_epi8(sc, _mm_set1_epi8(32));
}

// Per-vector index for vpshufb on 16 scale bytes broadcast to both lanes: int16 words of byte 2j (low lane) and
// byte 2j + 1 (high lane), the 0x80 index zeroing the high byte.
inline __m256i word_index(int j) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(0x8000 | (2 * j + 1))),
                            _mm_set1_epi16(static_cast<short>(0x8000 | (2 * j))));
}

// ---------------------------------------------------------------------------------------------------------------
// Q2_K

struct DecodedQ2 {
    __m256i w[8];  // q * scale, unsigned bytes
    __m256i mins;  // 16 int16 sub-block mins
    __m256 d, neg_dmin;
};

[[gnu::always_inline]] inline void decode(const BlockQ2_K& b, DecodedQ2& u) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_and_si128(sc, nibble));
    u.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), nibble));
    const __m256i three = _mm256_set1_epi8(3);
    #pragma GCC unroll 8
    for (int half = 0; half < 2; ++half) {
        const __m256i q = load256(b.qs + 32 * half);
        #pragma GCC unroll 8
        for (int m = 0; m < 4; ++m) {
            const int j = 4 * half + m;
            const __m256i v = _mm256_and_si256(m ? _mm256_srli_epi16(q, 2 * m) : q, three);
            // Both bytes of a word share a sub-block and q * scale <= 45 never carries into the high byte.
            u.w[j] = _mm256_mullo_epi16(v, _mm256_shuffle_epi8(scales, word_index(j)));
        }
    }
    u.d = _mm256_set1_ps(_cvtsh_ss(b.d));
    u.neg_dmin = _mm256_set1_ps(-_cvtsh_ss(b.dmin));
}

[[gnu::always_inline]] inline __m256 column(const DecodedQ2& u, const BlockQ8_K& y, __m256 acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j += 2) {
        const __m256i p0 = _mm256_maddubs_epi16(u.w[j], load256(y.qs + 32 * j));
        const __m256i p1 = _mm256_maddubs_epi16(u.w[j + 1], load256(y.qs + 32 * j + 32));
        s[(j / 2) & 1] = _mm256_add_epi32(s[(j / 2) & 1], _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones));
    }
    const __m256i mins = _mm256_madd_epi16(load256(y.bsums), u.mins);
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s[0], s[1])), u.d);
    f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), u.neg_dmin, f);
    return _mm256_fmadd_ps(f, _mm256_broadcast_ss(&y.d), acc);
}

// ---------------------------------------------------------------------------------------------------------------
// Q3_K

struct DecodedQ3 {
    __m256i w[8];      // q + 4 * high bit, 0..7
    __m256i scale[8];  // int16 scale of sub-block 2j (low lane) and 2j + 1 (high lane)
    __m256i offset_mul;  // -4 * scale of each sub-block, int16, against bsums
    __m256 d;
};

[[gnu::always_inline]] inline void decode(const BlockQ3_K& b, DecodedQ3& u) {
    const __m128i sc = q3_k_scales(b.scales);
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc);
    u.offset_mul = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2));
    // Scales 0-7 as words in both lanes, then scales 8-15.
    const __m256i first = _mm256_permute2x128_si256(sc16, sc16, 0x00);
    const __m256i second = _mm256_permute2x128_si256(sc16, sc16, 0x11);
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
        const int s = 2 * (j % 4);  // word index of scale 2j within its 8
        const __m256i idx = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(0x0100 * (2 * s + 3) + 2 * s + 2)),
                                             _mm_set1_epi16(static_cast<short>(0x0100 * (2 * s + 1) + 2 * s)));
        u.scale[j] = _mm256_shuffle_epi8(j < 4 ? first : second, idx);
    }
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hmask = load256(b.hmask);
    #pragma GCC unroll 8
    for (int half = 0; half < 2; ++half) {
        const __m256i q = load256(b.qs + 32 * half);
        #pragma GCC unroll 8
        for (int m = 0; m < 4; ++m) {
            const int j = 4 * half + m;
            const __m256i v = _mm256_and_si256(m ? _mm256_srli_epi16(q, 2 * m) : q, three);
            // Bit j of each hmask byte moved to bit 2 (16-bit shifts: the mask drops what crossed bytes).
            const __m256i h = j < 2    ? _mm256_slli_epi16(hmask, 2 - j)
                              : j == 2 ? hmask
                                       : _mm256_srli_epi16(hmask, j - 2);
            u.w[j] = _mm256_or_si256(v, _mm256_and_si256(h, four));
        }
    }
    u.d = _mm256_set1_ps(_cvtsh_ss(b.d));
}

[[gnu::always_inline]] inline __m256 column(const DecodedQ3& u, const BlockQ8_K& y, __m256 acc) {
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
        const __m256i p = _mm256_maddubs_epi16(u.w[j], load256(y.qs + 32 * j));
        s[j & 1] = _mm256_add_epi32(s[j & 1], _mm256_madd_epi16(p, u.scale[j]));
    }
    const __m256i offset = _mm256_madd_epi16(load256(y.bsums), u.offset_mul);
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), offset);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(u.d, _mm256_broadcast_ss(&y.d)), acc);
}

// ---------------------------------------------------------------------------------------------------------------

// Weight bytes this far ahead are prefetched: during decode rows stream from memory.
constexpr int kPrefetchBytes = 1024;

inline void prefetch_ahead(const void* block) {
    const char* p = static_cast<const char*>(block) + kPrefetchBytes;
    _mm_prefetch(p, _MM_HINT_T0);
    _mm_prefetch(p + 64, _MM_HINT_T0);
}

// C activation columns against one weight row: each block decoded once, then the same per-column sequence for every
// column, so a column's result does not depend on C.
template <typename Block, typename Decoded, int C>
void dot_cols(int64_t n, const void* w, const void* a, size_t a_stride, float* out) {
    const auto* x = static_cast<const Block*>(w);
    const BlockQ8_K* y[C];
    for (int c = 0; c < C; ++c)
        y[c] = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + c * a_stride);
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    Decoded u;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        prefetch_ahead(x + i);
        decode(x[i], u);
        for (int c = 0; c < C; ++c) acc[c] = column(u, y[c][i], acc[c]);
    }
    for (int c = 0; c < C; ++c) out[c] = hsum(acc[c]);
}

template <typename Block, typename Decoded>
void dot_any(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    switch (n_cols) {
        case 1: dot_cols<Block, Decoded, 1>(n, w, a, a_stride, out); break;
        case 2: dot_cols<Block, Decoded, 2>(n, w, a, a_stride, out); break;
        case 3: dot_cols<Block, Decoded, 3>(n, w, a, a_stride, out); break;
        default: dot_cols<Block, Decoded, 4>(n, w, a, a_stride, out); break;
    }
}

}  // namespace

void register_dots_klow_avx2(DotTable& t) {
    t.set(DType::Q2_K, dot_any<BlockQ2_K, DecodedQ2>);
    t.set(DType::Q3_K, dot_any<BlockQ3_K, DecodedQ3>);
}

}  // namespace strata::cpu
