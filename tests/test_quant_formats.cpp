// Quant block formats (issue 5 foundation): type table against ggml's, round-trip error bounds, hand-built blocks
// whose values follow from the format definitions (ggml-common.h / ggml-quants.c), and properties of the i-quant
// codebooks. llama.cpp as a whole-model oracle is in test_quant_interop.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace {

using namespace strata;

// ---- (1) the type table ----

struct GgmlType {
    uint32_t id;
    const char* name;
    int64_t block_size;
    size_t block_bytes;
    bool quantizes;  // strata has a reference quantizer for it
};

// ggml's type_traits (ggml.c; sizes also in shared/reference/gguf-qwen4exp.md): elements and bytes per block.
const GgmlType kIssueTypes[] = {
    {2, "q4_0", 32, 18, true},      {10, "q2_k", 256, 84, true},     {11, "q3_k", 256, 110, true},
    {12, "q4_k", 256, 144, true},   {13, "q5_k", 256, 176, true},    {14, "q6_k", 256, 210, true},
    {15, "q8_k", 256, 292, true},   {20, "iq4_nl", 32, 18, true},    {23, "iq4_xs", 256, 136, true},
    {17, "iq2_xs", 256, 74, false}, {18, "iq3_xxs", 256, 98, false}, {21, "iq3_s", 256, 110, false},
    {29, "iq1_m", 256, 56, false},  {8, "q8_0", 32, 34, true},
};

TEST(QuantFormats, TypeTableMatchesGgml) {
    for (const GgmlType& g : kIssueTypes) {
        SCOPED_TRACE(g.name);
        auto t = dtype_traits(g.id);
        ASSERT_TRUE(t.has_value());
        EXPECT_STREQ(t->name, g.name);
        EXPECT_EQ(t->block_size, g.block_size);
        EXPECT_EQ(t->block_bytes, g.block_bytes);
        EXPECT_TRUE(t->can_compute);
        EXPECT_EQ(dtype_from_name(g.name), static_cast<DType>(g.id));
        EXPECT_EQ(row_bytes(static_cast<DType>(g.id), 3 * g.block_size), 3 * g.block_bytes);
    }
    // The C++ block structs have exactly ggml's sizes (no padding).
    EXPECT_EQ(sizeof(BlockQ4_0), 18u);
    EXPECT_EQ(sizeof(BlockQ2_K), 84u);
    EXPECT_EQ(sizeof(BlockQ3_K), 110u);
    EXPECT_EQ(sizeof(BlockQ4_K), 144u);
    EXPECT_EQ(sizeof(BlockQ5_K), 176u);
    EXPECT_EQ(sizeof(BlockQ6_K), 210u);
    EXPECT_EQ(sizeof(BlockQ8_K), 292u);
    EXPECT_EQ(sizeof(BlockIQ4_NL), 18u);
    EXPECT_EQ(sizeof(BlockIQ4_XS), 136u);
    EXPECT_EQ(sizeof(BlockIQ2_XS), 74u);
    EXPECT_EQ(sizeof(BlockIQ3_XXS), 98u);
    EXPECT_EQ(sizeof(BlockIQ3_S), 110u);
    EXPECT_EQ(sizeof(BlockIQ1_M), 56u);
}

// ---- (2) round trips ----

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
    const auto n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(row_bytes(t, n));
    quantize_row(t, x.data(), q.data(), n);
    std::vector<float> y(x.size());
    dequantize_row(t, q.data(), y.data(), n);
    return y;
}

double nmse(const std::vector<float>& x, const std::vector<float>& y) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        err += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
        ref += static_cast<double>(x[i]) * x[i];
    }
    return err / ref;
}

struct RoundTripBound {
    DType type;
    double max_nmse;
};

// NMSE bounds on unit-gaussian rows. Each is 1.5 x Delta^2 / 12, the mean squared error of plain round-to-nearest
// with step Delta, where Delta is the format's step at the expected extent of a group of gaussian values:
//   symmetric formats: Delta = E[max|x|] / (levels on one side); E[max|x|] = 2.13 (16 values), 2.4 (32), 3.0 (256);
//   min/scale formats: Delta = E[max - min] / (levels - 1); E[range] = 3.53 (16 values), 4.12 (32).
// ggml's scale searches only lower the error below plain rounding; the factor 1.5 covers the spread of the group
// extent from row to row and the rounding of the stored scales (6-bit, 8-bit, f16).
const RoundTripBound kBounds[] = {
    {DType::Q8_K, 1.5 * std::pow(3.0 / 127, 2) / 12},  // 256 values, levels +-127        -> 7.0e-5
    {DType::Q6_K, 1.5 * std::pow(2.13 / 32, 2) / 12},  // 16 values, levels -32..31        -> 5.5e-4
    {DType::Q5_K, 1.5 * std::pow(4.12 / 31, 2) / 12},  // 32 values, levels 0..31          -> 2.2e-3
    {DType::Q4_K, 1.5 * std::pow(4.12 / 15, 2) / 12},  // 32 values, levels 0..15          -> 9.4e-3
    {DType::Q4_0, 1.5 * std::pow(2.4 / 8, 2) / 12},    // 32 values, levels -8..7          -> 1.1e-2
    // IQ4: 16 non-uniform levels spanning [-127, 113] / 127 of the group's max: average step 240 / 15 / 127 of it.
    {DType::IQ4_NL, 1.5 * std::pow(2.4 * 240.0 / 15 / 127, 2) / 12},  // -> 1.1e-2
    {DType::IQ4_XS, 1.5 * std::pow(2.4 * 240.0 / 15 / 127, 2) / 12},
    {DType::Q3_K, 1.5 * std::pow(2.13 / 4, 2) / 12},  // 16 values, levels -4..3          -> 3.5e-2
    {DType::Q2_K, 1.5 * std::pow(3.53 / 3, 2) / 12},  // 16 values, levels 0..3           -> 1.7e-1
};

TEST(QuantFormats, GaussianRoundTripWithinBounds) {
    for (const RoundTripBound& b : kBounds) {
        SCOPED_TRACE(dtype_name(b.type));
        const int64_t block = traits(b.type).block_size;
        // Odd block counts: nothing may depend on pairs of blocks.
        const int64_t n = block == 32 ? 32 * 37 : 256 * 7;
        std::mt19937 rng(1234);
        std::normal_distribution<float> gauss;
        double worst = 0;
        for (int row = 0; row < 20; ++row) {
            std::vector<float> x(static_cast<size_t>(n));
            for (float& v : x) v = gauss(rng);
            worst = std::max(worst, nmse(x, round_trip(b.type, x)));
        }
        std::printf("[quant] %-7s worst NMSE %.3g (bound %.3g)\n", dtype_name(b.type), worst, b.max_nmse);
        EXPECT_LT(worst, b.max_nmse);
        EXPECT_GT(worst, 0.0);  // a lossless "round trip" would mean the type is not really quantized
    }
}

// llama.cpp's own quantization test (tests/test-quantize-fns.cpp): data 0.1 + 2 cos(i), 4096 values, error
// sqrt(sum diff^2) / n, with its thresholds: 0.002 in general, 0.0075 for Q2_K, 0.0040 for Q3_K.
TEST(QuantFormats, LlamaCppQuantizeFnsThresholds) {
    const int64_t n = 32 * 128;
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 0.1f + 2 * std::cos(static_cast<float>(i));
    for (const RoundTripBound& b : kBounds) {
        const std::vector<float> y = round_trip(b.type, x);
        double sum = 0;
        for (size_t i = 0; i < x.size(); ++i) sum += (static_cast<double>(x[i]) - y[i]) * (x[i] - y[i]);
        const double err = std::sqrt(sum) / static_cast<double>(n);
        const double limit = b.type == DType::Q2_K ? 0.0075 : b.type == DType::Q3_K ? 0.0040 : 0.002;
        EXPECT_LT(err, limit) << dtype_name(b.type);
    }
}

TEST(QuantFormats, ZerosAndScaledRowsQuantizeSanely) {
    for (const RoundTripBound& b : kBounds) {
        SCOPED_TRACE(dtype_name(b.type));
        const int64_t n = 256 * 3;
        std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
        for (float v : round_trip(b.type, zeros)) ASSERT_EQ(v, 0.0f);
        // One all-zero super-block between two live ones, and a row with large and tiny magnitudes: no NaN or Inf,
        // and the zero block stays zero.
        std::mt19937 rng(7);
        std::normal_distribution<float> gauss;
        std::vector<float> x(static_cast<size_t>(n));
        for (size_t i = 0; i < x.size(); ++i) x[i] = i / 256 == 1 ? 0.0f : gauss(rng) * (i < 256 ? 1e3f : 1e-3f);
        const std::vector<float> y = round_trip(b.type, x);
        for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_TRUE(std::isfinite(y[i])) << i;
            if (i / 256 == 1) {
                ASSERT_EQ(y[i], 0.0f) << i;
            }
        }
        EXPECT_LT(nmse({x.begin(), x.begin() + 256}, {y.begin(), y.begin() + 256}), b.max_nmse);
        EXPECT_LT(nmse({x.begin() + 512, x.end()}, {y.begin() + 512, y.end()}), b.max_nmse);
    }
}

TEST(QuantFormats, SignedExtremeIsExactForSymmetricTypes) {
    // Q8_K, Q6_K and Q4_0 map the block's signed extreme to an exact level (-127/-128/-8 times the scale), so it
    // survives the round trip up to the f16/f32 rounding of the scale.
    for (DType t : {DType::Q8_K, DType::Q4_0}) {
        std::vector<float> x(256);
        for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
        x[37] = -3.0f;
        const std::vector<float> y = round_trip(t, x);
        EXPECT_NEAR(y[37], -3.0f, 3.0f * 1e-3f) << dtype_name(t);
    }
}

// ---- (3) hand-built blocks ----

constexpr uint16_t kF16Half = 0x3800;     // 0.5
constexpr uint16_t kF16Quarter = 0x3400;  // 0.25
constexpr uint16_t kF16Eighth = 0x3000;   // 0.125

template <typename Block>
std::vector<float> dequantize_blocks(DType t, const std::vector<Block>& blocks) {
    const int64_t n = static_cast<int64_t>(blocks.size()) * traits(t).block_size;
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(t, blocks.data(), y.data(), n);
    return y;
}

void expect_values(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    int bad = 0;
    for (size_t i = 0; i < got.size() && bad < 5; ++i)
        if (got[i] != want[i]) {
            ADD_FAILURE() << "element " << i << ": got " << got[i] << ", format says " << want[i];
            ++bad;
        }
}

TEST(QuantBlocks, Q4_0) {
    // x = d * (q - 8); byte j: element j in the low nibble, element j + 16 in the high nibble.
    BlockQ4_0 b{};
    b.d = kF16Half;
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
        want[j] = 0.5f * (j - 8);
        want[j + 16] = 0.5f * (15 - j - 8);
    }
    expect_values(dequantize_blocks(DType::Q4_0, std::vector{b}), want);
}

// Element e (0..255) of the Q2_K / Q3_K 2-bit field layout: qs[32 * (e / 128) + e % 32], bits 2 * ((e % 128) / 32).
void set_two_bits(uint8_t* qs, int e, int v) {
    qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(v << (2 * ((e % 128) / 32)));
}

TEST(QuantBlocks, Q2_K) {
    // x = d * scale_s * q - dmin * min_s for sub-block s = e / 16; scales[s] = scale | min << 4.
    BlockQ2_K b{};
    b.d = kF16Half;
    b.dmin = kF16Quarter;
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<uint8_t>(s | ((15 - s) << 4));
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
        const int q = (e * 7 + 3) % 4;
        set_two_bits(b.qs, e, q);
        want[e] = 0.5f * (e / 16) * q - 0.25f * (15 - e / 16);
    }
    expect_values(dequantize_blocks(DType::Q2_K, std::vector{b}), want);
}

TEST(QuantBlocks, Q3_K) {
    // x = d * (scale_s - 32) * (q - 4), q = 2 low bits + 4 * hmask bit; 6-bit scales: low nibble of scale s in byte
    // s % 8 (nibble s / 8), high 2 bits in byte 8 + s % 4 at bit 2 * (s / 4).
    BlockQ3_K b{};
    b.d = kF16Quarter;
    int scale[16];
    for (int s = 0; s < 16; ++s) {
        scale[s] = (s * 5 + 3) % 64;
        b.scales[s % 8] |= static_cast<uint8_t>((scale[s] & 0xF) << (4 * (s / 8)));
        b.scales[8 + s % 4] |= static_cast<uint8_t>((scale[s] >> 4) << (2 * (s / 4)));
    }
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
        const int q = (e * 3 + 1) % 8;
        set_two_bits(b.qs, e, q & 3);
        if (q & 4) b.hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
        want[e] = 0.25f * (scale[e / 16] - 32) * (q - 4);
    }
    expect_values(dequantize_blocks(DType::Q3_K, std::vector{b}), want);
}

// Q4_K / Q5_K 12-byte scales: for j < 4 byte j holds scale j and byte j + 4 min j (6 bits each); byte j + 8 holds
// the low nibbles of scale j + 4 and min j + 4, whose high 2 bits sit in bits 6..7 of bytes j and j + 4.
void pack_k4_scales(const int* scale, const int* min, uint8_t* out) {
    for (int j = 0; j < 4; ++j) {
        out[j] = static_cast<uint8_t>(scale[j] | ((scale[j + 4] >> 4) << 6));
        out[j + 4] = static_cast<uint8_t>(min[j] | ((min[j + 4] >> 4) << 6));
        out[j + 8] = static_cast<uint8_t>((scale[j + 4] & 0xF) | ((min[j + 4] & 0xF) << 4));
    }
}

TEST(QuantBlocks, Q4_K) {
    // x = d * scale_s * q - dmin * min_s for sub-block s = e / 32; sub-blocks 2p and 2p+1 share qs[32p..32p+31]
    // (low and high nibbles).
    BlockQ4_K b{};
    b.d = kF16Half;
    b.dmin = kF16Eighth;
    int scale[8], min[8];
    for (int s = 0; s < 8; ++s) {
        scale[s] = 10 + 7 * s;  // up to 59: the high 2 bits matter
        min[s] = 63 - 5 * s;
    }
    pack_k4_scales(scale, min, b.scales);
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
        const int s = e / 32, q = (e * 5 + 2) % 16;
        b.qs[32 * (s / 2) + e % 32] |= static_cast<uint8_t>(q << (4 * (s % 2)));
        want[e] = 0.5f * scale[s] * q - 0.125f * min[s];
    }
    expect_values(dequantize_blocks(DType::Q4_K, std::vector{b}), want);
    // The unpacking helper agrees with the definition too.
    for (int s = 0; s < 8; ++s) {
        uint8_t sc = 0, m = 0;
        quant::unpack_scale_min_k4(b.scales, s, &sc, &m);
        EXPECT_EQ(sc, scale[s]);
        EXPECT_EQ(m, min[s]);
    }
}

TEST(QuantBlocks, Q5_K) {
    // As Q4_K with a fifth bit: bit s of qh[e % 32] adds 16 to element e of sub-block s.
    BlockQ5_K b{};
    b.d = kF16Quarter;
    b.dmin = kF16Half;
    int scale[8], min[8];
    for (int s = 0; s < 8; ++s) {
        scale[s] = 63 - 3 * s;
        min[s] = 2 + 8 * s;
    }
    pack_k4_scales(scale, min, b.scales);
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
        const int s = e / 32, q = (e * 11 + 5) % 32;
        b.qs[32 * (s / 2) + e % 32] |= static_cast<uint8_t>((q & 0xF) << (4 * (s % 2)));
        if (q & 16) b.qh[e % 32] |= static_cast<uint8_t>(1 << s);
        want[e] = 0.25f * scale[s] * q - 0.5f * min[s];
    }
    expect_values(dequantize_blocks(DType::Q5_K, std::vector{b}), want);
}

TEST(QuantBlocks, Q6_K) {
    // x = d * scale_{e/16} * (q - 32); element e = 128h + 32k + l: low nibble in ql[64h + l + 32 (k % 2)] (nibble
    // k / 2), high 2 bits in qh[32h + l] at bit 2k.
    BlockQ6_K b{};
    b.d = kF16Eighth;
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s % 2 ? -8 * s : 8 * s - 8);
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32, q = (e * 13 + 7) % 64;
        b.ql[64 * h + l + 32 * (k % 2)] |= static_cast<uint8_t>((q & 0xF) << (4 * (k / 2)));
        b.qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
        want[e] = 0.125f * b.scales[e / 16] * (q - 32);
    }
    expect_values(dequantize_blocks(DType::Q6_K, std::vector{b}), want);
}

TEST(QuantBlocks, Q8_K) {
    BlockQ8_K b{};
    b.d = 0.375f;
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
        b.qs[e] = static_cast<int8_t>(e - 128);
        want[e] = 0.375f * (e - 128);
    }
    expect_values(dequantize_blocks(DType::Q8_K, std::vector{b}), want);
    // bsums are the sums of each 16 quants (what dot products use to apply mins).
    std::vector<float> x(256);
    for (int e = 0; e < 256; ++e) x[e] = std::cos(0.3f * e);
    BlockQ8_K q{};
    quantize_row(DType::Q8_K, x.data(), &q, 256);
    for (int s = 0; s < 16; ++s) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += q.qs[16 * s + i];
        EXPECT_EQ(q.bsums[s], sum);
    }
}

// The IQ4_NL codebook as published in ggml-common.h (kvalues_iq4nl).
const int kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

TEST(QuantBlocks, IQ4_NL) {
    for (int i = 0; i < 16; ++i) EXPECT_EQ(quant::kIQ4NLValues[i], kIQ4Values[i]);
    // x = d * value[index]; nibble layout as Q4_0. Two blocks: the second one's scale is negative.
    std::vector<BlockIQ4_NL> b(2);
    b[0].d = kF16Half;
    b[1].d = static_cast<uint16_t>(kF16Quarter | 0x8000);
    std::vector<float> want(64);
    for (int blk = 0; blk < 2; ++blk)
        for (int j = 0; j < 16; ++j) {
            const int lo = (j * 3) % 16, hi = (j * 7 + 5) % 16;
            b[blk].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
            const float d = blk == 0 ? 0.5f : -0.25f;
            want[32 * blk + j] = d * kIQ4Values[lo];
            want[32 * blk + j + 16] = d * kIQ4Values[hi];
        }
    expect_values(dequantize_blocks(DType::IQ4_NL, b), want);
}

TEST(QuantBlocks, IQ4_XS) {
    // x = d * (ls_s - 32) * value[index]; 6-bit ls: low nibble in scales_l[s / 2] (nibble s % 2), high 2 bits in
    // scales_h at bit 2s; indices as Q4_0 within each 32-element sub-block.
    BlockIQ4_XS b{};
    b.d = kF16Eighth;
    int ls[8];
    for (int s = 0; s < 8; ++s) {
        ls[s] = (s * 9 + 4) % 64;
        b.scales_l[s / 2] |= static_cast<uint8_t>((ls[s] & 0xF) << (4 * (s % 2)));
        b.scales_h = static_cast<uint16_t>(b.scales_h | ((ls[s] >> 4) << (2 * s)));
    }
    std::vector<float> want(256);
    for (int e = 0; e < 256; ++e) {
        const int s = e / 32, within = e % 32, idx = (e * 5 + 1) % 16;
        b.qs[16 * s + within % 16] |= static_cast<uint8_t>(idx << (4 * (within / 16)));
        want[e] = 0.125f * (ls[s] - 32) * kIQ4Values[idx];
    }
    expect_values(dequantize_blocks(DType::IQ4_XS, std::vector{b}), want);
}

// Sign of element j (0..7) of a group whose 7 stored sign bits are `bits`: bit j for j < 7; the 8th sign makes the
// count of negative signs even (the IQ2/IQ3 sign convention).
float group_sign(uint32_t bits, int j) {
    const int parity = __builtin_popcount(bits & 127) & 1;
    const int bit = j < 7 ? static_cast<int>((bits >> j) & 1) : parity;
    return bit ? -1.0f : 1.0f;
}

uint8_t byte_of(uint64_t v, int j) {
    return static_cast<uint8_t>(v >> (8 * j));
}

TEST(QuantBlocks, IQ2_XS) {
    // Group g of 8: qs[g] = grid index (9 bits) | sign bits << 9; scale nibble (g % 4) / 2 of scales[g / 4];
    // x = d * (0.5 + scale) / 4 * grid byte * sign.
    BlockIQ2_XS b{};
    b.d = kF16Half;
    for (int i = 0; i < 8; ++i) b.scales[i] = static_cast<uint8_t>(((i * 3) % 16) | (((i * 5 + 2) % 16) << 4));
    std::vector<float> want(256);
    for (int g = 0; g < 32; ++g) {
        const uint32_t idx = (g * 37 + 11) % 512, signs = (g * 29 + 3) % 128;
        b.qs[g] = static_cast<uint16_t>(idx | (signs << 9));
        const int scale = (b.scales[g / 4] >> (4 * ((g % 4) / 2))) & 0xF;
        for (int j = 0; j < 8; ++j)
            want[8 * g + j] = 0.5f * (0.5f + scale) * 0.25f * byte_of(quant::kIQ2XSGrid[idx], j) * group_sign(signs, j);
    }
    expect_values(dequantize_blocks(DType::IQ2_XS, std::vector{b}), want);
}

TEST(QuantBlocks, IQ3_XXS) {
    // qs[0..63]: one grid index per 4 values; then per 32 values a little-endian uint32: 4 x 7 sign bits (group l at
    // bit 7l) and the scale in bits 28..31; x = d * (0.5 + scale) / 2 * grid byte * sign.
    BlockIQ3_XXS b{};
    b.d = kF16Quarter;
    std::vector<float> want(256);
    for (int s = 0; s < 8; ++s) {
        const uint32_t scale = (s * 7 + 1) % 16;
        uint32_t aux = scale << 28;
        uint32_t group_signs[4];
        for (int l = 0; l < 4; ++l) {
            group_signs[l] = (s * 31 + l * 17 + 5) % 128;
            aux |= group_signs[l] << (7 * l);
        }
        std::memcpy(b.qs + 64 + 4 * s, &aux, 4);
        for (int k = 0; k < 8; ++k) {  // 8 grid entries of 4 values in this sub-block
            const int idx = (s * 8 + k) * 53 % 256;
            b.qs[8 * s + k] = static_cast<uint8_t>(idx);
            for (int j = 0; j < 4; ++j) {
                const int e = 32 * s + 4 * k + j;
                want[e] = 0.25f * (0.5f + scale) * 0.5f * byte_of(quant::kIQ3XXSGrid[idx], j) *
                          group_sign(group_signs[k / 2], 4 * (k % 2) + j);
            }
        }
    }
    expect_values(dequantize_blocks(DType::IQ3_XXS, std::vector{b}), want);
}

TEST(QuantBlocks, IQ3_S) {
    // Per 32 values s: 8 grid indices of 9 bits (low 8 in qs[8s + k], 9th = bit k of qh[s]); explicit signs (byte
    // signs[4s + l] for group l of 8, bit j); scale nibble s % 2 of scales[s / 2]; x = d * (1 + 2 scale) * grid * sign.
    BlockIQ3_S b{};
    b.d = kF16Eighth;
    for (int i = 0; i < 4; ++i) b.scales[i] = static_cast<uint8_t>(((i * 5 + 3) % 16) | (((i * 11) % 16) << 4));
    for (int i = 0; i < 32; ++i) b.signs[i] = static_cast<uint8_t>((i * 73 + 19) % 256);
    std::vector<float> want(256);
    for (int s = 0; s < 8; ++s) {
        const int scale = (b.scales[s / 2] >> (4 * (s % 2))) & 0xF;
        for (int k = 0; k < 8; ++k) {
            const int idx = ((s * 8 + k) * 97 + 13) % 512;
            b.qs[8 * s + k] = static_cast<uint8_t>(idx & 0xFF);
            if (idx & 256) b.qh[s] |= static_cast<uint8_t>(1 << k);
            for (int j = 0; j < 4; ++j) {
                const int e = 32 * s + 4 * k + j;
                const int bit = 4 * (k % 2) + j;
                const float sign = (b.signs[4 * s + k / 2] >> bit) & 1 ? -1.0f : 1.0f;
                want[e] = 0.125f * (1 + 2 * scale) * byte_of(quant::kIQ3SGrid[idx], j) * sign;
            }
        }
    }
    expect_values(dequantize_blocks(DType::IQ3_S, std::vector{b}), want);
}

TEST(QuantBlocks, IQ1_M) {
    // scales: four little-endian uint16; sub-block s (32 values) uses uint16 s / 2, bits 6 (s % 2) + 3 h for its
    // half h (16 values); the top nibbles of the four uint16 (first = lowest) are the f16 super-block scale d.
    // Group g of 8: 11-bit index = qs[g] | (low 3 bits of nibble g % 2 of qh[g / 2]) << 8, and bit 3 of that
    // nibble selects delta = -1/8 (set) or +1/8; x = d * (2 scale + 1) * (grid value + delta), grid values -1/0/1.
    BlockIQ1_M b{};
    const uint16_t d_bits = kF16Quarter;
    uint16_t sc[4] = {};
    int scale3[8][2];
    for (int s = 0; s < 8; ++s)
        for (int h = 0; h < 2; ++h) {
            scale3[s][h] = (s * 3 + h * 5 + 1) % 8;
            sc[s / 2] = static_cast<uint16_t>(sc[s / 2] | (scale3[s][h] << (6 * (s % 2) + 3 * h)));
        }
    for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>(sc[k] | (((d_bits >> (4 * k)) & 0xF) << 12));
    std::memcpy(b.scales, sc, sizeof sc);
    std::vector<float> want(256);
    for (int g = 0; g < 32; ++g) {
        const int idx = (g * 331 + 7) % 2048;
        const bool negative_delta = g % 3 == 0;
        b.qs[g] = static_cast<uint8_t>(idx & 0xFF);
        const int nibble = (idx >> 8) | (negative_delta ? 8 : 0);
        b.qh[g / 2] |= static_cast<uint8_t>(nibble << (4 * (g % 2)));
        const int s = g / 4, h = (g % 4) / 2;
        for (int j = 0; j < 8; ++j) {
            const auto v = static_cast<int8_t>(byte_of(quant::kIQ1SGrid[idx], j));
            want[8 * g + j] = 0.25f * (2 * scale3[s][h] + 1) * (v + (negative_delta ? -0.125f : 0.125f));
        }
    }
    expect_values(dequantize_blocks(DType::IQ1_M, std::vector{b}), want);
}

// ---- codebook properties (ggml-common.h: what each grid is made of) ----

template <typename T, size_t N>
void expect_grid(const T (&grid)[N], int values_per_entry, const std::set<int>& allowed, uint64_t first,
                 uint64_t last) {
    std::set<uint64_t> distinct(grid, grid + N);
    EXPECT_EQ(distinct.size(), N) << "grid entries repeat";
    for (size_t i = 0; i < N; ++i)
        for (int j = 0; j < values_per_entry; ++j)
            ASSERT_TRUE(allowed.count(byte_of(grid[i], j))) << "entry " << i << " byte " << j;
    EXPECT_EQ(grid[0], first);
    EXPECT_EQ(grid[N - 1], last);
}

TEST(QuantTables, GridsHaveTheirDefinedValues) {
    // iq2xs_grid: 512 entries of 8 magnitudes from {8, 25, 43}.
    expect_grid(quant::kIQ2XSGrid, 8, {8, 25, 43}, 0x0808080808080808ull, 0x2b2b2b2b2b2b2b2bull);
    // iq3xxs_grid: 256 entries of 4 magnitudes from {4, 12, ..., 52, 62}.
    expect_grid(quant::kIQ3XXSGrid, 4, {4, 12, 20, 28, 36, 44, 52, 62}, 0x04040404u, 0x3e341c04u);
    // iq3s_grid: 512 entries of 4 odd magnitudes 1..15.
    expect_grid(quant::kIQ3SGrid, 4, {1, 3, 5, 7, 9, 11, 13, 15}, 0x01010101u, 0x0f0f0101u);
    // iq1s_grid: 2048 entries of 8 values in {-1, 0, 1} (bytes 0xff, 0, 1).
    expect_grid(quant::kIQ1SGrid, 8, {0xff, 0, 1}, 0xffffffffffffffffull, 0x0101010101010101ull);
}

TEST(QuantTables, SignCompletionMatchesGgmlTable) {
    // ggml's ksigns_iq2xs starts 0, 129, 130, 3, 132, 5, 6, 135 and ends 252, 125, 126, 255.
    const int head[8] = {0, 129, 130, 3, 132, 5, 6, 135};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(quant::even_signs(static_cast<uint32_t>(i)), head[i]);
    EXPECT_EQ(quant::even_signs(124), 252);
    EXPECT_EQ(quant::even_signs(125), 125);
    EXPECT_EQ(quant::even_signs(126), 126);
    EXPECT_EQ(quant::even_signs(127), 255);
    for (uint32_t i = 0; i < 128; ++i) EXPECT_EQ(__builtin_popcount(quant::even_signs(i)) % 2, 0);
}

// ---- quantizer behaviour that follows from ggml's reference quantizers ----

TEST(QuantFormats, QuantizedBlocksAreSelfConsistent) {
    // Re-quantizing a dequantized row lands on (nearly) the same values: the levels are representable exactly, so
    // only the scale search may shift them slightly.
    for (const RoundTripBound& b : kBounds) {
        std::mt19937 rng(99);
        std::normal_distribution<float> gauss;
        std::vector<float> x(256 * 3);
        for (float& v : x) v = gauss(rng);
        const std::vector<float> y = round_trip(b.type, x);
        const std::vector<float> z = round_trip(b.type, y);
        EXPECT_LT(nmse(y, z), b.max_nmse / 4) << dtype_name(b.type);
    }
}

TEST(QuantFormats, RowsMustBeWholeBlocks) {
    std::vector<float> x(300);
    std::vector<uint8_t> q(1024);
    EXPECT_DEATH(quantize_row(DType::Q4_K, x.data(), q.data(), 300), "internal error");
}

}  // namespace
