// qwen4exp's MTP draft layer (issue 28): binding of llama.cpp's nextn block and its forward pass over a run of cells.
// The math follows the training code (tools/train/model.py, MTPHead.forward), which is what the weights learnt.
#include <algorithm>
#include <string>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/qwen4exp.h"

namespace strata {

namespace {

// The MTP layer's cells of one sequence: its K/V cache.
class Qwen4ExpDraftState final : public DraftState {
  public:
    Qwen4ExpDraftState(const void* owner, const AttentionShape& shape, int64_t capacity)
        : owner_(owner), capacity_(capacity) {
        cache.init(shape, nullptr, capacity);
    }
    int64_t capacity() const override { return capacity_; }
    const void* owner() const { return owner_; }
    AttentionCache cache;

  private:
    const void* owner_;
    int64_t capacity_;
};

}  // namespace

Qwen4ExpDraftLayer::Qwen4ExpDraftLayer(const void* owner, const Qwen4ExpHparams& h, Qwen4ExpMtp w, Tensor token_embd,
                                       int64_t n_vocab)
    : owner_(owner), h_(h), w_(std::move(w)), token_embd_(token_embd), n_vocab_(n_vocab) {}

std::unique_ptr<DraftState> Qwen4ExpDraftLayer::new_state(int64_t capacity) const {
    if (capacity <= 0) throw Error("new_draft_state: the capacity must be positive");
    return std::make_unique<Qwen4ExpDraftState>(owner_, h_.attention, capacity);
}

const float* Qwen4ExpDraftLayer::run(DraftState& state, int64_t pos0, std::span<const float> residual,
                                     std::span<const int32_t> tokens, std::span<float> logits,
                                     std::span<float> residual_out, Scratch& scratch, ThreadPool* pool) const {
    auto* st = dynamic_cast<Qwen4ExpDraftState*>(&state);
    if (!st || st->owner() != owner_) throw Error("draft_forward: the draft state was not created by this model");
    const int64_t n = std::ssize(tokens), width = this->width(), H = h_.hc.n_embd;
    if (n == 0) throw Error("draft_forward: no cells given");
    if (pos0 < 0 || pos0 + n > st->capacity())
        throw Error("draft_forward: cells " + std::to_string(pos0) + ".." + std::to_string(pos0 + n - 1) +
                    " do not fit a draft state of " + std::to_string(st->capacity()) + " cells");
    if (std::ssize(residual) < n * width) throw Error("draft_forward: the residual holds fewer than n rows");
    if (std::ssize(logits) < n_vocab_) throw Error("draft_forward: the logits need n_vocab floats");
    if (!residual_out.empty() && std::ssize(residual_out) < width)
        throw Error("draft_forward: residual_out needs one row of the residual's width");
    for (const int32_t id : tokens)
        if (id < 0 || id >= n_vocab_)
            throw Error("draft_forward: token id " + std::to_string(id) + " is out of range (vocabulary of " +
                        std::to_string(n_vocab_) + ")");
    float* emb = scratch.take<float>(n * H);
    float* hidden = scratch.take<float>(n * H);
    float* rows_out = residual_out.empty() ? nullptr : scratch.take<float>(n * width);
    for (int64_t t = 0; t < n; ++t) cpu::get_row(token_embd_, tokens[static_cast<size_t>(t)], emb + t * H);
    qwen4exp_mtp_forward({.h = h_,
                          .w = w_,
                          .cache = st->cache,
                          .pos0 = pos0,
                          .residual = residual.data(),
                          .embeddings = emb,
                          .n = n,
                          .hidden = hidden,
                          .residual_out = rows_out,
                          .scratch = scratch,
                          .pool = pool});
    // Only the last cell drafts; the cells before it are the catch-up of cells the trunk has confirmed.
    if (rows_out) std::copy_n(rows_out + (n - 1) * width, width, residual_out.data());
    return hidden + (n - 1) * H;
}

std::optional<Qwen4ExpMtp> bind_qwen4exp_mtp(const TensorBinder& binder, const Qwen4ExpHparams& h, int64_t n_layer,
                                             int64_t n_block_all) {
    if (n_block_all <= n_layer) return std::nullopt;
    const int64_t H = h.hc.n_embd, HC = h.hc.n_streams * H;
    Qwen4ExpMtp m;
    m.block = n_layer;
    auto name = [&](const char* n) { return block_tensor(n_layer, n); };
    m.enorm = binder.require_f32(name("nextn.enorm.weight"), {H});
    m.hnorm = binder.require_f32(name("nextn.hnorm.weight"), {HC});
    m.eh_proj = binder.require(name("nextn.eh_proj.weight"), {2 * H, H});
    m.hc_attn = bind_hyper_connection(binder, block_tensor(n_layer, "hc_attn"), h.hc, true);
    m.hc_ffn = bind_hyper_connection(binder, block_tensor(n_layer, "hc_ffn"), h.hc, true);
    m.attention = bind_attention(binder, n_layer, h.attention, nullptr);  // dense: no indexer
    m.moe = bind_moe(binder, n_layer, h.moe);
    m.head_hc = bind_hyper_connection(binder, block_tensor(n_layer, "nextn.hc_head"), h.hc, false);
    return m;
}

void qwen4exp_mtp_forward(const Qwen4ExpMtpArgs& a) {
    const Qwen4ExpHparams& h = a.h;
    const int64_t n = a.n, hc = h.hc.n_streams, H = h.hc.n_embd, HC = hc * H;
    Scratch& scratch = a.scratch;

    // eh_proj's input for cell t, stream s: [enorm(e_t) ; hnorm(R_t)_s]. hnorm is one RMS over all streams
    // (pre_fc_norm_hidden is an RMSNorm of width HC), then fc_hidden applies per stream.
    float* cat = scratch.take<float>(n * hc * 2 * H);
    parallel_each(a.pool, n, [&](int64_t t) {
        float* row0 = cat + t * hc * 2 * H;
        cpu::rms_norm(a.embeddings + t * H, H, a.w.enorm.data(), h.eps, row0);
        for (int64_t s = 1; s < hc; ++s) std::copy_n(row0, H, row0 + s * 2 * H);
    });
    float* hn = scratch.take<float>(n * HC);
    parallel_each(a.pool, n, [&](int64_t t) {
        cpu::rms_norm(a.residual + t * HC, HC, a.w.hnorm.data(), h.eps, hn + t * HC);
        for (int64_t s = 0; s < hc; ++s) std::copy_n(hn + t * HC + s * H, H, cat + (t * hc + s) * 2 * H + H);
    });
    float* residual = scratch.take<float>(n * HC);  // rows (t, s): the layout of the trunk's residual
    cpu::matmul({.w = a.w.eh_proj, .x = cat, .y = residual, .n_tokens = n * hc, .pool = a.pool});

    // One trunk attention block (dense), its rows at positions pos0.. of the layer's own cells.
    float* mixed = scratch.take<float>(n * H);
    float* out = scratch.take<float>(n * H);
    float* inject = scratch.take<float>(n * hc);
    AttentionCache* caches[] = {&a.cache};
    const SequenceRows rows[] = {{.begin = 0, .count = n, .pos0 = a.pos0}};
    qwen4exp_block({.h = h,
                    .hc_attn = a.w.hc_attn,
                    .hc_ffn = a.w.hc_ffn,
                    .moe = a.w.moe,
                    .layer = a.w.block,
                    .residual = residual,
                    .mixed = mixed,
                    .out = out,
                    .inject = inject,
                    .n_tokens = n,
                    .scratch = scratch,
                    .pool = a.pool},
                   [&] {
                       attention_forward({.shape = h.attention,
                                          .indexer = nullptr,
                                          .weights = a.w.attention,
                                          .caches = caches,
                                          .sequences = rows,
                                          .x = mixed,
                                          .out = out,
                                          .n_tokens = n,
                                          .scratch = scratch,
                                          .pool = a.pool});
                   });
    if (a.residual_out) std::copy_n(residual, n * HC, a.residual_out);
    hyper_connection_read({.shape = h.hc,
                           .weights = a.w.head_hc,
                           .residual = residual,
                           .mixed = a.hidden,
                           .inject = nullptr,
                           .n_tokens = n,
                           .scratch = scratch,
                           .pool = a.pool});
}

}  // namespace strata
