// The doorbell ping-pong (doorbell.h). One device thread: for round i it reads the host's flag until it holds i or
// the round's time bound passes (the global nanosecond timer), counts a timeout in the latter case, then publishes
// ack = i with a system-scope release store. The host writes flag = i, then polls ack with its own bound. The read the
// measurements chose, and the timer, are shared with the engine's doorbell (doorbell_device.cuh, doorbell_wait.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/doorbell.h"
#include "backend/cuda/doorbell_device.cuh"
#include "backend/cuda/model_ops.h"

namespace strata::cuda {

namespace {

template <DoorbellRead kRead>
__device__ __forceinline__ uint32_t read_flag(uint32_t* flag) {
    uint32_t v;
    if constexpr (kRead == DoorbellRead::Plain) {
        v = *flag;
    } else if constexpr (kRead == DoorbellRead::Volatile) {
        asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    } else if constexpr (kRead == DoorbellRead::AcquireSystem) {
        v = doorbell_load_acquire_system(flag);
    } else {
        // Without cudaDevAttrHostNativeAtomicSupported CUDA promises nothing for a system-scope atomic on host memory;
        // on the H200 this one was mostly answered without the host's store (bench/NOTES.md).
        v = atomicAdd_system(flag, 0u);
    }
    return v;
}

template <DoorbellRead kRead, bool kBackoff>
__global__ void ping_pong_kernel(uint32_t* flag, uint32_t* ack, uint32_t* timeouts, int64_t rounds,
                                 uint64_t bound_ns) {
    uint32_t missed = 0;
    for (int64_t i = 1; i <= rounds; ++i) {
        const uint32_t want = static_cast<uint32_t>(i);
        const uint64_t start = doorbell_global_ns();
        bool seen = false;
        while (true) {
            if (read_flag<kRead>(flag) >= want) {
                seen = true;
                break;
            }
            if (doorbell_global_ns() - start > bound_ns) break;
            if constexpr (kBackoff) __nanosleep(64);
        }
        if (!seen) ++missed;
        asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(ack), "r"(want) : "memory");
    }
    *timeouts = missed;
}

template <DoorbellRead kRead>
void launch(bool backoff, uint32_t* flag, uint32_t* ack, uint32_t* timeouts, int64_t rounds, uint64_t bound_ns,
            cudaStream_t stream) {
    if (backoff)
        ping_pong_kernel<kRead, true><<<1, 1, 0, stream>>>(flag, ack, timeouts, rounds, bound_ns);
    else
        ping_pong_kernel<kRead, false><<<1, 1, 0, stream>>>(flag, ack, timeouts, rounds, bound_ns);
}

// The flag and the ack on separate 128-byte lines of one mapped pinned page.
struct FlagPage {
    explicit FlagPage(bool write_combined) : page(4096, write_combined) {
        std::fill_n(static_cast<uint32_t*>(page.host()), 1024, 0u);
    }
    volatile uint32_t* host_flag() const { return static_cast<volatile uint32_t*>(page.host()); }
    volatile uint32_t* host_ack() const { return host_flag() + 32; }
    uint32_t* device_flag() const { return static_cast<uint32_t*>(const_cast<void*>(page.device())); }
    uint32_t* device_ack() const { return device_flag() + 32; }
    MappedHostBuffer page;
};

}  // namespace

const char* doorbell_read_name(DoorbellRead read) {
    switch (read) {
        case DoorbellRead::Plain: return "plain load";
        case DoorbellRead::Volatile: return "volatile load";
        case DoorbellRead::AcquireSystem: return "acquire load, system scope";
        case DoorbellRead::RelaxedRmw: return "relaxed fetch_add(0), system scope";
    }
    return "?";
}

bool host_native_atomics(const Context& ctx) {
    int value = 0;
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrHostNativeAtomicSupported, ctx.info().index));
    return value != 0;
}

DoorbellResult doorbell_ping_pong(Context& ctx, const DoorbellOptions& o) {
    if (o.rounds <= 0 || o.rounds > 10'000'000) throw Error("doorbell: rounds must be in 1..10000000");
    if (o.device_bound_us <= 0 || o.host_bound_us <= 0) throw Error("doorbell: the wait bounds must be positive");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const FlagPage page(o.write_combined);
    const DeviceBuffer timeouts = ctx.allocate(sizeof(uint32_t), "scratch");
    cudaStream_t stream = ctx.stream().handle();
    const uint64_t bound_ns = static_cast<uint64_t>(o.device_bound_us) * 1000;
    auto* t = timeouts.as<uint32_t>();
    switch (o.read) {
        case DoorbellRead::Plain:
            launch<DoorbellRead::Plain>(o.backoff, page.device_flag(), page.device_ack(), t, o.rounds, bound_ns, stream);
            break;
        case DoorbellRead::Volatile:
            launch<DoorbellRead::Volatile>(o.backoff, page.device_flag(), page.device_ack(), t, o.rounds, bound_ns,
                                           stream);
            break;
        case DoorbellRead::AcquireSystem:
            launch<DoorbellRead::AcquireSystem>(o.backoff, page.device_flag(), page.device_ack(), t, o.rounds,
                                                bound_ns, stream);
            break;
        case DoorbellRead::RelaxedRmw:
            launch<DoorbellRead::RelaxedRmw>(o.backoff, page.device_flag(), page.device_ack(), t, o.rounds, bound_ns,
                                             stream);
            break;
    }
    STRATA_CUDA_CHECK_LAUNCH("ping_pong_kernel");

    using Clock = std::chrono::steady_clock;
    DoorbellResult r;
    r.rounds = o.rounds;
    std::vector<double> us;
    us.reserve(static_cast<size_t>(o.rounds));
    for (int64_t i = 1; i <= o.rounds; ++i) {
        const uint32_t want = static_cast<uint32_t>(i);
        const auto t0 = Clock::now();
        if (o.ring) *page.host_flag() = want;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        const auto limit = t0 + std::chrono::microseconds(o.host_bound_us);
        while (*page.host_ack() < want && Clock::now() < limit) {
        }
        if (*page.host_ack() < want) ++r.host_misses;
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    // The kernel ends within its bounds once the host has written every flag; wait for it with a bound of our own.
    const auto deadline = Clock::now() + std::chrono::microseconds(o.device_bound_us) * (o.rounds + 1) +
                          std::chrono::seconds(5);
    while (cudaStreamQuery(stream) == cudaErrorNotReady) {
        if (Clock::now() > deadline)
            throw Error("doorbell: the device kernel did not finish within its bounds; the GPU may be unusable now");
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    uint32_t device_timeouts = 0;
    ctx.download(t, &device_timeouts, sizeof device_timeouts);
    r.device_timeouts = device_timeouts;
    std::sort(us.begin(), us.end());
    r.median_us = us[us.size() / 2];
    r.p90_us = us[us.size() * 9 / 10];
    r.max_us = us.back();
    return r;
}

}  // namespace strata::cuda
