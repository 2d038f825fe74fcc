// Hyper-connection read and write (model_ops.h). Decode windows take the fused path: one kernel per (token, stream)
// (on sm_90+ and Q8_0 activations, a cluster of blocks per (token, stream)) applies the previous block's pending write,
// forms the grouped RMS norm, quantizes it for the down product and computes the stream's share of the inject product
// (float or Q8_0 weights); then the down matvec, the silu quantized on the way into the up matvec, and the mix kernel
// (5 launches where the plain path takes 8-9). At one token with Q8_0-reading up weights the up matvec's blocks
// quantize the silu themselves and, with four streams, form the mix in their epilogue (matvec_kernels.cuh): 3 launches.
// Asked to (mixed_q8_0), that epilogue also writes mixed as the Q8_0 activations of the block's input products.
// Prompt windows and shapes the fused kernel does not cover take the plain path: the grouped norm (elementwise.cu), the
// products (matmul), and this file's silu and mix kernels.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/hyper_connection_device.cuh"
#include "backend/cuda/internal.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/matvec_kernels.cuh"
#include "backend/cuda/model_ops.h"
#include "backend/cuda/moe_combine_device.cuh"
#include "backend/cuda/quantize_device.cuh"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;

// low[i] = silu(low[i] / hc), as cpu::silu of the quotient.
__global__ void low_rank_silu_kernel(float* low, int64_t n, float hc) {
    kernels::enter_dependent_grid();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) low[i] = kernels::SiluScaledSource{low, hc}(0, n, i);
}

// mixed[t][j] = (sum over streams s in order of sigmoid(g[t][s H + j]) * xn[t][s H + j]) / hc; the first T * hc threads
// also turn inject into 2 * sigmoid(inject / hc). Products and sums rounded step by step (no contraction), as the CPU.
// With inject_partials (the fused read), the raw inject product is first added up from the streams' shares, in
// stream order.
__global__ void mix_kernel(const float* gate, const float* xn, float* mixed, float* inject, int64_t n_tokens,
                           int64_t hc, int64_t H, const float* inject_partials) {
    kernels::enter_dependent_grid();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (inject && i < n_tokens * hc) {
        const float* shares = inject_partials ? inject_partials + (i / hc) * hc * hc : nullptr;
        const float raw = shares ? kernels::hc_inject_from_shares(shares, hc, i % hc) : inject[i];
        inject[i] = kernels::hc_inject_value(raw, hc);
    }
    if (i >= n_tokens * H) return;
    const int64_t t = i / H, j = i % H;
    const float* g = gate + t * hc * H + j;
    const float* x = xn + t * hc * H + j;
    mixed[i] = kernels::hc_mix_value(hc, [&](int64_t s) { return g[s * H]; }, [&](int64_t s) { return x[s * H]; });
}

// residual[t][s][j] += inject[t][s] * block_out[t][j].
__global__ void write_kernel(float* residual, const float* block_out, const float* inject, int64_t n_tokens,
                             int64_t hc, int64_t H) {
    kernels::enter_dependent_grid();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * hc * H) return;
    const int64_t ts = i / H, j = i % H, t = ts / hc;
    residual[i] = __fadd_rn(residual[i], __fmul_rn(inject[ts], block_out[t * H + j]));
}

// ---- the fused read's first kernel --------------------------------------------------------------------------------

// 1,024 threads of 4 values: the kernel runs one block per stream on as many SMs, so its time is one thread's chain of
// instructions; 512 threads of 8 values measured 9.1 us a launch under ncu (1,700 instructions a warp).
constexpr int kPrologueThreads = 1024;
constexpr int kPrologueValues = 4;  // values per thread: streams of up to 4,096 (Flash-Next: 2,560)

struct PrologueParams {
    float* residual;          // [T x HC], updated in place by the pending write
    const float* block_out;   // [T x H] of the previous block, or null (no pending write)
    const float* inject;      // [T x hc]: the previous block's transformed inject (read only with a pending write)
    MoeCombine combine;       // or the pending write as an MoE combine (expert_out null: none)
    const float* gamma;       // [HC]
    float eps;
    int64_t H;
    float* xn;                // [T x HC]
    QuantizedActivations act; // xn quantized for the down product (T rows of HC)
    const uint8_t* inject_w;  // {HC, hc} rows inject_row_bytes apart, or null
    size_t inject_row_bytes;
    float* inject_partials;   // [T x hc (stream) x hc (inject row)]: each stream's share of the inject product
};

// Q8_0 inject weights (blocks of an f16 scale and 32 int8): their product reads xn as quantized for a Q8_0 down
// product, as the CPU's integer dot does (the sums differ only in float order).
struct Q8_0Weights {};

template <typename T>
__device__ __forceinline__ float load_weight(const uint8_t* row, int e) {
    if constexpr (std::is_same_v<T, Q8_0Weights>) {
        const uint8_t* block = row + (e / 32) * 34;
        return __half2float(*reinterpret_cast<const __half*>(block)) *
               static_cast<float>(static_cast<int8_t>(block[2 + e % 32]));
    } else if constexpr (std::is_same_v<T, float>)
        return reinterpret_cast<const float*>(row)[e];
    else if constexpr (std::is_same_v<T, __half>)
        return __half2float(reinterpret_cast<const __half*>(row)[e]);
    else
        return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[e]);
}

// One block per (token, stream): a stream is one norm group and a whole number of activation blocks. Every thread
// holds the values i = k * kPrologueThreads + threadIdx.x of its stream, loaded together; the pending write and the
// sum of squares in double follow (hyper_connection_write's and group_norm_block_kernel's rounding), then each slice
// of kPrologueThreads values is scaled, stored, quantized (kQ8K: 256-value blocks, else 32) and added into this
// stream's share of each inject row, which the mix kernel adds up in stream order. InjectW: the inject weights'
// element type (void: no inject).
template <int kStreams, bool kQ8K, typename InjectW>
__global__ void __launch_bounds__(kPrologueThreads) hc_prologue_kernel(const PrologueParams p) {
    __shared__ double warp_sums[kPrologueThreads / 32];
    __shared__ float inject_sums[kPrologueThreads / 32][kStreams];
    __shared__ kernels::AbsMax best[kPrologueThreads / 32];
    __shared__ float gate_sums[kernels::kCombineGateWarps];
    kernels::enter_dependent_grid();  // the down matvec may start loading its weights
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int64_t t = blockIdx.x, g = blockIdx.y, H = p.H, HC = kStreams * H, first = g * H;
    float* residual = p.residual + t * HC + first;
    const bool combine = p.combine.expert_out != nullptr, pending = combine || p.block_out;
    const float pending_inject = pending ? p.inject[t * kStreams + g] : 0.0f;
    const float shared_gate = combine && p.combine.shared_gate
                                  ? kernels::moe_shared_gate(p.combine.shared_gate, p.combine.x + t * H, H, gate_sums)
                                  : 0.0f;

    // Every load first, in one batch: the stores below could alias them as far as the compiler knows, so loads left
    // in the loops would each wait for the stores before them (one round trip per slice).
    constexpr int kInjectRows = std::is_void_v<InjectW> ? 1 : kStreams;
    float v[kPrologueValues], out[kPrologueValues], gamma[kPrologueValues], wi[kPrologueValues][kInjectRows];
#pragma unroll
    for (int k = 0; k < kPrologueValues; ++k) {
        const int i = k * kPrologueThreads + tid;
        const bool inside = i < H;
        v[k] = inside ? residual[i] : 0.0f;
        out[k] = !inside ? 0.0f
                 : combine
                     ? kernels::moe_add_shared(p.combine, t, i, kernels::moe_routed_sum(p.combine, t, i), shared_gate)
                 : p.block_out ? p.block_out[t * H + i]
                               : 0.0f;
        gamma[k] = inside ? p.gamma[first + i] : 0.0f;
#pragma unroll
        for (int r = 0; r < kInjectRows; ++r) {
            if constexpr (std::is_void_v<InjectW>)
                wi[k][r] = 0.0f;
            else
                wi[k][r] = inside ? load_weight<InjectW>(p.inject_w + r * p.inject_row_bytes,
                                                         static_cast<int>(first) + i)
                                  : 0.0f;
        }
    }
    double sum = 0.0;
#pragma unroll
    for (int k = 0; k < kPrologueValues; ++k) {
        const int i = k * kPrologueThreads + tid;
        if (i >= H) continue;
        if (pending) {
            v[k] = __fadd_rn(v[k], __fmul_rn(pending_inject, out[k]));
            residual[i] = v[k];
        }
        sum += static_cast<double>(v[k]) * v[k];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < kPrologueThreads / 32; ++w) total += warp_sums[w];
    const float scale = static_cast<float>(1.0 / sqrt(total / static_cast<double>(H) + p.eps));

    float inj[kStreams] = {};
    auto* q = const_cast<int8_t*>(p.act.q) + t * HC;
    auto* d = const_cast<float*>(p.act.d) + t * (HC / 32);
    auto* s16 = const_cast<float*>(p.act.s16) + t * (HC / 16);
#pragma unroll
    for (int k = 0; k < kPrologueValues; ++k) {
        const int slice = k * kPrologueThreads;
        if (slice >= H) break;  // block-uniform
        const int i = slice + tid;
        const int64_t e = first + i;
        const bool inside = i < H;
        float x = 0.0f;
        if (inside) {
            x = __fmul_rn(__fmul_rn(v[k], scale), gamma[k]);
            p.xn[t * HC + e] = x;
        }
        float quantized = 0.0f;
        if constexpr (kQ8K) {
            kernels::quantize_q8_k_value(x, e, inside, q, d, s16, best);
        } else if (i - lane < H) {  // whole warps: H is a multiple of 32
            quantized = kernels::quantize_q8_0_value(x, e, q, d, s16);
        }
        if constexpr (!std::is_void_v<InjectW>) {
            const float operand = std::is_same_v<InjectW, Q8_0Weights> ? quantized : x;
            if (inside)
#pragma unroll
                for (int r = 0; r < kStreams; ++r)
                    inj[r] = fmaf(wi[k][r], operand, inj[r]);
        }
    }
    if constexpr (!std::is_void_v<InjectW>) {
#pragma unroll
        for (int r = 0; r < kStreams; ++r) {
            const float x = warp_sum(inj[r]);
            if (lane == 0) inject_sums[warp][r] = x;
        }
        __syncthreads();
        if (tid < kStreams) {
            float share = 0.0f;
            for (int w = 0; w < kPrologueThreads / 32; ++w) share += inject_sums[w][tid];
            p.inject_partials[(t * kStreams + g) * kStreams + tid] = share;
        }
    }
}

// The same first kernel spread over a thread-block cluster per (token, stream) (sm_90+): rank k of C blocks holds
// values k * (H / C) .. of the stream, one a thread; the blocks' sums of squares meet through distributed shared
// memory, and so do their shares of each inject row, which rank 0 adds up in rank order. The one-block kernel runs on
// as many SMs as streams and its time was its instruction issue there: 7.4 -> 5.1 us a launch under ncu, Flash-Next
// decode 164.0 -> 168.8 t/s (H200, session 11). Q8_0 activations only (a Q8_K block of 256 would straddle the blocks
// of small streams).
constexpr int kMaxPrologueCluster = 8;  // the portable cluster size

template <int kStreams, typename InjectW>
__global__ void __launch_bounds__(kPrologueThreads) hc_prologue_cluster_kernel(const PrologueParams p) {
    kernels::enter_dependent_grid();  // the down matvec may start loading its weights
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    __shared__ double warp_sums[kPrologueThreads / 32];
    __shared__ double block_sum;
    __shared__ float warp_inject[kPrologueThreads / 32][kStreams];
    __shared__ float rank_inject[kMaxPrologueCluster][kStreams];  // rank 0's copy: every rank's shares
    const cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank()), ranks = static_cast<int>(cluster.num_blocks());
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int n_warps = static_cast<int>(blockDim.x) / 32;
    const int64_t t = blockIdx.z, g = blockIdx.y, H = p.H, HC = kStreams * H, first = g * H;
    const int i = rank * static_cast<int>(blockDim.x) + tid;  // the value's index in its stream
    const int64_t e = first + i;
    float* residual = p.residual + t * HC + first;

    float v = residual[i];
    const bool combine = p.combine.expert_out != nullptr, pending = combine || p.block_out;
    // The routed experts' part of a pending combine is loaded and summed before the shared gate's barrier.
    float out = combine ? kernels::moe_routed_sum(p.combine, t, i) : p.block_out ? p.block_out[t * H + i] : 0.0f;
    const float gamma = p.gamma[e];
    constexpr int kInjectRows = std::is_void_v<InjectW> ? 1 : kStreams;
    float wi[kInjectRows];
#pragma unroll
    for (int r = 0; r < kInjectRows; ++r) {
        if constexpr (std::is_void_v<InjectW>)
            wi[r] = 0.0f;
        else
            wi[r] = load_weight<InjectW>(p.inject_w + r * p.inject_row_bytes, static_cast<int>(e));
    }
    if (combine) {
        __shared__ float gate_sums[kernels::kCombineGateWarps];
        const float shared_gate =
            p.combine.shared_gate ? kernels::moe_shared_gate(p.combine.shared_gate, p.combine.x + t * H, H, gate_sums)
                                  : 0.0f;
        out = kernels::moe_add_shared(p.combine, t, i, out, shared_gate);
    }
    if (pending) {
        v = __fadd_rn(v, __fmul_rn(p.inject[t * kStreams + g], out));
        residual[i] = v;
    }
    const double sum = warp_sum(static_cast<double>(v) * v);
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        double s = 0.0;
        for (int w = 0; w < n_warps; ++w) s += warp_sums[w];
        block_sum = s;
    }
    cluster.sync();  // every rank's block_sum is written (and every block of the cluster has started)
    double total = 0.0;
    for (int r = 0; r < ranks; ++r) total += *cluster.map_shared_rank(&block_sum, r);
    const float scale = static_cast<float>(1.0 / sqrt(total / static_cast<double>(H) + p.eps));

    const float x = __fmul_rn(__fmul_rn(v, scale), gamma);
    p.xn[t * HC + e] = x;
    const float quantized = kernels::quantize_q8_0_value(x, e, const_cast<int8_t*>(p.act.q) + t * HC,
                                                         const_cast<float*>(p.act.d) + t * (HC / 32),
                                                         const_cast<float*>(p.act.s16) + t * (HC / 16));
    if constexpr (!std::is_void_v<InjectW>) {
        const float operand = std::is_same_v<InjectW, Q8_0Weights> ? quantized : x;
#pragma unroll
        for (int r = 0; r < kStreams; ++r) {
            const float s = warp_sum(fmaf(wi[r], operand, 0.0f));
            if (lane == 0) warp_inject[warp][r] = s;
        }
        __syncthreads();
        if (tid < kStreams) {
            float s = 0.0f;
            for (int w = 0; w < n_warps; ++w) s += warp_inject[w][tid];
            *cluster.map_shared_rank(&rank_inject[rank][tid], 0) = s;
        }
    }
    cluster.sync();  // rank 0 holds every share; no rank reads another's shared memory after this
    if constexpr (!std::is_void_v<InjectW>) {
        if (rank == 0 && tid < kStreams) {
            float share = 0.0f;
            for (int r = 0; r < ranks; ++r) share += rank_inject[r][tid];
            p.inject_partials[(t * kStreams + g) * kStreams + tid] = share;
        }
    }
#endif
}

// The cluster size for a stream of H values, one a thread in whole warps: the largest C <= 8 with H / C a multiple
// of 32 and at most kPrologueThreads; 0 where none of 2..8 fits.
int prologue_cluster_blocks(int64_t H) {
    for (int c = kMaxPrologueCluster; c >= 2; --c)
        if (H % (32 * c) == 0 && H / c <= kPrologueThreads) return c;
    return 0;
}

unsigned blocks_for(int64_t n) {
    return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

// The read's workspace, in order: xn [T x HC], low [T x r] (rounded up to 64 floats), gate [T x HC]; then, for the
// fused path, xn and low quantized (from the next 256-byte boundary) and the inject product's shares per stream
// [T x hc x hc]. `floats` counts from the base, with room for the alignment whatever the base's.
struct ReadWorkspace {
    float *xn, *low, *gate;
    uint8_t *xn_quantized, *low_quantized;
    float* inject_partials;
    int64_t floats;
};

ReadWorkspace read_workspace(float* base, const HyperConnectionDims& s, int64_t T) {
    const int64_t HC = s.n_streams * s.n_embd, R = s.low_rank;
    // Addresses as integers: hyper_connection_workspace_floats asks with no base (0) for the size alone.
    const uintptr_t start = reinterpret_cast<uintptr_t>(base);
    const uintptr_t low = start + static_cast<uintptr_t>(T * HC) * sizeof(float);
    const uintptr_t gate = low + static_cast<uintptr_t>((T * R + 63) / 64 * 64) * sizeof(float);
    const uintptr_t gate_end = gate + static_cast<uintptr_t>(T * HC) * sizeof(float);
    const uintptr_t xn_quantized = (gate_end + 255) / 256 * 256;
    const uintptr_t low_quantized = xn_quantized + quantized_activation_bytes(DType::Q8_0, T * HC).total();
    // quantized_activation_bytes rounds each array up to 256 bytes: the shares start float-aligned.
    const uintptr_t partials = low_quantized + quantized_activation_bytes(DType::Q8_0, T * R).total();
    ReadWorkspace w{};
    w.xn = base;
    w.low = reinterpret_cast<float*>(low);
    w.gate = reinterpret_cast<float*>(gate);
    w.xn_quantized = reinterpret_cast<uint8_t*>(xn_quantized);
    w.low_quantized = reinterpret_cast<uint8_t*>(low_quantized);
    w.inject_partials = reinterpret_cast<float*>(partials);
    // The alignment takes at most 255 bytes whatever the base: counted as 256.
    w.floats = static_cast<int64_t>((gate_end - start) + 256 + (partials - xn_quantized)) / 4 +
               T * s.n_streams * s.n_streams;
    return w;
}

}  // namespace

int64_t hyper_connection_workspace_floats(const HyperConnectionDims& s, int64_t n_tokens) {
    return read_workspace(nullptr, s, n_tokens).floats;
}

namespace {

bool float_type(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

// Whether the fused read covers this window: a decode window, 2 or 4 streams each within the kernel's reach and of
// whole activation blocks of the down product, an up product of whole blocks too, and float or Q8_0 inject weights
// (or none).
bool fused_read_applies(const HyperConnectionReadArgs& a) {
    const HyperConnectionDims& s = a.shape;
    const HyperConnectionDeviceWeights& w = a.weights;
    const int64_t R = s.low_rank;
    auto whole_blocks = [](DType t, int64_t in) {
        return reads_quantized_activations(t) && in % (reads_q8_k_activations(t) ? 256 : 32) == 0;
    };
    // Q8_0 inject weights read xn quantized to Q8_0: only when the down product reads it that way too.
    const bool inject_ok = !a.inject || float_type(w.inject->type) ||
                           (w.inject->type == DType::Q8_0 && !reads_q8_k_activations(w.down->type));
    return a.n_tokens <= kMaxMatvecTokens && (s.n_streams == 2 || s.n_streams == 4) &&
           s.n_embd <= int64_t{kPrologueThreads} * kPrologueValues && whole_blocks(w.down->type, s.n_embd) &&
           whole_blocks(w.up->type, R) && inject_ok;
}

template <int kStreams, bool kQ8K>
void launch_prologue(const PrologueParams& p, DType inject_type, int64_t T, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(kStreams));
    auto launch = [&](auto kernel) {
        launch_dependent("hc_prologue_kernel", kernel, grid, dim3(kPrologueThreads), 0, stream, p);
    };
    if (!p.inject_w)
        launch(hc_prologue_kernel<kStreams, kQ8K, void>);
    else if (inject_type == DType::F32)
        launch(hc_prologue_kernel<kStreams, kQ8K, float>);
    else if (inject_type == DType::Q8_0)
        launch(hc_prologue_kernel<kStreams, kQ8K, Q8_0Weights>);
    else if (inject_type == DType::F16)
        launch(hc_prologue_kernel<kStreams, kQ8K, __half>);
    else
        launch(hc_prologue_kernel<kStreams, kQ8K, __nv_bfloat16>);
}

template <int kStreams>
void launch_prologue_cluster(const PrologueParams& p, DType inject_type, int cluster, int64_t T, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(cluster), static_cast<unsigned>(kStreams), static_cast<unsigned>(T));
    const dim3 block(static_cast<unsigned>(p.H / cluster));
    auto launch = [&](auto kernel) {
        launch_dependent_clusters("hc_prologue_cluster_kernel", static_cast<unsigned>(cluster), kernel, grid, block, 0,
                                  stream, p);
    };
    if (!p.inject_w)
        launch(hc_prologue_cluster_kernel<kStreams, void>);
    else if (inject_type == DType::F32)
        launch(hc_prologue_cluster_kernel<kStreams, float>);
    else if (inject_type == DType::Q8_0)
        launch(hc_prologue_cluster_kernel<kStreams, Q8_0Weights>);
    else if (inject_type == DType::F16)
        launch(hc_prologue_cluster_kernel<kStreams, __half>);
    else
        launch(hc_prologue_cluster_kernel<kStreams, __nv_bfloat16>);
}

// Returns whether a.mixed_q8_0 got mixed's Q8_0 activations.
bool fused_read(Context& ctx, const HyperConnectionReadArgs& a) {
    const HyperConnectionDims& s = a.shape;
    const HyperConnectionDeviceWeights& w = a.weights;
    const int64_t T = a.n_tokens, hc = s.n_streams, H = s.n_embd, HC = hc * H, R = s.low_rank;
    cudaStream_t stream = ctx.stream().handle();
    const ReadWorkspace ws = read_workspace(a.workspace, s, T);
    float *xn = ws.xn, *low = ws.low, *gate = ws.gate, *partials = ws.inject_partials;
    const QuantizedActivations xn_act = quantized_activations_at(ws.xn_quantized, w.down->type, T * HC);
    const QuantizedActivations low_act = quantized_activations_at(ws.low_quantized, w.up->type, T * R);
    const PrologueParams p{.residual = a.residual,
                           .block_out = a.pending_block_out,
                           .inject = a.inject,
                           .combine = a.pending_combine ? *a.pending_combine : MoeCombine{},
                           .gamma = w.norm,
                           .eps = s.eps,
                           .H = H,
                           .xn = xn,
                           .act = xn_act,
                           .inject_w = a.inject ? static_cast<const uint8_t*>(w.inject->data) : nullptr,
                           .inject_row_bytes = a.inject ? w.inject->nb[1] : 0,
                           .inject_partials = partials};
    const bool q8k = reads_q8_k_activations(w.down->type);
    const DType inject_type = a.inject ? w.inject->type : DType::F32;
    const int cluster = q8k || !clusters_supported() ? 0 : prologue_cluster_blocks(H);
    if (cluster > 0 && hc == 2)
        launch_prologue_cluster<2>(p, inject_type, cluster, T, stream);
    else if (cluster > 0)
        launch_prologue_cluster<4>(p, inject_type, cluster, T, stream);
    else if (hc == 2 && q8k)
        launch_prologue<2, true>(p, inject_type, T, stream);
    else if (hc == 2)
        launch_prologue<2, false>(p, inject_type, T, stream);
    else if (q8k)
        launch_prologue<4, true>(p, inject_type, T, stream);
    else
        launch_prologue<4, false>(p, inject_type, T, stream);

    auto matvec = [&](const Tensor& m, const QuantizedActivations& act, const float* x, float* y,
                      const OwnActivations& own = {}, const HcMix& mix = {}) {
        MatvecLaunch l{.type = m.type, .w = static_cast<const uint8_t*>(m.data), .row_bytes = m.nb[1],
                       .rows = m.ne[1], .in = m.ne[0], .n_tokens = static_cast<int>(T), .act = act, .x = x, .y = y,
                       .stream = stream};
        l.own = own;
        l.mix = mix;
        STRATA_ASSERT(launch_matvec_any(l));
    };
    matvec(*w.down, xn_act, xn, low);
    // One token: the up product's blocks quantize silu(low / hc) themselves, and with four streams they also form the
    // mix in their epilogue: two launches fewer on the critical path.
    if (can_form_own_activations(w.up->type, R, T)) {
        const OwnActivations own{.silu_of = low, .divisor = static_cast<float>(hc)};
        if (hc == kHcMixStreams && H % kHcMixColumns == 0) {
            const bool q8_0 = a.mixed_q8_0 && H % 32 == 0 && clusters_supported();  // one token (own activations)
            const HcMix mix{
                .xn = xn,
                .mixed = a.mixed,
                .inject = a.inject,
                .inject_partials = partials,
                .H = H,
                .q8_0 = q8_0 ? quantized_activations_at(a.mixed_q8_0, DType::Q8_0, H) : QuantizedActivations{}};
            matvec(*w.up, {}, nullptr, gate, own, mix);
            return q8_0;
        }
        matvec(*w.up, {}, nullptr, gate, own);
    } else {
        quantize_silu_scaled(w.up->type, low, static_cast<float>(hc), R, T, low_act, stream);
        matvec(*w.up, low_act, nullptr, gate);
    }
    launch_dependent("mix_kernel", mix_kernel, dim3(blocks_for(T * std::max(H, hc))), dim3(kThreads), 0, stream, gate,
                     xn, a.mixed, a.inject, T, hc, H, partials);
    return false;
}

}  // namespace

bool hyper_connection_read(Context& ctx, const HyperConnectionReadArgs& a) {
    const HyperConnectionDims& s = a.shape;
    const HyperConnectionDeviceWeights& w = a.weights;
    const int64_t T = a.n_tokens, hc = s.n_streams, H = s.n_embd, HC = hc * H, R = s.low_rank;
    if (T <= 0) return false;
    if (hc <= 0 || H <= 0 || R <= 0) throw Error("CUDA hyper-connection read: bad shape");
    if (!a.residual || !a.mixed || !a.workspace || !w.norm || !w.down || !w.up)
        throw Error("CUDA hyper-connection read: null residual, output, workspace or weight");
    if (a.inject && !w.inject) throw Error("CUDA hyper-connection read: inject asked for without inject weights");
    if ((a.pending_block_out || a.pending_combine) && !a.inject)
        throw Error("CUDA hyper-connection read: a pending write needs the inject buffer");
    if (a.pending_block_out && a.pending_combine)
        throw Error("CUDA hyper-connection read: two pending writes (a block output and an MoE combine)");
    if (a.pending_combine && (a.pending_combine->H != H || a.pending_combine->n_tokens != T))
        throw Error("CUDA hyper-connection read: the pending MoE combine has another width or token count");
    if (w.down->ne[0] != HC || w.down->ne[1] != R || w.up->ne[0] != R || w.up->ne[1] != HC ||
        (a.inject && (w.inject->ne[0] != HC || w.inject->ne[1] != hc)))
        throw Error("CUDA hyper-connection read: weight shapes do not match the streams, width and rank");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    if (fused_read_applies(a)) return fused_read(ctx, a);

    if (a.pending_combine) {
        moe_combine(ctx, *a.pending_combine);
        hyper_connection_write(ctx, s, a.residual, a.pending_combine->out, a.inject, T);
    } else if (a.pending_block_out) {
        hyper_connection_write(ctx, s, a.residual, a.pending_block_out, a.inject, T);
    }
    cudaStream_t stream = ctx.stream().handle();
    const ReadWorkspace ws = read_workspace(a.workspace, s, T);
    float *xn = ws.xn, *low = ws.low, *gate = ws.gate;

    rms_norm_grouped(ctx, {.x = a.residual, .out = xn, .n_tokens = T, .n_groups = hc, .group = H, .gamma = w.norm,
                           .eps = s.eps});
    if (a.inject)
        matmul_shared_input(ctx, xn, T, {{w.down, low}, {w.inject, a.inject}});  // x quantized once for both
    else
        matmul(ctx, {.w = *w.down, .x = xn, .y = low, .n_tokens = T});
    launch_dependent("low_rank_silu_kernel", low_rank_silu_kernel, dim3(blocks_for(T * R)), dim3(kThreads), 0, stream,
                     low, T * R, static_cast<float>(hc));
    matmul(ctx, {.w = *w.up, .x = low, .y = gate, .n_tokens = T});
    launch_dependent("mix_kernel", mix_kernel, dim3(blocks_for(T * std::max(H, hc))), dim3(kThreads), 0, stream, gate,
                     xn, a.mixed, a.inject, T, hc, H, static_cast<const float*>(nullptr));
    return false;
}

void hyper_connection_write(Context& ctx, const HyperConnectionDims& s, float* residual, const float* block_out,
                            const float* inject, int64_t n_tokens) {
    if (n_tokens <= 0) return;
    if (!residual || !block_out || !inject) throw Error("CUDA hyper-connection write: null pointer");
    if (s.n_streams <= 0 || s.n_embd <= 0) throw Error("CUDA hyper-connection write: bad shape");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const int64_t n = n_tokens * s.n_streams * s.n_embd;
    launch_dependent("write_kernel", write_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, ctx.stream().handle(),
                     residual, block_out, inject, n_tokens, s.n_streams, s.n_embd);
}

}  // namespace strata::cuda
