// The CUDA backend's public surface: device discovery, a context per device (stream, memory accountant, the quant
// codebooks in device memory), RAII device buffers and the quantized matrix products. This header needs no CUDA
// headers, so plain C++ (tests, the model layer) can include it; the code behind it is in src/backend/cuda/*.cpp/.cu.
// Everything a user can cause (no device, a budget too small, an unsupported type) throws strata::Error with one line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

struct CUstream_st;     // cudaStream_t is CUstream_st*
struct CUgraph_st;      // cudaGraph_t
struct CUgraphExec_st;  // cudaGraphExec_t
struct CUevent_st;      // cudaEvent_t

namespace strata::cuda {

// ---- devices --------------------------------------------------------------------------------------------------------

// CUDA devices this process can use; 0 when there is no driver or no device (never throws).
int device_count();
// Why device_count() is 0, in words with the CUDA error string ("" when a device is there): for skip messages.
std::string no_device_reason();

struct DeviceInfo {
    int index = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;
    // __CUDA_ARCH__ of the kernels the driver loaded: the newest of the build's architectures the device runs (750
    // on an H200 when the build has only compute_75 PTX). Paths whose device code is sm_90-only need it at 900+.
    int kernel_arch = 0;
    // Shared memory one thread block can opt in to: 227 KB on sm_90, 99 KB on sm_86 / 89 / 120, 64 KB on sm_75.
    size_t max_shared_per_block = 0;
    int multiprocessors = 0;
    size_t l2_bytes = 0;
    size_t total_bytes = 0;
    size_t free_bytes_at_start = 0;
};

// ---- memory ---------------------------------------------------------------------------------------------------------

// Counts the device bytes strata holds against a budget (--vram-budget), by label ("weights", "kv cache",
// "scratch"), so the plan can be printed and an allocation over budget fails with a clear message before cudaMalloc
// is asked. Not thread-safe: one accountant per context, used from the thread that drives it.
class MemoryAccountant {
public:
    explicit MemoryAccountant(size_t budget_bytes) : budget_(budget_bytes) {}
    ~MemoryAccountant();
    MemoryAccountant(const MemoryAccountant&) = delete;
    MemoryAccountant& operator=(const MemoryAccountant&) = delete;

    // Books `bytes` under `label`; throws Error (nothing booked) when the budget would be exceeded.
    void reserve(size_t bytes, const std::string& label);
    void release(size_t bytes, const std::string& label);

    size_t budget() const { return budget_; }
    size_t used() const { return used_; }
    size_t peak() const { return peak_; }
    // One line per label in use, then the total against the budget.
    std::string plan() const;

private:
    size_t budget_;
    size_t used_ = 0;
    size_t peak_ = 0;
    std::map<std::string, size_t> by_label_;
};

// Device memory owned by one object: freed (and its bytes returned to the accountant) when it goes. Sizes are rounded
// up to 256 bytes, so kernels may read whole 16-byte granules that overlap the last valid byte. The accountant must
// outlive its buffers.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(MemoryAccountant& accountant, size_t bytes, std::string label);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& other) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return ptr_; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    size_t size() const { return bytes_; }  // as asked for, before rounding

private:
    void reset() noexcept;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
    size_t booked_ = 0;
    MemoryAccountant* accountant_ = nullptr;
    std::string label_;
};

// A non-blocking CUDA stream, destroyed with the object.
class Stream {
public:
    Stream();
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    CUstream_st* handle() const { return stream_; }
    void synchronize() const;

private:
    CUstream_st* stream_ = nullptr;
};

// ---- context --------------------------------------------------------------------------------------------------------

class DownloadRing;  // context.cpp
class BlasHandle;    // blas.h

// n zeroed floats of page-locked host memory (cudaHostAlloc, portable), which Context::download copies into
// directly; null when the system will not pin that much. Freed with free_pinned_floats.
float* allocate_pinned_floats(size_t n);
void free_pinned_floats(float* p);

struct ContextOptions {
    int device = 0;
    // Bytes strata may hold on the device; 0: the memory free when the context starts, less a 5% margin.
    size_t vram_budget = 0;
    // Dense products of kBlasMinTokens tokens or more with quant weights: the weights dequantized to fp16 and
    // multiplied by cuBLAS (false: the backend's own tensor-core GEMM, which decodes them in its tiles).
    bool blas_products = true;
};
// Tokens from which matmul takes cuBLAS (ContextOptions::blas_products): each weight is then dequantized once for at
// least this many products.
constexpr int64_t kBlasMinTokens = 256;

// One device in use: selects it, reads its properties, uploads the quant codebooks, and owns the stream every
// operation of this context runs on plus a grow-only scratch buffer for the matrix products. Methods must be called
// from one thread at a time.
class Context {
public:
    explicit Context(const ContextOptions& options = {});
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    const DeviceInfo& info() const { return info_; }
    bool blas_products() const { return blas_products_; }
    MemoryAccountant& memory() { return *memory_; }
    const Stream& stream() const { return *stream_; }

    DeviceBuffer allocate(size_t bytes, const std::string& label);
    // A new buffer holding a copy of host bytes (synchronous).
    DeviceBuffer upload(const void* host, size_t bytes, const std::string& label);
    // Device bytes to host after all work queued on the stream (synchronous). Straight into page-locked memory
    // (allocate_pinned_floats; the bytes must lie in one allocation); into pageable memory through a ring of
    // page-locked chunks, the host copying one chunk out while the next is on the bus.
    void download(const void* device, void* host, size_t bytes) const;
    // Host bytes into device memory, queued on the stream (the host bytes may be reused as soon as it returns).
    void copy_to_device(void* device, const void* host, size_t bytes);
    // Device bytes copied to other device bytes, queued on the stream (capturable into a graph).
    void copy_on_device(void* dst, const void* src, size_t bytes);
    // Device bytes set to zero, queued on the stream.
    void zero(void* device, size_t bytes);
    void synchronize() const { stream_->synchronize(); }
    // Makes this context's device the calling thread's current one (kernels launch on the current device): the
    // stages of a split, one context a device, take turns on one thread.
    void make_current() const;
    // Bracket work for a profiler started with --profile-from-start off (Nsight Compute); stop waits for the stream.
    void profiler_start();
    void profiler_stop();

    // Device scratch of at least `bytes`, valid until the next call; contents undefined. Counted as "scratch". It
    // only grows, and never while the stream is being captured into a graph (that throws Error: reserve enough
    // before capturing, since a captured graph keeps the address).
    void* scratch(size_t bytes);
    // cuBLAS on this context's stream, made on first use (its workspace is booked as scratch).
    BlasHandle& blas();

private:
    DeviceInfo info_;
    std::unique_ptr<MemoryAccountant> memory_;
    std::unique_ptr<Stream> stream_;
    DeviceBuffer scratch_;
    bool blas_products_ = true;
    std::unique_ptr<BlasHandle> blas_;
    mutable std::unique_ptr<DownloadRing> downloads_;  // made on the first download into pageable memory
};

// A CUDA graph: the work one call queues on a context's stream (and on side streams it joins back with events),
// captured once and then replayed with one launch. Whatever the work reads per replay must sit in device memory that
// the host rewrites between replays (copy_to_device); the launches themselves never change.
class Graph {
public:
    Graph() = default;
    ~Graph();
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    // Runs `enqueue` with the context's stream in capture mode (nothing executes) and instantiates the result.
    // Throws Error when a call inside cannot be captured; the stream is left out of capture mode either way.
    void capture(Context& ctx, const std::function<void()>& enqueue);
    // Queues one replay on the context's stream.
    void replay(Context& ctx) const;
    bool ready() const { return exec_ != nullptr; }
    // Back to no graph (before the buffers it captured go away or move).
    void clear() noexcept;

private:
    CUgraph_st* graph_ = nullptr;
    CUgraphExec_st* exec_ = nullptr;
};

// Times sections of the work queued eagerly on a context's stream with CUDA events (not usable inside a graph
// capture): mark(kind) starts a section of that kind and ends the previous one; finish() ends the last, waits for the
// stream and adds each section's time to its kind.
class StreamProfiler {
public:
    explicit StreamProfiler(std::vector<std::string> kinds);
    ~StreamProfiler();
    StreamProfiler(const StreamProfiler&) = delete;
    StreamProfiler& operator=(const StreamProfiler&) = delete;
    void mark(Context& ctx, int kind);
    void finish(Context& ctx);
    // One line per kind: total ms, µs per token over n_tokens, share of the total.
    std::string report(int64_t n_tokens) const;

private:
    std::vector<std::string> kinds_;
    std::vector<double> ms_;
    std::vector<CUevent_st*> events_;  // a pool, reused
    std::vector<int> marks_;           // the kind of each recorded event, in order
};

// Device-to-device copy bandwidth in GB/s (10^9 bytes), counting each copied byte read once and written once
// (2 * bytes / time) over ten copies of `bytes`: the roofline that decode figures are set against (bytes a token
// reads / this).
double measure_copy_bandwidth(Context& ctx, size_t bytes = size_t{256} << 20);

// ---- matrix products ------------------------------------------------------------------------------------------------

// Tokens per call of the quantized matrix-vector kernels; larger calls use the dequantize-then-GEMM path.
constexpr int64_t kMaxMatvecTokens = 8;

// Whether matmul accepts weights of type t.
bool supports_matmul(DType t);

// y[t, o] = sum_i W[o, i] * x[t, i] for t < n_tokens, as cpu::matmul computes it: W {in, out} in ggml's layout in
// device memory (w.device == Device::Cuda), x and y device pointers to rows of `in` and `out` floats. Quant weights
// take the CPU backend's activation format (Q8_0 for Q8_0 / Q4_0 / IQ4_NL, Q8_K for the other quant types, f32 for
// float weights), quantized on the device bit for bit as the CPU does, so results match cpu::matmul up to float
// summation order. Queued on the context's stream; returns before the work is done. x must be 16-byte aligned. On
// sm_90+ the matvec kernel starts loading weights before the kernel queued ahead of it has finished (programmatic
// dependent launch), so weights must not be written by the work queued just before the call.
struct MatmulArgs {
    const Tensor& w;
    const float* x;
    float* y;
    int64_t n_tokens = 1;
};
void matmul(Context& ctx, const MatmulArgs& args);
// Several products of the same activations (the four GDN projections, q/k/v, a hyper-connection's down and inject):
// each y = w . x exactly as matmul computes it, with x quantized once per activation format instead of once per
// product. Every w takes rows of the same length.
struct MatmulOutput {
    const Tensor* w;
    float* y;
};
// x_q8_0: x already quantized to Q8_0 for one token (a buffer hyper_connection_read filled through mixed_q8_0): the
// products of weights that read Q8_0 activations take it instead of a quantizer launch.
void matmul_shared_input(Context& ctx, const float* x, int64_t n_tokens, std::initializer_list<MatmulOutput> outputs,
                         const void* x_q8_0 = nullptr);
// Whether products of w_type weights read Q8_0 activations (Q8_0, Q4_0, IQ4_NL), and the bytes of n values of them.
bool reads_q8_0_activations(DType w_type);
size_t q8_0_activation_bytes(int64_t n_values);
// The context scratch one matmul of these weights over n_tokens tokens takes (to reserve it before a graph capture).
size_t matmul_scratch_bytes(const Tensor& w, int64_t n_tokens);

// ---- recurrent and elementwise ops of the GDN and attention blocks (gdn.cu, elementwise.cu) -------------------------
//
// Each computes what the CPU reference of the same name in backend/cpu/ops.h computes (the oracle the tests compare
// with), over a window of tokens and all heads or channels in one launch. Pointers are device pointers; the work is
// queued on the context's stream and the call returns before it is done. Bad shapes or pointers throw Error.

// The gated delta rule (cpu::gated_delta_step) over n_tokens consecutive tokens for `heads` value heads at once. Each
// head's [dk][dv] f32 state (key index major, head h at state + h * dk * dv) is read once, kept on chip across the
// window and written back once; every token's output is written. Token t of value head h reads q at
// q + t * q_stride + kh * dk (likewise k), v at v + t * v_stride + h * dv, g and beta at [t * heads + h], and writes
// out + t * out_stride + h * dv, where the key head kh = h / (heads / key_heads), or h % key_heads when
// tiled_value_heads. dk is 16, 32, 64, 128 or 256; dv any positive count; q and k rows 16-byte aligned (pointers and strides
// multiples of 4 floats). Each token is computed the same way wherever a window starts, so a window split over
// several calls gives the same bits as one call. out_f16, when set, gets the same outputs as IEEE half bits
// (round to nearest even) at the same offsets; out or out_f16 may be null, not both.
//
// Two kernels compute it, with the same bits (issue 8, seed 001): Shuffle splits a state column's dk values over
// lanes of one warp that combine their partial sums with shuffles (no barrier per token); Column splits them over
// warps that combine through shared memory (a barrier per token). Each lane runs the same FMA chains in both, and the
// partial sums are combined in the same tree, so the choice changes speed only (and windows may mix them).
enum class GdnRecurrence { Auto, Column, Shuffle };
const char* gdn_recurrence_name(GdnRecurrence recurrence);
// The kernel `recurrence` runs (Auto resolved to the faster on the H200, the shuffle kernel; the others as they are).
GdnRecurrence resolve_gdn_recurrence(GdnRecurrence recurrence);
struct GatedDeltaArgs {
    float* state;
    const float* q;
    const float* k;
    const float* v;
    int64_t q_stride = 0, k_stride = 0, v_stride = 0;
    const float* g;     // log decay per token and head
    const float* beta;  // per token and head
    float* out;
    int64_t out_stride = 0;
    int64_t n_tokens = 0;
    int64_t heads = 0;
    int64_t key_heads = 0;
    bool tiled_value_heads = false;
    int64_t dk = 0;
    int64_t dv = 0;
    uint16_t* out_f16 = nullptr;  // optional: the outputs as half bits, out_stride apart
    GdnRecurrence recurrence = GdnRecurrence::Auto;
};
void gated_delta(Context& ctx, const GatedDeltaArgs& args);

// The causal depthwise conv (cpu::causal_conv_step) over n_tokens tokens: token t reads x + t * x_stride and writes
// out + t * out_stride (out must not overlap x or the history); history holds (kernel - 1) * dilation rows of
// `channels` values, oldest first, and is advanced past the window. w is {kernel, channels} (taps of a channel
// contiguous). Sums in the CPU's order with a fused multiply-add per tap, as the CPU reference runs on x86-64 with
// FMA, so results equal it bit for bit there.
struct ConvWindowArgs {
    const float* x;
    int64_t x_stride = 0;
    const float* w;
    float* history;
    float* out;
    int64_t out_stride = 0;
    int64_t n_tokens = 0;
    int64_t channels = 0;
    int64_t kernel = 0;
    int64_t dilation = 1;
};
void causal_conv(Context& ctx, const ConvWindowArgs& args);

// Norms over n_tokens rows (row t at x + t * row_stride; 0: n_groups * group) of n_groups groups of `group` values,
// written to out in the same layout (out may equal x). rms_norm_grouped: cpu::rms_norm_grouped per row; gamma covers
// n_groups * group values, or with gamma_shared the same `group` values for every group (one head's norm weights),
// or is null (no scale). l2_norm: cpu::l2_norm per group (gamma unused). Sums of squares in double as the CPU does.
struct GroupNormArgs {
    const float* x;
    float* out;
    int64_t n_tokens = 1;
    int64_t row_stride = 0;
    int64_t n_groups = 1;
    int64_t group = 0;
    const float* gamma = nullptr;
    bool gamma_shared = false;
    float eps = 0.0f;
};
void rms_norm_grouped(Context& ctx, const GroupNormArgs& args);
void l2_norm(Context& ctx, const GroupNormArgs& args);

// Elementwise over n floats (cpu::sigmoid_inplace, cpu::silu_mul: g = silu(g) * u), with the device's expf.
void sigmoid_inplace(Context& ctx, float* x, int64_t n);
void silu_mul(Context& ctx, float* g, const float* u, int64_t n);

// ---- end of the recurrent and elementwise ops -----------------------------------------------------------------------

}  // namespace strata::cuda
