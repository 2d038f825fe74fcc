#include "backend/cuda/host_memory.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace strata::cuda {

HostRegistration::HostRegistration(const Context& ctx, std::vector<std::pair<const void*, size_t>> ranges,
                                   HostPinning pinning)
    : pinning_(pinning) {
    const auto start = std::chrono::steady_clock::now();
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    if (pinning == HostPinning::Copy) {
        std::sort(ranges.begin(), ranges.end());
        size_t total = 0;
        for (const auto& [p, n] : ranges) total += (n + 255) / 256 * 256;
        const cudaError_t err =
            cudaHostAlloc(&arena_, std::max<size_t>(total, 1), cudaHostAllocMapped | cudaHostAllocPortable);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            arena_ = nullptr;
            throw Error("CUDA: cannot pin " + std::to_string(total >> 20) + " MiB of host memory for the experts: " +
                        cudaGetErrorString(err) + "; check free RAM and `ulimit -l`, or lower --ram-budget");
        }
        void* device = nullptr;
        STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&device, arena_, 0));
        size_t at = 0;
        for (const auto& [p, n] : ranges) {
            regions_.push_back({static_cast<const uint8_t*>(p), n, static_cast<const uint8_t*>(arena_) + at,
                                static_cast<const uint8_t*>(device) + at});
            at += (n + 255) / 256 * 256;
        }
        bytes_ = total;
        // The copy in pieces of 64 MiB over every core: page faults on the mapped file then overlap.
        std::vector<std::pair<const uint8_t*, uint8_t*>> pieces;
        std::vector<size_t> piece_bytes;
        constexpr size_t kPiece = size_t{64} << 20;
        for (const Region& r : regions_)
            for (size_t off = 0; off < r.bytes; off += kPiece) {
                pieces.push_back({r.original + off, const_cast<uint8_t*>(r.host) + off});
                piece_bytes.push_back(std::min(kPiece, r.bytes - off));
            }
        std::atomic<size_t> next{0};
        const unsigned n_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < n_threads; ++t)
            threads.emplace_back([&] {
                for (size_t i; (i = next.fetch_add(1)) < pieces.size();)
                    std::memcpy(pieces[i].second, pieces[i].first, piece_bytes[i]);
            });
        for (std::thread& t : threads) t.join();
        seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return;
    }
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    std::vector<std::pair<uintptr_t, uintptr_t>> spans;  // page-aligned [begin, end)
    for (const auto& [p, n] : ranges) {
        if (!p || n == 0) continue;
        const auto b = reinterpret_cast<uintptr_t>(p);
        spans.push_back({b / page * page, (b + n + page - 1) / page * page});
    }
    std::sort(spans.begin(), spans.end());
    std::vector<std::pair<uintptr_t, uintptr_t>> merged;
    for (const auto& s : spans)
        if (!merged.empty() && s.first <= merged.back().second)
            merged.back().second = std::max(merged.back().second, s.second);
        else
            merged.push_back(s);
    int read_only = 0;
    (void)cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, ctx.info().index);
    const unsigned flags =
        cudaHostRegisterMapped | cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    for (const auto& [b, e] : merged) {
        void* host = reinterpret_cast<void*>(b);
        const cudaError_t err = cudaHostRegister(host, e - b, flags);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            for (const Region& r : regions_) (void)cudaHostUnregister(const_cast<uint8_t*>(r.original));
            regions_.clear();
            throw Error("CUDA: cannot pin " + std::to_string((e - b) >> 20) + " MiB of the model's expert pages (" +
                        std::to_string(bytes_ >> 20) + " MiB pinned before it): " + cudaGetErrorString(err) +
                        "; check `ulimit -l` and free RAM, or lower --ram-budget so experts are read from the file");
        }
        void* device = nullptr;
        STRATA_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
        regions_.push_back({static_cast<const uint8_t*>(host), e - b, static_cast<const uint8_t*>(host),
                            static_cast<const uint8_t*>(device)});
        bytes_ += e - b;
    }
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

HostRegistration::~HostRegistration() {
    if (arena_) {
        if (cudaFreeHost(arena_) != cudaSuccess) (void)cudaGetLastError();
        return;
    }
    for (const Region& r : regions_)
        if (cudaHostUnregister(const_cast<uint8_t*>(r.original)) != cudaSuccess) (void)cudaGetLastError();
}

const HostRegistration::Region& HostRegistration::region(const void* original) const {
    const auto* p = static_cast<const uint8_t*>(original);
    auto it = std::upper_bound(regions_.begin(), regions_.end(), p,
                               [](const uint8_t* q, const Region& r) { return q < r.original; });
    if (it == regions_.begin() || p >= (it - 1)->original + (it - 1)->bytes)
        throw Error("CUDA: a host address outside the pinned expert bytes");
    return *(it - 1);
}

const void* HostRegistration::device(const void* original) const {
    const Region& r = region(original);
    return r.device + (static_cast<const uint8_t*>(original) - r.original);
}

const void* HostRegistration::host(const void* original) const {
    const Region& r = region(original);
    return r.host + (static_cast<const uint8_t*>(original) - r.original);
}

CopyStream::CopyStream(const Context& ctx) {
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (CUevent_st*& e : events_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CopyStream::~CopyStream() {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    for (CUevent_st* e : events_)
        if (e) (void)cudaEventDestroy(e);
    if (stream_) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
}

void CopyStream::copy(void* device_destination, const void* source, size_t bytes) {
    if (bytes) STRATA_CUDA_CHECK(cudaMemcpyAsync(device_destination, source, bytes, cudaMemcpyDefault, stream_));
}

uint64_t CopyStream::ticket() {
    // An event is reused kEvents tickets later; wait for it first (bounded by the copies queued before it).
    if (issued_ + 1 > landed_ + kEvents) {
        STRATA_CUDA_CHECK(cudaEventSynchronize(events_[(landed_ + 1) % kEvents]));
        ++landed_;
    }
    ++issued_;
    STRATA_CUDA_CHECK(cudaEventRecord(events_[issued_ % kEvents], stream_));
    return issued_;
}

bool CopyStream::landed(uint64_t ticket) {
    while (landed_ < ticket && landed_ < issued_) {
        const cudaError_t err = cudaEventQuery(events_[(landed_ + 1) % kEvents]);
        if (err == cudaErrorNotReady) {
            (void)cudaGetLastError();
            return false;
        }
        STRATA_CUDA_CHECK(err);
        ++landed_;
    }
    return landed_ >= ticket;
}

void CopyStream::synchronize() {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    landed_ = issued_;
}

CopyRing::CopyRing(Context& ctx, int buffers, size_t buffer_bytes) : ctx_(ctx), buffer_bytes_(buffer_bytes) {
    if (buffers < 1 || buffer_bytes == 0 || buffer_bytes % 256 != 0)
        throw Error("CUDA copy ring: " + std::to_string(buffers) + " buffers of " + std::to_string(buffer_bytes) +
                    " bytes (at least one, a multiple of 256 bytes)");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    memory_ = ctx.allocate(static_cast<size_t>(buffers) * buffer_bytes, "expert stream ring");
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ready_.assign(static_cast<size_t>(buffers), nullptr);
    free_.assign(static_cast<size_t>(buffers), nullptr);
    for (std::vector<CUevent_st*>* events : {&ready_, &free_})
        for (CUevent_st*& e : *events) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CopyRing::~CopyRing() {
    if (stream_) (void)cudaStreamSynchronize(stream_);
    for (std::vector<CUevent_st*>* events : {&ready_, &free_})
        for (CUevent_st* e : *events)
            if (e) (void)cudaEventDestroy(e);
    if (stream_) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
}

void CopyRing::fill(int64_t chunk, const std::vector<Piece>& pieces) {
    const int64_t n = buffers();
    if (chunk != filled_ + 1 || chunk - n > released_)
        throw Error("CUDA copy ring: chunk " + std::to_string(chunk) + " filled out of order (filled " +
                    std::to_string(filled_) + ", released " + std::to_string(released_) + ")");
    const size_t b = static_cast<size_t>(chunk % n);
    // The buffer's last reader must be done; before the first round the event was never recorded (no wait).
    if (chunk >= n) STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_, free_[b], 0));
    uint8_t* base = buffer(static_cast<int>(b));
    for (const Piece& p : pieces) {
        const size_t pitch = p.rows > 1 ? p.pitch : p.bytes, source_pitch = p.rows > 1 ? p.source_pitch : p.bytes;
        if (p.bytes == 0 || p.rows == 0) continue;
        if (p.offset + (p.rows - 1) * pitch + p.bytes > buffer_bytes_ || pitch < p.bytes || source_pitch < p.bytes)
            throw Error("CUDA copy ring: a piece of " + std::to_string(p.rows) + " x " + std::to_string(p.bytes) +
                        " bytes at offset " + std::to_string(p.offset) + " does not fit a buffer of " +
                        std::to_string(buffer_bytes_));
        if (p.rows == 1)
            STRATA_CUDA_CHECK(cudaMemcpyAsync(base + p.offset, p.source, p.bytes, cudaMemcpyDefault, stream_));
        else
            STRATA_CUDA_CHECK(cudaMemcpy2DAsync(base + p.offset, pitch, p.source, source_pitch, p.bytes, p.rows,
                                                cudaMemcpyDefault, stream_));
        bytes_copied_ += p.bytes * p.rows;
    }
    STRATA_CUDA_CHECK(cudaEventRecord(ready_[b], stream_));
    filled_ = chunk;
}

void CopyRing::acquire(int64_t chunk) {
    if (chunk != acquired_ + 1 || chunk > filled_)
        throw Error("CUDA copy ring: chunk " + std::to_string(chunk) + " acquired out of order (filled " +
                    std::to_string(filled_) + ", acquired " + std::to_string(acquired_) + ")");
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream().handle(), ready_[static_cast<size_t>(chunk % buffers())], 0));
    acquired_ = chunk;
}

void CopyRing::release(int64_t chunk) {
    if (chunk != released_ + 1 || chunk > acquired_)
        throw Error("CUDA copy ring: chunk " + std::to_string(chunk) + " released out of order (acquired " +
                    std::to_string(acquired_) + ", released " + std::to_string(released_) + ")");
    STRATA_CUDA_CHECK(cudaEventRecord(free_[static_cast<size_t>(chunk % buffers())], ctx_.stream().handle()));
    released_ = chunk;
}

void CopyRing::reset() {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ctx_.synchronize();
    filled_ = acquired_ = released_ = -1;
}

void copy_to_host_async(Context& ctx, void* pinned_host, const void* device, size_t bytes) {
    if (bytes)
        STRATA_CUDA_CHECK(cudaMemcpyAsync(pinned_host, device, bytes, cudaMemcpyDeviceToHost, ctx.stream().handle()));
}

namespace {

__global__ void gather_ints_kernel(const int32_t* const* sources, int64_t count, int64_t stride, int32_t* out) {
    const int32_t* src = sources[blockIdx.x];
    int32_t* dst = out + static_cast<int64_t>(blockIdx.x) * stride;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

void gather_ints_to_mapped(Context& ctx, const int32_t* const* sources, int64_t n_sources, int64_t count,
                           int64_t stride, int32_t* mapped_destination) {
    if (n_sources <= 0 || count <= 0) return;
    gather_ints_kernel<<<static_cast<unsigned>(n_sources), 128, 0, ctx.stream().handle()>>>(sources, count, stride,
                                                                                            mapped_destination);
    STRATA_CUDA_CHECK_LAUNCH("gather_ints_kernel");
}

}  // namespace strata::cuda
