// Gated softmax attention (q/gate interleaved per head, q/k RMSNorm, partial NEOX rope, sigmoid output gate) with an
// optional QSA indexer that picks which cached cells each query attends to. Math: Qwen4ExpTextAttention and
// Qwen4ExpTextQSAIndexer (dense when the block has no compress ratio: qwen35moe, qwen3next). For text every M-RoPE
// section sees the same position, so the rope is plain NEOX over the first n_rot dims.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/batch_rows.h"
#include "model/binding.h"
#include "model/scratch.h"

namespace strata {

struct AttentionShape {
    int64_t n_embd = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;
    int64_t n_rot = 0;
    float freq_base = 10000.0f;
    float eps = 1e-6f;
};

struct IndexerShape {
    int64_t n_head = 0;    // ni
    int64_t head_dim = 0;  // di
    int64_t budget = 0;    // cells kept from complete blocks (top_k)
    int64_t ratio = 0;     // cells per block; 0: no indexer, dense attention
};

struct AttentionWeights {
    Tensor q;                           // {H, 2 hd nh}: per head [q | gate]
    Tensor k;                           // {H, hd nkv}
    Tensor v;                           // {H, hd nkv}
    Tensor o;                           // {hd nh, H}
    std::vector<float> q_norm, k_norm;  // {hd}
    // QSA indexer (qwen4exp attention blocks with a ratio)
    std::optional<Tensor> index_q;                  // {H, ni di}
    std::optional<Tensor> index_k;                  // {H, di}
    std::vector<float> index_q_norm, index_k_norm;  // {di}
};

AttentionWeights bind_attention(const TensorBinder& binder, int64_t block, const AttentionShape& shape,
                                const IndexerShape* indexer);

// Per-sequence cache of one attention block: rotated keys and values of every cell, and for QSA the raw indexer keys
// plus the pooled (normalised, rotated) key of each complete block. Cells below the sequence's length never change
// once written, and pooled key b depends only on cells of block b: n_pooled is all a checkpoint needs to keep.
struct AttentionCache {
    std::vector<float> k, v;          // capacity x (nkv hd)
    std::vector<float> index_raw;     // capacity x di
    std::vector<float> index_pooled;  // (capacity / ratio) x di
    int64_t n_pooled = 0;
    void init(const AttentionShape& shape, const IndexerShape* indexer, int64_t capacity);
    size_t bytes() const { return (k.size() + v.size() + index_raw.size() + index_pooled.size()) * sizeof(float); }
};

// One pass over the rows of one or more sequences (batch_rows.h): projections over all rows at once; each row then
// attends over its own sequence's cache (rows and heads in parallel).
struct AttentionForwardArgs {
    const AttentionShape& shape;
    const IndexerShape* indexer;  // null or ratio 0: dense
    const AttentionWeights& weights;
    std::span<AttentionCache* const> caches;  // one per sequence
    std::span<const SequenceRows> sequences;  // their rows, same order; pos0: cells before it are cached
    const float* x;                           // [n_tokens x H]
    float* out;                               // [n_tokens x H]
    int64_t n_tokens = 1;                     // all rows
    Scratch& scratch;
    ThreadPool* pool = nullptr;
};
void attention_forward(const AttentionForwardArgs& args);

// The cells a QSA query at position `pos` attends to, ascending: the complete blocks of `ratio` cells with the best
// sum_h relu(q_h . k_block) / sqrt(di) (at most budget / ratio of them), then the partial tail block.
// q: ni x di (normalised, rotated); pooled: one di row per complete block.
std::vector<int32_t> qsa_select(const IndexerShape& shape, const float* q, const float* pooled, int64_t pos);
// Working space of qsa_select_into (grown to the number of blocks, so reusing one allocates only when a longer
// context comes): the blocks' order keys, and a copy of them with their indices for selections decided by a tie.
struct QsaSelectScratch {
    std::vector<uint32_t> keys, tie_keys;
    std::vector<int32_t> tie_index;
};
// The same into `cells` (room for qsa_max_cells), returning how many; scores: room for pos / ratio + 1 floats.
// The best blocks are found by radix select, linear in the number of blocks; where equal scores straddle the cut,
// the blocks kept are the ones torch.topk keeps on the CPU (core/topk_tie_order.h), as in the transformers oracle.
int64_t qsa_select_into(const IndexerShape& shape, const float* q, const float* pooled, int64_t pos, int32_t* cells,
                        float* scores, QsaSelectScratch& scratch);
inline int64_t qsa_max_cells(const IndexerShape& s) {
    return s.budget / s.ratio * s.ratio + s.ratio;
}

}  // namespace strata
