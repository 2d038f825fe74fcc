// The recurrent ops of the GDN block: the gated delta rule over a window of tokens with each head's state kept on
// chip, and the causal depthwise conv over a window.
//
// The delta rule's state columns are independent: column j of S needs only v[j] and the whole of k and q, so a head's
// [dk][dv] state is split by columns over thread blocks, and a column's dk values over G lanes, each holding R = dk / G
// of them in registers. Two kernels differ only in where those G lanes sit and how they combine their partial dot
// products (issue 8, seed 001):
//  - shuffle: the G lanes are in one warp and combine with __shfl_xor butterflies: no barrier per token;
//  - column: the G lanes are in G different warps (one warp per row group, a lane per column) and combine through
//    shared memory: one __syncthreads per token (two with STRATA_GDN_TWO_REDUCTIONS).
// Every lane runs the same FMA chains in both (the helpers below), and the column kernel adds the G partials in the
// butterfly's tree, so both give the same bits. By default one reduction of S'^T k, S'^T q and k . q per token; build
// with -DSTRATA_GDN_TWO_REDUCTIONS=1 for the CPU's order: S^T q over the updated state, a second reduction. The state
// goes through shared memory once on the way in and once on the way out, so both global passes are coalesced rows.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gdn_device.cuh"
#include "backend/cuda/internal.h"
#include "backend/cuda/launch.cuh"

namespace strata::cuda {

namespace {

constexpr int kDeltaThreads = 128;       // shuffle kernel: 4 warps per block
constexpr int kColumnBlockColumns = 32;  // column kernel: a warp per row group, one lane per column

struct DeltaParams {
    float* state;
    const float* q;
    const float* k;
    const float* v;
    int64_t q_stride, k_stride, v_stride;
    const float* g;
    const float* beta;
    float* out;
    uint16_t* out_f16;
    int64_t out_stride;
    int64_t n_tokens, heads, key_heads;
    bool tiled;
    int64_t dv;
};

// Token t's inputs of one lane: its R values of k and q (rows row0 .. row0 + R - 1 of key head kh), its column's v,
// and the head's g and beta.
template <int R>
struct TokenInputs {
    float k[R], q[R];
    float v, g, beta;
};

template <int DK, int R>
__device__ __forceinline__ void load_token(const DeltaParams& p, int64_t t, int64_t kh, int64_t h, int row0, int64_t j,
                                           bool valid, TokenInputs<R>& in) {
    const float4* k4 = reinterpret_cast<const float4*>(p.k + t * p.k_stride + kh * DK + row0);
    const float4* q4 = reinterpret_cast<const float4*>(p.q + t * p.q_stride + kh * DK + row0);
#pragma unroll
    for (int r = 0; r < R / 4; ++r) {
        const float4 a = __ldg(k4 + r), b = __ldg(q4 + r);
        in.k[4 * r] = a.x, in.k[4 * r + 1] = a.y, in.k[4 * r + 2] = a.z, in.k[4 * r + 3] = a.w;
        in.q[4 * r] = b.x, in.q[4 * r + 1] = b.y, in.q[4 * r + 2] = b.z, in.q[4 * r + 3] = b.w;
    }
    in.v = valid ? __ldg(p.v + t * p.v_stride + h * p.dv + j) : 0.0f;
    in.g = __ldg(p.g + t * p.heads + h);
    in.beta = __ldg(p.beta + t * p.heads + h);
}

// A block's BC state columns [j0, j0 + BC) of one head go through shared memory on the way in and out, so both global
// passes are coalesced rows: a lane's R rows from row0 of column `column` (columns past dv read as 0, never written).
template <int DK, int R, int BC, int kThreadCount>
__device__ __forceinline__ void load_state(const float* state, int64_t j0, int64_t dv, float* tile, int row0,
                                           int column, float (&s)[R]) {
    for (int idx = static_cast<int>(threadIdx.x); idx < DK * BC; idx += kThreadCount) {
        const int i = idx / BC, c = idx % BC;
        tile[idx] = j0 + c < dv ? state[i * dv + j0 + c] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = tile[(row0 + r) * BC + column];
}
template <int DK, int R, int BC, int kThreadCount>
__device__ __forceinline__ void store_state(float* state, int64_t j0, int64_t dv, float* tile, int row0, int column,
                                            const float (&s)[R]) {
    __syncthreads();  // every thread has read its part of the tile before any overwrites it
#pragma unroll
    for (int r = 0; r < R; ++r) tile[(row0 + r) * BC + column] = s[r];
    __syncthreads();
    for (int idx = static_cast<int>(threadIdx.x); idx < DK * BC; idx += kThreadCount) {
        const int i = idx / BC, c = idx % BC;
        if (j0 + c < dv) state[i * dv + j0 + c] = tile[idx];
    }
}

__device__ __forceinline__ void write_output(const DeltaParams& p, int64_t t, int64_t h, int64_t j, float o) {
    const int64_t at = t * p.out_stride + h * p.dv + j;
    if (p.out) p.out[at] = o;
    if (p.out_f16) p.out_f16[at] = __half_as_ushort(__float2half_rn(o));
}

// ---- one lane's arithmetic per token, shared by both kernels (the same chains, so the same bits) --------------------

#if STRATA_GDN_TWO_REDUCTIONS
// As the CPU orders it: S *= exp(g), the lane's part of S^T k in two chains (instruction-level parallelism).
template <int R>
__device__ __forceinline__ float decay_and_sk_partial(float (&s)[R], const TokenInputs<R>& in, float decay) {
    float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r += 2) {
        s[r] *= decay;
        s[r + 1] *= decay;
        p0 = fmaf(s[r], in.k[r], p0);
        p1 = fmaf(s[r + 1], in.k[r + 1], p1);
    }
    return p0 + p1;
}

// S += k delta^T, then the lane's part of S^T q over the updated state (the second reduction).
template <int R>
__device__ __forceinline__ float update_and_out_partial(float (&s)[R], const TokenInputs<R>& in, float delta) {
    float o0 = 0.0f, o1 = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r += 2) {
        s[r] = fmaf(in.k[r], delta, s[r]);
        s[r + 1] = fmaf(in.k[r + 1], delta, s[r + 1]);
        o0 = fmaf(s[r], in.q[r], o0);
        o1 = fmaf(s[r + 1], in.q[r + 1], o1);
    }
    return o0 + o1;
}
#else
// One reduction per token instead of two: with S' = exp(g) S, the output over the updated state is
// (S' + k delta^T)^T q = S'^T q + delta (k . q), so the lane's parts of S'^T k, S'^T q and k . q are formed together
// and the rank-1 update leaves the token's critical path.
template <int R>
__device__ __forceinline__ void decay_and_partials(float (&s)[R], const TokenInputs<R>& in, float decay, float& sk,
                                                   float& sq, float& kq) {
    sk = 0.0f, sq = 0.0f, kq = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        s[r] *= decay;
        sk = fmaf(s[r], in.k[r], sk);
        sq = fmaf(s[r], in.q[r], sq);
        kq = fmaf(in.k[r], in.q[r], kq);
    }
}

template <int R>
__device__ __forceinline__ void rank1_update(float (&s)[R], const TokenInputs<R>& in, float delta) {
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = fmaf(in.k[r], delta, s[r]);
}
#endif

// ---- shuffle kernel -------------------------------------------------------------------------------------------------

// Block (x, h): value head h, state columns [x * BC, x * BC + BC). Lane `lane` of warp `w` owns column
// w * C + lane % C and rows (lane / C) * R .. + R - 1 (contiguous, so k and q come in float4 loads).
template <int DK, int G>
__global__ void __launch_bounds__(kDeltaThreads) gated_delta_kernel(DeltaParams p) {
    kernels::enter_dependent_grid();
    constexpr int R = DK / G;          // state values per lane
    constexpr int C = 32 / G;          // columns per warp
    constexpr int BC = C * (kDeltaThreads / 32);  // columns per block
    static_assert(R % 4 == 0 && 32 % G == 0);
    __shared__ float tile[DK * BC];

    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int sub = lane / C, column = warp * C + lane % C;
    const int64_t h = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * BC, j = j0 + column;
    const int64_t dv = p.dv;
    const bool valid = j < dv;
    const int64_t kh = p.tiled ? h % p.key_heads : h / (p.heads / p.key_heads);
    float* state = p.state + h * DK * dv;

    float s[R];
    load_state<DK, R, BC, kDeltaThreads>(state, j0, dv, tile, sub * R, column, s);

    // The next token's inputs are loaded before the current token is computed, so their latency hides behind its math.
    TokenInputs<R> next{};
    if (p.n_tokens > 0) load_token<DK, R>(p, 0, kh, h, sub * R, j, valid, next);
    for (int64_t t = 0; t < p.n_tokens; ++t) {
        const TokenInputs<R> cur = next;
        if (t + 1 < p.n_tokens) load_token<DK, R>(p, t + 1, kh, h, sub * R, j, valid, next);

        // S *= exp(g); delta = (v - S^T k) * beta. The butterfly over lane bits C, 2C, .. 16 (the row-group index's
        // bits, lowest first) leaves every lane of a column the same sum: ((p0 + p1) + (p2 + p3)) + ... for G = 8.
        const float decay = expf(cur.g);
#if STRATA_GDN_TWO_REDUCTIONS
        float sk = decay_and_sk_partial(s, cur, decay);
#pragma unroll
        for (int offset = C; offset < 32; offset *= 2) sk += __shfl_xor_sync(0xffffffffu, sk, offset);
        const float delta = (cur.v - sk) * cur.beta;
        float o = update_and_out_partial(s, cur, delta);
#pragma unroll
        for (int offset = C; offset < 32; offset *= 2) o += __shfl_xor_sync(0xffffffffu, o, offset);
#else
        float sk, sq, kq;
        decay_and_partials(s, cur, decay, sk, sq, kq);
#pragma unroll
        for (int offset = C; offset < 32; offset *= 2) {  // three independent shuffle chains
            sk += __shfl_xor_sync(0xffffffffu, sk, offset);
            sq += __shfl_xor_sync(0xffffffffu, sq, offset);
            kq += __shfl_xor_sync(0xffffffffu, kq, offset);
        }
        const float delta = (cur.v - sk) * cur.beta;
        const float o = fmaf(delta, kq, sq);
        rank1_update(s, cur, delta);
#endif
        if (sub == 0 && valid) write_output(p, t, h, j, o);
    }

    store_state<DK, R, BC, kDeltaThreads>(state, j0, dv, tile, sub * R, column, s);
}

template <int DK, int G>
void launch_gated_delta(const DeltaParams& p, cudaStream_t stream) {
    constexpr int BC = (32 / G) * (kDeltaThreads / 32);
    const dim3 grid(static_cast<unsigned>((p.dv + BC - 1) / BC), static_cast<unsigned>(p.heads));
    launch_dependent("gated_delta_kernel", gated_delta_kernel<DK, G>, grid, dim3(kDeltaThreads), 0, stream, p);
}

// ---- column kernel --------------------------------------------------------------------------------------------------

// The G partial sums of one column (partial[g * kColumnBlockColumns], g < G) added in the shuffle butterfly's tree:
// its step with lane offset C * 2^m (m = 0, 1, ..) adds the sums of two blocks of 2^m row groups that differ in bit m
// of the group index, so after log2(G) steps every lane holds the balanced tree "lower half's sum + upper half's
// sum", recursively: ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) for G = 8. The lanes of an upper block add in
// the other order (b + a), which is the same IEEE sum, so all lanes agree with this tree bit for bit.
template <int G>
__device__ __forceinline__ float butterfly_order_sum(const float* partial) {
    static_assert(G >= 1 && (G & (G - 1)) == 0);
    if constexpr (G == 1)
        return partial[0];
    else  // a recursion rather than a loop over an array, so the values stay in registers
        return butterfly_order_sum<G / 2>(partial) + butterfly_order_sum<G / 2>(partial + G / 2 * kColumnBlockColumns);
}

// Block (x, h): value head h, state columns [x * 32, x * 32 + 32). Warp `group` holds rows group * R .. + R - 1 of the
// block's 32 columns, lane = column. Per token each thread writes its partial sums to shared memory; after the barrier
// every thread adds the G partials of its column itself (no second barrier to hand the result out). The partials are
// double-buffered by token parity: token t + 1 writes the other buffer, and token t + 2 writes this one only after
// the barrier of token t + 1, which no thread passes before it has read token t's partials.
template <int DK, int G>
__global__ void __launch_bounds__(G * kColumnBlockColumns) gated_delta_column_kernel(DeltaParams p) {
    kernels::enter_dependent_grid();
    constexpr int R = DK / G, BC = kColumnBlockColumns, kThreads = G * BC;
    static_assert(R % 4 == 0);
    __shared__ float tile[DK * BC];
#if STRATA_GDN_TWO_REDUCTIONS
    // Two barriers per token, so one buffer each: S^T k's partials of token t + 1 are written after the second
    // barrier of token t, by which every thread has read token t's; the output partials of token t + 1 after its
    // first barrier, which group 0 passes only after reading token t's.
    __shared__ float sk_partial[kThreads], out_partial[kThreads];
#else
    __shared__ float partial[2][3][kThreads];  // [token parity][S'^T k, S'^T q, k . q][group * BC + column]
#endif

    const int tid = static_cast<int>(threadIdx.x), group = tid / BC, column = tid % BC;
    const int64_t h = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * BC, j = j0 + column;
    const int64_t dv = p.dv;
    const bool valid = j < dv;
    const int64_t kh = p.tiled ? h % p.key_heads : h / (p.heads / p.key_heads);
    float* state = p.state + h * DK * dv;

    float s[R];
    load_state<DK, R, BC, kThreads>(state, j0, dv, tile, group * R, column, s);

    TokenInputs<R> next{};
    if (p.n_tokens > 0) load_token<DK, R>(p, 0, kh, h, group * R, j, valid, next);
    for (int64_t t = 0; t < p.n_tokens; ++t) {
        const TokenInputs<R> cur = next;
        if (t + 1 < p.n_tokens) load_token<DK, R>(p, t + 1, kh, h, group * R, j, valid, next);

        const float decay = expf(cur.g);
#if STRATA_GDN_TWO_REDUCTIONS
        sk_partial[tid] = decay_and_sk_partial(s, cur, decay);
        __syncthreads();
        const float delta = (cur.v - butterfly_order_sum<G>(sk_partial + column)) * cur.beta;
        out_partial[tid] = update_and_out_partial(s, cur, delta);
        __syncthreads();
        if (group == 0 && valid) write_output(p, t, h, j, butterfly_order_sum<G>(out_partial + column));
#else
        float (&buffer)[3][kThreads] = partial[t & 1];
        float sk, sq, kq;
        decay_and_partials(s, cur, decay, sk, sq, kq);
        buffer[0][tid] = sk, buffer[1][tid] = sq, buffer[2][tid] = kq;
        __syncthreads();
        const float delta = (cur.v - butterfly_order_sum<G>(buffer[0] + column)) * cur.beta;
        rank1_update(s, cur, delta);
        // Only group 0 writes the output, so only it adds up S'^T q and k . q.
        if (group == 0 && valid) {
            const float kq_sum = butterfly_order_sum<G>(buffer[2] + column);
            const float sq_sum = butterfly_order_sum<G>(buffer[1] + column);
            write_output(p, t, h, j, fmaf(delta, kq_sum, sq_sum));
        }
#endif
    }

    store_state<DK, R, BC, kThreads>(state, j0, dv, tile, group * R, column, s);
}

template <int DK, int G>
void launch_gated_delta_column(const DeltaParams& p, cudaStream_t stream) {
    constexpr int BC = kColumnBlockColumns;
    const dim3 grid(static_cast<unsigned>((p.dv + BC - 1) / BC), static_cast<unsigned>(p.heads));
    launch_dependent("gated_delta_column_kernel", gated_delta_column_kernel<DK, G>, grid, dim3(G * BC), 0, stream, p);
}

// Both kernels with the same rows per lane (G lanes per column), so their FMA chains match.
template <int DK, int G>
void launch_gated_delta(const DeltaParams& p, GdnRecurrence recurrence, cudaStream_t stream) {
    if (recurrence == GdnRecurrence::Column)
        launch_gated_delta_column<DK, G>(p, stream);
    else
        launch_gated_delta<DK, G>(p, stream);
}

bool aligned16(const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// ---- causal conv ----------------------------------------------------------------------------------------------------

// One thread per channel (gdn_device.cuh).
__global__ void causal_conv_kernel(ConvWindowArgs a) {
    kernels::enter_dependent_grid();
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c < a.channels) kernels::causal_conv_channel(a, c);
}

// Long windows: a thread per (channel, run of kConvTokensPerThread tokens), so a prompt window fills the GPU (one
// thread per channel walked 4,096 tokens on 40 of 132 SMs: 12% of a Flash-Next prompt). Every output takes the same
// operations in the same order as causal_conv_kernel's; the history is rewritten afterwards by
// causal_conv_history_kernel, once every output has read the old one.
constexpr int64_t kConvTokensPerThread = 32;
constexpr int64_t kConvSplitMinTokens = 64;

__global__ void causal_conv_tokens_kernel(ConvWindowArgs a) {
    kernels::enter_dependent_grid();
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t first = static_cast<int64_t>(blockIdx.y) * kConvTokensPerThread;
    if (c < a.channels) kernels::causal_conv_outputs(a, c, first, min(first + kConvTokensPerThread, a.n_tokens));
}

__global__ void causal_conv_history_kernel(ConvWindowArgs a) {
    kernels::enter_dependent_grid();
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c < a.channels) kernels::causal_conv_history(a, c);
}

}  // namespace

const char* gdn_recurrence_name(GdnRecurrence recurrence) {
    switch (recurrence) {
        case GdnRecurrence::Auto: return "auto";
        case GdnRecurrence::Column: return "column";
        case GdnRecurrence::Shuffle: return "shuffle";
    }
    return "unknown";
}

GdnRecurrence resolve_gdn_recurrence(GdnRecurrence recurrence) {
    if (recurrence != GdnRecurrence::Auto) return recurrence;
    // The shuffle kernel: on the H200 `strata bench gdn-recurrence` (48 heads of 128 x 128) measured it 1.29x faster
    // than the column kernel at 8,192 tokens (4.65 against 6.00 ms) and 1.32x at 32,768 (18.5 against 24.4 ms), with
    // the same bits (bench/NOTES.md, 2026-12-01).
    return GdnRecurrence::Shuffle;
}

void gated_delta(Context& ctx, const GatedDeltaArgs& a) {
    if (a.n_tokens < 0) throw Error("CUDA gated_delta: n_tokens is negative");
    if (a.n_tokens == 0) return;
    if (a.heads <= 0 || a.key_heads <= 0 || a.heads % a.key_heads != 0)
        throw Error("CUDA gated_delta: " + std::to_string(a.heads) + " value heads are no multiple of " +
                    std::to_string(a.key_heads) + " key heads");
    if (a.heads > 65535) throw Error("CUDA gated_delta: more than 65535 heads in one call");
    if (a.dk != 16 && a.dk != 32 && a.dk != 64 && a.dk != 128 && a.dk != 256)
        throw Error("CUDA gated_delta: key head size dk = " + std::to_string(a.dk) +
                    " is not supported (16, 32, 64, 128, 256)");
    if (a.dv <= 0) throw Error("CUDA gated_delta: value head size dv must be positive");
    if (!a.state || !a.q || !a.k || !a.v || !a.g || !a.beta || (!a.out && !a.out_f16))
        throw Error("CUDA gated_delta: a null pointer among state, q, k, v, g, beta, out (and out_f16)");
    if (a.recurrence != GdnRecurrence::Auto && a.recurrence != GdnRecurrence::Column &&
        a.recurrence != GdnRecurrence::Shuffle)
        throw Error("CUDA gated_delta: unknown recurrence kernel " + std::to_string(static_cast<int>(a.recurrence)));
    if (!aligned16(a.q) || !aligned16(a.k) || a.q_stride % 4 != 0 || a.k_stride % 4 != 0)
        throw Error("CUDA gated_delta: q and k rows must be 16-byte aligned (pointers and strides multiples of 4 "
                    "floats)");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const DeltaParams p{.state = a.state, .q = a.q, .k = a.k, .v = a.v, .q_stride = a.q_stride,
                        .k_stride = a.k_stride, .v_stride = a.v_stride, .g = a.g, .beta = a.beta, .out = a.out,
                        .out_f16 = a.out_f16, .out_stride = a.out_stride, .n_tokens = a.n_tokens, .heads = a.heads,
                        .key_heads = a.key_heads, .tiled = a.tiled_value_heads, .dv = a.dv};
    cudaStream_t stream = ctx.stream().handle();
    const GdnRecurrence recurrence = resolve_gdn_recurrence(a.recurrence);
    // 8 lanes per column up to dk 128 (16 values each), 16 at 256: the same registers per lane. The small heads of
    // the test models (16, 32) take 4 values per lane.
    switch (a.dk) {
        case 16: launch_gated_delta<16, 4>(p, recurrence, stream); break;
        case 32: launch_gated_delta<32, 8>(p, recurrence, stream); break;
        case 64: launch_gated_delta<64, 8>(p, recurrence, stream); break;
        case 128: launch_gated_delta<128, 8>(p, recurrence, stream); break;
        default: launch_gated_delta<256, 16>(p, recurrence, stream); break;
    }
}

bool check_conv_window(const ConvWindowArgs& a) {
    if (a.n_tokens < 0 || a.channels < 0) throw Error("CUDA causal_conv: negative token or channel count");
    if (a.kernel < 1 || a.dilation < 1)
        throw Error("CUDA causal_conv: kernel " + std::to_string(a.kernel) + " and dilation " +
                    std::to_string(a.dilation) + " must be at least 1");
    if (a.n_tokens == 0 || a.channels == 0) return false;
    if (!a.x || !a.w || !a.out || (a.kernel > 1 && !a.history))
        throw Error("CUDA causal_conv: a null pointer among x, w, history, out");
    if (a.n_tokens > 1 && (a.x_stride < a.channels || a.out_stride < a.channels))
        throw Error("CUDA causal_conv: token strides must be at least the channel count");
    return true;
}

void causal_conv(Context& ctx, const ConvWindowArgs& a) {
    if (!check_conv_window(a)) return;
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    constexpr int kThreads = 256;
    const auto channel_blocks = static_cast<unsigned>((a.channels + kThreads - 1) / kThreads);
    cudaStream_t stream = ctx.stream().handle();
    if (a.n_tokens < kConvSplitMinTokens) {
        launch_dependent("causal_conv_kernel", causal_conv_kernel, dim3(channel_blocks), dim3(kThreads), 0, stream, a);
        return;
    }
    const auto runs = static_cast<unsigned>((a.n_tokens + kConvTokensPerThread - 1) / kConvTokensPerThread);
    launch_dependent("causal_conv_tokens_kernel", causal_conv_tokens_kernel, dim3(channel_blocks, runs), dim3(kThreads),
                     0, stream, a);
    if (a.kernel > 1)
        launch_dependent("causal_conv_history_kernel", causal_conv_history_kernel, dim3(channel_blocks),
                         dim3(kThreads), 0, stream, a);
}

}  // namespace strata::cuda
