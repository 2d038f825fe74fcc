// qwen4exp's MTP draft layer (issue 28): binding of llama.cpp's nextn block and its forward pass over a run of cells.
// The math follows the training code (tools/train/model.py, MTPHead.forward), which is what the weights learnt.
#include <algorithm>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/qwen4exp.h"

namespace strata {

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
