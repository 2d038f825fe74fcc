// The hand-off between the stages of a split (stage_link.h).
#include "backend/cuda/stage_link.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace strata::cuda {

namespace {

size_t rounded(size_t bytes) {
    return (bytes + 255) / 256 * 256;
}

}  // namespace

size_t StageLink::staging_bytes(std::span<const Rows> rows) {
    size_t total = 0;
    for (const Rows& r : rows) total += rounded(r.bytes);
    return total;
}

StageLink::StageLink(Context& from, Context& to, size_t max_bytes) : from_(from), to_(to), max_bytes_(max_bytes) {
    const int a = from.info().index, b = to.info().index;
    if (a == b) {
        route_ = Route::SameDevice;
    } else {
        int can = 0;
        STRATA_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, b, a));
        route_ = can ? Route::Peer : Route::PinnedHost;
    }
    if (route_ == Route::Peer) {
        STRATA_CUDA_CHECK(cudaSetDevice(b));
        const cudaError_t err = cudaDeviceEnablePeerAccess(a, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled)
            (void)cudaGetLastError();
        else
            STRATA_CUDA_CHECK(err);
    }
    if (route_ == Route::PinnedHost) {
        if (cudaHostAlloc(&staging_, std::max<size_t>(max_bytes, 1), cudaHostAllocPortable) != cudaSuccess) {
            (void)cudaGetLastError();
            throw Error("CUDA split: no page-locked host memory (" + std::to_string(max_bytes >> 10) +
                        " KiB) for the hand-off between devices " + std::to_string(a) + " and " + std::to_string(b));
        }
    }
    // Each event on the device of the stream it is recorded on.
    STRATA_CUDA_CHECK(cudaSetDevice(a));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaSetDevice(b));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
}

StageLink::~StageLink() {
    // The streams may still hold copies of this link: they finish first (a failing call here has nothing to report
    // to; the next checked call reports the fault).
    if (cudaStreamSynchronize(to_.stream().handle()) != cudaSuccess) (void)cudaGetLastError();
    if (cudaStreamSynchronize(from_.stream().handle()) != cudaSuccess) (void)cudaGetLastError();
    if (ready_ && cudaEventDestroy(ready_) != cudaSuccess) (void)cudaGetLastError();
    if (copied_ && cudaEventDestroy(copied_) != cudaSuccess) (void)cudaGetLastError();
    if (staging_ && cudaFreeHost(staging_) != cudaSuccess) (void)cudaGetLastError();
}

const char* StageLink::route_name(Route route) {
    switch (route) {
        case Route::SameDevice: return "one device (device-to-device copy)";
        case Route::Peer: return "peer copy";
        case Route::PinnedHost: return "through page-locked host memory";
    }
    return "?";
}

void StageLink::hand_off(std::span<const Rows> rows) {
    const int a = from_.info().index, b = to_.info().index;
    cudaStream_t from = from_.stream().handle(), to = to_.stream().handle();
    STRATA_ASSERT(staging_bytes(rows) <= max_bytes_);
    STRATA_CUDA_CHECK(cudaSetDevice(a));
    if (route_ == Route::PinnedHost) {
        // Out on the stage before's stream (its later work waits for the copy in, which reads the staging).
        size_t at = 0;
        for (const Rows& r : rows) {
            if (r.bytes)
                STRATA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(staging_) + at, r.from, r.bytes,
                                                  cudaMemcpyDeviceToHost, from));
            at += rounded(r.bytes);
        }
    }
    STRATA_CUDA_CHECK(cudaEventRecord(ready_, from));
    STRATA_CUDA_CHECK(cudaSetDevice(b));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(to, ready_, 0));
    size_t at = 0;
    for (const Rows& r : rows) {
        if (r.bytes == 0) continue;
        switch (route_) {
            case Route::SameDevice:
                STRATA_CUDA_CHECK(cudaMemcpyAsync(r.to, r.from, r.bytes, cudaMemcpyDeviceToDevice, to));
                break;
            case Route::Peer: STRATA_CUDA_CHECK(cudaMemcpyPeerAsync(r.to, b, r.from, a, r.bytes, to)); break;
            case Route::PinnedHost:
                STRATA_CUDA_CHECK(cudaMemcpyAsync(r.to, static_cast<const char*>(staging_) + at, r.bytes,
                                                  cudaMemcpyHostToDevice, to));
                break;
        }
        at += rounded(r.bytes);
    }
    STRATA_CUDA_CHECK(cudaEventRecord(copied_, to));
    // The stage before's next window overwrites the rows (and the staging): it waits for the copy. The wait is
    // queued now, on a stream of another device where they differ (allowed for cudaStreamWaitEvent).
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(from, copied_, 0));
}

}  // namespace strata::cuda
