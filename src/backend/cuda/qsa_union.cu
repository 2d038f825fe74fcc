// QSA attention over 8-position selection unions on tensor cores (qsa_union.h states what is computed).
//
// Three kernels:
//   1. union: one thread block per group of 8 positions. The cell range is walked in windows of 32,768 cells; each
//      window's cells get an 8-bit mask in shared memory (an atomicOr per selected cell: the result does not depend on
//      the order), then the block compacts the non-zero masks in ascending cell order with one scan.
//   2. attention: thread block (split, kv head, group), 8 warps. Rows r = p * G + g (position p of the group, query
//      head g of the kv head's G). Per 64-cell chunk of the split's share of the union:
//        a. the chunk's cells, their masks and K/V rows (page table look-ups), K and V converted to fp16 in shared
//           memory ([cell][dim], rows padded by 8 halves so fragment loads hit 32 distinct banks);
//        b. S^T = K Q^T: tiles of 16 cells x 8 rows, mma.sync m16n8k16 over head_dim; scaled, -inf where the row's
//           position did not choose the cell, to shared memory as f32;
//        c. online softmax, one warp per row: new maximum, rescale factor, P in fp16 (the sum taken over the rounded
//           P, so the normalisation matches what the products use);
//        d. O^T += V^T P^T: tiles of 16 dims x 8 rows held in registers by the warps, V^T fragments by ldmatrix.trans.
//      The split's unnormalised O, maximum and sum go to the workspace.
//   3. merge: block (position, head): the splits by log-sum-exp, the division by the sum, the sigmoid gate.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/activation_device.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/qsa_union.h"
#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda {

namespace {

// ---- 1. the union ---------------------------------------------------------------------------------------------------

constexpr int kUnionThreads = 1024;
constexpr int kUnionWindow = 32768;                             // cells per shared-memory mask window
constexpr int kCellsPerThread = kUnionWindow / kUnionThreads;  // 32: eight mask words

struct UnionParams {
    const int32_t* n_cells;
    const int32_t* cells;
    int64_t cells_stride;
    const int32_t* n_selected;
    int64_t max_cells;
    int n_tokens;
    int64_t capacity;  // cells the page table covers
    int32_t* union_cells;
    uint8_t* union_masks;
    int32_t* n_union;
    int64_t union_stride;
};


__device__ __forceinline__ int nonzero_bytes(uint32_t w) {
    return ((w & 0xffu) != 0) + ((w & 0xff00u) != 0) + ((w & 0xff0000u) != 0) + ((w & 0xff000000u) != 0);
}

__global__ void __launch_bounds__(kUnionThreads) union_kernel(const UnionParams p) {
    __shared__ uint4 masks4[kUnionWindow / 16];
    __shared__ int32_t len_s[kQsaUnionGroup], count_s[kQsaUnionGroup];
    __shared__ int32_t warp_sums[32];
    uint32_t* masks = reinterpret_cast<uint32_t*>(masks4);
    const int tid = static_cast<int>(threadIdx.x);
    const int group = static_cast<int>(blockIdx.x);
    const int t0 = group * static_cast<int>(kQsaUnionGroup);
    const int np = min(static_cast<int>(kQsaUnionGroup), p.n_tokens - t0);
    if (tid < kQsaUnionGroup) {
        int32_t len = 0, count = 0;
        if (tid < np) {
            len = static_cast<int32_t>(min(static_cast<int64_t>(max(p.n_cells[t0 + tid], 0)), p.capacity));
            count = static_cast<int32_t>(min(static_cast<int64_t>(max(p.n_selected[t0 + tid], 0)), p.max_cells));
        }
        len_s[tid] = len;
        count_s[tid] = count;
    }
    __syncthreads();
    int32_t hi = 0;
#pragma unroll
    for (int i = 0; i < kQsaUnionGroup; ++i) hi = max(hi, len_s[i]);
    int32_t* out_cells = p.union_cells + static_cast<int64_t>(group) * p.union_stride;
    uint8_t* out_masks = p.union_masks + static_cast<int64_t>(group) * p.union_stride;
    int32_t written = 0;
    for (int32_t w0 = 0; w0 < hi; w0 += kUnionWindow) {
        for (int i = tid; i < kUnionWindow / 16; i += kUnionThreads) masks4[i] = make_uint4(0, 0, 0, 0);
        __syncthreads();
        for (int pos = 0; pos < np; ++pos) {
            const int32_t* list = p.cells + static_cast<int64_t>(t0 + pos) * p.cells_stride;
            const int32_t limit = min(len_s[pos], w0 + kUnionWindow), n = count_s[pos];
            for (int32_t i = tid; i < n; i += kUnionThreads) {
                const int32_t c = list[i];
                if (c >= w0 && c < limit) {
                    const int32_t local = c - w0;
                    atomicOr(&masks[local / 4], (1u << pos) << (8 * (local % 4)));
                }
            }
        }
        __syncthreads();
        // Thread t compacts cells [32t, 32t + 32) of the window: eight words, read as two 16-byte loads.
        uint32_t words[kCellsPerThread / 4];
        const uint4 a = masks4[2 * tid], b = masks4[2 * tid + 1];
        words[0] = a.x, words[1] = a.y, words[2] = a.z, words[3] = a.w;
        words[4] = b.x, words[5] = b.y, words[6] = b.z, words[7] = b.w;
        int32_t mine = 0;
#pragma unroll
        for (int j = 0; j < kCellsPerThread / 4; ++j) mine += nonzero_bytes(words[j]);
        int32_t total = 0;
        int32_t slot = written + block_inclusive_sum(mine, warp_sums, &total) - mine;
#pragma unroll
        for (int j = 0; j < kCellsPerThread / 4; ++j)
#pragma unroll
            for (int byte = 0; byte < 4; ++byte) {
                const uint32_t m = (words[j] >> (8 * byte)) & 0xffu;
                if (m) {
                    out_cells[slot] = w0 + tid * kCellsPerThread + j * 4 + byte;
                    out_masks[slot] = static_cast<uint8_t>(m);
                    ++slot;
                }
            }
        written += total;
        __syncthreads();  // the masks are cleared for the next window
    }
    if (tid == 0) p.n_union[group] = written;
}

// ---- 2. attention over the union ------------------------------------------------------------------------------------

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = static_cast<int>(kQsaUnionChunk);
constexpr int kMaxOutTilesPerWarp = 24;  // O^T tiles of 16 x 8 held in registers: 96 floats a thread
constexpr int kScoreStride = kChunk + 4;  // f32 scores per row: the fragment writes of 8 rows x 4 lanes hit 32 banks
constexpr int kProbStride = kChunk + 8;   // fp16 probabilities per row

// Shared memory of the attention kernel for R rows (a multiple of 8) at head dim hd, in the order of the carve-up:
// scores (f32), max / sum / rescale (f32), the chunk's K/V row indices (int64), then fp16 Q, K, V, P, then the masks.
struct SharedLayout {
    size_t scores, stats, rows, q, k, v, prob, masks, total;
};
__host__ __device__ constexpr SharedLayout shared_layout(int rows, int hd) {
    SharedLayout s{};
    const size_t row_halves = static_cast<size_t>(hd) + 8;
    s.scores = 0;
    s.stats = s.scores + static_cast<size_t>(rows) * kScoreStride * 4;
    s.rows = s.stats + 3 * static_cast<size_t>(rows) * 4;
    s.q = s.rows + kChunk * 8;
    s.k = s.q + static_cast<size_t>(rows) * row_halves * 2;
    s.v = s.k + kChunk * row_halves * 2;
    s.prob = s.v + kChunk * row_halves * 2;
    s.masks = s.prob + static_cast<size_t>(rows) * kProbStride * 2;
    s.total = s.masks + kChunk;
    return s;
}

struct AttentionParams {
    KvCacheView c;
    PageTable table;
    const int32_t* union_cells;
    const uint8_t* union_masks;
    const int32_t* n_union;
    int64_t union_stride;
    const float* q;
    int64_t q_token_stride, q_head_stride;
    float scale;
    int n_head;
    int group;  // query heads per kv head
    int n_tokens;
    int n_splits;
    float* part_o;  // [split][token][head][hd]
    float* part_m;  // [split][token][head]
    float* part_l;
};


// D = A B + D for one m16n8k16 tile (A row-major 16 x 16 fp16, B column-major 16 x 8 fp16, D 16 x 8 f32). Fragments
// (g = lane / 4, q = lane % 4): a[0] = A[g][2q, 2q+1], a[1] = A[g+8][2q..], a[2] = A[g][2q+8..], a[3] = A[g+8][2q+8..];
// b[0] = B[2q, 2q+1][g], b[1] = B[2q+8, 2q+9][g]; d[0], d[1] = D[g][2q, 2q+1], d[2], d[3] = D[g+8][2q, 2q+1].
// sm_75 has only m16n8k8 for fp16: two of them with the same fragments, k 0-7 (a[0], a[1], b[0]) then k 8-15 (a[2],
// a[3], b[1]); the sums are rounded to f32 after each 8 products, so they may differ from sm_80's in the last bits.
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b[0]));
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Four 8 x 8 fp16 matrices transposed from shared memory: lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __half* row) {
    const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

__device__ __forceinline__ uint32_t load_pair(const __half* p) {
    return *reinterpret_cast<const uint32_t*>(p);
}

// 16 consecutive values of a K or V row as fp16, from fp16 bits or int8 with the group's scale.
template <bool kInt8>
__device__ __forceinline__ void load_segment(const void* base, const uint16_t* scales, int64_t row, int hd, int d0,
                                             uint4 out[2]) {
    if constexpr (kInt8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const int8_t*>(base) + row * hd + d0);
        const float s = __half2float(__ushort_as_half(scales[row * (hd / kKvInt8Group) + d0 / kKvInt8Group]));
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        uint32_t h[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int8_t lo = static_cast<int8_t>((w[i / 2] >> (16 * (i % 2))) & 0xffu);
            const int8_t hi = static_cast<int8_t>((w[i / 2] >> (16 * (i % 2) + 8)) & 0xffu);
            const __half2 pair = __floats2half2_rn(s * static_cast<float>(lo), s * static_cast<float>(hi));
            h[i] = *reinterpret_cast<const uint32_t*>(&pair);
        }
        out[0] = make_uint4(h[0], h[1], h[2], h[3]);
        out[1] = make_uint4(h[4], h[5], h[6], h[7]);
    } else {
        const uint4* src = reinterpret_cast<const uint4*>(static_cast<const __half*>(base) + row * hd + d0);
        out[0] = src[0];
        out[1] = src[1];
    }
}

template <int HD, bool kInt8>
__global__ void __launch_bounds__(kThreads, 1) union_attention_kernel(const AttentionParams p) {
    constexpr int kRowHalves = HD + 8;
    constexpr int kDimTiles = HD / 16;
    extern __shared__ uint4 shared4[];
    uint8_t* shared = reinterpret_cast<uint8_t*>(shared4);
    const int G = p.group, R = G * static_cast<int>(kQsaUnionGroup);
    const SharedLayout layout = shared_layout(R, HD);
    float* s_s = reinterpret_cast<float*>(shared + layout.scores);
    float* m_s = reinterpret_cast<float*>(shared + layout.stats);
    float* l_s = m_s + R;
    float* alpha_s = l_s + R;
    int64_t* rows_s = reinterpret_cast<int64_t*>(shared + layout.rows);
    __half* q_s = reinterpret_cast<__half*>(shared + layout.q);
    __half* k_s = reinterpret_cast<__half*>(shared + layout.k);
    __half* v_s = reinterpret_cast<__half*>(shared + layout.v);
    __half* p_s = reinterpret_cast<__half*>(shared + layout.prob);
    uint8_t* mask_s = shared + layout.masks;

    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int lg = lane / 4, lq = lane % 4;  // fragment coordinates
    const int split = static_cast<int>(blockIdx.x), kvh = static_cast<int>(blockIdx.y);
    const int group = static_cast<int>(blockIdx.z);
    const int t0 = group * static_cast<int>(kQsaUnionGroup);
    const int np = min(static_cast<int>(kQsaUnionGroup), p.n_tokens - t0);
    const int64_t nkv = p.c.shape.n_head_kv;

    // Q of the group's rows as fp16 (rows of positions past the window's end stay 0; their masks are 0 too).
    for (int i = tid; i < R * HD; i += kThreads) {
        const int r = i / HD, d = i % HD, pos = r / G, g = r % G;
        float x = 0.0f;
        if (pos < np)
            x = p.q[static_cast<int64_t>(t0 + pos) * p.q_token_stride + static_cast<int64_t>(kvh * G + g) *
                                                                           p.q_head_stride + d];
        q_s[r * kRowHalves + d] = __float2half_rn(x);
    }
    for (int r = tid; r < R; r += kThreads) m_s[r] = -INFINITY, l_s[r] = 0.0f;

    const int out_tiles = kDimTiles * (R / 8);
    float acc[kMaxOutTilesPerWarp][4];
#pragma unroll
    for (int j = 0; j < kMaxOutTilesPerWarp; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    const int32_t n_union = p.n_union[group];
    const int32_t n_chunks = (n_union + kChunk - 1) / kChunk;
    const int32_t per_split = (n_chunks + p.n_splits - 1) / p.n_splits;
    const int32_t chunk_begin = min(n_chunks, split * per_split), chunk_end = min(n_chunks, chunk_begin + per_split);
    const int32_t* cells = p.union_cells + static_cast<int64_t>(group) * p.union_stride;
    const uint8_t* masks = p.union_masks + static_cast<int64_t>(group) * p.union_stride;
    const int64_t capacity = p.table.n_logical_pages * kKvPageCells;
    __syncthreads();

    for (int32_t chunk = chunk_begin; chunk < chunk_end; ++chunk) {
        // a. The chunk's cells: K/V row (or -1: past the union, or a page outside the table or the cache) and mask.
        if (tid < kChunk) {
            const int32_t idx = chunk * kChunk + tid;
            int64_t row = -1;
            uint8_t mask = 0;
            if (idx < n_union) {
                const int32_t cell = cells[idx];
                if (cell >= 0 && cell < capacity) {
                    const int32_t page = p.table.pages[cell / kKvPageCells];
                    if (page >= 0 && page < p.c.shape.n_pages) {
                        row = (static_cast<int64_t>(page) * nkv + kvh) * kKvPageCells + cell % kKvPageCells;
                        mask = masks[idx];
                    }
                }
            }
            rows_s[tid] = row;
            mask_s[tid] = mask;
        }
        __syncthreads();
        //    K and V rows in 16-value segments: consecutive threads take consecutive segments of a row.
        for (int task = tid; task < kChunk * (HD / 16); task += kThreads) {
            const int ci = task / (HD / 16), d0 = (task % (HD / 16)) * 16;
            const int64_t row = rows_s[ci];
            uint4 kh[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)}, vh[2] = {kh[0], kh[1]};
            if (row >= 0) {
                load_segment<kInt8>(p.c.k, p.c.k_scales, row, HD, d0, kh);
                load_segment<kInt8>(p.c.v, p.c.v_scales, row, HD, d0, vh);
            }
            uint4* kd = reinterpret_cast<uint4*>(k_s + ci * kRowHalves + d0);
            uint4* vd = reinterpret_cast<uint4*>(v_s + ci * kRowHalves + d0);
            kd[0] = kh[0], kd[1] = kh[1], vd[0] = vh[0], vd[1] = vh[1];
        }
        __syncthreads();

        // b. S^T = K Q^T: tile (cells 16 mt.., rows 8 nt..).
        for (int t = warp; t < 4 * (R / 8); t += kWarps) {
            const int mt = t % 4, nt = t / 4;
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const __half* a_row = k_s + (mt * 16 + lg) * kRowHalves + 2 * lq;
            const __half* b_row = q_s + (nt * 8 + lg) * kRowHalves + 2 * lq;
#pragma unroll 4
            for (int k0 = 0; k0 < HD; k0 += 16) {
                const uint32_t a[4] = {load_pair(a_row + k0), load_pair(a_row + 8 * kRowHalves + k0),
                                       load_pair(a_row + k0 + 8), load_pair(a_row + 8 * kRowHalves + k0 + 8)};
                const uint32_t b[2] = {load_pair(b_row + k0), load_pair(b_row + k0 + 8)};
                mma_16816(s, a, b);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int cell = mt * 16 + lg + (i / 2) * 8, r = nt * 8 + 2 * lq + i % 2;
                const bool chosen = (mask_s[cell] >> (r / G)) & 1u;
                s_s[r * kScoreStride + cell] = chosen ? s[i] * p.scale : -INFINITY;
            }
        }
        __syncthreads();

        // c. Online softmax, one warp per row.
        for (int r = warp; r < R; r += kWarps) {
            const float s0 = s_s[r * kScoreStride + lane], s1 = s_s[r * kScoreStride + lane + 32];
            const float m_old = m_s[r];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
            float alpha = 1.0f, p0 = 0.0f, p1 = 0.0f;
            if (m_new != -INFINITY) {
                alpha = expf(m_old - m_new);
                p0 = expf(s0 - m_new);
                p1 = expf(s1 - m_new);
            }
            const __half h0 = __float2half_rn(p0), h1 = __float2half_rn(p1);
            const float sum = warp_sum(__half2float(h0) + __half2float(h1));
            p_s[r * kProbStride + lane] = h0;
            p_s[r * kProbStride + lane + 32] = h1;
            if (lane == 0) {
                alpha_s[r] = alpha;
                m_s[r] = m_new;
                l_s[r] = l_s[r] * alpha + sum;
            }
        }
        __syncthreads();

        // d. O^T += V^T P^T: tile (dims 16 mt.., rows 8 nt..), k over the chunk's cells.
#pragma unroll
        for (int j = 0; j < kMaxOutTilesPerWarp; ++j) {
            const int t = warp + kWarps * j;
            if (t < out_tiles) {
                const int mt = t % kDimTiles, nt = t / kDimTiles;
                const int r0 = nt * 8 + 2 * lq;
                const float a0 = alpha_s[r0], a1 = alpha_s[r0 + 1];
                acc[j][0] *= a0, acc[j][1] *= a1, acc[j][2] *= a0, acc[j][3] *= a1;
                // ldmatrix.trans: matrix m of the four covers cells k0 + 8 (m / 2) .., dims mt * 16 + 8 (m % 2) ..
                const int m = lane / 8;
                const __half* v_row = v_s + (8 * (m / 2) + lane % 8) * kRowHalves + mt * 16 + 8 * (m % 2);
                const __half* b_row = p_s + (nt * 8 + lg) * kProbStride + 2 * lq;
#pragma unroll
                for (int k0 = 0; k0 < kChunk; k0 += 16) {
                    uint32_t a[4];
                    ldmatrix_x4_trans(a, v_row + k0 * kRowHalves);
                    const uint32_t b[2] = {load_pair(b_row + k0), load_pair(b_row + k0 + 8)};
                    mma_16816(acc[j], a, b);
                }
            }
        }
        __syncthreads();  // K, V, P and the masks are rewritten by the next chunk
    }

    // The split's partial results for the rows of real positions.
#pragma unroll
    for (int j = 0; j < kMaxOutTilesPerWarp; ++j) {
        const int t = warp + kWarps * j;
        if (t < out_tiles) {
            const int mt = t % kDimTiles, nt = t / kDimTiles;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int d = mt * 16 + lg + (i / 2) * 8, r = nt * 8 + 2 * lq + i % 2;
                const int pos = r / G;
                if (pos < np) {
                    const int64_t head = static_cast<int64_t>(kvh) * G + r % G;
                    const int64_t at = (static_cast<int64_t>(split) * p.n_tokens + t0 + pos) * p.n_head + head;
                    p.part_o[at * HD + d] = acc[j][i];
                }
            }
        }
    }
    for (int r = tid; r < R; r += kThreads) {
        const int pos = r / G;
        if (pos < np) {
            const int64_t head = static_cast<int64_t>(kvh) * G + r % G;
            const int64_t at = (static_cast<int64_t>(split) * p.n_tokens + t0 + pos) * p.n_head + head;
            p.part_m[at] = m_s[r];
            p.part_l[at] = l_s[r];
        }
    }
}

// ---- 3. the merge ---------------------------------------------------------------------------------------------------

struct MergeParams {
    const float* part_o;
    const float* part_m;
    const float* part_l;
    int n_splits, n_tokens, n_head, hd;
    const float* gate;
    int64_t gate_token_stride, gate_head_stride;
    float* out;
    int64_t out_token_stride;
};

// Block (position, head), one thread per dim: every thread walks the splits in the same order (the maxima and sums are
// broadcast reads), so the result does not depend on the launch.
__global__ void union_merge_kernel(const MergeParams p) {
    const int64_t token = blockIdx.x, head = blockIdx.y;
    const int d = static_cast<int>(threadIdx.x);
    float m = -INFINITY;
    for (int64_t s = 0; s < p.n_splits; ++s) m = fmaxf(m, p.part_m[(s * p.n_tokens + token) * p.n_head + head]);
    float l = 0.0f, o = 0.0f;
    if (m != -INFINITY)
        for (int64_t s = 0; s < p.n_splits; ++s) {
            const int64_t at = (s * p.n_tokens + token) * p.n_head + head;
            const float ms = p.part_m[at];
            if (ms == -INFINITY) continue;
            const float w = expf(ms - m);
            l = fmaf(p.part_l[at], w, l);
            o = fmaf(p.part_o[at * p.hd + d], w, o);
        }
    float r = l > 0.0f ? o / l : 0.0f;
    if (p.gate) r *= kernels::sigmoid(p.gate[token * p.gate_token_stride + head * p.gate_head_stride + d]);
    p.out[token * p.out_token_stride + head * p.hd + d] = r;
}

// ---- host side ------------------------------------------------------------------------------------------------------

constexpr size_t align256(size_t n) {
    return (n + 255) / 256 * 256;
}

struct WorkspaceLayout {
    size_t cells, masks, counts, part_o, part_m, part_l, total;
};
WorkspaceLayout workspace_layout(int64_t n_tokens, int64_t max_cells, int64_t n_head, int64_t hd, int64_t n_splits) {
    const size_t groups = static_cast<size_t>((n_tokens + kQsaUnionGroup - 1) / kQsaUnionGroup);
    const size_t stride = static_cast<size_t>(kQsaUnionGroup * max_cells);
    const size_t rows = static_cast<size_t>(n_splits * n_tokens * n_head);
    WorkspaceLayout w{};
    w.cells = 0;
    w.masks = w.cells + align256(groups * stride * 4);
    w.counts = w.masks + align256(groups * stride);
    w.part_o = w.counts + align256(groups * 4);
    w.part_m = w.part_o + align256(rows * static_cast<size_t>(hd) * 4);
    w.part_l = w.part_m + align256(rows * 4);
    w.total = w.part_l + align256(rows * 4);
    return w;
}

template <int HD, bool kInt8>
void launch_attention(const AttentionParams& p, dim3 grid, size_t shared, cudaStream_t stream) {
    // Raised once per kernel to the largest size asked for (an attribute, not a stream operation: fine in a capture).
    static size_t shared_set = 48 * 1024;
    if (shared > shared_set) {
        STRATA_CUDA_CHECK(cudaFuncSetAttribute(union_attention_kernel<HD, kInt8>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        shared_set = shared;
    }
    union_attention_kernel<HD, kInt8><<<grid, kThreads, shared, stream>>>(p);
    STRATA_CUDA_CHECK_LAUNCH("union_attention_kernel");
}

}  // namespace

std::string qsa_union_unsupported(const Context& ctx, const KvCacheShape& s, int64_t n_head) {
    if (!(s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256))
        return "head_dim " + std::to_string(s.head_dim) + " (the union kernel takes 64, 128 or 256)";
    if (s.n_head_kv <= 0 || n_head <= 0 || n_head % s.n_head_kv != 0)
        return std::to_string(n_head) + " query heads are no multiple of " + std::to_string(s.n_head_kv) +
               " kv heads";
    const int64_t group = n_head / s.n_head_kv, rows = group * kQsaUnionGroup;
    if ((s.head_dim / 16) * (rows / 8) > kWarps * kMaxOutTilesPerWarp)
        return std::to_string(group) + " query heads per kv head at head_dim " + std::to_string(s.head_dim) +
               " (the union kernel's registers hold at most " +
               std::to_string(kWarps * kMaxOutTilesPerWarp * 8 / (s.head_dim / 16) / kQsaUnionGroup) + ")";
    if (const size_t need = shared_layout(static_cast<int>(rows), static_cast<int>(s.head_dim)).total;
        need > ctx.info().max_shared_per_block)
        return std::to_string(group) + " query heads per kv head at head_dim " + std::to_string(s.head_dim) +
               " need " + std::to_string(need) + " bytes of shared memory; a thread block of " + ctx.info().name +
               " gets " + std::to_string(ctx.info().max_shared_per_block);
    return "";
}

size_t qsa_union_workspace_bytes(int64_t n_tokens, int64_t max_cells, int64_t n_head, int64_t head_dim,
                                 int64_t n_splits) {
    return workspace_layout(n_tokens, max_cells, n_head, head_dim, n_splits).total;
}

int64_t qsa_union_splits(const Context& ctx, int64_t n_tokens, int64_t n_head_kv, int64_t max_cells) {
    const int64_t groups = std::max<int64_t>(1, (n_tokens + kQsaUnionGroup - 1) / kQsaUnionGroup);
    const int64_t max_chunks = std::max<int64_t>(1, (kQsaUnionGroup * max_cells + kChunk - 1) / kChunk);
    const int64_t blocks = std::max<int64_t>(1, n_head_kv) * groups;
    const int64_t by_device = (static_cast<int64_t>(ctx.info().multiprocessors) + blocks - 1) / blocks;
    return std::clamp<int64_t>(by_device, 1, max_chunks);
}

void qsa_union_attention(Context& ctx, const QsaUnionAttentionArgs& a) {
    const KvCacheShape& s = a.cache.shape;
    if (const std::string why = qsa_union_unsupported(ctx, s, a.n_head); !why.empty())
        throw Error("CUDA qsa_union_attention: " + why);
    const bool int8 = s.storage == KvStorage::Int8;
    if (!a.cache.k || !a.cache.v || (int8 && (!a.cache.k_scales || !a.cache.v_scales)))
        throw Error("CUDA qsa_union_attention: the cache has no storage");
    if (!a.table.pages || a.table.n_logical_pages <= 0 || !a.n_cells || !a.cells || !a.n_selected || !a.q || !a.out)
        throw Error("CUDA qsa_union_attention: a null pointer among page table, n_cells, cells, n_selected, q, out");
    if (a.n_tokens < 0 || a.n_tokens > (int64_t{1} << 24))
        throw Error("CUDA qsa_union_attention: n_tokens must be in 0..2^24");
    if (a.max_cells <= 0 || a.max_cells > (int64_t{1} << 26))
        throw Error("CUDA qsa_union_attention: max_cells must be in 1..2^26");
    if (a.n_splits < 1 || a.n_splits > 65535) throw Error("CUDA qsa_union_attention: n_splits must be in 1..65535");
    const int64_t hd = s.head_dim;
    const int64_t cells_stride = a.cells_stride ? a.cells_stride : a.max_cells;
    const int64_t q_head_stride = a.q_head_stride ? a.q_head_stride : hd;
    const int64_t q_token_stride = a.q_token_stride ? a.q_token_stride : a.n_head * q_head_stride;
    const int64_t gate_head_stride = a.gate_head_stride ? a.gate_head_stride : hd;
    const int64_t gate_token_stride = a.gate_token_stride ? a.gate_token_stride : a.n_head * gate_head_stride;
    const int64_t out_token_stride = a.out_token_stride ? a.out_token_stride : a.n_head * hd;
    if (cells_stride < a.max_cells || q_head_stride < hd || gate_head_stride < hd || out_token_stride < a.n_head * hd)
        throw Error("CUDA qsa_union_attention: strides shorter than the rows they hold");
    const WorkspaceLayout w = workspace_layout(a.n_tokens, a.max_cells, a.n_head, hd, a.n_splits);
    if (!a.workspace || a.workspace_bytes < w.total)
        throw Error("CUDA qsa_union_attention: workspace of " + std::to_string(a.workspace_bytes) + " bytes, " +
                    std::to_string(w.total) + " needed");
    if (a.n_tokens == 0) return;
    STRATA_CUDA_CHECK(cudaSetDevice(ctx.info().index));
    cudaStream_t stream = ctx.stream().handle();
    auto* base = static_cast<uint8_t*>(a.workspace);
    const int64_t groups = (a.n_tokens + kQsaUnionGroup - 1) / kQsaUnionGroup;
    const int64_t union_stride = kQsaUnionGroup * a.max_cells;
    auto* union_cells = reinterpret_cast<int32_t*>(base + w.cells);
    auto* union_masks = base + w.masks;
    auto* n_union = reinterpret_cast<int32_t*>(base + w.counts);

    const UnionParams up{.n_cells = a.n_cells, .cells = a.cells, .cells_stride = cells_stride,
                         .n_selected = a.n_selected, .max_cells = a.max_cells,
                         .n_tokens = static_cast<int>(a.n_tokens),
                         .capacity = a.table.n_logical_pages * kKvPageCells, .union_cells = union_cells,
                         .union_masks = union_masks, .n_union = n_union, .union_stride = union_stride};
    union_kernel<<<static_cast<unsigned>(groups), kUnionThreads, 0, stream>>>(up);
    STRATA_CUDA_CHECK_LAUNCH("union_kernel");

    const int64_t group = a.n_head / s.n_head_kv;
    const AttentionParams ap{.c = a.cache, .table = a.table, .union_cells = union_cells, .union_masks = union_masks,
                             .n_union = n_union, .union_stride = union_stride, .q = a.q,
                             .q_token_stride = q_token_stride, .q_head_stride = q_head_stride, .scale = a.scale,
                             .n_head = static_cast<int>(a.n_head), .group = static_cast<int>(group),
                             .n_tokens = static_cast<int>(a.n_tokens), .n_splits = static_cast<int>(a.n_splits),
                             .part_o = reinterpret_cast<float*>(base + w.part_o),
                             .part_m = reinterpret_cast<float*>(base + w.part_m),
                             .part_l = reinterpret_cast<float*>(base + w.part_l)};
    const dim3 grid(static_cast<unsigned>(a.n_splits), static_cast<unsigned>(s.n_head_kv),
                    static_cast<unsigned>(groups));
    const size_t shared = shared_layout(static_cast<int>(group * kQsaUnionGroup), static_cast<int>(hd)).total;
    switch (hd) {
        case 64:
            int8 ? launch_attention<64, true>(ap, grid, shared, stream)
                 : launch_attention<64, false>(ap, grid, shared, stream);
            break;
        case 128:
            int8 ? launch_attention<128, true>(ap, grid, shared, stream)
                 : launch_attention<128, false>(ap, grid, shared, stream);
            break;
        default:
            int8 ? launch_attention<256, true>(ap, grid, shared, stream)
                 : launch_attention<256, false>(ap, grid, shared, stream);
            break;
    }

    const MergeParams mp{.part_o = ap.part_o, .part_m = ap.part_m, .part_l = ap.part_l,
                         .n_splits = static_cast<int>(a.n_splits), .n_tokens = static_cast<int>(a.n_tokens),
                         .n_head = static_cast<int>(a.n_head), .hd = static_cast<int>(hd), .gate = a.gate,
                         .gate_token_stride = gate_token_stride, .gate_head_stride = gate_head_stride, .out = a.out,
                         .out_token_stride = out_token_stride};
    union_merge_kernel<<<dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head)),
                         static_cast<unsigned>(hd), 0, stream>>>(mp);
    STRATA_CUDA_CHECK_LAUNCH("union_merge_kernel");
}

}  // namespace strata::cuda
