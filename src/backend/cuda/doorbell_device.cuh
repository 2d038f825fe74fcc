// Private to the CUDA backend: the device side of a doorbell, shared by the ping-pong benchmark (doorbell.cu) and the
// engine's wait (doorbell_wait.cu), plus the check a kernel that consumes a doorbell's data makes first.
#pragma once

#include <cstdint>

namespace strata::cuda {

// The global nanosecond timer: a spin's bound is wall time, whatever the clocks do.
__device__ __forceinline__ uint64_t doorbell_global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The read the H200 measurements chose (bench/NOTES.md, 2026-12-01): a system-scope acquire load sees the host's
// store in ~3 us and orders the reads of the data the host wrote before ringing after it. (A plain load is hoisted out
// of the spin; a system-scope fetch_add(0) on host memory was served without the host's store on the H200.)
__device__ __forceinline__ uint32_t doorbell_load_acquire_system(const uint32_t* flag) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    return v;
}

// Whether the window's doorbell wait gave up (Doorbell::gave_up_word()): a kernel that consumes the data behind a
// doorbell returns without writing anything when it did, so data that never arrived is never used. nullptr: no guard.
__device__ __forceinline__ bool doorbell_window_gave_up(const uint32_t* gave_up_word) {
    if (gave_up_word == nullptr) return false;
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(gave_up_word) : "memory");
    return v != 0;
}

}  // namespace strata::cuda
