// The GDN recurrence's two CUDA kernels (issue 8, seed 001) through the production entry point cuda::gated_delta:
// GdnRecurrence::Column (a column's rows over warps, partial sums through shared memory, a barrier per token) against
// GdnRecurrence::Shuffle (over lanes of one warp, shuffles, no barrier). They run the same FMA chains and add the
// partial sums in the same tree, so the state and the FP32 and FP16 outputs must agree bit for bit: T = 0, 1, 7, 256
// and 1000, two seeds, flash-next's heads and odd shapes. Each kernel is also checked against the CPU reference
// (cpu::gated_delta_step, within the tolerance test_cuda_recurrent explains), its FP16 outputs against the host's
// rounding of its FP32 outputs, and a window split over calls against one call.
//
// Without the CUDA backend compiled in (-DSTRATA_CUDA=ON) or without a GPU, every test skips with a message saying
// so. STRATA_CUDA_PERF=1 adds the timing of both kernels at 8,192 and 32,768 tokens for 48 heads (what `strata bench
// gdn-recurrence` prints).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"

#if STRATA_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gdn_bench.h"
#include "cuda_test_util.h"
#include "gdn_test_inputs.h"
#endif

namespace {

#if !STRATA_HAS_CUDA

TEST(CudaGdnRecurrence, SkippedWithoutTheBackend) {
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): CUDA GDN recurrence tests skipped";
}

#else

namespace cuda = strata::cuda;
namespace cpu = strata::cpu;
using namespace strata::cuda_test;
constexpr const char* kDeviceTests = "CUDA GDN recurrence tests";

constexpr int64_t kSentinels = 64;        // values after an output that must stay poison
constexpr uint16_t kHalfPoison = 0x7e5a;  // a quiet half NaN that no rounding of a finite output gives

using Shape = DeltaShape;

std::string shape_name(const Shape& s) {
    return "dk " + std::to_string(s.dk) + " dv " + std::to_string(s.dv) + " heads " + std::to_string(s.heads) + "/" +
           std::to_string(s.key_heads) + (s.tiled ? " tiled" : "");
}

// flash-next's GDN heads (48 value heads over 16 key heads of 128 x 128, tiled as qwen4exp lays them out), then odd
// ones: dv not a multiple of either kernel's columns per block (16 for the shuffle kernel at 8 lanes per column, 32
// for the column kernel), and every dk (16: 4 row groups, 32 to 128: 8, 256: 16).
const Shape kShapes[] = {{128, 128, 48, 16, true},
                         {64, 40, 6, 3, false},
                         {256, 72, 4, 2, true},
                         {16, 20, 4, 2, false},
                         {32, 24, 3, 1, true}};

using Inputs = DeltaInputs;

// One kernel's device copies of a window: its own state and poisoned FP32 and FP16 outputs (with sentinels).
struct KernelRun {
    const Inputs& in;
    cuda::GdnRecurrence recurrence;
    cuda::DeviceBuffer rows, g, beta, state, out, out_f16;

    KernelRun(const Inputs& inputs, cuda::GdnRecurrence which) : in(inputs), recurrence(which) {
        rows = upload(in.rows);
        g = upload(in.g);
        beta = upload(in.beta);
        state = upload(in.state);
        out = upload(std::vector<float>(in.n_out() + kSentinels, poison()));
        out_f16 = upload(std::vector<uint16_t>(in.n_out() + kSentinels, kHalfPoison));
    }
    // Tokens [first, first + count); FP32 and FP16 outputs unless one is switched off.
    void call(int64_t first, int64_t count, bool f32 = true, bool f16 = true) {
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
                                      .out = f32 ? out.as<float>() + first * in.out_row() : nullptr,
                                      .out_stride = in.out_row(),
                                      .n_tokens = count,
                                      .heads = in.s.heads,
                                      .key_heads = in.s.key_heads,
                                      .tiled_value_heads = in.s.tiled,
                                      .dk = in.s.dk,
                                      .dv = in.s.dv,
                                      .out_f16 = f16 ? out_f16.as<uint16_t>() + first * in.out_row() : nullptr,
                                      .recurrence = recurrence});
    }
    std::vector<float> state_now() const { return download<float>(state.data(), in.state.size()); }
    std::vector<float> out_now() const { return download<float>(out.data(), in.n_out() + kSentinels); }
    std::vector<uint16_t> out_f16_now() const { return download<uint16_t>(out_f16.data(), in.n_out() + kSentinels); }
};

template <typename T>
int64_t bit_mismatches(const std::vector<T>& a, const std::vector<T>& b) {
    EXPECT_EQ(a.size(), b.size());
    int64_t n = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
    return n;
}

// See test_cuda_recurrent.cpp (kDeltaNmse): the device's summation order, FMAs, the fused output and expf each cost
// a relative ~6e-8 per step and the recurrence does not grow them; one misplaced column or skipped token costs >= 1e-4.
// 1,000 tokens give the errors more steps than the 300 there, still far below this.
constexpr double kCpuNmse = 1e-9;

// Column vs shuffle bit for bit, and each against the CPU and against its own FP32 outputs rounded on the host.
TEST(CudaGdnRecurrence, ColumnEqualsShuffleBitForBit) {
    SKIP_WITHOUT_DEVICE();
    for (const uint32_t seed : {1u, 2u})
        for (const Shape& s : kShapes)
            for (const int64_t tokens : {0, 1, 7, 256, 1000}) {
                SCOPED_TRACE(shape_name(s) + " T=" + std::to_string(tokens) + " seed " + std::to_string(seed));
                std::mt19937 rng(seed * 1000003u + static_cast<uint32_t>(tokens));
                const Inputs in(s, tokens, rng);
                KernelRun column(in, cuda::GdnRecurrence::Column), shuffle(in, cuda::GdnRecurrence::Shuffle);
                column.call(0, tokens);
                shuffle.call(0, tokens);
                const std::vector<float> cs = column.state_now(), ss = shuffle.state_now();
                const std::vector<float> co = column.out_now(), so = shuffle.out_now();
                const std::vector<uint16_t> ch = column.out_f16_now(), sh = shuffle.out_f16_now();
                const int64_t state_diff = bit_mismatches(cs, ss), out_diff = bit_mismatches(co, so),
                              f16_diff = bit_mismatches(ch, sh);
                EXPECT_EQ(state_diff, 0);
                EXPECT_EQ(out_diff, 0);
                EXPECT_EQ(f16_diff, 0);

                // Every output written, nothing past the end, and the FP16 outputs the FP32 ones rounded.
                const size_t n_out = in.n_out();
                int64_t unwritten = 0, clobbered = 0, f16_wrong = 0;
                for (size_t i = 0; i < n_out; ++i) {
                    unwritten += is_poison(co[i]);
                    f16_wrong += ch[i] != strata::f32_to_f16(co[i]);
                }
                for (size_t i = n_out; i < co.size(); ++i) clobbered += !is_poison(co[i]) || ch[i] != kHalfPoison;
                EXPECT_EQ(unwritten, 0);
                EXPECT_EQ(clobbered, 0);
                EXPECT_EQ(f16_wrong, 0);
                if (tokens == 0) {  // nothing runs: the state stays as it was
                    EXPECT_EQ(std::memcmp(cs.data(), in.state.data(), cs.size() * 4), 0);
                    continue;
                }
                std::vector<float> ref_state = in.state, ref_out(n_out);
                in.reference(0, in.n_tokens, ref_state, ref_out);
                const double state_nmse = nmse(cs.data(), ref_state.data(), cs.size());
                const double out_nmse = nmse(co.data(), ref_out.data(), n_out);
                EXPECT_LE(state_nmse, kCpuNmse);
                EXPECT_LE(out_nmse, kCpuNmse);
                std::printf(
                    "[ cuda     ] %-28s T=%-4lld seed %u: column vs shuffle %lld/%lld/%lld differing bits "
                    "(state/f32/f16); vs CPU NMSE state %.3g out %.3g\n",
                    shape_name(s).c_str(), static_cast<long long>(tokens), seed, static_cast<long long>(state_diff),
                    static_cast<long long>(out_diff), static_cast<long long>(f16_diff), state_nmse, out_nmse);
            }
}

// Auto runs one of the two (whichever resolve_gdn_recurrence names), and an FP16-only call (out null) writes the same
// half bits and state as a call with both outputs.
TEST(CudaGdnRecurrence, AutoAndFp16OnlyGiveTheSameBits) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(9);
    const Inputs in(kShapes[0], 64, rng);
    KernelRun both(in, cuda::GdnRecurrence::Column), automatic(in, cuda::GdnRecurrence::Auto);
    KernelRun f16_column(in, cuda::GdnRecurrence::Column), f16_shuffle(in, cuda::GdnRecurrence::Shuffle);
    both.call(0, 64);
    automatic.call(0, 64);
    f16_column.call(0, 64, /*f32=*/false);
    f16_shuffle.call(0, 64, /*f32=*/false);
    std::printf("[ cuda     ] Auto runs the %s kernel for dk 128\n",
                cuda::gdn_recurrence_name(cuda::resolve_gdn_recurrence(cuda::GdnRecurrence::Auto)));
    EXPECT_NE(cuda::resolve_gdn_recurrence(cuda::GdnRecurrence::Auto), cuda::GdnRecurrence::Auto);
    EXPECT_EQ(bit_mismatches(automatic.state_now(), both.state_now()), 0);
    EXPECT_EQ(bit_mismatches(automatic.out_now(), both.out_now()), 0);
    for (KernelRun* r : {&f16_column, &f16_shuffle}) {
        EXPECT_EQ(bit_mismatches(r->state_now(), both.state_now()), 0);
        EXPECT_EQ(bit_mismatches(r->out_f16_now(), both.out_f16_now()), 0);
        const std::vector<float> untouched = r->out_now();
        int64_t written = 0;
        for (const float f : untouched) written += !is_poison(f);
        EXPECT_EQ(written, 0) << "an FP16-only call wrote FP32 outputs";
    }
}

// The column kernel, like the shuffle kernel, computes every token the same way wherever the window starts.
TEST(CudaGdnRecurrence, ColumnSplitWindowEqualsOneCall) {
    SKIP_WITHOUT_DEVICE();
    std::mt19937 rng(77);
    const Inputs in({128, 128, 4, 2, false}, 300, rng);
    KernelRun whole(in, cuda::GdnRecurrence::Column), split(in, cuda::GdnRecurrence::Column),
        mixed(in, cuda::GdnRecurrence::Column);
    whole.call(0, 300);
    split.call(0, 137);
    split.call(137, 163);
    // Kernels may alternate between calls on one state: same bits.
    mixed.call(0, 100);
    mixed.recurrence = cuda::GdnRecurrence::Shuffle;
    mixed.call(100, 100);
    mixed.recurrence = cuda::GdnRecurrence::Column;
    mixed.call(200, 100);
    for (KernelRun* r : {&split, &mixed}) {
        EXPECT_EQ(bit_mismatches(r->state_now(), whole.state_now()), 0) << (r == &split ? "137 + 163" : "mixed");
        EXPECT_EQ(bit_mismatches(r->out_now(), whole.out_now()), 0) << (r == &split ? "137 + 163" : "mixed");
        EXPECT_EQ(bit_mismatches(r->out_f16_now(), whole.out_f16_now()), 0) << (r == &split ? "137 + 163" : "mixed");
    }
}

TEST(CudaGdnRecurrence, RejectsBadArguments) {
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    const cuda::DeviceBuffer b = ctx.allocate(1 << 20, "test");
    float* p = b.as<float>();
    const cuda::GatedDeltaArgs good{.state = p,
                                    .q = p,
                                    .k = p,
                                    .v = p,
                                    .g = p,
                                    .beta = p,
                                    .out = p,
                                    .n_tokens = 1,
                                    .heads = 2,
                                    .key_heads = 1,
                                    .dk = 64,
                                    .dv = 64};
    cuda::GatedDeltaArgs a = good;
    a.out = nullptr;
    expect_error([&] { cuda::gated_delta(ctx, a); }, "null pointer");
    a = good;
    a.recurrence = static_cast<cuda::GdnRecurrence>(7);
    expect_error([&] { cuda::gated_delta(ctx, a); }, "unknown recurrence kernel");
    a = good;
    a.dk = 48;
    a.recurrence = cuda::GdnRecurrence::Column;
    expect_error([&] { cuda::gated_delta(ctx, a); }, "dk = 48");
    ctx.synchronize();
}

// ---- performance (STRATA_CUDA_PERF=1) -------------------------------------------------------------------------------

TEST(CudaPerf, GdnRecurrenceColumnVsShuffle) {
    if (!std::getenv("STRATA_CUDA_PERF")) GTEST_SKIP() << "set STRATA_CUDA_PERF=1 for the CUDA timing run";
    SKIP_WITHOUT_DEVICE();
    cuda::Context& ctx = context();
    std::printf(
        "[ perf     ] %s: GDN recurrence, 48 value heads / 16 key heads of 128 x 128 (flash-next), median of "
        "5 calls; Auto runs %s\n",
        ctx.info().name.c_str(),
        cuda::gdn_recurrence_name(cuda::resolve_gdn_recurrence(cuda::GdnRecurrence::Auto)));
    std::printf("[ perf     ] | tokens | column ms | shuffle ms | speed-up | mismatches |\n");
    for (const int64_t tokens : {int64_t{8192}, int64_t{32768}}) {
        const cuda::GdnRecurrenceBenchResult r = cuda::time_gdn_recurrences(ctx, {.tokens = tokens});
        std::printf("[ perf     ] | %lld | %.2f | %.2f | %.2fx | %lld / %lld |\n", static_cast<long long>(tokens),
                    r.column_ms, r.shuffle_ms, r.column_ms / r.shuffle_ms, static_cast<long long>(r.mismatches),
                    static_cast<long long>(r.compared));
        EXPECT_EQ(r.mismatches, 0);
    }
}

#endif  // STRATA_HAS_CUDA

}  // namespace
