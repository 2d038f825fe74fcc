// The hand-off between two consecutive stages of a model split over several GPUs (issue 29; model/cuda/
// split_cuda.cpp): after each window, device rows of the stage before (the residual streams and any pending write) are
// copied into the same rows of the stage after, ordered by events between the two contexts' streams. By peer copy
// where the devices reach each other, through page-locked host memory where not, and as a plain device-to-device copy
// when both stages are on one device (the test path without two GPUs). Needs no CUDA headers.
#pragma once

#include <cstddef>
#include <span>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

class StageLink {
  public:
    // One piece of a hand-off: `bytes` at `from` (the stage before's device memory) into `to` (the stage after's).
    struct Rows {
        const void* from = nullptr;
        void* to = nullptr;
        size_t bytes = 0;
    };
    enum class Route { SameDevice, Peer, PinnedHost };

    // What a hand-off of these rows takes of max_bytes (each piece at a 256-byte boundary).
    static size_t staging_bytes(std::span<const Rows> rows);
    // max_bytes: the most a hand-off takes (staging_bytes; sizes the host staging of the PinnedHost route). Enables
    // peer access from `to`'s device to `from`'s where the devices allow it.
    StageLink(Context& from, Context& to, size_t max_bytes);
    ~StageLink();
    StageLink(const StageLink&) = delete;
    StageLink& operator=(const StageLink&) = delete;

    // Queued after the work queued so far on `from`'s stream (the window that wrote the rows): `to`'s stream waits for
    // it and copies the rows (PinnedHost: `from` copies them out, `to` copies them in), and `from`'s stream waits for
    // that copy before its later work, which overwrites the rows. Nothing here blocks the host. Leaves `to`'s device
    // current.
    void hand_off(std::span<const Rows> rows);

    Route route() const { return route_; }
    static const char* route_name(Route route);

  private:
    Context& from_;
    Context& to_;
    Route route_ = Route::SameDevice;
    size_t max_bytes_ = 0;
    void* staging_ = nullptr;        // PinnedHost: max_bytes of page-locked memory
    CUevent_st* ready_ = nullptr;    // on `from`'s device: the rows are written (or copied out)
    CUevent_st* copied_ = nullptr;   // on `to`'s device: the rows are copied in
};

}  // namespace strata::cuda
