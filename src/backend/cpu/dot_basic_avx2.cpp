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

// Weight bytes this far ahead are prefetched: during decode the rows stream from memory, and the hardware prefetcher
// alone left a third of the bandwidth unused (Q8_0, one column: 7.5 -> 10 GB/s with 8 threads' worth of load around).
constexpr int kPrefetchBytes = 2048;

inline void prefetch_lines(const void* p, int bytes) {
    for (int l = 0; l < bytes; l += 64) _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes + l, _MM_HINT_T0);
}

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

template <int C>
inline void column_rows(const void* a, size_t a_stride, const uint8_t* (&rows)[C]) {
    for (int c = 0; c < C; ++c) rows[c] = static_cast<const uint8_t*>(a) + c * a_stride;
}

// ---- float weights ---------------------------------------------------------------------------------------------

enum class FloatKind { F32, F16, BF16 };

template <FloatKind K>
inline __m256 load8(const void* w, int64_t i) {
    if constexpr (K == FloatKind::F32) {
        return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    } else if constexpr (K == FloatKind::F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i)));
    } else {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
}

template <FloatKind K>
inline float load1(const void* w, int64_t i) {
    if constexpr (K == FloatKind::F32) {
        return static_cast<const float*>(w)[i];
    } else if constexpr (K == FloatKind::F16) {
        return _cvtsh_ss(static_cast<const uint16_t*>(w)[i]);
    } else {
        const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
    }
}

template <FloatKind K>
constexpr int kElementBytes = K == FloatKind::F32 ? 4 : 2;

template <FloatKind K, int C>
void dot_float_c(int64_t n, const void* w, const void* a, size_t a_stride, float* out) {
    const uint8_t* rows[C];
    column_rows<C>(a, a_stride, rows);
    const float* y[C];
    for (int c = 0; c < C; ++c) y[c] = reinterpret_cast<const float*>(rows[c]);
    __m256 acc0[C], acc1[C];
    for (int c = 0; c < C; ++c) acc0[c] = acc1[c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        prefetch_lines(static_cast<const uint8_t*>(w) + i * kElementBytes<K>, 16 * kElementBytes<K>);
        const __m256 w0 = load8<K>(w, i), w1 = load8<K>(w, i + 8);
        for (int c = 0; c < C; ++c) {
            acc0[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y[c] + i), acc0[c]);
            acc1[c] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(y[c] + i + 8), acc1[c]);
        }
    }
    if (i + 8 <= n) {
        const __m256 w0 = load8<K>(w, i);
        for (int c = 0; c < C; ++c) acc0[c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(y[c] + i), acc0[c]);
        i += 8;
    }
    for (int c = 0; c < C; ++c) {
        __m128 s = _mm_set_ss(hsum(_mm256_add_ps(acc0[c], acc1[c])));
        for (int64_t k = i; k < n; ++k) s = _mm_fmadd_ss(_mm_set_ss(load1<K>(w, k)), _mm_set_ss(y[c][k]), s);
        out[c] = _mm_cvtss_f32(s);
    }
}

// ---- Q8_0-activation types ---------------------------------------------------------------------------------------

// The 32 weights of a block as signed bytes, in element order.
inline __m256i decode(const BlockQ8_0& b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }

// 16 bytes of nibbles -> 32 values 0..15: low nibbles are elements 0..15, high nibbles 16..31.
inline __m256i nibbles(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

inline __m256i decode(const BlockQ4_0& b) { return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8)); }

inline __m256i iq4_values() {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIQ4NLValues)));
}

inline __m256i decode(const BlockIQ4_NL& b) { return _mm256_shuffle_epi8(iq4_values(), nibbles(b.qs)); }

// 8 int32 sums of 4 products w * y each, from |w| and y carrying w's sign.
inline __m256i dot_bytes(__m256i abs_w, __m256i signed_y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, signed_y), _mm256_set1_epi16(1));
}

// The 8 f16 scales at the start of 8 consecutive blocks of `stride` bytes (the scale is each block's first field),
// as floats; one gather instead of 8 scalar conversions.
template <int Stride>
inline __m256 scales8(const void* first_block) {
    const __m256i offsets = _mm256_setr_epi32(0, Stride, 2 * Stride, 3 * Stride, 4 * Stride, 5 * Stride, 6 * Stride,
                                              7 * Stride);
    const __m256i words = _mm256_i32gather_epi32(static_cast<const int*>(first_block), offsets, 1);
    // The low 16 bits of each 32-bit word, packed into 8 halves.
    const __m256i packed = _mm256_shuffle_epi8(
        words, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1,
                                -1, -1, -1, -1, -1, -1, -1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
}

// One block into the column accumulators; `scale` holds each column's product of the two block scales.
template <typename Block, int C>
inline void q8_block(const Block& xb, const BlockQ8_0* const (&y)[C], int64_t i, const __m256 (&scale)[C],
                     __m256 (&acc)[C]) {
    const __m256i q = decode(xb);
    const __m256i aq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
        const __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][i].qs)), q);
        acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_bytes(aq, sy)), scale[c], acc[c]);
    }
}

template <typename Block, int C>
void dot_q8act_c(int64_t n, const void* w, const void* a, size_t a_stride, float* out) {
    const auto* x = static_cast<const Block*>(w);
    const uint8_t* rows[C];
    column_rows<C>(a, a_stride, rows);
    const BlockQ8_0* y[C];
    for (int c = 0; c < C; ++c) y[c] = reinterpret_cast<const BlockQ8_0*>(rows[c]);
    // Even blocks go to acc0, odd ones to acc1.
    __m256 acc0[C], acc1[C];
    for (int c = 0; c < C; ++c) acc0[c] = acc1[c] = _mm256_setzero_ps();
    const int64_t nb = n / 32;
    int64_t i = 0;
    // Groups of 8 blocks: the 8 scale products dx * dy of a column come from two gathers and one multiply, and each
    // block's product is then a broadcast load. The products and the FMA order are those of the one-block path below.
    alignas(32) float products[C][8];
    for (; i + 8 <= nb; i += 8) {
        prefetch_lines(x + i, static_cast<int>(8 * sizeof(Block)));
        const __m256 dx = scales8<sizeof(Block)>(x + i);
        for (int c = 0; c < C; ++c)
            _mm256_store_ps(products[c], _mm256_mul_ps(dx, scales8<sizeof(BlockQ8_0)>(y[c] + i)));
#pragma GCC unroll 4
        for (int j = 0; j < 8; j += 2) {
            __m256 s0[C], s1[C];
            for (int c = 0; c < C; ++c) {
                s0[c] = _mm256_broadcast_ss(&products[c][j]);
                s1[c] = _mm256_broadcast_ss(&products[c][j + 1]);
            }
            q8_block<Block, C>(x[i + j], y, i + j, s0, acc0);
            q8_block<Block, C>(x[i + j + 1], y, i + j + 1, s1, acc1);
        }
    }
    for (; i < nb; ++i) {
        const float dx = _cvtsh_ss(x[i].d);
        __m256 s[C];
        for (int c = 0; c < C; ++c) s[c] = _mm256_set1_ps(dx * _cvtsh_ss(y[c][i].d));
        q8_block<Block, C>(x[i], y, i, s, (i & 1) ? acc1 : acc0);
    }
    for (int c = 0; c < C; ++c) out[c] = hsum(_mm256_add_ps(acc0[c], acc1[c]));
}

// ---- IQ4_XS ---------------------------------------------------------------------------------------------------

// The 8 sub-block scales ls - 32 of a super-block as int16, in both 128-bit lanes: ls is 4 bits of scales_l and 2 of
// scales_h, spread to one byte each with pdep.
inline __m256i sub_block_scales(const BlockIQ4_XS& b) {
    uint32_t low;
    std::memcpy(&low, b.scales_l, 4);
    const uint64_t ls = _pdep_u64(low, 0x0F0F0F0F0F0F0F0Full) | _pdep_u64(b.scales_h, 0x3030303030303030ull);
    const __m128i s8 = _mm_sub_epi8(_mm_cvtsi64_si128(static_cast<long long>(ls)), _mm_set1_epi8(32));
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8));
}

template <int C>
void dot_iq4_xs_c(int64_t n, const void* w, const void* a, size_t a_stride, float* out) {
    const auto* x = static_cast<const BlockIQ4_XS*>(w);
    const uint8_t* rows[C];
    column_rows<C>(a, a_stride, rows);
    const BlockQ8_K* y[C];
    for (int c = 0; c < C; ++c) y[c] = reinterpret_cast<const BlockQ8_K*>(rows[c]);
    const __m256i values = iq4_values();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const BlockIQ4_XS& xb = x[i];
        prefetch_lines(&xb, static_cast<int>(sizeof(BlockIQ4_XS)));
        __m256i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
        const __m256i scales = sub_block_scales(xb);
#pragma GCC unroll 4
        for (int j = 0; j < 8; j += 2) {
            // Sub-blocks j and j + 1 from one 32-byte load: low nibbles are each one's first 16 values.
            const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 16 * j));
            const __m256i lo = _mm256_shuffle_epi8(values, _mm256_and_si256(packed, m4));
            const __m256i hi = _mm256_shuffle_epi8(values, _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4));
            const __m256i pair[2] = {_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31)};
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const __m256i q = pair[h];
                const __m256i aq = _mm256_sign_epi8(q, q);
                // Broadcast int16 lane j + h: bytes 2(j + h) and 2(j + h) + 1 into every pair.
                const __m256i scale =
                    _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>(0x0202 * (j + h) + 0x0100)));
#pragma GCC unroll 4
                for (int c = 0; c < C; ++c) {
                    const __m256i sy = _mm256_sign_epi8(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][i].qs + 32 * (j + h))), q);
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sy), scale));
                }
            }
        }
        const float dx = _cvtsh_ss(xb.d);
        for (int c = 0; c < C; ++c)
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y[c][i].d), _mm256_cvtepi32_ps(isum[c]), acc[c]);
    }
    for (int c = 0; c < C; ++c) out[c] = hsum(acc[c]);
}

// ---- dispatch on n_cols -------------------------------------------------------------------------------------------

template <template <int> class K>
void by_cols(int64_t n, const void* w, const void* a, size_t a_stride, float* out, int n_cols) {
    switch (n_cols) {
        case 1: K<1>::run(n, w, a, a_stride, out); break;
        case 2: K<2>::run(n, w, a, a_stride, out); break;
        case 3: K<3>::run(n, w, a, a_stride, out); break;
        default: K<4>::run(n, w, a, a_stride, out); break;
    }
}

template <FloatKind F>
struct FloatK {
    template <int C>
    struct K {
        static void run(int64_t n, const void* w, const void* a, size_t s, float* o) {
            dot_float_c<F, C>(n, w, a, s, o);
        }
    };
};

template <typename Block>
struct Q8ActK {
    template <int C>
    struct K {
        static void run(int64_t n, const void* w, const void* a, size_t s, float* o) {
            dot_q8act_c<Block, C>(n, w, a, s, o);
        }
    };
};

template <int C>
struct IQ4XSK {
    static void run(int64_t n, const void* w, const void* a, size_t s, float* o) { dot_iq4_xs_c<C>(n, w, a, s, o); }
};

}  // namespace

void register_dots_basic_avx2(DotTable& t) {
    t.set(DType::F32, by_cols<FloatK<FloatKind::F32>::K>);
    t.set(DType::F16, by_cols<FloatK<FloatKind::F16>::K>);
    t.set(DType::BF16, by_cols<FloatK<FloatKind::BF16>::K>);
    t.set(DType::Q8_0, by_cols<Q8ActK<BlockQ8_0>::K>);
    t.set(DType::Q4_0, by_cols<Q8ActK<BlockQ4_0>::K>);
    t.set(DType::IQ4_NL, by_cols<Q8ActK<BlockIQ4_NL>::K>);
    t.set(DType::IQ4_XS, by_cols<IQ4XSK>);
}

}  // namespace strata::cpu
