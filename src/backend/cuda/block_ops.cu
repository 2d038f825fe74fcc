// The small per-token ops of the model's blocks (block_ops.h), each doing the CPU code's operations in the CPU's order
// where that order decides the bits: products and sums rounded one by one (__fmul_rn / __fadd_rn, so nvcc never
// contracts them into fused multiply-adds the baseline x86-64 reference does not have), sums of squares in double,
// cpu::dot's eight interleaved partial sums, rope angles in double. What cannot match bit for bit is the device's
// expf / log1pf (within 2 ulp of the host's) and double pow / sincos (within 2 ulp in double, so the float cos and sin
// agree with the host's but for rare rounding ties). Every op is a few launches of fixed shape with no host sync and
// no allocation, so the model can capture them in a CUDA graph.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/block_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn_device.cuh"
#include "backend/cuda/internal.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm_device.cuh"
#include "backend/cuda/quantize_device.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kVStretch = 2048;  // v values per block of gdn_activate

size_t align256(size_t bytes) {
    return (bytes + 255) / 256 * 256;
}

// Blocks of a grid-stride loop over n items (the kernels loop, so the count is capped).
unsigned stride_blocks(int64_t n) {
    return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65536));
}

// Blocks of kWarps warps for one warp per item.
unsigned warp_blocks(int64_t items, const char* op) {
    const int64_t blocks = (items + kWarps - 1) / kWarps;
    if (blocks > 0x7fffffff) throw Error(std::string("CUDA ") + op + ": too many rows in one call");
    return static_cast<unsigned>(blocks);
}

unsigned one_block_each(int64_t items, const char* op) {
    if (items > 0x7fffffff) throw Error(std::string("CUDA ") + op + ": too many rows in one call");
    return static_cast<unsigned>(items);
}

void select_device(Context& ctx) {
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
}

using kernels::sigmoid;
using kernels::silu;


// One NEOX pair (x[i], x[i + n_rot / 2]) of cpu::rope_neox at position pos.
__device__ __forceinline__ void rope_pair(float* x, int64_t i, int64_t n_rot, double pos, float freq_base) {
    const double inv_freq =
        pow(static_cast<double>(freq_base), -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    double sin_angle, cos_angle;
    sincos(pos * inv_freq, &sin_angle, &cos_angle);
    const float c = static_cast<float>(cos_angle), s = static_cast<float>(sin_angle);
    const int64_t half = n_rot / 2;
    const float x0 = x[i], x1 = x[i + half];
    x[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    x[i + half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// ---- embedding rows -------------------------------------------------------------------------------------------------

// Block t copies the bytes of row tokens[t] into staging row t, zeros for a token outside [0, rows). Rows are an even
// number of bytes at even addresses (every type's block is), so 16-bit granules always work; 16-byte ones when aligned.
__global__ void embed_copy_rows_kernel(const uint8_t* table, size_t table_stride, int64_t table_rows, size_t rb,
                                       const int32_t* tokens, uint8_t* staging) {
    kernels::enter_dependent_grid();
    const int64_t token = tokens[blockIdx.x];
    const bool valid = token >= 0 && token < table_rows;
    uint8_t* dst = staging + blockIdx.x * rb;
    const uint8_t* src = table + static_cast<size_t>(valid ? token : 0) * table_stride;
    if (rb % 16 == 0 && table_stride % 16 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(staging) % 16 == 0) {
        for (size_t i = threadIdx.x; i < rb / 16; i += blockDim.x)
            reinterpret_cast<uint4*>(dst)[i] = valid ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
    } else {
        for (size_t i = threadIdx.x; i < rb / 2; i += blockDim.x)
            reinterpret_cast<uint16_t*>(dst)[i] = valid ? reinterpret_cast<const uint16_t*>(src)[i] : uint16_t{0};
    }
}

// out row t * copies + c = f32 row t, for the hc streams' copies.
__global__ void embed_broadcast_kernel(const float* rows, int64_t n_tokens, int64_t copies, int64_t width,
                                       float* out) {
    kernels::enter_dependent_grid();
    const int64_t n = n_tokens * copies * width;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = i / width, e = i % width;
        out[i] = rows[(row / copies) * width + e];
    }
}

// ---- rope -----------------------------------------------------------------------------------------------------------

__global__ void rope_kernel(RopeArgs a) {
    kernels::enter_dependent_grid();
    const int64_t half = a.n_rot / 2, n = a.n_tokens * a.n_heads * half;
    for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < n;
         item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = item % half, th = item / half, h = th % a.n_heads, t = th / a.n_heads;
        rope_pair(a.x + t * a.token_stride + h * a.head_stride, i, a.n_rot, static_cast<double>(a.positions[t]),
                  a.freq_base);
    }
}

// The sets of one norm+rope launch: warps [first_warp[s], first_warp[s + 1]) take set s.
struct NormRopeSets {
    NormRopeArgs set[kMaxNormRopeSets];
    int64_t first_warp[kMaxNormRopeSets + 1];
    int n_sets;
};

// One warp per (set, token, head): the head's RMS norm as rms_norm_grouped computes it (norm_device.cuh), then its
// rope as rope_kernel does, once the warp's writes are visible to all its lanes.
__global__ void __launch_bounds__(kThreads) norm_rope_kernel(const NormRopeSets sets) {
    kernels::enter_dependent_grid();
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (warp >= sets.first_warp[sets.n_sets]) return;  // whole warps leave together
    int s = 0;
    while (warp >= sets.first_warp[s + 1]) ++s;
    const NormRopeArgs& a = sets.set[s];
    const RopeArgs& r = a.rope;
    const int64_t item = warp - sets.first_warp[s];
    const int64_t t = item / r.n_heads, h = item % r.n_heads;
    float* x = r.x + t * r.token_stride + h * r.head_stride;
    const float scale = kernels::rms_scale(kernels::warp_sum_of_squares(x, a.head_dim, lane), a.head_dim, a.eps);
    for (int64_t i = lane; i < a.head_dim; i += 32) {
        const float v = __fmul_rn(x[i], scale);
        x[i] = a.gamma ? __fmul_rn(v, a.gamma[i]) : v;
    }
    __syncwarp();
    const double pos = static_cast<double>(r.positions[t]);
    for (int64_t i = lane; i < r.n_rot / 2; i += 32) rope_pair(x, i, r.n_rot, pos, r.freq_base);
}

// ---- GDN ------------------------------------------------------------------------------------------------------------

// Block (t, y): for y < head_blocks, warp w the q or k head y * kWarps + w (gdn_activate_head); for y >= head_blocks,
// silu over a stretch of the v part. Spread over blocks: one block per token left one SM doing all 10,240 channels of
// a Flash-Next row (24 us under ncu).
__global__ void __launch_bounds__(kThreads) gdn_activate_kernel(GdnActivateArgs a, int64_t head_blocks) {
    kernels::enter_dependent_grid();
    float* row = a.conv + static_cast<int64_t>(blockIdx.x) * a.conv_dim;
    const int64_t qk = 2 * a.key_dim, q_heads = a.key_dim / a.head_dim;
    if (static_cast<int64_t>(blockIdx.y) >= head_blocks) {
        const int64_t stretch = static_cast<int64_t>(blockIdx.y) - head_blocks;
        const int64_t begin = qk + stretch * kVStretch, end = begin + kVStretch < a.conv_dim ? begin + kVStretch : a.conv_dim;
        for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) row[i] = silu(row[i]);
        return;
    }
    const int64_t h = static_cast<int64_t>(blockIdx.y) * kWarps + threadIdx.x / 32;
    if (h >= 2 * q_heads) return;
    kernels::gdn_activate_head(row + h * a.head_dim, a.head_dim, h < q_heads, a.q_scale);
}

__global__ void gdn_gates_kernel(GdnGatesArgs a) {
    kernels::enter_dependent_grid();
    const int64_t n = a.n_tokens * a.n_heads;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        kernels::gdn_gate_item(a, i);
}

// gdn_conv_activate: blocks [0, 2 * q_heads): the q or k head b, whose threads first run the conv of one channel
// each over the window, then (after a barrier: a head's norm reads every channel) warp w takes the tokens w, w + 8,
// ... (gdn_activate_head); the next v_blocks: one v channel a thread, its conv then its silu per token; the last
// block: the gates.
__global__ void __launch_bounds__(kThreads) gdn_conv_activate_kernel(ConvWindowArgs conv, GdnActivateArgs act,
                                                                     GdnGatesArgs gates, int64_t qk_heads,
                                                                     int64_t v_blocks) {
    kernels::enter_dependent_grid();
    const int64_t b = blockIdx.x, q_heads = act.key_dim / act.head_dim;
    if (b < qk_heads) {
        for (int64_t i = threadIdx.x; i < act.head_dim; i += kThreads)
            kernels::causal_conv_channel(conv, b * act.head_dim + i);
        __syncthreads();
        for (int64_t t = threadIdx.x / 32; t < act.n_tokens; t += kWarps)
            kernels::gdn_activate_head(act.conv + t * act.conv_dim + b * act.head_dim, act.head_dim, b < q_heads,
                                       act.q_scale);
        return;
    }
    if (b < qk_heads + v_blocks) {
        const int64_t c = 2 * act.key_dim + (b - qk_heads) * kThreads + threadIdx.x;
        if (c >= act.conv_dim) return;
        kernels::causal_conv_channel(conv, c);
        for (int64_t t = 0; t < act.n_tokens; ++t) {
            float* v = act.conv + t * act.conv_dim + c;
            *v = silu(*v);
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < gates.n_tokens * gates.n_heads; i += kThreads) kernels::gdn_gate_item(gates, i);
}

__global__ void split_beta_alpha_kernel(SplitBetaAlphaArgs a) {
    kernels::enter_dependent_grid();
    const int64_t nv = a.key_heads * a.per_group, n = a.n_tokens * nv;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = i / nv, h = i % nv, g = h / a.per_group, j = h % a.per_group;
        const float* row = a.ba + t * 2 * nv + g * 2 * a.per_group;
        a.beta[i] = row[j];
        a.alpha[i] = row[a.per_group + j];
    }
}

// One warp per (token, head): cpu::rms_norm (x * scale, then * gamma), then * act(z): three roundings, as the CPU.
// With q8_0.q (heads of a multiple of 32 values) each round of the warp's loop is one Q8_0 block, which it quantizes
// as quantize_activations would from the stored values.
__global__ void __launch_bounds__(kThreads) gated_norm_kernel(GatedNormArgs a, QuantizedActivations q8_0) {
    kernels::enter_dependent_grid();
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (item >= a.n_tokens * a.n_heads) return;  // whole warps leave together
    float* x = a.x + item * a.head_dim;
    const float* z = a.z + item * a.head_dim;
    const float scale = kernels::rms_scale(kernels::warp_sum_of_squares(x, a.head_dim, lane), a.head_dim, a.eps);
    for (int64_t i = lane; i < a.head_dim; i += 32) {
        float v = __fmul_rn(x[i], scale);
        if (a.gamma) v = __fmul_rn(v, a.gamma[i]);
        v = __fmul_rn(v, a.sigmoid_gate ? sigmoid(z[i]) : silu(z[i]));
        x[i] = v;
        if (q8_0.q)
            (void)kernels::quantize_q8_0_value(v, item * a.head_dim + i, const_cast<int8_t*>(q8_0.q),
                                               const_cast<float*>(q8_0.d), const_cast<float*>(q8_0.s16));
    }
}

// ---- rows at positions and the QSA indexer --------------------------------------------------------------------------

__global__ void store_rows_kernel(StoreRowsArgs a, int64_t src_stride) {
    kernels::enter_dependent_grid();
    const int64_t t = blockIdx.x, p = a.positions[t];
    if (p < 0 || p >= a.dst_rows) return;
    const float* src = a.src + t * src_stride;
    float* dst = a.dst + p * a.width;
    for (int64_t i = threadIdx.x; i < a.width; i += blockDim.x) dst[i] = src[i];
}

// Block b of the pooled keys by one warp: the mean of its raw rows (row(q) gives raw row q; summed in order in float,
// divided by ratio), cpu::rms_norm with k_norm, then cpu::rope_neox at the block's first position. The rope pairs
// values other lanes wrote, hence the __syncwarp (which also orders the memory accesses of the warp).
template <typename RowOf>
__device__ __forceinline__ void pool_block(const IndexerPoolArgs& a, int64_t b, int lane, RowOf row) {
    const int64_t di = a.head_dim;
    float* pooled = a.pooled + b * di;
    double sum = 0.0;
    for (int64_t d = lane; d < di; d += 32) {
        float s = 0.0f;
        for (int64_t r = 0; r < a.ratio; ++r) s = __fadd_rn(s, row(b * a.ratio + r)[d]);
        const float v = s / static_cast<float>(a.ratio);
        pooled[d] = v;
        sum += static_cast<double>(v) * v;
    }
    sum = warp_sum(sum);
    const float scale = kernels::rms_scale(sum, di, a.eps);
    for (int64_t d = lane; d < di; d += 32) {
        const float v = __fmul_rn(pooled[d], scale);
        pooled[d] = a.k_norm ? __fmul_rn(v, a.k_norm[d]) : v;
    }
    __syncwarp();
    for (int64_t i = lane; i < a.n_rot / 2; i += 32)
        rope_pair(pooled, i, a.n_rot, static_cast<double>(b * a.ratio), a.freq_base);
}

// The block a position completes, or -1.
__device__ __forceinline__ int64_t completed_block(const IndexerPoolArgs& a, int64_t p) {
    if (p < 0 || (p + 1) % a.ratio != 0) return -1;
    const int64_t b = (p + 1) / a.ratio - 1;
    return b < a.max_blocks ? b : -1;
}

// One warp per token that completes a block.
__global__ void __launch_bounds__(kThreads) indexer_pool_kernel(IndexerPoolArgs a) {
    kernels::enter_dependent_grid();
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (t >= a.n_tokens) return;
    const int64_t b = completed_block(a, a.positions[t]);
    if (b >= 0) pool_block(a, b, lane, [&](int64_t q) { return a.raw + q * a.head_dim; });
}

// One warp per token: its row stored at its position (store_rows), then the block it completes pooled as
// indexer_pool_kernel does, reading the rows this launch stores from the window's own src (another warp may not have
// stored them yet; they are the same values).
__global__ void __launch_bounds__(kThreads)
    indexer_store_pool_kernel(StoreRowsArgs s, int64_t src_stride, IndexerPoolArgs a) {
    kernels::enter_dependent_grid();
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (t >= s.n_tokens) return;
    const int64_t p = s.positions[t];
    if (p >= 0 && p < s.dst_rows)
        for (int64_t i = lane; i < s.width; i += 32) s.dst[p * s.width + i] = s.src[t * src_stride + i];
    const int64_t b = completed_block(a, p);
    if (b < 0) return;
    const int64_t first = s.positions[0];
    pool_block(a, b, lane, [&](int64_t q) {
        // The window's token at position q, if any: at q - first when the positions run on, else found by a search.
        const int64_t guess = q - first;
        if (guess >= 0 && guess < s.n_tokens && s.positions[guess] == q) return s.src + guess * src_stride;
        for (int64_t u = 0; u < s.n_tokens; ++u)
            if (s.positions[u] == q) return s.src + u * src_stride;
        return a.raw + q * a.head_dim;
    });
}

// ---- PLE ------------------------------------------------------------------------------------------------------------

constexpr int kPleThreads = 128;

// Block (t, s): threads 0..7 each sum one of cpu::dot's eight interleaved partial sums (element i goes to sum i % 8,
// the tail included, in increasing i), thread 0 combines them in cpu::dot's order and forms the gate, then the block
// writes the gated row.
__global__ void __launch_bounds__(kPleThreads) ple_gate_kernel(PleGateArgs a, float inv_sqrt_h) {
    kernels::enter_dependent_grid();
    __shared__ float partial[8];
    __shared__ float gate;
    const int64_t ts = blockIdx.x, t = ts / a.n_streams, H = a.n_embd;
    const float* k = a.key + ts * H;
    const float* q = a.query + ts * H;
    if (threadIdx.x < 8) {
        float acc = 0.0f;
        for (int64_t i = threadIdx.x; i < H; i += 8) acc = __fadd_rn(acc, __fmul_rn(k[i], q[i]));
        partial[threadIdx.x] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const float* c = partial;
        const float dot = __fadd_rn(__fadd_rn(__fadd_rn(c[0], c[4]), __fadd_rn(c[1], c[5])),
                                    __fadd_rn(__fadd_rn(c[2], c[6]), __fadd_rn(c[3], c[7])));
        float g = __fmul_rn(dot, inv_sqrt_h);
        const float magnitude = fabsf(g) < 1e-6f ? 1e-6f : fabsf(g);  // std::max(|g|, 1e-6f), NaN kept
        g = __fmul_rn(__fsqrt_rn(magnitude), g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f));
        gate = sigmoid(g);
    }
    __syncthreads();
    const float* value = a.value + t * H;
    float* out = a.gated + ts * H;
    for (int64_t j = threadIdx.x; j < H; j += blockDim.x) out[j] = __fmul_rn(gate, value[j]);
}

__global__ void ple_residual_kernel(float* residual, const float* gated, const float* conv, int64_t n) {
    kernels::enter_dependent_grid();
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        residual[i] = __fadd_rn(residual[i], __fadd_rn(gated[i], silu(conv[i])));
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    kernels::enter_dependent_grid();
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        x[i] = __fadd_rn(x[i], y[i]);
}

}  // namespace

// ---- embedding rows -------------------------------------------------------------------------------------------------

// Staging: the raw rows (256-byte aligned), then their f32 conversion (used when copies > 1).
size_t embed_staging_bytes(const Tensor& table, int64_t n_tokens) {
    if (n_tokens <= 0) return 0;
    const size_t n = static_cast<size_t>(n_tokens);
    return align256(n * row_bytes(table.type, table.ne[0])) + n * static_cast<size_t>(table.ne[0]) * sizeof(float);
}

void embed_rows(Context& ctx, const EmbedArgs& a) {
    if (a.n_tokens < 0 || a.copies < 1) throw Error("CUDA embed_rows: negative token count or copies < 1");
    if (!a.table) throw Error("CUDA embed_rows: null table");
    const Tensor& table = *a.table;
    if (table.device != Device::Cuda)
        throw Error("CUDA embed_rows: table " + table.name + " is in host memory; upload it to the device first");
    if (!supports_matmul(table.type))
        throw Error(std::string("CUDA embed_rows: table type ") + dtype_name(table.type) + " is not supported");
    if (table.ne[2] != 1 || table.ne[3] != 1 || table.ne[0] <= 0 || table.ne[1] <= 0 || !table.data)
        throw Error("CUDA embed_rows: table " + table.name + " must be a 2-D {width, rows} tensor with data");
    const int64_t width = table.ne[0];
    const size_t rb = row_bytes(table.type, width);
    if (table.nb[1] < rb || table.nb[1] % 2 != 0 || rb % 2 != 0)
        throw Error("CUDA embed_rows: table " + table.name + " has rows of an unexpected stride");
    if (a.n_tokens == 0) return;
    if (!a.tokens || !a.out || !a.staging) throw Error("CUDA embed_rows: null tokens, out or staging");
    const unsigned blocks = one_block_each(a.n_tokens, "embed_rows");
    select_device(ctx);
    cudaStream_t stream = ctx.stream().handle();
    auto* raw = static_cast<uint8_t*>(a.staging);
    launch_dependent("embed_copy_rows_kernel", embed_copy_rows_kernel, dim3(blocks), dim3(128), 0, stream,
                     static_cast<const uint8_t*>(table.data), table.nb[1], table.ne[1], rb, a.tokens, raw);
    // One copy: straight into out. More: into staging's f32 rows, then copied out copies times.
    float* rows = a.copies == 1 ? a.out
                                : reinterpret_cast<float*>(raw + align256(static_cast<size_t>(a.n_tokens) * rb));
    const DequantizeLaunch l{.type = table.type, .w = raw, .row_bytes = rb, .rows = a.n_tokens, .in = width,
                             .out = rows, .stream = stream};
    STRATA_ASSERT(launch_dequantize_any(l));
    if (a.copies > 1) {
        launch_dependent("embed_broadcast_kernel", embed_broadcast_kernel,
                         dim3(stride_blocks(a.n_tokens * a.copies * width)), dim3(kThreads), 0, stream, rows,
                         a.n_tokens, a.copies, width, a.out);
    }
}

// ---- rope -----------------------------------------------------------------------------------------------------------

void rope_neox(Context& ctx, const RopeArgs& a) {
    if (a.n_tokens < 0 || a.n_heads < 0) throw Error("CUDA rope_neox: negative token or head count");
    if (a.n_rot < 0 || a.n_rot % 2 != 0)
        throw Error("CUDA rope_neox: n_rot " + std::to_string(a.n_rot) + " must be even and not negative");
    if (a.n_tokens == 0 || a.n_heads == 0 || a.n_rot == 0) return;
    if (!a.x || !a.positions) throw Error("CUDA rope_neox: null x or positions");
    if ((a.n_heads > 1 && a.head_stride < a.n_rot) || (a.n_tokens > 1 && a.token_stride < a.n_rot))
        throw Error("CUDA rope_neox: head or token stride shorter than n_rot " + std::to_string(a.n_rot));
    select_device(ctx);
    launch_dependent("rope_kernel", rope_kernel, dim3(stride_blocks(a.n_tokens * a.n_heads * (a.n_rot / 2))),
                     dim3(kThreads), 0, ctx.stream().handle(), a);
}

void rms_norm_rope(Context& ctx, const NormRopeArgs& a) {
    rms_norm_rope(ctx, std::span<const NormRopeArgs>(&a, 1));
}

void rms_norm_rope(Context& ctx, std::span<const NormRopeArgs> sets) {
    if (sets.size() > static_cast<size_t>(kMaxNormRopeSets))
        throw Error("CUDA rms_norm_rope: " + std::to_string(sets.size()) + " sets in one launch; at most " +
                    std::to_string(kMaxNormRopeSets));
    NormRopeSets p{};
    int64_t warps = 0;
    for (const NormRopeArgs& a : sets) {
        const RopeArgs& r = a.rope;
        if (r.n_tokens < 0 || r.n_heads < 0 || a.head_dim < 0)
            throw Error("CUDA rms_norm_rope: negative token, head or head_dim count");
        if (r.n_rot < 0 || r.n_rot % 2 != 0 || r.n_rot > a.head_dim)
            throw Error("CUDA rms_norm_rope: n_rot " + std::to_string(r.n_rot) +
                        " must be even, not negative and at most head_dim " + std::to_string(a.head_dim));
        if (r.n_tokens == 0 || r.n_heads == 0 || a.head_dim == 0) continue;  // nothing to do for this set
        if (!r.x || !r.positions) throw Error("CUDA rms_norm_rope: null x or positions");
        if ((r.n_heads > 1 && r.head_stride < a.head_dim) ||
            (r.n_tokens > 1 && r.token_stride < r.n_heads * a.head_dim))
            throw Error("CUDA rms_norm_rope: head or token stride shorter than the heads");
        p.set[p.n_sets] = a;
        p.first_warp[p.n_sets] = warps;
        warps += r.n_tokens * r.n_heads;
        ++p.n_sets;
    }
    if (p.n_sets == 0) return;
    p.first_warp[p.n_sets] = warps;
    const unsigned blocks = warp_blocks(warps, "rms_norm_rope");
    select_device(ctx);
    launch_dependent("norm_rope_kernel", norm_rope_kernel, dim3(blocks), dim3(kThreads), 0, ctx.stream().handle(), p);
}

// ---- GDN ------------------------------------------------------------------------------------------------------------

namespace {

// gdn_activate's checks: throws Error on a bad shape; false when there is nothing to do.
bool check_activate(const GdnActivateArgs& a) {
    if (a.n_tokens < 0) throw Error("CUDA gdn_activate: negative token count");
    if (a.head_dim <= 0 || a.key_dim < 0 || a.key_dim % a.head_dim != 0 || 2 * a.key_dim > a.conv_dim)
        throw Error("CUDA gdn_activate: bad shape (conv_dim " + std::to_string(a.conv_dim) + ", key_dim " +
                    std::to_string(a.key_dim) + ", head_dim " + std::to_string(a.head_dim) +
                    "): key_dim must be a multiple of head_dim and 2 * key_dim at most conv_dim");
    if (a.n_tokens == 0 || a.conv_dim == 0) return false;
    if (!a.conv) throw Error("CUDA gdn_activate: null conv rows");
    return true;
}

bool check_gates(const GdnGatesArgs& a) {
    if (a.n_tokens < 0 || a.n_heads < 0) throw Error("CUDA gdn_gates: negative token or head count");
    if (a.n_tokens == 0 || a.n_heads == 0) return false;
    if (!a.beta || !a.alpha || !a.a || !a.dt_bias) throw Error("CUDA gdn_gates: null pointer");
    return true;
}

}  // namespace

void gdn_activate(Context& ctx, const GdnActivateArgs& a) {
    if (!check_activate(a)) return;
    const unsigned blocks = one_block_each(a.n_tokens, "gdn_activate");
    const int64_t head_blocks = (2 * (a.key_dim / a.head_dim) + kWarps - 1) / kWarps;
    const int64_t v_blocks = (a.conv_dim - 2 * a.key_dim + kVStretch - 1) / kVStretch;
    if (head_blocks + v_blocks > 65535) throw Error("CUDA gdn_activate: too many heads in one row");
    select_device(ctx);
    launch_dependent("gdn_activate_kernel", gdn_activate_kernel,
                     dim3(blocks, static_cast<unsigned>(std::max<int64_t>(head_blocks + v_blocks, 1))), dim3(kThreads),
                     0, ctx.stream().handle(), a, head_blocks);
}

void gdn_gates(Context& ctx, const GdnGatesArgs& a) {
    if (!check_gates(a)) return;
    select_device(ctx);
    launch_dependent("gdn_gates_kernel", gdn_gates_kernel, dim3(stride_blocks(a.n_tokens * a.n_heads)), dim3(kThreads),
                     0, ctx.stream().handle(), a);
}

void gdn_conv_activate(Context& ctx, const ConvWindowArgs& conv, const GdnActivateArgs& act,
                       const GdnGatesArgs& gates) {
    if (conv.n_tokens != act.n_tokens || gates.n_tokens != act.n_tokens || conv.channels != act.conv_dim ||
        conv.out != act.conv || (act.n_tokens > 1 && conv.out_stride != act.conv_dim))
        throw Error("CUDA gdn_conv_activate: the conv must write the activations' rows (same tokens, channels and "
                    "row stride)");
    if (act.n_tokens > kMaxMatvecTokens)
        throw Error("CUDA gdn_conv_activate: " + std::to_string(act.n_tokens) + " tokens; it takes decode windows of "
                    "at most " + std::to_string(kMaxMatvecTokens));
    const bool has_conv = check_conv_window(conv), has_act = check_activate(act), has_gates = check_gates(gates);
    if (!has_conv && !has_act && !has_gates) return;
    if (!has_conv || !has_act) throw Error("CUDA gdn_conv_activate: an empty conv or activation with work to do");
    const int64_t qk_heads = 2 * (act.key_dim / act.head_dim);
    const int64_t v_blocks = (act.conv_dim - 2 * act.key_dim + kThreads - 1) / kThreads;
    if (qk_heads + v_blocks + 1 > 0x7fffffff) throw Error("CUDA gdn_conv_activate: too many channels");
    select_device(ctx);
    launch_dependent("gdn_conv_activate_kernel", gdn_conv_activate_kernel,
                     dim3(static_cast<unsigned>(qk_heads + v_blocks + 1)), dim3(kThreads), 0, ctx.stream().handle(),
                     conv, act, has_gates ? gates : GdnGatesArgs{}, qk_heads, v_blocks);
}

void split_beta_alpha(Context& ctx, const SplitBetaAlphaArgs& a) {
    if (a.n_tokens < 0 || a.key_heads <= 0 || a.per_group <= 0)
        throw Error("CUDA split_beta_alpha: bad shape (tokens, key heads, heads per group)");
    if (a.n_tokens == 0) return;
    if (!a.ba || !a.beta || !a.alpha) throw Error("CUDA split_beta_alpha: null pointer");
    select_device(ctx);
    launch_dependent("split_beta_alpha_kernel", split_beta_alpha_kernel,
                     dim3(stride_blocks(a.n_tokens * a.key_heads * a.per_group)), dim3(kThreads), 0,
                     ctx.stream().handle(), a);
}

namespace {

// False when there is nothing to do; throws Error on bad arguments.
bool check_gated_norm(const GatedNormArgs& a) {
    if (a.n_tokens < 0 || a.n_heads < 0 || a.head_dim < 0)
        throw Error("CUDA gated_norm: negative token, head or head_dim count");
    if (a.n_tokens == 0 || a.n_heads == 0 || a.head_dim == 0) return false;
    if (!a.x || !a.z) throw Error("CUDA gated_norm: null x or z");
    return true;
}

void launch_gated_norm(Context& ctx, const GatedNormArgs& a, const QuantizedActivations& q8_0) {
    const unsigned blocks = warp_blocks(a.n_tokens * a.n_heads, "gated_norm");
    select_device(ctx);
    launch_dependent("gated_norm_kernel", gated_norm_kernel, dim3(blocks), dim3(kThreads), 0, ctx.stream().handle(), a,
                     q8_0);
}

}  // namespace

void gated_norm(Context& ctx, const GatedNormArgs& a) {
    if (check_gated_norm(a)) launch_gated_norm(ctx, a, {});
}

void gated_norm_matmul(Context& ctx, const GatedNormArgs& a, const Tensor& w, float* y) {
    const int64_t width = a.n_heads * a.head_dim;
    if (w.ne[0] != width)
        throw Error("CUDA gated_norm_matmul: " + w.name + " takes rows of " + std::to_string(w.ne[0]) +
                    " values, the norm gives " + std::to_string(width));
    const bool fused = a.head_dim % 32 == 0 && matvec_reads_q8_0(w, a.n_tokens);
    if (!fused) {
        gated_norm(ctx, a);
        matmul(ctx, {.w = w, .x = a.x, .y = y, .n_tokens = a.n_tokens});
        return;
    }
    if (!check_gated_norm(a)) return;
    const QuantizedActivations act = matvec_activations(ctx, w, a.n_tokens);
    launch_gated_norm(ctx, a, act);
    matvec_quantized(ctx, w, act, a.x, y, a.n_tokens);
}

// ---- rows at positions and the QSA indexer --------------------------------------------------------------------------

namespace {

// store_rows' checks; false: nothing to store. The source stride goes to *src_stride.
bool check_store_rows(const StoreRowsArgs& a, int64_t* src_stride) {
    if (a.n_tokens < 0 || a.width < 0 || a.dst_rows < 0 || a.src_stride < 0)
        throw Error("CUDA store_rows: negative token count, width, row count or stride");
    *src_stride = a.src_stride ? a.src_stride : a.width;
    if (a.n_tokens > 1 && *src_stride < a.width) throw Error("CUDA store_rows: src_stride shorter than width");
    if (a.n_tokens == 0 || a.width == 0) return false;
    if (!a.dst || !a.src || !a.positions) throw Error("CUDA store_rows: null dst, src or positions");
    return true;
}

// indexer_pool's checks; false: nothing to pool.
bool check_indexer_pool(const IndexerPoolArgs& a) {
    if (a.n_tokens < 0 || a.max_blocks < 0) throw Error("CUDA indexer_pool: negative token or block count");
    if (a.head_dim <= 0 || a.ratio <= 0 || a.n_rot < 0 || a.n_rot % 2 != 0 || a.n_rot > a.head_dim)
        throw Error("CUDA indexer_pool: bad shape (head_dim " + std::to_string(a.head_dim) + ", ratio " +
                    std::to_string(a.ratio) + ", n_rot " + std::to_string(a.n_rot) +
                    "): n_rot must be even and at most head_dim, ratio positive");
    if (a.n_tokens == 0 || a.max_blocks == 0) return false;
    if (!a.raw || !a.pooled || !a.positions) throw Error("CUDA indexer_pool: null raw, pooled or positions");
    return true;
}

}  // namespace

void store_rows(Context& ctx, const StoreRowsArgs& a) {
    int64_t src_stride = 0;
    if (!check_store_rows(a, &src_stride)) return;
    const unsigned blocks = one_block_each(a.n_tokens, "store_rows");
    select_device(ctx);
    launch_dependent("store_rows_kernel", store_rows_kernel, dim3(blocks), dim3(128), 0, ctx.stream().handle(), a,
                     src_stride);
}

void indexer_pool(Context& ctx, const IndexerPoolArgs& a) {
    if (!check_indexer_pool(a)) return;
    const unsigned blocks = warp_blocks(a.n_tokens, "indexer_pool");
    select_device(ctx);
    launch_dependent("indexer_pool_kernel", indexer_pool_kernel, dim3(blocks), dim3(kThreads), 0, ctx.stream().handle(),
                     a);
}

void indexer_store_pool(Context& ctx, const StoreRowsArgs& store, const IndexerPoolArgs& pool) {
    if (store.n_tokens != pool.n_tokens || store.positions != pool.positions || store.dst != pool.raw ||
        store.width != pool.head_dim)
        throw Error(
            "CUDA indexer_store_pool: the rows stored and the rows pooled must be the same (tokens, "
            "positions, raw array, width)");
    int64_t src_stride = 0;
    if (!check_store_rows(store, &src_stride)) return;
    if (!check_indexer_pool(pool)) return store_rows(ctx, store);
    const unsigned blocks = warp_blocks(store.n_tokens, "indexer_store_pool");
    select_device(ctx);
    launch_dependent("indexer_store_pool_kernel", indexer_store_pool_kernel, dim3(blocks), dim3(kThreads), 0,
                     ctx.stream().handle(), store, src_stride, pool);
}

// ---- PLE ------------------------------------------------------------------------------------------------------------

void ple_gate(Context& ctx, const PleGateArgs& a) {
    if (a.n_tokens < 0 || a.n_streams < 0 || a.n_embd < 0)
        throw Error("CUDA ple_gate: negative token, stream or width count");
    if (a.n_tokens == 0 || a.n_streams == 0 || a.n_embd == 0) return;
    if (!a.key || !a.query || !a.value || !a.gated) throw Error("CUDA ple_gate: null pointer");
    const unsigned blocks = one_block_each(a.n_tokens * a.n_streams, "ple_gate");
    // As the CPU: 1 / sqrt(float(H)) in float (both correctly rounded, so the same bits here).
    const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(a.n_embd));
    select_device(ctx);
    launch_dependent("ple_gate_kernel", ple_gate_kernel, dim3(blocks), dim3(kPleThreads), 0, ctx.stream().handle(), a,
                     inv_sqrt_h);
}

void ple_residual_add(Context& ctx, float* residual, const float* gated, const float* conv, int64_t n) {
    if (n < 0) throw Error("CUDA ple_residual_add: negative length");
    if (n == 0) return;
    if (!residual || !gated || !conv) throw Error("CUDA ple_residual_add: null pointer");
    select_device(ctx);
    launch_dependent("ple_residual_kernel", ple_residual_kernel, dim3(stride_blocks(n)), dim3(kThreads), 0,
                     ctx.stream().handle(), residual, gated, conv, n);
}

void add_inplace(Context& ctx, float* x, const float* y, int64_t n) {
    if (n < 0) throw Error("CUDA add_inplace: negative length");
    if (n == 0) return;
    if (!x || !y) throw Error("CUDA add_inplace: null pointer");
    select_device(ctx);
    launch_dependent("add_kernel", add_kernel, dim3(stride_blocks(n)), dim3(kThreads), 0, ctx.stream().handle(), x, y,
                     n);
}

}  // namespace strata::cuda
