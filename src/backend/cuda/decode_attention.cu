// Decode attention over the paged KV cache, split over the cells (flash-decoding): thread block (split, kv head) walks
// its range of cells in tiles of 32 and keeps, for each query head of the kv head's group, a running maximum, a
// running sum of exponentials and an unnormalised output; a second kernel merges the splits by log-sum-exp.
//
// A tile in three steps, each across the whole block:
//   1. scores: warp w takes tile cells w, w + 8, w + 16, w + 24; each lane reads head_dim / 32 consecutive values of
//      the cell's K and V rows (one 16-byte load per row for fp16 at head_dim 256; issued during the previous tile's
//      steps 2 and 3), the K row's dot with every query head of the group is reduced across the warp; the V rows go
//      to shared memory as f32;
//   2. softmax update: one warp per query head, one lane per tile cell (the new maximum, the rescale factor, p);
//   3. outputs: thread (i, part) owns shared position i (one dim, see stored_dim) of query heads part,
//      part + 256 / head_dim, ... in registers and adds sum_c p[g][c] v[c][i] (p read four cells at a time, broadcast
//      across the warp).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/activation_device.cuh"
#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quantize_device.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;
constexpr int kCellsPerWarp = kTile / kWarps;  // 4
constexpr int kMaxAcc = 16;                    // output values per thread: query heads per group <= 16 * 256 / hd
constexpr int64_t kMaxSplits = 4096;

struct SplitParams {
    KvCacheView c;
    PageTable table;
    const int32_t* n_cells;
    const int32_t* cells;
    const int32_t* n_selected;
    int64_t max_cells;
    const float* q;
    int64_t q_stride;
    float scale;
    int n_head;
    int group;
    int n_splits;
    float* part_o;  // [split][head][hd]
    float* part_m;  // [split][head]
    float* part_l;
    // Queries by blockIdx.z (DecodeAttentionArgs::n_queries); with out set (one split) the block writes the final,
    // normalised and gated, heads instead of the split's partial results.
    int64_t q_token_stride, cells_stride;
    float* out;
    int64_t out_token_stride;
    const float* gate;
    int64_t gate_stride, gate_token_stride;
};


// R = hd / 32 consecutive values of one row as raw bytes: fp16 2R bytes, int8 R bytes (at most 16).
template <int R, bool kInt8>
struct Fragment {
    static constexpr int kBytes = kInt8 ? R : 2 * R;
    static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
    uint32_t w[kWords];
};

template <int R, bool kInt8>
__device__ __forceinline__ void load_fragment(const uint8_t* p, Fragment<R, kInt8>& f) {
    constexpr int B = Fragment<R, kInt8>::kBytes;
    if constexpr (B == 16) {
        const uint4 x = *reinterpret_cast<const uint4*>(p);
        f.w[0] = x.x, f.w[1] = x.y, f.w[2] = x.z, f.w[3] = x.w;
    } else if constexpr (B == 8) {
        const uint2 x = *reinterpret_cast<const uint2*>(p);
        f.w[0] = x.x, f.w[1] = x.y;
    } else if constexpr (B == 4) {
        f.w[0] = *reinterpret_cast<const uint32_t*>(p);
    } else if constexpr (B == 2) {
        f.w[0] = *reinterpret_cast<const uint16_t*>(p);
    } else {
        f.w[0] = *p;
    }
}

template <int R, bool kInt8>
__device__ __forceinline__ void decode_fragment(const Fragment<R, kInt8>& f, float scale, float out[R]) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
        if constexpr (kInt8) {
            const int8_t q = static_cast<int8_t>((f.w[j / 4] >> (8 * (j % 4))) & 0xffu);
            out[j] = scale * static_cast<float>(q);
        } else {
            const uint16_t bits = static_cast<uint16_t>((f.w[j / 2] >> (16 * (j % 2))) & 0xffffu);
            out[j] = __half2float(__ushort_as_half(bits));
        }
    }
}

// Lane l holds dims l * R .. l * R + R - 1 of a row (one wide global load), and keeps value j of them at shared
// position j * 32 + l, so a warp's shared reads and writes of one j touch 32 consecutive words (no bank conflicts).
// The dim held at shared position i:
template <int HD>
__device__ __forceinline__ int stored_dim(int i) {
    return (i % 32) * (HD / 32) + i / 32;
}

template <int HD>
constexpr size_t split_shared_floats(int group) {
    return static_cast<size_t>(group) * HD + static_cast<size_t>(kTile) * HD + static_cast<size_t>(group) * kTile +
           3 * static_cast<size_t>(group);
}

template <int HD, bool kInt8>
__global__ void __launch_bounds__(kThreads, 2) attention_split_kernel(const SplitParams p) {
    kernels::enter_dependent_grid();
    constexpr int R = HD / 32;
    constexpr int kParts = kThreads / HD;
    extern __shared__ float4 shared4[];
    float* shared = reinterpret_cast<float*>(shared4);
    const int G = p.group;
    float* q_s = shared;                // G x HD
    float* v_s = q_s + G * HD;          // kTile x HD
    float* p_s = v_s + kTile * HD;      // G x kTile
    float* m_s = p_s + G * kTile;       // G
    float* l_s = m_s + G;               // G
    float* alpha_s = l_s + G;           // G

    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int split = static_cast<int>(blockIdx.x), kvh = static_cast<int>(blockIdx.y);
    const int64_t query = blockIdx.z;
    const int64_t nkv = p.c.shape.n_head_kv;
    const int64_t capacity = p.table.n_logical_pages * kKvPageCells;
    const int32_t cache_len = static_cast<int32_t>(min(static_cast<int64_t>(max(p.n_cells[query], 0)), capacity));
    const int32_t* cells = p.cells ? p.cells + query * p.cells_stride : nullptr;
    const float* q = p.q + query * p.q_token_stride;
    const int32_t n =
        cells ? static_cast<int32_t>(min(static_cast<int64_t>(max(p.n_selected[query], 0)), p.max_cells)) : cache_len;
    const int32_t chunk = (n + p.n_splits - 1) / p.n_splits;
    const int32_t begin = min(n, split * chunk), end = min(n, begin + chunk);

    for (int i = tid; i < G * HD; i += kThreads) {
        const int g = i / HD, d = stored_dim<HD>(i % HD);
        q_s[i] = q[static_cast<int64_t>(kvh * G + g) * p.q_stride + d];
    }
    if (tid < G) m_s[tid] = -INFINITY, l_s[tid] = 0.0f;
    float acc[kMaxAcc];
#pragma unroll
    for (int j = 0; j < kMaxAcc; ++j) acc[j] = 0.0f;
    const int d_own = tid % HD, part = tid / HD;
    __syncthreads();

    const size_t value_bytes = kInt8 ? 1 : 2;
    const uint8_t* k_base = static_cast<const uint8_t*>(p.c.k);
    const uint8_t* v_base = static_cast<const uint8_t*>(p.c.v);
    // This warp's four cells of the tile at t0: the page-table look-ups and all K and V loads issued together.
    Fragment<R, kInt8> kf[kCellsPerWarp], vf[kCellsPerWarp];
    float ks[kCellsPerWarp], vs[kCellsPerWarp];
    bool valid[kCellsPerWarp];
    auto load_tile = [&](int32_t t0) {
#pragma unroll
        for (int r = 0; r < kCellsPerWarp; ++r) {
            const int32_t idx = t0 + warp + kWarps * r;
            int32_t cell = idx < end ? (cells ? cells[idx] : idx) : -1;
            int32_t page = -1;
            if (cell >= 0 && cell < cache_len) page = p.table.pages[cell / kKvPageCells];
            valid[r] = page >= 0 && page < p.c.shape.n_pages;
            ks[r] = vs[r] = 0.0f;
            if (valid[r]) {
                const int64_t row = (static_cast<int64_t>(page) * nkv + kvh) * kKvPageCells + cell % kKvPageCells;
                const size_t offset = (static_cast<size_t>(row) * HD + static_cast<size_t>(lane) * R) * value_bytes;
                load_fragment<R, kInt8>(k_base + offset, kf[r]);
                load_fragment<R, kInt8>(v_base + offset, vf[r]);
                if constexpr (kInt8) {
                    const int64_t s = row * (HD / kKvInt8Group) + lane * R / kKvInt8Group;
                    ks[r] = __half2float(__ushort_as_half(p.c.k_scales[s]));
                    vs[r] = __half2float(__ushort_as_half(p.c.v_scales[s]));
                }
            }
        }
    };
    if (begin < end) load_tile(begin);
    for (int32_t t0 = begin; t0 < end; t0 += kTile) {
        // 1. The tile's values (loaded during the previous tile's steps 2 and 3), then the dot products.
        float kv[kCellsPerWarp][R];
#pragma unroll
        for (int r = 0; r < kCellsPerWarp; ++r) {
            float vv[R];
            if (valid[r]) {
                decode_fragment<R, kInt8>(kf[r], ks[r], kv[r]);
                decode_fragment<R, kInt8>(vf[r], vs[r], vv);
            } else {
#pragma unroll
                for (int j = 0; j < R; ++j) kv[r][j] = vv[j] = 0.0f;
            }
            float* dst = v_s + (warp + kWarps * r) * HD + lane;
#pragma unroll
            for (int j = 0; j < R; ++j) dst[j * 32] = vv[j];
        }
        for (int g = 0; g < G; ++g) {
            const float* qg = q_s + g * HD + lane;
            float qv[R];
#pragma unroll
            for (int j = 0; j < R; ++j) qv[j] = qg[j * 32];
            float dots[kCellsPerWarp];
#pragma unroll
            for (int r = 0; r < kCellsPerWarp; ++r) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < R; ++j) s = fmaf(qv[j], kv[r][j], s);
                dots[r] = s;
            }
#pragma unroll
            for (int off = 16; off > 0; off /= 2)
#pragma unroll
                for (int r = 0; r < kCellsPerWarp; ++r) dots[r] += __shfl_xor_sync(0xffffffffu, dots[r], off);
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < kCellsPerWarp; ++r)
                    p_s[g * kTile + warp + kWarps * r] = valid[r] ? dots[r] * p.scale : -INFINITY;
        }
        __syncthreads();
        // The next tile's loads fly while this one's softmax and outputs are computed.
        if (t0 + kTile < end) load_tile(t0 + kTile);
        // 2. Online softmax per query head.
        for (int g = warp; g < G; g += kWarps) {
            const float s = p_s[g * kTile + lane];
            const float m_old = m_s[g];
            const float m_new = fmaxf(m_old, warp_max(s));
            float alpha = 1.0f, pr = 0.0f;
            if (m_new != -INFINITY) {
                alpha = expf(m_old - m_new);
                pr = expf(s - m_new);
            }
            const float sum = warp_sum(pr);
            p_s[g * kTile + lane] = pr;
            if (lane == 0) {
                alpha_s[g] = alpha;
                m_s[g] = m_new;
                l_s[g] = l_s[g] * alpha + sum;
            }
        }
        __syncthreads();
        // 3. Outputs.
#pragma unroll
        for (int j = 0; j < kMaxAcc; ++j) {
            const int g = part + j * kParts;
            if (g < G) acc[j] *= alpha_s[g];
        }
#pragma unroll 2
        for (int c = 0; c < kTile; c += 4) {
            const float v0 = v_s[c * HD + d_own], v1 = v_s[(c + 1) * HD + d_own];
            const float v2 = v_s[(c + 2) * HD + d_own], v3 = v_s[(c + 3) * HD + d_own];
#pragma unroll
            for (int j = 0; j < kMaxAcc; ++j) {
                const int g = part + j * kParts;
                if (g < G) {
                    const float4 pr = *reinterpret_cast<const float4*>(p_s + g * kTile + c);
                    acc[j] = fmaf(pr.x, v0, fmaf(pr.y, v1, fmaf(pr.z, v2, fmaf(pr.w, v3, acc[j]))));
                }
            }
        }
        __syncthreads();  // v_s and p_s are rewritten by the next tile
    }

    const int64_t head0 = static_cast<int64_t>(kvh) * G;
    if (p.out) {
        // One split: what attention_merge_kernel makes of it (a weight of exactly 1, the sum over l, the gate).
        float* out = p.out + query * p.out_token_stride;
        const float* gate = p.gate ? p.gate + query * p.gate_token_stride : nullptr;
#pragma unroll
        for (int j = 0; j < kMaxAcc; ++j) {
            const int g = part + j * kParts;
            if (g >= G) continue;
            const int64_t h = head0 + g, d = stored_dim<HD>(d_own);
            const float l = l_s[g];
            float r = l > 0.0f ? acc[j] / l : 0.0f;
            if (gate) r *= kernels::sigmoid(gate[h * p.gate_stride + d]);
            out[h * HD + d] = r;
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < kMaxAcc; ++j) {
        const int g = part + j * kParts;
        if (g < G) p.part_o[(static_cast<int64_t>(split) * p.n_head + head0 + g) * HD + stored_dim<HD>(d_own)] = acc[j];
    }
    if (tid < G) {
        p.part_m[static_cast<int64_t>(split) * p.n_head + head0 + tid] = m_s[tid];
        p.part_l[static_cast<int64_t>(split) * p.n_head + head0 + tid] = l_s[tid];
    }
}

// Block (h, 32-dim chunk): the splits of head h merged by log-sum-exp, then the optional sigmoid gate. The splits'
// maxima and weights are computed by the whole block; warp w sums the outputs of splits w, w + 8, ... for its 32 dims
// (coalesced), and the eight partial sums meet in shared memory in a fixed order.
constexpr int kMergeThreads = 256;
constexpr int kMergeDims = 32;
// With q8_0.q (a token's row of the output product's activations) warp 0 also quantizes its 32 values: one Q8_0
// block, as quantize_activations forms it from the stored values.
__global__ void __launch_bounds__(kMergeThreads)
    attention_merge_kernel(const float* part_o, const float* part_m, const float* part_l, int n_splits, int64_t n_head,
                           int64_t hd, const float* gate, int64_t gate_stride, float* out, QuantizedActivations q8_0) {
    kernels::enter_dependent_grid();
    extern __shared__ float w_s[];  // n_splits weights
    __shared__ float red[kMergeThreads / 32];
    __shared__ float o_s[kMergeThreads / 32][kMergeDims];
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int64_t h = blockIdx.x, d = static_cast<int64_t>(blockIdx.y) * kMergeDims + lane;
    float m = -INFINITY;
    for (int s = tid; s < n_splits; s += kMergeThreads) m = fmaxf(m, part_m[s * n_head + h]);
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int w = 1; w < kMergeThreads / 32; ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float l = 0.0f;
    for (int s = tid; s < n_splits; s += kMergeThreads) {
        const float ms = part_m[s * n_head + h];
        const float w = ms == -INFINITY ? 0.0f : expf(ms - m);
        w_s[s] = w;
        l = fmaf(part_l[s * n_head + h], w, l);
    }
    l = warp_sum(l);
    if (lane == 0) red[warp] = l;
    __syncthreads();
    l = 0.0f;
#pragma unroll
    for (int w = 0; w < kMergeThreads / 32; ++w) l += red[w];
    float o = 0.0f;
#pragma unroll 4
    for (int s = warp; s < n_splits; s += kMergeThreads / 32) o = fmaf(part_o[(s * n_head + h) * hd + d], w_s[s], o);
    o_s[warp][lane] = o;
    __syncthreads();
    if (warp == 0) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < kMergeThreads / 32; ++w) total += o_s[w][lane];
        float r = l > 0.0f ? total / l : 0.0f;
        if (gate) r *= kernels::sigmoid(gate[h * gate_stride + d]);
        out[h * hd + d] = r;
        if (q8_0.q)
            (void)kernels::quantize_q8_0_value(r, h * hd + d, const_cast<int8_t*>(q8_0.q), const_cast<float*>(q8_0.d),
                                               const_cast<float*>(q8_0.s16));
    }
}

template <int HD, bool kInt8>
void launch_split(const SplitParams& p, int64_t nkv, int64_t n_queries, cudaStream_t stream) {
    const size_t shared = split_shared_floats<HD>(p.group) * sizeof(float);
    // Raised once per kernel to the largest size asked for (an attribute, not a stream operation: fine during capture).
    static size_t shared_set = 48 * 1024;
    if (shared > shared_set) {
        STRATA_CUDA_CHECK(cudaFuncSetAttribute(attention_split_kernel<HD, kInt8>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        shared_set = shared;
    }
    const dim3 grid(static_cast<unsigned>(p.n_splits), static_cast<unsigned>(nkv), static_cast<unsigned>(n_queries));
    launch_dependent("attention_split_kernel", attention_split_kernel<HD, kInt8>, grid, dim3(kThreads), shared, stream,
                     p);
}

}  // namespace

size_t decode_attention_workspace_bytes(int64_t n_head, int64_t head_dim, int64_t n_splits) {
    return static_cast<size_t>(n_splits) * static_cast<size_t>(n_head) * static_cast<size_t>(head_dim + 2) *
           sizeof(float);
}

int64_t decode_attention_splits(const Context& ctx, int64_t n_head_kv, int64_t max_cells) {
    const int64_t by_cells = std::max<int64_t>(1, (max_cells + kMinCellsPerSplit - 1) / kMinCellsPerSplit);
    const int64_t by_device =
        std::max<int64_t>(1, (2 * static_cast<int64_t>(ctx.info().multiprocessors) + n_head_kv - 1) / n_head_kv);
    return std::min({by_cells, by_device, kMaxSplits});
}

namespace {

// decode_attention; with q8_0.q its merge also writes the token's row of the output product's Q8_0 activations.
void run_decode_attention(Context& ctx, const DecodeAttentionArgs& a, const QuantizedActivations& q8_0) {
    const KvCacheShape& s = a.cache.shape;
    const bool int8 = s.storage == KvStorage::Int8;
    if (!(s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256 || (!int8 && s.head_dim == 32)))
        throw Error("CUDA decode_attention: head_dim " + std::to_string(s.head_dim) + " is not supported");
    if (s.n_head_kv <= 0 || s.n_head_kv > 65535 || a.n_head <= 0 || a.n_head % s.n_head_kv != 0)
        throw Error("CUDA decode_attention: " + std::to_string(a.n_head) + " query heads are no multiple of " +
                    std::to_string(s.n_head_kv) + " kv heads");
    const int64_t group = a.n_head / s.n_head_kv;
    const int64_t max_group = kMaxAcc * (kThreads / s.head_dim);
    if (group > max_group)
        throw Error("CUDA decode_attention: " + std::to_string(group) + " query heads per kv head at head_dim " +
                    std::to_string(s.head_dim) + " (at most " + std::to_string(max_group) + ")");
    if (a.n_splits < 1 || a.n_splits > kMaxSplits)
        throw Error("CUDA decode_attention: n_splits must be in 1.." + std::to_string(kMaxSplits));
    if (!a.cache.k || !a.cache.v || (int8 && (!a.cache.k_scales || !a.cache.v_scales)))
        throw Error("CUDA decode_attention: the cache has no storage");
    if (!a.table.pages || a.table.n_logical_pages <= 0 || !a.n_cells || !a.q || !a.out)
        throw Error("CUDA decode_attention: a null pointer among page table, n_cells, q, out");
    if (a.cells && (!a.n_selected || a.max_cells <= 0))
        throw Error("CUDA decode_attention: a cell list needs n_selected and max_cells");
    const int64_t q_stride = a.q_head_stride ? a.q_head_stride : s.head_dim;
    const int64_t gate_stride = a.gate_head_stride ? a.gate_head_stride : s.head_dim;
    if (q_stride < s.head_dim || gate_stride < s.head_dim)
        throw Error("CUDA decode_attention: head strides shorter than head_dim");
    const bool batched = a.n_queries > 1;
    if (a.n_queries < 1 || a.n_queries > 65535)
        throw Error("CUDA decode_attention: n_queries must be in 1..65535, got " + std::to_string(a.n_queries));
    if (batched && a.n_splits != 1) throw Error("CUDA decode_attention: several queries in one launch take one split");
    if (batched && (a.q_token_stride < a.n_head * q_stride || a.out_token_stride < a.n_head * s.head_dim ||
                    (a.gate && a.gate_token_stride < a.n_head * gate_stride) ||
                    (a.cells && a.cells_stride < a.max_cells)))
        throw Error("CUDA decode_attention: the queries' rows overlap (token strides shorter than a query's heads)");
    if (batched && q8_0.q) throw Error("CUDA decode_attention: Q8_0 outputs are for one query");
    const size_t need = decode_attention_workspace_bytes(a.n_head, s.head_dim, a.n_splits);
    if (!batched && (!a.workspace || a.workspace_bytes < need))
        throw Error("CUDA decode_attention: workspace of " + std::to_string(a.workspace_bytes) + " bytes, " +
                    std::to_string(need) + " needed");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    float* part_o = batched ? nullptr : static_cast<float*>(a.workspace);
    float* part_m = batched ? nullptr : part_o + a.n_splits * a.n_head * s.head_dim;
    float* part_l = batched ? nullptr : part_m + a.n_splits * a.n_head;
    const SplitParams p{.c = a.cache, .table = a.table, .n_cells = a.n_cells, .cells = a.cells,
                        .n_selected = a.n_selected, .max_cells = a.max_cells, .q = a.q, .q_stride = q_stride,
                        .scale = a.scale, .n_head = static_cast<int>(a.n_head), .group = static_cast<int>(group),
                        .n_splits = static_cast<int>(a.n_splits), .part_o = part_o, .part_m = part_m,
                        .part_l = part_l, .q_token_stride = a.q_token_stride, .cells_stride = a.cells_stride,
                        .out = batched ? a.out : nullptr, .out_token_stride = a.out_token_stride, .gate = a.gate,
                        .gate_stride = gate_stride, .gate_token_stride = a.gate_token_stride};
    cudaStream_t stream = ctx.stream().handle();
    const int64_t nkv = s.n_head_kv, nq = a.n_queries;
    switch (s.head_dim) {
        case 32: launch_split<32, false>(p, nkv, nq, stream); break;
        case 64: int8 ? launch_split<64, true>(p, nkv, nq, stream) : launch_split<64, false>(p, nkv, nq, stream); break;
        case 128:
            int8 ? launch_split<128, true>(p, nkv, nq, stream) : launch_split<128, false>(p, nkv, nq, stream);
            break;
        default:
            int8 ? launch_split<256, true>(p, nkv, nq, stream) : launch_split<256, false>(p, nkv, nq, stream);
            break;
    }
    if (batched) return;
    const dim3 merge_grid(static_cast<unsigned>(a.n_head), static_cast<unsigned>(s.head_dim / kMergeDims));
    launch_dependent("attention_merge_kernel", attention_merge_kernel, merge_grid, dim3(kMergeThreads),
                     static_cast<size_t>(a.n_splits) * sizeof(float), stream, part_o, part_m, part_l,
                     static_cast<int>(a.n_splits), a.n_head, s.head_dim, a.gate, gate_stride, a.out, q8_0);
}

}  // namespace

void decode_attention(Context& ctx, const DecodeAttentionArgs& a) {
    run_decode_attention(ctx, a, {});
}

void decode_attention_matmul(Context& ctx, std::span<const DecodeAttentionArgs> per_token, const Tensor& w, float* y) {
    const int64_t T = static_cast<int64_t>(per_token.size());
    if (T == 0) return;
    const DecodeAttentionArgs& first = per_token[0];
    const int64_t width = first.n_head * first.cache.shape.head_dim;
    if (w.ne[0] != width)
        throw Error("CUDA decode_attention_matmul: " + w.name + " takes rows of " + std::to_string(w.ne[0]) +
                    " values, the heads give " + std::to_string(width));
    bool rows_follow = true;  // token t's heads at first.out + t * width, as the product reads them
    for (int64_t t = 0; t < T; ++t)
        rows_follow =
            rows_follow && per_token[static_cast<size_t>(t)].out == first.out + t * width &&
            per_token[static_cast<size_t>(t)].n_head * per_token[static_cast<size_t>(t)].cache.shape.head_dim == width;
    if (!rows_follow) throw Error("CUDA decode_attention_matmul: the tokens' heads are not consecutive rows");
    const bool fused = first.cache.shape.head_dim % kMergeDims == 0 && matvec_reads_q8_0(w, T);
    if (!fused) {
        for (const DecodeAttentionArgs& a : per_token) run_decode_attention(ctx, a, {});
        matmul(ctx, {.w = w, .x = first.out, .y = y, .n_tokens = T});
        return;
    }
    const QuantizedActivations act = matvec_activations(ctx, w, T);
    for (int64_t t = 0; t < T; ++t)
        run_decode_attention(
            ctx, per_token[static_cast<size_t>(t)],
            {.q = act.q + t * width, .d = act.d + t * (width / 32), .s16 = act.s16 + t * (width / 16)});
    matvec_quantized(ctx, w, act, first.out, y, T);
}

}  // namespace strata::cuda
