// f16 / bf16 conversions and Q8_0 against references written from the IEEE 754 and ggml block definitions.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace strata {
namespace {

// binary16 by definition: sign, 5-bit exponent (bias 15), 10-bit fraction; exponent 0 is subnormal.
double f16_reference(uint16_t h) {
    const int exp = (h >> 10) & 0x1f;
    const int frac = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 31) return frac ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
    if (exp == 0) return sign * std::ldexp(frac, -24);
    return sign * std::ldexp(1024 + frac, exp - 25);
}

bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

// Nearest binary16 with ties to even, by search over all finite positive values.
uint16_t f16_round_reference(float x) {
    static const std::vector<double> positive = [] {
        std::vector<double> v;
        for (uint32_t h = 0; h <= 0x7bff; ++h) v.push_back(f16_reference(static_cast<uint16_t>(h)));
        return v;
    }();
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(x));
    if (a >= 65520.0) return sign | 0x7c00;  // at or past max + half an ulp: infinity
    const auto it = std::lower_bound(positive.begin(), positive.end(), a);
    if (it == positive.end()) return sign | 0x7bff;  // between 65504 and 65520
    const auto hi = static_cast<uint16_t>(it - positive.begin());
    if (positive[hi] == a || hi == 0) return sign | hi;
    const auto lo = static_cast<uint16_t>(hi - 1);
    const double d_lo = a - positive[lo];
    const double d_hi = positive[hi] - a;
    if (d_lo < d_hi) return sign | lo;
    if (d_hi < d_lo) return sign | hi;
    return sign | ((lo & 1) ? hi : lo);
}

TEST(DTypeF16, KnownValues) {
    EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
    EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
    EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
    EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
    EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
    EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
    EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
    EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
    EXPECT_EQ(f16_to_f32(0x3555), 0x1.554p-2f);
    EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
    EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
    EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
    EXPECT_EQ(f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
    EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
    EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00);
    EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
    EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));
    EXPECT_TRUE(f16_is_nan(f32_to_f16(std::numeric_limits<float>::quiet_NaN())));
    EXPECT_TRUE(f16_is_nan(f32_to_f16(std::bit_cast<float>(0x7F800001u))));  // NaN with only a low payload bit
    EXPECT_TRUE(f16_is_nan(f32_to_f16(std::bit_cast<float>(0xFFC00000u))));
}

TEST(DTypeF16, RoundingAndOverflow) {
    EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);  // below max + half ulp
    EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // the tie rounds to even, which is infinity
    EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
    EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
    EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::max()), 0x7C00);
    EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie between 0x3C00 and 0x3C01: even
    EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie between 0x3C01 and 0x3C02: even
    EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3C01);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);       // half the smallest subnormal: tie to 0
    EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);       // 1.5 subnormal ulps: tie to even 2
    EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -30)), 0x0000);
    EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -30)), 0x8000);
    EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
    // Rounding up out of the subnormals into the smallest normal.
    EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);
}

TEST(DTypeF16, ExhaustiveDecodeAndRoundTrip) {
    for (uint32_t k = 0; k <= 0xffff; ++k) {
        const auto h = static_cast<uint16_t>(k);
        const float f = f16_to_f32(h);
        if (f16_is_nan(h)) {
            EXPECT_TRUE(std::isnan(f)) << std::hex << k;
            EXPECT_TRUE(f16_is_nan(f32_to_f16(f))) << std::hex << k;
            continue;
        }
        ASSERT_EQ(static_cast<double>(f), f16_reference(h)) << std::hex << k;
        ASSERT_EQ(f32_to_f16(f), h) << std::hex << k;
    }
}

TEST(DTypeF16, ExhaustiveTiesToEven) {
    // Every midpoint between neighbouring finite f16 values is exact in f32; it must round to the even neighbour,
    // and the f32 values just beside it to the nearer neighbour.
    for (uint32_t h = 0; h < 0x7bff; ++h) {
        const double mid = (f16_reference(static_cast<uint16_t>(h)) + f16_reference(static_cast<uint16_t>(h + 1))) / 2;
        const auto x = static_cast<float>(mid);
        ASSERT_EQ(static_cast<double>(x), mid);
        const auto even = static_cast<uint16_t>((h & 1) ? h + 1 : h);
        ASSERT_EQ(f32_to_f16(x), even) << std::hex << h;
        ASSERT_EQ(f32_to_f16(-x), even | 0x8000) << std::hex << h;
        ASSERT_EQ(f32_to_f16(std::nextafter(x, 0.0f)), h) << std::hex << h;
        ASSERT_EQ(f32_to_f16(std::nextafter(x, INFINITY)), h + 1) << std::hex << h;
    }
}

TEST(DTypeF16, RandomFloatsMatchReference) {
    std::mt19937 rng(1234);
    for (int k = 0; k < 200000; ++k) {
        uint32_t bits = rng();
        if (k % 2 == 0) bits = (bits & 0x807fffffu) | ((100u + rng() % 45u) << 23);  // exponents near f16's range
        const float x = std::bit_cast<float>(bits);
        if (std::isnan(x)) continue;
        ASSERT_EQ(f32_to_f16(x), f16_round_reference(x)) << std::hexfloat << x;
    }
}

TEST(DTypeBF16, KnownValuesAndRounding) {
    EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
    EXPECT_EQ(bf16_to_f32(0xC040), -3.0f);
    EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));  // smallest subnormal
    EXPECT_EQ(bf16_to_f32(0x7F7F), std::ldexp(255.0f, 120));  // largest finite
    EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
    EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
    EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // past max + half ulp
    EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);         // tie: even
    EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);     // tie: even
    EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3F81);
    for (uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
        const uint16_t h = f32_to_bf16(std::bit_cast<float>(nan_bits));
        EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << std::hex << nan_bits;
    }
}

TEST(DTypeBF16, ExhaustiveTiesAndRoundTrip) {
    for (uint32_t h = 0; h <= 0xffff; ++h) {
        const float f = bf16_to_f32(static_cast<uint16_t>(h));
        ASSERT_EQ(std::bit_cast<uint32_t>(f), h << 16);  // bf16 is the top half of an f32 by definition
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_bf16(f), h);
        if ((h & 0x7fff) >= 0x7f7f) continue;  // no finite neighbour above
        const uint32_t mid = h << 16 | 0x8000;  // exactly halfway to h + 1
        ASSERT_EQ(f32_to_bf16(std::bit_cast<float>(mid)), (h & 1) ? h + 1 : h) << std::hex << h;
        ASSERT_EQ(f32_to_bf16(std::bit_cast<float>(mid - 1)), h) << std::hex << h;
        ASSERT_EQ(f32_to_bf16(std::bit_cast<float>(mid + 1)), h + 1) << std::hex << h;
    }
}

TEST(DTypeQ8_0, DequantizeByDefinition) {
    // A block is an f16 scale d and 32 int8 values; element j is d * q[j].
    BlockQ8_0 b[2];
    b[0].d = 0x3800;  // 0.5
    b[1].d = 0xB400;  // -0.25
    for (int j = 0; j < 32; ++j) {
        b[0].qs[j] = static_cast<int8_t>(j * 8 - 128);
        b[1].qs[j] = static_cast<int8_t>(127 - j);
    }
    float y[64];
    dequantize_row(DType::Q8_0, b, y, 64);
    for (int j = 0; j < 32; ++j) {
        EXPECT_EQ(y[j], 0.5f * static_cast<float>(j * 8 - 128));
        EXPECT_EQ(y[32 + j], -0.25f * static_cast<float>(127 - j));
    }
}

void expect_q8_0_bounded(const std::vector<float>& x) {
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<BlockQ8_0> q(static_cast<size_t>(n / kQ8_0Block));
    quantize_row(DType::Q8_0, x.data(), q.data(), n);
    std::vector<float> y(x.size());
    dequantize_row(DType::Q8_0, q.data(), y.data(), n);
    for (int64_t blk = 0; blk < n / kQ8_0Block; ++blk) {
        float amax = 0;
        for (int j = 0; j < kQ8_0Block; ++j) amax = std::max(amax, std::fabs(x[blk * kQ8_0Block + j]));
        const double d = amax / 127.0;  // the exact scale
        const double d16 = f16_to_f32(q[blk].d);
        // Rounding q to the nearest integer costs up to d/2; storing d as f16 adds |d - d16| per unit of |q| <= 127.
        const double bound = d / 2 + 127 * std::fabs(d - d16) + 1e-6 * amax;
        for (int j = 0; j < kQ8_0Block; ++j) {
            const int64_t k = blk * kQ8_0Block + j;
            EXPECT_LE(std::fabs(static_cast<double>(y[k]) - x[k]), bound) << "element " << k;
            EXPECT_GE(q[blk].qs[j], -127);
        }
    }
}

TEST(DTypeQ8_0, RoundTripErrorBounded) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float scale : {1e-4f, 0.02f, 1.0f, 300.0f}) {
        std::vector<float> x(32 * 16);
        for (auto& v : x) v = scale * normal(rng);
        expect_q8_0_bounded(x);
    }
    std::vector<float> zeros(64, 0.0f);
    expect_q8_0_bounded(zeros);
}

TEST(DTypeQ8_0, ExactScaleGivesHalfStepBound) {
    // amax = 127 * 2^-4 makes d = 2^-4 exactly representable in f16: the error is at most d/2 per element, and the
    // largest element comes back exactly.
    std::vector<float> x(32);
    const float d = 0.0625f;
    for (int j = 0; j < 32; ++j) x[j] = d * (static_cast<float>(j) * 7.9f - 120.0f);
    x[5] = 127 * d;
    std::vector<BlockQ8_0> q(1);
    quantize_row(DType::Q8_0, x.data(), q.data(), 32);
    EXPECT_EQ(q[0].d, f32_to_f16(d));
    EXPECT_EQ(q[0].qs[5], 127);
    std::vector<float> y(32);
    dequantize_row(DType::Q8_0, q.data(), y.data(), 32);
    for (int j = 0; j < 32; ++j) EXPECT_LE(std::fabs(y[j] - x[j]), d / 2) << j;
    EXPECT_EQ(y[5], x[5]);
}

TEST(DTypeTraits, BlockSizes) {
    EXPECT_EQ(row_bytes(DType::Q8_0, 64), 68u);
    EXPECT_EQ(row_bytes(DType::F16, 3), 6u);
    EXPECT_EQ(row_bytes(DType::BF16, 5), 10u);
    EXPECT_EQ(row_bytes(DType::Q4_K, 256), 144u);
    EXPECT_FALSE(dtype_traits(4).has_value());  // ids 4 and 5 (Q4_2, Q4_3) were removed from ggml
    EXPECT_FALSE(dtype_traits(31).has_value());
    EXPECT_EQ(dtype_from_name("Q8_0"), DType::Q8_0);
    EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
    EXPECT_EQ(dtype_from_name("q9_9"), std::nullopt);
}

}  // namespace
}  // namespace strata
