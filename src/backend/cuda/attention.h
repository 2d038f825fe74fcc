// The attention side of the CUDA backend (issue 7, slice 3): a paged KV cache in fp16 or int8, the append of new
// keys and values, the QSA indexer (block scores and the radix top-k with the tail), and decode attention split over
// the cells with a log-sum-exp merge. Like cuda_backend.h this header needs no CUDA headers.
//
// Every per-token value (positions, cache length, how many cells QSA selected) lives in device memory and is read by
// the kernels, so a captured CUDA graph replays the same launches for every token without host edits. Launch shapes
// depend only on capacities (pages, the QSA budget, the split count).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cuda/cuda_backend.h"

namespace strata::cuda {

// ---- the paged KV cache ---------------------------------------------------------------------------------------------
//
// A cache is made of physical pages of kKvPageCells consecutive cells; a sequence's page table (device int32, one
// entry per logical page) says which physical page holds logical page j, i.e. cells [4j, 4j + 4). Within a cache the
// values of (physical page p, kv head h, slot s, dim d) sit at element ((p * n_head_kv + h) * 4 + s) * head_dim + d of
// the K (and, separately, the V) array: one page of one head is 4 * head_dim contiguous values.
//
// Storage kinds:
//   F16:  each value rounded to fp16 (round to nearest even).
//   Int8: each (cell, head) row split into groups of kKvInt8Group = 64 consecutive values, one fp16 scale per group
//         at element ((p * n_head_kv + h) * 4 + s) * (head_dim / 64) + d / 64 of the scale array. The exact rule,
//         symmetric with round to nearest (llama.cpp's Q8_0 rule with 64-value groups):
//           amax = max |x_i| over the group;  d = amax / 127 (f32 division);  scale = fp16(d) (nearest even);
//           id = d != 0 ? 1 / d : 0 (f32);  q_i = clamp(roundf(x_i * id), -127, 127)  (roundf: ties away from 0);
//         a value reads back as float(scale) * q_i (exact in f32).
constexpr int64_t kKvPageCells = 4;
constexpr int64_t kKvInt8Group = 64;

enum class KvStorage { F16, Int8 };

struct KvCacheShape {
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;  // 32, 64, 128 or 256 (Int8: 64, 128 or 256)
    int64_t n_pages = 0;   // physical pages
    KvStorage storage = KvStorage::F16;
};

// The device arrays of one cache, as the kernels take them (k and v: uint16 fp16 bits or int8 values).
struct KvCacheView {
    KvCacheShape shape;
    void* k = nullptr;
    void* v = nullptr;
    uint16_t* k_scales = nullptr;  // Int8 only: fp16 bits
    uint16_t* v_scales = nullptr;
};

// One attention layer's cache, booked as "kv cache". Contents start undefined (nothing reads a cell before it is
// appended: attention reads only cells below the cache length).
class KvCache {
public:
    KvCache(Context& ctx, const KvCacheShape& shape);
    const KvCacheShape& shape() const { return view_.shape; }
    const KvCacheView& view() const { return view_; }
    // Bytes of one page of K for all heads (values, then scales separately), for the memory plan and the tests.
    static size_t value_bytes_per_page(const KvCacheShape& shape);
    static size_t scale_bytes_per_page(const KvCacheShape& shape);

private:
    DeviceBuffer k_, v_, k_scales_, v_scales_;
    KvCacheView view_;
};

// Where a sequence's cells live: page_table[j] is the physical page of logical page j (j < n_logical_pages); cells at
// or beyond n_logical_pages * 4, and table entries outside [0, n_pages), are never read or written.
struct PageTable {
    const int32_t* pages = nullptr;  // device
    int64_t n_logical_pages = 0;
};

// Writes n_tokens rows of keys and values (f32, token t at k + t * k_stride, heads consecutive: n_head_kv * head_dim
// values; stride 0 means exactly that) into the cells positions[t] (device int32), converting them to the cache's
// storage, and raises *n_cells (device int32, the cache length) to max(positions) + 1. A position outside the page
// table is skipped.
struct KvAppendArgs {
    KvCacheView cache;
    PageTable table;
    const float* k = nullptr;
    const float* v = nullptr;
    int64_t k_stride = 0, v_stride = 0;
    const int32_t* positions = nullptr;
    int32_t* n_cells = nullptr;
    int64_t n_tokens = 0;
};
void kv_append(Context& ctx, const KvAppendArgs& args);

// ---- QSA: the indexer's block selection -----------------------------------------------------------------------------
//
// What qsa_select_into (model/attention.h) computes, for the query at position pos = *n_cells - 1: blocks of `ratio`
// cells, n_blocks = (pos + 1) / ratio complete ones, k = min(budget / ratio, n_blocks) of them kept. When k ==
// n_blocks every cell is kept; otherwise block b scores sum_h relu(q_h . pooled_b) * (1 / sqrt(head_dim)), computed
// in the CPU's exact float order (cpu::dot's eight partial sums combined in its fixed tree, no fused multiply-adds,
// heads summed in order), so the scores are bit-identical and so is the selection: the k largest scores by radix
// select over the CPU's order-preserving keys (-0 == +0), ties taken lowest block index first. Output: the cells of
// the chosen blocks in ascending order, then the partial tail block's cells (pos + 1 - n_blocks * ratio of them);
// *n_selected their count (at most qsa_max_cells = budget / ratio * ratio + ratio).
struct QsaSelectArgs {
    int64_t n_head = 0;    // indexer heads
    int64_t head_dim = 0;  // indexer head size
    int64_t budget = 0;
    int64_t ratio = 0;
    const float* q = nullptr;       // n_head x head_dim, normalised and rotated (device)
    const float* pooled = nullptr;  // one head_dim row per complete block (device), max_blocks rows
    int64_t max_blocks = 0;         // rows in pooled (the capacity in cells / ratio); longer caches are cut there
    const int32_t* n_cells = nullptr;
    float* scores = nullptr;    // max_blocks floats of workspace (written only when a selection is needed)
    uint32_t* keys = nullptr;   // 2 x max_blocks of workspace (the second half for selections decided by a tie)
    int32_t* cells = nullptr;   // room for qsa_max_cells(args)
    int32_t* n_selected = nullptr;
    // A prompt window's queries in one launch pair: query t reads q + t * q_stride and n_cells[t], uses scores + t *
    // max_blocks and keys + t * 2 * max_blocks as its workspace, and writes cells + t * cells_stride and
    // n_selected[t]. Each query's selection is the one it would get alone.
    int64_t n_queries = 1;
    int64_t q_stride = 0;
    int64_t cells_stride = 0;
};
inline int64_t qsa_max_cells(const QsaSelectArgs& a) {
    return a.budget / a.ratio * a.ratio + a.ratio;
}
void qsa_select(Context& ctx, const QsaSelectArgs& args);

// ---- decode attention -----------------------------------------------------------------------------------------------
//
// One query token, all heads: out[h] = sum_c softmax_c(scale * q_h . k_c) v_c over the cells given (cpu::attend),
// kv head h / (n_head / n_head_kv). The cells are the list cells[0 .. *n_selected) (QSA; entries outside the cache
// length are skipped), or with cells null all cells [0, *n_cells) (full attention). The cells are cut into n_splits
// contiguous ranges, each range with one kv head's query heads a thread block (K and V rows read once per kv head),
// and the splits' partial results (running max, sum, unnormalised output) merged by log-sum-exp. With gate set,
// out[h][d] is then multiplied by sigmoid(gate[h * gate_head_stride + d]) (the qwen4exp output gate).
struct DecodeAttentionArgs {
    KvCacheView cache;
    PageTable table;
    const int32_t* n_cells = nullptr;
    const int32_t* cells = nullptr;
    const int32_t* n_selected = nullptr;
    int64_t max_cells = 0;  // with cells: entries of the list at most (qsa_max_cells)
    const float* q = nullptr;
    int64_t n_head = 0;
    int64_t q_head_stride = 0;  // 0: head_dim
    const float* gate = nullptr;
    int64_t gate_head_stride = 0;  // 0: head_dim
    float scale = 1.0f;
    float* out = nullptr;  // n_head x head_dim
    int64_t n_splits = 1;
    void* workspace = nullptr;  // decode_attention_workspace_bytes
    size_t workspace_bytes = 0;
    // A prompt window's queries in one launch (n_queries > 1; n_splits must be 1): query t reads q + t *
    // q_token_stride, gate + t * gate_token_stride, n_cells[t], cells + t * cells_stride and n_selected[t], and writes
    // out + t * out_token_stride. Each (query, kv head) is one thread block that normalises and gates its heads' sums
    // itself: no workspace, and the bits of a one-split decode_attention of that query.
    int64_t n_queries = 1;
    int64_t q_token_stride = 0, gate_token_stride = 0, out_token_stride = 0, cells_stride = 0;
};
size_t decode_attention_workspace_bytes(int64_t n_head, int64_t head_dim, int64_t n_splits);
// A split count that gives the device about two thread blocks per multiprocessor for up to max_cells cells, with at
// least kMinCellsPerSplit cells in each split.
constexpr int64_t kMinCellsPerSplit = 32;
int64_t decode_attention_splits(const Context& ctx, int64_t n_head_kv, int64_t max_cells);
void decode_attention(Context& ctx, const DecodeAttentionArgs& args);
// decode_attention for each token of a window, token t's heads at per_token[0].out + t * n_head * head_dim, then the
// output product y = w . heads. At decode with weights that read Q8_0 activations the attention's last kernel writes
// them itself (the bits of decode_attention then matmul, one launch fewer).
void decode_attention_matmul(Context& ctx, std::span<const DecodeAttentionArgs> per_token, const Tensor& w, float* y);

}  // namespace strata::cuda
