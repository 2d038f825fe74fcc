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

// Device buffers a copy stream fills while the context's stream computes from them, chunk after chunk (a prompt
// window's experts streamed into VRAM, issue 25). Chunk c (numbered from 0, never reused) goes into buffer
// c % buffers(). The host only queues, never waits: fill(c) copies after the context's stream has released chunk
// c - buffers(), acquire(c) makes the context's stream wait for chunk c's bytes, release(c) frees its buffer. Calls
// must come in that order (fill(c) after release(c - buffers()), acquire(c) after fill(c), chunks in order); one out
// of order throws Error, since its wait would pair with the wrong copy. reset() waits for both streams and starts
// the numbering again (after a window that stopped half way).
class CopyRing {
  public:
    CopyRing(Context& ctx, int buffers, size_t buffer_bytes);
    ~CopyRing();
    CopyRing(const CopyRing&) = delete;
    CopyRing& operator=(const CopyRing&) = delete;

    // `rows` rows of `bytes`, source_pitch apart in pinned or device memory, to buffer offset `offset`, pitch apart.
    struct Piece {
        size_t offset;
        const void* source;
        size_t bytes;
        size_t rows = 1;
        size_t source_pitch = 0;
        size_t pitch = 0;
    };
    int buffers() const { return static_cast<int>(ready_.size()); }
    size_t buffer_bytes() const { return buffer_bytes_; }
    uint8_t* buffer(int i) const { return memory_.as<uint8_t>() + static_cast<size_t>(i) * buffer_bytes_; }
    void fill(int64_t chunk, const std::vector<Piece>& pieces);
    void acquire(int64_t chunk);
    void release(int64_t chunk);
    void reset();
    // Whether every chunk filled was acquired and released (a window that ran to its end).
    bool drained() const { return acquired_ == filled_ && released_ == filled_; }
    int64_t next_chunk() const { return filled_ + 1; }
    uint64_t bytes_copied() const { return bytes_copied_; }

  private:
    Context& ctx_;
    size_t buffer_bytes_ = 0;
    DeviceBuffer memory_;
    CUstream_st* stream_ = nullptr;
    std::vector<CUevent_st*> ready_, free_;
    int64_t filled_ = -1, acquired_ = -1, released_ = -1;
    uint64_t bytes_copied_ = 0;
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
