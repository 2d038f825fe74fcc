// The doorbell ping-pong (backend/cuda/doorbell.h, issue 8 seed 000) as a correctness check: with the reads that see
// a host store (system-scope acquire load; volatile load) every round completes with no device timeout and no host
// miss; a doorbell that never rings is counted in every round and the call still returns (every wait is bounded).
// Neither the plain load nor the system-scope read-modify-write has that promise: CUDA promises nothing for
// system-scope atomics on host memory unless the device reports cudaDevAttrHostNativeAtomicSupported, and on the H200
// the fetch_add(0) was mostly answered without the host's store (bench/NOTES.md). The RMW's figures are printed, not
// asserted; the plain load is left to `strata bench doorbell`. No timing is asserted here (the benchmark measures it).
//
// Without the CUDA backend compiled in (-DSTRATA_CUDA=ON) or without a GPU, every test skips with a message saying so.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#if STRATA_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/doorbell.h"
#include "cuda_test_util.h"
#endif

namespace {

#if !STRATA_HAS_CUDA

TEST(CudaDoorbell, SkippedWithoutTheBackend) {
    GTEST_SKIP() << "CUDA backend not compiled in (configure with -DSTRATA_CUDA=ON): CUDA doorbell tests skipped";
}

#else

namespace cuda = strata::cuda;
using namespace strata::cuda_test;
constexpr const char* kDeviceTests = "CUDA doorbell tests";

TEST(CudaDoorbell, PromisedReadsSeeEveryRing) {
    SKIP_WITHOUT_DEVICE();
    for (const cuda::DoorbellRead read : {cuda::DoorbellRead::AcquireSystem, cuda::DoorbellRead::Volatile})
        for (const bool write_combined : {false, true}) {
            SCOPED_TRACE(std::string(cuda::doorbell_read_name(read)) + (write_combined ? ", write-combined" : ""));
            const cuda::DoorbellResult r =
                cuda::doorbell_ping_pong(context(), {.read = read, .write_combined = write_combined, .rounds = 2000});
            std::printf("[ doorbell ] %s%s: median %.2f us, p90 %.2f us, max %.1f us\n", cuda::doorbell_read_name(read),
                        write_combined ? ", write-combined" : "", r.median_us, r.p90_us, r.max_us);
            EXPECT_EQ(r.device_timeouts, 0);
            EXPECT_EQ(r.host_misses, 0);
        }
}

// Reported, not asserted: what the system-scope fetch_add(0) sees on this device, next to whether the device does
// host atomics natively (the only case in which CUDA promises anything for it).
TEST(CudaDoorbell, ReadModifyWriteIsReported) {
    SKIP_WITHOUT_DEVICE();
    const bool native = cuda::host_native_atomics(context());
    std::printf("[ doorbell ] cudaDevAttrHostNativeAtomicSupported = %d\n", native ? 1 : 0);
    for (const bool write_combined : {false, true}) {
        const int64_t rounds = 2000;
        const cuda::DoorbellResult r = cuda::doorbell_ping_pong(
            context(), {.read = cuda::DoorbellRead::RelaxedRmw, .write_combined = write_combined, .rounds = rounds});
        std::printf("[ doorbell ] %s%s: median %.2f us, p90 %.2f us, max %.1f us, device timeouts %lld/%lld, host "
                    "misses %lld (not asserted)\n",
                    cuda::doorbell_read_name(cuda::DoorbellRead::RelaxedRmw), write_combined ? ", write-combined" : "",
                    r.median_us, r.p90_us, r.max_us, static_cast<long long>(r.device_timeouts),
                    static_cast<long long>(rounds), static_cast<long long>(r.host_misses));
        EXPECT_EQ(r.rounds, rounds);  // it ran and returned: every wait is bounded whatever the read sees
    }
}

TEST(CudaDoorbell, ARingThatNeverComesIsCountedAndNeverHangs) {
    SKIP_WITHOUT_DEVICE();
    const cuda::DoorbellResult r = cuda::doorbell_ping_pong(
        context(),
        {.read = cuda::DoorbellRead::AcquireSystem, .rounds = 50, .device_bound_us = 200, .ring = false});
    EXPECT_EQ(r.device_timeouts, 50);  // every device wait gave up at its bound, and said so
    EXPECT_EQ(r.host_misses, 0);       // and still answered, so the host never waited past its own bound
}

#endif

}  // namespace
