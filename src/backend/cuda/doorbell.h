// The doorbell ping-pong (issue 8, seed 000): how fast, and whether at all, a GPU thread spinning on a flag in mapped
// pinned host memory sees the host's store. The GPU waits for flag == i and answers ack = i; the host times each
// round. Every device spin is bounded in time and counts the waits that hit the bound; the host's wait is bounded too,
// so a read that never sees the store shows up as timeouts, never as a hang. On the H200 (bench/NOTES.md, 2026-12-01)
// the volatile and the system-scope acquire loads saw every ring in ~3 us; the plain load (hoisted out of the spin)
// and the system-scope fetch_add(0) (answered without the host's store: CUDA promises nothing for system-scope atomics
// on host memory without cudaDevAttrHostNativeAtomicSupported) ran to their bound. The engine's doorbell
// (doorbell_wait.h) reads with the acquire load. Like cuda_backend.h this header needs no CUDA headers.
#pragma once

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

// How the device reads the flag.
enum class DoorbellRead {
    Plain,          // an ordinary load (the compiler may keep the first value in a register): H200, every wait timed out
    Volatile,       // ld.volatile: H200, sees every ring
    AcquireSystem,  // ld.acquire.sys (cuda::atomic_ref<thread_scope_system>::load(acquire)): H200, sees every ring
    RelaxedRmw,     // atomicAdd_system(flag, 0), a relaxed RMW at system scope: H200, ~98% of the waits timed out
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

// Whether the device does system-scope atomics on host memory natively (cudaDevAttrHostNativeAtomicSupported). Without
// it CUDA promises nothing for them, which is why the doorbell reads its flags with loads, never read-modify-writes.
bool host_native_atomics(const Context& ctx);

}  // namespace strata::cuda
