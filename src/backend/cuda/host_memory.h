// Host memory the device reads directly, and a copy stream beside the context's stream: what experts in host RAM
// (issue 25) need from the backend. The mapped file's expert pages are registered (page-locked and mapped into the
// device's address space, read-only), so a gathered product reads a missed expert over PCIe through its device
// address, and a swap copies an expert into a VRAM cache slot on the copy stream while windows run. Like
// cuda_backend.h this header needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

// The model's expert bytes where the device can read them: a page-locked, mapped copy (cudaHostAlloc, filled by
// several threads from the mapped file), or the mapped file's own pages registered with the driver (page-locked,
// mapped, read-only where supported; ranges that share pages are merged first, since the driver refuses a page twice).
// Registering avoids the second copy in RAM, but the driver pins a private file mapping page by page (and a kernel
// may unshare each page it pins): on the H200 machine 43 GB did not register within two minutes, so copying is the
// default.
enum class HostPinning { Copy, Register };

class HostRegistration {
  public:
    // Throws Error, with the bytes asked for, when the system will not pin them (ulimit -l, or too little RAM).
    HostRegistration(const Context& ctx, std::vector<std::pair<const void*, size_t>> ranges,
                     HostPinning pinning = HostPinning::Copy);
    ~HostRegistration();
    HostRegistration(const HostRegistration&) = delete;
    HostRegistration& operator=(const HostRegistration&) = delete;

    // Where a byte of one of the ranges lies for the device, and for host reads (the copy's host address, or the byte
    // itself when registered); throw Error for one outside every range.
    const void* device(const void* host) const;
    const void* host(const void* original) const;
    size_t bytes() const { return bytes_; }
    double seconds() const { return seconds_; }  // how long pinning (and copying) took

  private:
    struct Region {
        const uint8_t* original;
        size_t bytes;
        const uint8_t* host;
        const uint8_t* device;
    };
    const Region& region(const void* original) const;
    std::vector<Region> regions_;  // by original address
    HostPinning pinning_;
    void* arena_ = nullptr;  // the copy (HostPinning::Copy)
    size_t bytes_ = 0;
    double seconds_ = 0;
};

// A stream for copies that must not hold up the context's stream (expert swaps), with tickets to ask, without
// waiting, whether the copies queued before a ticket have landed.
class CopyStream {
  public:
    explicit CopyStream(const Context& ctx);
    ~CopyStream();
    CopyStream(const CopyStream&) = delete;
    CopyStream& operator=(const CopyStream&) = delete;

    // `bytes` from `source` (device memory or registered host memory) to device memory; queued, returns at once.
    void copy(void* device_destination, const void* source, size_t bytes);
    // A ticket for every copy queued so far (1, 2, ...).
    uint64_t ticket();
    // Whether the copies before `ticket` have landed; never blocks.
    bool landed(uint64_t ticket);
    void synchronize();

  private:
    static constexpr int kEvents = 256;
    CUstream_st* stream_ = nullptr;
    CUevent_st* events_[kEvents] = {};
    uint64_t issued_ = 0;  // tickets handed out
    uint64_t landed_ = 0;  // every ticket up to this one has landed
};

// Device bytes into page-locked host memory (allocate_pinned_floats, MappedHostBuffer), queued on the context's
// stream: capturable, so a window's graph can hand its routing to the host.
void copy_to_host_async(Context& ctx, void* pinned_host, const void* device, size_t bytes);

// One launch for many small copies into mapped host memory (MappedHostBuffer::device()): source i (sources is a
// device array of n_sources pointers) gives `count` ints at destination + i * stride. Capturable; a decode window
// hands every layer's routing to the host with it, where a copy per layer would cost a graph node each.
void gather_ints_to_mapped(Context& ctx, const int32_t* const* sources, int64_t n_sources, int64_t count,
                           int64_t stride, int32_t* mapped_destination);

}  // namespace strata::cuda
