// Private to the CUDA backend: the matrix-vector kernel shared by every weight type, and the dequantize kernel of the
// GEMM path. A weight type plugs in through a Format<type> specialization (in the family's .cu file) that says how
// big its blocks are and decodes 16 consecutive weights of a block ("a piece"):
//   quant types: 16 signed 8-bit integers q with w_i = scale * q_i + offset, so the dot with 8-bit activations is
//                four dp4a per piece and token;
//   float types: 16 floats.
//
// The matvec kernel (MMVQ style): each warp owns kRows weight rows (2 up to 4 tokens, else 1) and walks them in
// chunks of 32 * kPiecesPerLane pieces. A chunk's bytes are copied into the warp's shared memory with 16-byte loads
// from the 16-byte granules that cover it (all coalesced, whatever the block size, which is rarely a multiple of 16),
// the next chunk's loads are issued before the current chunk is decoded, and each lane then decodes its pieces from
// shared memory against the activations of every token. Partial sums per (row, token) are reduced across the warp
// with shuffles; matrices with few rows split each row over 2 or 4 warps of a block, whose sums meet in shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/internal.h"
#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda::kernels {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kPieceElems = 16;
// Pieces per lane and chunk for quant types: 2 (1,024 weights a chunk) measured as fast as or faster than 4 on the
// H200 at decode shapes (bench/NOTES.md, 2026-11-30).
constexpr int kQuantPiecesPerLane = 2;

// Programmatic dependent launch (sm_90+), built with -DSTRATA_CUDA_PDL: the matvec kernel may start while the kernel
// before it (the activation quantizer) still runs; it issues its first weight loads, which depend on nothing computed
// on the device, and waits for the previous kernel's results only before it reads activations or writes outputs.
// Off by default: inside the decode graph it measured +1.3% (session 6) and +0.4% (session 8, with the quantizers
// triggering early) on Flash-Next (bench/NOTES.md). The wait and the trigger are no-ops for a kernel launched without.
#if defined(STRATA_CUDA_PDL)
constexpr bool kUseProgrammaticLaunch = true;
#else
constexpr bool kUseProgrammaticLaunch = false;
#endif

// Waits until the grid this one depends on has finished and its writes are visible (a no-op without PDL).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next kernel on the stream launch now (it still waits for this grid before it reads what this one writes).
__device__ __forceinline__ void allow_next_grid_to_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

template <DType T>
struct Format;  // specialized per weight type in the family files

// 16 weights as 8-bit integers (byte k of q[j] is weight 4j + k): w = scale * q + offset.
struct QuantPiece {
    int q[4];
    float scale;
    float offset;
};

// ---- unaligned little-endian reads ----------------------------------------------------------------------------------
// Every block size and every field that is read 16 bits at a time sits at an even offset, and rows start at even
// addresses, so 16-bit reads are always aligned; wider values are put together from them.

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) {
    return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) {
    return load_u16(p) | (load_u16(p + 2) << 16);
}
__device__ __forceinline__ void load_16_bytes(const uint8_t* p, uint32_t v[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = load_u32(p + 4 * k);
}
__device__ __forceinline__ float load_f16(const uint8_t* p) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(load_u16(p))));
}

// ---- byte tricks ----------------------------------------------------------------------------------------------------

// The 7 stored sign bits of a group of 8 with the parity bit that makes the count of minus signs even.
__device__ __forceinline__ uint32_t even_signs(uint32_t seven_bits) {
    return seven_bits | ((__popc(seven_bits) & 1u) << 7);
}
// Negates byte k of v where bit k of four_bits is set (values < 128, so the result is a valid int8).
__device__ __forceinline__ int apply_signs(uint32_t v, uint32_t four_bits) {
    const uint32_t minus = __vcmpne4((four_bits * 0x01010101u) & 0x08040201u, 0u);  // 0xff per negative byte
    return static_cast<int>(__vsub4(v ^ minus, minus));
}

// ---- the matvec kernel ----------------------------------------------------------------------------------------------

struct MatvecParams {
    MatvecSegment segment[kMaxMatvecSegments];
    int64_t first_block[kMaxMatvecSegments];  // blockIdx.x where each segment starts
    int n_segments;
    int64_t in;
    QuantizedActivations act;
    const float* x;
    float* y;
    int warps_per_row;  // 1, 2 or 4: the warps of a block that share a row, each taking every n-th chunk
    ExpertGather gather;  // MoE: blockIdx.y is the pair (see internal.h)
};


template <typename F>
struct ChunkShape {
    static constexpr int kPieces = kWarpSize * F::kPiecesPerLane;
    static constexpr int kElems = kPieces * kPieceElems;
    static constexpr int kBlocks = kElems / F::kBlockElems;
    static_assert(kElems % F::kBlockElems == 0, "a chunk holds whole blocks");
    // A chunk's bytes start anywhere in a granule: one granule more than its size needs.
    static constexpr int kGranules = (kBlocks * F::kBlockBytes + 15) / 16 + 1;
    static constexpr int kGranulesPerLane = (kGranules + kWarpSize - 1) / kWarpSize;
};

// The explicit minimum of 1 block per SM lets ptxas use more registers (~120 instead of ~80 at 8 tokens): 8 tokens
// then ran up to 2x faster on the H200 (bench/NOTES.md).
template <typename F, int kTokens, int kRows>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize, 1) matvec_kernel(const MatvecParams p) {
    using Shape = ChunkShape<F>;
    constexpr int kG = Shape::kGranulesPerLane;
    __shared__ uint4 stage[kWarpsPerBlock][kRows][kG * kWarpSize];

    const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
    const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
    // Warps split <row group, part>: part k of a group takes chunks k, k + split, ...; partial sums meet in shared
    // memory at the end (in a fixed order, so results do not depend on timing).
    const int split = p.warps_per_row;
    const int part = warp % split;
    int s = 0;  // this block's segment (block-uniform)
    while (s + 1 < p.n_segments && static_cast<int64_t>(blockIdx.x) >= p.first_block[s + 1]) ++s;
    const MatvecSegment seg = p.segment[s];
    const int64_t block = static_cast<int64_t>(blockIdx.x) - p.first_block[s];
    const int64_t row0 = (block * (kWarpsPerBlock / split) + warp / split) * kRows;
    const bool active = row0 < seg.rows;  // no early return: the block synchronizes below when split > 1

    // The weights, activations and outputs of this launch, or with an expert gather those of pair blockIdx.y.
    const uint8_t* w_base = seg.w;
    QuantizedActivations act = p.act;
    const float* x_base = p.x;
    float* y_base = seg.y;
    if (p.gather.ids) {
        wait_for_previous_grid();  // the expert ids come from the kernel before
        const int64_t pair = blockIdx.y;
        int64_t slot = pair;
        if (p.gather.second_from > 0 && pair >= p.gather.second_from) {
            slot = pair - p.gather.second_from;
            w_base += p.gather.second_offset;
        }
        const int64_t act_row = slot / p.gather.pairs_per_act_row;
        w_base += static_cast<size_t>(p.gather.ids[slot]) * p.gather.expert_bytes;
        if (act.q) {
            act.q += act_row * p.in;
            act.d += act_row * (p.in / 32);
            if (act.s16) act.s16 += act_row * (p.in / 16);
        }
        if (x_base) x_base += act_row * p.in;
        y_base += pair * seg.rows;
    }

    const int64_t in = p.in;
    const int64_t blocks_per_row = in / F::kBlockElems;
    const int64_t n_chunks = (blocks_per_row + Shape::kBlocks - 1) / Shape::kBlocks;

    uint4 next[kRows][kG];
    int next_shift[kRows];
    // Issues the 16-byte loads of chunk c of every row this warp owns (granules past the chunk stay unloaded).
    auto load_chunk = [&](int64_t c) {
        const int64_t b0 = c * Shape::kBlocks;
        const int64_t nb = min(blocks_per_row - b0, static_cast<int64_t>(Shape::kBlocks));
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            next_shift[r] = 0;
            if (row0 + r >= seg.rows) continue;
            const uintptr_t start =
                reinterpret_cast<uintptr_t>(w_base + (row0 + r) * seg.row_bytes + b0 * F::kBlockBytes);
            const uintptr_t base = start & ~uintptr_t{15};
            const int n_granules = static_cast<int>((start + nb * F::kBlockBytes - base + 15) / 16);
            next_shift[r] = static_cast<int>(start - base);
            const uint4* src = reinterpret_cast<const uint4*>(base);
#pragma unroll
            for (int g = 0; g < kG; ++g) {
                const int idx = lane + g * kWarpSize;
                if (idx < n_granules) next[r][g] = __ldg(src + idx);
            }
        }
    };

    float acc[kRows][kTokens];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[r][t] = 0.0f;

    if (active && part < n_chunks) load_chunk(part);
    wait_for_previous_grid();  // activations and outputs only from here on
    for (int64_t c = part; active && c < n_chunks; c += split) {
        int shift[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            shift[r] = next_shift[r];
#pragma unroll
            for (int g = 0; g < kG; ++g) stage[warp][r][lane + g * kWarpSize] = next[r][g];
        }
        __syncwarp();
        if (c + split < n_chunks) load_chunk(c + split);  // in flight while this chunk is decoded

#pragma unroll
        for (int k = 0; k < F::kPiecesPerLane; ++k) {
            const int piece = lane + k * kWarpSize;
            const int64_t e0 = c * Shape::kElems + piece * kPieceElems;
            if (e0 >= in) continue;
            const int block = piece * kPieceElems / F::kBlockElems;
            const int piece_in_block = (piece * kPieceElems % F::kBlockElems) / kPieceElems;
            if constexpr (F::kIsFloat) {
                // Rows first, then one token's 16 activations at a time: keeps registers at 16 * (kRows + 1).
                float wv[kRows][kPieceElems];
#pragma unroll
                for (int r = 0; r < kRows; ++r)
                    F::decode(reinterpret_cast<const uint8_t*>(stage[warp][r]) + shift[r] + block * F::kBlockBytes,
                              piece_in_block, wv[r]);
#pragma unroll
                for (int t = 0; t < kTokens; ++t) {
                    const float4* xp = reinterpret_cast<const float4*>(x_base + t * in + e0);
                    float xs[kPieceElems];
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 v = __ldg(xp + j);
                        xs[4 * j] = v.x;
                        xs[4 * j + 1] = v.y;
                        xs[4 * j + 2] = v.z;
                        xs[4 * j + 3] = v.w;
                    }
#pragma unroll
                    for (int r = 0; r < kRows; ++r) {
                        float s = 0.0f;
#pragma unroll
                        for (int i = 0; i < kPieceElems; ++i) s = fmaf(wv[r][i], xs[i], s);
                        acc[r][t] += s;
                    }
                }
            } else {
                int4 aq[kTokens];
                float ad[kTokens], as[kTokens];
#pragma unroll
                for (int t = 0; t < kTokens; ++t) {
                    aq[t] = __ldg(reinterpret_cast<const int4*>(act.q + t * in + e0));
                    ad[t] = __ldg(act.d + t * (in / 32) + e0 / 32);
                    if constexpr (F::kHasOffset) as[t] = __ldg(act.s16 + t * (in / 16) + e0 / 16);
                }
#pragma unroll
                for (int r = 0; r < kRows; ++r) {
                    const uint8_t* blk = reinterpret_cast<const uint8_t*>(stage[warp][r]) + shift[r] +
                                         block * F::kBlockBytes;
                    const QuantPiece wp = F::decode(blk, piece_in_block);
#pragma unroll
                    for (int t = 0; t < kTokens; ++t) {
                        int sumi = __dp4a(wp.q[0], aq[t].x, 0);
                        sumi = __dp4a(wp.q[1], aq[t].y, sumi);
                        sumi = __dp4a(wp.q[2], aq[t].z, sumi);
                        sumi = __dp4a(wp.q[3], aq[t].w, sumi);
                        acc[r][t] += ad[t] * (wp.scale * static_cast<float>(sumi));
                        if constexpr (F::kHasOffset) acc[r][t] += wp.offset * as[t];
                    }
                }
            }
        }
        __syncwarp();  // the stage is overwritten by the next chunk
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[r][t] = warp_sum(acc[r][t]);
    if (split > 1) {
        __shared__ float partial[kWarpsPerBlock][kRows][kTokens];
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < kRows; ++r)
#pragma unroll
                for (int t = 0; t < kTokens; ++t) partial[warp][r][t] = acc[r][t];
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int t = 0; t < kTokens; ++t) {
                float sum = partial[warp][r][t];
                for (int k = 1; k < split; ++k) sum += partial[warp + k][r][t];
                acc[r][t] = sum;
            }
    }
    if (!active) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int t = 0; t < kTokens; ++t)
            if (lane == t && row0 + r < seg.rows) y_base[t * seg.rows + row0 + r] = acc[r][t];
    }
}

template <typename F, int kTokens>
void launch_matvec_tokens(const MatvecLaunch& l) {
    // Two rows per warp keep more loads in flight for small batches; at 5..8 tokens one row keeps the accumulators
    // and activation registers from spilling.
    constexpr int kRows = kTokens <= 4 ? 2 : 1;
    // A decode matrix of a few thousand rows gives too few warps to keep enough loads in flight on a large GPU
    // (H200: ~30 KB per SM): rows are then split over 2 or 4 warps. The choice depends on the shape only, never on
    // the token count, so a token's sum is formed in the same order whatever the batch.
    // 4,096 row parts (~16 warps per SM on an H200 at 2 rows a warp) measured faster than 8,192 (more, shorter
    // warps than fit at once).
    // An expert gather multiplies the rows by the pairs of each token (top-k, twice for stacked gate and up): counted
    // per token, never per launch, so the order of a token's sums still does not depend on the batch.
    constexpr int64_t kTargetRowParts = 4096;
    const int64_t n_chunks = (l.in / F::kBlockElems + ChunkShape<F>::kBlocks - 1) / ChunkShape<F>::kBlocks;
    // Segments count together: the split depends on the launch's rows, fixed by the shape, never by the tokens.
    STRATA_ASSERT(l.n_more >= 0 && l.n_more < kMaxMatvecSegments && (l.n_more == 0 || !l.gather.ids));
    int64_t rows_per_token =
        l.gather.ids ? l.rows * l.gather.pairs_per_act_row * (l.gather.second_from > 0 ? 2 : 1) : l.rows;
    for (int i = 0; i < l.n_more; ++i) rows_per_token += l.more[i].rows;
    int split = 1;
    while (split < kWarpsPerBlock && rows_per_token * split < kTargetRowParts && split * 2 <= n_chunks) split *= 2;
    const int64_t rows_per_block = kWarpsPerBlock / split * kRows;
    MatvecParams p{.segment = {}, .first_block = {}, .n_segments = 1 + l.n_more, .in = l.in, .act = l.act, .x = l.x,
                   .warps_per_row = split, .gather = l.gather};
    p.segment[0] = {.w = l.w, .row_bytes = l.row_bytes, .rows = l.rows, .y = l.y};
    for (int i = 0; i < l.n_more; ++i) p.segment[i + 1] = l.more[i];
    int64_t blocks = 0;
    for (int i = 0; i < p.n_segments; ++i) {
        p.first_block[i] = blocks;
        blocks += (p.segment[i].rows + rows_per_block - 1) / rows_per_block;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(blocks), l.gather.ids ? static_cast<unsigned>(l.gather.n_pairs) : 1u);
    config.blockDim = dim3(kWarpsPerBlock * kWarpSize);
    config.stream = l.stream;
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = kUseProgrammaticLaunch ? 1 : 0;
    config.attrs = &attribute;
    config.numAttrs = 1;
    STRATA_CUDA_CHECK(cudaLaunchKernelEx(&config, matvec_kernel<F, kTokens, kRows>, p));
}

template <typename F>
void launch_matvec_typed(const MatvecLaunch& l) {
    switch (l.n_tokens) {
        case 1: return launch_matvec_tokens<F, 1>(l);
        case 2: return launch_matvec_tokens<F, 2>(l);
        case 3: return launch_matvec_tokens<F, 3>(l);
        case 4: return launch_matvec_tokens<F, 4>(l);
        case 5: return launch_matvec_tokens<F, 5>(l);
        case 6: return launch_matvec_tokens<F, 6>(l);
        case 7: return launch_matvec_tokens<F, 7>(l);
        case 8: return launch_matvec_tokens<F, 8>(l);
        default: STRATA_ASSERT(!"matvec takes 1..8 tokens");
    }
}

// ---- dequantize (the GEMM path) -------------------------------------------------------------------------------------

// One thread per piece: out[r * in + i] = w(r, i) as f32. Quant types only (float types convert per element).
template <typename F>
__global__ void dequantize_kernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t in, float* out) {
    const int64_t pieces_per_row = in / kPieceElems;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * pieces_per_row) return;
    const int64_t r = i / pieces_per_row;
    const int64_t e0 = (i % pieces_per_row) * kPieceElems;
    const uint8_t* blk = w + r * row_bytes + (e0 / F::kBlockElems) * F::kBlockBytes;
    const QuantPiece wp = F::decode(blk, static_cast<int>((e0 % F::kBlockElems) / kPieceElems));
    float* o = out + r * in + e0;
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            o[4 * k + j] = wp.scale * static_cast<float>(static_cast<int8_t>(wp.q[k] >> (8 * j))) + wp.offset;
}

template <typename F>
void launch_dequantize_typed(const DequantizeLaunch& l) {
    const int64_t n = l.rows * (l.in / kPieceElems);
    constexpr int kThreads = 256;
    dequantize_kernel<F><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, l.stream>>>(
        l.w, l.row_bytes, l.rows, l.in, l.out);
    STRATA_CUDA_CHECK_LAUNCH("dequantize_kernel");
}

}  // namespace strata::cuda::kernels
