// CUDA parity of the model-level ops (issue 7, slice 4) against the CPU reference path of this repo:
// - the MoE layer at decode (1..8 tokens) against model/moe.cpp's moe_forward, for experts of every type the CPU runs
//   (float ones also at widths 16 does not divide), fused and separate gate/up, with a shared expert; the chosen experts identical to cpu::softmax + cpu::top_k's
//   (ties forced by duplicated router rows), the routing weights and the output by NMSE; a captured graph replays to
//   the same bits as eager launches;
// - the hyper-connection read and write against model/hyper_connection.cpp (Q8_0 and F32 weights);
// - the PLE rows (hash and gather from mapped host memory) against ple_rows_into + cpu::get_row, F16 and Q8_0 tables;
// - greedy sampling against argmax_lowest (ties, -0/+0, NaN, all -inf), and top-k / top-p / min-p / temperature
//   sampling against runtime/sampler.cpp's Sampler given the same uniform number.
// STRATA_CUDA_PERF=1 adds the timing: the Flash-Next MoE layer (512 experts top-10, hidden 2560, experts 640 wide,
// shared expert 640) in IQ2_XS and Q4_K, 12 layers in one graph, next to the copy-bandwidth roofline; greedy and
// top-k sampling over 248,320 logits.
//
// Without the CUDA backend compiled in (-DSTRATA_CUDA=ON) or without a GPU, every test skips with a message saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/hyper_connection.h"
#include "model/moe.h"
#include "model/ple.h"
#include "model/scratch.h"
#include "runtime/sampler.h"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>

#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/model_ops.h"
#include "cuda_test_util.h"
#endif

namespace {

using strata::DType;

#if !STRATA_HAS_CUDA

TEST(CudaModelOps, SkippedWithoutTheBackend) {
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): CUDA model-op tests skipped";
}

#else

namespace cuda = strata::cuda;
namespace cpu = strata::cpu;
using namespace strata::cuda_test;
constexpr const char* kDeviceTests = "CUDA model-op tests";

// rows x in weights of type t, each row quantized from its own gaussian floats (scaled like trained weights).
std::vector<uint8_t> random_rows(DType t, int64_t rows, int64_t in, std::mt19937& rng, float sigma = 0.05f) {
    const size_t rb = strata::row_bytes(t, in);
    std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float> src = gaussian(static_cast<size_t>(in), rng, sigma);
        strata::quantize_row(t, src.data(), w.data() + rb * static_cast<size_t>(r), in);
    }
    return w;
}

// A weight tensor on the host and its copy on the device.
struct Weight {
    std::vector<uint8_t> host;
    cuda::DeviceBuffer dev;
    strata::Tensor host_t, dev_t;
    Weight(DType t, std::vector<int64_t> ne, std::vector<uint8_t> bytes) : host(std::move(bytes)) {
        dev = context().upload(host.data(), host.size(), "test weights");
        host_t = strata::make_tensor("w", t, static_cast<int>(ne.size()), ne.data(), host.data());
        dev_t = strata::make_tensor("w", t, static_cast<int>(ne.size()), ne.data(), dev.data());
        dev_t.device = strata::Device::Cuda;
    }
    static Weight random(DType t, std::vector<int64_t> ne, std::mt19937& rng, float sigma = 0.05f) {
        int64_t rows = 1;
        for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
        return Weight(t, ne, random_rows(t, rows, ne[0], rng, sigma));
    }
};

// ---- MoE ------------------------------------------------------------------------------------------------------------

// Output NMSE limit. Both sides quantize x and the SwiGLU activations with the same rules and take the same integer
// dot products; they differ in the order of float sums (~1e-13), expf against glibc's exp (a few ulp in silu,
// softmax and the shared gate), and therefore, rarely, in one activation value of the down product landing on the
// other side of a quantization step: one such flip moves one term of one output row by a step of 1/127 of its block's
// largest value, NMSE ~1e-7 at these widths. 1e-5 leaves room for a few; a wrong expert or a misread block costs
// ~1e-1 and more.
constexpr double kMoeNmse = 1e-5;
// Routing weights: softmax and a normalization in float on both sides, expf vs exp: a few ulp, NMSE ~1e-13.
constexpr double kRouteNmse = 1e-10;

struct MoeCase {
    DType expert_type;
    DType down_type;
    int64_t H, E, K, F, FS;
    bool fused;
    DType shared_type;  // the shared expert's three matrices
};

struct MoeFixture {
    MoeCase c;
    strata::MoeShape shape;
    std::unique_ptr<Weight> router, gate_up, gate, up, down, sgate_proj, sup, sdown;
    std::vector<float> shared_gate;
    cuda::DeviceBuffer shared_gate_dev;
    strata::MoeWeights cpu_w;
    cuda::MoeLayerWeights dev_w;
    cuda::MoeLayerShape dev_shape;

    MoeFixture(const MoeCase& mc, std::mt19937& rng, bool duplicate_router_rows) : c(mc) {
        const int64_t H = c.H, E = c.E, F = c.F, FS = c.FS;
        shape = {.n_embd = H, .n_expert = E, .n_expert_used = c.K, .n_ff = F, .n_ff_shared = FS,
                 .normalize_weights = true};
        dev_shape = {.n_embd = H, .n_expert = E, .n_expert_used = c.K, .n_ff = F, .n_ff_shared = FS,
                     .normalize_weights = true};
        std::vector<float> rw = gaussian(static_cast<size_t>(H * E), rng, 0.1f);
        if (duplicate_router_rows)  // experts 2k+1 copy expert 2k: equal logits, so ties in the top-k
            for (int64_t e = 1; e < E; e += 2) std::copy_n(rw.begin() + (e - 1) * H, H, rw.begin() + e * H);
        std::vector<uint8_t> rb(rw.size() * 4);
        std::memcpy(rb.data(), rw.data(), rb.size());
        router = std::make_unique<Weight>(DType::F32, std::vector<int64_t>{H, E}, std::move(rb));
        if (c.fused) {
            gate_up = std::make_unique<Weight>(Weight::random(c.expert_type, {H, 2 * F, E}, rng));
        } else {
            gate = std::make_unique<Weight>(Weight::random(c.expert_type, {H, F, E}, rng));
            up = std::make_unique<Weight>(Weight::random(c.expert_type, {H, F, E}, rng));
        }
        down = std::make_unique<Weight>(Weight::random(c.down_type, {F, H, E}, rng));
        cpu_w.router = router->host_t;
        if (c.fused) {
            cpu_w.gate_up = gate_up->host_t;
        } else {
            cpu_w.gate = gate->host_t;
            cpu_w.up = up->host_t;
        }
        cpu_w.down = down->host_t;
        if (FS > 0) {
            shared_gate = gaussian(static_cast<size_t>(H), rng, 0.1f);
            shared_gate_dev = upload(shared_gate);
            sgate_proj = std::make_unique<Weight>(Weight::random(c.shared_type, {H, FS}, rng));
            sup = std::make_unique<Weight>(Weight::random(c.shared_type, {H, FS}, rng));
            sdown = std::make_unique<Weight>(Weight::random(c.shared_type, {FS, H}, rng));
            cpu_w.shared_gate = shared_gate;
            cpu_w.shared_gate_proj = sgate_proj->host_t;
            cpu_w.shared_up = sup->host_t;
            cpu_w.shared_down = sdown->host_t;
        }
        // Expert views as bind_moe makes them.
        auto view = [](const strata::Tensor& t, int64_t e, int64_t row, int64_t n) {
            strata::Tensor v = cpu::matrix_view(t, e, row, n);
            v.name.clear();
            return v;
        };
        for (int64_t e = 0; e < E; ++e) {
            cpu_w.expert_gate.push_back(c.fused ? view(*cpu_w.gate_up, e, 0, F) : view(*cpu_w.gate, e, 0, F));
            cpu_w.expert_up.push_back(c.fused ? view(*cpu_w.gate_up, e, F, F) : view(*cpu_w.up, e, 0, F));
            cpu_w.expert_down.push_back(view(cpu_w.down, e, 0, H));
        }
        dev_w = {.router = &router->dev_t,
                 .gate_up = c.fused ? &gate_up->dev_t : nullptr,
                 .gate = c.fused ? nullptr : &gate->dev_t,
                 .up = c.fused ? nullptr : &up->dev_t,
                 .down = &down->dev_t,
                 .shared_gate = FS > 0 ? shared_gate_dev.as<float>() : nullptr,
                 .shared_gate_proj = FS > 0 ? &sgate_proj->dev_t : nullptr,
                 .shared_up = FS > 0 ? &sup->dev_t : nullptr,
                 .shared_down = FS > 0 ? &sdown->dev_t : nullptr};
    }

    // The CPU's choice: cpu::matmul of the router, cpu::softmax, cpu::top_k, weights p / sum in top-k order.
    void cpu_route(const std::vector<float>& x, int64_t T, std::vector<int32_t>& ids, std::vector<float>& w) const {
        const int64_t E = c.E, K = c.K;
        std::vector<float> logits(static_cast<size_t>(T * E));
        cpu::matmul({.w = router->host_t, .x = x.data(), .y = logits.data(), .n_tokens = T});
        ids.clear();
        w.clear();
        for (int64_t t = 0; t < T; ++t) {
            float* p = logits.data() + t * E;
            cpu::softmax(p, E);
            const std::vector<int32_t> top = cpu::top_k(p, E, K);
            float sum = 0.0f;
            for (int32_t e : top) sum += p[e];
            for (int32_t e : top) {
                ids.push_back(e);
                w.push_back(p[e] / sum);
            }
        }
    }
};

class CudaMoe : public ::testing::TestWithParam<MoeCase> {};

TEST_P(CudaMoe, MatchesMoeForward) {
    SKIP_WITHOUT_DEVICE();
    const MoeCase c = GetParam();
    std::mt19937 rng(4242 + static_cast<unsigned>(c.expert_type) * 7 + static_cast<unsigned>(c.E));
    for (const bool ties : {false, true}) {
        MoeFixture fx(c, rng, ties);
        cuda::Context& ctx = context();
        cuda::MoeWorkspace ws(ctx, fx.dev_shape, fx.dev_w);
        double worst = 0, worst_w = 0;
        int64_t compared = 0;
        for (int64_t T = 1; T <= cuda::kMaxMatvecTokens; ++T) {
            SCOPED_TRACE("T " + std::to_string(T) + (ties ? " with ties" : ""));
            const std::vector<float> x = gaussian(static_cast<size_t>(T * c.H), rng);
            std::vector<float> ref(x.size());
            strata::Scratch scratch;
            strata::moe_forward({.shape = fx.shape, .weights = fx.cpu_w, .x = x.data(), .out = ref.data(),
                                 .n_tokens = T, .scratch = scratch});
            std::vector<int32_t> ref_ids;
            std::vector<float> ref_w;
            fx.cpu_route(x, T, ref_ids, ref_w);

            const cuda::DeviceBuffer dx = upload(x), dout = ctx.allocate(x.size() * 4, "test");
            cuda::moe_layer(ctx, {.shape = fx.dev_shape, .weights = fx.dev_w, .x = dx.as<float>(),
                                  .out = dout.as<float>(), .n_tokens = T, .workspace = ws});
            const std::vector<float> got = download<float>(dout.data(), x.size());
            const std::vector<int32_t> ids = download<int32_t>(ws.expert_ids(), ref_ids.size());
            const std::vector<float> w = download<float>(ws.expert_weights(), ref_w.size());
            EXPECT_EQ(ids, ref_ids);
            {
                // The combine left to the caller (deferred_combine), then run: the same bits.
                const cuda::DeviceBuffer dout3 = ctx.allocate(x.size() * 4, "test");
                cuda::MoeCombine combine{};
                cuda::moe_layer(ctx, {.shape = fx.dev_shape,
                                      .weights = fx.dev_w,
                                      .x = dx.as<float>(),
                                      .out = dout3.as<float>(),
                                      .n_tokens = T,
                                      .workspace = ws,
                                      .deferred_combine = &combine});
                EXPECT_EQ(combine.out, dout3.as<float>());
                cuda::moe_combine(ctx, combine);
                const std::vector<float> deferred = download<float>(dout3.data(), x.size());
                EXPECT_EQ(std::memcmp(deferred.data(), got.data(), got.size() * 4), 0) << "deferred combine differs";
            }
            const double e_out = nmse(got, ref), e_w = nmse(w, ref_w);
            EXPECT_LE(e_out, kMoeNmse);
            EXPECT_LE(e_w, kRouteNmse);
            worst = std::max(worst, e_out);
            worst_w = std::max(worst_w, e_w);
            compared += static_cast<int64_t>(ids.size());

            if (T == 1 || T == 3) {
                // Graph replay gives the eager bits (at one token too: the decode path).
                cudaStream_t s = ctx.stream().handle();
                const cuda::DeviceBuffer dout2 = ctx.allocate(x.size() * 4, "test");
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                cuda::moe_layer(ctx, {.shape = fx.dev_shape, .weights = fx.dev_w, .x = dx.as<float>(),
                                      .out = dout2.as<float>(), .n_tokens = T, .workspace = ws});
                CHECK_CUDA(cudaStreamEndCapture(s, &graph));
                CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
                CHECK_CUDA(cudaGraphLaunch(exec, s));
                CHECK_CUDA(cudaGraphLaunch(exec, s));
                const std::vector<float> replayed = download<float>(dout2.data(), x.size());
                EXPECT_EQ(std::memcmp(replayed.data(), got.data(), got.size() * 4), 0) << "graph replay differs";
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
            }
        }
        std::printf("[ cuda     ] MoE %s/%s E %lld K %lld F %lld%s%s: %lld expert choices identical; worst NMSE out "
                    "%.3g (limit %.0g), weights %.3g (limit %.0g)\n",
                    strata::dtype_name(c.expert_type), strata::dtype_name(c.down_type), static_cast<long long>(c.E),
                    static_cast<long long>(c.K), static_cast<long long>(c.F), c.fused ? " fused" : "",
                    ties ? " ties" : "", static_cast<long long>(compared), worst, kMoeNmse, worst_w, kRouteNmse);
    }
}

// Prompt windows (more than kMaxMatvecTokens tokens) through the grouped expert GEMM (moe_layer_prompt): fp16
// operands on tensor cores, as the dense prompt GEMM. Gate and up then differ from the CPU's by ~3e-4 relative (11-bit
// operands) instead of ~1e-7, and about 1% of the hidden values land on the other side of a Q8 rounding step before
// down (one step is ~1/40 of a typical value): NMSE ~1e-5 on the output, measured 0.85-4.8e-5 on the H200 over these
// cases, where the CPU's own Q8 rounding of the hidden values is ~5e-5 from exact f32 arithmetic. Bound 1e-4; a
// wrong expert or a misread block costs ~1e-1. The windows reach the hard cases: 9 tokens (one past decode), 64 and
// 100, experts with no pairs, and a window of one token repeated, whose K experts take every token (100 pairs each:
// a tile of 64 and a ragged one); and where the window gives its experts 64 pairs or more on average (the cases of
// few experts at 480 tokens), tiles of 128 pairs (a full one and ragged ones when one token is repeated).
constexpr double kGroupedMoeNmse = 1e-4;
TEST_P(CudaMoe, PromptWindowMatchesMoeForward) {
    SKIP_WITHOUT_DEVICE();
    const MoeCase c = GetParam();
    std::mt19937 rng(977 + static_cast<unsigned>(c.expert_type) * 7 + static_cast<unsigned>(c.E));
    MoeFixture fx(c, rng, true);
    if (!cuda::moe_prompt_supported(fx.dev_shape, fx.dev_w)) {
        std::printf("[ cuda     ] MoE prompt %s/%s: takes the sliced path (no grouped GEMM for these weights)\n",
                    strata::dtype_name(c.expert_type), strata::dtype_name(c.down_type));
        return;
    }
    cuda::Context& ctx = context();
    constexpr int64_t kMaxTokens = 480;
    cuda::MoePromptWorkspace ws(ctx, fx.dev_shape, kMaxTokens);
    const bool wide_tiles = kMaxTokens * c.K >= 64 * c.E;
    double worst = 0;
    for (const bool repeated : {false, true})
        for (const int64_t T : {int64_t{9}, int64_t{40}, int64_t{64}, int64_t{100}, kMaxTokens}) {
            if (T == kMaxTokens && !wide_tiles) continue;  // 64-pair tiles only: the windows above cover them
            SCOPED_TRACE("T " + std::to_string(T) + (repeated ? ", one token repeated" : ""));
            std::vector<float> x = gaussian(static_cast<size_t>(T * c.H), rng);
            if (repeated)
                for (int64_t t = 1; t < T; ++t) std::copy_n(x.begin(), c.H, x.begin() + t * c.H);
            std::vector<float> ref(x.size());
            strata::Scratch scratch;
            strata::moe_forward({.shape = fx.shape, .weights = fx.cpu_w, .x = x.data(), .out = ref.data(),
                                 .n_tokens = T, .scratch = scratch});
            std::vector<int32_t> ref_ids;
            std::vector<float> ref_w;
            fx.cpu_route(x, T, ref_ids, ref_w);
            const cuda::DeviceBuffer dx = upload(x), dout = ctx.allocate(x.size() * 4, "test");
            cuda::moe_layer_prompt(ctx, {.shape = fx.dev_shape, .weights = fx.dev_w, .x = dx.as<float>(),
                                         .out = dout.as<float>(), .n_tokens = T, .workspace = ws});
            const std::vector<float> got = download<float>(dout.data(), x.size());
            EXPECT_EQ(download<int32_t>(ws.expert_ids(), ref_ids.size()), ref_ids);
            EXPECT_LE(nmse(download<float>(ws.expert_weights(), ref_w.size()), ref_w), kRouteNmse);
            const double e = nmse(got, ref);
            EXPECT_LE(e, kGroupedMoeNmse);
            worst = std::max(worst, e);
            // Again: the same bits (the counting sort's order within an expert does not reach the sums).
            const cuda::DeviceBuffer dout2 = ctx.allocate(x.size() * 4, "test");
            cuda::moe_layer_prompt(ctx, {.shape = fx.dev_shape, .weights = fx.dev_w, .x = dx.as<float>(),
                                         .out = dout2.as<float>(), .n_tokens = T, .workspace = ws});
            const std::vector<float> again = download<float>(dout2.data(), x.size());
            EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * 4), 0) << "a second run differs";
        }
    std::printf("[ cuda     ] MoE prompt %s/%s E %lld K %lld F %lld%s%s: worst NMSE %.3g (limit %.0g)\n",
                strata::dtype_name(c.expert_type), strata::dtype_name(c.down_type), static_cast<long long>(c.E),
                static_cast<long long>(c.K), static_cast<long long>(c.F), c.fused ? " fused" : "",
                wide_tiles ? " (128-pair tiles at 480 tokens)" : "", worst, kGroupedMoeNmse);
}

INSTANTIATE_TEST_SUITE_P(
    Types, CudaMoe,
    ::testing::Values(MoeCase{DType::IQ2_XS, DType::IQ2_XS, 256, 37, 5, 256, 96, false, DType::Q8_0},
                      MoeCase{DType::Q4_K, DType::Q4_K, 512, 64, 8, 256, 0, true, DType::Q8_0},
                      MoeCase{DType::Q8_0, DType::Q8_0, 160, 19, 3, 96, 64, false, DType::Q8_0},
                      MoeCase{DType::IQ2_XS, DType::Q8_0, 256, 128, 10, 160, 160, false, DType::Q8_0},
                      // Flash-Next's routing (512 experts, top 10: 16 a lane of the one-warp router) and down type.
                      MoeCase{DType::IQ2_XS, DType::IQ4_NL, 256, 512, 10, 64, 64, false, DType::Q8_0},
                      // More experts than the one-warp router holds: the block router.
                      MoeCase{DType::Q8_0, DType::IQ4_NL, 64, 600, 8, 64, 0, false, DType::Q8_0},
                      // Float experts, as `convert --outtype f32/f16/bf16` writes them: the goldens' shape (hidden
                      // 64, experts 32 wide), and widths 16 does not divide (hidden 40 or 37, experts 24 or 33, shared
                      // expert 40 or 21), which the gathered products once refused ("down of type f32 cannot run as
                      // a gathered matrix-vector product").
                      MoeCase{DType::F32, DType::F32, 64, 8, 2, 32, 48, false, DType::F32},
                      MoeCase{DType::F32, DType::F32, 40, 8, 2, 24, 40, false, DType::F32},
                      MoeCase{DType::F16, DType::F16, 37, 6, 2, 33, 21, true, DType::F16},
                      MoeCase{DType::BF16, DType::BF16, 40, 9, 3, 24, 40, false, DType::BF16},
                      // Quantized gate/up over rows of 256 with a down product whose 40-wide rows hold no block:
                      // what `strata quantize` writes then (f16 fallback).
                      MoeCase{DType::Q4_K, DType::F16, 256, 8, 2, 40, 48, false, DType::F16},
                      // The other expert types the CPU runs, one case each.
                      MoeCase{DType::Q4_0, DType::Q4_0, 96, 8, 2, 64, 32, false, DType::Q4_0},
                      MoeCase{DType::Q2_K, DType::Q3_K, 256, 8, 2, 256, 256, true, DType::Q6_K},
                      MoeCase{DType::Q5_K, DType::Q6_K, 256, 8, 2, 256, 256, false, DType::Q5_K},
                      MoeCase{DType::IQ4_XS, DType::IQ3_XXS, 256, 8, 3, 256, 256, false, DType::IQ4_XS},
                      MoeCase{DType::IQ3_S, DType::IQ1_M, 256, 8, 2, 256, 256, true, DType::IQ3_S}),
    [](const ::testing::TestParamInfo<MoeCase>& case_info) {
        return std::string(strata::dtype_name(case_info.param.expert_type)) + "_" +
               strata::dtype_name(case_info.param.down_type) + "_H" + std::to_string(case_info.param.H) + "_E" +
               std::to_string(case_info.param.E);
    });

// ---- hyper-connections ----------------------------------------------------------------------------------------------

// Limit: xn, low and the inject input are quantized to Q8_0 on both sides by the same rule, so the only differences
// are float summation order (~1e-13), expf vs exp in silu/sigmoid, and rarely one activation on the other side of a
// quantization step (~1e-7 each, as for the MoE). F32 weights: no quantization, ~1e-12.
constexpr double kHcNmse = 1e-5;

// The weight types of a read. Decode windows of quantized down/up products with float (or no) inject weights take
// the fused path (one kernel for the pending write, norm, quantization and inject product); the rest, and every
// window of more than 8 tokens, the plain one. Both are checked here against the CPU.
struct HcCase {
    DType down, up, inject;
    int64_t hc, H, r;
};

TEST(CudaHyperConnection, ReadAndWriteMatchTheCpu) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(77);
    cuda::Context& ctx = context();
    // On sm_90+ the fused cases whose down product reads Q8_0 activations take the cluster form of the first kernel
    // (3, 5, 8 and 8 blocks a stream); the Q4_K case takes the one-block form.
    const HcCase cases[] = {
        {DType::Q8_0, DType::Q8_0, DType::Q8_0, 4, 96, 64},     // plain (quantized inject), fused as the final mixer
        {DType::F32, DType::F32, DType::F32, 4, 96, 64},        // plain
        {DType::Q8_0, DType::Q8_0, DType::F16, 4, 96, 64},      // fused: Flash-Next's mix
        {DType::Q4_K, DType::Q8_0, DType::F32, 4, 128, 64},     // fused, Q8_K activations for down
        {DType::IQ4_NL, DType::Q8_0, DType::BF16, 2, 160, 96},  // fused, two streams
        {DType::Q8_0, DType::Q8_0, DType::F16, 4, 2560, 320},   // fused: Flash-Next's shape (a cluster of 8 a stream)
        {DType::Q8_0, DType::Q8_0, DType::Q8_0, 2, 512, 96},    // fused, two streams of 8-block clusters
    };
    for (const HcCase& c : cases) {
        for (const bool with_inject : {true, false}) {
            const int64_t hc = c.hc, H = c.H, r = c.r, HC = hc * H;
            const strata::HyperConnectionShape shape{.n_streams = hc, .n_embd = H, .low_rank = r, .eps = 1e-6f};
            const cuda::HyperConnectionDims dims{.n_streams = hc, .n_embd = H, .low_rank = r, .eps = 1e-6f};
            std::vector<float> norm = gaussian(static_cast<size_t>(HC), rng, 0.2f);
            for (float& v : norm) v += 1.0f;
            Weight down = Weight::random(c.down, {HC, r}, rng, 0.1f), up = Weight::random(c.up, {r, HC}, rng, 0.1f),
                   inject = Weight::random(c.inject, {HC, hc}, rng, 0.1f);
            strata::HyperConnectionWeights cw;
            cw.norm = norm;
            cw.down = down.host_t;
            cw.up = up.host_t;
            if (with_inject) cw.inject = inject.host_t;
            const cuda::DeviceBuffer norm_dev = upload(norm);
            const cuda::HyperConnectionDeviceWeights dw{.norm = norm_dev.as<float>(), .down = &down.dev_t,
                                                        .up = &up.dev_t,
                                                        .inject = with_inject ? &inject.dev_t : nullptr};
            const std::string name = std::string(strata::dtype_name(c.down)) + "/" + strata::dtype_name(c.up) + "/" +
                                     strata::dtype_name(c.inject) + " hc " + std::to_string(hc);
            double worst_mixed = 0, worst_inject = 0, worst_write = 0, worst_pending = 0;
            for (const int64_t T : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{12}}) {
                SCOPED_TRACE(name + " T " + std::to_string(T));
                const std::vector<float> residual = gaussian(static_cast<size_t>(T * HC), rng, 2.0f);
                std::vector<float> mixed(static_cast<size_t>(T * H)), inj(static_cast<size_t>(T * hc));
                strata::Scratch scratch;
                strata::hyper_connection_read({.shape = shape, .weights = cw, .residual = residual.data(),
                                               .mixed = mixed.data(), .inject = with_inject ? inj.data() : nullptr,
                                               .n_tokens = T, .scratch = scratch});
                const cuda::DeviceBuffer dres = upload(residual), dmixed = ctx.allocate(mixed.size() * 4, "test"),
                                         dinj = ctx.allocate(inj.size() * 4, "test"),
                                         dws = ctx.allocate(
                                             static_cast<size_t>(cuda::hyper_connection_workspace_floats(dims, T)) * 4,
                                             "test");
                cuda::hyper_connection_read(ctx, {.shape = dims, .weights = dw, .residual = dres.as<float>(),
                                                  .mixed = dmixed.as<float>(),
                                                  .inject = with_inject ? dinj.as<float>() : nullptr, .n_tokens = T,
                                                  .workspace = dws.as<float>()});
                const double e_m = nmse(download<float>(dmixed.data(), mixed.size()), mixed);
                EXPECT_LE(e_m, kHcNmse);
                worst_mixed = std::max(worst_mixed, e_m);
                if (!with_inject) continue;
                const double e_i = nmse(download<float>(dinj.data(), inj.size()), inj);
                EXPECT_LE(e_i, kHcNmse);
                worst_inject = std::max(worst_inject, e_i);

                // The write, on the same injection weights on both sides: one rounded product and sum per value.
                const std::vector<float> block_out = gaussian(static_cast<size_t>(T * H), rng);
                std::vector<float> res_cpu = residual;
                strata::hyper_connection_write(shape, res_cpu.data(), block_out.data(), inj.data(), T, nullptr);
                const cuda::DeviceBuffer dout = upload(block_out), dinj_cpu = upload(inj);
                cuda::hyper_connection_write(ctx, dims, dres.as<float>(), dout.as<float>(), dinj_cpu.as<float>(), T);
                const std::vector<float> res_gpu = download<float>(dres.data(), res_cpu.size());
                EXPECT_EQ(std::memcmp(res_gpu.data(), res_cpu.data(), res_cpu.size() * 4), 0) << "write not exact";
                worst_write = std::max(worst_write, nmse(res_gpu, res_cpu));

                // The same write left pending and applied by the next read's first kernel: CPU write then read.
                const cuda::DeviceBuffer dres2 = upload(residual), dinj2 = upload(inj);
                std::vector<float> mixed2(mixed.size()), inj2(inj.size());
                strata::hyper_connection_read({.shape = shape, .weights = cw, .residual = res_cpu.data(),
                                               .mixed = mixed2.data(), .inject = inj2.data(), .n_tokens = T,
                                               .scratch = scratch});
                cuda::hyper_connection_read(ctx, {.shape = dims, .weights = dw, .residual = dres2.as<float>(),
                                                  .mixed = dmixed.as<float>(), .inject = dinj2.as<float>(),
                                                  .n_tokens = T, .workspace = dws.as<float>(),
                                                  .pending_block_out = dout.as<float>()});
                const std::vector<float> res2 = download<float>(dres2.data(), res_cpu.size());
                EXPECT_EQ(std::memcmp(res2.data(), res_cpu.data(), res_cpu.size() * 4), 0)
                    << "pending write not exact";
                const double e_p = std::max(nmse(download<float>(dmixed.data(), mixed2.size()), mixed2),
                                            nmse(download<float>(dinj2.data(), inj2.size()), inj2));
                EXPECT_LE(e_p, kHcNmse);
                worst_pending = std::max(worst_pending, e_p);

                // The pending write as an MoE combine left to the read (moe_layer's deferred_combine): the bits of
                // moe_combine followed by the read with its output pending. With and without a shared expert.
                const int n_used = 3;
                const std::vector<float> expert_out = gaussian(static_cast<size_t>(T * n_used * H), rng),
                                         routing = gaussian(static_cast<size_t>(T * n_used), rng, 0.3f),
                                         shared_gate = gaussian(static_cast<size_t>(H), rng, 0.05f),
                                         moe_x = gaussian(static_cast<size_t>(T * H), rng),
                                         shared = gaussian(static_cast<size_t>(T * H), rng);
                const cuda::DeviceBuffer dexp = upload(expert_out), drouting = upload(routing),
                                         dsg = upload(shared_gate), dmx = upload(moe_x), dshared = upload(shared),
                                         dcombined = ctx.allocate(static_cast<size_t>(T * H) * 4, "test");
                for (const bool with_shared : {true, false}) {
                    const cuda::MoeCombine combine{.expert_out = dexp.as<float>(),
                                                   .weights = drouting.as<float>(),
                                                   .n_used = n_used,
                                                   .shared_gate = with_shared ? dsg.as<float>() : nullptr,
                                                   .x = dmx.as<float>(),
                                                   .shared = dshared.as<float>(),
                                                   .out = dcombined.as<float>(),
                                                   .H = H,
                                                   .n_tokens = T};
                    std::vector<float> state[2][3];  // [folded][residual, mixed, inject]
                    for (int folded = 0; folded < 2; ++folded) {
                        const cuda::DeviceBuffer dres3 = upload(residual), dinj3 = upload(inj);
                        if (!folded) cuda::moe_combine(ctx, combine);
                        cuda::hyper_connection_read(ctx, {.shape = dims,
                                                          .weights = dw,
                                                          .residual = dres3.as<float>(),
                                                          .mixed = dmixed.as<float>(),
                                                          .inject = dinj3.as<float>(),
                                                          .n_tokens = T,
                                                          .workspace = dws.as<float>(),
                                                          .pending_block_out = folded ? nullptr : dcombined.as<float>(),
                                                          .pending_combine = folded ? &combine : nullptr});
                        state[folded][0] = download<float>(dres3.data(), residual.size());
                        state[folded][1] = download<float>(dmixed.data(), mixed.size());
                        state[folded][2] = download<float>(dinj3.data(), inj.size());
                    }
                    for (int k = 0; k < 3; ++k)
                        EXPECT_EQ(std::memcmp(state[0][k].data(), state[1][k].data(), state[0][k].size() * 4), 0)
                            << (k == 0   ? "residual"
                                : k == 1 ? "mixed"
                                         : "inject")
                            << " differs with the combine " << (with_shared ? "(shared expert)" : "(no shared expert)")
                            << " left to the read";
                }
            }
            std::printf("[ cuda     ] hyper-connection %s%s: worst NMSE mixed %.3g, inject %.3g, read after a pending "
                        "write %.3g (limit %.0g); write %.3g (bit-exact expected)\n",
                        name.c_str(), with_inject ? "" : " (final mixer)", worst_mixed, worst_inject, worst_pending,
                        kHcNmse, worst_write);
        }
    }
}

// A one-token read that also writes mixed as Q8_0 activations (mixed_q8_0: the up product's mix epilogue in clusters
// of four blocks, sm_90+): products of the three weight types that read Q8_0 activations, given them through
// matmul_shared_input's x_q8_0, give the bits of the same products quantizing the read's mixed themselves.
TEST(CudaHyperConnection, MixedQ8_0GivesTheQuantizersBits) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(78);
    cuda::Context& ctx = context();
    // The cluster code exists in kernels built for sm_90+ only (a 75-virtual build on an H200 has none).
    const bool sm90 = ctx.info().cc_major >= 9 && ctx.info().kernel_arch >= 900;
    if (!sm90)
        std::printf("[ cuda     ] sm_%d%d, kernels for %d: no clusters, the read leaves mixed_q8_0 alone\n",
                    ctx.info().cc_major, ctx.info().cc_minor, ctx.info().kernel_arch);
    for (const auto& [H, r] : {std::pair<int64_t, int64_t>{96, 64}, {2560, 320}}) {
        SCOPED_TRACE("H " + std::to_string(H));
        const int64_t hc = 4, HC = hc * H;
        const cuda::HyperConnectionDims dims{.n_streams = hc, .n_embd = H, .low_rank = r, .eps = 1e-6f};
        std::vector<float> norm = gaussian(static_cast<size_t>(HC), rng, 0.2f);
        for (float& v : norm) v += 1.0f;
        Weight down = Weight::random(DType::Q8_0, {HC, r}, rng, 0.1f),
               up = Weight::random(DType::Q8_0, {r, HC}, rng, 0.1f),
               inject = Weight::random(DType::F16, {HC, hc}, rng, 0.1f);
        const cuda::DeviceBuffer norm_dev = upload(norm);
        const cuda::HyperConnectionDeviceWeights dw{
            .norm = norm_dev.as<float>(), .down = &down.dev_t, .up = &up.dev_t, .inject = &inject.dev_t};
        const cuda::DeviceBuffer dres = upload(gaussian(static_cast<size_t>(HC), rng, 2.0f)),
                                 dmixed = ctx.allocate(static_cast<size_t>(H) * 4, "test"),
                                 dinj = ctx.allocate(static_cast<size_t>(hc) * 4, "test"),
                                 dws = ctx.allocate(
                                     static_cast<size_t>(cuda::hyper_connection_workspace_floats(dims, 1)) * 4, "test"),
                                 dq8 = ctx.allocate(cuda::q8_0_activation_bytes(H), "test");
        const bool wrote = cuda::hyper_connection_read(ctx, {.shape = dims,
                                                             .weights = dw,
                                                             .residual = dres.as<float>(),
                                                             .mixed = dmixed.as<float>(),
                                                             .inject = dinj.as<float>(),
                                                             .n_tokens = 1,
                                                             .workspace = dws.as<float>(),
                                                             .mixed_q8_0 = dq8.data()});
        EXPECT_EQ(wrote, sm90);
        if (!wrote) continue;
        for (const DType t : {DType::Q8_0, DType::Q4_0, DType::IQ4_NL}) {
            const Weight w = Weight::random(t, {H, 48}, rng);
            const cuda::DeviceBuffer y_own = ctx.allocate(48 * 4, "test"), y_ahead = ctx.allocate(48 * 4, "test");
            cuda::matmul_shared_input(ctx, dmixed.as<float>(), 1, {{&w.dev_t, y_own.as<float>()}});
            cuda::matmul_shared_input(ctx, dmixed.as<float>(), 1, {{&w.dev_t, y_ahead.as<float>()}}, dq8.data());
            EXPECT_EQ(std::memcmp(download<float>(y_own.data(), 48).data(), download<float>(y_ahead.data(), 48).data(),
                                  48 * 4),
                      0)
                << strata::dtype_name(t) << ": the product on the read's Q8_0 activations differs";
        }
    }
}

// ---- PLE rows -------------------------------------------------------------------------------------------------------

TEST(CudaPle, GatherFromMappedHostMatchesCpuRows) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937_64 rng64(5);
    std::mt19937 rng(6);
    cuda::Context& ctx = context();
    for (const DType tt : {DType::F16, DType::Q8_0}) {
        const int64_t N = 3, heads_per = 4, n_heads = (N - 1) * heads_per, P = 96, R = 5003;
        const int32_t eos = 7;
        strata::PleShape shape{.n_embd = 0, .n_streams = 0, .ngram = N, .heads_per_ngram = heads_per,
                               .row_width = P, .conv_kernel = 1, .eos = eos};
        for (int64_t n = 0; n < N; ++n) shape.multipliers.push_back(rng64() | 1);
        for (int64_t h = 0; h < n_heads; ++h) {
            const uint64_t size = 1 + rng64() % (R / n_heads);
            shape.sizes.push_back(size);
            shape.offsets.push_back(static_cast<uint64_t>(h * (R / n_heads)));
        }
        const std::vector<uint8_t> table_bytes = random_rows(tt, R, P, rng, 1.0f);
        cuda::MappedHostBuffer table(table_bytes.size());
        std::memcpy(table.host(), table_bytes.data(), table_bytes.size());
        const int64_t ne[2] = {P, R};
        const strata::Tensor host_table = strata::make_tensor("t", tt, 2, ne, table_bytes.data());

        const cuda::DeviceBuffer mult = upload(shape.multipliers), offs = upload(shape.offsets),
                                 sizes = upload(shape.sizes);
        std::vector<int32_t> history(static_cast<size_t>(N - 1), eos);
        cuda::DeviceBuffer dhist = upload(history);
        // A token stream with EOS in it (cuts the windows), in calls of 1, 3 and 8 tokens.
        std::vector<int32_t> stream;
        for (int i = 0; i < 40; ++i) stream.push_back(i % 11 == 5 ? eos : static_cast<int32_t>(rng() % 248320));
        size_t pos = 0;
        int64_t rows_compared = 0;
        double worst = 0;
        bool rows_equal = true;
        for (const int64_t T : {1, 3, 8, 1, 8, 3, 8, 8}) {
            if (pos + static_cast<size_t>(T) > stream.size()) break;
            const std::vector<int32_t> toks(stream.begin() + static_cast<std::ptrdiff_t>(pos),
                                            stream.begin() + static_cast<std::ptrdiff_t>(pos) + T);
            pos += static_cast<size_t>(T);
            std::vector<int64_t> ref_rows;
            std::vector<float> ref(static_cast<size_t>(T * n_heads * P));
            for (int64_t t = 0; t < T; ++t) {
                const std::vector<int64_t> r = strata::ple_rows(shape, history.data(), toks[static_cast<size_t>(t)]);
                for (int64_t h = 0; h < n_heads; ++h)
                    cpu::get_row(host_table, r[static_cast<size_t>(h)], ref.data() + (t * n_heads + h) * P);
                ref_rows.insert(ref_rows.end(), r.begin(), r.end());
                std::copy(history.begin() + 1, history.end(), history.begin());
                history.back() = toks[static_cast<size_t>(t)];
            }
            const cuda::DeviceBuffer dtok = upload(toks),
                                     drows = ctx.allocate(static_cast<size_t>(T * n_heads) * 8, "test"),
                                     staging = ctx.allocate(
                                         static_cast<size_t>(T * n_heads) * strata::row_bytes(tt, P), "test"),
                                     dout = ctx.allocate(ref.size() * 4, "test");
            cuda::ple_gather(ctx, {.ngram = N, .heads_per_ngram = heads_per, .eos = eos,
                                   .multipliers = mult.as<uint64_t>(), .offsets = offs.as<uint64_t>(),
                                   .sizes = sizes.as<uint64_t>(), .table = table.device(), .table_type = tt,
                                   .row_width = P, .table_rows = R, .tokens = dtok.as<int32_t>(),
                                   .history = dhist.as<int32_t>(), .n_tokens = T, .rows = drows.as<int64_t>(),
                                   .staging = staging.data(), .out = dout.as<float>()});
            const std::vector<int64_t> rows = download<int64_t>(drows.data(), ref_rows.size());
            rows_equal = rows_equal && rows == ref_rows;
            EXPECT_EQ(rows, ref_rows);
            const std::vector<float> got = download<float>(dout.data(), ref.size());
            const double e = nmse(got, ref);
            worst = std::max(worst, e);
            // F16 rows convert exactly; Q8_0 rows are d * q on both sides (exact in f32).
            EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << strata::dtype_name(tt);
            EXPECT_EQ(download<int32_t>(dhist.data(), history.size()), history);
            rows_compared += static_cast<int64_t>(rows.size());
        }
        std::printf("[ cuda     ] PLE %s table from mapped host memory: %lld rows, ids %s, NMSE %.3g (bit-exact "
                    "expected)\n",
                    strata::dtype_name(tt), static_cast<long long>(rows_compared), rows_equal ? "identical" : "DIFFER",
                    worst);
    }
}

// ---- sampling -------------------------------------------------------------------------------------------------------

constexpr int64_t kVocab = 248320;

int32_t gpu_greedy(const std::vector<float>& logits, cuda::SamplingWorkspace& ws) {
    const cuda::DeviceBuffer d = upload(logits), out = context().allocate(4, "test");
    cuda::sample_greedy(context(), d.as<float>(), static_cast<int64_t>(logits.size()), out.as<int32_t>(), ws);
    return download<int32_t>(out.data(), 1)[0];
}

TEST(CudaSampling, GreedyMatchesArgmaxLowest) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(11);
    cuda::SamplingWorkspace ws(context(), kVocab);
    int checked = 0;
    for (const int64_t n : {kVocab, int64_t{7}, int64_t{100003}, int64_t{1}}) {
        std::vector<float> l = gaussian(static_cast<size_t>(n), rng, 3.0f);
        auto check = [&](const char* what) {
            EXPECT_EQ(gpu_greedy(l, ws), strata::argmax_lowest(l)) << what << " n " << n;
            ++checked;
        };
        check("random");
        if (n > 5) {
            const float top = *std::max_element(l.begin(), l.end()) + 1.0f;
            l[static_cast<size_t>(n - 1)] = top;
            l[static_cast<size_t>(n / 2)] = top;
            l[static_cast<size_t>(3)] = top;
            check("ties");
            std::fill(l.begin(), l.end(), -1.0f);
            l[static_cast<size_t>(n - 2)] = 0.0f;
            l[static_cast<size_t>(2)] = -0.0f;
            check("-0 before +0");
            l[static_cast<size_t>(2)] = -std::numeric_limits<float>::infinity();
            check("-inf");
            l[static_cast<size_t>(n / 3)] = std::numeric_limits<float>::quiet_NaN();
            check("NaN");
            std::fill(l.begin(), l.end(), -std::numeric_limits<float>::infinity());
            check("all -inf");
        }
    }
    std::printf("[ cuda     ] greedy: %d rows identical to argmax_lowest (ties, -0/+0, NaN, all -inf)\n", checked);
}

TEST(CudaSampling, TopKMatchesTheCpuSampler) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(12);
    cuda::Context& ctx = context();
    cuda::SamplingWorkspace ws(ctx, kVocab);
    const cuda::DeviceBuffer du = ctx.allocate(8, "test"), dout = ctx.allocate(4, "test");
    int compared = 0, differing = 0;
    for (int row = 0; row < 2; ++row) {
        std::vector<float> l = gaussian(static_cast<size_t>(kVocab), rng, 3.0f);
        if (row == 1)  // coarse logits: many exact ties, at the top-k boundary too
            for (float& v : l) v = std::round(v * 4.0f) / 4.0f;
        const cuda::DeviceBuffer dl = upload(l);
        for (const int32_t k : {1, 40, 1000, 1024})
            for (const float top_p : {1.0f, 0.9f, 0.3f})
                for (const float min_p : {0.0f, 0.05f})
                    for (const float temp : {0.7f, 1.0f, 1.6f})
                        for (uint64_t seed = 1; seed <= 2; ++seed) {
                            strata::SamplingParams p;
                            p.temperature = temp;
                            p.top_k = k;
                            p.top_p = top_p;
                            p.min_p = min_p;
                            p.seed = seed * 1000003 + static_cast<uint64_t>(k);
                            strata::Sampler sampler(p, kVocab);
                            const int32_t want = sampler.sample(l);
                            std::mt19937_64 draw(p.seed);  // the sampler's one draw for this token
                            const double u = static_cast<double>(draw() >> 11) * 0x1.0p-53;
                            CHECK_CUDA(cudaMemcpyAsync(du.data(), &u, 8, cudaMemcpyHostToDevice,
                                                       ctx.stream().handle()));
                            cuda::sample_top_k(ctx,
                                               {.logits = dl.as<float>(), .n_vocab = kVocab, .top_k = k,
                                                .top_p = top_p,
                                                .floor_logit = min_p > 0.0f ? std::log(min_p)
                                                                            : -std::numeric_limits<float>::infinity(),
                                                .inv_temperature = 1.0 / static_cast<double>(temp),
                                                .uniform = du.as<double>(), .out = dout.as<int32_t>()},
                                               ws);
                            const int32_t got = download<int32_t>(dout.data(), 1)[0];
                            EXPECT_EQ(got, want) << "row " << row << " k " << k << " top_p " << top_p << " min_p "
                                                 << min_p << " T " << temp << " u " << u;
                            ++compared;
                            differing += got != want;
                        }
    }
    std::printf("[ cuda     ] top-k sampling: %d draws compared with Sampler::sample, %d differ\n", compared,
                differing);
}

// ---- timing (STRATA_CUDA_PERF=1) ------------------------------------------------------------------------------------

// `pattern_rows` distinct quantized rows tiled over rows x in (realistic bytes without quantizing billions of weights).
std::vector<uint8_t> tiled_rows(DType t, int64_t rows, int64_t in, std::mt19937& rng) {
    constexpr int64_t kPattern = 64;
    const std::vector<uint8_t> pattern = random_rows(t, kPattern, in, rng);
    const size_t rb = strata::row_bytes(t, in);
    std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(w.data() + rb * static_cast<size_t>(r), pattern.data() + rb * static_cast<size_t>(r % kPattern),
                    rb);
    return w;
}

// One device tensor made of host bytes.
struct DeviceTensor {
    cuda::DeviceBuffer buf;
    strata::Tensor t;
    DeviceTensor(DType type, std::vector<int64_t> ne, const std::vector<uint8_t>& bytes) {
        buf = context().upload(bytes.data(), bytes.size(), "perf weights");
        t = strata::make_tensor("w", type, static_cast<int>(ne.size()), ne.data(), buf.data());
        t.device = strata::Device::Cuda;
    }
};

// The Flash-Next MoE layer at decode: 12 layers with their own weights (so nothing a replay reads was left in L2 by
// the replay before) and their own inputs in one graph; per layer = replay / 12.
TEST(CudaPerf, FlashNextMoeLayer) {
    if (!std::getenv("STRATA_CUDA_PERF")) GTEST_SKIP() << "set STRATA_CUDA_PERF=1 for the CUDA timing run";
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    const double copy_gbs = copy_bandwidth_gbs(ctx);
    constexpr int64_t kLayers = 12, H = 2560, E = 512, K = 10, F = 640, FS = 640;
    std::printf("[ perf     ] %s, %d SMs, L2 %.0f MB; device copy (read + write) %.0f GB/s\n", ctx.info().name.c_str(),
                ctx.info().multiprocessors, ctx.info().l2_bytes / 1e6, copy_gbs);
    std::printf("[ perf     ] Flash-Next MoE layer at decode: %lld experts top-%lld, hidden %lld, experts %lld wide "
                "(down q8_0: 640 is no multiple of 256), shared expert %lld (q8_0), router f32; 12 layers in one "
                "graph, median of 21 replays / 12\n",
                static_cast<long long>(E), static_cast<long long>(K), static_cast<long long>(H),
                static_cast<long long>(F), static_cast<long long>(FS));
    std::printf("[ perf     ] %-8s %3s %10s %10s %8s %7s %12s\n", "experts", "T", "us/layer", "MB/layer", "GB/s",
                "%copy", "roofline us");
    std::mt19937 rng(21);
    const std::vector<uint8_t> router_bytes = [&] {
        std::vector<float> r = gaussian(static_cast<size_t>(H * E), rng, 0.05f);
        std::vector<uint8_t> b(r.size() * 4);
        std::memcpy(b.data(), r.data(), b.size());
        return b;
    }();
    const std::vector<uint8_t> down_bytes = tiled_rows(DType::Q8_0, H * E, F, rng);
    const std::vector<uint8_t> sgp = tiled_rows(DType::Q8_0, FS, H, rng), sdn = tiled_rows(DType::Q8_0, H, FS, rng);
    const std::vector<float> shared_gate = gaussian(static_cast<size_t>(H), rng, 0.05f);
    for (const DType type : {DType::IQ2_XS, DType::Q4_K}) {
        const std::vector<uint8_t> gate_bytes = tiled_rows(type, F * E, H, rng);
        struct Layer {
            std::unique_ptr<DeviceTensor> router, gate, up, down, sgate, sup, sdown;
            cuda::DeviceBuffer shared_gate, x, out;
            cuda::MoeLayerWeights w;
            std::unique_ptr<cuda::MoeWorkspace> ws;
        };
        const cuda::MoeLayerShape shape{.n_embd = H, .n_expert = E, .n_expert_used = K, .n_ff = F, .n_ff_shared = FS};
        std::vector<Layer> layers(kLayers);
        for (Layer& l : layers) {
            l.router = std::make_unique<DeviceTensor>(DType::F32, std::vector<int64_t>{H, E}, router_bytes);
            l.gate = std::make_unique<DeviceTensor>(type, std::vector<int64_t>{H, F, E}, gate_bytes);
            l.up = std::make_unique<DeviceTensor>(type, std::vector<int64_t>{H, F, E}, gate_bytes);
            l.down = std::make_unique<DeviceTensor>(DType::Q8_0, std::vector<int64_t>{F, H, E}, down_bytes);
            l.sgate = std::make_unique<DeviceTensor>(DType::Q8_0, std::vector<int64_t>{H, FS}, sgp);
            l.sup = std::make_unique<DeviceTensor>(DType::Q8_0, std::vector<int64_t>{H, FS}, sgp);
            l.sdown = std::make_unique<DeviceTensor>(DType::Q8_0, std::vector<int64_t>{FS, H}, sdn);
            l.shared_gate = upload(shared_gate);
            const std::vector<float> x = gaussian(static_cast<size_t>(8 * H), rng);
            l.x = upload(x);
            l.out = ctx.allocate(x.size() * 4, "perf");
            l.w = {.router = &l.router->t, .gate = &l.gate->t, .up = &l.up->t, .down = &l.down->t,
                   .shared_gate = l.shared_gate.as<float>(), .shared_gate_proj = &l.sgate->t, .shared_up = &l.sup->t,
                   .shared_down = &l.sdown->t};
            l.ws = std::make_unique<cuda::MoeWorkspace>(ctx, shape, l.w);
        }
        for (const int64_t T : {int64_t{1}, int64_t{8}}) {
            const double us = graph_median_us(ctx, [&] {
                for (Layer& l : layers)
                    cuda::moe_layer(ctx, {.shape = shape, .weights = l.w, .x = l.x.as<float>(),
                                          .out = l.out.as<float>(), .n_tokens = T, .workspace = *l.ws});
            }) / kLayers;
            // Bytes: the router, the distinct experts the tokens chose (gate, up, down slices), the shared expert.
            std::vector<int32_t> ids = download<int32_t>(layers[0].ws->expert_ids(), static_cast<size_t>(T * K));
            std::sort(ids.begin(), ids.end());
            const int64_t distinct = std::unique(ids.begin(), ids.end()) - ids.begin();
            const double expert_bytes = 2.0 * F * strata::row_bytes(type, H) + H * strata::row_bytes(DType::Q8_0, F);
            const double bytes = H * E * 4.0 + distinct * expert_bytes + 2.0 * FS * strata::row_bytes(DType::Q8_0, H) +
                                 H * strata::row_bytes(DType::Q8_0, FS);
            const double gbs = bytes / (us * 1e-6) / 1e9;
            std::printf("[ perf     ] %-8s %3lld %10.2f %10.2f %8.0f %6.1f%% %12.2f   (%lld distinct experts)\n",
                        strata::dtype_name(type), static_cast<long long>(T), us, bytes / 1e6, gbs,
                        100.0 * gbs / copy_gbs, bytes / (copy_gbs * 1e9) * 1e6, static_cast<long long>(distinct));
        }
    }

    // Sampling over the Flash-Next vocabulary (the 1 MB row stays in L2 across calls: latency, not bandwidth).
    cuda::SamplingWorkspace ws(ctx, kVocab);
    const std::vector<float> l = gaussian(static_cast<size_t>(kVocab), rng, 3.0f);
    const cuda::DeviceBuffer dl = upload(l), dout = ctx.allocate(4, "perf");
    const double u = 0.37;
    const cuda::DeviceBuffer du = context().upload(&u, 8, "perf");
    constexpr int kCalls = 20;
    const double greedy_us = graph_median_us(ctx, [&] {
        for (int i = 0; i < kCalls; ++i) cuda::sample_greedy(ctx, dl.as<float>(), kVocab, dout.as<int32_t>(), ws);
    }) / kCalls;
    const double topk_us = graph_median_us(ctx, [&] {
        for (int i = 0; i < kCalls; ++i)
            cuda::sample_top_k(ctx, {.logits = dl.as<float>(), .n_vocab = kVocab, .top_k = 40, .top_p = 0.95f,
                                     .floor_logit = std::log(0.05f), .inv_temperature = 1.0 / 0.8,
                                     .uniform = du.as<double>(), .out = dout.as<int32_t>()},
                               ws);
    }) / kCalls;
    std::printf("[ perf     ] sampling over %lld logits (%.2f MB, roofline %.2f us): greedy %.2f us, top-k 40 / top-p "
                "0.95 / min-p 0.05 / T 0.8 %.2f us (graph of %d calls, median of 21)\n",
                static_cast<long long>(kVocab), kVocab * 4 / 1e6, kVocab * 4.0 / (copy_gbs * 1e9) * 1e6, greedy_us,
                topk_us, kCalls);
}

#endif  // STRATA_HAS_CUDA

}  // namespace
