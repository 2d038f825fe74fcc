// The MoE layer at decode (model_ops.h): router by matmul, softmax and top-k per token in one warp (up to 512
// experts, held in registers) or one thread block, the chosen experts by gathered matrix-vector launches (the matvec
// kernels of matvec_*.cu, each pair reading its expert's slice through the id on the device), SwiGLU, the shared
// expert, and the weighted combine.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/activation_device.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/doorbell_device.cuh"
#include "backend/cuda/doorbell_wait.h"
#include "backend/cuda/model_ops.h"
#include "backend/cuda/moe_combine_device.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda {

namespace {

constexpr int kRouteThreads = 256;

// (probability, expert) with the larger probability first and ties to the lower id: cpu top-k's order.
__device__ __forceinline__ bool route_better(float pa, int ia, float pb, int ib) {
    return pa > pb || (pa == pb && ia < ib);
}

// One block per token: softmax as cpu::softmax, then n_used rounds of a block argmax over the experts not yet chosen.
// Expert i belongs to thread i % kRouteThreads, which keeps whether it was taken in a bit of its own, so a round is
// one warp argmax, one barrier, and every thread combining the warps' winners in the same order (the results of the
// two-barrier, one-thread form it replaced, bit for bit).
__global__ void __launch_bounds__(kRouteThreads)
    route_kernel(const float* logits, int n_expert, int n_used, bool normalize, int32_t* ids, float* weights) {
    extern __shared__ float prob[];  // n_expert probabilities
    __shared__ float red_f[2][kRouteThreads / 32];  // two rounds' winners alternate, so one barrier per round is enough
    __shared__ int red_i[2][kRouteThreads / 32];
    __shared__ double red_d[kRouteThreads / 32];
    kernels::enter_dependent_grid();
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const float* l = logits + static_cast<int64_t>(blockIdx.x) * n_expert;

    float mx = -INFINITY;
    for (int i = tid; i < n_expert; i += kRouteThreads) mx = fmaxf(mx, l[i]);
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red_f[0][warp] = mx;
    __syncthreads();
    mx = red_f[0][0];
    for (int w = 1; w < kRouteThreads / 32; ++w) mx = fmaxf(mx, red_f[0][w]);
    double sum = 0.0;
    for (int i = tid; i < n_expert; i += kRouteThreads) {
        const float e = expf(l[i] - mx);
        prob[i] = e;
        sum += e;
    }
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) red_d[warp] = sum;
    __syncthreads();  // also: every thread has read red_f[0] before round 0 writes it
    sum = 0.0;
    for (int w = 0; w < kRouteThreads / 32; ++w) sum += red_d[w];
    const float inv = static_cast<float>(1.0 / sum);
    for (int i = tid; i < n_expert; i += kRouteThreads) prob[i] *= inv;  // each thread reads only its own experts

    int32_t* my_ids = ids + static_cast<int64_t>(blockIdx.x) * n_used;
    float* my_weights = weights + static_cast<int64_t>(blockIdx.x) * n_used;
    uint32_t taken = 0;  // bit j: expert tid + j * kRouteThreads was chosen
    float chosen_sum = 0.0f;  // thread 0: the chosen weights summed in top-k order, as the CPU sums them
    for (int k = 0; k < n_used; ++k) {
        float best = -INFINITY;
        int best_i = n_expert;
        for (int i = tid, j = 0; i < n_expert; i += kRouteThreads, ++j)
            if (!(taken >> j & 1u) && route_better(prob[i], i, best, best_i)) best = prob[i], best_i = i;
        for (int o = 16; o > 0; o /= 2) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (route_better(ob, oi, best, best_i)) best = ob, best_i = oi;
        }
        const int buf = k & 1;
        if (lane == 0) red_f[buf][warp] = best, red_i[buf][warp] = best_i;
        __syncthreads();
        best = red_f[buf][0], best_i = red_i[buf][0];
        for (int w = 1; w < kRouteThreads / 32; ++w)
            if (route_better(red_f[buf][w], red_i[buf][w], best, best_i)) best = red_f[buf][w], best_i = red_i[buf][w];
        if (best_i % kRouteThreads == tid) taken |= 1u << (best_i / kRouteThreads);
        if (tid == 0) {
            my_ids[k] = best_i;
            my_weights[k] = best;
            chosen_sum += best;
        }
    }
    if (tid == 0 && normalize)
        for (int k = 0; k < n_used; ++k) my_weights[k] = my_weights[k] / chosen_sum;
}

// The most experts route_warp_kernel holds: 16 a lane.
constexpr int kWarpRouteMaxPerLane = 16;

// Routing of one token by one warp, its experts in registers (lane holds experts lane + 32 m, m < kPerLane): softmax
// as route_kernel, then each of n_used rounds is a scan of the lane's untaken experts and two warp reductions (the
// largest probability, then the lowest id among the lanes that have it: probabilities are never negative, so their
// bit patterns order as unsigned integers). No shared memory and no barrier; the ids and weights of route_kernel.
template <int kPerLane>
__global__ void __launch_bounds__(32)
    route_warp_kernel(const float* logits, int n_expert, int n_used, bool normalize, int32_t* ids, float* weights) {
    kernels::enter_dependent_grid();
    const int lane = static_cast<int>(threadIdx.x);
    const float* l = logits + static_cast<int64_t>(blockIdx.x) * n_expert;
    float p[kPerLane];
    uint32_t taken = 0;  // bit m: expert lane + 32 m is taken (or does not exist)
    float mx = -INFINITY;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
        const int i = lane + 32 * m;
        p[m] = i < n_expert ? l[i] : 0.0f;
        if (i < n_expert)
            mx = fmaxf(mx, p[m]);
        else
            taken |= 1u << m;
    }
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
        if (taken >> m & 1u) continue;
        p[m] = expf(p[m] - mx);
        sum += p[m];
    }
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) p[m] *= inv;

    int32_t* my_ids = ids + static_cast<int64_t>(blockIdx.x) * n_used;
    float* my_weights = weights + static_cast<int64_t>(blockIdx.x) * n_used;
    float chosen_sum = 0.0f;  // lane 0: the chosen weights summed in top-k order, as the CPU sums them
    for (int k = 0; k < n_used; ++k) {
        float best = 0.0f;
        int best_m = -1;
#pragma unroll
        for (int m = 0; m < kPerLane; ++m)  // ids grow with m: a strict > keeps the lower id on ties
            if (!(taken >> m & 1u) && (best_m < 0 || p[m] > best)) best = p[m], best_m = m;
        const unsigned top = warp_extreme_u32<true>(best_m >= 0 ? __float_as_uint(best) + 1u : 0u);
        const bool has_top = best_m >= 0 && __float_as_uint(best) + 1u == top;
        const unsigned mine = static_cast<unsigned>(lane + 32 * best_m);
        const unsigned win = warp_extreme_u32<false>(has_top ? mine : 0xffffffffu);
        if (has_top && mine == win) taken |= 1u << best_m;
        if (lane == 0) {
            const float w = __uint_as_float(top - 1u);
            my_ids[k] = static_cast<int32_t>(win);
            my_weights[k] = w;
            chosen_sum += w;
        }
    }
    if (lane == 0 && normalize)
        for (int k = 0; k < n_used; ++k) my_weights[k] = my_weights[k] / chosen_sum;
}

template <int kPerLane>
void launch_route_warp(const float* logits, int64_t T, int n_expert, int n_used, bool normalize, int32_t* ids,
                       float* weights, cudaStream_t stream) {
    launch_dependent("route_warp_kernel", route_warp_kernel<kPerLane>, dim3(static_cast<unsigned>(T)), dim3(32), 0,
                     stream, logits, n_expert, n_used, normalize, ids, weights);
}

// Routing of T tokens: one warp a token when the experts fit its registers (Flash-Next's 512: 5.2 us a launch under
// ncu, against 8.4 for route_kernel, whose every round waits on a block barrier), else one block a token.
void route(const float* logits, int64_t T, int n_expert, int n_used, bool normalize, int32_t* ids, float* weights,
           cudaStream_t stream) {
    const int per_lane = (n_expert + 31) / 32;
    if (per_lane <= 1) return launch_route_warp<1>(logits, T, n_expert, n_used, normalize, ids, weights, stream);
    if (per_lane <= 2) return launch_route_warp<2>(logits, T, n_expert, n_used, normalize, ids, weights, stream);
    if (per_lane <= 4) return launch_route_warp<4>(logits, T, n_expert, n_used, normalize, ids, weights, stream);
    if (per_lane <= 8) return launch_route_warp<8>(logits, T, n_expert, n_used, normalize, ids, weights, stream);
    if (per_lane <= kWarpRouteMaxPerLane)
        return launch_route_warp<kWarpRouteMaxPerLane>(logits, T, n_expert, n_used, normalize, ids, weights, stream);
    const size_t route_shared = static_cast<size_t>(n_expert) * sizeof(float);
    if (route_shared > 48 * 1024)
        STRATA_CUDA_CHECK(cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(route_shared)));
    launch_dependent("route_kernel", route_kernel, dim3(static_cast<unsigned>(T)), dim3(kRouteThreads), route_shared,
                     stream, logits, n_expert, n_used, normalize, ids, weights);
}

constexpr int kCombineThreads = 256;

// Grid (chunks of H, tokens): every block forms its token's shared-expert gate itself (moe_combine_device.cuh).
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const MoeCombine c) {
    kernels::enter_dependent_grid();
    const int64_t t = blockIdx.y;
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x;
    const float routed = j < c.H ? kernels::moe_routed_sum(c, t, j) : 0.0f;
    __shared__ float warp_sums[kernels::kCombineGateWarps];
    const float gate = c.shared_gate ? kernels::moe_shared_gate(c.shared_gate, c.x + t * c.H, c.H, warp_sums) : 0.0f;
    if (j < c.H) c.out[t * c.H + j] = kernels::moe_add_shared(c, t, j, routed, gate);
}

size_t align_bytes(size_t n) {
    return (n + 255) / 256 * 256;
}

const Tensor& gate_tensor(const MoeLayerWeights& w) {
    return w.gate_up ? *w.gate_up : *w.gate;
}

// The host's rows into the pairs that were the host's (down_at null), read with volatile loads: the host wrote them
// after the window started, so no line of them may come from a cache. Nothing when the window gave up.
constexpr int kHostRowThreads = 256;
struct HostRows {
    const int32_t* ids;
    const uint8_t* const* down_at;
    const float* rows;
    float* out;
    int64_t H;
    const uint32_t* gave_up;
};

__global__ void __launch_bounds__(kHostRowThreads) host_rows_kernel(HostRows r) {
    kernels::enter_dependent_grid();
    if (doorbell_window_gave_up(r.gave_up)) return;
    const int64_t pair = blockIdx.x;
    if (r.down_at[r.ids[pair]] != nullptr) return;
    const float* src = r.rows + pair * r.H;
    float* dst = r.out + pair * r.H;
    for (int64_t j = threadIdx.x; j < r.H; j += kHostRowThreads) {
        float v;
        asm volatile("ld.volatile.global.f32 %0, [%1];" : "=f"(v) : "l"(src + j) : "memory");
        dst[j] = v;
    }
}

void check_expert_tensor(const Tensor* t, const char* what, int64_t in, int64_t rows, int64_t n_expert,
                         const uint8_t* const* at) {
    if (!t) throw Error(std::string("CUDA MoE: missing ") + what);
    if (t->device != Device::Cuda && !at)
        throw Error(std::string("CUDA MoE: ") + what + " is in host memory without an address table");
    if (t->ne[0] != in || t->ne[1] != rows || t->ne[2] != n_expert)
        throw Error(std::string("CUDA MoE: ") + what + " has the wrong shape");
    if (!supports_matmul(t->type) || in % traits(t->type).block_size != 0)
        throw Error(std::string("CUDA MoE: ") + what + " of type " + dtype_name(t->type) +
                    " cannot run as a gathered matrix-vector product");
}

}  // namespace

void route_tokens(const float* logits, int64_t T, int n_expert, int n_used, bool normalize, int32_t* ids,
                  float* weights, cudaStream_t stream) {
    route(logits, T, n_expert, n_used, normalize, ids, weights, stream);
}

MoeWorkspace::MoeWorkspace(Context& ctx, const MoeLayerShape& s, const MoeLayerWeights& w) : shape_(s) {
    if (s.n_embd <= 0 || s.n_expert <= 0 || s.n_expert_used <= 0 || s.n_expert_used > s.n_expert || s.n_ff <= 0 ||
        s.n_ff_shared < 0)
        throw Error("CUDA MoE: bad shape (embedding, expert count, experts used or expert width)");
    if (s.n_expert > 32 * kRouteThreads)
        throw Error("CUDA MoE: " + std::to_string(s.n_expert) + " experts; the router takes at most " +
                    std::to_string(32 * kRouteThreads));
    if (!w.down || (!w.gate_up && !w.gate)) throw Error("CUDA MoE: missing expert tensors");
    if (s.n_ff_shared > 0 && (!w.shared_gate_proj || !w.shared_down))
        throw Error("CUDA MoE: the shape has a shared expert but its weights are missing");
    const int64_t T = kMaxMatvecTokens, H = s.n_embd, E = s.n_expert, K = s.n_expert_used, F = s.n_ff,
                  FS = s.n_ff_shared;
    const int64_t pairs = T * K;
    const DType shared_in_type = FS > 0 ? w.shared_gate_proj->type : DType::F32;
    const DType shared_down_type = FS > 0 ? w.shared_down->type : DType::F32;
    const size_t sizes[] = {
        static_cast<size_t>(T * E) * 4,
        static_cast<size_t>(pairs) * 4,
        static_cast<size_t>(pairs) * 4,
        quantized_activation_bytes(gate_tensor(w).type, T * H).total(),
        static_cast<size_t>(pairs * 2 * F) * 4,
        static_cast<size_t>(pairs * F) * 4,
        quantized_activation_bytes(w.down->type, pairs * F).total(),
        static_cast<size_t>(pairs * H) * 4,
        quantized_activation_bytes(shared_in_type, T * H).total(),
        static_cast<size_t>(T * FS) * 4,
        static_cast<size_t>(T * FS) * 4,
        static_cast<size_t>(T * FS) * 4,
        static_cast<size_t>(T * H) * 4,
        quantized_activation_bytes(shared_down_type, T * FS).total(),
    };
    size_t total = 0;
    for (size_t b : sizes) total += align_bytes(b);
    buffer_ = ctx.allocate(total, "scratch");
    auto* base = static_cast<uint8_t*>(buffer_.data());
    void* parts[std::size(sizes)];
    for (size_t i = 0; i < std::size(sizes); ++i) {
        parts[i] = base;
        base += align_bytes(sizes[i]);
    }
    logits_ = static_cast<float*>(parts[0]);
    ids_ = static_cast<int32_t*>(parts[1]);
    weights_ = static_cast<float*>(parts[2]);
    x_act_ = parts[3];
    gate_out_ = static_cast<float*>(parts[4]);
    hidden_ = static_cast<float*>(parts[5]);
    hidden_act_ = parts[6];
    expert_out_ = static_cast<float*>(parts[7]);
    shared_x_act_ = parts[8];
    shared_g_ = static_cast<float*>(parts[9]);
    shared_u_ = static_cast<float*>(parts[10]);
    shared_h_ = static_cast<float*>(parts[11]);
    shared_out_ = static_cast<float*>(parts[12]);
    shared_h_act_ = parts[13];
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&x_ready_, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&shared_done_, cudaEventDisableTiming));
}

MoeWorkspace::~MoeWorkspace() {
    // Errors here come from an earlier fault that a checked call reports anyway.
    if (side_ && cudaStreamSynchronize(side_) != cudaSuccess) (void)cudaGetLastError();
    for (cudaEvent_t e : {fork_, x_ready_, shared_done_})
        if (e && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
    if (side_ && cudaStreamDestroy(side_) != cudaSuccess) (void)cudaGetLastError();
}

void moe_layer(Context& ctx, const MoeLayerArgs& a) {
    const MoeLayerShape& s = a.shape;
    const MoeLayerWeights& w = a.weights;
    MoeWorkspace& ws = a.workspace;
    const int64_t T = a.n_tokens, H = s.n_embd, E = s.n_expert, K = s.n_expert_used, F = s.n_ff, FS = s.n_ff_shared;
    if (T < 1 || T > kMaxMatvecTokens)
        throw Error("CUDA MoE: " + std::to_string(T) + " tokens; the decode path takes 1.." +
                    std::to_string(kMaxMatvecTokens));
    if (ws.shape_.n_embd != H || ws.shape_.n_expert != E || ws.shape_.n_expert_used != K || ws.shape_.n_ff != F ||
        ws.shape_.n_ff_shared != FS)
        throw Error("CUDA MoE: the workspace was made for another shape");
    if (!a.x || !a.out) throw Error("CUDA MoE: null x or out");
    if (!w.router || w.router->device != Device::Cuda || w.router->ne[0] != H || w.router->ne[1] != E)
        throw Error("CUDA MoE: the router must be a device tensor {n_embd, n_expert}");
    const bool tables = w.down_at != nullptr;
    if (tables && (w.gate_up ? !w.gate_up_at : (!w.gate_at || !w.up_at)))
        throw Error("CUDA MoE: expert address tables for down but not for gate and up");
    if (w.gate_up) {
        check_expert_tensor(w.gate_up, "gate_up", H, 2 * F, E, w.gate_up_at);
    } else {
        check_expert_tensor(w.gate, "gate", H, F, E, w.gate_at);
        check_expert_tensor(w.up, "up", H, F, E, w.up_at);
        if (w.up->type != w.gate->type || w.up->nb[1] != w.gate->nb[1] || w.up->nb[2] != w.gate->nb[2])
            throw Error("CUDA MoE: gate and up must share their type and layout");
    }
    check_expert_tensor(w.down, "down", F, H, E, w.down_at);
    if (FS > 0) {
        if (!w.shared_gate || !w.shared_gate_proj || !w.shared_up || !w.shared_down)
            throw Error("CUDA MoE: the shape has a shared expert but its weights are missing");
        const Tensor* shared[] = {w.shared_gate_proj, w.shared_up, w.shared_down};
        for (const Tensor* t : shared)
            if (t->device != Device::Cuda || !supports_matmul(t->type) || t->ne[2] != 1 ||
                t->ne[0] % traits(t->type).block_size != 0)
                throw Error("CUDA MoE: the shared expert's weights must be device matrices of a supported type");
        if (w.shared_gate_proj->ne[0] != H || w.shared_gate_proj->ne[1] != FS || w.shared_up->ne[0] != H ||
            w.shared_up->ne[1] != FS || w.shared_down->ne[0] != FS || w.shared_down->ne[1] != H ||
            w.shared_up->type != w.shared_gate_proj->type)
            throw Error("CUDA MoE: the shared expert's weights have the wrong shapes or differing gate/up types");
    }
    if (E * static_cast<int64_t>(sizeof(float)) * 2 > 96 * 1024) throw Error("CUDA MoE: too many experts for routing");

    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t main = ctx.stream().handle();
    cudaStream_t side = ws.side_;
    STRATA_CUDA_CHECK(cudaEventRecord(ws.fork_, main));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(side, ws.fork_, 0));

    // Side branch: x quantized for the experts, then the whole shared expert.
    const int64_t pairs = T * K;
    const Tensor& gt = gate_tensor(w);
    const QuantizedActivations x_act = quantized_activations_at(ws.x_act_, gt.type, T * H);
    quantize_activations(gt.type, a.x, H, T, x_act, side);
    STRATA_CUDA_CHECK(cudaEventRecord(ws.x_ready_, side));
    auto plain = [&](const Tensor& t, const QuantizedActivations& act, const float* x, float* y) {
        const MatvecLaunch l{.type = t.type, .w = static_cast<const uint8_t*>(t.data), .row_bytes = t.nb[1],
                             .rows = t.ne[1], .in = t.ne[0], .n_tokens = static_cast<int>(T), .act = act, .x = x,
                             .y = y, .stream = side};
        STRATA_ASSERT(launch_matvec_any(l));
    };
    if (FS > 0) {
        const DType st = w.shared_gate_proj->type;
        QuantizedActivations sx = quantized_activations_at(ws.shared_x_act_, st, T * H);
        if (same_activation_format(st, gt.type))
            sx = x_act;  // the experts' quantized x serves the shared expert too
        else
            quantize_activations(st, a.x, H, T, sx, side);
        // Gate and up in one launch (two segments): same type and input.
        const Tensor& sg = *w.shared_gate_proj;
        MatvecLaunch gate_up{.type = st, .w = static_cast<const uint8_t*>(sg.data), .row_bytes = sg.nb[1],
                             .rows = sg.ne[1], .in = H, .n_tokens = static_cast<int>(T), .act = sx, .x = a.x,
                             .y = ws.shared_g_, .stream = side};
        gate_up.more[0] = {.w = static_cast<const uint8_t*>(w.shared_up->data), .row_bytes = w.shared_up->nb[1],
                           .rows = w.shared_up->ne[1], .y = ws.shared_u_};
        gate_up.n_more = 1;
        STRATA_ASSERT(launch_matvec_any(gate_up));
        const DType dt = w.shared_down->type;
        const QuantizedActivations h_act = quantized_activations_at(ws.shared_h_act_, dt, T * FS);
        quantize_swiglu({.w_type = dt, .gate = ws.shared_g_, .up = ws.shared_u_, .stride = FS, .in = FS,
                         .n_rows = T, .hidden = ws.shared_h_, .out = h_act, .stream = side});
        plain(*w.shared_down, h_act, ws.shared_h_, ws.shared_out_);
    }
    STRATA_CUDA_CHECK(cudaEventRecord(ws.shared_done_, side));

    // Main branch: router and routing.
    matmul(ctx, {.w = *w.router, .x = a.x, .y = ws.logits_, .n_tokens = T});
    route(ws.logits_, T, static_cast<int>(E), static_cast<int>(K), s.normalize_weights, ws.ids_, ws.weights_, main);

    const MoeHostShare* share = a.host_share;
    if (share) {
        if (!tables || !share->doorbell || !share->ids || !share->x || !share->rows)
            throw Error("CUDA MoE: a host share needs the expert address tables, a doorbell and its mapped buffers");
        DoorbellPublish publish{.slot = share->slot};
        publish.parts[0] = {.device_source = ws.ids_, .mapped_destination = share->ids,
                            .bytes = static_cast<size_t>(pairs) * sizeof(int32_t)};
        publish.parts[1] = {.device_source = a.x, .mapped_destination = share->x,
                            .bytes = static_cast<size_t>(T * H) * sizeof(float)};
        share->doorbell->enqueue_publish(publish);
    }

    // Gate and up of every (token, slot) pair in one launch (two stacked tensors: the up pairs follow the gate ones).
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(main, ws.x_ready_, 0));
    auto gathered = [&](const Tensor& t, int64_t rows, const QuantizedActivations& act, const float* x, float* y,
                        int64_t n_pairs, int64_t pairs_per_row, int64_t second_from, int64_t second_offset,
                        const uint8_t* const* at, const uint8_t* const* second_at) {
        const MatvecLaunch l{.type = t.type, .w = at ? nullptr : static_cast<const uint8_t*>(t.data),
                             .row_bytes = t.nb[1], .rows = rows, .in = t.ne[0], .n_tokens = 1, .act = act, .x = x,
                             .y = y, .stream = main,
                             .gather = {.ids = ws.ids_, .expert_bytes = t.nb[2], .n_pairs = n_pairs,
                                        .pairs_per_act_row = pairs_per_row, .second_from = second_from,
                                        .second_offset = second_offset, .at = at, .second_at = second_at}};
        STRATA_ASSERT(launch_matvec_any(l));
    };
    const float* up_out;
    int64_t stride;
    if (w.gate_up) {
        gathered(*w.gate_up, 2 * F, x_act, a.x, ws.gate_out_, pairs, K, 0, 0, w.gate_up_at, nullptr);
        up_out = ws.gate_out_ + F;
        stride = 2 * F;
    } else {
        const int64_t offset =
            tables ? 0 : static_cast<const uint8_t*>(w.up->data) - static_cast<const uint8_t*>(w.gate->data);
        gathered(*w.gate, F, x_act, a.x, ws.gate_out_, 2 * pairs, K, pairs, offset, w.gate_at, w.up_at);
        up_out = ws.gate_out_ + pairs * F;
        stride = F;
    }
    const QuantizedActivations h_act = quantized_activations_at(ws.hidden_act_, w.down->type, pairs * F);
    quantize_swiglu({.w_type = w.down->type, .gate = ws.gate_out_, .up = up_out, .stride = stride, .in = F,
                     .n_rows = pairs, .hidden = reads_quantized_activations(w.down->type) ? nullptr : ws.hidden_,
                     .out = h_act, .stream = main});
    gathered(*w.down, H, h_act, ws.hidden_, ws.expert_out_, pairs, 1, 0, 0, w.down_at, nullptr);

    if (share) {
        share->doorbell->enqueue_wait({.slot = share->slot, .layer = share->layer});
        const dim3 grid(static_cast<unsigned>(pairs));
        launch_dependent("host_rows_kernel", host_rows_kernel, grid, dim3(kHostRowThreads), 0, main,
                         HostRows{.ids = ws.ids_, .down_at = w.down_at, .rows = share->rows, .out = ws.expert_out_,
                                  .H = H, .gave_up = share->doorbell->gave_up_word()});
    }

    // Join, then the weighted combine with the shared expert (or left to the caller).
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(main, ws.shared_done_, 0));
    const MoeCombine combine{.expert_out = ws.expert_out_,
                             .weights = ws.weights_,
                             .n_used = static_cast<int>(K),
                             .shared_gate = FS > 0 ? w.shared_gate : nullptr,
                             .x = a.x,
                             .shared = ws.shared_out_,
                             .out = a.out,
                             .H = H,
                             .n_tokens = T};
    if (a.deferred_combine)
        *a.deferred_combine = combine;
    else
        moe_combine(ctx, combine);
}

void moe_combine(Context& ctx, const MoeCombine& c) {
    if (c.n_tokens <= 0) return;
    if (!c.expert_out || !c.weights || !c.out || c.H <= 0 || c.n_used <= 0 || (c.shared_gate && (!c.x || !c.shared)))
        throw Error("CUDA MoE combine: null buffer or bad shape");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const dim3 grid(static_cast<unsigned>((c.H + kCombineThreads - 1) / kCombineThreads),
                    static_cast<unsigned>(c.n_tokens));
    launch_dependent("combine_kernel", combine_kernel, grid, dim3(kCombineThreads), 0, ctx.stream().handle(), c);
}

}  // namespace strata::cuda
