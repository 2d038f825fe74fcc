// The engine's doorbell (issue 8, seed 000): the host tells work queued on the GPU that the data of one layer of one
// decode window is in place (the CPU experts' rows, a routing plan), and the GPU waits for it inside the window's
// graph. Every wait is bounded: a flag that never comes is counted, logged with its layer and window, and the window
// is marked as given up, so the kernels that would consume the data skip it and the host must redo the window on a
// path that does not wait, or fail the request. Going on with data that did not arrive is not a choice this API
// offers: in Strata a too-small spin bound made decoding look faster and produced degenerate text.
//
// One window, host side:
//   const uint32_t w = doorbell.open_window();       // the window's number; the graph reads it at its start
//   graph.replay(ctx);                               // enqueue_window_start, enqueue_wait(...), guarded consumers
//   ... stage the data for layer L, then doorbell.ring(slot, w) ...   (any host thread)
//   const DoorbellCheck c = doorbell.check_window(); // waits for the stream; c.gave_up: redo or fail (run_window)
// Like cuda_backend.h this header needs no CUDA headers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

class MappedHostBuffer;

// The default bound of one device wait: 1 s. It is a hang guard, not a latency knob: a wait that gives up costs the
// window a redo, and one that gives up too early (Strata's too-small bound) is exactly the failure this guards
// against. 1 s is ~5,000x the slowest round trip measured on the H200 (189 us, bench/NOTES.md), ~75x what Strata's
// decode window waited for its CPU experts on an RTX 5070 (13.4 ms, strata-architecture.md 3.4), and under the 2 s
// after which a display driver (Windows TDR) resets a GPU whose kernel does not return, so a dead host worker shows
// up as our stall report rather than a device reset. No flag sets it yet: the expert offload that rings it will.
constexpr int64_t kDoorbellDefaultBoundUs = 1'000'000;

struct DoorbellOptions {
    int slots = 1;                               // flags, one per layer (or per layer and phase) that waits
    int64_t bound_us = kDoorbellDefaultBoundUs;  // one device wait gives up after this long
};

// Where a wait sits in the model, for the stall report. The window comes from the device at run time.
struct DoorbellWait {
    int slot = 0;
    int layer = 0;
};

// A copy of the data behind a doorbell (host memory mapped into the device, MappedHostBuffer::device()) into device
// memory: a consumer of that data, so it is skipped when the window gave up.
struct DoorbellCopy {
    const void* mapped_source = nullptr;
    void* device_destination = nullptr;
    size_t bytes = 0;  // a multiple of 16; both addresses 16-byte aligned
};

// The other direction: the window tells the host that a layer's data is ready for it (a routing and its input, for
// the CPU expert workers). Up to 4 device buffers are copied into mapped host memory, then the slot's outbox word is
// set to the window's number with a system-scope release, so the host that sees the number sees the bytes.
struct DoorbellPublish {
    int slot = 0;
    struct Part {
        const void* device_source = nullptr;
        void* mapped_destination = nullptr;  // MappedHostBuffer::device() of the host buffer
        size_t bytes = 0;                    // a multiple of 4
    } parts[4];
};

// One wait that hit its bound.
struct DoorbellStall {
    int layer = 0;
    int slot = 0;
    uint32_t window = 0;     // the window it waited in (= the ring value it expected)
    uint32_t last_seen = 0;  // the flag's value when it gave up (an earlier window's number, or 0: never rung)
    double waited_ms = 0;    // device time from the start of the wait to giving up
};

// What check_window() found.
struct [[nodiscard]] DoorbellCheck {
    uint32_t window = 0;
    bool gave_up = false;
    std::vector<DoorbellStall> stalls;  // this window's (at most one: a later wait in a given-up window does not wait)
    int64_t timeouts_total = 0;         // this doorbell's, since it was made
    std::string report;                 // one line when gave_up ("" otherwise): layer, window, bound, count
};

class Doorbell {
public:
    // Pins one page of flags and a stall log in mapped host memory and a small device state on the context's device.
    // Throws Error on bad options or when the memory cannot be had.
    Doorbell(Context& ctx, const DoorbellOptions& options);
    ~Doorbell();
    Doorbell(const Doorbell&) = delete;
    Doorbell& operator=(const Doorbell&) = delete;

    // ---- host side ----
    // Starts the next window and returns its number (1, 2, ...): what the window's waits expect and what ring() is
    // given. Throws Error while the previous window has not been checked (its number would be overwritten under it).
    uint32_t open_window();
    // Publishes that the data of `slot` for `window` is in place: call after writing that data (its stores are ordered
    // before the flag's, write-combined memory included). Any host thread; never blocks.
    void ring(int slot, uint32_t window);
    // Spins (bounded by `bound_us`) until the device has published `slot` for `window` (enqueue_publish); false when
    // the bound passed first. Any host thread.
    bool wait_published(int slot, uint32_t window, int64_t bound_us) const;
    // Waits for the context's stream (each wait on it ends within its bound) and says whether the window's waits all
    // saw their ring. Throws Error when the window's work did not start with enqueue_window_start.
    DoorbellCheck check_window();

    // ---- device side, queued on the context's stream; capturable into a graph (nothing baked in changes between
    // replays: the window number is read from mapped memory at the window's start) ----
    // The window's first step: takes the number open_window() published and clears the gave-up word.
    void enqueue_window_start();
    // One thread spins on the slot's flag (system-scope acquire load) until it reaches the window's number or the bound
    // passes; then it counts the timeout, logs a stall and sets the gave-up word. In a window that already gave up it
    // returns at once (one dead worker costs a window one bound, not one per layer).
    void enqueue_wait(const DoorbellWait& wait);
    // The copies of DoorbellPublish, then the slot's outbox word set to the window's number.
    void enqueue_publish(const DoorbellPublish& publish);
    // The copy of DoorbellCopy; nothing when the window gave up.
    void enqueue_copy(const DoorbellCopy& copy);
    // The redo of a window that gave up starts here: clears the gave-up word, so the consumers of the redo path (which
    // waits for nothing: its data is in place before it is queued) run.
    void enqueue_redo_start();
    // The word a consumer kernel of this doorbell's data checks first (doorbell_window_gave_up in doorbell_device.cuh).
    const uint32_t* gave_up_word() const;

    // This doorbell's; the process's (what /metrics shows as strata:doorbell_timeouts_total) is core/doorbell_stats.h.
    int64_t timeouts_total() const { return timeouts_total_; }
    const std::string& last_stall_report() const { return last_report_; }
    int64_t bound_us() const { return options_.bound_us; }

private:
    Context& ctx_;
    DoorbellOptions options_;
    std::unique_ptr<MappedHostBuffer> flags_;  // [slots] ring values, then the published window number
    std::unique_ptr<MappedHostBuffer> log_;    // the stall log the device writes
    std::unique_ptr<MappedHostBuffer> outbox_;  // [slots] window numbers the device published
    DeviceBuffer state_;                       // the window's device state (doorbell_wait.cu)
    uint32_t window_ = 0;
    bool window_open_ = false;
    uint32_t log_read_ = 0;  // stall records consumed so far
    int64_t timeouts_total_ = 0;
    std::string last_report_;
};

// The caller's policy for a window whose wait gave up, as one call: opens the window, runs `waiting(window)` (queue the
// window's work, waits included, and ring or hand the window to the host workers), checks it; when a wait gave up,
// runs `redo(window)` (the same window on a path that waits for nothing) or, with no redo, throws Error with the stall
// report. Returns the check (gave_up true: the window was redone).
struct DoorbellWindow {
    std::function<void(uint32_t window)> waiting;
    std::function<void(uint32_t window)> redo;  // empty: fail the request
};
DoorbellCheck run_window(Doorbell& doorbell, const DoorbellWindow& window);

}  // namespace strata::cuda
