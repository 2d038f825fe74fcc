// Private to the CUDA backend: the tensor-core GEMM of the matmul's prompt path (more than kMaxMatvecTokens tokens)
// for every quant type, y[t][r] = sum_k w[r][k] * x[t][k]. Included by each family's .cu file, which instantiates it
// with its Format<T> (launch_gemm_basic / _kquant / _iq), so the codebooks in that file's __constant__ memory are in
// reach of the decoder.
//
// A block owns 128 weight rows x kTokens tokens (64 or 128) and walks k in tiles of 64:
//   weights:     each thread decodes 2 pieces (16 weights) of the 128 x 64 tile with Format<T>::decode straight from
//                global memory (no dequantized copy of the matrix anywhere) and stores them as fp16 in shared memory.
//                The next tile's blocks are prefetched into L1 before the tensor cores start on the current tile and
//                decoded after them: a decode right after its loads would stall every warp of the block on memory at
//                the same point (decode reads type-specific fields, so "load raw, decode later" has no generic form);
//   activations: fp16 (the Q8 activations the CPU multiplies with, d * q, times a power of two per token that keeps
//                them inside fp16's range), copied into shared memory with cp.async one tile ahead (sm_75: plain
//                loads and stores);
//   products:    mma.sync m16n8k16 (fp16 in, f32 sums; two m16n8k8 on sm_75): 8 warps, 4 along rows x 2 along
//                tokens, 32 rows x kTokens / 2 tokens each, operands read with ldmatrix from rows padded to 72 halves
//                (conflict-free).
// Split-K (blockIdx.z) gives each block a contiguous range of k tiles and writes its partial sums to its own slice of
// the output; the host adds the slices in a fixed order, so every run gives the same bits.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"
#include "backend/cuda/matvec_kernels.cuh"

namespace strata::cuda::kernels {

constexpr int kGemmRows = 128;
constexpr int kGemmTileK = 64;
constexpr int kGemmThreads = 256;
constexpr int kGemmStride = kGemmTileK + 8;  // halves per shared row: 144 bytes puts 8 ldmatrix rows in 8 bank groups
constexpr int kGemmPiecesPerRow = kGemmTileK / kPieceElems;
constexpr int kGemmPiecesPerThread = kGemmRows * kGemmPiecesPerRow / kGemmThreads;
static_assert(kGemmRows * kGemmPiecesPerRow % kGemmThreads == 0, "whole pieces per thread");
// Dynamic shared memory of a block of `tokens` tokens: two buffers each of weight and activation tiles (55,296 bytes at
// 64 tokens, 73,728 at 128: more than sm_75's 64 KB).
constexpr size_t gemm_shared_bytes(int tokens) {
    return size_t{2} * (kGemmRows + static_cast<size_t>(tokens)) * kGemmStride * sizeof(__half);
}

struct GemmParams {
    const uint8_t* w;
    size_t row_bytes;
    int64_t rows;
    int64_t in;
    int64_t tokens;
    const __half* x;           // [t * in + k]
    const float* token_scale;  // what token t's sums are multiplied by (undoes the fp16 range scaling)
    float* out;                // split s writes out[s * split_stride + t * ld_out + r]
    int64_t ld_out;
    int64_t split_stride;
    int64_t k_tiles_per_split;
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __half* p) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// d += a * b for one 16 x 8 x 16 step: a 16 x 16 (row-major), b 16 x 8 (column-major), f32 sums. sm_75 has only
// m16n8k8 for fp16: two of them, k 0-7 (a[0], a[1], b0: the same fragment layout) then k 8-15 (a[2], a[3], b1). Its
// sums are rounded to f32 after each 8 products, so they may differ from sm_80's in the last bits.
__device__ __forceinline__ void mma_16x8x16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 16 bytes global -> shared without a register stop; zero-filled when `valid` is false (src is then not read). sm_75
// has no cp.async: a plain load (L2 only, as .cg) and store into the same place, done when the call returns, so
// committing and waiting have nothing to do there.
__device__ __forceinline__ void copy_16_async(__half* dst, const __half* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    *reinterpret_cast<uint4*>(dst) = valid ? __ldcg(reinterpret_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
#else
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void commit_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
__device__ __forceinline__ void wait_async_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#else
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void prefetch_l1(const void* p) {
    asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p));
}

// Byte k of v as a signed integer in a float, exactly and without I2F (a quarter-rate instruction, 16 of them per
// piece): with the sign bit flipped the byte is q + 128, which as the low mantissa bits of 2^23 gives 2^23 + q + 128.
template <int k>
__device__ __forceinline__ float signed_byte_as_float(uint32_t sign_flipped) {
    return __int_as_float(static_cast<int>(__byte_perm(sign_flipped, 0x4B000000u, 0x7440u | k))) - 8388736.0f;
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) {
    return *reinterpret_cast<uint32_t*>(&h);
}

// The main loop of one block: weight rows row0 .. row0 + 127 of w (rows in all, row_bytes apart) times the kTokens
// activation rows that x_row(t) names (-1: zeros; row r starts at x + r * in), over k tiles [kt_begin, kt_end), summed
// into acc. Shared by the plain GEMM and the grouped expert GEMM: only where rows come from and go to differs.
template <typename F, int kTokens, typename XRow>
__device__ __forceinline__ void gemm_block_loop(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t in,
                                                const __half* x, int64_t row0, int64_t kt_begin, int64_t kt_end,
                                                XRow x_row, float (&acc)[2][kTokens / 16][4]) {
    static_assert(!F::kIsFloat, "float weights take the f32 GEMM path");
    constexpr int kWarpTokens = kTokens / 2, kTokenFrags = kWarpTokens / 8, kRowFrags = 2;
    static_assert(kTokenFrags % 2 == 0, "token fragments are read in pairs");
    extern __shared__ uint4 gemm_shared[];
    __half* const w_tiles = reinterpret_cast<__half*>(gemm_shared);     // [2][kGemmRows][kGemmStride]
    __half* const x_tiles = w_tiles + 2 * kGemmRows * kGemmStride;       // [2][kTokens][kGemmStride]

    const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
    const int warp_row = (warp % 4) * 32, warp_tok = (warp / 4) * kWarpTokens;

    // Asks for the cache lines of the blocks under this thread's pieces of weight tile kt (once per block and tile:
    // the first piece of a block, or of the row in this tile for blocks longer than a tile).
    auto prefetch_tile = [&](int64_t kt) {
#pragma unroll
        for (int i = 0; i < kGemmPiecesPerThread; ++i) {
            const int piece = tid + i * kGemmThreads;
            const int64_t row = row0 + piece / kGemmPiecesPerRow;
            const int64_t e0 = kt * kGemmTileK + (piece % kGemmPiecesPerRow) * kPieceElems;
            if (row >= rows || e0 >= in || (e0 % F::kBlockElems != 0 && piece % kGemmPiecesPerRow != 0)) continue;
            const uint8_t* blk = w + row * row_bytes + (e0 / F::kBlockElems) * F::kBlockBytes;
            prefetch_l1(blk);
            if constexpr (F::kBlockBytes > 128) prefetch_l1(blk + 128);
            static_assert(F::kBlockBytes <= 256, "three lines cover a block");
            prefetch_l1(blk + F::kBlockBytes - 1);
        }
    };
    QuantPiece next[kGemmPiecesPerThread];
    // Reads and decodes this thread's pieces of weight tile kt (zeros past the rows or the row's end).
    auto decode_tile = [&](int64_t kt) {
#pragma unroll
        for (int i = 0; i < kGemmPiecesPerThread; ++i) {
            const int piece = tid + i * kGemmThreads;  // consecutive threads: consecutive pieces of a row
            const int64_t row = row0 + piece / kGemmPiecesPerRow;
            const int64_t e0 = kt * kGemmTileK + (piece % kGemmPiecesPerRow) * kPieceElems;
            if (row < rows && e0 < in) {
                const uint8_t* blk = w + row * row_bytes + (e0 / F::kBlockElems) * F::kBlockBytes;
                next[i] = F::decode(blk, static_cast<int>((e0 % F::kBlockElems) / kPieceElems));
            } else {
                next[i] = QuantPiece{{0, 0, 0, 0}, 0.0f, 0.0f};
            }
        }
    };
    // The decoded pieces as fp16 weights scale * q + offset in buffer `buf`.
    auto store_tile = [&](int buf) {
#pragma unroll
        for (int i = 0; i < kGemmPiecesPerThread; ++i) {
            const int piece = tid + i * kGemmThreads;
            const QuantPiece& wp = next[i];
            uint32_t h[8];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint32_t v = static_cast<uint32_t>(wp.q[k]) ^ 0x80808080u;
                const float b0 = signed_byte_as_float<0>(v), b1 = signed_byte_as_float<1>(v);
                const float b2 = signed_byte_as_float<2>(v), b3 = signed_byte_as_float<3>(v);
                h[2 * k] = half2_bits(__floats2half2_rn(fmaf(wp.scale, b0, wp.offset), fmaf(wp.scale, b1, wp.offset)));
                h[2 * k + 1] = half2_bits(__floats2half2_rn(fmaf(wp.scale, b2, wp.offset), fmaf(wp.scale, b3, wp.offset)));
            }
            uint4* dst = reinterpret_cast<uint4*>(w_tiles + (buf * kGemmRows + piece / kGemmPiecesPerRow) * kGemmStride +
                                                  (piece % kGemmPiecesPerRow) * kPieceElems);
            dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
            dst[1] = make_uint4(h[4], h[5], h[6], h[7]);
        }
    };
    // Activation tile kt into buffer `buf`, 16 bytes (8 values) per copy (zeros past the tokens or the row's end).
    auto load_x_tile = [&](int64_t kt, int buf) {
        constexpr int kChunksPerRow = kGemmTileK / 8, kChunks = kTokens * kChunksPerRow;
#pragma unroll
        for (int c = tid; c < kChunks; c += kGemmThreads) {
            const int t = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
            const int64_t xr = x_row(t), k = kt * kGemmTileK + kc;
            const bool valid = xr >= 0 && k < in;
            copy_16_async(x_tiles + (buf * kTokens + t) * kGemmStride + kc, valid ? x + xr * in + k : x, valid);
        }
        commit_async();
    };

#pragma unroll
    for (int m = 0; m < kRowFrags; ++m)
#pragma unroll
        for (int n = 0; n < kTokenFrags; ++n)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[m][n][j] = 0.0f;

    if (kt_begin < kt_end) {
        load_x_tile(kt_begin, 0);
        decode_tile(kt_begin);
        store_tile(0);
        wait_async_all();
        __syncthreads();
    }
    for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
        const int cur = static_cast<int>((kt - kt_begin) & 1);
        const bool more = kt + 1 < kt_end;
        if (more) {
            load_x_tile(kt + 1, cur ^ 1);
            prefetch_tile(kt + 1);  // in flight during the products below
        }
        const __half* wt = w_tiles + cur * kGemmRows * kGemmStride;
        const __half* xt = x_tiles + cur * kTokens * kGemmStride;
#pragma unroll
        for (int kk = 0; kk < kGemmTileK; kk += 16) {
            // A: lanes 0-15 give rows 0-15 at k, lanes 16-31 the same rows at k + 8 (fragments a0..a3 in order).
            uint32_t a[kRowFrags][4];
#pragma unroll
            for (int m = 0; m < kRowFrags; ++m)
                ldmatrix_x4(a[m], wt + (warp_row + m * 16 + lane % 16) * kGemmStride + kk + (lane / 16) * 8);
#pragma unroll
            for (int n2 = 0; n2 < kTokenFrags / 2; ++n2) {
                // B, two 8-token fragments: lanes 0-7 tokens 0-7 at k, 8-15 the same at k + 8, 16-31 tokens 8-15.
                uint32_t b[4];
                ldmatrix_x4(b, xt + (warp_tok + n2 * 16 + lane % 8 + (lane / 16) * 8) * kGemmStride + kk +
                                   ((lane / 8) % 2) * 8);
#pragma unroll
                for (int m = 0; m < kRowFrags; ++m) {
                    mma_16x8x16(acc[m][2 * n2], a[m], b[0], b[1]);
                    mma_16x8x16(acc[m][2 * n2 + 1], a[m], b[2], b[3]);
                }
            }
        }
        if (more) {
            decode_tile(kt + 1);
            store_tile(cur ^ 1);  // that buffer was last read before the barrier that ended the previous tile
        }
        wait_async_all();
        __syncthreads();
    }
}

// Calls store(r, t, value) for each of this thread's sums in acc: fragment element j of (m, n) is row g (+8 for
// j >= 2), token 2c + (j % 2) of the block's tile, with g = lane / 4 and c = lane % 4 (r relative to row0).
template <int kTokens, typename Store>
__device__ __forceinline__ void gemm_block_store(const float (&acc)[2][kTokens / 16][4], Store store) {
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
    const int warp_row = (warp % 4) * 32, warp_tok = (warp / 4) * (kTokens / 2);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int n = 0; n < kTokens / 16; ++n)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                store(warp_row + m * 16 + lane / 4 + (j / 2) * 8, warp_tok + n * 8 + (lane % 4) * 2 + j % 2,
                      acc[m][n][j]);
}

template <typename F, int kTokens>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_tensor_core_kernel(const GemmParams p) {
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kGemmRows;
    const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kTokens;
    const int64_t k_tiles = (p.in + kGemmTileK - 1) / kGemmTileK;
    const int64_t kt_begin = static_cast<int64_t>(blockIdx.z) * p.k_tiles_per_split;
    const int64_t kt_end = min(k_tiles, kt_begin + p.k_tiles_per_split);
    float acc[2][kTokens / 16][4];
    gemm_block_loop<F, kTokens>(
        p.w, p.row_bytes, p.rows, p.in, p.x, row0, kt_begin, kt_end,
        [&](int t) { return tok0 + t < p.tokens ? tok0 + t : int64_t{-1}; }, acc);
    float* out = p.out + static_cast<int64_t>(blockIdx.z) * p.split_stride;
    gemm_block_store<kTokens>(acc, [&](int r_in, int t_in, float v) {
        const int64_t r = row0 + r_in, t = tok0 + t_in;
        if (r < p.rows && t < p.tokens) out[t * p.ld_out + r] = v * p.token_scale[t];
    });
}

// The grouped expert GEMM (moe_prompt.cu): block (x, y) multiplies row tile x % row_tiles of matrix x / row_tiles
// (gate and up: two; down: one) of expert tile_expert[y] by the tile's pairs, sorted_pairs[tile_begin[y] ..
// + tile_count[y]), whose activation rows are pair / x_div (the token for gate and up, the pair for down), and
// writes pair p's sums to out[mat][p * ld_out + r]. Block y takes tile *tile_first + y; tiles from *tile_end on (the
// grid is sized for the most there can be) return at once, so one launch can cover a range of experts' tiles.
struct GroupedGemmParams {
    const uint8_t* w[2];          // expert 0's slice of each matrix (experts expert_bytes apart), or
    const uint8_t* const* at[2];  // per-expert addresses (experts in host RAM: a VRAM slot or mapped host pages)
    size_t expert_bytes;
    size_t row_bytes;
    int64_t rows;
    int64_t in;
    int row_tiles;
    const __half* x;      // [x row][in]
    const float* x_scale;  // what x row r's sums are multiplied by
    int x_div;
    const int32_t* tile_first;
    const int32_t* tile_end;
    const int32_t* tile_expert;
    const int32_t* tile_begin;
    const int32_t* tile_count;
    const int32_t* sorted_pairs;
    float* out[2];
    int64_t ld_out;
};

template <typename F, int kTokens>
__global__ void __launch_bounds__(kGemmThreads, 2) gemm_grouped_kernel(const GroupedGemmParams p) {
    __shared__ int32_t pairs[kTokens];
    const int tile = *p.tile_first + static_cast<int>(blockIdx.y);
    if (tile >= *p.tile_end) return;
    const int mat = static_cast<int>(blockIdx.x) / p.row_tiles;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x % p.row_tiles) * kGemmRows;
    const int expert = p.tile_expert[tile], count = p.tile_count[tile];
    static_assert(kTokens <= kGemmThreads);
    if (threadIdx.x < kTokens)
        pairs[threadIdx.x] = static_cast<int>(threadIdx.x) < count ? p.sorted_pairs[p.tile_begin[tile] + threadIdx.x] : -1;
    __syncthreads();
    const uint8_t* w = p.at[mat] ? p.at[mat][expert] : p.w[mat] + static_cast<size_t>(expert) * p.expert_bytes;
    const int64_t k_tiles = (p.in + kGemmTileK - 1) / kGemmTileK;
    float acc[2][kTokens / 16][4];
    gemm_block_loop<F, kTokens>(
        w, p.row_bytes, p.rows, p.in, p.x, row0, 0, k_tiles,
        [&](int t) { return pairs[t] >= 0 ? static_cast<int64_t>(pairs[t] / p.x_div) : int64_t{-1}; }, acc);
    float* out = p.out[mat];
    gemm_block_store<kTokens>(acc, [&](int r_in, int t_in, float v) {
        const int64_t r = row0 + r_in;
        const int pair = pairs[t_in];
        if (r < p.rows && pair >= 0) out[pair * p.ld_out + r] = v * p.x_scale[pair / p.x_div];
    });
}

template <typename F, int kTokens>
void launch_grouped_gemm_tiles(const GroupedGemmLaunch& l) {
    constexpr size_t kSharedBytes = gemm_shared_bytes(kTokens);
    auto* kernel = gemm_grouped_kernel<F, kTokens>;
    STRATA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSharedBytes)));
    const int row_tiles = static_cast<int>((l.rows + kGemmRows - 1) / kGemmRows);
    GroupedGemmParams p{.w = {l.w[0], l.w[1]}, .at = {l.at[0], l.at[1]}, .expert_bytes = l.expert_bytes,
                        .row_bytes = l.row_bytes, .rows = l.rows, .in = l.in, .row_tiles = row_tiles, .x = l.x,
                        .x_scale = l.x_scale, .x_div = l.x_div, .tile_first = l.tile_first, .tile_end = l.tile_end,
                        .tile_expert = l.tile_expert,
                        .tile_begin = l.tile_begin, .tile_count = l.tile_count, .sorted_pairs = l.sorted_pairs,
                        .out = {l.out[0], l.out[1]}, .ld_out = l.ld_out};
    const dim3 grid(static_cast<unsigned>(row_tiles * l.n_mats), static_cast<unsigned>(l.max_tiles));
    kernel<<<grid, kGemmThreads, kSharedBytes, l.stream>>>(p);
    STRATA_CUDA_CHECK_LAUNCH("gemm_grouped_kernel");
}

template <typename F>
void launch_grouped_gemm_typed(const GroupedGemmLaunch& l) {
    STRATA_ASSERT(l.in % kPieceElems == 0 && l.in % F::kBlockElems == 0);
    if (l.tile_tokens == kGroupedGemmWideTokens)
        launch_grouped_gemm_tiles<F, kGroupedGemmWideTokens>(l);
    else
        launch_grouped_gemm_tiles<F, kGroupedGemmTokens>(l);
}

template <typename F, int kTokens>
void launch_gemm_tiles(const GemmLaunch& l) {
    constexpr size_t kSharedBytes = gemm_shared_bytes(kTokens);
    auto* kernel = gemm_tensor_core_kernel<F, kTokens>;
    // Over the 48 KB a launch gets without asking; set per call (cheap) so that every device of the process has it.
    STRATA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSharedBytes)));
    const bool split = l.splits > 1;
    const GemmParams p{.w = l.w, .row_bytes = l.row_bytes, .rows = l.rows, .in = l.in, .tokens = l.n_tokens,
                       .x = l.x, .token_scale = l.token_scale, .out = split ? l.partials : l.y,
                       .ld_out = split ? l.rows : l.ldy, .split_stride = split ? l.rows * l.n_tokens : 0,
                       .k_tiles_per_split = l.k_tiles_per_split};
    const dim3 grid(static_cast<unsigned>((l.rows + kGemmRows - 1) / kGemmRows),
                    static_cast<unsigned>((l.n_tokens + kTokens - 1) / kTokens), static_cast<unsigned>(l.splits));
    kernel<<<grid, kGemmThreads, kSharedBytes, l.stream>>>(p);
    STRATA_CUDA_CHECK_LAUNCH("gemm_tensor_core_kernel");
}

template <typename F>
void launch_gemm_typed(const GemmLaunch& l) {
    STRATA_ASSERT(l.in % kPieceElems == 0 && l.in % F::kBlockElems == 0);
    if (l.tile_tokens == 128)
        launch_gemm_tiles<F, 128>(l);
    else
        launch_gemm_tiles<F, 64>(l);
}

}  // namespace strata::cuda::kernels
