// QSA attention over the union of 8 neighbouring positions' selections (issue 8, seed 003), the tensor-core
// alternative to calling decode_attention once per position of a prompt window. Like attention.h this header needs no
// CUDA headers.
//
// What it computes is decode_attention's contract for each position t of the window, with t's own cell list, cache
// length and query: out[t][h] = sigmoid(gate) * sum_c softmax_c(scale * q_t,h . k_c) v_c over exactly the cells t
// selected (entries at or beyond t's cache length skipped, cells on pages outside the table or the cache skipped). The
// cell lists must be strictly ascending, as qsa_select writes them (a cell listed twice counts once here, twice in
// decode_attention).
//
// How: positions go in groups of 8 consecutive ones (the last group may be ragged). A first kernel writes each group's
// sorted union of cells, each with an 8-bit mask of the positions that chose it. The attention kernel takes the union
// in chunks of 64 cells: it converts the chunk's K and V (fp16 or int8 with scales) to fp16 in shared memory once,
// computes S^T = K Q^T for every query head of the kv head times the 8 positions with mma.sync m16n8k16 (two m16n8k8
// on sm_75; fp16 in, fp32 sums), sets -inf where a position did not choose a cell, updates an fp32 online softmax and
// adds P V (P in fp16) on tensor cores. The union is split over thread blocks like decode_attention's cells; a last
// kernel merges the splits by log-sum-exp and applies the gate.
//
// Not bitwise equal to decode_attention: Q, K, V and the probabilities enter the products as fp16 (error against an
// FP64 reference a few 1e-4 of the output scale, see tests/test_cuda_qsa_union.cpp). Deterministic: a rerun on the
// same inputs gives the same bits. Every per-position value is read from device memory and the launch shapes depend
// only on the arguments' capacities, so it works inside a captured CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cuda/attention.h"

namespace strata::cuda {

constexpr int64_t kQsaUnionGroup = 8;   // positions per union
constexpr int64_t kQsaUnionChunk = 64;  // union cells per attention step

struct QsaUnionAttentionArgs {
    KvCacheView cache;
    PageTable table;
    int64_t n_tokens = 0;                  // positions in the window: groups [8i, 8i + 8)
    const int32_t* n_cells = nullptr;      // device, one per position: its cache length
    const int32_t* cells = nullptr;        // position t's ascending cell list at cells + t * cells_stride
    int64_t cells_stride = 0;              // 0: max_cells
    const int32_t* n_selected = nullptr;   // device, one per position
    int64_t max_cells = 0;                 // entries of a list at most (qsa_max_cells)
    const float* q = nullptr;              // position t, head h at q + t * q_token_stride + h * q_head_stride
    int64_t n_head = 0;
    int64_t q_head_stride = 0;             // 0: head_dim
    int64_t q_token_stride = 0;            // 0: n_head * q_head_stride
    const float* gate = nullptr;           // optional, same indexing with the gate strides
    int64_t gate_head_stride = 0;          // 0: head_dim
    int64_t gate_token_stride = 0;         // 0: n_head * gate_head_stride
    float scale = 1.0f;
    float* out = nullptr;                  // position t at out + t * out_token_stride, n_head x head_dim
    int64_t out_token_stride = 0;          // 0: n_head * head_dim
    int64_t n_splits = 1;                  // thread blocks per (group, kv head) along the union
    void* workspace = nullptr;             // qsa_union_workspace_bytes
    size_t workspace_bytes = 0;
};

// Why the union kernels cannot run a cache of this shape with n_head query heads on this device ("" when they can):
// head_dim 64, 128 or 256, and the 8 positions' query heads of one kv head must fit the kernel's registers and the
// device's shared memory (227 KB a block on sm_90, 99 KB on sm_86 / 89 / 120, 64 KB on sm_75).
std::string qsa_union_unsupported(const Context& ctx, const KvCacheShape& shape, int64_t n_head);
// Scratch for n_tokens positions: the unions (cells, masks, counts) and the splits' partial results.
size_t qsa_union_workspace_bytes(int64_t n_tokens, int64_t max_cells, int64_t n_head, int64_t head_dim,
                                 int64_t n_splits);
// A split count that gives the device about one thread block per multiprocessor when the union is as large as it can
// be, never more splits than such a union has chunks.
int64_t qsa_union_splits(const Context& ctx, int64_t n_tokens, int64_t n_head_kv, int64_t max_cells);
void qsa_union_attention(Context& ctx, const QsaUnionAttentionArgs& args);

}  // namespace strata::cuda
