// The engine's doorbell (backend/cuda/doorbell_wait.h, issue 8): a ring that comes is seen and the data the host wrote
// before it is what the consumer reads; a flag that never comes is counted, reported with its layer and window, ends
// within its bound, and its consumer does not run on the stale data still in place (an earlier window's), and the
// redo on the path that does not wait gives the right result; all of it inside a captured graph replayed with a new
// window number each time. The oracle of every consumer output is the data the host wrote for that window (the
// consumer is a copy, so it must match bit for bit); "did not run" is an output still holding its sentinel.
//
// Without the CUDA backend compiled in (-DSTRATA_CUDA=ON) or without a GPU, every test skips with a message saying so.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if STRATA_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/doorbell_wait.h"
#include "backend/cuda/model_ops.h"
#include "core/doorbell_stats.h"
#include "cuda_test_util.h"
#endif

namespace {

#if !STRATA_HAS_CUDA

TEST(CudaDoorbellWait, SkippedWithoutTheBackend) {
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): CUDA doorbell wait tests skipped";
}

#else

namespace cuda = strata::cuda;
using namespace strata::cuda_test;
using Clock = std::chrono::steady_clock;
constexpr const char* kDeviceTests = "CUDA doorbell wait tests";

constexpr size_t kFloats = 16384;  // 64 KiB behind the flag
constexpr size_t kBytes = kFloats * sizeof(float);

// What the host worker produces for a window: different in every window, so a consumer that read an earlier window's
// data (or read before the host's stores landed) shows.
std::vector<float> window_data(uint32_t window) {
    std::vector<float> v(kFloats);
    for (size_t i = 0; i < kFloats; ++i) v[i] = static_cast<float>(window) * 1000.0f + static_cast<float>(i) * 0.25f;
    return v;
}

// One layer's data path: the host writes into mapped memory, the window's consumer copies it into device memory.
struct Rig {
    explicit Rig(const cuda::DoorbellOptions& options)
        : doorbell(context(), options), staged(kBytes), output(context().allocate(kBytes, "test")) {
        std::memset(staged.host(), 0, kBytes);
    }
    cuda::DoorbellCopy copy() const {
        return {.mapped_source = staged.device(), .device_destination = output.data(), .bytes = kBytes};
    }
    // The window's work for one layer: start, wait, consume.
    void enqueue_window(int layer, int slot = 0) {
        doorbell.enqueue_window_start();
        doorbell.enqueue_wait({.slot = slot, .layer = layer});
        doorbell.enqueue_copy(copy());
    }
    void fill_output_with_sentinel() {
        const std::vector<float> sentinel(kFloats, poison());
        context().copy_to_device(output.data(), sentinel.data(), kBytes);
    }
    // The host worker: the data, then the ring (after a pause, so the device is already spinning).
    void stage_and_ring(uint32_t window, int slot = 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        const std::vector<float> data = window_data(window);
        std::memcpy(staged.host(), data.data(), kBytes);
        doorbell.ring(slot, window);
    }
    std::vector<float> read_output() { return download<float>(output.data(), kFloats); }
    bool output_is_sentinel() {
        const std::vector<float> out = read_output();
        for (float f : out)
            if (!is_poison(f)) return false;
        return true;
    }

    cuda::Doorbell doorbell;
    cuda::MappedHostBuffer staged;
    cuda::DeviceBuffer output;
};

void expect_window_data(const std::vector<float>& got, uint32_t window) {
    const std::vector<float> want = window_data(window);
    ASSERT_EQ(got.size(), want.size());
    size_t wrong = 0;
    for (size_t i = 0; i < want.size(); ++i) wrong += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    EXPECT_EQ(wrong, 0u) << "window " << window << ": first value " << got[0] << ", want " << want[0];
}

TEST(CudaDoorbellWait, ARingThatComesIsSeenWithTheDataBehindIt) {
    SKIP_WITHOUT_DEVICE();
    Rig rig({.slots = 1});
    for (int i = 0; i < 20; ++i) {
        SCOPED_TRACE("round " + std::to_string(i));
        const uint32_t window = rig.doorbell.open_window();
        rig.fill_output_with_sentinel();
        rig.enqueue_window(/*layer=*/4);
        rig.stage_and_ring(window);
        const cuda::DoorbellCheck check = rig.doorbell.check_window();
        EXPECT_FALSE(check.gave_up) << check.report;
        EXPECT_TRUE(check.stalls.empty());
        EXPECT_EQ(check.report, "");
        EXPECT_EQ(check.timeouts_total, 0);
        expect_window_data(rig.read_output(), window);  // the consumer ran, on the data written before the ring
    }
    EXPECT_EQ(rig.doorbell.timeouts_total(), 0);
}

TEST(CudaDoorbellWait, AFlagThatNeverComesIsCountedReportedAndItsDataNeverUsed) {
    SKIP_WITHOUT_DEVICE();
    constexpr int64_t kBoundUs = 50'000;
    Rig rig({.slots = 2, .bound_us = kBoundUs});
    const int64_t process_timeouts_before = strata::doorbell_stats().timeouts_total;

    // Window 1 rings: the mapped memory now holds window 1's data, which window 2 must not consume.
    uint32_t window = rig.doorbell.open_window();
    rig.enqueue_window(/*layer=*/3);
    rig.stage_and_ring(window);
    ASSERT_FALSE(rig.doorbell.check_window().gave_up);

    // Window 2: two layers wait (slots 0 and 1) and neither is rung.
    window = rig.doorbell.open_window();
    ASSERT_EQ(window, 2u);
    rig.fill_output_with_sentinel();
    rig.doorbell.enqueue_window_start();
    rig.doorbell.enqueue_wait({.slot = 0, .layer = 3});
    rig.doorbell.enqueue_copy(rig.copy());
    rig.doorbell.enqueue_wait({.slot = 1, .layer = 9});
    rig.doorbell.enqueue_copy(rig.copy());
    const auto start = Clock::now();
    const cuda::DoorbellCheck check = rig.doorbell.check_window();
    const double elapsed_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    std::printf("[ doorbell ] %s (check returned after %.1f ms)\n", check.report.c_str(), elapsed_ms);

    EXPECT_TRUE(check.gave_up);
    ASSERT_EQ(check.stalls.size(), 1u);  // the second wait, in a window already given up, did not wait
    EXPECT_EQ(check.stalls[0].layer, 3);
    EXPECT_EQ(check.stalls[0].slot, 0);
    EXPECT_EQ(check.stalls[0].window, 2u);
    EXPECT_EQ(check.stalls[0].last_seen, 1u);               // window 1's ring, which does not count for window 2
    EXPECT_GE(check.stalls[0].waited_ms, kBoundUs * 1e-3);  // it gave up at its bound, not before
    EXPECT_LT(elapsed_ms, kBoundUs * 1e-3 + 1000.0);        // and never hung
    EXPECT_EQ(check.timeouts_total, 1);
    EXPECT_EQ(rig.doorbell.timeouts_total(), 1);
    EXPECT_EQ(strata::doorbell_stats().timeouts_total - process_timeouts_before, 1);  // what /metrics shows
    EXPECT_NE(check.report.find("layer 3 window 2"), std::string::npos) << check.report;
    EXPECT_NE(check.report.find("bound 50.0 ms"), std::string::npos) << check.report;
    EXPECT_EQ(check.report.find('\n'), std::string::npos);
    EXPECT_EQ(rig.doorbell.last_stall_report(), check.report);
    EXPECT_EQ(strata::doorbell_stats().last_stall_report, check.report);
    EXPECT_TRUE(rig.output_is_sentinel()) << "a consumer ran on data that never arrived (window 1's)";

    // The redo on the path that does not wait: the data is in place before the work is queued.
    rig.doorbell.enqueue_redo_start();
    const std::vector<float> data = window_data(window);
    std::memcpy(rig.staged.host(), data.data(), kBytes);
    rig.doorbell.enqueue_copy(rig.copy());
    expect_window_data(rig.read_output(), window);

    // Window 3 gets only a late ring for window 2: still not its own, so it gives up too.
    window = rig.doorbell.open_window();
    rig.fill_output_with_sentinel();
    rig.enqueue_window(/*layer=*/7);
    rig.doorbell.ring(0, window - 1);
    const cuda::DoorbellCheck late = rig.doorbell.check_window();
    EXPECT_TRUE(late.gave_up);
    ASSERT_EQ(late.stalls.size(), 1u);
    EXPECT_EQ(late.stalls[0].layer, 7);
    EXPECT_EQ(late.stalls[0].window, 3u);
    EXPECT_EQ(late.stalls[0].last_seen, 2u);
    EXPECT_EQ(late.timeouts_total, 2);
    EXPECT_TRUE(rig.output_is_sentinel());

    // Window 4 rings: the doorbell is clean again.
    window = rig.doorbell.open_window();
    rig.fill_output_with_sentinel();
    rig.enqueue_window(/*layer=*/3);
    rig.stage_and_ring(window);
    const cuda::DoorbellCheck clean = rig.doorbell.check_window();
    EXPECT_FALSE(clean.gave_up) << clean.report;
    EXPECT_EQ(clean.timeouts_total, 2);
    expect_window_data(rig.read_output(), window);
}

TEST(CudaDoorbellWait, RunWindowRedoesOnThePathWithoutWaitsOrFailsTheRequest) {
    SKIP_WITHOUT_DEVICE();
    Rig rig({.slots = 1, .bound_us = 20'000});
    bool sentinel_before_redo = false;
    const cuda::DoorbellCheck check = cuda::run_window(
        rig.doorbell, {.waiting =
                           [&](uint32_t) {
                               rig.fill_output_with_sentinel();
                               rig.enqueue_window(/*layer=*/11);
                           },  // no ring
                       .redo =
                           [&](uint32_t window) {
                               sentinel_before_redo = rig.output_is_sentinel();
                               const std::vector<float> data = window_data(window);
                               std::memcpy(rig.staged.host(), data.data(), kBytes);
                               rig.doorbell.enqueue_copy(rig.copy());
                           }});
    EXPECT_TRUE(check.gave_up);
    EXPECT_TRUE(sentinel_before_redo);
    expect_window_data(rig.read_output(), check.window);

    const cuda::DoorbellCheck rung = cuda::run_window(
        rig.doorbell, {.waiting = [&](uint32_t window) {
                           rig.enqueue_window(/*layer=*/11);
                           rig.stage_and_ring(window);
                       }});
    EXPECT_FALSE(rung.gave_up) << rung.report;
    expect_window_data(rig.read_output(), rung.window);

    strata::testing::expect_error(
        [&] {
            (void)cuda::run_window(rig.doorbell, {.waiting = [&](uint32_t) { rig.enqueue_window(/*layer=*/11); }});
        },
        "layer 11 window 3 gave up");
    EXPECT_EQ(rig.doorbell.timeouts_total(), 2);
}

TEST(CudaDoorbellWait, WorksInACapturedGraphWithANewWindowEachReplay) {
    SKIP_WITHOUT_DEVICE();
    Rig rig({.slots = 1, .bound_us = 50'000});
    cuda::Graph graph;
    graph.capture(context(), [&] { rig.enqueue_window(/*layer=*/5); });
    int64_t gave_up = 0;
    for (int replay = 0; replay < 9; ++replay) {
        SCOPED_TRACE("replay " + std::to_string(replay));
        const bool ring = replay % 3 != 2;
        const uint32_t window = rig.doorbell.open_window();
        rig.fill_output_with_sentinel();
        graph.replay(context());
        if (ring) rig.stage_and_ring(window);
        const cuda::DoorbellCheck check = rig.doorbell.check_window();
        EXPECT_EQ(check.window, window);
        EXPECT_EQ(check.gave_up, !ring) << check.report;
        if (ring) {
            expect_window_data(rig.read_output(), window);
            continue;
        }
        ++gave_up;
        ASSERT_EQ(check.stalls.size(), 1u);
        EXPECT_EQ(check.stalls[0].layer, 5);
        EXPECT_EQ(check.stalls[0].window, window);
        EXPECT_EQ(check.stalls[0].last_seen, window - 1);
        EXPECT_EQ(check.timeouts_total, gave_up);
        EXPECT_TRUE(rig.output_is_sentinel()) << "the graph's consumer ran on the previous window's data";
    }
    EXPECT_EQ(rig.doorbell.timeouts_total(), 3);
}

TEST(CudaDoorbellWait, MisuseIsAClearError) {
    SKIP_WITHOUT_DEVICE();
    using strata::testing::expect_error;
    expect_error([] { cuda::Doorbell d(context(), {.slots = 0}); }, "slots must be in 1..");
    expect_error([] { cuda::Doorbell d(context(), {.slots = 1, .bound_us = 0}); }, "the wait bound must be");
    cuda::Doorbell d(context(), {.slots = 2});
    expect_error([&] { d.ring(2, 1); }, "ring of slot 2");
    expect_error([&] { (void)d.check_window(); }, "without an open window");
    (void)d.open_window();
    expect_error([&] { (void)d.open_window(); }, "check_window() it before opening the next");
    // A window whose work did not start with enqueue_window_start is caught, not read as clean.
    expect_error([&] { (void)d.check_window(); }, "did not start with enqueue_window_start");
    EXPECT_EQ(cuda::kDoorbellDefaultBoundUs, 1'000'000);
    EXPECT_EQ(d.bound_us(), cuda::kDoorbellDefaultBoundUs);
}

#endif

}  // namespace
