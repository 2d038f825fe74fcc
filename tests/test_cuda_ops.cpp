// CUDA op parity (issue 7): the CUDA matrix products against the CPU reference cpu::matmul on the same weights, for
// every weight type the CPU backend computes, odd shapes (row counts that fill no warp, row lengths of 1, 3 and 17+
// blocks) and 1..8 tokens (the matvec kernels) plus 40; and the GEMM path (more than 8 tokens: the tensor-core GEMM for
// quant weights, an f32 GEMM for float weights) at 9..300 tokens, rows that fill no tile and K from 256 to 4,352,
// with split-K. The gathered products of the MoE layer (each pair of a token and an expert reads its expert's matrix
// through an id on the device) for every type, at row lengths of whole chunks, of a part of one, and (float types) of
// lengths 16 does not divide. Also the device memory accountant and the backend's error messages.
//
// Without the CUDA backend compiled in (-DSTRATA_CUDA=ON) or without a GPU, every test skips with a message saying
// so (CI has neither). STRATA_CUDA_PERF=1 adds timing runs: GB/s of decode-sized matrix-vector products per weight
// type next to the device-to-device copy bandwidth measured in the same run (the roofline), and TFLOP/s of the GEMM
// path at prompt-window shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/tensor.h"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/internal.h"
#include "cuda_test_util.h"
#endif

namespace strata {
void PrintTo(DType t, std::ostream* os) {
    *os << dtype_name(t);
}
}  // namespace strata

namespace {

using strata::DType;

#if !STRATA_HAS_CUDA

TEST(CudaOps, SkippedWithoutTheBackend) {
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): CUDA op tests skipped";
}

#else

namespace cuda = strata::cuda;
namespace cpu = strata::cpu;
using namespace strata::cuda_test;
constexpr const char* kDeviceTests = "CUDA op tests";

const DType kWeightTypes[] = {DType::F32,    DType::F16,    DType::BF16,    DType::Q8_0,  DType::Q4_0,  DType::Q2_K,
                              DType::Q3_K,   DType::Q4_K,   DType::Q5_K,    DType::Q6_K,  DType::IQ4_NL, DType::IQ4_XS,
                              DType::IQ2_XS, DType::IQ3_XXS, DType::IQ3_S,  DType::IQ1_M};

// NMSE = sum (gpu - cpu)^2 / sum cpu^2 over all outputs of one (type, shape, tokens) case.
//
// Both sides compute the same products of the same numbers: the device quantizes the activations with the CPU's own
// rules (Q8_0: f16 scale, roundf; Q8_K: -127 / signed max, nearest_int), the integer dot of a 16-weight piece is
// exact on both, and what differs is only the order (and grouping of the scale products) in which f32 adds the
// per-piece terms, and for float weights at more than 8 tokens the f32 GEMM. Rounding
// in a different order is a random walk of relative steps of 2^-24 ~ 6e-8: over N terms of random sign the relative
// error of a dot is about 6e-8 * sqrt(N) / sqrt(N) of the typical term, an NMSE near 1e-14 .. 1e-12 for these rows.
// 1e-9 leaves orders of headroom, while one activation value quantized differently (off by one step in a 256-block)
// already costs ~1e-8 and one misread block of 16 weights in the shortest rows ~1/16.
constexpr double kReassociationNmse = 1e-9;

// The tensor-core GEMM (quant weights, more than 8 tokens) multiplies fp16 roundings of the same weights and quantized
// activations: each of the two factors of a term carries a relative error of at most 2^-11 (rms ~2^-11 / sqrt(3) over
// a spread of mantissas), so the NMSE is ~1e-7 and any single output is off by ~3e-4 of the outputs' rms (the error
// of a dot of random-sign terms scales like the dot). Bounds with 10x / 30x headroom; a wrong or missed weight piece
// of 16 in the longest rows (4,352) already moves its outputs by ~6% of the rms, and a wrong tile or edge by ~100%.
constexpr double kFp16Nmse = 1e-6;
constexpr double kFp16WorstOverRms = 1e-2;


int64_t block_of(DType t) {
    return strata::traits(t).block_size;
}

bool is_float(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

bool takes_tensor_core_gemm(DType t, int64_t tokens) {
    return tokens > strata::cuda::kMaxMatvecTokens && !is_float(t);
}

// Row lengths: 1, 3 and 17+ blocks (a chunk of the kernel is 1,024 quant weights or 512 float weights, so the last
// one also spans several chunks with a partial tail); float rows also get one that is no multiple of 16.
std::vector<int64_t> row_lengths(DType t) {
    if (is_float(t)) return {48, 1000, 4112};
    const int64_t b = block_of(t);
    return b == 32 ? std::vector<int64_t>{96, 800, 4128} : std::vector<int64_t>{256, 768, 4352};
}

constexpr int64_t kTokenCounts[] = {1, 2, 3, 4, 5, 6, 7, 8, 40};
// Rows: none fills the 4 warps x 2 rows of a thread block evenly; 1 is the smallest.
constexpr int64_t kRowCounts[] = {67, 1, 130};

struct Outcome {
    double nmse = 0;
    int64_t unwritten = 0;   // outputs still holding the poison
    int64_t non_finite = 0;  // NaN or inf among the written outputs
    int64_t clobbered = 0;   // sentinels after the output that changed
    double worst_over_rms = 0;  // max |gpu - cpu| / rms(cpu)
    bool same_on_rerun = true;  // a second call gave the same bits (only checked when asked)
};

constexpr int64_t kSentinels = 64;  // values after an output that must stay poison

Outcome compare_outputs(const std::vector<float>& got, const std::vector<float>& ref);

Outcome run_case(DType t, const std::vector<uint8_t>& w, int64_t rows, int64_t in, int64_t tokens, std::mt19937& rng,
                 bool rerun = false) {
    std::vector<float> x(static_cast<size_t>(tokens * in));
    std::normal_distribution<float> gauss;
    for (float& v : x) v = gauss(rng);

    std::vector<float> ref(static_cast<size_t>(tokens * rows));
    const strata::Tensor host_w = matrix(t, in, rows, w.data(), strata::Device::Host);
    cpu::matmul({.w = host_w, .x = x.data(), .y = ref.data(), .n_tokens = tokens});

    cuda::Context& ctx = context();
    const cuda::DeviceBuffer dw = ctx.upload(w.data(), w.size(), "weights");
    const cuda::DeviceBuffer dx = ctx.upload(x.data(), x.size() * 4, "activations");
    const std::vector<float> poisoned(ref.size() + kSentinels, poison());
    const cuda::DeviceBuffer dy = ctx.upload(poisoned.data(), poisoned.size() * 4, "outputs");
    const strata::Tensor dev_w = matrix(t, in, rows, dw.data(), strata::Device::Cuda);
    cuda::matmul(ctx, {.w = dev_w, .x = dx.as<float>(), .y = dy.as<float>(), .n_tokens = tokens});
    std::vector<float> got(poisoned.size());
    ctx.download(dy.data(), got.data(), got.size() * 4);

    Outcome o = compare_outputs(got, ref);
    if (rerun) {
        cuda::matmul(ctx, {.w = dev_w, .x = dx.as<float>(), .y = dy.as<float>(), .n_tokens = tokens});
        std::vector<float> again(ref.size());
        ctx.download(dy.data(), again.data(), again.size() * 4);
        o.same_on_rerun = std::memcmp(again.data(), got.data(), again.size() * 4) == 0;
    }
    return o;
}

// The outputs got (ref.size() values, then kSentinels that must still hold the poison) against ref.
Outcome compare_outputs(const std::vector<float>& got, const std::vector<float>& ref) {
    Outcome o;
    double worst_abs = 0;
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (is_poison(got[i])) {
            ++o.unwritten;
            continue;
        }
        if (!std::isfinite(got[i])) {
            ++o.non_finite;
            continue;
        }
        err2 += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
        ref2 += static_cast<double>(ref[i]) * ref[i];
        worst_abs = std::max(worst_abs, std::fabs(static_cast<double>(got[i]) - ref[i]));
    }
    for (size_t i = ref.size(); i < got.size(); ++i) o.clobbered += !is_poison(got[i]);
    o.nmse = ref2 > 0 ? err2 / ref2 : err2;
    const double rms = std::sqrt(ref2 / static_cast<double>(ref.size()));
    o.worst_over_rms = rms > 0 ? worst_abs / rms : worst_abs;
    return o;
}

// ---- parity ---------------------------------------------------------------------------------------------------------

class CudaMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CudaMatmul, MatchesTheCpuReference) {
    SKIP_WITHOUT_DEVICE();
    const DType t = GetParam();
    std::mt19937 rng(1234 + static_cast<unsigned>(t));
    const std::vector<int64_t> lengths = row_lengths(t);
    double worst = 0;
    for (size_t s = 0; s < lengths.size(); ++s) {
        const int64_t in = lengths[s], rows = kRowCounts[s];
        const std::vector<uint8_t> w = random_weights(t, rows, in, rng);
        for (const int64_t tokens : kTokenCounts) {
            const Outcome o = run_case(t, w, rows, in, tokens, rng);
            SCOPED_TRACE(std::string(strata::dtype_name(t)) + " rows " + std::to_string(rows) + " in " +
                         std::to_string(in) + " tokens " + std::to_string(tokens));
            EXPECT_EQ(o.unwritten, 0);
            EXPECT_EQ(o.non_finite, 0);
            EXPECT_EQ(o.clobbered, 0);
            if (takes_tensor_core_gemm(t, tokens)) {
                EXPECT_LE(o.nmse, kFp16Nmse);
                EXPECT_LE(o.worst_over_rms, kFp16WorstOverRms);
            } else {
                EXPECT_LE(o.nmse, kReassociationNmse);
                worst = std::max(worst, o.nmse);
            }
        }
    }
    std::printf("[ cuda     ] %-8s worst NMSE against cpu::matmul %.3g (threshold %.0g; tensor-core GEMM cases: "
                "GemmPath)\n",
                strata::dtype_name(t), worst, kReassociationNmse);
}

// The GEMM path (more than 8 tokens) for every type: token counts that fill no tile of 64 or 128 tokens (9, 100, 300)
// and one that does (64); from 256 (cuda::kBlasMinTokens) quant weights go to cuBLAS on their fp16 dequantization; rows that fill no tile of 128 (300, 130); a short K (320 quant weights a row, 256 for the
// super-block types, 1,000 float) with one k tile split, and a long one (4,128 / 4,352 / 4,112) that small tile
// counts split over up to 8 blocks. Every case runs twice: split-K must add its partial sums in a fixed order.
TEST_P(CudaMatmul, GemmPathMatchesTheCpuReference) {
    SKIP_WITHOUT_DEVICE();
    const DType t = GetParam();
    std::mt19937 rng(4321 + static_cast<unsigned>(t));
    const int64_t b = block_of(t);
    const int64_t short_k = is_float(t) ? 1000 : b == 32 ? 320 : 256;
    const int64_t long_k = is_float(t) ? 4112 : b == 32 ? 4128 : 4352;
    const struct {
        int64_t in, rows;
    } shapes[] = {{short_k, 300}, {long_k, 130}};
    double worst_nmse = 0, worst_over_rms = 0;
    for (const auto& shape : shapes) {
        const std::vector<uint8_t> w = random_weights(t, shape.rows, shape.in, rng);
        for (const int64_t tokens : {9, 64, 100, 256, 300}) {
            const Outcome o = run_case(t, w, shape.rows, shape.in, tokens, rng, /*rerun=*/true);
            SCOPED_TRACE(std::string(strata::dtype_name(t)) + " rows " + std::to_string(shape.rows) + " in " +
                         std::to_string(shape.in) + " tokens " + std::to_string(tokens));
            EXPECT_EQ(o.unwritten, 0);
            EXPECT_EQ(o.non_finite, 0);
            EXPECT_EQ(o.clobbered, 0);
            EXPECT_TRUE(o.same_on_rerun);
            EXPECT_LE(o.nmse, is_float(t) ? kReassociationNmse : kFp16Nmse);
            if (!is_float(t)) {
                EXPECT_LE(o.worst_over_rms, kFp16WorstOverRms);
            }
            worst_nmse = std::max(worst_nmse, o.nmse);
            worst_over_rms = std::max(worst_over_rms, o.worst_over_rms);
        }
    }
    std::printf("[ cuda     ] %-8s GEMM path: worst NMSE against cpu::matmul %.3g (threshold %.0g), worst |error| / rms "
                "%.3g (threshold %.0g)\n",
                strata::dtype_name(t), worst_nmse, is_float(t) ? kReassociationNmse : kFp16Nmse, worst_over_rms,
                is_float(t) ? 0.0 : kFp16WorstOverRms);
}

// matmul_shared_input over a window long enough for cuBLAS: the outputs that share the activation format share one
// quantized fp16 copy of x, and each must be the bits matmul gives alone (outputs of another format, and the GEMM
// path's window of 100 tokens, go through matmul one by one).
TEST_P(CudaMatmul, SharedInputProductsEqualSeparateProducts) {
    SKIP_WITHOUT_DEVICE();
    const DType t = GetParam();
    if (is_float(t)) GTEST_SKIP() << "float weights take the f32 GEMM whatever the window";
    std::mt19937 rng(777 + static_cast<unsigned>(t));
    const int64_t in = block_of(t) == 32 ? 320 : 256;
    const int64_t rows[] = {300, 4, 67};
    cuda::Context& ctx = context();
    std::vector<cuda::DeviceBuffer> weights;
    std::vector<strata::Tensor> dev_w;
    for (const int64_t r : rows) {
        const std::vector<uint8_t> w = random_weights(t, r, in, rng);
        weights.push_back(ctx.upload(w.data(), w.size(), "weights"));
        dev_w.push_back(matrix(t, in, r, weights.back().data(), strata::Device::Cuda));
    }
    // A Q8_0 matrix too: beside a type that reads Q8_K activations, two formats, so no shared copy.
    const std::vector<uint8_t> w8 = random_weights(DType::Q8_0, 40, in, rng);
    const cuda::DeviceBuffer dw8 = ctx.upload(w8.data(), w8.size(), "weights");
    const strata::Tensor q8 = matrix(DType::Q8_0, in, 40, dw8.data(), strata::Device::Cuda);
    for (const int64_t tokens : {100, 300}) {
        std::vector<float> x(static_cast<size_t>(tokens * in));
        std::normal_distribution<float> gauss;
        for (float& v : x) v = gauss(rng);
        const cuda::DeviceBuffer dx = ctx.upload(x.data(), x.size() * 4, "activations");
        auto out = [&](int64_t r) { return ctx.allocate(static_cast<size_t>(tokens * r) * 4, "outputs"); };
        const cuda::DeviceBuffer a0 = out(rows[0]), a1 = out(rows[1]), a2 = out(rows[2]), a3 = out(40);
        const cuda::DeviceBuffer b0 = out(rows[0]), b1 = out(rows[1]), b2 = out(rows[2]), b3 = out(40);
        cuda::matmul_shared_input(ctx, dx.as<float>(), tokens,
                                  {{&dev_w[0], a0.as<float>()},
                                   {&dev_w[1], a1.as<float>()},
                                   {&dev_w[2], a2.as<float>()},
                                   {&q8, a3.as<float>()}});
        const cuda::DeviceBuffer* alone[] = {&b0, &b1, &b2};
        for (size_t i = 0; i < 3; ++i)
            cuda::matmul(ctx, {.w = dev_w[i], .x = dx.as<float>(), .y = alone[i]->as<float>(), .n_tokens = tokens});
        cuda::matmul(ctx, {.w = q8, .x = dx.as<float>(), .y = b3.as<float>(), .n_tokens = tokens});
        const cuda::DeviceBuffer* shared[] = {&a0, &a1, &a2, &a3};
        const cuda::DeviceBuffer* separate[] = {&b0, &b1, &b2, &b3};
        for (size_t i = 0; i < 4; ++i) {
            std::vector<float> got(shared[i]->size() / 4), want(got.size());
            ctx.download(shared[i]->data(), got.data(), got.size() * 4);
            ctx.download(separate[i]->data(), want.data(), want.size() * 4);
            EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
                << strata::dtype_name(t) << " output " << i << ", " << tokens << " tokens";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CudaMatmul, ::testing::ValuesIn(kWeightTypes),
                         [](const ::testing::TestParamInfo<DType>& param_info) {
                             return std::string(strata::dtype_name(param_info.param));
                         });

// Runs 8 tokens, then 3, then each token alone: every token's outputs must be the same bits each time.
void expect_tokens_independent_of_the_batch(DType t, const std::vector<uint8_t>& w, int64_t rows, int64_t in,
                                            std::mt19937& rng) {
    std::vector<float> x(static_cast<size_t>(cuda::kMaxMatvecTokens * in));
    std::normal_distribution<float> gauss;
    for (float& v : x) v = gauss(rng);
    cuda::Context& ctx = context();
    const cuda::DeviceBuffer dw = ctx.upload(w.data(), w.size(), "weights");
    const cuda::DeviceBuffer dx = ctx.upload(x.data(), x.size() * 4, "activations");
    const cuda::DeviceBuffer dy = ctx.allocate(static_cast<size_t>(cuda::kMaxMatvecTokens * rows) * 4, "outputs");
    const strata::Tensor dev_w = matrix(t, in, rows, dw.data(), strata::Device::Cuda);
    auto run = [&](int64_t first, int64_t tokens) {
        cuda::matmul(ctx, {.w = dev_w, .x = dx.as<float>() + first * in, .y = dy.as<float>(), .n_tokens = tokens});
        std::vector<float> y(static_cast<size_t>(tokens * rows));
        ctx.download(dy.data(), y.data(), y.size() * 4);
        return y;
    };
    const std::vector<float> batch8 = run(0, cuda::kMaxMatvecTokens), batch3 = run(0, 3);
    for (int64_t k = 0; k < cuda::kMaxMatvecTokens; ++k) {
        const std::vector<float> alone = run(k, 1);
        EXPECT_EQ(std::memcmp(alone.data(), batch8.data() + k * rows, alone.size() * 4), 0) << "token " << k << " of 8";
        if (k < 3) {
            EXPECT_EQ(std::memcmp(alone.data(), batch3.data() + k * rows, alone.size() * 4), 0) << "token " << k << " of 3";
        }
    }
}

// A token's outputs must not depend on how many tokens share the call (1..8: the matvec kernels), bit for bit: each
// (row, token) sum is formed in the same order whatever the batch (the rows per warp and the row split depend on the
// shape only), which is what lets prefill, token-by-token decode and chunked prompts agree later.
TEST_P(CudaMatmul, TokenResultsDoNotDependOnTheBatch) {
    SKIP_WITHOUT_DEVICE();
    const DType t = GetParam();
    std::mt19937 rng(99 + static_cast<unsigned>(t));
    const int64_t in = row_lengths(t)[2], rows = kRowCounts[0];
    expect_tokens_independent_of_the_batch(t, random_weights(t, rows, in, rng), rows, in, rng);
}

// `period` distinct quantized rows tiled over a rows x in matrix: realistic bytes without quantizing tens of millions
// of weights.
std::vector<uint8_t> tiled_weights(DType t, int64_t rows, int64_t in, std::mt19937& rng, int64_t period = 32) {
    const std::vector<uint8_t> pattern = random_weights(t, period, in, rng);
    const size_t rb = strata::row_bytes(t, in);
    std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(w.data() + rb * static_cast<size_t>(r), pattern.data() + rb * static_cast<size_t>(r % period), rb);
    return w;
}

// Against cpu::matmul at each token count, then bit for bit across the batch.
void expect_cpu_parity_and_batch(DType t, const std::vector<uint8_t>& w, int64_t rows, int64_t in,
                                 std::initializer_list<int64_t> token_counts, std::mt19937& rng) {
    for (const int64_t tokens : token_counts) {
        const Outcome o = run_case(t, w, rows, in, tokens, rng);
        SCOPED_TRACE(std::string(strata::dtype_name(t)) + " tokens " + std::to_string(tokens));
        EXPECT_EQ(o.unwritten, 0);
        EXPECT_EQ(o.non_finite, 0);
        EXPECT_EQ(o.clobbered, 0);
        EXPECT_LE(o.nmse, kReassociationNmse);
    }
    expect_tokens_independent_of_the_batch(t, w, rows, in, rng);
}

// Many short rows (no longer than a kernel chunk) go 8 to a warp, walked as one span whose chunks cross row
// boundaries (the expert down products' 640 weights a row, the hyper-connection up's 320): 8,197 rows leave the last
// warp a partial span. Against cpu::matmul at 1, 3 and 8 tokens, and bit for bit across the batch.
TEST_P(CudaMatmul, ShortRowsEightToAWarpMatchTheCpuAndTheBatch) {
    SKIP_WITHOUT_DEVICE();
    const DType t = GetParam();
    std::mt19937 rng(77 + static_cast<unsigned>(t));
    const int64_t in = is_float(t) ? 48 : block_of(t) == 32 ? 320 : 256, rows = 8197;
    expect_cpu_parity_and_batch(t, random_weights(t, rows, in, rng), rows, in, {1, 3, 8}, rng);
}

// A long product like an output head (Flash-Next's: 248,320 rows, 4 a warp, ~15,500 blocks in many waves): 65,541
// rows of a little over one chunk (61 distinct rows tiled, so a row mix-up shows), against cpu::matmul at 1 and 2
// tokens, and bit for bit across the batch.
TEST_P(CudaMatmul, LongProductsMatchTheCpuAndTheBatch) {
    SKIP_WITHOUT_DEVICE();
    const DType t = GetParam();
    std::mt19937 rng(55 + static_cast<unsigned>(t));
    const int64_t in = is_float(t) ? 528 : block_of(t) == 32 ? 1056 : 1280, rows = 65541;
    expect_cpu_parity_and_batch(t, tiled_weights(t, rows, in, rng, 61), rows, in, {1, 2}, rng);
}

// Float rows whose length 16 does not divide (a small model's hidden or expert width, and what a quantized conversion
// writes as f16 for rows that hold no whole block): a kernel of their own at 1..8 tokens, the f32 GEMM at 40. Against
// cpu::matmul, and bit for bit across the batch.
TEST(CudaMatmulFloat, RowsOfAnyLengthMatchTheCpuAndTheBatch) {
    SKIP_WITHOUT_DEVICE();
    for (const DType t : {DType::F32, DType::F16, DType::BF16}) {
        std::mt19937 rng(31 + static_cast<unsigned>(t));
        for (const int64_t in : {1, 3, 17, 24, 40, 1000}) {
            for (const int64_t rows : {1, 67, 130}) {
                SCOPED_TRACE(std::string(strata::dtype_name(t)) + " rows " + std::to_string(rows) + " in " +
                             std::to_string(in));
                expect_cpu_parity_and_batch(t, random_weights(t, rows, in, rng), rows, in, {1, 2, 3, 5, 8, 40}, rng);
            }
        }
    }
}

// ---- gathered products (the MoE layer's experts) --------------------------------------------------------------------

// One gathered launch as moe_layer makes them: n_pairs single-token products, pair p with the matrix of expert
// ids[slot] of a stacked {in, rows, n_expert} tensor against activation row slot / pairs_per_row, where slot is p, or
// with two tensors (separate gate and up, the second right after the first) p - slots for the pairs of the second.
struct GatherCase {
    int64_t in, rows, n_expert, act_rows, pairs_per_row;
    bool two_tensors;
};

Outcome run_gather(DType t, const GatherCase& c, std::mt19937& rng) {
    const int64_t slots = c.act_rows * c.pairs_per_row, n_pairs = c.two_tensors ? 2 * slots : slots;
    const int64_t n_tensors = c.two_tensors ? 2 : 1;
    const size_t rb = strata::row_bytes(t, c.in), expert_bytes = rb * static_cast<size_t>(c.rows);
    const size_t tensor_bytes = expert_bytes * static_cast<size_t>(c.n_expert);
    const std::vector<uint8_t> w = random_weights(t, n_tensors * c.n_expert * c.rows, c.in, rng);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.n_expert - 1));
    std::vector<int32_t> ids(static_cast<size_t>(slots));
    for (int32_t& id : ids) id = pick(rng);
    const std::vector<float> x = gaussian(static_cast<size_t>(c.act_rows * c.in), rng);

    std::vector<float> ref(static_cast<size_t>(n_pairs * c.rows));
    for (int64_t p = 0; p < n_pairs; ++p) {
        const int64_t slot = p % slots, tensor = p / slots;
        const uint8_t* expert = w.data() + tensor * tensor_bytes + static_cast<size_t>(ids[slot]) * expert_bytes;
        cpu::matmul({.w = matrix(t, c.in, c.rows, expert, strata::Device::Host),
                     .x = x.data() + slot / c.pairs_per_row * c.in,
                     .y = ref.data() + p * c.rows,
                     .n_tokens = 1});
    }

    cuda::Context& ctx = context();
    cudaStream_t stream = ctx.stream().handle();
    const cuda::DeviceBuffer dw = ctx.upload(w.data(), w.size(), "weights");
    const cuda::DeviceBuffer dx = upload(x), dids = upload(ids);
    const std::vector<float> poisoned(ref.size() + kSentinels, poison());
    const cuda::DeviceBuffer dy = upload(poisoned);
    const cuda::QuantizedActivationBytes qb = cuda::quantized_activation_bytes(t, c.act_rows * c.in);
    const cuda::DeviceBuffer dq = ctx.allocate(std::max<size_t>(qb.total(), 256), "activations");
    const cuda::QuantizedActivations act = cuda::quantized_activations_at(dq.data(), t, c.act_rows * c.in);
    cuda::quantize_activations(t, dx.as<float>(), c.in, c.act_rows, act, stream);
    const cuda::MatvecLaunch l{.type = t,
                               .w = static_cast<const uint8_t*>(dw.data()),
                               .row_bytes = rb,
                               .rows = c.rows,
                               .in = c.in,
                               .n_tokens = 1,
                               .act = act,
                               .x = dx.as<float>(),
                               .y = dy.as<float>(),
                               .stream = stream,
                               .gather = {.ids = dids.as<int32_t>(),
                                          .expert_bytes = expert_bytes,
                                          .n_pairs = n_pairs,
                                          .pairs_per_act_row = c.pairs_per_row,
                                          .second_from = c.two_tensors ? slots : 0,
                                          .second_offset = c.two_tensors ? static_cast<int64_t>(tensor_bytes) : 0}};
    EXPECT_TRUE(cuda::launch_matvec_any(l));
    return compare_outputs(download<float>(dy.data(), poisoned.size()), ref);
}

// Every type at the row lengths the MoE layer meets: rows no longer than a kernel chunk (8 rows a warp: the expert
// down products), a part of a chunk, several chunks with a tail, and for float types lengths 16 does not divide (the
// f32 qwen3next whose experts failed with "cannot run as a gathered matrix-vector product"). Row counts that fill no
// warp, top-k pairs sharing a token's activations, separate gate and up in one launch, repeated expert ids.
TEST_P(CudaMatmul, GatheredProductsMatchTheCpuReference) {
    SKIP_WITHOUT_DEVICE();
    const DType t = GetParam();
    std::mt19937 rng(2024 + static_cast<unsigned>(t));
    const int64_t b = block_of(t);
    const std::vector<int64_t> lengths = is_float(t)   ? std::vector<int64_t>{24, 33, 48, 528, 1000}
                                         : b == 32 ? std::vector<int64_t>{32, 96, 320, 1056}
                                                   : std::vector<int64_t>{256, 768, 1280};
    double worst = 0;
    for (const int64_t in : lengths) {
        for (const GatherCase& c : {GatherCase{in, 37, 5, 3, 2, false}, GatherCase{in, 64, 7, 4, 3, true},
                                    GatherCase{in, 37, 5, 6, 1, false}}) {
            SCOPED_TRACE(std::string(strata::dtype_name(t)) + " in " + std::to_string(c.in) + " rows " +
                         std::to_string(c.rows) + " pairs per row " + std::to_string(c.pairs_per_row) +
                         (c.two_tensors ? " two tensors" : ""));
            const Outcome o = run_gather(t, c, rng);
            EXPECT_EQ(o.unwritten, 0);
            EXPECT_EQ(o.non_finite, 0);
            EXPECT_EQ(o.clobbered, 0);
            EXPECT_LE(o.nmse, kReassociationNmse);
            worst = std::max(worst, o.nmse);
        }
    }
    std::printf("[ cuda     ] %-8s gathered products: worst NMSE against cpu::matmul %.3g (threshold %.0g)\n",
                strata::dtype_name(t), worst, kReassociationNmse);
}

// ---- errors and memory ----------------------------------------------------------------------------------------------

TEST(CudaMemory, AccountantRefusesOverBudgetAndKeepsItsBooks) {
    // Host-only bookkeeping: runs wherever the backend is compiled in.
    cuda::MemoryAccountant m(1000);
    m.reserve(600, "weights");
    expect_error([&] { m.reserve(401, "kv cache"); }, "would exceed the VRAM budget");
    EXPECT_EQ(m.used(), 600u);
    m.reserve(400, "kv cache");
    EXPECT_EQ(m.used(), 1000u);
    EXPECT_NE(m.plan().find("kv cache"), std::string::npos) << m.plan();
    m.release(400, "kv cache");
    m.release(600, "weights");
    EXPECT_EQ(m.used(), 0u);
    EXPECT_EQ(m.peak(), 1000u);
}

TEST(CudaMemory, BudgetIsEnforcedBeforeCudaMalloc) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context small({.device = 0, .vram_budget = size_t{1} << 20});
    {
        const cuda::DeviceBuffer a = small.allocate(512 << 10, "weights");
        EXPECT_NE(a.data(), nullptr);
        // 1 GiB would fit on any GPU: the refusal can only come from the budget.
        expect_error([&] { (void)small.allocate(size_t{1} << 30, "kv cache"); }, "VRAM budget");
        EXPECT_EQ(small.memory().used(), size_t{512} << 10);
    }
    EXPECT_EQ(small.memory().used(), 0u);  // the buffer gave its bytes back
}

// The kernels the driver loaded, against the build's architecture list (the oracle: CMAKE_CUDA_ARCHITECTURES; CMake
// builds SASS and PTX for each plain number): the newest entry the device runs, the same major's SASS or else PTX it
// JIT-compiles. A 75-virtual build on an H200 reports 750: its sm_75 code runs, and the host takes no sm_90-only path.
TEST(CudaContext, ReportsTheArchitectureOfTheLoadedKernels) {
    SKIP_WITHOUT_DEVICE();
    const cuda::DeviceInfo& info = context().info();
    const int device_arch = info.cc_major * 100 + info.cc_minor * 10;
    const std::string list = STRATA_CUDA_ARCHITECTURES;
    std::printf("[ cuda     ] %s: compute capability %d.%d, kernels for %d (built for %s), %zu bytes of shared memory "
                "a block\n", info.name.c_str(), info.cc_major, info.cc_minor, info.kernel_arch, list.c_str(),
                info.max_shared_per_block);
    EXPECT_GE(info.kernel_arch, 750);
    EXPECT_LE(info.kernel_arch, device_arch);
    EXPECT_GE(info.max_shared_per_block, size_t{48} << 10);
    int expected = 0;
    bool numbers_only = true;
    for (size_t at = 0; at < list.size();) {
        const size_t end = std::min(list.find(',', at), list.size());
        const std::string entry = list.substr(at, end - at);
        at = end + 1;
        const size_t digits = entry.find_first_not_of("0123456789");
        const std::string tail = digits == std::string::npos ? "" : entry.substr(digits);
        if (digits == 0 || (tail != "" && tail != "-virtual")) {
            numbers_only = false;  // native, all, -real entries: no exact expectation
            continue;
        }
        const int arch = std::stoi(entry.substr(0, digits)) * 10;
        if (arch <= device_arch) expected = std::max(expected, arch);
    }
    if (numbers_only) {
        EXPECT_EQ(info.kernel_arch, expected) << "built for " << list;
    }
}

// Context::download after queued work: into pageable memory through the staging ring (1, 3.x and 9.x chunks of
// 256 KB: partial chunks, the ring of four wrapping) and straight into page-locked memory; every byte is the device's,
// and a kernel queued before the download (a memset here) has landed.
TEST(CudaContext, DownloadsGiveTheDeviceBytesAfterQueuedWork) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    for (const size_t n : {size_t{1}, size_t{1000}, size_t{65536}, size_t{248320}, size_t{600001}}) {
        SCOPED_TRACE("floats " + std::to_string(n));
        std::vector<float> want(n);
        for (size_t i = 0; i < n; ++i) want[i] = static_cast<float>(i) * 0.5f + 1.0f;
        const cuda::DeviceBuffer d = ctx.upload(want.data(), n * sizeof(float), "test");
        ctx.zero(static_cast<float*>(d.data()) + n / 2, sizeof(float));  // queued on the stream, not waited for
        want[n / 2] = 0.0f;
        std::vector<float> pageable(n, -1.0f);
        ctx.download(d.data(), pageable.data(), n * sizeof(float));
        EXPECT_EQ(std::memcmp(pageable.data(), want.data(), n * sizeof(float)), 0);
        float* pinned = cuda::allocate_pinned_floats(n);
        ASSERT_NE(pinned, nullptr);
        ctx.zero(static_cast<float*>(d.data()) + n - 1, sizeof(float));
        want[n - 1] = 0.0f;
        ctx.download(d.data(), pinned, n * sizeof(float));
        EXPECT_EQ(std::memcmp(pinned, want.data(), n * sizeof(float)), 0);
        cuda::free_pinned_floats(pinned);
    }
}

TEST(CudaErrors, SayWhatIsWrong) {
    SKIP_WITHOUT_DEVICE();
    expect_error([] { cuda::Context bad({.device = 1000}); }, "device 1000 does not exist");
    std::vector<uint8_t> w(strata::row_bytes(DType::Q4_0, 64) * 2);
    float x[64] = {}, y[2] = {};
    const strata::Tensor host_w = matrix(DType::Q4_0, 64, 2, w.data(), strata::Device::Host);
    expect_error([&] { cuda::matmul(context(), {.w = host_w, .x = x, .y = y}); }, "host memory");
    const strata::Tensor q5 = matrix(DType::Q5_0, 64, 2, w.data(), strata::Device::Cuda);
    expect_error([&] { cuda::matmul(context(), {.w = q5, .x = x, .y = y}); }, "not supported");
}

// ---- performance (STRATA_CUDA_PERF=1) -------------------------------------------------------------------------------

// Whether the comma-separated list names type t.
bool names_type(const char* list, DType t) {
    std::string rest = list;
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        if (rest.substr(0, comma) == strata::dtype_name(t)) return true;
        if (comma == std::string::npos) break;
        rest.erase(0, comma + 1);
    }
    return false;
}

struct PerfShape {
    int64_t in, rows;
};

TEST(CudaPerf, MatvecBandwidth) {
    if (!std::getenv("STRATA_CUDA_PERF")) GTEST_SKIP() << "set STRATA_CUDA_PERF=1 for the CUDA timing run";
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    cudaStream_t s = ctx.stream().handle();
    const double copy_gbs = copy_bandwidth_gbs(ctx);
    std::printf("[ perf     ] %s, %d SMs, L2 %.0f MB; device copy (read + write) %.0f GB/s\n", ctx.info().name.c_str(),
                ctx.info().multiprocessors, ctx.info().l2_bytes / 1e6, copy_gbs);
    std::printf("[ perf     ] GB/s = weight bytes / time per call (activation quantization included; a CUDA graph of "
                "100 calls replayed, weight copies rotated past the L2)\n");
    std::printf("[ perf     ] %-8s %-12s %10s %9s %8s %8s %9s %8s\n", "type", "in x out", "MB", "us T=1", "GB/s",
                "%copy", "us T=8", "GB/s");
    const PerfShape shapes[] = {{4096, 4096}, {2048, 11008}, {11008, 2048}};
    std::mt19937 rng(7);
    // STRATA_CUDA_PERF_TYPES=q4_k,iq2_xs limits the run (e.g. under a profiler); default: every type.
    const char* only = std::getenv("STRATA_CUDA_PERF_TYPES");
    for (const DType t : kWeightTypes) {
        if (only && *only && !names_type(only, t)) continue;
        for (const PerfShape& shape : shapes) {
            const int64_t in = shape.in, rows = shape.rows;
            if (in % block_of(t) != 0) continue;
            const std::vector<uint8_t> w = tiled_weights(t, rows, in, rng);
            const size_t bytes = w.size();
            const size_t copies = std::max<size_t>(2, (4 * ctx.info().l2_bytes + bytes - 1) / bytes);
            std::vector<cuda::DeviceBuffer> dw;
            for (size_t c = 0; c < copies; ++c) dw.push_back(ctx.upload(w.data(), bytes, "perf weights"));
            std::vector<float> x(static_cast<size_t>(8 * in));
            std::normal_distribution<float> gauss;
            for (float& v : x) v = gauss(rng);
            const cuda::DeviceBuffer dx = ctx.upload(x.data(), x.size() * 4, "perf");
            const cuda::DeviceBuffer dy = ctx.allocate(static_cast<size_t>(8 * rows) * 4, "perf");
            double us[2] = {0, 0};
            const int64_t token_counts[2] = {1, 8};
            for (int k = 0; k < 2; ++k) {
                auto call = [&](size_t c) {
                    const strata::Tensor dev_w = matrix(t, in, rows, dw[c].data(), strata::Device::Cuda);
                    cuda::matmul(ctx, {.w = dev_w, .x = dx.as<float>(), .y = dy.as<float>(),
                                       .n_tokens = token_counts[k]});
                };
                for (size_t c = 0; c < copies; ++c) call(c);  // warm-up; sizes the scratch before capture
                ctx.synchronize();
                constexpr int kCalls = 100;
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                for (int i = 0; i < kCalls; ++i) call(static_cast<size_t>(i) % copies);
                CHECK_CUDA(cudaStreamEndCapture(s, &graph));
                CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
                CHECK_CUDA(cudaGraphLaunch(exec, s));  // warm-up
                cudaEvent_t start, stop;
                cudaEventCreate(&start);
                cudaEventCreate(&stop);
                std::vector<float> runs;
                for (int rep = 0; rep < 5; ++rep) {
                    cudaEventRecord(start, s);
                    CHECK_CUDA(cudaGraphLaunch(exec, s));
                    cudaEventRecord(stop, s);
                    CHECK_CUDA(cudaEventSynchronize(stop));
                    float ms = 0;
                    cudaEventElapsedTime(&ms, start, stop);
                    runs.push_back(ms);
                }
                std::sort(runs.begin(), runs.end());
                us[k] = runs[runs.size() / 2] * 1e3 / kCalls;  // median of 5 replays
                cudaEventDestroy(start);
                cudaEventDestroy(stop);
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
            }
            const double gbs1 = static_cast<double>(bytes) / (us[0] * 1e-6) / 1e9;
            const double gbs8 = static_cast<double>(bytes) / (us[1] * 1e-6) / 1e9;
            const std::string shape_name = std::to_string(in) + "x" + std::to_string(rows);
            std::printf("[ perf     ] %-8s %-12s %10.1f %9.2f %8.0f %7.0f%% %9.2f %8.0f\n", strata::dtype_name(t),
                        shape_name.c_str(), bytes / 1e6, us[0], gbs1, 100.0 * gbs1 / copy_gbs, us[1], gbs8);
        }
    }
}

// TFLOP/s of the GEMM path at prompt-window shapes (Flash-Next's dense products: in x out), activation quantization
// and the fp16 copy included. 2 * in * out * tokens flops a call; one weight copy (reread from the L2 where it fits,
// as consecutive windows would not: a little optimistic for the smaller matrices).
TEST(CudaPerf, GemmTflops) {
    if (!std::getenv("STRATA_CUDA_PERF")) GTEST_SKIP() << "set STRATA_CUDA_PERF=1 for the CUDA timing run";
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    const PerfShape shapes[] = {{2560, 4096}, {4096, 2560}, {2560, 12288}, {12288, 2560}, {2560, 10240}, {10240, 2560}};
    const int64_t token_counts[] = {64, 256, 512};
    std::printf("[ perf     ] GEMM path: TFLOP/s = 2 in out T / time per call (median graph replay of 10 calls)\n");
    std::printf("[ perf     ] %-8s %-12s %9s %7s %9s %7s %9s %7s\n", "type", "in x out", "us T=64", "TFLOP/s",
                "us T=256", "TFLOP/s", "us T=512", "TFLOP/s");
    std::mt19937 rng(11);
    const char* only = std::getenv("STRATA_CUDA_PERF_TYPES");
    for (const DType t : {DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::IQ2_XS, DType::IQ4_XS, DType::F16}) {
        if (only && *only && !names_type(only, t)) continue;
        for (const PerfShape& shape : shapes) {
            const int64_t in = shape.in, rows = shape.rows;
            if (in % block_of(t) != 0) continue;
            const std::vector<uint8_t> w = tiled_weights(t, rows, in, rng);
            const size_t bytes = w.size();
            const cuda::DeviceBuffer dw = ctx.upload(w.data(), bytes, "perf weights");
            const std::vector<float> x = gaussian(static_cast<size_t>(512 * in), rng);
            const cuda::DeviceBuffer dx = ctx.upload(x.data(), x.size() * 4, "perf");
            const cuda::DeviceBuffer dy = ctx.allocate(static_cast<size_t>(512 * rows) * 4, "perf");
            const strata::Tensor dev_w = matrix(t, in, rows, dw.data(), strata::Device::Cuda);
            std::string line;
            for (const int64_t tokens : token_counts) {
                constexpr int kCalls = 10;
                const double us = graph_median_us(ctx, [&] {
                    for (int i = 0; i < kCalls; ++i)
                        cuda::matmul(ctx, {.w = dev_w, .x = dx.as<float>(), .y = dy.as<float>(), .n_tokens = tokens});
                }, 5) / kCalls;
                const double tflops = 2.0 * static_cast<double>(in * rows * tokens) / (us * 1e-6) / 1e12;
                char cell[64];
                std::snprintf(cell, sizeof cell, " %9.1f %7.1f", us, tflops);
                line += cell;
            }
            const std::string shape_name = std::to_string(in) + "x" + std::to_string(rows);
            std::printf("[ perf     ] %-8s %-12s%s\n", strata::dtype_name(t), shape_name.c_str(), line.c_str());
        }
    }
}

#endif  // STRATA_HAS_CUDA

}  // namespace
