// Float vectors of W lanes (GCC/Clang vector extensions) for the sampler's passes over the whole vocabulary: W = 4 is
// SSE2 on the baseline x86-64 build (NEON on ARM), W = 8 is compiled inside target("avx2") functions and chosen at
// run time. Every lane does the same IEEE operations in both widths (no FMA contraction: ISO C++ mode), so the
// sampler's numbers, and with them its tokens, do not depend on which width ran.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

// Helpers take vectors by reference and are always inlined, so no 32-byte vector crosses a call on a build without
// AVX (GCC's -Wpsabi notes).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace strata::vec {

template <int W>
struct Lanes {
    typedef float f __attribute__((vector_size(W * 4)));
    typedef int32_t i __attribute__((vector_size(W * 4)));
    typedef uint16_t u16 __attribute__((vector_size(W * 4)));  // 2W lanes: a whole register of 16-bit values
    typedef int16_t s16 __attribute__((vector_size(W * 4)));
    typedef uint64_t u64 __attribute__((vector_size(W * 4)));
};

template <int W>
[[gnu::always_inline]] inline typename Lanes<W>::f load(const float* p) {
    typename Lanes<W>::f v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}
template <int W>
[[gnu::always_inline]] inline void store(float* p, const typename Lanes<W>::f& v) {
    std::memcpy(p, &v, sizeof(v));
}
template <int W>
[[gnu::always_inline]] inline typename Lanes<W>::f splat(float x) {
    typename Lanes<W>::f v;
    for (int k = 0; k < W; ++k) v[k] = x;
    return v;
}

// e^x for x <= 0, relative error about 2e-7; exactly 1 at 0; 0 below -87 (where e^x leaves the normal floats) and
// for -infinity. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-6 Taylor polynomial (error < 1e-7),
// and 2^n put into the exponent bits.
template <int W>
[[gnu::always_inline]] inline typename Lanes<W>::f exp_nonpositive(const typename Lanes<W>::f& x_in) {
    using F = typename Lanes<W>::f;
    using I = typename Lanes<W>::i;
    const F lo = splat<W>(-87.0f);
    const I too_small = x_in < lo;
    const F x = too_small ? lo : x_in;
    const F magic = splat<W>(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
    const F n = (x * splat<W>(1.44269504f) + magic) - magic;
    F r = x - n * splat<W>(0.693145752f);  // ln2 split: a high part exact in float, then the rest
    r = r - n * splat<W>(1.42860677e-6f);
    F p = splat<W>(1.0f / 720.0f);
    p = p * r + splat<W>(1.0f / 120.0f);
    p = p * r + splat<W>(1.0f / 24.0f);
    p = p * r + splat<W>(1.0f / 6.0f);
    p = p * r + splat<W>(0.5f);
    p = p * r + splat<W>(1.0f);
    p = p * r + splat<W>(1.0f);
    const I bits = (__builtin_convertvector(n, I) + 127) << 23;
    F scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    const F result = p * scale;
    return too_small ? splat<W>(0.0f) : result;
}

inline float exp_nonpositive_scalar(float x) {
    const Lanes<4>::f v = exp_nonpositive<4>(splat<4>(x));
    return v[0];
}

}  // namespace strata::vec

#pragma GCC diagnostic pop
