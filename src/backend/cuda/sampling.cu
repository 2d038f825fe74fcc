// Sampling on the device (model_ops.h): greedy as one multi-block argmax whose last block to finish reduces the
// blocks' results, and the CPU sampler's small-top-k chain in one thread block: a radix select of the k-th largest
// logit (4 passes of 8 bits over order-preserving keys), an ordered compaction of the k survivors (ties to the lowest
// ids), a bitonic sort, then top-p, min-p, temperature and the draw with the CPU's double arithmetic and order.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/model_ops.h"

namespace strata::cuda {

namespace {

constexpr int kGreedyThreads = 256;
constexpr int kGreedyMaxBlocks = 264;

struct GreedyPartials {
    float value[kGreedyMaxBlocks];
    int32_t index[kGreedyMaxBlocks];
    int32_t nan[kGreedyMaxBlocks];
    unsigned int done;  // blocks finished; the last one resets it (graph replays find it at 0)
};

// (value, index): the larger value, ties to the lower index (-0 == +0, as float comparison says).
__device__ __forceinline__ bool greedy_better(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_kernel(const float* logits, int64_t n, GreedyPartials* partials, int32_t* out) {
    __shared__ float red_v[kGreedyThreads / 32];
    __shared__ int red_i[kGreedyThreads / 32];
    __shared__ bool is_last;
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    float best = -INFINITY;
    int best_i = 0x7fffffff;
    bool nan = false;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kGreedyThreads + tid; i < n;
         i += static_cast<int64_t>(gridDim.x) * kGreedyThreads) {
        const float v = logits[i];
        nan |= isnan(v);
        if (v > best) best = v, best_i = static_cast<int>(i);  // indices rise per thread: > keeps the first
    }
    for (int o = 16; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (greedy_better(ov, oi, best, best_i)) best = ov, best_i = oi;
    }
    if (lane == 0) red_v[warp] = best, red_i[warp] = best_i;
    const int any_nan = __syncthreads_or(nan);
    if (tid == 0) {
        for (int w = 1; w < kGreedyThreads / 32; ++w)
            if (greedy_better(red_v[w], red_i[w], best, best_i)) best = red_v[w], best_i = red_i[w];
        partials->value[blockIdx.x] = best;
        partials->index[blockIdx.x] = best_i;
        partials->nan[blockIdx.x] = any_nan;
        __threadfence();
        is_last = atomicAdd(&partials->done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    if (tid < 32) {
        best = -INFINITY;
        best_i = 0x7fffffff;
        nan = false;
        for (unsigned b = tid; b < gridDim.x; b += 32) {
            const float v = *static_cast<volatile float*>(&partials->value[b]);
            const int i = *static_cast<volatile int32_t*>(&partials->index[b]);
            nan |= *static_cast<volatile int32_t*>(&partials->nan[b]) != 0;
            if (greedy_better(v, i, best, best_i)) best = v, best_i = i;
        }
        for (int o = 16; o > 0; o /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (greedy_better(ov, oi, best, best_i)) best = ov, best_i = oi;
        }
        nan = __any_sync(0xffffffffu, nan);
        if (tid == 0) {
            *out = (nan || !(best > -INFINITY)) ? -1 : best_i;
            partials->done = 0;
        }
    }
}

// ---- top-k sampling -------------------------------------------------------------------------------------------------

constexpr int kTopKThreads = 1024;
constexpr int kSubHistograms = 16;
constexpr int kUnroll = 4;

// Order-preserving key of a float (larger float, larger key), with -0 mapped to +0 so that they tie.
__device__ __forceinline__ uint32_t order_key(float f) {
    uint32_t u = __float_as_uint(f);
    if (f == 0.0f) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// fn(i, logits[i]) for every i < n, spread over the block: one thread block must pull the whole row through one
// multiprocessor, so each thread keeps kUnroll 16-byte loads in flight before it uses any of them (one 4-byte load at
// a time left the passes latency-bound: ~90 us each over 248K logits on the H200).
template <typename Fn>
__device__ __forceinline__ void for_each_logit(const float* logits, int64_t n, Fn fn) {
    const int tid = static_cast<int>(threadIdx.x);
    const int64_t n4 = (reinterpret_cast<uintptr_t>(logits) % 16 == 0) ? n / 4 : 0;
    const float4* v4 = reinterpret_cast<const float4*>(logits);
    for (int64_t base = 0; base < n4; base += static_cast<int64_t>(kUnroll) * kTopKThreads) {
        float4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t j = base + static_cast<int64_t>(u) * kTopKThreads + tid;
            if (j < n4) v[u] = __ldg(v4 + j);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t j = base + static_cast<int64_t>(u) * kTopKThreads + tid;
            if (j < n4) {
                fn(4 * j, v[u].x);
                fn(4 * j + 1, v[u].y);
                fn(4 * j + 2, v[u].z);
                fn(4 * j + 3, v[u].w);
            }
        }
    }
    for (int64_t i = 4 * n4 + tid; i < n; i += kTopKThreads) fn(i, __ldg(logits + i));
}

__global__ void __launch_bounds__(kTopKThreads) top_k_sample_kernel(TopKSamplingArgs a) {
    __shared__ unsigned int hist[kSubHistograms][256];
    __shared__ unsigned long long cand[kTopKThreads];
    __shared__ double prob[kTopKThreads];
    __shared__ int warp_eq[kTopKThreads / 32];
    __shared__ float red_f[kTopKThreads / 32];
    __shared__ uint32_t s_prefix, s_mask;
    __shared__ int s_remaining, s_eq_total, s_kept, s_gt_count, s_eq_count, s_eq_base;
    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int64_t n = a.n_vocab;
    const int k = a.top_k;

    // The largest logit, and whether the row can be sampled at all.
    float mx = -INFINITY;
    bool bad = false;
    for_each_logit(a.logits, n, [&](int64_t, float v) {
        bad |= isnan(v);
        mx = fmaxf(mx, v);
    });
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red_f[warp] = mx;
    bad = __syncthreads_or(bad);
    mx = red_f[0];
    for (int w = 1; w < kTopKThreads / 32; ++w) mx = fmaxf(mx, red_f[w]);
    if (bad || !(mx > -INFINITY) || mx == INFINITY) {
        if (tid == 0) *a.out = -1;
        return;
    }

    // Radix select: the key of the k-th largest logit, how many logits equal it (eq_total), and how many of those
    // are kept (remaining: the lowest ids first).
    if (tid == 0) s_prefix = 0, s_mask = 0, s_remaining = k;
    unsigned int* my_hist = hist[warp % kSubHistograms];
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < kSubHistograms * 256; i += kTopKThreads) (&hist[0][0])[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for_each_logit(a.logits, n, [&](int64_t, float v) {
            const uint32_t key = order_key(v);
            if ((key & mask) == prefix) atomicAdd(&my_hist[(key >> shift) & 255], 1u);
        });
        __syncthreads();
        if (tid < 256)
            for (int s = 1; s < kSubHistograms; ++s) hist[0][tid] += hist[s][tid];
        __syncthreads();
        if (tid == 0) {
            int remaining = s_remaining;
            int d = 255;
            for (; d > 0; --d) {
                if (static_cast<int>(hist[0][d]) >= remaining) break;
                remaining -= static_cast<int>(hist[0][d]);
            }
            s_remaining = remaining;
            s_eq_total = static_cast<int>(hist[0][d]);
            s_prefix = prefix | (static_cast<uint32_t>(d) << shift);
            s_mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    const uint32_t kth = s_prefix;
    const int need_eq = s_remaining, n_gt = k - need_eq;
    const bool all_eq = s_eq_total == need_eq;  // no tie across the boundary: every equal logit is kept

    // The survivors, in any order (sorted below): every key above kth, and, without a tie across the boundary,
    // every key equal to it.
    if (tid == 0) s_gt_count = 0, s_eq_count = 0, s_eq_base = 0;
    cand[tid] = 0;
    __syncthreads();
    for_each_logit(a.logits, n, [&](int64_t i, float v) {
        const uint32_t key = order_key(v);
        const unsigned long long entry =
            (static_cast<unsigned long long>(key) << 32) | (0xffffffffull - static_cast<unsigned long long>(i));
        if (key > kth) cand[atomicAdd(&s_gt_count, 1)] = entry;
        else if (key == kth && all_eq) cand[n_gt + atomicAdd(&s_eq_count, 1)] = entry;
    });
    __syncthreads();
    // A tie across the boundary: the first need_eq equal keys in id order, by an ordered scan (ballots per chunk).
    if (!all_eq) {
        for (int64_t base = 0; base < n; base += kTopKThreads) {
            if (s_eq_base >= need_eq) break;  // uniform: read after the barrier below
            const int64_t i = base + tid;
            const bool eq = i < n && order_key(a.logits[i]) == kth;
            const unsigned beq = __ballot_sync(0xffffffffu, eq);
            if (lane == 0) warp_eq[warp] = __popc(beq);
            __syncthreads();
            int off_eq = s_eq_base;
            for (int w = 0; w < warp; ++w) off_eq += warp_eq[w];
            if (eq) {
                const int pos = off_eq + __popc(beq & ((1u << lane) - 1u));
                if (pos < need_eq)
                    cand[n_gt + pos] = (static_cast<unsigned long long>(kth) << 32) |
                                       (0xffffffffull - static_cast<unsigned long long>(i));
            }
            __syncthreads();
            if (tid == 0)
                for (int w = 0; w < kTopKThreads / 32; ++w) s_eq_base += warp_eq[w];
            __syncthreads();
        }
    }
    __syncthreads();

    // Bitonic sort, largest first (entries past k are 0, the smallest).
    for (int size = 2; size <= kTopKThreads; size *= 2) {
        for (int stride = size / 2; stride > 0; stride /= 2) {
            const int other = tid ^ stride;
            if (other > tid) {
                const bool descending = (tid & size) == 0;
                const unsigned long long x = cand[tid], y = cand[other];
                if (descending ? x < y : x > y) cand[tid] = y, cand[other] = x;
            }
            __syncthreads();
        }
    }

    // The CPU's chain over the sorted survivors: p in double, sums in order by one thread.
    const double max_logit = mx;
    float logit = 0.0f;
    if (tid < k) {
        const int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(cand[tid]));
        logit = a.logits[id];
        prob[tid] = exp(static_cast<double>(logit) - max_logit);
    }
    __syncthreads();
    if (tid == 0) {
        int kept = k;
        if (a.top_p < 1.0f) {
            double total = 0.0;
            for (int j = 0; j < k; ++j) total += prob[j];
            const double target = static_cast<double>(a.top_p) * total;
            double cumulative = 0.0;
            for (int j = 0; j < k; ++j) {
                cumulative += prob[j];
                if (cumulative >= target) {
                    kept = j + 1;
                    break;
                }
            }
        }
        while (kept > 1) {
            const int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(cand[kept - 1]));
            if (a.logits[id] - mx >= a.floor_logit) break;
            --kept;
        }
        s_kept = kept;
    }
    __syncthreads();
    const int kept = s_kept;
    if (tid < kept) prob[tid] = exp((static_cast<double>(logit) - max_logit) * a.inv_temperature);
    __syncthreads();
    if (tid == 0) {
        double sum = 0.0;
        for (int j = 0; j < kept; ++j) sum += prob[j];
        const double target = *a.uniform * sum;
        double cumulative = 0.0;
        int chosen = 0;
        for (int j = 0; j < kept; ++j) {
            cumulative += prob[j];
            if (target < cumulative) {
                chosen = j;
                break;
            }
        }
        *a.out = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(cand[chosen]));
    }
}

}  // namespace

SamplingWorkspace::SamplingWorkspace(Context& ctx, int64_t n_vocab) : n_vocab_(n_vocab) {
    if (n_vocab <= 0 || n_vocab > 0x7fffffff) throw Error("CUDA sampling: vocabulary size out of range");
    buffer_ = ctx.allocate(sizeof(GreedyPartials), "scratch");
    STRATA_CUDA_CHECK(cudaMemsetAsync(buffer_.data(), 0, sizeof(GreedyPartials), ctx.stream().handle()));
    ctx.synchronize();
}

void sample_greedy(Context& ctx, const float* logits, int64_t n_vocab, int32_t* out, SamplingWorkspace& ws) {
    if (n_vocab <= 0 || n_vocab > ws.n_vocab()) throw Error("CUDA greedy sampling: vocabulary size out of range");
    if (!logits || !out) throw Error("CUDA greedy sampling: null pointer");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    const int64_t per_block = kGreedyThreads * 4;
    const int blocks = static_cast<int>(std::min<int64_t>(kGreedyMaxBlocks, (n_vocab + per_block - 1) / per_block));
    greedy_kernel<<<blocks, kGreedyThreads, 0, ctx.stream().handle()>>>(
        logits, n_vocab, static_cast<GreedyPartials*>(ws.data()), out);
    STRATA_CUDA_CHECK_LAUNCH("greedy_kernel");
}

void sample_top_k(Context& ctx, const TopKSamplingArgs& a, SamplingWorkspace& ws) {
    if (a.n_vocab <= 0 || a.n_vocab > ws.n_vocab()) throw Error("CUDA top-k sampling: vocabulary size out of range");
    if (a.top_k < 1 || a.top_k > kMaxDeviceTopK || a.top_k >= a.n_vocab)
        throw Error("CUDA top-k sampling: top_k must be 1.." + std::to_string(kMaxDeviceTopK) +
                    " and below the vocabulary size, got " + std::to_string(a.top_k));
    if (!(a.top_p > 0.0f && a.top_p <= 1.0f)) throw Error("CUDA top-k sampling: top_p must be in (0, 1]");
    if (!(a.inv_temperature > 0.0) || !std::isfinite(a.inv_temperature))
        throw Error("CUDA top-k sampling: the temperature must be > 0 (use greedy for 0)");
    if (!a.logits || !a.uniform || !a.out) throw Error("CUDA top-k sampling: null pointer");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    top_k_sample_kernel<<<1, kTopKThreads, 0, ctx.stream().handle()>>>(a);
    STRATA_CUDA_CHECK_LAUNCH("top_k_sample_kernel");
}

}  // namespace strata::cuda
