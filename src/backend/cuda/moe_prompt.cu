// The MoE layer for prompt windows (model_ops.h, issue 26): the window's pairs grouped by expert on the device, then
// grouped tensor-core GEMMs (gemm_tensor_core.cuh's gemm_grouped_kernel) for gate/up and down. A pair's sums do not
// depend on where it sits in its tile or on which other pairs share the tile, so the order the counting sort leaves
// within an expert (atomics) does not change a bit of the result.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/activation_device.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"
#include "backend/cuda/model_ops.h"

namespace strata::cuda {

namespace {

constexpr int kGroupThreads = 1024;
constexpr int kGroupExpertsPerThread = 4;
constexpr int kMaxPromptExperts = kGroupThreads * kGroupExpertsPerThread;
constexpr int kTileTokens = kGroupedGemmTokens;  // the smallest tile: the workspace's tile arrays are cut for it

// One block: counts per expert, their prefix sums (where each expert's pairs start in the sorted list) and each
// expert's tiles of up to tile_tokens pairs (expert e's are [expert_tiles[e], expert_tiles[e + 1]); the last entry
// is the count), then every pair to its expert's range.
__global__ void __launch_bounds__(kGroupThreads)
    group_pairs_kernel(const int32_t* ids, int n_pairs, int n_expert, int tile_tokens, int32_t* sorted,
                       int32_t* expert_tiles, int32_t* tile_expert, int32_t* tile_begin, int32_t* tile_count) {
    using Scan = cub::BlockScan<int, kGroupThreads>;
    __shared__ typename Scan::TempStorage scan_storage;
    __shared__ int count[kMaxPromptExperts];
    __shared__ int cursor[kMaxPromptExperts];
    const int tid = static_cast<int>(threadIdx.x);
    for (int e = tid; e < n_expert; e += kGroupThreads) count[e] = 0;
    __syncthreads();
    for (int p = tid; p < n_pairs; p += kGroupThreads) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    int c[kGroupExpertsPerThread], pairs = 0, tiles = 0;
#pragma unroll
    for (int j = 0; j < kGroupExpertsPerThread; ++j) {
        const int e = tid * kGroupExpertsPerThread + j;
        c[j] = e < n_expert ? count[e] : 0;
        pairs += c[j];
        tiles += (c[j] + tile_tokens - 1) / tile_tokens;
    }
    int pair_base = 0, tile_base = 0, total_tiles = 0;
    Scan(scan_storage).ExclusiveSum(pairs, pair_base);
    __syncthreads();  // the scan's storage is used again
    Scan(scan_storage).ExclusiveSum(tiles, tile_base, total_tiles);
#pragma unroll
    for (int j = 0; j < kGroupExpertsPerThread; ++j) {
        const int e = tid * kGroupExpertsPerThread + j;
        if (e >= n_expert) break;
        cursor[e] = pair_base;
        expert_tiles[e] = tile_base;
        for (int i = 0; i * tile_tokens < c[j]; ++i, ++tile_base) {
            tile_expert[tile_base] = e;
            tile_begin[tile_base] = pair_base + i * tile_tokens;
            tile_count[tile_base] = min(tile_tokens, c[j] - i * tile_tokens);
        }
        pair_base += c[j];
    }
    if (tid == 0) expert_tiles[n_expert] = total_tiles;
    __syncthreads();
    for (int p = tid; p < n_pairs; p += kGroupThreads) sorted[atomicAdd(&cursor[ids[p]], 1)] = p;
}

constexpr int kSwiGluThreads = 256;

// h = silu(g) * u, as cpu::silu_mul (the shared expert's f32 hidden rows; its down product quantizes them).
__global__ void __launch_bounds__(kSwiGluThreads) silu_mul_kernel(const float* g, const float* u, float* h, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kSwiGluThreads + threadIdx.x;
    if (i < n) h[i] = kernels::silu(g[i]) * u[i];
}

int64_t max_tiles_of(const MoeLayerShape& s, int64_t max_tokens) {
    const int64_t pairs = max_tokens * s.n_expert_used;
    return (pairs + kTileTokens - 1) / kTileTokens + std::min(s.n_expert, pairs);
}

// The parts of a workspace, in order (their offsets are 256-byte aligned).
std::vector<size_t> part_sizes(const MoeLayerShape& s, int64_t P) {
    const int64_t H = s.n_embd, E = s.n_expert, K = s.n_expert_used, F = s.n_ff, FS = s.n_ff_shared;
    const int64_t pairs = P * K, tiles = max_tiles_of(s, P);
    // Every quantized activation format takes the same bytes (quantized_activation_bytes): Q8_0 stands for them.
    return {
        static_cast<size_t>(P * E) * 4,                                  // logits
        static_cast<size_t>(pairs) * 4,                                  // ids
        static_cast<size_t>(pairs) * 4,                                  // weights
        static_cast<size_t>(pairs) * 4,                                  // sorted pairs
        static_cast<size_t>(E + 1 + 3 * tiles) * 4,                      // expert_tiles, then the tile arrays
        quantized_activation_bytes(DType::Q8_0, P * H).total(),          // x quantized
        static_cast<size_t>(P * H) * 2,                                  // x in fp16
        static_cast<size_t>(P) * 4,                                      // x scale
        // The gate and up sums, then (once SwiGLU has read them) the expert outputs in the same bytes.
        static_cast<size_t>(pairs * std::max(2 * F, H)) * 4,
        quantized_activation_bytes(DType::Q8_0, pairs * F).total(),      // hidden quantized
        static_cast<size_t>(pairs * F) * 2,                              // hidden in fp16
        static_cast<size_t>(pairs) * 4,                                  // hidden scale
        static_cast<size_t>(P * FS) * 4 * 3,                             // shared g, u, h
        static_cast<size_t>(P * H) * 4,                                  // shared out
    };
}

size_t aligned(size_t n) {
    return (n + 255) / 256 * 256;
}

bool grouped_type(const Tensor* t, int64_t in) {
    return t && supports_gemm_tensor_core(t->type) && in % traits(t->type).block_size == 0 && in % 32 == 0;
}

}  // namespace

size_t MoePromptWorkspace::bytes(const MoeLayerShape& shape, int64_t max_tokens) {
    size_t total = 0;
    for (size_t b : part_sizes(shape, max_tokens)) total += aligned(b);
    return total;
}

namespace {

void check_prompt_shape(const MoeLayerShape& s, int64_t max_tokens) {
    if (max_tokens <= kMaxMatvecTokens || s.n_embd <= 0 || s.n_expert <= 0 || s.n_expert_used <= 0 ||
        s.n_expert_used > s.n_expert || s.n_ff <= 0 || s.n_ff_shared < 0)
        throw Error("CUDA MoE prompt workspace: bad shape or window (" + std::to_string(max_tokens) + " tokens)");
}

}  // namespace

MoePromptWorkspace::MoePromptWorkspace(Context& ctx, const MoeLayerShape& s, int64_t max_tokens)
    : shape_(s), max_tokens_(max_tokens), max_tiles_(max_tiles_of(s, max_tokens)) {
    check_prompt_shape(s, max_tokens);
    buffer_ = ctx.allocate(bytes(s, max_tokens), "scratch");
    carve(static_cast<uint8_t*>(buffer_.data()));
}

MoePromptWorkspace::MoePromptWorkspace(const MoeLayerShape& s, int64_t max_tokens, void* memory)
    : shape_(s), max_tokens_(max_tokens), max_tiles_(max_tiles_of(s, max_tokens)) {
    check_prompt_shape(s, max_tokens);
    if (!memory || reinterpret_cast<uintptr_t>(memory) % 256 != 0)
        throw Error("CUDA MoE prompt workspace: the memory lent must be 256-byte aligned");
    carve(static_cast<uint8_t*>(memory));
}

void MoePromptWorkspace::carve(uint8_t* base) {
    const MoeLayerShape& s = shape_;
    const int64_t max_tokens = max_tokens_;
    const std::vector<size_t> sizes = part_sizes(s, max_tokens);
    std::vector<uint8_t*> at;
    for (size_t b : sizes) {
        at.push_back(base);
        base += aligned(b);
    }
    const int64_t FS = s.n_ff_shared, P = max_tokens;
    logits_ = reinterpret_cast<float*>(at[0]);
    ids_ = reinterpret_cast<int32_t*>(at[1]);
    weights_ = reinterpret_cast<float*>(at[2]);
    sorted_pairs_ = reinterpret_cast<int32_t*>(at[3]);
    expert_tiles_ = reinterpret_cast<int32_t*>(at[4]);
    tile_expert_ = expert_tiles_ + s.n_expert + 1;
    tile_begin_ = tile_expert_ + max_tiles_;
    tile_count_ = tile_begin_ + max_tiles_;
    x_act_ = at[5];
    x_half_ = at[6];
    x_scale_ = reinterpret_cast<float*>(at[7]);
    gate_out_ = reinterpret_cast<float*>(at[8]);
    expert_out_ = gate_out_;
    hidden_act_ = at[9];
    hidden_half_ = at[10];
    hidden_scale_ = reinterpret_cast<float*>(at[11]);
    shared_g_ = reinterpret_cast<float*>(at[12]);
    shared_u_ = shared_g_ + P * FS;
    shared_h_ = shared_u_ + P * FS;
    shared_out_ = reinterpret_cast<float*>(at[13]);
}

bool moe_prompt_supported(const MoeLayerShape& s, const MoeLayerWeights& w) {
    if (s.n_expert > kMaxPromptExperts || !w.down) return false;
    const bool gate_ok = w.gate_up ? grouped_type(w.gate_up, s.n_embd)
                                   : grouped_type(w.gate, s.n_embd) && w.up && w.up->type == w.gate->type &&
                                         w.up->nb[1] == w.gate->nb[1] && w.up->nb[2] == w.gate->nb[2];
    return gate_ok && grouped_type(w.down, s.n_ff);
}

void moe_layer_prompt(Context& ctx, const MoePromptArgs& a) {
    const MoeLayerShape& s = a.shape;
    const MoeLayerWeights& w = a.weights;
    MoePromptWorkspace& ws = a.workspace;
    const int64_t T = a.n_tokens, H = s.n_embd, E = s.n_expert, K = s.n_expert_used, F = s.n_ff, FS = s.n_ff_shared;
    if (T < 1 || T > ws.max_tokens_)
        throw Error("CUDA MoE prompt: " + std::to_string(T) + " tokens; the workspace takes 1.." +
                    std::to_string(ws.max_tokens_));
    if (ws.shape_.n_embd != H || ws.shape_.n_expert != E || ws.shape_.n_expert_used != K || ws.shape_.n_ff != F ||
        ws.shape_.n_ff_shared != FS)
        throw Error("CUDA MoE prompt: the workspace was made for another shape");
    if (!moe_prompt_supported(s, w)) throw Error("CUDA MoE prompt: these expert weights take the sliced path");
    if (!a.x || !a.out || !w.router || w.router->ne[0] != H || w.router->ne[1] != E)
        throw Error("CUDA MoE prompt: null x or out, or a router that is not {n_embd, n_expert}");
    const bool tables = w.down_at != nullptr;
    const Tensor& gt = w.gate_up ? *w.gate_up : *w.gate;
    for (const Tensor* t : {&gt, w.down})
        if (!tables && t->device != Device::Cuda)
            throw Error("CUDA MoE prompt: " + t->name + " is in host memory without an address table");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t stream = ctx.stream().handle();
    const int64_t pairs = T * K;

    // Router, routing, and the pairs by expert.
    matmul(ctx, {.w = *w.router, .x = a.x, .y = ws.logits_, .n_tokens = T});
    route_tokens(ws.logits_, T, static_cast<int>(E), static_cast<int>(K), s.normalize_weights, ws.ids_, ws.weights_,
                 stream);
    // Wide tiles once experts average a full narrow tile: half the weight decoding, the same sums (a pair's products
    // do not depend on its tile).
    const int tile_tokens =
        pairs >= kGroupedGemmWideTokens / 2 * E &&
                ctx.info().max_shared_per_block >= gemm_tile_shared_bytes(kGroupedGemmWideTokens)
            ? kGroupedGemmWideTokens
            : kGroupedGemmTokens;
    group_pairs_kernel<<<1, kGroupThreads, 0, stream>>>(ws.ids_, static_cast<int>(pairs), static_cast<int>(E),
                                                        tile_tokens, ws.sorted_pairs_, ws.expert_tiles_, ws.tile_expert_,
                                                        ws.tile_begin_, ws.tile_count_);
    STRATA_CUDA_CHECK_LAUNCH("group_pairs_kernel");
    // One launch over every expert's tiles, or, with experts streamed, one per range of experts between the waits
    // for its bytes and their release.
    MoeExpertStream* streamed = a.stream;
    const int ranges = streamed ? streamed->ranges() : 1;
    if (ranges < 1 || E % ranges != 0)
        throw Error("CUDA MoE prompt: " + std::to_string(E) + " experts do not split into " + std::to_string(ranges) +
                    " streamed ranges");
    const int64_t per_range = E / ranges;
    const int64_t range_tiles = std::min<int64_t>(
        ws.max_tiles_, (T * std::min(K, per_range) + kTileTokens - 1) / kTileTokens + per_range);
    auto run_grouped = [&](GroupedGemmLaunch l, int pass) {
        for (int r = 0; r < ranges; ++r) {
            if (streamed) streamed->ready(pass, r);
            l.tile_first = ws.expert_tiles_ + r * per_range;
            l.tile_end = ws.expert_tiles_ + (r + 1) * per_range;
            l.max_tiles = streamed ? range_tiles : ws.max_tiles_;
            STRATA_ASSERT(launch_grouped_gemm(l));
            if (streamed) streamed->done(pass, r);
        }
    };

    // The shared expert first (GEMMs through matmul: gate and up share x; SwiGLU; down): with experts streamed, it
    // runs while the first ranges' bytes are on the bus.
    if (FS > 0) {
        if (!w.shared_gate || !w.shared_gate_proj || !w.shared_up || !w.shared_down)
            throw Error("CUDA MoE prompt: the shape has a shared expert but its weights are missing");
        matmul_shared_input(ctx, a.x, T, {{w.shared_gate_proj, ws.shared_g_}, {w.shared_up, ws.shared_u_}});
        const int64_t n = T * FS;
        silu_mul_kernel<<<static_cast<unsigned>((n + kSwiGluThreads - 1) / kSwiGluThreads), kSwiGluThreads, 0,
                          stream>>>(ws.shared_g_, ws.shared_u_, ws.shared_h_, n);
        STRATA_CUDA_CHECK_LAUNCH("silu_mul_kernel");
        matmul(ctx, {.w = *w.shared_down, .x = ws.shared_h_, .y = ws.shared_out_, .n_tokens = T});
    }
    // Gate and up: x quantized as the CPU multiplies it, in fp16; one grouped launch for both matrices.
    const QuantizedActivations x_act = quantized_activations_at(ws.x_act_, gt.type, T * H);
    quantize_activations(gt.type, a.x, H, T, x_act, stream);
    auto* x_half = static_cast<__half*>(ws.x_half_);
    activations_to_half(x_act, H, T, x_half, ws.x_scale_, stream);
    const bool fused = w.gate_up != nullptr;
    GroupedGemmLaunch gate_up{.type = gt.type, .n_mats = fused ? 1 : 2, .w = {nullptr, nullptr},
                              .at = {nullptr, nullptr}, .expert_bytes = gt.nb[2], .row_bytes = gt.nb[1],
                              .rows = fused ? 2 * F : F, .in = H, .x = x_half, .x_scale = ws.x_scale_,
                              .x_div = static_cast<int>(K), .tile_first = nullptr, .tile_end = nullptr,
                              .tile_expert = ws.tile_expert_,
                              .tile_begin = ws.tile_begin_, .tile_count = ws.tile_count_,
                              .sorted_pairs = ws.sorted_pairs_, .max_tiles = ws.max_tiles_,
                              .out = {ws.gate_out_, ws.gate_out_ + pairs * F}, .ld_out = fused ? 2 * F : F,
                              .stream = stream, .tile_tokens = tile_tokens};
    if (fused) {
        gate_up.w[0] = static_cast<const uint8_t*>(w.gate_up->data);
        gate_up.at[0] = w.gate_up_at;
    } else {
        gate_up.w[0] = static_cast<const uint8_t*>(w.gate->data);
        gate_up.w[1] = static_cast<const uint8_t*>(w.up->data);
        gate_up.at[0] = w.gate_at;
        gate_up.at[1] = w.up_at;
    }
    if (tables && !(gate_up.at[0] && (fused || gate_up.at[1])))
        throw Error("CUDA MoE prompt: expert address tables for down but not for gate and up");
    run_grouped(gate_up, 0);

    // SwiGLU into the down products' activations, in fp16; one grouped launch for down.
    const float* up_out = fused ? ws.gate_out_ + F : ws.gate_out_ + pairs * F;
    const DType dt = w.down->type;
    const QuantizedActivations h_act = quantized_activations_at(ws.hidden_act_, dt, pairs * F);
    quantize_swiglu({.w_type = dt, .gate = ws.gate_out_, .up = up_out, .stride = fused ? 2 * F : F, .in = F,
                     .n_rows = pairs, .hidden = nullptr, .out = h_act, .stream = stream});
    auto* h_half = static_cast<__half*>(ws.hidden_half_);
    activations_to_half(h_act, F, pairs, h_half, ws.hidden_scale_, stream);
    GroupedGemmLaunch down{.type = dt, .n_mats = 1, .w = {static_cast<const uint8_t*>(w.down->data), nullptr},
                                 .at = {w.down_at, nullptr}, .expert_bytes = w.down->nb[2],
                                 .row_bytes = w.down->nb[1], .rows = H, .in = F, .x = h_half,
                                 .x_scale = ws.hidden_scale_, .x_div = 1, .tile_first = nullptr, .tile_end = nullptr,
                                 .tile_expert = ws.tile_expert_, .tile_begin = ws.tile_begin_,
                                 .tile_count = ws.tile_count_, .sorted_pairs = ws.sorted_pairs_,
                                 .max_tiles = ws.max_tiles_, .out = {ws.expert_out_, nullptr}, .ld_out = H,
                                 .stream = stream, .tile_tokens = tile_tokens};
    run_grouped(down, 1);

    moe_combine(ctx, {.expert_out = ws.expert_out_,
                      .weights = ws.weights_,
                      .n_used = static_cast<int>(K),
                      .shared_gate = FS > 0 ? w.shared_gate : nullptr,
                      .x = a.x,
                      .shared = ws.shared_out_,
                      .out = a.out,
                      .H = H,
                      .n_tokens = T});
}

}  // namespace strata::cuda
