// The QSA indexer on the device: block scores in the CPU's exact float order, then one thread block that selects the
// best blocks by radix select and writes the selected cells (attention.h states what is computed).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/warp_reduce.cuh"
#include "core/topk_tie_order.h"

namespace strata::cuda {

namespace {

constexpr int kScoreThreads = 256;  // 8 lanes per block: 32 blocks per thread block
constexpr int64_t kMaxIndexerQ = 8192;  // n_head * head_dim floats staged in shared memory
constexpr int kSelectThreads = 1024;
constexpr int kWarpsPerSelect = kSelectThreads / 32;
// Keys staged in shared memory for the four histogram passes and the two scans when they fit (128 KB: 32,768 blocks,
// 131,072 cells at ratio 4; fewer on devices with less shared memory); longer caches read them from global memory (L2)
// each pass.
constexpr int64_t kMaxSharedKeys = 32768;

struct Counts {
    int32_t n_visible, n_blocks, k;
};

// Query t's arguments alone (QsaSelectArgs::n_queries): its q, cache length, workspace, cells and count.
__device__ __forceinline__ QsaSelectArgs query_args(QsaSelectArgs a, int64_t t) {
    a.q += t * a.q_stride;
    a.n_cells += t;
    a.scores += t * a.max_blocks;
    a.keys += t * 2 * a.max_blocks;
    a.cells += t * a.cells_stride;
    a.n_selected += t;
    return a;
}

__device__ __forceinline__ Counts counts(const QsaSelectArgs& a) {
    int32_t n_visible = *a.n_cells;
    n_visible = max(0, n_visible);
    int32_t n_blocks = static_cast<int32_t>(n_visible / a.ratio);
    if (n_blocks > a.max_blocks) {  // the pooled rows end there: cut the visible cells to match
        n_blocks = static_cast<int32_t>(a.max_blocks);
        n_visible = static_cast<int32_t>(a.max_blocks * a.ratio + a.ratio - 1);
    }
    const int32_t k = static_cast<int32_t>(min(a.budget / a.ratio, static_cast<int64_t>(n_blocks)));
    return {n_visible, n_blocks, k};
}

// The CPU's float_key: larger float, larger key; -0 maps like +0.
__device__ __forceinline__ uint32_t float_key(float f) {
    f = __fadd_rn(f, 0.0f);
    const uint32_t bits = __float_as_uint(f);
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// Eight lanes per block: lane j of the eight sums the products of dims j, j + 8, ... in order (cpu::dot's partial sum
// j), then the eight combine as ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)). Rounded multiplies and adds only.
// Block (x, t): query t's blocks x * 32 .. x * 32 + 31.
__global__ void __launch_bounds__(kScoreThreads) qsa_score_kernel(QsaSelectArgs batch) {
    kernels::enter_dependent_grid();
    __shared__ float q[kMaxIndexerQ];
    const QsaSelectArgs a = query_args(batch, blockIdx.y);
    const Counts n = counts(a);
    if (n.k == n.n_blocks) return;  // everything is kept: no scores needed (the CPU computes none either)
    if (static_cast<int64_t>(blockIdx.x) * (kScoreThreads / 8) >= n.n_blocks) return;  // none of its blocks exist yet
    const int64_t qn = a.n_head * a.head_dim;
    for (int64_t i = threadIdx.x; i < qn; i += kScoreThreads) q[i] = a.q[i];
    __syncthreads();
    const int lane8 = static_cast<int>(threadIdx.x) % 8;
    const int64_t b = static_cast<int64_t>(blockIdx.x) * (kScoreThreads / 8) + threadIdx.x / 8;
    const bool valid = b < n.n_blocks;
    const float* row = a.pooled + (valid ? b : 0) * a.head_dim;
    float sum = 0.0f;
    for (int64_t h = 0; h < a.n_head; ++h) {
        const float* qh = q + h * a.head_dim;
        float acc = 0.0f;
        if (valid)
            for (int64_t i = lane8; i < a.head_dim; i += 8) acc = __fadd_rn(acc, __fmul_rn(qh[i], row[i]));
        // Lanes 8m + j: the xor-4 partner holds a_{j^4}: a_j + a_{j+4} in lanes j and j + 4 (addition commutes
        // exactly); then xor 1 pairs (0,1) and (2,3), xor 2 joins the two halves.
        acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 4));
        acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
        acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
        sum = __fadd_rn(sum, fmaxf(0.0f, acc));
    }
    if (valid && lane8 == 0) {
        const float scale = 1.0f / sqrtf(static_cast<float>(a.head_dim));
        const float score = __fmul_rn(sum, scale);
        a.scores[b] = score;
        a.keys[b] = float_key(score);
    }
}


// Thread block t: query t's selection (qsa_select_into).
__global__ void __launch_bounds__(kSelectThreads) qsa_select_kernel(QsaSelectArgs batch, bool keys_in_shared) {
    kernels::enter_dependent_grid();
    const QsaSelectArgs a = query_args(batch, blockIdx.x);
    extern __shared__ uint32_t shared_keys[];
    __shared__ int32_t hist[256];
    __shared__ int32_t warp_sums[32];
    __shared__ uint32_t s_prefix;
    __shared__ int32_t s_remaining;
    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32;
    const Counts n = counts(a);
    int32_t n_out = 0;  // cells before the tail
    if (n.n_blocks > 0 && n.k == n.n_blocks) {
        n_out = n.n_blocks * static_cast<int32_t>(a.ratio);
        for (int32_t c = tid; c < n_out; c += kSelectThreads) a.cells[c] = c;
    } else if (n.n_blocks > 0 && n.k > 0) {
        const uint32_t* keys = a.keys;
        if (keys_in_shared) {
            for (int32_t i = tid; i < n.n_blocks; i += kSelectThreads) shared_keys[i] = a.keys[i];
            keys = shared_keys;
        }
        // Most significant digit first: the histogram of the digit among keys that match the prefix so far, then the
        // digit holding the remaining-th largest (counted from the top).
        uint32_t prefix = 0, mask = 0;
        int32_t remaining = n.k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            if (tid < 256) hist[tid] = 0;
            __syncthreads();
            // Scores are non-negative sums, so nearly all keys share their leading digits: each thread counts runs of
            // one digit before it adds, so the same bin is not hit by thousands of atomics in a row.
            uint32_t run_digit = 0;
            int32_t run = 0;
            for (int32_t i = tid; i < n.n_blocks; i += kSelectThreads) {
                const uint32_t key = keys[i];
                if ((key & mask) != prefix) continue;
                const uint32_t digit = (key >> shift) & 255;
                if (run > 0 && digit != run_digit) {
                    atomicAdd(&hist[run_digit], run);
                    run = 0;
                }
                run_digit = digit;
                ++run;
            }
            if (run > 0) atomicAdd(&hist[run_digit], run);
            __syncthreads();
            // Thread t holds digit 255 - t: an inclusive sum gives the count at or above each digit.
            const int32_t mine = tid < 256 ? hist[255 - tid] : 0;
            const int32_t at_or_above = block_inclusive_sum(mine, warp_sums, nullptr);
            const int32_t above = at_or_above - mine;
            // The digit where the count from the top first reaches `remaining` (digit 0 at the latest, as the CPU).
            if (tid < 256 && above < remaining && (at_or_above >= remaining || tid == 255)) {
                s_prefix = prefix | (static_cast<uint32_t>(255 - tid) << shift);
                s_remaining = remaining - above;
            }
            __syncthreads();
            prefix = s_prefix;
            remaining = s_remaining;
            mask |= 255u << shift;
            __syncthreads();
        }
        // Every key above the prefix and `remaining` of those equal to it, in ascending order: each warp owns a
        // contiguous range and walks it 32 consecutive keys at a time (conflict-free shared reads); two block scans
        // over the warps' counts give each warp its place among the equal keys and in the output, and ballots give
        // each lane its place within a step. When every equal key is kept the set is plain; when equal keys straddle
        // the cut, torch.topk's choice among them (core/topk_tie_order.h, as the CPU) is replayed by one thread and
        // the kept blocks flagged in `keys` (the global copy; the shared one, if any, is not read again), with their
        // indices in the workspace's second half.
        const int lane = tid % 32;
        const int32_t per_warp = ((n.n_blocks + kWarpsPerSelect - 1) / kWarpsPerSelect + 31) / 32 * 32;
        const int32_t begin = min(n.n_blocks, warp * per_warp), end = min(n.n_blocks, begin + per_warp);
        int32_t above = 0, equal = 0;
        for (int32_t i = begin + lane; i < end; i += 32) {
            above += keys[i] > prefix;
            equal += keys[i] == prefix;
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            above += __shfl_xor_sync(0xffffffffu, above, off);
            equal += __shfl_xor_sync(0xffffffffu, equal, off);
        }
        // Only lane 0 of each warp enters the scans, so a lane-0 inclusive sum counts whole warps.
        const int32_t equal_in = lane == 0 ? equal : 0;
        int32_t equal_total = 0;
        const int32_t equal_before =
            __shfl_sync(0xffffffffu, block_inclusive_sum(equal_in, warp_sums, &equal_total) - equal_in, 0);
        const bool by_flag = equal_total > remaining;
        uint32_t* flags = a.keys;
        if (by_flag) {
            int32_t* index = reinterpret_cast<int32_t*>(a.keys + a.max_blocks);
            for (int32_t i = tid; i < n.n_blocks; i += kSelectThreads) {
                flags[i] = keys[i];
                index[i] = i;
            }
            __syncthreads();
            if (tid == 0) topk_tie_order::select({flags, index}, n.k, n.n_blocks);
            __syncthreads();
            for (int32_t i = tid; i < n.n_blocks; i += kSelectThreads) flags[i] = 0;
            __syncthreads();
            for (int32_t j = tid; j < n.k; j += kSelectThreads) flags[index[j]] = 1;
            __syncthreads();
            above = 0;
            for (int32_t i = begin + lane; i < end; i += 32) above += flags[i] != 0;
#pragma unroll
            for (int off = 16; off > 0; off /= 2) above += __shfl_xor_sync(0xffffffffu, above, off);
        }
        const int32_t take_equal = by_flag ? 0 : max(0, min(equal, remaining - equal_before));
        const int32_t mine = lane == 0 ? above + take_equal : 0;
        int32_t chosen_total = 0;
        int32_t out = __shfl_sync(0xffffffffu, block_inclusive_sum(mine, warp_sums, &chosen_total) - mine, 0);
        int32_t equal_seen = equal_before;
        const int32_t ratio = static_cast<int32_t>(a.ratio);
        const uint32_t below = (1u << lane) - 1u;
        for (int32_t base = begin; base < end; base += 32) {
            const int32_t i = base + lane;
            bool take = false;
            if (by_flag) {
                take = i < end && flags[i] != 0;
            } else {
                const uint32_t key = i < end ? keys[i] : 0u;
                const bool is_equal = i < end && key == prefix;
                const uint32_t equal_mask = __ballot_sync(0xffffffffu, is_equal);
                take = i < end &&
                       (key > prefix || (is_equal && equal_seen + __popc(equal_mask & below) < remaining));
                equal_seen += __popc(equal_mask);
            }
            const uint32_t take_mask = __ballot_sync(0xffffffffu, take);
            if (take) {
                const int32_t slot = out + __popc(take_mask & below);
                for (int32_t j = 0; j < ratio; ++j) a.cells[slot * ratio + j] = i * ratio + j;
            }
            out += __popc(take_mask);
        }
        n_out = chosen_total * ratio;
    }
    // The partial tail block.
    const int32_t tail0 = n.n_blocks * static_cast<int32_t>(a.ratio);
    for (int32_t c = tail0 + tid; c < n.n_visible; c += kSelectThreads) a.cells[n_out + (c - tail0)] = c;
    if (tid == 0) *a.n_selected = n_out + max(0, n.n_visible - tail0);
}

}  // namespace

void qsa_select(Context& ctx, const QsaSelectArgs& a) {
    if (a.n_head <= 0 || a.head_dim <= 0 || a.n_head * a.head_dim > kMaxIndexerQ)
        throw Error("CUDA qsa_select: indexer heads x head_dim must be in 1.." + std::to_string(kMaxIndexerQ));
    if (a.ratio <= 0 || a.budget < 0) throw Error("CUDA qsa_select: ratio must be positive and budget not negative");
    if (a.max_blocks <= 0 || a.max_blocks > (int64_t{1} << 24))
        throw Error("CUDA qsa_select: max_blocks must be in 1..2^24");
    if (a.max_blocks * a.ratio + a.ratio > 0x7fffffff) throw Error("CUDA qsa_select: capacity too large");
    if (!a.q || !a.pooled || !a.n_cells || !a.scores || !a.keys || !a.cells || !a.n_selected)
        throw Error("CUDA qsa_select: a null pointer among q, pooled, n_cells, scores, keys, cells, n_selected");
    if (a.n_queries < 1 || a.n_queries > 65535)
        throw Error("CUDA qsa_select: n_queries must be in 1..65535, got " + std::to_string(a.n_queries));
    if (a.n_queries > 1 && (a.q_stride < a.n_head * a.head_dim || a.cells_stride < qsa_max_cells(a)))
        throw Error("CUDA qsa_select: the queries' q or cell rows overlap (q_stride, cells_stride)");
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t stream = ctx.stream().handle();
    const int64_t per_block = kScoreThreads / 8;
    launch_dependent("qsa_score_kernel", qsa_score_kernel,
                     dim3(static_cast<unsigned>((a.max_blocks + per_block - 1) / per_block),
                          static_cast<unsigned>(a.n_queries)),
                     dim3(kScoreThreads), 0, stream, a);
    // Raised once to the most the keys can take (an attribute, not a stream operation: fine during graph capture):
    // kMaxSharedKeys, or fewer where the device's blocks have less room beside the kernel's own arrays (sm_75, 64 KB).
    static int64_t max_shared_keys = -1;
    if (max_shared_keys < 0) {
        cudaFuncAttributes attributes{};
        STRATA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, qsa_select_kernel));
        const size_t room = ctx.info().max_shared_per_block - std::min(ctx.info().max_shared_per_block,
                                                                      attributes.sharedSizeBytes);
        const int64_t keys = std::min(kMaxSharedKeys, static_cast<int64_t>(room / 4));
        STRATA_CUDA_CHECK(cudaFuncSetAttribute(qsa_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(keys * 4)));
        max_shared_keys = keys;
    }
    const bool keys_in_shared = a.max_blocks <= max_shared_keys;
    const size_t shared = keys_in_shared ? static_cast<size_t>(a.max_blocks) * 4 : 0;
    launch_dependent("qsa_select_kernel", qsa_select_kernel, dim3(static_cast<unsigned>(a.n_queries)),
                     dim3(kSelectThreads), shared, stream, a, keys_in_shared);
}

}  // namespace strata::cuda
