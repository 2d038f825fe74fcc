// The CPU's packed Q8_0 GEMM (backend/cpu/packed.h) against its definition, computed here without the kernel:
//   y[t, r] = fma(float(s_B), d_w B * d_a B, ... fma(float(s_0), d_w 0 * d_a 0, 0))
// over the 32-element blocks b in order, where s_b is the exact integer dot of block b's weight quants with the
// activation quants that llama.cpp's reference quantizer gives (quantize_row, itself checked against llama.cpp in
// test_quant_interop). The products d_w * d_a of two f16 values and the sums s_b (|s_b| < 2^24) are exact in f32, so
// the only rounding is the chain of FMAs, and the comparison is bit for bit. Also: the matmul gives the same bits for
// any thread count and token grouping, and views of slices and row ranges read the right packed rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/gemm_packed.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/quant_dot.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace {

using strata::DType;
using strata::Tensor;
namespace cpu = strata::cpu;

#define SKIP_WITHOUT_AVX512()                                                                                  \
    if (cpu::detected_isa() != cpu::Isa::Avx512)                                                               \
    GTEST_SKIP() << "this CPU has no AVX-512 VNNI (detected: " << cpu::isa_name(cpu::detected_isa())          \
                 << "): the packed GEMM is not used here"

std::vector<float> gaussian(int64_t n, std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> g(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = g(rng);
    return v;
}

// A Q8_0 weight of `slices` matrices {n, rows}, quantized from gaussian values (a few rows all zero).
std::vector<uint8_t> q8_weights(int64_t n, int64_t rows, int64_t slices, std::mt19937& rng) {
    const size_t row_bytes = strata::row_bytes(DType::Q8_0, n);
    std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows * slices));
    for (int64_t r = 0; r < rows * slices; ++r) {
        std::vector<float> x = gaussian(n, rng, 0.02f);
        if (r % 7 == 3) std::fill(x.begin(), x.end(), 0.0f);
        strata::quantize_row(DType::Q8_0, x.data(), bytes.data() + row_bytes * static_cast<size_t>(r), n);
    }
    return bytes;
}

// The definition above, for one weight row and one activation row.
float defined_dot(const strata::BlockQ8_0* w, const strata::BlockQ8_0* a, int64_t n_blocks) {
    float acc = 0.0f;
    for (int64_t b = 0; b < n_blocks; ++b) {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += int32_t{w[b].qs[j]} * int32_t{a[b].qs[j]};
        const float scale = strata::f16_to_f32(w[b].d) * strata::f16_to_f32(a[b].d);
        acc = std::fma(static_cast<float>(s), scale, acc);
    }
    return acc;
}

std::vector<float> defined_matmul(const Tensor& w, const float* x, int64_t n_tokens) {
    const int64_t n = w.ne[0], rows = w.ne[1];
    std::vector<uint8_t> q(strata::row_bytes(DType::Q8_0, n));
    std::vector<float> y(static_cast<size_t>(rows * n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {
        strata::quantize_row(DType::Q8_0, x + t * n, q.data(), n);
        for (int64_t r = 0; r < rows; ++r)
            y[static_cast<size_t>(t * rows + r)] =
                defined_dot(reinterpret_cast<const strata::BlockQ8_0*>(w.row(r)),
                            reinterpret_cast<const strata::BlockQ8_0*>(q.data()), n / 32);
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

TEST(PackedGemm, BiasedActivationsAreTheReferenceQuantsPlus128) {
    SKIP_WITHOUT_AVX512();
    std::mt19937 rng(1);
    for (int64_t n : {32, 96, 4096}) {
        std::vector<float> x = gaussian(n, rng);
        x[static_cast<size_t>(n / 3)] = 40.0f;  // an outlier block
        for (int64_t i = 0; i < 32 && i < n; ++i) x[static_cast<size_t>(i)] = (i % 2 ? 1.0f : -1.0f) * 0.5f;  // ties
        if (n > 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // a zero block
        std::vector<uint8_t> ref(strata::row_bytes(DType::Q8_0, n));
        strata::quantize_row(DType::Q8_0, x.data(), ref.data(), n);
        std::vector<uint8_t> biased(static_cast<size_t>(n / 32) * cpu::kBiasedBlockBytes);
        cpu::quantize_q8_0_biased(x.data(), biased.data(), n);
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

TEST(PackedGemm, MatmulEqualsTheDefinitionForAnyThreadsAndGrouping) {
    SKIP_WITHOUT_AVX512();
    std::mt19937 rng(2);
    cpu::PackedWeights packer;
    // Row counts below, at and around the 16-row group; block counts 1, odd, and a model's width.
    const std::pair<int64_t, int64_t> shapes[] = {{32, 1}, {96, 15}, {64, 16}, {160, 17}, {1024, 40}, {288, 100}};
    for (const auto& [n, rows] : shapes) {
        SCOPED_TRACE("W {" + std::to_string(n) + ", " + std::to_string(rows) + "}");
        const std::vector<uint8_t> bytes = q8_weights(n, rows, 1, rng);
        const int64_t ne[2] = {n, rows};
        Tensor w = strata::make_tensor("w", DType::Q8_0, 2, ne, bytes.data());
        ASSERT_TRUE(packer.pack(w));
        constexpr int64_t kTokens = 19;  // two full 8-token tiles and a ragged one
        const std::vector<float> x = gaussian(n * kTokens, rng);
        const std::vector<float> want = defined_matmul(w, x.data(), kTokens);
        for (const auto& [tokens, threads] : {std::pair{kTokens, 1}, {kTokens, 2}, {kTokens, 3}, {int64_t{1}, 1}}) {
            std::vector<float> got;
            for (int64_t t0 = 0; t0 < kTokens; t0 += tokens) {
                std::vector<float> y(static_cast<size_t>(rows * tokens));
                cpu::matmul({.w = w, .x = x.data() + t0 * n, .y = y.data(), .n_tokens = tokens,
                             .pool = pool_of(threads)});
                got.insert(got.end(), y.begin(), y.end());
            }
            EXPECT_TRUE(same_bits(got, want)) << tokens << " tokens per call on " << threads << " threads";
        }
    }
    EXPECT_GT(packer.bytes(), size_t{0});
}

TEST(PackedGemm, ViewsOfSlicesAndRowRangesReadTheirRows) {
    SKIP_WITHOUT_AVX512();
    std::mt19937 rng(3);
    const int64_t n = 128, rows = 48, slices = 3;
    const std::vector<uint8_t> bytes = q8_weights(n, rows, slices, rng);
    const int64_t ne[3] = {n, rows, slices};
    Tensor w = strata::make_tensor("experts", DType::Q8_0, 3, ne, bytes.data());
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

TEST(PackedGemm, AnotherInstructionSetReadsTheUnpackedRows) {
    SKIP_WITHOUT_AVX512();
    std::mt19937 rng(4);
    const int64_t n = 256, rows = 33;
    const std::vector<uint8_t> bytes = q8_weights(n, rows, 1, rng);
    const int64_t ne[2] = {n, rows};
    Tensor w = strata::make_tensor("w", DType::Q8_0, 2, ne, bytes.data());
    Tensor plain = w;
    cpu::PackedWeights packer;
    ASSERT_TRUE(packer.pack(w));
    const std::vector<float> x = gaussian(n * 4, rng);
    std::vector<float> got(static_cast<size_t>(rows * 4)), want(got.size());
    cpu::override_active_isa(cpu::Isa::Avx2);
    cpu::matmul({.w = w, .x = x.data(), .y = got.data(), .n_tokens = 4});
    cpu::matmul({.w = plain, .x = x.data(), .y = want.data(), .n_tokens = 4});
    cpu::override_active_isa(std::nullopt);
    EXPECT_TRUE(same_bits(got, want));
}

}  // namespace
