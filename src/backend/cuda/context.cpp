// Devices, memory accounting, buffers, streams and the per-device context.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "backend/cuda/blas.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"

namespace strata::cuda {

namespace {

std::string human_bytes(size_t bytes) {
    char buf[64];
    const double b = static_cast<double>(bytes);
    if (bytes >= (size_t{1} << 30))
        std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
    else if (bytes >= (size_t{1} << 20))
        std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
    else
        std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
    return buf;
}

// cudaMalloc's granularity is coarser anyway; 256 keeps every buffer's tail granule inside the allocation.
constexpr size_t kAllocationGranule = 256;

}  // namespace

// ---- devices --------------------------------------------------------------------------------------------------------

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // reset the runtime's last-error state so later checks start clean
        return 0;
    }
    return n;
}

std::string no_device_reason() {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
    }
    return n == 0 ? "no CUDA device present" : "";
}

// ---- memory ---------------------------------------------------------------------------------------------------------

MemoryAccountant::~MemoryAccountant() {
    // Buffers hold a pointer to their accountant: one outliving it is a bug in the owner's order of destruction.
    STRATA_ASSERT(used_ == 0);
}

void MemoryAccountant::reserve(size_t bytes, const std::string& label) {
    if (bytes > budget_ || used_ > budget_ - bytes)
        throw Error("CUDA: allocating " + human_bytes(bytes) + " for " + label + " would exceed the VRAM budget of " +
                    human_bytes(budget_) + " (" + human_bytes(used_) + " in use); raise --vram-budget or use a "
                    "smaller model or context");
    used_ += bytes;
    by_label_[label] += bytes;
    if (used_ > peak_) peak_ = used_;
}

void MemoryAccountant::release(size_t bytes, const std::string& label) {
    auto it = by_label_.find(label);
    STRATA_ASSERT(it != by_label_.end() && it->second >= bytes && used_ >= bytes);
    it->second -= bytes;
    if (it->second == 0) by_label_.erase(it);
    used_ -= bytes;
}

std::string MemoryAccountant::plan() const {
    std::string s;
    for (const auto& [label, bytes] : by_label_) s += "  " + label + ": " + human_bytes(bytes) + "\n";
    s += "  total: " + human_bytes(used_) + " of a budget of " + human_bytes(budget_) + " (peak " +
         human_bytes(peak_) + ")\n";
    return s;
}

DeviceBuffer::DeviceBuffer(MemoryAccountant& accountant, size_t bytes, std::string label)
    : bytes_(bytes), accountant_(&accountant), label_(std::move(label)) {
    booked_ = (bytes + kAllocationGranule - 1) / kAllocationGranule * kAllocationGranule;
    if (booked_ == 0) booked_ = kAllocationGranule;
    accountant.reserve(booked_, label_);  // throws before cudaMalloc is asked
    const cudaError_t err = cudaMalloc(&ptr_, booked_);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        accountant.release(booked_, label_);
        ptr_ = nullptr;
        throw Error("CUDA: cudaMalloc of " + human_bytes(booked_) + " for " + label_ + " failed: " +
                    cudaGetErrorString(err) + " (" + human_bytes(accountant.used()) + " held by strata)");
    }
}

DeviceBuffer::~DeviceBuffer() {
    reset();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      booked_(std::exchange(other.booked_, 0)),
      accountant_(std::exchange(other.accountant_, nullptr)),
      label_(std::move(other.label_)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
        reset();
        ptr_ = std::exchange(other.ptr_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
        booked_ = std::exchange(other.booked_, 0);
        accountant_ = std::exchange(other.accountant_, nullptr);
        label_ = std::move(other.label_);
    }
    return *this;
}

void DeviceBuffer::reset() noexcept {
    if (!ptr_) return;
    // A failing free in a destructor cannot be reported by throwing; it only happens after a fault that the next
    // checked call reports anyway.
    if (cudaFree(ptr_) != cudaSuccess) (void)cudaGetLastError();
    accountant_->release(booked_, label_);
    ptr_ = nullptr;
    bytes_ = booked_ = 0;
}

// ---- streams --------------------------------------------------------------------------------------------------------

Stream::Stream() {
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::~Stream() {
    if (stream_ && cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
}

void Stream::synchronize() const {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- context --------------------------------------------------------------------------------------------------------

namespace {

// loaded_kernel_arch() of the current device, asked once per device (programmatic launches ask at every launch).
int current_kernel_arch(int device) {
    constexpr int kKnownDevices = 64;
    static std::array<std::atomic<int>, kKnownDevices> known{};  // 0: not asked yet
    if (device < 0 || device >= kKnownDevices) return loaded_kernel_arch();
    int arch = known[static_cast<size_t>(device)].load(std::memory_order_relaxed);
    if (arch == 0) {
        arch = loaded_kernel_arch();
        known[static_cast<size_t>(device)].store(arch, std::memory_order_relaxed);
    }
    return arch;
}

}  // namespace

bool programmatic_launch_supported() {
    int device = 0, major = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 9 && current_kernel_arch(device) >= 900;
}

void prefer_shared_memory_carveout(const void* kernel) {
    static std::mutex mutex;
    static std::set<std::pair<int, const void*>> done;
    int device = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    const std::lock_guard lock(mutex);
    if (done.count({device, kernel})) return;
    STRATA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    done.insert({device, kernel});
}

bool clusters_supported() {
    int device = 0, yes = 0;
    STRATA_CUDA_CHECK(cudaGetDevice(&device));
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&yes, cudaDevAttrClusterLaunch, device));
    return yes != 0 && current_kernel_arch(device) >= 900;
}

Context::Context(const ContextOptions& options) {
    const int n = device_count();
    if (n == 0) throw Error("CUDA backend: " + no_device_reason());
    if (options.device < 0 || options.device >= n)
        throw Error("CUDA backend: device " + std::to_string(options.device) + " does not exist (" +
                    std::to_string(n) + " device(s), numbered from 0)");
    STRATA_CUDA_CHECK(cudaSetDevice(options.device));
    cudaDeviceProp prop{};
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, options.device));
    size_t free_bytes = 0, total_bytes = 0;
    STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    info_ = {.index = options.device,
             .name = prop.name,
             .cc_major = prop.major,
             .cc_minor = prop.minor,
             .kernel_arch = 0,
             .max_shared_per_block = prop.sharedMemPerBlockOptin,
             .multiprocessors = prop.multiProcessorCount,
             .l2_bytes = static_cast<size_t>(prop.l2CacheSize),
             .total_bytes = total_bytes,
             .free_bytes_at_start = free_bytes};
    // The kernels use dp4a and __shfl_sync (sm_61+); the build's oldest architecture is 7.5.
    if (prop.major < 7 || (prop.major == 7 && prop.minor < 5))
        throw Error("CUDA backend: " + info_.name + " has compute capability " + std::to_string(prop.major) + "." +
                    std::to_string(prop.minor) + "; strata needs 7.5 or newer");
    info_.kernel_arch = current_kernel_arch(options.device);
    if (info_.kernel_arch == 0)
        throw Error("CUDA backend: this build has no kernels for " + info_.name + " (compute capability " +
                    std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                    "); rebuild with CMAKE_CUDA_ARCHITECTURES including " + std::to_string(prop.major) +
                    std::to_string(prop.minor));
    const size_t budget = options.vram_budget ? options.vram_budget : free_bytes / 20 * 19;
    memory_ = std::make_unique<MemoryAccountant>(budget);
    blas_products_ = options.blas_products;
    stream_ = std::make_unique<Stream>();
    upload_basic_tables();
    upload_iq_tables();
}

Context::~Context() {
    if (stream_ && cudaStreamSynchronize(stream_->handle()) != cudaSuccess) (void)cudaGetLastError();
    blas_.reset();              // its workspace is booked in the accountant, and it is bound to the stream
    scratch_ = DeviceBuffer();  // before the accountant it is booked in
}

void Context::make_current() const {
    STRATA_CUDA_CHECK(cudaSetDevice(info_.index));
}

DeviceBuffer Context::allocate(size_t bytes, const std::string& label) {
    STRATA_CUDA_CHECK(cudaSetDevice(info_.index));
    return DeviceBuffer(*memory_, bytes, label);
}

DeviceBuffer Context::upload(const void* host, size_t bytes, const std::string& label) {
    DeviceBuffer b = allocate(bytes, label);
    // On the context's stream, then waited for: a plain cudaMemcpy from pageable memory may return before its DMA
    // has landed, and it is not ordered with this non-blocking stream, so a kernel queued next could read stale bytes
    // (seen on the H200: a greedy test read the previous row's logits at a reused address).
    if (!bytes) return b;
    const cudaError_t err = cudaMemcpyAsync(b.data(), host, bytes, cudaMemcpyHostToDevice, stream_->handle());
    if (err != cudaErrorInvalidValue) {
        STRATA_CUDA_CHECK(err);
        stream_->synchronize();
        return b;
    }
    // A source that straddles page-locked and pageable memory (a tensor beside the expert pages that the offload
    // registers: their first and last pages are shared) is refused whole: copy it through a page-locked bounce.
    (void)cudaGetLastError();
    constexpr size_t kChunk = size_t{16} << 20;
    void* bounce = nullptr;
    STRATA_CUDA_CHECK(cudaMallocHost(&bounce, std::min(bytes, kChunk)));
    try {
        for (size_t done = 0; done < bytes; done += kChunk) {
            const size_t n = std::min(kChunk, bytes - done);
            std::memcpy(bounce, static_cast<const uint8_t*>(host) + done, n);
            STRATA_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(b.data()) + done, bounce, n,
                                              cudaMemcpyHostToDevice, stream_->handle()));
            stream_->synchronize();
        }
    } catch (...) {
        (void)cudaFreeHost(bounce);
        throw;
    }
    STRATA_CUDA_CHECK(cudaFreeHost(bounce));
    return b;
}

// Page-locked staging for downloads: kSlots chunks, each with an event that says its copy has landed. A copy into
// pageable memory goes through the driver's own staging at a fraction of the bus's speed; a decode token's logits
// (~1 MB) are on the critical path of every token.
class DownloadRing {
  public:
    DownloadRing() {
        for (cudaEvent_t& e : landed_) STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        void* staging = nullptr;
        if (cudaHostAlloc(&staging, kChunkBytes * kSlots, cudaHostAllocPortable) != cudaSuccess) {
            (void)cudaGetLastError();  // not pinned: downloads take the driver's path
            return;
        }
        staging_ = static_cast<uint8_t*>(staging);
    }
    ~DownloadRing() {
        for (cudaEvent_t e : landed_)
            if (e && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
        if (staging_ && cudaFreeHost(staging_) != cudaSuccess) (void)cudaGetLastError();
    }
    DownloadRing(const DownloadRing&) = delete;
    DownloadRing& operator=(const DownloadRing&) = delete;

    // Chunk i lands in slot i % kSlots; the host copies it out, then queues chunk i + kSlots into the freed slot.
    void download(cudaStream_t stream, const void* device, void* host, size_t bytes) {
        if (!staging_) {
            STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
            STRATA_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
            return;
        }
        const size_t n = (bytes + kChunkBytes - 1) / kChunkBytes;
        const auto length = [&](size_t i) { return std::min(kChunkBytes, bytes - i * kChunkBytes); };
        const auto slot = [&](size_t i) { return staging_ + (i % kSlots) * kChunkBytes; };
        const auto enqueue = [&](size_t i) {
            STRATA_CUDA_CHECK(cudaMemcpyAsync(slot(i), static_cast<const uint8_t*>(device) + i * kChunkBytes, length(i),
                                              cudaMemcpyDeviceToHost, stream));
            STRATA_CUDA_CHECK(cudaEventRecord(landed_[i % kSlots], stream));
        };
        for (size_t i = 0; i < std::min<size_t>(n, kSlots); ++i) enqueue(i);
        for (size_t i = 0; i < n; ++i) {
            STRATA_CUDA_CHECK(cudaEventSynchronize(landed_[i % kSlots]));
            std::memcpy(static_cast<uint8_t*>(host) + i * kChunkBytes, slot(i), length(i));
            if (i + kSlots < n) enqueue(i + kSlots);
        }
    }

  private:
    static constexpr int kSlots = 4;
    static constexpr size_t kChunkBytes = size_t{256} << 10;  // 128 KB and 1 MB measured level (H200)
    uint8_t* staging_ = nullptr;
    cudaEvent_t landed_[kSlots] = {};
};

float* allocate_pinned_floats(size_t n) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, std::max<size_t>(n, 1) * sizeof(float), cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    std::memset(p, 0, n * sizeof(float));
    return static_cast<float*>(p);
}

void free_pinned_floats(float* p) {
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
}

namespace {

bool is_page_locked(const void* host) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

}  // namespace

void Context::download(const void* device, void* host, size_t bytes) const {
    if (bytes == 0) return stream_->synchronize();
    if (is_page_locked(host)) {
        STRATA_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_->handle()));
        return stream_->synchronize();
    }
    if (!downloads_) {
        STRATA_CUDA_CHECK(cudaSetDevice(info_.index));  // the ring's events belong to this device
        downloads_ = std::make_unique<DownloadRing>();
    }
    downloads_->download(stream_->handle(), device, host, bytes);
}

void Context::copy_to_device(void* device, const void* host, size_t bytes) {
    if (bytes) STRATA_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_->handle()));
}

void Context::copy_on_device(void* dst, const void* src, size_t bytes) {
    if (bytes) STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_->handle()));
}

void Context::zero(void* device, size_t bytes) {
    if (bytes) STRATA_CUDA_CHECK(cudaMemsetAsync(device, 0, bytes, stream_->handle()));
}

BlasHandle& Context::blas() {
    if (!blas_) blas_ = std::make_unique<BlasHandle>(*this);
    return *blas_;
}

void* Context::scratch(size_t bytes) {
    if (scratch_.size() < bytes) {
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        STRATA_CUDA_CHECK(cudaStreamIsCapturing(stream_->handle(), &capturing));
        if (capturing != cudaStreamCaptureStatusNone)
            throw Error("CUDA backend: the scratch buffer (" + std::to_string(scratch_.size()) +
                        " bytes) must grow to " + std::to_string(bytes) +
                        " bytes during a graph capture; reserve it before capturing");
        // The old scratch may still be read by queued kernels.
        stream_->synchronize();
        scratch_ = DeviceBuffer();
        scratch_ = allocate(bytes, "scratch");
    }
    return scratch_.data();
}

// ---- graphs ---------------------------------------------------------------------------------------------------------

Graph::~Graph() {
    clear();
}

void Graph::clear() noexcept {
    if (exec_ && cudaGraphExecDestroy(exec_) != cudaSuccess) (void)cudaGetLastError();
    if (graph_ && cudaGraphDestroy(graph_) != cudaSuccess) (void)cudaGetLastError();
    exec_ = nullptr;
    graph_ = nullptr;
}

void Graph::capture(Context& ctx, const std::function<void()>& enqueue) {
    clear();
    cudaStream_t stream = ctx.stream().handle();
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    STRATA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
        enqueue();
    } catch (...) {
        cudaGraph_t broken = nullptr;
        if (cudaStreamEndCapture(stream, &broken) == cudaSuccess && broken) cudaGraphDestroy(broken);
        (void)cudaGetLastError();
        throw;
    }
    STRATA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    STRATA_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

void Graph::replay(Context& ctx) const {
    STRATA_ASSERT(exec_ != nullptr);
    STRATA_CUDA_CHECK(cudaGraphLaunch(exec_, ctx.stream().handle()));
}

void Context::profiler_start() {
    STRATA_CUDA_CHECK(cudaSetDevice(info().index));
    STRATA_CUDA_CHECK(cudaProfilerStart());
}

void Context::profiler_stop() {
    synchronize();
    STRATA_CUDA_CHECK(cudaProfilerStop());
}

}  // namespace strata::cuda
