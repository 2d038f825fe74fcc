#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/topk_tie_order.h"

namespace strata {

namespace {
bool has_indexer(const IndexerShape* ix) {
    return ix != nullptr && ix->ratio > 0;
}
}  // namespace

AttentionWeights bind_attention(const TensorBinder& binder, int64_t block, const AttentionShape& s,
                                const IndexerShape* ix) {
    auto name = [&](const char* n) { return block_tensor(block, n); };
    const int64_t H = s.n_embd;
    AttentionWeights w;
    const int64_t q_rows = 2 * s.head_dim * s.n_head, kv_rows = s.head_dim * s.n_head_kv;
    if (!binder.has(name("attn_q.weight")) && binder.has(name("attn_qkv.weight"))) {
        // A fused projection (llama.cpp's create_tensor_qkv accepts it): rows [q+gate | k | v].
        const Tensor qkv = binder.require(name("attn_qkv.weight"), {H, q_rows + 2 * kv_rows});
        w.q = cpu::matrix_view(qkv, 0, 0, q_rows);
        w.k = cpu::matrix_view(qkv, 0, q_rows, kv_rows);
        w.v = cpu::matrix_view(qkv, 0, q_rows + kv_rows, kv_rows);
    } else {
        w.q = binder.require(name("attn_q.weight"), {H, q_rows});
        w.k = binder.require(name("attn_k.weight"), {H, kv_rows});
        w.v = binder.require(name("attn_v.weight"), {H, kv_rows});
    }
    w.o = binder.require(name("attn_output.weight"), {s.head_dim * s.n_head, H});
    w.q_norm = binder.require_f32(name("attn_q_norm.weight"), {s.head_dim});
    w.k_norm = binder.require_f32(name("attn_k_norm.weight"), {s.head_dim});
    if (has_indexer(ix)) {
        w.index_q = binder.require(name("indexer.q_proj.weight"), {H, ix->n_head * ix->head_dim});
        w.index_k = binder.require(name("indexer.k_proj.weight"), {H, ix->head_dim});
        w.index_q_norm = binder.require_f32(name("indexer.q_norm.weight"), {ix->head_dim});
        w.index_k_norm = binder.require_f32(name("indexer.k_norm.weight"), {ix->head_dim});
    }
    return w;
}

void AttentionCache::init(const AttentionShape& s, const IndexerShape* ix, int64_t capacity) {
    k.assign(static_cast<size_t>(capacity * s.n_head_kv * s.head_dim), 0.0f);
    v.assign(k.size(), 0.0f);
    if (has_indexer(ix)) {
        index_raw.assign(static_cast<size_t>(capacity * ix->head_dim), 0.0f);
        index_pooled.assign(static_cast<size_t>(capacity / ix->ratio * ix->head_dim), 0.0f);
    }
    n_pooled = 0;
}

namespace {

// Order-preserving map of a float to an unsigned key (larger float, larger key; -0 counts as +0).
uint32_t float_key(float f) {
    f += 0.0f;
    uint32_t bits = 0;
    std::memcpy(&bits, &f, 4);
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// Marks the k largest keys of [0, n) in ascending index order, the kept set equal to torch.topk's on the CPU. A most
// significant-digit radix select (four histogram passes over 8-bit digits) finds the k-th largest key; when every key
// equal to it is kept, one ascending scan takes them and all keys above it. When equal keys straddle the cut (the
// indexer's ReLU makes runs of exact zeros), which of them torch keeps depends on its algorithm's swaps, so the
// selection is replayed exactly (core/topk_tie_order.h) and marked back in index order. O(n) either way.
int64_t top_k_ascending(const uint32_t* keys, int64_t n, int64_t k, int32_t* chosen, QsaSelectScratch& scratch) {
    uint32_t prefix = 0, mask = 0;
    int64_t remaining = k;  // how many still to take at or below the current prefix
    int64_t equal = 0;      // keys equal to the final prefix
    for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t count[256] = {};
        for (int64_t i = 0; i < n; ++i)
            if ((keys[i] & mask) == prefix) ++count[(keys[i] >> shift) & 255];
        int digit = 255;
        for (; digit > 0 && count[digit] < remaining; --digit) remaining -= count[digit];
        prefix |= static_cast<uint32_t>(digit) << shift;
        mask |= 255u << shift;
        equal = count[digit];
    }
    int64_t m = 0;
    if (equal <= remaining) {
        for (int64_t i = 0; i < n; ++i)
            if (keys[i] >= prefix) chosen[m++] = static_cast<int32_t>(i);
        return m;
    }
    scratch.tie_keys.assign(keys, keys + n);
    scratch.tie_index.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) scratch.tie_index[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    topk_tie_order::select({scratch.tie_keys.data(), scratch.tie_index.data()}, k, n);
    // The kept indices, ascending: mark them in the permuted key copy (no longer needed), then scan.
    std::fill(scratch.tie_keys.begin(), scratch.tie_keys.end(), 0u);
    for (int64_t j = 0; j < k; ++j) scratch.tie_keys[static_cast<size_t>(scratch.tie_index[static_cast<size_t>(j)])] = 1;
    for (int64_t i = 0; i < n; ++i)
        if (scratch.tie_keys[static_cast<size_t>(i)]) chosen[m++] = static_cast<int32_t>(i);
    return m;
}

}  // namespace

int64_t qsa_select_into(const IndexerShape& s, const float* q, const float* pooled, int64_t pos, int32_t* cells,
                        float* scores, QsaSelectScratch& scratch) {
    const int64_t n_visible = pos + 1;
    const int64_t n_blocks = n_visible / s.ratio;
    int64_t n = 0;
    if (n_blocks > 0) {
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
        const int64_t k = std::min(s.budget / s.ratio, n_blocks);
        if (k == n_blocks) {
            for (int64_t c = 0; c < n_blocks * s.ratio; ++c) cells[n++] = static_cast<int32_t>(c);
        } else {
            std::vector<uint32_t>& keys = scratch.keys;
            keys.resize(static_cast<size_t>(n_blocks));
            for (int64_t b = 0; b < n_blocks; ++b) {
                float sum = 0.0f;
                for (int64_t h = 0; h < s.n_head; ++h)
                    sum += std::max(0.0f, cpu::dot(q + h * s.head_dim, pooled + b * s.head_dim, s.head_dim));
                scores[b] = sum * scale;
                keys[static_cast<size_t>(b)] = float_key(scores[b]);
            }
            // The chosen block ids go to the end of `cells` (room for k of them there: k * ratio >= k), then expand
            // in place from the front, which never overtakes the ids still to be read.
            int32_t* chosen = cells + k * (s.ratio - 1);
            const int64_t m = top_k_ascending(keys.data(), n_blocks, k, chosen, scratch);
            for (int64_t j = 0; j < m; ++j) {
                const int32_t block = chosen[j];
                for (int64_t i = 0; i < s.ratio; ++i) cells[n++] = static_cast<int32_t>(block * s.ratio + i);
            }
        }
    }
    for (int64_t c = n_blocks * s.ratio; c < n_visible; ++c) cells[n++] = static_cast<int32_t>(c);
    return n;
}

std::vector<int32_t> qsa_select(const IndexerShape& s, const float* q, const float* pooled, int64_t pos) {
    std::vector<int32_t> cells(static_cast<size_t>(qsa_max_cells(s)));
    std::vector<float> scores(static_cast<size_t>((pos + 1) / s.ratio + 1));
    QsaSelectScratch scratch;
    cells.resize(static_cast<size_t>(qsa_select_into(s, q, pooled, pos, cells.data(), scores.data(), scratch)));
    return cells;
}

namespace {

// Indexer keys of the new rows go to their sequence's cache raw; every block they complete gets its pooled key: the
// mean of its raw keys, k_norm, rope at the block's first position. Returns the rows' normalised, rotated queries.
const float* index_append(const AttentionForwardArgs& a) {
    const IndexerShape& ix = *a.indexer;
    const AttentionWeights& w = a.weights;
    const int64_t T = a.n_tokens, di = ix.head_dim;
    float* raw = a.scratch.take<float>(T * di);
    cpu::matmul({.w = *w.index_k, .x = a.x, .y = raw, .n_tokens = T, .pool = a.pool});
    for (size_t i = 0; i < a.sequences.size(); ++i) {
        const SequenceRows& rows = a.sequences[i];
        AttentionCache& c = *a.caches[i];
        std::copy_n(raw + rows.begin * di, rows.count * di, c.index_raw.data() + rows.pos0 * di);
        const int64_t n_complete = (rows.pos0 + rows.count) / ix.ratio;
        for (; c.n_pooled < n_complete; ++c.n_pooled) {
            float* pooled = c.index_pooled.data() + c.n_pooled * di;
            for (int64_t d = 0; d < di; ++d) {
                float sum = 0.0f;
                for (int64_t i2 = 0; i2 < ix.ratio; ++i2) sum += c.index_raw[(c.n_pooled * ix.ratio + i2) * di + d];
                pooled[d] = sum / static_cast<float>(ix.ratio);
            }
            cpu::rms_norm(pooled, di, w.index_k_norm.data(), a.shape.eps, pooled);
            cpu::rope_neox(pooled, a.shape.n_rot, c.n_pooled * ix.ratio, a.shape.freq_base);
        }
    }
    float* index_q = a.scratch.take<float>(T * ix.n_head * di);
    cpu::matmul({.w = *w.index_q, .x = a.x, .y = index_q, .n_tokens = T, .pool = a.pool});
    for (const SequenceRows& rows : a.sequences)
        parallel_each(a.pool, rows.count, [&](int64_t t) {
            for (int64_t h = 0; h < ix.n_head; ++h) {
                float* q = index_q + ((rows.begin + t) * ix.n_head + h) * di;
                cpu::rms_norm(q, di, w.index_q_norm.data(), a.shape.eps, q);
                cpu::rope_neox(q, a.shape.n_rot, rows.pos0 + t, a.shape.freq_base);
            }
        });
    return index_q;
}

void run(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (pool)
        pool->parallel_for(n, fn);
    else
        fn(0, n);
}

}  // namespace

void attention_forward(const AttentionForwardArgs& a) {
    const AttentionShape& s = a.shape;
    const AttentionWeights& w = a.weights;
    const int64_t T = a.n_tokens, hd = s.head_dim, nh = s.n_head, nkv = s.n_head_kv;
    const int64_t kv_width = nkv * hd;
    STRATA_ASSERT(nh % nkv == 0);
    STRATA_ASSERT(a.caches.size() == a.sequences.size());
    Scratch& scratch = a.scratch;

    float* qg = scratch.take<float>(T * 2 * hd * nh);
    float* k_new = scratch.take<float>(T * kv_width);
    float* v_new = scratch.take<float>(T * kv_width);
    const cpu::MatmulJob qkv[] = {{.w = &w.q, .x = a.x, .y = qg, .n_tokens = T},
                                  {.w = &w.k, .x = a.x, .y = k_new, .n_tokens = T},
                                  {.w = &w.v, .x = a.x, .y = v_new, .n_tokens = T}};
    cpu::matmul_many(qkv, a.pool);
    // Which sequence each row belongs to and its position.
    int32_t* row_seq = scratch.take<int32_t>(T);
    int64_t max_pos = 0;
    for (size_t i = 0; i < a.sequences.size(); ++i) {
        const SequenceRows& rows = a.sequences[i];
        STRATA_ASSERT(static_cast<int64_t>(a.caches[i]->k.size()) >= (rows.pos0 + rows.count) * kv_width);
        for (int64_t j = 0; j < rows.count; ++j) row_seq[rows.begin + j] = static_cast<int32_t>(i);
        if (rows.count > 0) max_pos = std::max(max_pos, rows.pos0 + rows.count - 1);
    }
    auto row_pos = [&](int64_t t) {
        const SequenceRows& rows = a.sequences[static_cast<size_t>(row_seq[t])];
        return rows.pos0 + (t - rows.begin);
    };
    // q/k norms and rotation row by row over the threads, then the rows' keys and values go to their caches.
    parallel_each(a.pool, T, [&](int64_t t) {
        const int64_t pos = row_pos(t);
        for (int64_t h = 0; h < nh; ++h) {
            float* q = qg + (t * nh + h) * 2 * hd;
            cpu::rms_norm(q, hd, w.q_norm.data(), s.eps, q);
            cpu::rope_neox(q, s.n_rot, pos, s.freq_base);
        }
        for (int64_t h = 0; h < nkv; ++h) {
            float* k = k_new + t * kv_width + h * hd;
            cpu::rms_norm(k, hd, w.k_norm.data(), s.eps, k);
            cpu::rope_neox(k, s.n_rot, pos, s.freq_base);
        }
    });
    for (size_t i = 0; i < a.sequences.size(); ++i) {
        const SequenceRows& rows = a.sequences[i];
        AttentionCache& c = *a.caches[i];
        std::copy_n(k_new + rows.begin * kv_width, rows.count * kv_width, c.k.data() + rows.pos0 * kv_width);
        std::copy_n(v_new + rows.begin * kv_width, rows.count * kv_width, c.v.data() + rows.pos0 * kv_width);
    }

    // The cells each row attends to: QSA picks them per row; dense attention takes 0..pos, a prefix of one ramp.
    const bool sparse = has_indexer(a.indexer);
    int32_t* cells = nullptr;
    int64_t* n_cells = nullptr;
    int64_t cells_stride = 0;
    if (sparse) {
        const float* index_q = index_append(a);
        const IndexerShape& ix = *a.indexer;
        cells_stride = qsa_max_cells(ix);
        cells = scratch.take<int32_t>(T * cells_stride);
        n_cells = scratch.take<int64_t>(T);
        run(a.pool, T, [&](int64_t begin, int64_t end) {
            thread_local std::vector<float> scores;
            thread_local QsaSelectScratch select_scratch;
            for (int64_t t = begin; t < end; ++t) {
                const int64_t pos = row_pos(t);
                scores.resize(static_cast<size_t>((pos + 1) / ix.ratio + 1));
                n_cells[t] = qsa_select_into(ix, index_q + t * ix.n_head * ix.head_dim,
                                             a.caches[static_cast<size_t>(row_seq[t])]->index_pooled.data(), pos,
                                             cells + t * cells_stride, scores.data(), select_scratch);
            }
        });
    } else {
        cells = scratch.take<int32_t>(max_pos + 1);
        std::iota(cells, cells + max_pos + 1, 0);
    }

    float* heads = scratch.take<float>(T * nh * hd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    run(a.pool, T * nh, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
            const int64_t t = item / nh, h = item % nh;
            const AttentionCache& c = *a.caches[static_cast<size_t>(row_seq[t])];
            const std::span<const int32_t> row_cells =
                sparse ? std::span<const int32_t>(cells + t * cells_stride, static_cast<size_t>(n_cells[t]))
                       : std::span<const int32_t>(cells, static_cast<size_t>(row_pos(t) + 1));
            const int64_t kvh = h / (nh / nkv);
            float* o = heads + (t * nh + h) * hd;
            cpu::attend({.q = qg + (t * nh + h) * 2 * hd,
                         .keys = c.k.data() + kvh * hd,
                         .values = c.v.data() + kvh * hd,
                         .row_stride = kv_width,
                         .head_dim = hd,
                         .cells = row_cells,
                         .scale = scale,
                         .out = o});
            float* gate = qg + (t * nh + h) * 2 * hd + hd;  // read only here: the sigmoid goes in place
            cpu::sigmoid_inplace(gate, hd);
            for (int64_t d = 0; d < hd; ++d) o[d] *= gate[d];
        }
    });
    cpu::matmul({.w = w.o, .x = heads, .y = a.out, .n_tokens = T, .pool = a.pool});
}

}  // namespace strata
