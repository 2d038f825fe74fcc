// AVX-512 VNNI dot products of Q2_K / Q3_K weights with Q8_K activations. Each weight super-block is decoded once
// into registers (eight vectors of 32 unsigned weights, vector j holding elements 32j..32j+31: sub-block 2j in its
// low 128-bit lane, 2j+1 in its high lane); every activation column then runs the same integer sequence on them.
// Q2_K: the 4-bit sub-block scale is multiplied into the 2-bit values while decoding (q * scale <= 45 fits a byte),
// so a column costs one vpdpbusd per 32 weights; the mins go through the activation's bsums.
// Q3_K: weights decode to u = q + 4 * high bit in 0..7; vpdpbusd sums 4 products, vpackssdw of two such vectors feeds
// vpdpwssd with the signed 6-bit scales, and the "- 4" becomes -4 * scale * bsum per sub-block.
// Registers: 256-bit, except Q3_K with 2-4 columns. Measured on this Xeon (n = 4096, data in L2, one thread), 512-bit
// layouts gained nothing for Q2_K with four columns (5.8 GB/s both) and lost 14% with one (decode work dominates there
// and 512-bit integer multiplies issue on one port, 256-bit ones on two); Q3_K with four columns ran 6% faster on
// 512-bit (6.4 against 6.0 GB/s). Its one-column path stays 256-bit and pairs vectors j and j + 2 so that both give
// the same int32 lanes, hence the same float sequence per column and the same result.
// GCC 12's AVX-512 intrinsics start some results from a self-initialised "undefined" register, which -Wall reports
// once they are inlined (GCC bug 105593, fixed in GCC 13): silence that false positive for this file only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
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

// ---------------------------------------------------------------------------------------------------------------
// Q2_K

struct DecodedQ2 {
    __m256i w[8];   // q * scale, unsigned bytes
    __m256i mins;   // 16 int16 sub-block mins
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
            // int16 words of scale 2j (low lane) and 2j + 1 (high lane); the 0x80 index zeroes the high byte.
            const __m256i idx = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(0x8000 | (2 * j + 1))),
                                                 _mm_set1_epi16(static_cast<short>(0x8000 | (2 * j))));
            const __m256i v = _mm256_and_si256(m ? _mm256_srli_epi16(q, 2 * m) : q, three);
            // Both bytes of a word share a sub-block and q * scale <= 45 never carries into the high byte.
            u.w[j] = _mm256_mullo_epi16(v, _mm256_shuffle_epi8(scales, idx));
        }
    }
    u.d = _mm256_set1_ps(_cvtsh_ss(b.d));
    u.neg_dmin = _mm256_set1_ps(-_cvtsh_ss(b.dmin));
}

[[gnu::always_inline]] inline __m256 column(const DecodedQ2& u, const BlockQ8_K& y, __m256 acc) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j += 2) {
        s0 = _mm256_dpbusd_epi32(s0, u.w[j], load256(y.qs + 32 * j));
        s1 = _mm256_dpbusd_epi32(s1, u.w[j + 1], load256(y.qs + 32 * j + 32));
    }
    const __m256i mins = _mm256_madd_epi16(load256(y.bsums), u.mins);
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), u.d);
    f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), u.neg_dmin, f);
    return _mm256_fmadd_ps(f, _mm256_broadcast_ss(&y.d), acc);
}

// ---------------------------------------------------------------------------------------------------------------
// Q3_K

// What a Q3_K column needs besides the weights: -4 * scale of each sub-block (int16, against bsums) and d.
struct Q3Offset {
    __m256i offset_mul;
    __m256 d;
};

struct DecodedQ3 {
    __m256i w[8];  // q + 4 * high bit, 0..7
    // vpackssdw(dpbusd(w[f]), dpbusd(w[f + 2])) for f = 0, 1, 4, 5 holds, in 128-bit lane L, 4 sums of sub-block
    // 2f + L then 4 of sub-block 2f + 4 + L; scale[p] (pair p: f = 4 * (p / 2) + p % 2) has the matching int16 scales.
    // Pairing j with j + 2 (not j + 1) makes the int32 lanes those of DecodedQ3Wide.
    __m256i scale[4];
    Q3Offset rest;
};

// Bytes 0-15 of a vpshufb index repeating bytes a, b, c, e four times each.
inline __m128i repeat4(int a, int b, int c, int e) {
    return _mm_set_epi32(0x01010101 * e, 0x01010101 * c, 0x01010101 * b, 0x01010101 * a);
}

[[gnu::always_inline]] inline void decode(const BlockQ3_K& b, DecodedQ3& u) {
    const __m128i sc = q3_k_scales(b.scales);
    #pragma GCC unroll 8
    for (int p = 0; p < 4; ++p) {
        const int f = 4 * (p / 2) + p % 2;
        u.scale[p] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, repeat4(2 * f, 2 * f + 4, 2 * f + 1, 2 * f + 5)));
    }
    u.rest.offset_mul = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 2));
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hmask = load256(b.hmask);
    #pragma GCC unroll 8
    for (int half = 0; half < 2; ++half) {
        const __m256i q = load256(b.qs + 32 * half);
        #pragma GCC unroll 8
        for (int m = 0; m < 4; ++m) {
            const int j = 4 * half + m;
            const __m256i v = _mm256_and_si256(m ? _mm256_srli_epi16(q, 2 * m) : q, three);
            const __mmask32 high = _mm256_test_epi8_mask(hmask, _mm256_set1_epi8(static_cast<char>(1 << j)));
            u.w[j] = _mm256_mask_add_epi8(v, high, v, four);
        }
    }
    u.rest.d = _mm256_set1_ps(_cvtsh_ss(b.d));
}

[[gnu::always_inline]] inline __m256 q3_finish(__m256i isum, const Q3Offset& u, const BlockQ8_K& y, __m256 acc) {
    const __m256i offset = _mm256_madd_epi16(load256(y.bsums), u.offset_mul);
    const __m256i total = _mm256_add_epi32(isum, offset);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(u.d, _mm256_broadcast_ss(&y.d)), acc);
}

[[gnu::always_inline]] inline __m256 column(const DecodedQ3& u, const BlockQ8_K& y, __m256 acc) {
    __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    #pragma GCC unroll 8
    for (int p = 0; p < 4; ++p) {
        const int f = 4 * (p / 2) + p % 2;
        const __m256i v0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u.w[f], load256(y.qs + 32 * f));
        const __m256i v1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u.w[f + 2], load256(y.qs + 32 * f + 64));
        isum[p & 1] = _mm256_dpwssd_epi32(isum[p & 1], _mm256_packs_epi32(v0, v1), u.scale[p]);
    }
    return q3_finish(_mm256_add_epi32(isum[0], isum[1]), u.rest, y, acc);
}

// The same on 512-bit registers: w[k] holds elements 64k..64k+63 (vectors 2k and 2k + 1 of DecodedQ3).
struct DecodedQ3Wide {
    __m512i w[4];
    // vpackssdw(dpbusd(w[2h]), dpbusd(w[2h + 1])) holds, in 128-bit lane L, 4 sums of sub-block 8h + L then 4 of
    // sub-block 8h + 4 + L; scale[h] has the matching int16 scales.
    __m512i scale[2];
    Q3Offset rest;
};

[[gnu::always_inline]] inline void decode(const BlockQ3_K& b, DecodedQ3Wide& u) {
    const __m128i sc = q3_k_scales(b.scales);
    const __m256i sc2 = _mm256_broadcastsi128_si256(sc);
    #pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
        const int s = 8 * h;
        const __m256i idx = _mm256_set_m128i(repeat4(s + 2, s + 6, s + 3, s + 7), repeat4(s, s + 4, s + 1, s + 5));
        u.scale[h] = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(sc2, idx));
    }
    u.rest.offset_mul = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 2));
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i hmask = _mm512_broadcast_i64x4(load256(b.hmask));
    #pragma GCC unroll 8
    for (int k = 0; k < 4; ++k) {
        // Both 256-bit halves hold the 32 qs bytes of half k / 2; the low half takes field 2 * (k % 2) (vector 2k),
        // the high half the next field (vector 2k + 1).
        const int field = 2 * (k % 2);
        const __m512i q = _mm512_broadcast_i64x4(load256(b.qs + 32 * (k / 2)));
        const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(2 * field)),
                                                 _mm256_set1_epi16(static_cast<short>(2 * field + 2)), 1);
        const __m512i v = _mm512_and_si512(_mm512_srlv_epi16(q, shift), three);
        const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * k))),
                                               _mm256_set1_epi8(static_cast<char>(1 << (2 * k + 1))), 1);
        u.w[k] = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(hmask, bit), v, four);
    }
    u.rest.d = _mm256_set1_ps(_cvtsh_ss(b.d));
}

[[gnu::always_inline]] inline __m256 column(const DecodedQ3Wide& u, const BlockQ8_K& y, __m256 acc) {
    __m512i isum = _mm512_setzero_si512();
    #pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
        const __m512i v0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.w[2 * h], _mm512_loadu_si512(y.qs + 128 * h));
        const __m512i v1 =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), u.w[2 * h + 1], _mm512_loadu_si512(y.qs + 128 * h + 64));
        isum = _mm512_dpwssd_epi32(isum, _mm512_packs_epi32(v0, v1), u.scale[h]);
    }
    const __m256i sum = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
    return q3_finish(sum, u.rest, y, acc);
}

// ---------------------------------------------------------------------------------------------------------------

// Weight bytes this far ahead are prefetched: during decode rows stream from memory (measured on this Xeon, Q2_K:
// one column streams 20-25% faster with it, data in L2 is unaffected).
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

// Q3_K: 256-bit for one column, 512-bit for more (see the top of the file).
void dot_q3_k(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    switch (n_cols) {
        case 1: dot_cols<BlockQ3_K, DecodedQ3, 1>(n, w, a, a_stride, out); break;
        case 2: dot_cols<BlockQ3_K, DecodedQ3Wide, 2>(n, w, a, a_stride, out); break;
        case 3: dot_cols<BlockQ3_K, DecodedQ3Wide, 3>(n, w, a, a_stride, out); break;
        default: dot_cols<BlockQ3_K, DecodedQ3Wide, 4>(n, w, a, a_stride, out); break;
    }
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

void register_dots_klow_avx512(DotTable& t) {
    t.set(DType::Q2_K, dot_any<BlockQ2_K, DecodedQ2>);
    t.set(DType::Q3_K, dot_q3_k);
}

}  // namespace strata::cpu
