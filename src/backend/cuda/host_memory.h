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

// Pages of existing host memory (a mapped file) registered with the driver: page-locked, mapped, portable, and
// read-only where the device supports it. Ranges that share pages are merged first (the driver refuses a page twice).
class HostRegistration {
public:
    // Throws Error, with the bytes asked for, when the system will not pin them (ulimit -l, or too little RAM).
    HostRegistration(const Context& ctx, std::vector<std::pair<const void*, size_t>> ranges);
    ~HostRegistration();
    HostRegistration(const HostRegistration&) = delete;
    HostRegistration& operator=(const HostRegistration&) = delete;

    // The device address of a registered host byte; throws Error for one outside every range.
    const void* device(const void* host) const;
    size_t bytes() const { return bytes_; }
    double seconds() const { return seconds_; }  // how long registering took (the pages are read in)

private:
    struct Region {
        const uint8_t* host;
        size_t bytes;
        const uint8_t* device;
    };
    std::vector<Region> regions_;  // by host address
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
