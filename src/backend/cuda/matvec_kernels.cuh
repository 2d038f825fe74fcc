// Private to the CUDA backend: the matrix-vector kernel shared by every weight type, and the dequantize kernel of the
// GEMM path. A weight type plugs in through a Format<type> specialization (in the family's .cu file) that says how
// big its blocks are and decodes 16 consecutive weights of a block ("a piece"):
//   quant types: 16 signed 8-bit integers q with w_i = scale * q_i + offset, so the dot with 8-bit activations is
//                four dp4a per piece and token; the matvec decodes two adjacent pieces at a time (decode_pair below);
//   float types: 16 floats.
//
// The matvec kernel (MMVQ style): each warp owns kRows consecutive weight rows (8 for many short rows, else 2) and
// walks them as one span in chunks of 32 * kPiecesPerLane pieces. A chunk's bytes are copied into the warp's shared
// memory by cp.async (plain loads on sm_75) from the 16-byte granules that cover it (all coalesced, whatever the block
// size, which is rarely a multiple of 16), the next chunks' copies are in flight while one is decoded, and each lane
// then decodes its pieces (for quant types, pairs of adjacent pieces) from shared memory against the activations of
// every token, adding into the row each piece belongs to.
// Partial sums per (row, token) are reduced across the warp with shuffles; matrices with few rows split each span over
// 2 or 4 warps of a block, whose sums meet in shared memory.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/hyper_connection_device.cuh"
#include "backend/cuda/internal.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quantize_device.cuh"
#include "backend/cuda/warp_reduce.cuh"

namespace strata::cuda::kernels {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kPieceElems = 16;
// Pieces per lane and chunk for quant types: 2 (1,024 weights a chunk) measured as fast as or faster than 4 on the
// H200 at decode shapes (bench/NOTES.md, 2026-11-30).
constexpr int kQuantPiecesPerLane = 2;

// Programmatic dependent launch (launch.cuh): the matvec kernel issues its first weight loads, which depend on nothing
// computed on the device, before it waits for the previous kernel; after the wait it lets the next kernel launch, so
// that one's weight loads overlap this one too.

template <DType T>
struct Format;  // specialized per weight type in the family files

// 16 weights as 8-bit integers (byte k of q[j] is weight 4j + k): w = scale * q + offset.
struct QuantPiece {
    int q[4];
    float scale;
    float offset;
};

// Two adjacent pieces of a block (32 weights, pieces 2j and 2j + 1), which a matvec lane decodes together: the pair
// has one row, one block address, one activation scale and one accumulate. A format whose pieces share the scale
// (kPairSharesScale: scale[0] and offset[0] hold it) or the loaded bytes decodes the pair in one go
// (Format::decode_pair); any other decodes its two pieces.
struct QuantPair {
    int q[8];
    float scale[2];
    float offset[2];
};

template <typename F>
__device__ __forceinline__ QuantPair decode_pair(const uint8_t* b, int pair) {
    if constexpr (requires { F::decode_pair(b, pair); }) {
        return F::decode_pair(b, pair);
    } else {
        QuantPair w;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const QuantPiece piece = F::decode(b, 2 * pair + h);
#pragma unroll
            for (int k = 0; k < 4; ++k) w.q[4 * h + k] = piece.q[k];
            w.scale[h] = piece.scale;
            w.offset[h] = piece.offset;
        }
        return w;
    }
}

template <typename F>
constexpr bool kPairSharesScale = false;
template <typename F>
requires(F::kPairSharesScale) constexpr bool kPairSharesScale<F> = true;

// ---- unaligned little-endian reads ----------------------------------------------------------------------------------
// Every block size and every field that is read 16 bits at a time sits at an even offset, and rows start at even
// addresses, so 16-bit reads are always aligned; wider values are put together from aligned 32-bit words.

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) {
    return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) {
    return load_u16(p) | (load_u16(p + 2) << 16);
}
// 4 kWords bytes at an even address: the aligned words that cover them, funnel-shifted by 16 bits when the address
// is not a multiple of 4 (for 16 bytes: 5 word reads and 4 shifts instead of 8 halfword reads and 4 merges). The last
// word is read only when it holds wanted bytes; a misaligned read so touches the 2 bytes on each side inside the same
// aligned words (the neighbouring block's bytes, or the staging buffer's), never another page.
template <int kWords>
__device__ __forceinline__ void load_words(const uint8_t* p, uint32_t v[kWords]) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
    const uint32_t shift = static_cast<uint32_t>(a & 3) * 8;  // 0 or 16
    uint32_t u[kWords + 1];
#pragma unroll
    for (int k = 0; k < kWords; ++k) u[k] = w[k];
    u[kWords] = shift ? w[kWords] : 0u;
#pragma unroll
    for (int k = 0; k < kWords; ++k) v[k] = __funnelshift_r(u[k], u[k + 1], shift);
}
__device__ __forceinline__ void load_16_bytes(const uint8_t* p, uint32_t v[4]) {
    load_words<4>(p, v);
}
__device__ __forceinline__ float load_f16(const uint8_t* p) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(load_u16(p))));
}

// ---- byte tricks ----------------------------------------------------------------------------------------------------
// sm_90 has no SIMD byte instructions: __vsub4 and __vcmpne4 each expand to several. These use plain word arithmetic
// under the stated ranges, where no byte carries into the next.

// The 7 stored sign bits of a group of 8 with the parity bit that makes the count of minus signs even.
__device__ __forceinline__ uint32_t even_signs(uint32_t seven_bits) {
    return seven_bits | ((__popc(seven_bits) & 1u) << 7);
}
// Negates byte k of v where bit k of four_bits is set. Every byte of v must be in 1..127 (the grid values): then
// (b ^ 0xff) + 1 = -b never carries out of its byte. The multiply spreads bit k to bit 8k (the four shifted copies
// do not overlap).
__device__ __forceinline__ int apply_signs(uint32_t v, uint32_t four_bits) {
    const uint32_t ones = (four_bits * 0x00204081u) & 0x01010101u;  // 1 in each byte to negate
    return static_cast<int>((v ^ (ones * 0xffu)) + ones);
}
// Byte k of v minus c, as int8, for bytes of v in 0..127 and 0 <= c <= 128: each byte is lifted by 128 so the
// subtraction cannot borrow from the next, then put back.
__device__ __forceinline__ int sub_bytes(uint32_t v, uint32_t c) {
    return static_cast<int>(((v | 0x80808080u) - c * 0x01010101u) ^ 0x80808080u);
}
// 0xff in each byte whose bit 3 is set (bytes of v in 0..15).
__device__ __forceinline__ uint32_t bit3_mask(uint32_t v) {
    return ((v >> 3) & 0x01010101u) * 0xffu;
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
    OwnActivations own;   // with kOwn: the f32 row the block forms its activations from
    HcMix mix;            // with kMix
};


template <typename F>
struct ChunkShape {
    static constexpr int kPieces = kWarpSize * F::kPiecesPerLane;
    static constexpr int kElems = kPieces * kPieceElems;
    static constexpr int kBlocks = kElems / F::kBlockElems;
    static constexpr int kBytes = kBlocks * F::kBlockBytes;
    static_assert(kElems % F::kBlockElems == 0, "a chunk holds whole blocks");
    // A chunk's bytes start anywhere in a granule: one granule more than its size needs.
    static constexpr int kGranules = (kBytes + 15) / 16 + 1;
    static constexpr int kGranulesPerLane = (kGranules + kWarpSize - 1) / kWarpSize;
};

// Chunk copies run through cp.async (global to shared without registers), so the chunks a warp keeps in flight cost
// shared memory, not registers: kMatvecStages - 1 chunks are in flight while one is decoded. Two stages measured as
// fast as three or four on the H200 (Flash-Next decode within 1%, bench/NOTES.md session 9): the warps of an SM, not
// the depth of each, keep the copies in flight.
constexpr int kMatvecStages = 2;
// Plain launches of fewer rows than this go one row a warp: the hyper-connection down product (320 rows of 10,240)
// then has 1,280 warps instead of 640. At one token they take kFewRowStages (launch_matvec_rows).
constexpr int64_t kFewRows = 1024;
constexpr int kFewRowStages = 4;

// sm_75 has no cp.async: there a copy is a plain load (L2 only, as cp.async.cg) and store into the same slot, done
// when the call returns, so committing and waiting have nothing to do and the chunks are decoded from the same bytes.
__device__ __forceinline__ void copy_16_async(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    *static_cast<uint4*>(shared_dst) = __ldcg(static_cast<const uint4*>(global_src));
#else
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
#endif
}
__device__ __forceinline__ void commit_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#else
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#else
    asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// A block's own Q8_0 activations (one token), in shared memory.
struct alignas(16) OwnActivationStore {
    int8_t q[kMaxOwnActivations];
    float d[kMaxOwnActivations / 32];
    float s16[kMaxOwnActivations / 16];
};

// Activation reads: through the read-only cache from global memory, or plain loads from the block's own store.
template <bool kShared, typename T>
__device__ __forceinline__ T load_activation(const T* p) {
    if constexpr (kShared)
        return *p;
    else
        return __ldg(p);
}

// The explicit minimum of 1 block per SM lets ptxas use more registers (~120 instead of ~80 at 8 tokens): 8 tokens
// then ran up to 2x faster on the H200 (bench/NOTES.md). One token asks for 8 blocks (32 warps) an SM: at most 64
// registers, which every one-token kernel fits without spilling (the 8-row IQ4_NL and IQ3_XXS ones took 76-80).
// A warp's kRows rows are consecutive in memory (the launcher checks), so the warp walks them as one span of
// kRows * in weights: chunk after chunk with every lane busy, each piece adding into the row it belongs to. Rows
// shorter than a chunk (the expert down products' 640, the hyper-connection up's 320) then leave no lane idle.
// Offsets inside a span are 32-bit (a span is under 2^31 bytes and pieces: the launcher checks), so the per-piece
// index arithmetic stays in single instructions. kOwn: the block forms its activations itself (p.own, one token).
// kMix: the hyper-connection mix epilogue (p.mix; see HcMix); kMixQ8: it also writes mixed as Q8_0 activations
// (p.mix.q8_0; launched in clusters of kHcMixClusterBlocks).
template <typename F, int kTokens, int kRows, bool kOwn, bool kMix, int kStages = kMatvecStages, bool kMixQ8 = false>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarpSize, kTokens == 1 ? 8 : 1) matvec_kernel(const MatvecParams p) {
    using Shape = ChunkShape<F>;
    constexpr int kG = Shape::kGranulesPerLane;
    static_assert(!kOwn || (kTokens == 1 && !F::kIsFloat && F::kBlockElems == 32), "own activations: Q8_0 readers");
    static_assert(!kMix || (kOwn && kRows == kHcMixColumns && kWarpsPerBlock == kHcMixStreams), "mix: the HC up");
    static_assert(!kMixQ8 || kMix, "Q8_0 mixed: with the mix");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Every block of the cluster must have started before another writes its shared memory (the epilogue's wait).
    if constexpr (kMixQ8) cooperative_groups::this_cluster().barrier_arrive();
#endif
    __shared__ uint4 stage[kWarpsPerBlock][kStages][kG * kWarpSize];
    __shared__ std::conditional_t<kOwn, OwnActivationStore, char> own_store;

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
    // With kMix warp s takes stream s's rows of the block's columns (split is 1).
    const int64_t row0 =
        kMix ? warp * p.mix.H + block * kRows : (block * (kWarpsPerBlock / split) + warp / split) * kRows;
    const bool active = row0 < seg.rows;  // no early return: the block synchronizes below when split > 1

    // The weights, activations and outputs of this launch, or with an expert gather those of pair blockIdx.y.
    const uint8_t* w_base = seg.w;
    QuantizedActivations act = p.act;
    const float* x_base = p.x;
    float* y_base = seg.y;
    int64_t act_row = 0;
    if (p.gather.ids) {
        wait_for_previous_grid();  // the expert ids come from the kernel before
        const int64_t pair = blockIdx.y;
        int64_t slot = pair;
        const bool second = p.gather.second_from > 0 && pair >= p.gather.second_from;
        if (second) slot = pair - p.gather.second_from;
        act_row = slot / p.gather.pairs_per_act_row;
        const int32_t expert = p.gather.ids[slot];
        if (p.gather.at) {
            w_base = (second ? p.gather.second_at : p.gather.at)[expert];
            if (w_base == nullptr) return;  // a CPU expert worker computes this pair (block-uniform: before any sync)
        } else
            w_base += (second ? p.gather.second_offset : 0) + static_cast<size_t>(expert) * p.gather.expert_bytes;
        if (act.q) {
            act.q += act_row * p.in;
            act.d += act_row * (p.in / 32);
            if (act.s16) act.s16 += act_row * (p.in / 16);
        }
        if (x_base) x_base += act_row * p.in;
        y_base += pair * seg.rows;
    }

    const int in = static_cast<int>(p.in);
    const int pieces_per_row = in / kPieceElems;
    const int rows_here = active ? static_cast<int>(min(static_cast<int64_t>(kRows), seg.rows - row0)) : 0;
    const int span_pieces = rows_here * pieces_per_row;
    const int span_blocks = rows_here * (in / F::kBlockElems);
    const int n_chunks = (span_blocks + Shape::kBlocks - 1) / Shape::kBlocks;
    const uint8_t* span = w_base + row0 * seg.row_bytes;
    // Starts the copies of chunk c into stage slot `slot`: the 16-byte granules that cover it (the first may begin
    // before it; granules past the chunk stay uncopied and are never read).
    auto copy_chunk = [&](int slot, int c) {
        const int nb = min(span_blocks - c * Shape::kBlocks, Shape::kBlocks);
        const uint8_t* start = span + c * Shape::kBytes;
        const int lead = static_cast<int>(reinterpret_cast<uintptr_t>(start) & 15);
        const int n_granules = (lead + nb * F::kBlockBytes + 15) / 16;
        const uint4* src = reinterpret_cast<const uint4*>(start - lead);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
            const int idx = lane + g * kWarpSize;
            if (idx < n_granules) copy_16_async(&stage[warp][slot][idx], src + idx);
        }
    };

    float acc[kRows][kTokens];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[r][t] = 0.0f;
    // Adds v[t] into row r of the span (r is uniform only per piece, so every row is tested: registers stay put).
    // Products and sums are rounded one by one (no fused multiply-add the compiler may choose differently per token
    // count), so a token's sums are the same bits whatever the batch.
    auto add_to_row = [&](int r, const float (&v)[kTokens]) {
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr)
            if (rr == r)
#pragma unroll
                for (int t = 0; t < kTokens; ++t) acc[rr][t] = __fadd_rn(acc[rr][t], v[t]);
    };

    // This part's chunks are part + i * split for i < my_chunks; chunk i sits in slot i % kStages.
    const int my_chunks = part < n_chunks ? (n_chunks - part + split - 1) / split : 0;
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
        if (i < my_chunks) copy_chunk(i, part + i * split);
        commit_async_copies();  // empty groups too, so the group count stays uniform
    }
    enter_dependent_grid();  // activations and outputs only from here on
    if constexpr (kOwn) {
        // Every warp quantizes whole blocks of 32 (quantize_q8_0_value's warp-wide steps). Each lane's values are all
        // formed first, so their loads are in flight together (one round trip, not one per block of 32).
        constexpr int kPerLane = kMaxOwnActivations / 32 / kWarpsPerBlock;
        float v[kPerLane];
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
            const int e = (warp + j * kWarpsPerBlock) * 32 + lane;
            if (e >= in) break;
            v[j] = SiluScaledSource{p.own.silu_of, p.own.divisor}(act_row, in, e);
        }
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
            const int e = (warp + j * kWarpsPerBlock) * 32 + lane;
            if (e - lane >= in) break;  // warp-uniform: in is a multiple of 32
            (void)quantize_q8_0_value(v[j], e, own_store.q, own_store.d, own_store.s16);
        }
        __syncthreads();
        act = {own_store.q, own_store.d, own_store.s16};
    }
    // Row of span piece g: at two rows a warp one compare; at more, (g + 0.5) / pieces_per_row rounded down, exact in
    // float (its error, under 8 * 2^-22, stays below the 0.5 / pieces_per_row margin for rows under 2^18 pieces: the
    // launcher checks).
    const float inv_pieces_per_row = 1.0f / static_cast<float>(pieces_per_row);
    auto row_of = [&](int g) {
        if constexpr (kRows == 1)
            return 0;
        else if constexpr (kRows == 2)
            return g >= pieces_per_row ? 1 : 0;
        else
            return __float2int_rd((static_cast<float>(g) + 0.5f) * inv_pieces_per_row);
    };
    for (int i = 0; i < my_chunks; ++i) {
        const int ahead = i + kStages - 1;  // refills the slot decoded in the previous iteration
        if (ahead < my_chunks) copy_chunk(ahead % kStages, part + ahead * split);
        commit_async_copies();
        wait_async_copies<kStages - 1>();  // chunk i has landed (for this lane)
        __syncwarp();                      // ... and for every lane
        const int c = part + i * split;
        const uint8_t* chunk = reinterpret_cast<const uint8_t*>(stage[warp][i % kStages]) +
                               (reinterpret_cast<uintptr_t>(span + c * Shape::kBytes) & 15);
        const int g0 = c * Shape::kPieces;
        if constexpr (!F::kIsFloat) {
            // Quant types: lane l decodes pieces 2l and 2l + 1 of the chunk (and 2l + 64, 2l + 65 ... with more pieces
            // a lane), one pair of a block. Rows hold whole blocks of 32, so a pair never straddles two rows.
            static_assert(F::kPiecesPerLane % 2 == 0 && F::kBlockElems % (2 * kPieceElems) == 0);
#pragma unroll
            for (int k = 0; k < F::kPiecesPerLane / 2; ++k) {
                const int piece = 2 * (lane + k * kWarpSize);
                const int g = g0 + piece;
                if (g >= span_pieces) continue;
                const int r = row_of(g);
                const int e0 = (g - r * pieces_per_row) * kPieceElems;  // a multiple of 32
                const int block = piece * kPieceElems / F::kBlockElems;
                const int pair_in_block = (piece * kPieceElems % F::kBlockElems) / (2 * kPieceElems);
                const QuantPair wp = decode_pair<F>(chunk + block * F::kBlockBytes, pair_in_block);
                float v[kTokens];
#pragma unroll
                for (int t = 0; t < kTokens; ++t) {
                    const int4* aq = reinterpret_cast<const int4*>(act.q + t * in + e0);
                    const int4 a0 = load_activation<kOwn>(aq);
                    const int4 a1 = load_activation<kOwn>(aq + 1);
                    const float ad = load_activation<kOwn>(act.d + t * (in / 32) + e0 / 32);
                    int s0 = __dp4a(wp.q[0], a0.x, 0);
                    s0 = __dp4a(wp.q[1], a0.y, s0);
                    s0 = __dp4a(wp.q[2], a0.z, s0);
                    s0 = __dp4a(wp.q[3], a0.w, s0);
                    int s1 = __dp4a(wp.q[4], a1.x, 0);
                    s1 = __dp4a(wp.q[5], a1.y, s1);
                    s1 = __dp4a(wp.q[6], a1.z, s1);
                    s1 = __dp4a(wp.q[7], a1.w, s1);
                    if constexpr (kPairSharesScale<F>) {
                        v[t] = __fmul_rn(ad, __fmul_rn(wp.scale[0], static_cast<float>(s0 + s1)));
                    } else {
                        v[t] = __fmul_rn(ad, __fadd_rn(__fmul_rn(wp.scale[0], static_cast<float>(s0)),
                                                       __fmul_rn(wp.scale[1], static_cast<float>(s1))));
                    }
                    if constexpr (F::kHasOffset) {
                        const float2 s16 =
                            load_activation<kOwn>(reinterpret_cast<const float2*>(act.s16 + t * (in / 16) + e0 / 16));
                        const float offset_sum = kPairSharesScale<F> ? __fmul_rn(wp.offset[0], __fadd_rn(s16.x, s16.y))
                                                                     : __fadd_rn(__fmul_rn(wp.offset[0], s16.x),
                                                                                 __fmul_rn(wp.offset[1], s16.y));
                        v[t] = __fadd_rn(v[t], offset_sum);
                    }
                }
                add_to_row(r, v);
            }
        } else {
            // Float types: lane l takes pieces l, l + 32, ... (a float block is one piece).
            static_assert(F::kBlockElems == kPieceElems);
#pragma unroll
            for (int k = 0; k < F::kPiecesPerLane; ++k) {
                const int piece = lane + k * kWarpSize;
                const int g = g0 + piece;  // piece of the span
                if (g >= span_pieces) continue;
                const int r = row_of(g);
                const int e0 = (g - r * pieces_per_row) * kPieceElems;
                float wv[kPieceElems];
                F::decode(chunk + piece * F::kBlockBytes, 0, wv);
                float v[kTokens];
#pragma unroll
                for (int t = 0; t < kTokens; ++t) {
                    const float4* xp = reinterpret_cast<const float4*>(x_base + t * in + e0);
                    float sum = 0.0f;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const float4 x4 = __ldg(xp + j);
                        sum = fmaf(wv[4 * j], x4.x, sum);
                        sum = fmaf(wv[4 * j + 1], x4.y, sum);
                        sum = fmaf(wv[4 * j + 2], x4.z, sum);
                        sum = fmaf(wv[4 * j + 3], x4.w, sum);
                    }
                    v[t] = sum;
                }
                add_to_row(r, v);
            }
        }
        __syncwarp();  // the slot is refilled in the next iteration
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTokens; ++t) acc[r][t] = warp_sum(acc[r][t]);
    if constexpr (kMix) {
        // Every warp is active (the launcher sizes the grid to the columns): the streams' gate values of the block's
        // columns meet in shared memory, and one thread per column forms its mix.
        __shared__ float gate[kHcMixStreams][kRows];
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < kRows; ++r) gate[warp][r] = acc[r][0];
        __syncthreads();
        const int64_t H = p.mix.H;
        const int tid = static_cast<int>(threadIdx.x);
        float mixed = 0.0f;
        if (tid < kRows) {
            const int64_t j = block * kRows + tid;
            mixed = hc_mix_value(
                kHcMixStreams, [&](int64_t s) { return gate[s][tid]; }, [&](int64_t s) { return p.mix.xn[s * H + j]; });
            p.mix.mixed[j] = mixed;
        }
        if (block == 0 && p.mix.inject && tid >= kWarpSize && tid < kWarpSize + kHcMixStreams) {
            const int r = tid - kWarpSize;
            p.mix.inject[r] =
                hc_inject_value(hc_inject_from_shares(p.mix.inject_partials, kHcMixStreams, r), kHcMixStreams);
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if constexpr (kMixQ8) {
            // The cluster's 32 columns meet in rank 0's shared memory (remote stores, then the barrier: no block reads
            // another's memory, so none waits for the others to finish); rank 0's first warp quantizes them.
            __shared__ float cluster_mixed[kHcMixClusterBlocks * kRows];
            const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
            const int rank = static_cast<int>(cluster.block_rank());
            cluster.barrier_wait();
            if (tid < kRows) *cluster.map_shared_rank(&cluster_mixed[rank * kRows + tid], 0) = mixed;
            cluster.sync();
            if (rank == 0 && warp == 0) {
                const int64_t e = block / kHcMixClusterBlocks * 32 + lane;
                (void)quantize_q8_0_value(cluster_mixed[lane], e, const_cast<int8_t*>(p.mix.q8_0.q),
                                          const_cast<float*>(p.mix.q8_0.d), const_cast<float*>(p.mix.q8_0.s16));
            }
        }
#endif
        return;
    }
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

template <typename F, int kTokens, int kRows, bool kOwn, bool kMix = false>
void launch_matvec_rows(const MatvecLaunch& l) {
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
    while (!kMix && split < kWarpsPerBlock && rows_per_token * split < kTargetRowParts && split * 2 <= n_chunks)
        split *= 2;
    const int64_t rows_per_block = kWarpsPerBlock / split * kRows;
    MatvecParams p{.segment = {}, .first_block = {}, .n_segments = 1 + l.n_more, .in = l.in, .act = l.act, .x = l.x,
                   .warps_per_row = split, .gather = l.gather, .own = l.own, .mix = l.mix};
    p.segment[0] = {.w = l.w, .row_bytes = l.row_bytes, .rows = l.rows, .y = l.y};
    for (int i = 0; i < l.n_more; ++i) p.segment[i + 1] = l.more[i];
    int64_t blocks = 0;
    for (int i = 0; i < p.n_segments; ++i) {
        p.first_block[i] = blocks;
        blocks += (p.segment[i].rows + rows_per_block - 1) / rows_per_block;
    }
    const dim3 grid(static_cast<unsigned>(blocks), l.gather.ids ? static_cast<unsigned>(l.gather.n_pairs) : 1u);
    if constexpr (kMix) {
        if (l.mix.q8_0.q) {
            STRATA_ASSERT(blocks % kHcMixClusterBlocks == 0 && clusters_supported());
            return launch_dependent_clusters("matvec_kernel", kHcMixClusterBlocks,
                                             matvec_kernel<F, 1, kRows, true, true, kMatvecStages, true>, grid,
                                             dim3(kWarpsPerBlock * kWarpSize), 0, l.stream, p);
        }
    }
    if constexpr (kTokens == 1 && kRows == 1 && !kMix) {
        // A one-token launch of few rows (the hyper-connection down: 320 rows of 10,240, 2.5 chunks a warp) keeps
        // kFewRowStages - 1 chunks in flight, so a warp's weights are all requested before its wait: decode +0.5-1%
        // in two H200 runs (bench/NOTES.md, session 14). The up product with the mix measured slower so.
        if (!l.gather.ids && rows_per_token < kFewRows)
            return launch_dependent("matvec_kernel", matvec_kernel<F, 1, 1, kOwn, false, kFewRowStages>, grid,
                                    dim3(kWarpsPerBlock * kWarpSize), 0, l.stream, p);
    }
    launch_dependent("matvec_kernel", matvec_kernel<F, kTokens, kRows, kOwn, kMix>, grid,
                     dim3(kWarpsPerBlock * kWarpSize), 0, l.stream, p);
}

// Whether a format reads Q8_0 activations (blocks of 32 quant weights), the only kind a block forms itself.
template <typename F>
constexpr bool kFormsOwnActivations = !F::kIsFloat && F::kBlockElems == 32;

template <typename F, int kTokens, int kRows>
void launch_matvec_rows_any(const MatvecLaunch& l) {
    if (!l.own.silu_of) return launch_matvec_rows<F, kTokens, kRows, false>(l);
    if constexpr (kTokens == 1 && kFormsOwnActivations<F>) {
        STRATA_ASSERT(l.in <= kMaxOwnActivations && l.in % 32 == 0);
        if (!l.mix.xn) return launch_matvec_rows<F, 1, kRows, true>(l);
        STRATA_ASSERT(l.rows == kHcMixStreams * l.mix.H && l.mix.H % kHcMixColumns == 0 && l.n_more == 0 &&
                      !l.gather.ids);
        if constexpr (kRows == kHcMixColumns)
            launch_matvec_rows<F, 1, kRows, true, true>(l);
        else
            STRATA_ASSERT(!"the mix epilogue takes kHcMixColumns rows a warp");
    } else {
        STRATA_ASSERT(!"own activations: one token of a Q8_0-reading type");
    }
}

template <typename F, int kTokens>
void launch_matvec_tokens(const MatvecLaunch& l) {
    // A warp's rows are walked as one span, which needs them consecutive in memory (every weight matrix here; a
    // strided view goes one row a warp). The rows per warp depend on the shape only, never on the token count: a
    // row's pieces then meet the same lanes in the same order whatever the batch, so a token's sums do not depend on
    // it (test_cuda_ops: TokenResultsDoNotDependOnTheBatch).
    const size_t packed_row_bytes = static_cast<size_t>(l.in / F::kBlockElems) * F::kBlockBytes;
    bool consecutive = l.row_bytes == packed_row_bytes;
    for (int i = 0; i < l.n_more; ++i) consecutive = consecutive && l.more[i].row_bytes == packed_row_bytes;
    // 32-bit offsets inside a span: up to 8 packed rows (a strided view walks one row at a time).
    STRATA_ASSERT(l.in / kPieceElems < (int64_t{1} << 18) && packed_row_bytes * 8 < (size_t{1} << 31));
    int64_t rows = l.rows;
    for (int i = 0; i < l.n_more; ++i) rows += l.more[i].rows;
    if (l.mix.xn) return launch_matvec_rows_any<F, kTokens, kHcMixColumns>(l);  // its own row mapping
    if (!consecutive || (!l.gather.ids && rows < kFewRows)) return launch_matvec_rows_any<F, kTokens, 1>(l);
    // Rows no longer than a chunk come 8 to a warp when there are enough of them: a warp's span then fills whole
    // chunks. An expert gather always has enough (its pairs multiply the warps: the expert down products); a plain
    // launch needs 8,192 rows (the hyper-connection up). Otherwise 2 rows a warp keep enough warps. Counting a
    // gather's pairs instead would let the token count (pairs = tokens x top-k) change the rows per warp.
    const bool short_rows = l.in <= ChunkShape<F>::kElems && (l.gather.ids || rows >= 8192);
    if (short_rows) return launch_matvec_rows_any<F, kTokens, 8>(l);
    // Longer rows: 4 a warp in plain launches of 8,192 rows or more (Flash-Next's GDN input, attention q/k/v and
    // output head), whose warps then walk twice the chunks and whose GDN input fits one wave of an H200 (1,030 blocks
    // instead of 2,060): decode +1-2% (bench/NOTES.md, session 14; 8 a warp, and 4 in the expert gathers or in the
    // 2,560-row products, measured slower). Else 2 a warp.
    if (!l.gather.ids && rows >= 8192) return launch_matvec_rows_any<F, kTokens, 4>(l);
    launch_matvec_rows_any<F, kTokens, 2>(l);
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

// Piece i of a matrix of `in`-wide rows, counted row by row: its row, its first element and its decoded values.
template <typename F>
struct WeightPiece {
    int64_t row, first;
    QuantPiece value;
    __device__ __forceinline__ WeightPiece(const uint8_t* w, size_t row_bytes, int64_t in, int64_t i)
        : row(i / (in / kPieceElems)), first((i % (in / kPieceElems)) * kPieceElems) {
        const uint8_t* blk = w + row * row_bytes + (first / F::kBlockElems) * F::kBlockBytes;
        value = F::decode(blk, static_cast<int>((first % F::kBlockElems) / kPieceElems));
    }
};

// One thread per piece: out[r * in + i] = w(r, i) as f32. Quant types only (float types convert per element).
template <typename F>
__global__ void dequantize_kernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t in, float* out) {
    enter_dependent_grid();
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * (in / kPieceElems)) return;
    const WeightPiece<F> piece(w, row_bytes, in, i);
    const QuantPiece& wp = piece.value;
    float* o = out + piece.row * in + piece.first;
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            o[4 * k + j] = wp.scale * static_cast<float>(static_cast<int8_t>(wp.q[k] >> (8 * j))) + wp.offset;
}

// The same as fp16 (the dense prompt products through cuBLAS): each weight fmaf(scale, q, offset) rounded to fp16,
// the value the tensor-core GEMM's tiles hold.
template <typename F>
__global__ void dequantize_half_kernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t in, __half* out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * (in / kPieceElems)) return;
    const WeightPiece<F> piece(w, row_bytes, in, i);
    const QuantPiece& wp = piece.value;
    __half2 h[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const auto q = [&](int j) { return static_cast<float>(static_cast<int8_t>(wp.q[k] >> (8 * j))); };
        h[2 * k] = __floats2half2_rn(fmaf(wp.scale, q(0), wp.offset), fmaf(wp.scale, q(1), wp.offset));
        h[2 * k + 1] = __floats2half2_rn(fmaf(wp.scale, q(2), wp.offset), fmaf(wp.scale, q(3), wp.offset));
    }
    uint4* o = reinterpret_cast<uint4*>(out + piece.row * in + piece.first);
    o[0] = *reinterpret_cast<const uint4*>(h);
    o[1] = *reinterpret_cast<const uint4*>(h + 4);
}

template <typename F>
void launch_dequantize_typed(const DequantizeLaunch& l) {
    const int64_t n = l.rows * (l.in / kPieceElems);
    constexpr int kThreads = 256;
    const dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads));
    if (l.out_half) {
        dequantize_half_kernel<F><<<grid, kThreads, 0, l.stream>>>(l.w, l.row_bytes, l.rows, l.in, l.out_half);
        STRATA_CUDA_CHECK_LAUNCH("dequantize_half_kernel");
        return;
    }
    launch_dependent("dequantize_kernel", dequantize_kernel<F>, grid, dim3(kThreads), 0, l.stream, l.w, l.row_bytes,
                     l.rows, l.in, l.out);
}

}  // namespace strata::cuda::kernels
