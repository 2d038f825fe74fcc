// The doorbell ping-pong (issue 8, seed 000): how fast, and whether at all, a GPU thread spinning on a flag in mapped
// pinned host memory sees the host's store. The GPU waits for flag == i and answers ack = i; the host times each
// round. Every device spin is bounded in time and counts the waits that hit the bound; the host's wait is bounded too,
// so a read that never sees the store shows up as timeouts, never as a hang. The engine's doorbell primitive will use
// the read these measurements pick. Like cuda_backend.h this header needs no CUDA headers.
#pragma once

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

// How the device reads the flag.
enum class DoorbellRead {
    Plain,          // an ordinary load (the compiler may keep the first value in a register)
    Volatile,       // ld.volatile
    AcquireSystem,  // ld.acquire.sys (cuda::atomic_ref<thread_scope_system>::load(acquire))
    RelaxedRmw,     // atomicAdd_system(flag, 0): a relaxed read-modify-write at system scope
};
const char* doorbell_read_name(DoorbellRead read);

struct DoorbellOptions {
    DoorbellRead read = DoorbellRead::AcquireSystem;
    bool backoff = false;         // __nanosleep between the reads of a spin
    bool write_combined = false;  // cudaHostAllocWriteCombined for the flag's page
    int64_t rounds = 10000;
    int64_t device_bound_us = 1000;  // a device wait gives up after this long (and is counted)
    int64_t host_bound_us = 20000;   // a host wait for the ack gives up after this long (and is counted)
    bool ring = true;                // false: the host never writes the flag (a doorbell that never comes)
};

struct DoorbellResult {
    int64_t rounds = 0;
    double median_us = 0, p90_us = 0, max_us = 0;  // host-timed round trips
    int64_t device_timeouts = 0;                   // device waits that hit their bound
    int64_t host_misses = 0;                       // host waits that hit theirs
};

// Runs the ping-pong on the context's device (a kernel of one thread on the context's stream). Throws Error when the
// kernel does not finish within every bound summed (it cannot, as long as both sides keep their bounds).
DoorbellResult doorbell_ping_pong(Context& ctx, const DoorbellOptions& options);

}  // namespace strata::cuda
