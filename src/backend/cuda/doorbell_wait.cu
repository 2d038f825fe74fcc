// The engine's doorbell (doorbell_wait.h). The host publishes the window's number in mapped memory; the window's first
// kernel copies it into a small device state and clears the gave-up word; each wait is one thread spinning on its
// slot's flag with a system-scope acquire load, bounded by the global timer; a wait that gives up counts itself in the
// device state, writes a stall record into the mapped log and sets the gave-up word that every consumer kernel checks
// first. The host reads the state and the log after the window (check_window).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/doorbell_device.cuh"
#include "backend/cuda/doorbell_wait.h"
#include "backend/cuda/model_ops.h"
#include "core/doorbell_stats.h"

namespace strata::cuda {

namespace {

struct DeviceState {
    uint32_t window;    // the number open_window() published, taken at the window's start
    uint32_t gave_up;   // nonzero once a wait of this window hit its bound
    uint32_t timeouts;  // every wait that hit its bound, since the doorbell was made (wraps; the host takes deltas)
};

constexpr int kMaxSlots = 1024;
constexpr uint32_t kLogCapacity = 64;  // stall records kept between two checks; more are counted, not described
constexpr int kCopyThreads = 256;

// One record of the mapped stall log, written by the device, read by the host after the stream is done.
struct StallRecord {
    int32_t layer;
    int32_t slot;
    uint32_t window;
    uint32_t last_seen;
    uint64_t waited_ns;
};

// The flags sit at the start of their page; the published window number on a 128-byte line of its own after them.
int window_word_index(int slots) { return (slots + 31) / 32 * 32; }

__global__ void window_start_kernel(const uint32_t* published_window, DeviceState* state) {
    state->window = doorbell_load_acquire_system(published_window);
    atomicExch(&state->gave_up, 0u);
}

__global__ void wait_kernel(const uint32_t* flag, int slot, int layer, uint64_t bound_ns, DeviceState* state,
                            StallRecord* log) {
    // A window that already gave up is redone or failed as a whole: waiting again would only add a bound per layer.
    if (doorbell_window_gave_up(&state->gave_up)) return;
    const uint32_t expected = state->window;
    const uint64_t start = doorbell_global_ns();
    uint32_t seen = 0;
    uint64_t waited = 0;
    while (true) {
        seen = doorbell_load_acquire_system(flag);
        // seen >= expected, in serial-number order (the window numbers wrap after 2^32 windows)
        if (static_cast<int32_t>(seen - expected) >= 0) return;
        waited = doorbell_global_ns() - start;
        if (waited > bound_ns) break;
    }
    atomicExch(&state->gave_up, 1u);
    const uint32_t index = atomicAdd(&state->timeouts, 1u);
    StallRecord& record = log[index % kLogCapacity];
    record.layer = layer;
    record.slot = slot;
    record.window = expected;
    record.last_seen = seen;
    record.waited_ns = waited;
    __threadfence_system();
}

__global__ void __launch_bounds__(kCopyThreads)
    guarded_copy_kernel(const uint4* source, uint4* destination, size_t n, const uint32_t* gave_up_word) {
    if (doorbell_window_gave_up(gave_up_word)) return;
    for (size_t i = blockIdx.x * static_cast<size_t>(kCopyThreads) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * kCopyThreads) {
        // Volatile (relaxed, system scope): the host's bytes, never a line an earlier window left in a cache.
        uint4 v;
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(source + i)
                     : "memory");
        destination[i] = v;
    }
}

__global__ void __launch_bounds__(kCopyThreads)
    publish_kernel(DoorbellPublish publish, uint32_t* outbox, const DeviceState* state) {
    for (const DoorbellPublish::Part& part : publish.parts) {
        const auto* src = static_cast<const uint32_t*>(part.device_source);
        auto* dst = static_cast<uint32_t*>(part.mapped_destination);
        for (size_t i = threadIdx.x; i < part.bytes / 4; i += kCopyThreads) dst[i] = src[i];
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint32_t window = state->window;
        asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(outbox + publish.slot), "r"(window) : "memory");
    }
}

std::string format_ms(double ms) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", ms);
    return buf;
}

}  // namespace

Doorbell::Doorbell(Context& ctx, const DoorbellOptions& options) : ctx_(ctx), options_(options) {
    if (options.slots < 1 || options.slots > kMaxSlots)
        throw Error("doorbell: slots must be in 1.." + std::to_string(kMaxSlots) + ", got " +
                    std::to_string(options.slots));
    if (options.bound_us < 1 || options.bound_us > 60'000'000)
        throw Error("doorbell: the wait bound must be in 1 us..60 s, got " + std::to_string(options.bound_us) + " us");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const size_t flag_bytes = std::max<size_t>(4096, (window_word_index(options.slots) + 32) * sizeof(uint32_t));
    flags_ = std::make_unique<MappedHostBuffer>(flag_bytes);
    std::memset(flags_->host(), 0, flag_bytes);
    log_ = std::make_unique<MappedHostBuffer>(kLogCapacity * sizeof(StallRecord));
    std::memset(log_->host(), 0, kLogCapacity * sizeof(StallRecord));
    outbox_ = std::make_unique<MappedHostBuffer>(std::max<size_t>(4096, options.slots * sizeof(uint32_t)));
    std::memset(outbox_->host(), 0, outbox_->size());
    state_ = ctx.allocate(sizeof(DeviceState), "doorbell");
    ctx.zero(state_.data(), sizeof(DeviceState));
    ctx.synchronize();
}

Doorbell::~Doorbell() = default;

uint32_t Doorbell::open_window() {
    if (window_open_)
        throw Error("doorbell: window " + std::to_string(window_) +
                    " is still open: check_window() it before opening the next");
    if (++window_ == 0) ++window_;  // 0 is what a flag holds before its first ring
    uint32_t* published = static_cast<uint32_t*>(flags_->host()) + window_word_index(options_.slots);
    std::atomic_ref<uint32_t>(*published).store(window_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    window_open_ = true;
    return window_;
}

void Doorbell::ring(int slot, uint32_t window) {
    if (slot < 0 || slot >= options_.slots)
        throw Error("doorbell: ring of slot " + std::to_string(slot) + ", but there are " +
                    std::to_string(options_.slots));
    // A full fence (mfence on x86): the data's stores, write-combined ones included, reach memory before the flag's.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::atomic_ref<uint32_t>(static_cast<uint32_t*>(flags_->host())[slot]).store(window, std::memory_order_release);
}

void Doorbell::enqueue_window_start() {
    const auto* published = static_cast<const uint32_t*>(flags_->device()) + window_word_index(options_.slots);
    window_start_kernel<<<1, 1, 0, ctx_.stream().handle()>>>(published, state_.as<DeviceState>());
    STRATA_CUDA_CHECK_LAUNCH("doorbell window_start_kernel");
}

void Doorbell::enqueue_wait(const DoorbellWait& wait) {
    if (wait.slot < 0 || wait.slot >= options_.slots)
        throw Error("doorbell: wait on slot " + std::to_string(wait.slot) + ", but there are " +
                    std::to_string(options_.slots));
    const auto* flag = static_cast<const uint32_t*>(flags_->device()) + wait.slot;
    auto* log = static_cast<StallRecord*>(const_cast<void*>(log_->device()));
    wait_kernel<<<1, 1, 0, ctx_.stream().handle()>>>(flag, wait.slot, wait.layer,
                                                     static_cast<uint64_t>(options_.bound_us) * 1000,
                                                     state_.as<DeviceState>(), log);
    STRATA_CUDA_CHECK_LAUNCH("doorbell wait_kernel");
}

void Doorbell::enqueue_publish(const DoorbellPublish& publish) {
    if (publish.slot < 0 || publish.slot >= options_.slots)
        throw Error("doorbell: publish on slot " + std::to_string(publish.slot) + ", but there are " +
                    std::to_string(options_.slots));
    for (const DoorbellPublish::Part& part : publish.parts)
        if (part.bytes % 4 != 0 || (part.bytes && (!part.device_source || !part.mapped_destination)))
            throw Error("doorbell: a published part needs both addresses and a multiple of 4 bytes");
    publish_kernel<<<1, kCopyThreads, 0, ctx_.stream().handle()>>>(
        publish, static_cast<uint32_t*>(const_cast<void*>(outbox_->device())), state_.as<DeviceState>());
    STRATA_CUDA_CHECK_LAUNCH("doorbell publish_kernel");
}

bool Doorbell::wait_published(int slot, uint32_t window, int64_t bound_us) const {
    if (slot < 0 || slot >= options_.slots) throw Error("doorbell: wait_published on a slot that does not exist");
    std::atomic_ref<uint32_t> word(static_cast<uint32_t*>(outbox_->host())[slot]);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t spins = 0;; ++spins) {
        if (static_cast<int32_t>(word.load(std::memory_order_acquire) - window) >= 0) return true;
        if ((spins & 255) == 255 &&
            std::chrono::steady_clock::now() - start > std::chrono::microseconds(bound_us))
            return false;
    }
}

void Doorbell::enqueue_copy(const DoorbellCopy& copy) {
    if (copy.bytes % 16 != 0 || reinterpret_cast<uintptr_t>(copy.mapped_source) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(copy.device_destination) % 16 != 0)
        throw Error("doorbell: a copy needs 16-byte aligned addresses and a multiple of 16 bytes");
    if (copy.bytes == 0) return;
    const size_t n = copy.bytes / 16;
    const unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + kCopyThreads - 1) / kCopyThreads, 1024));
    guarded_copy_kernel<<<blocks, kCopyThreads, 0, ctx_.stream().handle()>>>(
        static_cast<const uint4*>(copy.mapped_source), static_cast<uint4*>(copy.device_destination), n,
        gave_up_word());
    STRATA_CUDA_CHECK_LAUNCH("doorbell guarded_copy_kernel");
}

void Doorbell::enqueue_redo_start() {
    STRATA_CUDA_CHECK(cudaMemsetAsync(&state_.as<DeviceState>()->gave_up, 0, sizeof(uint32_t),
                                      ctx_.stream().handle()));
}

const uint32_t* Doorbell::gave_up_word() const { return &state_.as<DeviceState>()->gave_up; }

DoorbellCheck Doorbell::check_window() {
    if (!window_open_) throw Error("doorbell: check_window() without an open window (open_window() first)");
    window_open_ = false;
    ctx_.synchronize();  // every wait on the stream ends within its bound
    DeviceState state{};
    ctx_.download(state_.data(), &state, sizeof state);
    if (state.window != window_)
        throw Error("doorbell: window " + std::to_string(window_) + " did not start with enqueue_window_start (the " +
                    "device is at window " + std::to_string(state.window) + ")");
    DoorbellCheck check;
    check.window = window_;
    check.gave_up = state.gave_up != 0;
    const uint32_t new_timeouts = state.timeouts - log_read_;
    if (new_timeouts > kLogCapacity) log_read_ = state.timeouts - kLogCapacity;  // the oldest were overwritten
    const auto* log = static_cast<const StallRecord*>(log_->host());
    for (; log_read_ != state.timeouts; ++log_read_) {
        const StallRecord& r = log[log_read_ % kLogCapacity];
        if (r.window == window_)
            check.stalls.push_back({.layer = r.layer,
                                    .slot = r.slot,
                                    .window = r.window,
                                    .last_seen = r.last_seen,
                                    .waited_ms = static_cast<double>(r.waited_ns) * 1e-6});
    }
    timeouts_total_ += new_timeouts;
    check.timeouts_total = timeouts_total_;
    if (check.gave_up) {
        const double bound_ms = static_cast<double>(options_.bound_us) * 1e-3;
        std::string what;
        if (check.stalls.empty()) {
            what = "window " + std::to_string(window_) + " gave up (its stall record was overwritten)";
        } else {
            const DoorbellStall& s = check.stalls.front();
            what = "layer " + std::to_string(s.layer) + " window " + std::to_string(s.window) +
                   " gave up waiting for slot " + std::to_string(s.slot) + " after " + format_ms(s.waited_ms) +
                   " ms (flag last seen " + std::to_string(s.last_seen) + ")";
        }
        check.report = "doorbell: " + what + ": the data it waited for did not arrive; bound " + format_ms(bound_ms) +
                       " ms, " + std::to_string(timeouts_total_) + " timeout(s) in total";
        last_report_ = check.report;
    }
    if (new_timeouts > 0) add_doorbell_timeouts(new_timeouts, check.report);  // the server's /metrics
    return check;
}

DoorbellCheck run_window(Doorbell& doorbell, const DoorbellWindow& window) {
    if (!window.waiting) throw Error("doorbell: run_window needs the window's waiting path");
    const uint32_t number = doorbell.open_window();
    try {
        window.waiting(number);
    } catch (...) {
        try {
            (void)doorbell.check_window();  // close the window (its waits end within their bound)
        } catch (...) {
        }
        throw;
    }
    DoorbellCheck check = doorbell.check_window();
    if (!check.gave_up) return check;
    if (!window.redo) throw Error(check.report + "; the request fails (no path without waits to redo it on)");
    doorbell.enqueue_redo_start();
    window.redo(number);
    return check;
}

}  // namespace strata::cuda
