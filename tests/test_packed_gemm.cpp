// The CPU's packed GEMMs (backend/cpu/packed.h) against their definition (gemm_packed.h), computed here without the
// kernels, from the format's fields:
//   Q8_0: y[t, r] = fma(float(s_B), d_w B * d_a B, ... fma(float(s_0), d_w 0 * d_a 0, 0)) over the 32-element blocks,
//         s_b the exact integer dot of block b's weight quants with the activation quants;
//   Q4_K: per super-block, acc = fma(float(S), d * d_a, acc) then acc = fma(-float(M), dmin * d_a, acc), S the sum of
//         each sub-block's 6-bit scale times its exact nibble dot, M the sum of each 6-bit min times the sub-block's
//         activation quant sum;
//   Q5_K (AVX2 only): as Q4_K with 5-bit values;
//   IQ4_XS (AVX2 only): acc = fma(float(S), d * d_a, acc), S the sum of each sub-block's ls - 32 times the exact dot
//         of its table values with the activation quants;
//   IQ3_XXS (AVX2 only): 0.25 x (acc = fma(float(S), d * d_a, acc)), S the sum of each sub-block's 2 ls + 1 times the
//         exact dot of its signed grid magnitudes with the activation quants;
//   IQ3_S (AVX2 only): as IQ3_XXS with 9-bit grid indices, stored sign bits and without the 0.25;
//   Q6_K (AVX2 only): acc = fma(float(S), d * d_a, acc), S the sum of each sub-block's int8 scale times its exact dot
//         of (q - 32) with the activation quants;
// where the activation quants are what llama.cpp's reference quantizers give (quantize_row, itself checked against
// llama.cpp in test_quant_interop). Every integer is exact and the float operations are written out in order, so the
// comparison is bit for bit. Also: the matmul gives the same bits for any thread count and token grouping, and views
// of slices and row ranges read the right packed rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backend/cpu/gemm_packed.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/quant_dot.h"
#include "convert/quantize.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "test_util.h"

namespace {

using strata::DType;
using strata::Tensor;
namespace cpu = strata::cpu;

#define SKIP_WITHOUT_AVX512()                                                                        \
    if (cpu::detected_isa() != cpu::Isa::Avx512)                                                     \
    GTEST_SKIP() << "this CPU has no AVX-512 VNNI (detected: " << cpu::isa_name(cpu::detected_isa()) \
                 << "): the packed GEMM is not used here"

std::vector<float> gaussian(int64_t n, std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> g(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = g(rng);
    return v;
}

// A weight of type t and `slices` matrices {n, rows}, quantized from gaussian values (a few rows all zero).
std::vector<uint8_t> weights(DType t, int64_t n, int64_t rows, int64_t slices, std::mt19937& rng) {
    const size_t row_bytes = strata::row_bytes(t, n);
    std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows * slices));
    for (int64_t r = 0; r < rows * slices; ++r) {
        std::vector<float> x = gaussian(n, rng, 0.02f);
        if (r % 7 == 3) std::fill(x.begin(), x.end(), 0.0f);
        strata::quantize_row(t, x.data(), bytes.data() + row_bytes * static_cast<size_t>(r), n);
    }
    return bytes;
}

// The definitions above, for one weight row and one quantized activation row.
float defined_dot_q8_0(const strata::BlockQ8_0* w, const strata::BlockQ8_0* a, int64_t n_blocks) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += int32_t{w[b].qs[j]} * int32_t{a[b].qs[j]};
        const float scale = strata::f16_to_f32(w[b].d) * strata::f16_to_f32(a[b].d);
        acc = std::fma(static_cast<float>(s), scale, acc);
    }
    return acc;
}

// Q4_K, and Q5_K (AVX2 only: the same with bit j of qh[l] as value l's fifth bit in sub-block j).
template <typename Block>
float defined_dot_q4_k(const Block* w, const strata::BlockQ8_K* a, int64_t n_blocks) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t scaled = 0, mins = 0;
        for (int j = 0; j < 8; ++j) {
            uint8_t scale = 0, min = 0;
            strata::quant::unpack_scale_min_k4(w[b].scales, j, &scale, &min);
            int32_t dot = 0, sum = 0;
            for (int l = 0; l < 32; ++l) {
                int q = (w[b].qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
                if constexpr (std::is_same_v<Block, strata::BlockQ5_K>) q |= ((w[b].qh[l] >> j) & 1) << 4;
                dot += q * a[b].qs[32 * j + l];
                sum += a[b].qs[32 * j + l];
            }
            scaled += scale * dot;
            mins += min * sum;
        }
        acc = std::fma(static_cast<float>(scaled), strata::f16_to_f32(w[b].d) * a[b].d, acc);
        acc = std::fma(-static_cast<float>(mins), strata::f16_to_f32(w[b].dmin) * a[b].d, acc);
    }
    return acc;
}

// The k-quant and i-quant GEMMs below (AVX2 only) share one definition: per super-block acc = fma(float(S), d * d_a,
// acc), S the exact int32 sum over its n_sub sub-blocks j of sub_block(w, a, j) (the sub-block's scale times the exact
// dot of its values with the activation quants).
template <typename Block, typename SubBlock>
float defined_superblock_dot(const Block* w, const strata::BlockQ8_K* a, int64_t n_blocks, int n_sub,
                             SubBlock sub_block) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t scaled = 0;
        for (int j = 0; j < n_sub; ++j) scaled += sub_block(w[b], a[b], j);
        acc = std::fma(static_cast<float>(scaled), strata::f16_to_f32(w[b].d) * a[b].d, acc);
    }
    return acc;
}

// Q6_K: 16 sub-blocks, the int8 scale times the dot of (q - 32), q the 6-bit value from ql's nibble and qh's 2 bits.
float defined_dot_q6_k(const strata::BlockQ6_K* w, const strata::BlockQ8_K* a, int64_t n_blocks) {
    return defined_superblock_dot(
        w, a, n_blocks, 16, [](const strata::BlockQ6_K& blk, const strata::BlockQ8_K& act, int j) {
            int32_t dot = 0;
            for (int l = 0; l < 16; ++l) {
                const int v = 16 * j + l, half = v / 128, quarter = (v % 128) / 32, pos = v % 32;
                const int low = (blk.ql[64 * half + 32 * (quarter % 2) + pos] >> (4 * (quarter / 2))) & 0xF;
                const int high = (blk.qh[32 * half + pos] >> (2 * quarter)) & 3;
                dot += ((low | high << 4) - 32) * act.qs[v];
            }
            return blk.scales[j] * dot;
        });
}

// IQ4_XS: 8 sub-blocks, ls - 32 times the dot of the table values.
float defined_dot_iq4_xs(const strata::BlockIQ4_XS* w, const strata::BlockQ8_K* a, int64_t n_blocks) {
    return defined_superblock_dot(
        w, a, n_blocks, 8, [](const strata::BlockIQ4_XS& blk, const strata::BlockQ8_K& act, int j) {
            const int ls = ((blk.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((blk.scales_h >> (2 * j)) & 3) << 4);
            int32_t dot = 0;
            for (int l = 0; l < 32; ++l) {
                const int nibble = (blk.qs[16 * j + l % 16] >> (4 * (l / 16))) & 0xF;
                dot += strata::quant::kIQ4NLValues[nibble] * act.qs[32 * j + l];
            }
            return (ls - 32) * dot;
        });
}

// IQ3_XXS: 8 sub-blocks, 2 ls + 1 times the dot of the signed grid magnitudes; the result 0.25 x acc.
float defined_dot_iq3_xxs(const strata::BlockIQ3_XXS* w, const strata::BlockQ8_K* a, int64_t n_blocks) {
    return 0.25f * defined_superblock_dot(
                       w, a, n_blocks, 8, [](const strata::BlockIQ3_XXS& blk, const strata::BlockQ8_K& act, int j) {
                           uint32_t aux;
                           std::memcpy(&aux, blk.qs + strata::kQK_K / 4 + 4 * j, 4);
                           int32_t dot = 0;
                           for (int l = 0; l < 32; ++l) {
                               const uint32_t grid = strata::quant::kIQ3XXSGrid[blk.qs[8 * j + l / 4]];
                               const int magnitude = static_cast<int>((grid >> (8 * (l % 4))) & 0xFF);
                               const bool negative = (strata::quant::even_signs(aux >> (7 * (l / 8))) >> (l % 8)) & 1;
                               dot += (negative ? -magnitude : magnitude) * act.qs[32 * j + l];
                           }
                           return static_cast<int32_t>(2 * (aux >> 28) + 1) * dot;
                       });
}

// IQ3_S: as IQ3_XXS with the 9-bit index qs | qh bit << 8, the stored sign bits and no 0.25.
float defined_dot_iq3_s(const strata::BlockIQ3_S* w, const strata::BlockQ8_K* a, int64_t n_blocks) {
    return defined_superblock_dot(
        w, a, n_blocks, 8, [](const strata::BlockIQ3_S& blk, const strata::BlockQ8_K& act, int j) {
            int32_t dot = 0;
            for (int l = 0; l < 32; ++l) {
                const int k = l / 4;
                const uint32_t grid = strata::quant::kIQ3SGrid[blk.qs[8 * j + k] | (((blk.qh[j] >> k) & 1) << 8)];
                const int magnitude = static_cast<int>((grid >> (8 * (l % 4))) & 0xFF);
                const bool negative = (blk.signs[4 * j + l / 8] >> (l % 8)) & 1;
                dot += (negative ? -magnitude : magnitude) * act.qs[32 * j + l];
            }
            return (2 * ((blk.scales[j / 2] >> (4 * (j % 2))) & 0xF) + 1) * dot;
        });
}

std::vector<float> defined_matmul(const Tensor& w, const float* x, int64_t n_tokens) {
    const int64_t n = w.ne[0], rows = w.ne[1];
    const DType act = cpu::activation_type(w.type);
    std::vector<uint8_t> q(strata::row_bytes(act, n));
    std::vector<float> y(static_cast<size_t>(rows * n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {
        strata::quantize_row(act, x + t * n, q.data(), n);
        for (int64_t r = 0; r < rows; ++r) {
            float& out = y[static_cast<size_t>(t * rows + r)];
            if (w.type == DType::Q8_0) {
                out = defined_dot_q8_0(reinterpret_cast<const strata::BlockQ8_0*>(w.row(r)),
                                       reinterpret_cast<const strata::BlockQ8_0*>(q.data()), n / 32);
            } else if (w.type == DType::Q4_K) {
                out = defined_dot_q4_k(reinterpret_cast<const strata::BlockQ4_K*>(w.row(r)),
                                       reinterpret_cast<const strata::BlockQ8_K*>(q.data()), n / strata::kQK_K);
            } else if (w.type == DType::IQ3_S) {
                out = defined_dot_iq3_s(reinterpret_cast<const strata::BlockIQ3_S*>(w.row(r)),
                                        reinterpret_cast<const strata::BlockQ8_K*>(q.data()), n / strata::kQK_K);
            } else if (w.type == DType::IQ3_XXS) {
                out = defined_dot_iq3_xxs(reinterpret_cast<const strata::BlockIQ3_XXS*>(w.row(r)),
                                          reinterpret_cast<const strata::BlockQ8_K*>(q.data()), n / strata::kQK_K);
            } else if (w.type == DType::IQ4_XS) {
                out = defined_dot_iq4_xs(reinterpret_cast<const strata::BlockIQ4_XS*>(w.row(r)),
                                         reinterpret_cast<const strata::BlockQ8_K*>(q.data()), n / strata::kQK_K);
            } else if (w.type == DType::Q5_K) {
                out = defined_dot_q4_k(reinterpret_cast<const strata::BlockQ5_K*>(w.row(r)),
                                       reinterpret_cast<const strata::BlockQ8_K*>(q.data()), n / strata::kQK_K);
            } else {
                out = defined_dot_q6_k(reinterpret_cast<const strata::BlockQ6_K*>(w.row(r)),
                                       reinterpret_cast<const strata::BlockQ8_K*>(q.data()), n / strata::kQK_K);
            }
        }
    }
    return y;
}

::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
    if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
    for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
            return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs " << want[i];
    return ::testing::AssertionSuccess();
}

strata::ThreadPool* pool_of(int threads) {
    static strata::ThreadPool pool2(2), pool3(3);
    return threads <= 1 ? nullptr : threads == 2 ? &pool2 : &pool3;
}

// cpu::matmul of `total` tokens of x, `per_call` tokens a call (the last takes what is left) on `threads` threads: each
// token's rows, token after token.
std::vector<float> matmul_in_calls(const Tensor& w, const std::vector<float>& x, int64_t total, int64_t per_call,
                                   int threads) {
    const int64_t n = w.ne[0], rows = w.ne[1];
    std::vector<float> got;
    for (int64_t t0 = 0; t0 < total; t0 += per_call) {
        const int64_t count = std::min(per_call, total - t0);
        std::vector<float> y(static_cast<size_t>(rows * count));
        cpu::matmul({.w = w, .x = x.data() + t0 * n, .y = y.data(), .n_tokens = count, .pool = pool_of(threads)});
        got.insert(got.end(), y.begin(), y.end());
    }
    return got;
}

// The AVX-512 and AVX2 quantizers where the CPU has them, and the portable ones.
template <typename Fn>
std::vector<Fn> quantizers(Fn avx512, Fn avx2, Fn portable) {
    std::vector<Fn> fns{portable};
    if (cpu::supports_isa(cpu::Isa::Avx2)) fns.push_back(avx2);
    if (cpu::supports_isa(cpu::Isa::Avx512)) fns.push_back(avx512);
    return fns;
}

TEST(PackedGemm, BiasedActivationsAreTheReferenceQuantsPlus128) {
    std::mt19937 rng(1);
    for (auto quantize :
         quantizers(cpu::quantize_q8_0_biased, cpu::quantize_q8_0_biased_avx2, cpu::quantize_q8_0_biased_portable))
        for (int64_t n : {32, 96, 4096}) {
            std::vector<float> x = gaussian(n, rng);
            x[static_cast<size_t>(n / 3)] = 40.0f;  // an outlier block
            for (int64_t i = 0; i < 32 && i < n; ++i)
                x[static_cast<size_t>(i)] = (i % 2 ? 1.0f : -1.0f) * 0.5f;  // ties
            if (n > 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);    // a zero block
            std::vector<uint8_t> ref(strata::row_bytes(DType::Q8_0, n));
            strata::quantize_row(DType::Q8_0, x.data(), ref.data(), n);
            std::vector<uint8_t> biased(static_cast<size_t>(n / 32) * cpu::kBiasedBlockBytes);
            quantize(x.data(), biased.data(), n);
            const auto* blocks = reinterpret_cast<const strata::BlockQ8_0*>(ref.data());
            for (int64_t b = 0; b < n / 32; ++b) {
                const uint8_t* got = biased.data() + static_cast<size_t>(b) * cpu::kBiasedBlockBytes;
                for (int j = 0; j < 32; ++j)
                    ASSERT_EQ(got[j], static_cast<uint8_t>(blocks[b].qs[j] + 128)) << "n " << n << " block " << b;
                float d;
                std::memcpy(&d, got + 32, 4);
                ASSERT_EQ(d, strata::f16_to_f32(blocks[b].d)) << "n " << n << " block " << b;
            }
        }
}

// Every packed GEMM: each type on each instruction set that has one (AVX2 alone, AVX2 + AVX-VNNI, AVX-512), the
// matmul held on that set for the whole test.
// What the Q8_0 GEMM with AVX2 alone reads: the reference quants themselves, then the f16 scale as f32.
TEST(PackedGemm, SignedActivationsAreTheReferenceQuants) {
    if (!cpu::supports_isa(cpu::Isa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
    std::mt19937 rng(7);
    for (int64_t n : {32, 4096}) {
        std::vector<float> x = gaussian(n, rng);
        x[static_cast<size_t>(n / 2)] = -40.0f;  // an outlier block
        std::vector<uint8_t> ref(strata::row_bytes(DType::Q8_0, n));
        strata::quantize_row(DType::Q8_0, x.data(), ref.data(), n);
        std::vector<uint8_t> got(static_cast<size_t>(n / 32) * cpu::kBiasedBlockBytes);
        cpu::quantize_q8_0_signed_avx2(x.data(), got.data(), n);
        const auto* blocks = reinterpret_cast<const strata::BlockQ8_0*>(ref.data());
        for (int64_t b = 0; b < n / 32; ++b) {
            const uint8_t* block = got.data() + static_cast<size_t>(b) * cpu::kBiasedBlockBytes;
            ASSERT_EQ(std::memcmp(block, blocks[b].qs, 32), 0) << "n " << n << " block " << b;
            float d;
            std::memcpy(&d, block + 32, 4);
            ASSERT_EQ(d, strata::f16_to_f32(blocks[b].d)) << "n " << n << " block " << b;
        }
    }
}

// What the Q8_0 GEMM with AVX2 alone reads for 8 tokens or more: the reference quants as int16, then the f16 scale as
// f32.
TEST(PackedGemm, I16ActivationsAreTheReferenceQuants) {
    if (!cpu::supports_isa(cpu::Isa::Avx2)) GTEST_SKIP() << "this CPU has no AVX2";
    std::mt19937 rng(9);
    for (int64_t n : {32, 4096}) {
        std::vector<float> x = gaussian(n, rng);
        x[static_cast<size_t>(n / 2)] = -40.0f;  // an outlier block
        std::vector<uint8_t> ref(strata::row_bytes(DType::Q8_0, n));
        strata::quantize_row(DType::Q8_0, x.data(), ref.data(), n);
        std::vector<uint8_t> got(static_cast<size_t>(n / 32) * cpu::kI16BlockBytes);
        cpu::quantize_q8_0_i16_avx2(x.data(), got.data(), n);
        const auto* blocks = reinterpret_cast<const strata::BlockQ8_0*>(ref.data());
        for (int64_t b = 0; b < n / 32; ++b) {
            const uint8_t* block = got.data() + static_cast<size_t>(b) * cpu::kI16BlockBytes;
            for (int i = 0; i < 32; ++i) {
                int16_t q;
                std::memcpy(&q, block + 2 * i, 2);
                ASSERT_EQ(q, blocks[b].qs[i]) << "n " << n << " block " << b << " quant " << i;
            }
            float d;
            std::memcpy(&d, block + 64, 4);
            ASSERT_EQ(d, strata::f16_to_f32(blocks[b].d)) << "n " << n << " block " << b;
        }
    }
}

class PackedType : public ::testing::TestWithParam<std::tuple<DType, cpu::Isa>> {
  protected:
    void SetUp() override {
        if (!cpu::supports_isa(isa()))
            GTEST_SKIP() << "this CPU has no " << cpu::isa_name(isa())
                         << " (detected: " << cpu::isa_name(cpu::detected_isa()) << ")";
        cpu::override_active_isa(isa());
    }
    void TearDown() override { cpu::override_active_isa(std::nullopt); }
    DType type() const { return std::get<0>(GetParam()); }
    cpu::Isa isa() const { return std::get<1>(GetParam()); }
    int64_t block() const { return strata::traits(type()).block_size; }
};

TEST_P(PackedType, MatmulEqualsTheDefinitionForAnyThreadsAndGrouping) {
    const DType type = this->type();
    std::mt19937 rng(2);
    cpu::PackedWeights packer;
    // Row counts below, at and around the 16-row group; block counts 1, odd, and a model's width.
    const int64_t B = block();
    const std::pair<int64_t, int64_t> shapes[] = {{B, 1},      {3 * B, 15}, {2 * B, 16},
                                                  {5 * B, 17}, {1024, 40},  {9 * B, 100}};
    for (const auto& [n, rows] : shapes) {
        SCOPED_TRACE("W {" + std::to_string(n) + ", " + std::to_string(rows) + "}");
        const std::vector<uint8_t> bytes = weights(type, n, rows, 1, rng);
        const int64_t ne[2] = {n, rows};
        Tensor w = strata::make_tensor("w", type, 2, ne, bytes.data());
        ASSERT_TRUE(packer.pack(w));
        // Five full 8-token tiles and a ragged one; also 1, 3, 7 and 8 per call (plain AVX2's Q8_0 GEMM takes its
        // int16 path from 8 tokens).
        constexpr int64_t kTokens = 45;
        const std::vector<float> x = gaussian(n * kTokens, rng);
        const std::vector<float> want = defined_matmul(w, x.data(), kTokens);
        for (const auto& [tokens, threads] : {std::pair{kTokens, 1},
                                              {kTokens, 2},
                                              {kTokens, 3},
                                              {int64_t{1}, 1},
                                              {int64_t{3}, 2},
                                              {int64_t{7}, 1},
                                              {int64_t{8}, 2}}) {
            const std::vector<float> got = matmul_in_calls(w, x, kTokens, tokens, threads);
            EXPECT_TRUE(same_bits(got, want)) << tokens << " tokens per call on " << threads << " threads";
        }
    }
    EXPECT_GT(packer.bytes(), size_t{0});
}

TEST_P(PackedType, ViewsOfSlicesAndRowRangesReadTheirRows) {
    std::mt19937 rng(3);
    const int64_t n = 2 * block(), rows = 48, slices = 3;
    const std::vector<uint8_t> bytes = weights(type(), n, rows, slices, rng);
    const int64_t ne[3] = {n, rows, slices};
    Tensor w = strata::make_tensor("experts", type(), 3, ne, bytes.data());
    cpu::PackedWeights packer;
    ASSERT_TRUE(packer.pack(w));
    const std::vector<float> x = gaussian(n * 9, rng);
    // Row ranges that start a group get the packed rows; the one at row 8 falls back to the row kernels, which sum
    // in another order, so it is compared with a tolerance.
    for (int64_t slice = 0; slice < slices; ++slice)
        for (const auto& [begin, count] : {std::pair<int64_t, int64_t>{0, 48}, {16, 32}, {32, 5}, {8, 24}}) {
            SCOPED_TRACE("slice " + std::to_string(slice) + " rows " + std::to_string(begin) + "+" +
                         std::to_string(count));
            const Tensor v = cpu::matrix_view(w, slice, begin, count);
            EXPECT_EQ(v.packed != nullptr, begin % cpu::kPackRows == 0);
            Tensor plain = v;
            plain.packed = nullptr;
            const std::vector<float> want = defined_matmul(plain, x.data(), 9);
            std::vector<float> got(static_cast<size_t>(count * 9));
            cpu::matmul({.w = v, .x = x.data(), .y = got.data(), .n_tokens = 9, .pool = pool_of(2)});
            if (v.packed != nullptr) {
                EXPECT_TRUE(same_bits(got, want));
            } else {
                for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])));
            }
        }
}

TEST_P(PackedType, ScalarCodeReadsTheUnpackedRows) {
    std::mt19937 rng(4);
    const int64_t n = 2 * block(), rows = 33;
    const std::vector<uint8_t> bytes = weights(type(), n, rows, 1, rng);
    const int64_t ne[2] = {n, rows};
    Tensor w = strata::make_tensor("w", type(), 2, ne, bytes.data());
    Tensor plain = w;
    cpu::PackedWeights packer;
    ASSERT_TRUE(packer.pack(w));
    const std::vector<float> x = gaussian(n * 4, rng);
    std::vector<float> got(static_cast<size_t>(rows * 4)), want(got.size());
    cpu::override_active_isa(cpu::Isa::Scalar);
    cpu::matmul({.w = w, .x = x.data(), .y = got.data(), .n_tokens = 4});
    cpu::matmul({.w = plain, .x = x.data(), .y = want.data(), .n_tokens = 4});
    cpu::override_active_isa(std::nullopt);
    EXPECT_TRUE(same_bits(got, want));
}

// A type packed for the AVX2 class only (no AVX-512 GEMM): with the matmul on AVX-512 the packed copy is ignored and
// the row kernel reads the format's rows, so the outputs are those of the same weight never packed.
TEST_P(PackedType, Avx512WithoutAGemmReadsTheUnpackedRows) {
    if (cpu::has_packed_gemm(type(), cpu::Isa::Avx512)) GTEST_SKIP() << "AVX-512 has a GEMM for this type";
    if (!cpu::supports_isa(cpu::Isa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512";
    std::mt19937 rng(8);
    const int64_t n = 2 * block(), rows = 33;
    const std::vector<uint8_t> bytes = weights(type(), n, rows, 1, rng);
    const int64_t ne[2] = {n, rows};
    Tensor w = strata::make_tensor("w", type(), 2, ne, bytes.data());
    Tensor plain = w;
    cpu::PackedWeights packer;
    ASSERT_TRUE(packer.pack(w));  // packed on this test's AVX2 flavour
    const std::vector<float> x = gaussian(n * 5, rng);
    std::vector<float> got(static_cast<size_t>(rows * 5)), want(got.size());
    cpu::override_active_isa(cpu::Isa::Avx512);
    cpu::matmul({.w = w, .x = x.data(), .y = got.data(), .n_tokens = 5});
    cpu::matmul({.w = plain, .x = x.data(), .y = want.data(), .n_tokens = 5});
    cpu::override_active_isa(isa());
    EXPECT_TRUE(same_bits(got, want));
}

std::string packed_type_name(const ::testing::TestParamInfo<std::tuple<DType, cpu::Isa>>& param) {
    std::string name =
        std::string(strata::dtype_name(std::get<0>(param.param))) + "_" + cpu::isa_name(std::get<1>(param.param));
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
}

INSTANTIATE_TEST_SUITE_P(Types, PackedType,
                         ::testing::Combine(::testing::Values(DType::Q8_0, DType::Q4_K),
                                            ::testing::Values(cpu::Isa::Avx2, cpu::Isa::Avx2Vnni, cpu::Isa::Avx512)),
                         packed_type_name);
// Types packed for the AVX2 class only.
INSTANTIATE_TEST_SUITE_P(Avx2Types, PackedType,
                         ::testing::Combine(::testing::Values(DType::Q5_K, DType::Q6_K, DType::IQ4_XS, DType::IQ3_XXS,
                                                              DType::IQ3_S),
                                            ::testing::Values(cpu::Isa::Avx2, cpu::Isa::Avx2Vnni)),
                         packed_type_name);

TEST(PackedGemm, Q8KSumsAreTheReferenceQuantsAndTheirSubBlockSums) {
    std::mt19937 rng(5);
    for (auto quantize :
         quantizers(cpu::quantize_q8_k_sums, cpu::quantize_q8_k_sums_avx2, cpu::quantize_q8_k_sums_portable)) {
        const int64_t n = 3 * strata::kQK_K;
        const std::vector<float> x = gaussian(n, rng);
        std::vector<strata::BlockQ8_K> ref(static_cast<size_t>(n / strata::kQK_K));
        strata::quantize_row(DType::Q8_K, x.data(), ref.data(), n);
        std::vector<uint8_t> got(static_cast<size_t>(n / strata::kQK_K) * cpu::kQ8KSumsBlockBytes);
        quantize(x.data(), got.data(), n);
        for (size_t b = 0; b < ref.size(); ++b) {
            const uint8_t* block = got.data() + b * cpu::kQ8KSumsBlockBytes;
            ASSERT_EQ(std::memcmp(block, ref[b].qs, strata::kQK_K), 0) << "block " << b;
            float d;
            std::memcpy(&d, block + strata::kQK_K, 4);
            ASSERT_EQ(d, ref[b].d);
            for (int j = 0; j < 8; ++j) {
                int16_t sum;
                std::memcpy(&sum, block + strata::kQK_K + 4 + 2 * j, 2);
                int want = 0;
                for (int l = 0; l < 32; ++l) want += ref[b].qs[32 * j + l];
                ASSERT_EQ(sum, want) << "block " << b << " sub-block " << j;
            }
        }
    }
}

// IQ2_XS with AVX-512 goes through a row kernel over activations laid out by group (gemm_packed.h), defined as: per
// group of 16 weights the exact dot with the Q8_K quants, one FMA per super-block into the group's lane with the
// scale (2 ls + 1) * d_w * d_a, then the 16 lanes summed in a fixed order, times 1/8.
float defined_dot_iq2_xs(const strata::BlockIQ2_XS* w, const strata::BlockQ8_K* a, int64_t n_blocks) {
    float lane[16] = {};
    for (int64_t b = 0; b < n_blocks; ++b) {
        const float dw = strata::f16_to_f32(w[b].d);
        for (int g = 0; g < 16; ++g) {
            const int ls = (w[b].scales[g / 2] >> (4 * (g % 2))) & 0xF;
            int32_t dot = 0;
            for (int half = 0; half < 2; ++half) {
                const uint16_t q = w[b].qs[2 * g + half];
                const uint64_t grid = strata::quant::kIQ2XSGrid[q & 511];
                const uint8_t signs = strata::quant::even_signs(q >> 9);
                for (int j = 0; j < 8; ++j) {
                    const int v = strata::quant::grid_byte(grid, j) * ((signs >> j) & 1 ? -1 : 1);
                    dot += v * a[b].qs[16 * g + 8 * half + j];
                }
            }
            const float scale = static_cast<float>(2 * ls + 1) * dw;
            lane[g] = std::fma(static_cast<float>(dot), scale * a[b].d, lane[g]);
        }
    }
    for (int width = 8; width >= 1; width /= 2)
        for (int g = 0; g < width; ++g) lane[g] = lane[g] + lane[g + width];
    return 0.125f * lane[0];
}

// Random IQ2_XS blocks of a {n, rows} matrix: every grid index, sign pattern and scale; d finite and small.
std::vector<strata::BlockIQ2_XS> random_iq2_xs_blocks(int64_t n, int64_t rows, std::mt19937& rng) {
    std::vector<strata::BlockIQ2_XS> blocks(static_cast<size_t>(n / strata::kQK_K * rows));
    for (auto& b : blocks) {
        for (auto& q : b.qs) q = static_cast<uint16_t>(rng());
        for (auto& sc : b.scales) sc = static_cast<uint8_t>(rng());
        b.d = strata::f32_to_f16(0.001f + 0.01f * static_cast<float>(rng() % 100) / 100.0f);
    }
    return blocks;
}

// Every row of an IQ2_XS matrix against every token of x quantized to Q8_K, by a written-out definition.
using Iq2XsDefinition = float (*)(const strata::BlockIQ2_XS*, const strata::BlockQ8_K*, int64_t);
std::vector<float> iq2_xs_by_definition(const Tensor& w, const std::vector<float>& x, int64_t tokens,
                                        Iq2XsDefinition defined) {
    const int64_t n = w.ne[0], rows = w.ne[1];
    std::vector<float> want(static_cast<size_t>(rows * tokens));
    std::vector<strata::BlockQ8_K> q(static_cast<size_t>(n / strata::kQK_K));
    for (int64_t t = 0; t < tokens; ++t) {
        strata::quantize_row(DType::Q8_K, x.data() + t * n, q.data(), n);
        for (int64_t r = 0; r < rows; ++r)
            want[static_cast<size_t>(t * rows + r)] =
                defined(reinterpret_cast<const strata::BlockIQ2_XS*>(w.row(r)), q.data(), n / strata::kQK_K);
    }
    return want;
}

TEST(PackedGemm, Iq2XsByGroupEqualsItsDefinitionForAnyThreadsAndGrouping) {
    SKIP_WITHOUT_AVX512();
    std::mt19937 rng(6);
    for (const auto& [n, rows] : {std::pair<int64_t, int64_t>{256, 3}, {768, 17}, {1024, 40}}) {
        SCOPED_TRACE("W {" + std::to_string(n) + ", " + std::to_string(rows) + "}");
        const std::vector<strata::BlockIQ2_XS> blocks = random_iq2_xs_blocks(n, rows, rng);
        const int64_t ne[2] = {n, rows};
        const Tensor w = strata::make_tensor("w", DType::IQ2_XS, 2, ne, blocks.data());
        constexpr int64_t kTokens = 45;
        const std::vector<float> x = gaussian(n * kTokens, rng);
        const std::vector<float> want = iq2_xs_by_definition(w, x, kTokens, defined_dot_iq2_xs);
        for (const auto& [tokens, threads] : {std::pair{kTokens, 1},
                                              {kTokens, 3},
                                              {int64_t{1}, 2},
                                              {int64_t{5}, 1},
                                              {int64_t{9}, 2},
                                              {int64_t{16}, 1}}) {
            const std::vector<float> got = matmul_in_calls(w, x, kTokens, tokens, threads);
            EXPECT_TRUE(same_bits(got, want)) << tokens << " tokens per call on " << threads << " threads";
        }
    }
}

// IQ2_XS with AVX2 (with or without AVX-VNNI): prompts go through 8 decoded rows against up to 64 tokens per call
// (gemm_packed.h), one token through the row kernel; both are defined as: per super-block the exact integer
// S = sum over groups of (2 ls + 1) x the dot of the signed grid magnitudes with the Q8_K quants, one FMA
// acc = fma(float(S), d_w * d_a, acc), and 0.125 x acc at the end.
float defined_dot_iq2_xs_avx2(const strata::BlockIQ2_XS* w, const strata::BlockQ8_K* a, int64_t n_blocks) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t s = 0;
        for (int g = 0; g < 16; ++g) {
            int32_t dot = 0;
            for (int half = 0; half < 2; ++half) {
                const uint16_t q = w[b].qs[2 * g + half];
                const uint64_t grid = strata::quant::kIQ2XSGrid[q & 511];
                const uint8_t signs = strata::quant::even_signs(q >> 9);
                for (int j = 0; j < 8; ++j)
                    dot += strata::quant::grid_byte(grid, j) * ((signs >> j) & 1 ? -1 : 1) *
                           a[b].qs[16 * g + 8 * half + j];
            }
            s += (2 * ((w[b].scales[g / 2] >> (4 * (g % 2))) & 0xF) + 1) * dot;
        }
        acc = std::fma(static_cast<float>(s), strata::f16_to_f32(w[b].d) * a[b].d, acc);
    }
    return 0.125f * acc;
}

TEST(PackedGemm, Iq2XsRows8EqualsItsDefinitionForAnyTokenCountOnAvx2) {
    std::mt19937 rng(8);
    for (const cpu::Isa isa : {cpu::Isa::Avx2, cpu::Isa::Avx2Vnni}) {
        if (!cpu::supports_isa(isa)) continue;
        SCOPED_TRACE(cpu::isa_name(isa));
        // Row counts: under one 8-row block, whole blocks, a ragged last block; 1 and 4 super-blocks.
        for (const auto& [n, rows] : {std::pair<int64_t, int64_t>{256, 3}, {1024, 16}, {256, 67}}) {
            SCOPED_TRACE("W {" + std::to_string(n) + ", " + std::to_string(rows) + "}");
            const std::vector<strata::BlockIQ2_XS> blocks = random_iq2_xs_blocks(n, rows, rng);
            const int64_t ne[2] = {n, rows};
            const Tensor w = strata::make_tensor("w", DType::IQ2_XS, 2, ne, blocks.data());
            constexpr int64_t kTokens = 70;  // past the 64 tokens of one call
            const std::vector<float> x = gaussian(n * kTokens, rng);
            const std::vector<float> want = iq2_xs_by_definition(w, x, kTokens, defined_dot_iq2_xs_avx2);
            cpu::override_active_isa(isa);
            // Every tail of the 8-token (plain) and 4-token (AVX-VNNI) passes, and 1 token (the row kernel).
            for (const auto& [tokens, threads] : {std::pair{kTokens, 1},
                                                  {kTokens, 3},
                                                  {int64_t{1}, 2},
                                                  {int64_t{5}, 1},
                                                  {int64_t{6}, 2},
                                                  {int64_t{7}, 1},
                                                  {int64_t{13}, 2},
                                                  {int64_t{35}, 1}}) {
                const std::vector<float> got = matmul_in_calls(w, x, kTokens, tokens, threads);
                EXPECT_TRUE(same_bits(got, want)) << tokens << " tokens per call on " << threads << " threads";
            }
            cpu::override_active_isa(std::nullopt);
        }
    }
}

// The bundled model quantized (dense matrices Q8_0, experts Q4_K: both packed) and loaded with and without the packed
// copies: the logits agree up to summation order (the same integer products; only the float accumulation differs),
// and with the copies a prompt fed in chunks gives the same bits as fed at once.
TEST(PackedGemm, ModelLogitsMatchTheRowKernelsAndDoNotDependOnChunking) {
    SKIP_WITHOUT_AVX512();
    const strata::testing::TempDir dir;
    const std::string path = dir / "q4_k.gguf";
    strata::quantize_gguf({.in_path = std::string(STRATA_SOURCE_DIR) + "/assets/strata-code-19m.gguf",
                           .out_path = path,
                           .type = "q4_k",
                           .threads = 2});
    std::vector<int32_t> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(static_cast<int32_t>((i * 977 + 13) % 8000));
    auto logits_of = [&](bool repack, int64_t chunk) {
        auto model = strata::load_model(path, {.n_threads = 2, .repack = repack});
        const int64_t V = model->info().n_vocab, T = static_cast<int64_t>(ids.size());
        auto seq = model->new_sequence(T);
        std::vector<float> logits(static_cast<size_t>(T * V));
        for (int64_t t = 0; t < T; t += chunk) {
            const int64_t n = std::min(chunk, T - t);
            model->forward(*seq, std::span<const int32_t>(ids.data() + t, static_cast<size_t>(n)),
                           std::span<float>(logits.data() + t * V, static_cast<size_t>(n * V)), false);
        }
        return logits;
    };
    const std::vector<float> packed = logits_of(true, 40), rows = logits_of(false, 40);
    // The products agree up to summation order (NMSE ~1e-14), but the model amplifies that where a discrete choice
    // is a near tie (the MoE's top-k): from such a position on, the recurrent state carries a difference of NMSE
    // 1e-5..6e-3 per position. The AVX2 and AVX-512 row kernels, which also differ only in summation order, show the
    // same pattern on other prompts. A wrong product would give NMSE ~1 and unrelated argmaxes.
    const size_t V = packed.size() / ids.size();
    double nmse_sum = 0;
    int same_argmax = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
        double err = 0, ref = 0;
        for (size_t i = t * V; i < (t + 1) * V; ++i) {
            err += (packed[i] - rows[i]) * static_cast<double>(packed[i] - rows[i]);
            ref += static_cast<double>(rows[i]) * rows[i];
        }
        nmse_sum += err / ref;
        const auto argmax = [&](const std::vector<float>& l) {
            return std::max_element(l.begin() + static_cast<std::ptrdiff_t>(t * V),
                                    l.begin() + static_cast<std::ptrdiff_t>((t + 1) * V)) -
                   l.begin();
        };
        same_argmax += argmax(packed) == argmax(rows);
    }
    EXPECT_LT(nmse_sum / static_cast<double>(ids.size()), 1e-3) << "packed vs row kernels, mean NMSE per position";
    EXPECT_GE(same_argmax, 38) << "positions (of 40) with the same argmax";
    // And they differ somewhere: the same bits everywhere would mean the packed copies were never used.
    EXPECT_FALSE(same_bits(packed, rows)) << "the model did not use the packed GEMMs";
    EXPECT_TRUE(same_bits(logits_of(true, 7), packed)) << "chunks of 7 vs one call";
    EXPECT_TRUE(same_bits(logits_of(true, 1), packed)) << "one token at a time vs one call";
}

}  // namespace
