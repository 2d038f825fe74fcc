#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/ops.h"
#include "core/error.h"

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

std::vector<int32_t> qsa_select(const IndexerShape& s, const float* q, const float* pooled, int64_t pos) {
    const int64_t n_visible = pos + 1;
    const int64_t n_blocks = n_visible / s.ratio;
    std::vector<int32_t> cells;
    if (n_blocks > 0) {
        std::vector<float> scores(static_cast<size_t>(n_blocks));
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
        for (int64_t b = 0; b < n_blocks; ++b) {
            float sum = 0.0f;
            for (int64_t h = 0; h < s.n_head; ++h)
                sum += std::max(0.0f, cpu::dot(q + h * s.head_dim, pooled + b * s.head_dim, s.head_dim));
            scores[b] = sum * scale;
        }
        std::vector<int32_t> blocks = cpu::top_k(scores.data(), n_blocks, std::min(s.budget / s.ratio, n_blocks));
        std::sort(blocks.begin(), blocks.end());
        for (int32_t b : blocks)
            for (int64_t i = 0; i < s.ratio; ++i) cells.push_back(static_cast<int32_t>(b * s.ratio + i));
    }
    for (int64_t c = n_blocks * s.ratio; c < n_visible; ++c) cells.push_back(static_cast<int32_t>(c));
    return cells;
}

namespace {

// Indexer keys of the new tokens go to the cache raw; every block they complete gets its pooled key: the mean of its
// raw keys, k_norm, rope at the block's first position.
void index_append(const AttentionForwardArgs& a, std::vector<float>& index_q) {
    const IndexerShape& ix = *a.indexer;
    const AttentionWeights& w = a.weights;
    const int64_t T = a.n_tokens, di = ix.head_dim;
    AttentionCache& c = a.cache;
    cpu::matmul({.w = *w.index_k, .x = a.x, .y = c.index_raw.data() + a.pos0 * di, .n_tokens = T, .pool = a.pool});
    const int64_t n_complete = (a.pos0 + T) / ix.ratio;
    for (; c.n_pooled < n_complete; ++c.n_pooled) {
        float* pooled = c.index_pooled.data() + c.n_pooled * di;
        for (int64_t d = 0; d < di; ++d) {
            float sum = 0.0f;
            for (int64_t i = 0; i < ix.ratio; ++i) sum += c.index_raw[(c.n_pooled * ix.ratio + i) * di + d];
            pooled[d] = sum / static_cast<float>(ix.ratio);
        }
        cpu::rms_norm(pooled, di, w.index_k_norm.data(), a.shape.eps, pooled);
        cpu::rope_neox(pooled, a.shape.n_rot, c.n_pooled * ix.ratio, a.shape.freq_base);
    }
    index_q.resize(static_cast<size_t>(T * ix.n_head * di));
    cpu::matmul({.w = *w.index_q, .x = a.x, .y = index_q.data(), .n_tokens = T, .pool = a.pool});
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < ix.n_head; ++h) {
            float* q = index_q.data() + (t * ix.n_head + h) * di;
            cpu::rms_norm(q, di, w.index_q_norm.data(), a.shape.eps, q);
            cpu::rope_neox(q, a.shape.n_rot, a.pos0 + t, a.shape.freq_base);
        }
}

}  // namespace

void attention_forward(const AttentionForwardArgs& a) {
    const AttentionShape& s = a.shape;
    const AttentionWeights& w = a.weights;
    const int64_t T = a.n_tokens, hd = s.head_dim, nh = s.n_head, nkv = s.n_head_kv;
    const int64_t kv_width = nkv * hd;
    STRATA_ASSERT(nh % nkv == 0);
    AttentionCache& c = a.cache;
    STRATA_ASSERT(static_cast<int64_t>(c.k.size()) >= (a.pos0 + T) * kv_width);

    std::vector<float> qg(static_cast<size_t>(T * 2 * hd * nh));
    cpu::matmul({.w = w.q, .x = a.x, .y = qg.data(), .n_tokens = T, .pool = a.pool});
    float* k_new = c.k.data() + a.pos0 * kv_width;
    float* v_new = c.v.data() + a.pos0 * kv_width;
    cpu::matmul({.w = w.k, .x = a.x, .y = k_new, .n_tokens = T, .pool = a.pool});
    cpu::matmul({.w = w.v, .x = a.x, .y = v_new, .n_tokens = T, .pool = a.pool});
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < nh; ++h) {
            float* q = qg.data() + (t * nh + h) * 2 * hd;
            cpu::rms_norm(q, hd, w.q_norm.data(), s.eps, q);
            cpu::rope_neox(q, s.n_rot, a.pos0 + t, s.freq_base);
        }
        for (int64_t h = 0; h < nkv; ++h) {
            float* k = k_new + t * kv_width + h * hd;
            cpu::rms_norm(k, hd, w.k_norm.data(), s.eps, k);
            cpu::rope_neox(k, s.n_rot, a.pos0 + t, s.freq_base);
        }
    }

    const bool sparse = has_indexer(a.indexer);
    std::vector<float> index_q;
    if (sparse) index_append(a, index_q);

    std::vector<float> heads(static_cast<size_t>(T * nh * hd));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t t = 0; t < T; ++t) {
        const int64_t pos = a.pos0 + t;
        std::vector<int32_t> cells;
        if (sparse) {
            cells = qsa_select(*a.indexer, index_q.data() + t * a.indexer->n_head * a.indexer->head_dim,
                               c.index_pooled.data(), pos);
        } else {
            cells.resize(static_cast<size_t>(pos + 1));
            std::iota(cells.begin(), cells.end(), 0);
        }
        for (int64_t h = 0; h < nh; ++h) {
            const int64_t kvh = h / (nh / nkv);
            float* o = heads.data() + (t * nh + h) * hd;
            cpu::attend({.q = qg.data() + (t * nh + h) * 2 * hd,
                         .keys = c.k.data() + kvh * hd,
                         .values = c.v.data() + kvh * hd,
                         .row_stride = kv_width,
                         .head_dim = hd,
                         .cells = cells,
                         .scale = scale,
                         .out = o});
            const float* gate = qg.data() + (t * nh + h) * 2 * hd + hd;
            for (int64_t d = 0; d < hd; ++d) o[d] *= cpu::sigmoid(gate[d]);
        }
    }
    cpu::matmul({.w = w.o, .x = heads.data(), .y = a.out, .n_tokens = T, .pool = a.pool});
}

}  // namespace strata
