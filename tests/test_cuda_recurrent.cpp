// CUDA parity of the recurrent and elementwise ops of the GDN and attention blocks (issue 7) against the CPU
// reference in backend/cpu/ops.h: the gated delta rule over windows of 1, 7, 64 and 300 tokens for many heads
// (state and outputs, against cpu::gated_delta_step token by token), a window split over calls against one call,
// the causal conv over a window (and its history), the grouped RMS norm, the L2 norm, sigmoid and SiLU-times-up.
//
// Without the CUDA backend compiled in (-DSTRATA_CUDA=ON) or without a GPU, every test skips with a message saying
// so. STRATA_CUDA_PERF=1 adds a timing run of the delta-rule window kernel (32 heads of 128 x 128, T = 1, 64, 512)
// next to the device-to-device copy bandwidth measured in the same run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"

#if STRATA_HAS_CUDA
#include <cuda_runtime.h>

#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "gdn_test_inputs.h"
#endif

namespace {

#if !STRATA_HAS_CUDA

TEST(CudaRecurrent, SkippedWithoutTheBackend) {
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): CUDA recurrent op tests skipped";
}

#else

namespace cuda = strata::cuda;
namespace cpu = strata::cpu;
using namespace strata::cuda_test;
constexpr const char* kDeviceTests = "CUDA recurrent op tests";

constexpr int64_t kSentinels = 64;  // values after an output that must stay poison

std::vector<float> download(const cuda::DeviceBuffer& b, size_t n) {
    return strata::cuda_test::download<float>(b.data(), n);
}

// The largest |got - ref| / |ref| (|ref| floored at 1e-30 so exact zeros compare absolutely).
double max_relative_error(const float* got, const float* ref, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(got[i]) && got[i] != ref[i]) return INFINITY;
        if (got[i] == ref[i]) continue;
        worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]) /
                                    std::max(std::fabs(static_cast<double>(ref[i])), 1e-30));
    }
    return worst;
}

// ---- gated delta rule -----------------------------------------------------------------------------------------------

// The device copies of one window's inputs, and a call over tokens [first, first + count).
struct DeviceDelta {
    const DeltaInputs& in;
    cuda::DeviceBuffer rows, g, beta, state, out;

    explicit DeviceDelta(const DeltaInputs& inputs) : in(inputs) {
        cuda::Context& ctx = context();
        rows = ctx.upload(in.rows.data(), in.rows.size() * 4, "test");
        g = ctx.upload(in.g.data(), in.g.size() * 4, "test");
        beta = ctx.upload(in.beta.data(), in.beta.size() * 4, "test");
        state = ctx.upload(in.state.data(), in.state.size() * 4, "test");
        const std::vector<float> poisoned(static_cast<size_t>(in.n_tokens * in.out_row() + kSentinels), poison());
        out = ctx.upload(poisoned.data(), poisoned.size() * 4, "test");
    }
    void run(int64_t first, int64_t count) {
        const int64_t key_dim = in.s.key_heads * in.s.dk;
        const float* r = rows.as<float>() + first * in.row;
        cuda::gated_delta(context(), {.state = state.as<float>(),
                                      .q = r,
                                      .k = r + key_dim,
                                      .v = r + 2 * key_dim,
                                      .q_stride = in.row,
                                      .k_stride = in.row,
                                      .v_stride = in.row,
                                      .g = g.as<float>() + first * in.s.heads,
                                      .beta = beta.as<float>() + first * in.s.heads,
                                      .out = out.as<float>() + first * in.out_row(),
                                      .out_stride = in.out_row(),
                                      .n_tokens = count,
                                      .heads = in.s.heads,
                                      .key_heads = in.s.key_heads,
                                      .tiled_value_heads = in.s.tiled,
                                      .dk = in.s.dk,
                                      .dv = in.s.dv});
    }
};

std::string shape_name(const DeltaShape& s) {
    return "dk " + std::to_string(s.dk) + " dv " + std::to_string(s.dv) + " heads " + std::to_string(s.heads) + "/" +
           std::to_string(s.key_heads) + (s.tiled ? " tiled" : "");
}

// Both sides compute the same function per token in f32 (decay, S^T k, delta, rank-1 update, output); the device sums
// each dot product in a different order (16-value partial sums combined by shuffles), contracts multiply-adds into
// FMAs, forms the output as S'^T q + delta (k . q) with S' the decayed state (the same value as (S' + k delta^T)^T q,
// one reduction fewer; both terms are of the order of the output, so nothing cancels), and takes exp(g) from the
// device's expf (within 2 ulp) instead of the host's. Each of those is a relative step of ~6e-8; the state carries
// them from token to token, but the update S (I - beta k k^T) exp(g) with |k| = 1, beta in (0, 1) and g < 0 does not
// grow them, so after 300 tokens the NMSE stays near (1e-6)^2 = 1e-12 or below (the H200 gave ~1e-15 for the state,
// ~1e-13 for the outputs). 1e-9 leaves margin, while one misplaced column (1/dv of the values), a skipped token or a
// missing decay costs >= 1e-4.
constexpr double kDeltaNmse = 1e-9;

TEST(CudaGatedDelta, MatchesTheCpuStepTokenByToken) {
    SKIP_WITHOUT_DEVICE();
    const DeltaShape shapes[] = {{64, 64, 8, 4, false}, {128, 128, 6, 3, true}, {128, 80, 4, 4, false},
                                 {256, 128, 2, 1, false}, {16, 16, 4, 2, true}, {32, 24, 3, 1, false}};
    std::mt19937 rng(2026);
    for (const DeltaShape& s : shapes)
        for (const int64_t tokens : {1, 7, 64, 300}) {
            SCOPED_TRACE(shape_name(s) + " tokens " + std::to_string(tokens));
            const DeltaInputs in(s, tokens, rng);
            std::vector<float> ref_state = in.state, ref_out(static_cast<size_t>(tokens * in.out_row()));
            in.reference(0, tokens, ref_state, ref_out);
            DeviceDelta dev(in);
            dev.run(0, tokens);
            const std::vector<float> state = download(dev.state, ref_state.size());
            const std::vector<float> out = download(dev.out, ref_out.size() + kSentinels);
            int64_t unwritten = 0, clobbered = 0;
            for (size_t i = 0; i < ref_out.size(); ++i) unwritten += is_poison(out[i]);
            for (size_t i = ref_out.size(); i < out.size(); ++i) clobbered += !is_poison(out[i]);
            EXPECT_EQ(unwritten, 0);
            EXPECT_EQ(clobbered, 0);
            const double state_nmse = nmse(state.data(), ref_state.data(), state.size());
            const double out_nmse = unwritten ? INFINITY : nmse(out.data(), ref_out.data(), ref_out.size());
            EXPECT_LE(state_nmse, kDeltaNmse);
            EXPECT_LE(out_nmse, kDeltaNmse);
            std::printf("[ cuda     ] gated_delta %-28s T=%-3lld NMSE state %.3g out %.3g (threshold %.0g)\n",
                        shape_name(s).c_str(), static_cast<long long>(tokens), state_nmse, out_nmse, kDeltaNmse);
        }
}

// Every token is computed by the same instructions wherever the window starts, and the state goes to memory as the
// f32 values the kernel holds, so a window split over calls gives the same bits as one call (what makes prefill,
// chunked prompts and decode agree).
TEST(CudaGatedDelta, SplitWindowEqualsOneCallBitForBit) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(77);
    const DeltaInputs in({128, 128, 4, 2, false}, 300, rng);
    DeviceDelta whole(in), split(in), single(in);
    whole.run(0, 300);
    split.run(0, 137);
    split.run(137, 163);
    for (int64_t t = 0; t < 7; ++t) single.run(t, 1);
    single.run(7, 293);
    const size_t n_state = in.state.size(), n_out = static_cast<size_t>(300 * in.out_row());
    const std::vector<float> ws = download(whole.state, n_state), wo = download(whole.out, n_out);
    for (DeviceDelta* d : {&split, &single}) {
        const std::vector<float> s = download(d->state, n_state), o = download(d->out, n_out);
        EXPECT_EQ(std::memcmp(s.data(), ws.data(), n_state * 4), 0) << (d == &split ? "137 + 163" : "7 x 1 + 293");
        EXPECT_EQ(std::memcmp(o.data(), wo.data(), n_out * 4), 0) << (d == &split ? "137 + 163" : "7 x 1 + 293");
    }
}

TEST(CudaGatedDelta, RejectsBadShapes) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    const cuda::DeviceBuffer b = ctx.allocate(1 << 20, "test");
    float* p = b.as<float>();
    const cuda::GatedDeltaArgs good{.state = p, .q = p, .k = p, .v = p, .g = p, .beta = p, .out = p, .n_tokens = 1,
                                    .heads = 2, .key_heads = 1, .dk = 64, .dv = 64};
    cuda::GatedDeltaArgs a = good;
    a.dk = 96;
    expect_error([&] { cuda::gated_delta(ctx, a); }, "dk = 96");
    a = good;
    a.key_heads = 3;
    expect_error([&] { cuda::gated_delta(ctx, a); }, "key heads");
    a = good;
    a.q = p + 1;
    expect_error([&] { cuda::gated_delta(ctx, a); }, "16-byte aligned");
    a = good;
    a.state = nullptr;
    expect_error([&] { cuda::gated_delta(ctx, a); }, "null pointer");
    expect_error([&] { cuda::causal_conv(ctx, {.x = p, .w = p, .history = p, .out = p, .n_tokens = 1, .channels = 4,
                                               .kernel = 0}); },
                 "kernel 0");
    ctx.synchronize();
}

// ---- causal conv ----------------------------------------------------------------------------------------------------

struct ConvCase {
    int64_t channels, tokens, kernel, dilation;
};

// The device does cpu::causal_conv_step's operations in its order: the current input's product, then one fused
// multiply-add per tap, which is what the host compiler emits in the reference's x86-64-v3/v4 clones (GCC contracts
// `out += w * in` in C++ mode). On a host with AVX2 and FMA, where those clones run, outputs and history must equal
// the CPU's bit for bit. Elsewhere (the baseline clone rounds each product) every output may differ by one rounding
// per tap: |diff| <= kernel * 2^-24 * sum |w * in| is the bound there. The history is copied, never rounded: equal
// everywhere.
TEST(CudaCausalConv, EqualsTheCpuStepsBitForBit) {
    SKIP_WITHOUT_DEVICE();
    // From 64 tokens a thread takes a run of 32 tokens and the history is rewritten by a second launch: runs that
    // end inside the window, taps that reach back over a run's start or into the history, dilations, kernel 1.
    const ConvCase cases[] = {{1, 1, 4, 1},    {37, 5, 4, 1},    {8195, 64, 4, 1}, {8192, 1, 4, 1}, {37, 3, 4, 2},
                              {64, 9, 2, 3},   {16, 4, 1, 1},    {300, 2, 4, 1},   {37, 100, 4, 2}, {5, 70, 4, 3},
                              {300, 63, 4, 1}, {259, 129, 1, 1}, {48, 4096, 4, 1}};
    std::mt19937 rng(5);
    cuda::Context& ctx = context();
    const bool host_has_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    std::printf("[ cuda     ] causal_conv: host %s FMA: %s\n", host_has_fma ? "has" : "lacks",
                host_has_fma ? "outputs must equal the CPU's bit for bit" : "outputs within one rounding per tap");
    for (const ConvCase& c : cases) {
        SCOPED_TRACE("channels " + std::to_string(c.channels) + " tokens " + std::to_string(c.tokens) + " kernel " +
                     std::to_string(c.kernel) + " dilation " + std::to_string(c.dilation));
        const int64_t hist_rows = (c.kernel - 1) * c.dilation, x_stride = c.channels + 3;
        const std::vector<float> x = gaussian(static_cast<size_t>(c.tokens * x_stride), rng);
        const std::vector<float> w = gaussian(static_cast<size_t>(c.kernel * c.channels), rng, 0.5f);
        std::vector<float> history = gaussian(static_cast<size_t>(std::max<int64_t>(hist_rows, 1) * c.channels), rng);
        std::vector<float> ref(static_cast<size_t>(c.tokens * c.channels));
        const cuda::DeviceBuffer dx = ctx.upload(x.data(), x.size() * 4, "test");
        const cuda::DeviceBuffer dw = ctx.upload(w.data(), w.size() * 4, "test");
        const cuda::DeviceBuffer dh = ctx.upload(history.data(), history.size() * 4, "test");
        const std::vector<float> poisoned(ref.size() + kSentinels, poison());
        const cuda::DeviceBuffer dout = ctx.upload(poisoned.data(), poisoned.size() * 4, "test");
        cuda::causal_conv(ctx, {.x = dx.as<float>(), .x_stride = x_stride, .w = dw.as<float>(),
                                .history = dh.as<float>(), .out = dout.as<float>(), .out_stride = c.channels,
                                .n_tokens = c.tokens, .channels = c.channels, .kernel = c.kernel,
                                .dilation = c.dilation});
        // sum over the taps of |w * in| per output, for the bound without FMA (the inputs as the CPU sees them).
        std::vector<double> magnitude(ref.size(), 0.0);
        {
            std::vector<float> hist_copy = history, scratch(static_cast<size_t>(c.channels));
            std::vector<float> abs_w(w.size());
            for (size_t i = 0; i < w.size(); ++i) abs_w[i] = std::fabs(w[i]);
            for (float& v : hist_copy) v = std::fabs(v);
            for (int64_t t = 0; t < c.tokens; ++t) {
                std::vector<float> abs_x(static_cast<size_t>(c.channels));
                for (int64_t ch = 0; ch < c.channels; ++ch)
                    abs_x[static_cast<size_t>(ch)] = std::fabs(x[t * x_stride + ch]);
                cpu::causal_conv_step({.x = abs_x.data(), .w = abs_w.data(), .history = hist_copy.data(),
                                       .out = scratch.data(), .channels = c.channels, .kernel = c.kernel,
                                       .dilation = c.dilation});
                for (int64_t ch = 0; ch < c.channels; ++ch)
                    magnitude[static_cast<size_t>(t * c.channels + ch)] = 1.001 * scratch[static_cast<size_t>(ch)];
            }
        }
        for (int64_t t = 0; t < c.tokens; ++t)
            cpu::causal_conv_step({.x = x.data() + t * x_stride, .w = w.data(), .history = history.data(),
                                   .out = ref.data() + t * c.channels, .channels = c.channels, .kernel = c.kernel,
                                   .dilation = c.dilation});
        const std::vector<float> out = download(dout, poisoned.size()), hist = download(dh, history.size());
        if (host_has_fma) {
            EXPECT_EQ(std::memcmp(out.data(), ref.data(), ref.size() * 4), 0);
        } else {
            for (size_t i = 0; i < ref.size(); ++i)
                EXPECT_LE(std::fabs(static_cast<double>(out[i]) - ref[i]), c.kernel * 0x1p-24 * magnitude[i]) << i;
        }
        EXPECT_EQ(std::memcmp(hist.data(), history.data(), history.size() * 4), 0);
        int64_t clobbered = 0;
        for (size_t i = ref.size(); i < out.size(); ++i) clobbered += !is_poison(out[i]);
        EXPECT_EQ(clobbered, 0);
    }
}

// ---- norms ----------------------------------------------------------------------------------------------------------

// The squares are exact in double on both sides and only the order of the double additions differs (relative
// ~1e-16), so the f32 scale is the CPU's or, when the double sum straddles a rounding boundary, one ulp away; the
// products are rounded one by one as on the CPU. Per value that is at most ~2 ulp (2.4e-7 relative); 5e-7 (4 ulp)
// is the bound, while a wrong group, gamma offset or scale is off by far more.
constexpr double kNormRelative = 5e-7;

TEST(CudaNorms, RmsNormGroupedMatchesTheCpu) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(11);
    cuda::Context& ctx = context();
    struct Case {
        int64_t tokens, groups, group;
        int gamma;  // 0 none, 1 per group, 2 shared
        bool in_place;
    };
    const Case cases[] = {{5, 16, 128, 1, false}, {5, 16, 128, 2, true}, {3, 7, 37, 0, false},
                          {2, 1, 4096, 1, true},  {1, 32, 64, 2, false}, {3, 4, 2560, 1, false}};
    for (const Case& c : cases) {
        SCOPED_TRACE("tokens " + std::to_string(c.tokens) + " groups " + std::to_string(c.groups) + " x " +
                     std::to_string(c.group) + " gamma " + std::to_string(c.gamma));
        const int64_t width = c.groups * c.group, stride = width + 8;
        const std::vector<float> x = gaussian(static_cast<size_t>(c.tokens * stride), rng, 3.0f);
        const std::vector<float> gamma = gaussian(static_cast<size_t>(c.gamma == 2 ? c.group : width), rng);
        std::vector<float> full_gamma(static_cast<size_t>(width));
        for (int64_t i = 0; i < width; ++i) full_gamma[i] = gamma[static_cast<size_t>(c.gamma == 2 ? i % c.group : i)];
        std::vector<float> ref = x;
        for (int64_t t = 0; t < c.tokens; ++t)
            cpu::rms_norm_grouped(x.data() + t * stride, c.groups, c.group, c.gamma ? full_gamma.data() : nullptr,
                                  1e-6f, ref.data() + t * stride);
        const cuda::DeviceBuffer dx = ctx.upload(x.data(), x.size() * 4, "test");
        const cuda::DeviceBuffer dg = ctx.upload(gamma.data(), gamma.size() * 4, "test");
        const cuda::DeviceBuffer dout = ctx.upload(x.data(), x.size() * 4, "test");  // the gaps keep x's values
        cuda::rms_norm_grouped(ctx, {.x = dx.as<float>(), .out = c.in_place ? dx.as<float>() : dout.as<float>(),
                                     .n_tokens = c.tokens, .row_stride = stride, .n_groups = c.groups,
                                     .group = c.group, .gamma = c.gamma ? dg.as<float>() : nullptr,
                                     .gamma_shared = c.gamma == 2, .eps = 1e-6f});
        const std::vector<float> out = download(c.in_place ? dx : dout, x.size());
        const double err = max_relative_error(out.data(), ref.data(), ref.size());
        EXPECT_LE(err, kNormRelative);
        std::printf("[ cuda     ] rms_norm_grouped %lld x %lld x %lld: max relative error %.3g (bound %.0g)\n",
                    static_cast<long long>(c.tokens), static_cast<long long>(c.groups),
                    static_cast<long long>(c.group), err, kNormRelative);
    }
}

TEST(CudaNorms, L2NormMatchesTheCpuAndLeavesTheRestOfTheRow) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(12);
    cuda::Context& ctx = context();
    // q heads of 7 tokens inside rows that also hold k and v (the model normalises q and k in the conv output).
    const int64_t tokens = 7, groups = 8, group = 128, stride = 3 * groups * group;
    const std::vector<float> x = gaussian(static_cast<size_t>(tokens * stride), rng, 2.0f);
    std::vector<float> ref = x;
    for (int64_t t = 0; t < tokens; ++t)
        for (int64_t g = 0; g < groups; ++g) {
            float* v = ref.data() + t * stride + g * group;
            cpu::l2_norm(v, group, 1e-6f, v);
        }
    const cuda::DeviceBuffer dx = ctx.upload(x.data(), x.size() * 4, "test");
    cuda::l2_norm(ctx, {.x = dx.as<float>(), .out = dx.as<float>(), .n_tokens = tokens, .row_stride = stride,
                        .n_groups = groups, .group = group, .eps = 1e-6f});
    const std::vector<float> out = download(dx, x.size());
    const double err = max_relative_error(out.data(), ref.data(), ref.size());
    EXPECT_LE(err, kNormRelative);
    std::printf("[ cuda     ] l2_norm %lld x %lld x %lld in rows of %lld: max relative error %.3g (bound %.0g)\n",
                static_cast<long long>(tokens), static_cast<long long>(groups), static_cast<long long>(group),
                static_cast<long long>(stride), err, kNormRelative);
}

// ---- activations ----------------------------------------------------------------------------------------------------

// The host's exp (an AVX-512 polynomial within 2 ulp of expf, or expf) and the device's expf (within 2 ulp) may differ
// by ~4 ulp; 1 + e, the division and the product add a rounding each: at most ~7 ulp (8e-7) relative. 1.5e-6 is the
// bound; a wrong formula or index is off by orders more.
constexpr double kActivationRelative = 1.5e-6;

TEST(CudaActivations, SigmoidAndSiluMulMatchTheCpu) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(13);
    cuda::Context& ctx = context();
    for (const int64_t n : {int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
        SCOPED_TRACE("n " + std::to_string(n));
        const std::vector<float> x = gaussian(static_cast<size_t>(n), rng, 6.0f);
        const std::vector<float> u = gaussian(static_cast<size_t>(n), rng);
        std::vector<float> ref_sigmoid = x, ref_silu = x;
        cpu::sigmoid_inplace(ref_sigmoid.data(), n);
        cpu::silu_mul(ref_silu.data(), u.data(), n);
        const cuda::DeviceBuffer da = ctx.upload(x.data(), x.size() * 4, "test");
        const cuda::DeviceBuffer db = ctx.upload(x.data(), x.size() * 4, "test");
        const cuda::DeviceBuffer du = ctx.upload(u.data(), u.size() * 4, "test");
        cuda::sigmoid_inplace(ctx, da.as<float>(), n);
        cuda::silu_mul(ctx, db.as<float>(), du.as<float>(), n);
        const std::vector<float> sig = download(da, x.size()), silu = download(db, x.size());
        const double e1 = max_relative_error(sig.data(), ref_sigmoid.data(), sig.size());
        const double e2 = max_relative_error(silu.data(), ref_silu.data(), silu.size());
        EXPECT_LE(e1, kActivationRelative);
        EXPECT_LE(e2, kActivationRelative);
        std::printf("[ cuda     ] n %-8lld sigmoid max relative error %.3g, silu_mul %.3g (bound %.2g)\n",
                    static_cast<long long>(n), e1, e2, kActivationRelative);
    }
}

// ---- performance (STRATA_CUDA_PERF=1) -------------------------------------------------------------------------------

// 32 value heads (32 key heads) of 128 x 128: a CUDA graph of calls replayed 5 times (median), the state rotated over
// enough copies to span 4x the L2 so every call reads and writes HBM.
TEST(CudaPerf, GatedDeltaWindow) {
    if (!std::getenv("STRATA_CUDA_PERF")) GTEST_SKIP() << "set STRATA_CUDA_PERF=1 for the CUDA timing run";
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    cudaStream_t stream = ctx.stream().handle();
    const double copy_gbs = copy_bandwidth_gbs(ctx);
    constexpr int64_t kHeads = 32, kDim = 128, kMaxTokens = 512;
    const size_t state_bytes = static_cast<size_t>(kHeads * kDim * kDim) * 4;
    std::printf("[ perf     ] %s, %d SMs, L2 %.0f MB; device copy (read + write) %.0f GB/s\n", ctx.info().name.c_str(),
                ctx.info().multiprocessors, ctx.info().l2_bytes / 1e6, copy_gbs);
    std::printf("[ perf     ] gated_delta, %lld heads of %lld x %lld: state %.1f MB read + %.1f MB written per call\n",
                static_cast<long long>(kHeads), static_cast<long long>(kDim), static_cast<long long>(kDim),
                state_bytes / 1e6, state_bytes / 1e6);
    std::printf("[ perf     ] %6s %10s %10s %12s %8s %14s %10s\n", "T", "us/call", "us/token", "state GB/s", "%copy",
                "all bytes MB", "GB/s");
    std::mt19937 rng(3);
    const DeltaInputs in({kDim, kDim, kHeads, kHeads, false}, kMaxTokens, rng);
    const cuda::DeviceBuffer rows = ctx.upload(in.rows.data(), in.rows.size() * 4, "perf");
    const cuda::DeviceBuffer g = ctx.upload(in.g.data(), in.g.size() * 4, "perf");
    const cuda::DeviceBuffer beta = ctx.upload(in.beta.data(), in.beta.size() * 4, "perf");
    const cuda::DeviceBuffer out = ctx.allocate(static_cast<size_t>(kMaxTokens * in.out_row()) * 4, "perf");
    const size_t copies = std::max<size_t>(2, (4 * ctx.info().l2_bytes + state_bytes - 1) / state_bytes);
    std::vector<cuda::DeviceBuffer> states;
    for (size_t c = 0; c < copies; ++c) states.push_back(ctx.upload(in.state.data(), state_bytes, "perf"));
    for (const int64_t tokens : {int64_t{1}, int64_t{64}, int64_t{512}}) {
        const float* r = rows.as<float>();
        auto call = [&](size_t c) {
            cuda::gated_delta(ctx, {.state = states[c].as<float>(), .q = r, .k = r + kHeads * kDim,
                                    .v = r + 2 * kHeads * kDim, .q_stride = in.row, .k_stride = in.row,
                                    .v_stride = in.row, .g = g.as<float>(), .beta = beta.as<float>(),
                                    .out = out.as<float>(), .out_stride = in.out_row(), .n_tokens = tokens,
                                    .heads = kHeads, .key_heads = kHeads, .dk = kDim, .dv = kDim});
        };
        for (size_t c = 0; c < copies; ++c) call(c);  // warm-up
        ctx.synchronize();
        const int calls = tokens == 1 ? 200 : 20;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < calls; ++i) call(static_cast<size_t>(i) % copies);
        CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
        cudaEvent_t start, stop;
        cudaEventCreate(&start);
        cudaEventCreate(&stop);
        std::vector<float> runs;
        for (int rep = 0; rep < 5; ++rep) {
            cudaEventRecord(start, stream);
            CHECK_CUDA(cudaGraphLaunch(exec, stream));
            cudaEventRecord(stop, stream);
            CHECK_CUDA(cudaEventSynchronize(stop));
            float ms = 0;
            cudaEventElapsedTime(&ms, start, stop);
            runs.push_back(ms);
        }
        std::sort(runs.begin(), runs.end());
        const double us = runs[runs.size() / 2] * 1e3 / calls;
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        // All bytes: the state both ways, q, k, v, g, beta read and the outputs written once each.
        const double all_bytes = 2.0 * state_bytes + static_cast<double>(tokens) *
                                                         (static_cast<double>(in.row + 2 * kHeads + in.out_row()) * 4);
        const double state_gbs = 2.0 * state_bytes / (us * 1e-6) / 1e9;
        std::printf("[ perf     ] %6lld %10.2f %10.3f %12.0f %7.1f%% %14.1f %10.0f\n", static_cast<long long>(tokens),
                    us, us / tokens, state_gbs, 100.0 * state_gbs / copy_gbs, all_bytes / 1e6,
                    all_bytes / (us * 1e-6) / 1e9);
    }
}

#endif  // STRATA_HAS_CUDA

}  // namespace
