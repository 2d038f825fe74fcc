// qwen4exp (Qwen3.8-Flash-Next): hyper-connection residual of hc streams; each block reads through a gated mix,
// runs Gated DeltaNet or QSA attention, writes back, reads again, runs the MoE, writes back. GDN blocks may first
// add per-layer n-gram embeddings (PLE), each with its own table and hashes. A final mixer (no norm) feeds the head.
// Math: transformers Qwen4ExpTextModel; GGUF names, keys and conventions: gguf-qwen4exp.md sections 1.4, 2.1-2.2, 7.
#include <algorithm>
#include <cstdio>
#include <string>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "format/gguf_names.h"
#include "model/hybrid.h"
#include "model/hyper_connection.h"
#include "model/moe.h"
#include "model/qwen4exp.h"

namespace strata {

namespace {

class Qwen4ExpModel final : public HybridModel {
  public:
    Qwen4ExpModel(std::unique_ptr<gguf::File> file, const LoadOptions& options)
        : HybridModel(std::move(file), options) {
        h_ = read_qwen4exp_hparams(*file_, info_, n_block_all_);
        TensorBinder binder(*file_, packer());
        bind_embeddings(binder);
        output_hc_ = bind_hyper_connection(binder, "output_hc", h_.hc, false);
        blocks_ = bind_qwen4exp_blocks(binder, h_, info_.n_layer);
        // The trunk never reads the MTP block: a file whose block is incomplete still runs, without MTP drafts.
        try {
            if (auto mtp = bind_qwen4exp_mtp(binder, h_, info_.n_layer, n_block_all_))
                mtp_.emplace(this, h_, std::move(*mtp), token_embd_, info_.n_vocab);
        } catch (const Error& e) {
            std::fprintf(stderr, "strata: no MTP drafts: %s\n", e.what());
        }
    }

    int64_t draft_residual_width() const override { return mtp_ ? mtp_->width() : 0; }

    std::unique_ptr<DraftState> new_draft_state(int64_t capacity) const override {
        if (!mtp_) throw Error("this model has no MTP draft layer");
        return mtp_->new_state(capacity);
    }

    void draft_forward(DraftState& state, int64_t pos0, std::span<const float> residual,
                       std::span<const int32_t> tokens, std::span<float> logits,
                       std::span<float> residual_out) const override {
        if (!mtp_) throw Error("this model has no MTP draft layer");
        exclusive([&](Scratch& scratch) {
            const float* hidden = mtp_->run(state, pos0, residual, tokens, logits, residual_out, scratch, pool());
            cpu::matmul({.w = output_, .x = hidden, .y = logits.data(), .n_tokens = 1, .pool = pool()});
        });
    }

  private:
    void init_layers(std::vector<LayerState>& layers, int64_t capacity) const override {
        layers.resize(blocks_.size());
        for (size_t il = 0; il < blocks_.size(); ++il) {
            const Qwen4ExpBlock& b = blocks_[il];
            if (b.recurrent)
                layers[il].gdn.init(h_.gdn);
            else
                layers[il].attention.init(h_.attention, &b.indexer, capacity);
            if (b.has_ple) layers[il].ple.init(b.ple_shape);
        }
    }

    void trunk(const TrunkBatch& batch, float* hidden) const override {
        const int64_t T = batch.n_rows();
        const int64_t H = info_.n_embd, hc = h_.hc.n_streams, HC = hc * H;
        Scratch& scratch = batch.scratch;

        // The residual starts as hc copies of the token embedding.
        float* emb = scratch.take<float>(T * H);
        float* residual = scratch.take<float>(T * HC);
        embed(batch.tokens, emb);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t s = 0; s < hc; ++s) std::copy_n(emb + t * H, H, residual + (t * hc + s) * H);

        float* mixed = scratch.take<float>(T * H);
        float* out = scratch.take<float>(T * H);
        float* inject = scratch.take<float>(T * hc);
        for (size_t il = 0; il < blocks_.size(); ++il) {
            const Qwen4ExpBlock& b = blocks_[il];
            const ScratchFrame frame(scratch);  // this block's buffers are reused by the next
            if (b.has_ple)
                ple_forward({.shape = b.ple_shape,
                             .weights = b.ple,
                             .states = batch.states(il, &LayerState::ple),
                             .sequences = batch.rows,
                             .tokens = batch.tokens.data(),
                             .residual = residual,
                             .n_tokens = T,
                             .scratch = scratch,
                             .pool = pool(),
                             .windows = batch.windows(il, &LayerState::ple_window)});

            qwen4exp_block({.h = h_,
                            .hc_attn = b.hc_attn,
                            .hc_ffn = b.hc_ffn,
                            .moe = b.moe,
                            .layer = static_cast<int64_t>(il),
                            .routing = routing(),
                            .residual = residual,
                            .mixed = mixed,
                            .out = out,
                            .inject = inject,
                            .n_tokens = T,
                            .scratch = scratch,
                            .pool = pool()},
                           [&] {
                               if (b.recurrent)
                                   gdn_forward({.shape = h_.gdn,
                                                .weights = b.gdn,
                                                .states = batch.states(il, &LayerState::gdn),
                                                .sequences = batch.rows,
                                                .x = mixed,
                                                .out = out,
                                                .n_tokens = T,
                                                .scratch = scratch,
                                                .pool = pool(),
                                                .windows = batch.windows(il, &LayerState::gdn_window)});
                               else
                                   attention_forward({.shape = h_.attention,
                                                      .indexer = &b.indexer,
                                                      .weights = b.attention,
                                                      .caches = batch.states(il, &LayerState::attention),
                                                      .sequences = batch.rows,
                                                      .x = mixed,
                                                      .out = out,
                                                      .n_tokens = T,
                                                      .scratch = scratch,
                                                      .pool = pool()});
                           });
        }
        if (batch.residual_out) std::copy_n(residual, T * HC, batch.residual_out);
        hyper_connection_read({.shape = h_.hc,
                               .weights = output_hc_,
                               .residual = residual,
                               .mixed = hidden,
                               .inject = nullptr,
                               .n_tokens = T,
                               .scratch = scratch,
                               .pool = pool()});
    }

    Qwen4ExpHparams h_;
    HyperConnectionWeights output_hc_;
    std::vector<Qwen4ExpBlock> blocks_;
    std::optional<Qwen4ExpDraftLayer> mtp_;
};

}  // namespace

void qwen4exp_block(const Qwen4ExpBlockArgs& a, const std::function<void()>& mixer) {
    auto read = [&](const HyperConnectionWeights& weights) {
        hyper_connection_read({.shape = a.h.hc,
                               .weights = weights,
                               .residual = a.residual,
                               .mixed = a.mixed,
                               .inject = a.inject,
                               .n_tokens = a.n_tokens,
                               .scratch = a.scratch,
                               .pool = a.pool});
    };
    read(a.hc_attn);
    mixer();
    hyper_connection_write(a.h.hc, a.residual, a.out, a.inject, a.n_tokens, a.pool);
    read(a.hc_ffn);
    moe_forward({.shape = a.h.moe,
                 .weights = a.moe,
                 .x = a.mixed,
                 .out = a.out,
                 .n_tokens = a.n_tokens,
                 .scratch = a.scratch,
                 .pool = a.pool,
                 .layer = a.layer,
                 .routing = a.routing});
    hyper_connection_write(a.h.hc, a.residual, a.out, a.inject, a.n_tokens, a.pool);
}

Qwen4ExpHparams read_qwen4exp_hparams(const gguf::File& file, const ModelInfo& info, int64_t n_block_all) {
    HparamReader hp(file, "qwen4exp");
    Qwen4ExpHparams h;
    const int64_t H = info.n_embd;
    const int64_t n_layer = info.n_layer;
    h.eps = hp.f32("attention.layer_norm_rms_epsilon");
    h.recurrent = recurrent_layer_map(hp, n_block_all, n_layer);
    h.hc = {.n_streams = hp.u32("hyper_connection.count"),
            .n_embd = H,
            .low_rank = hp.positive("hyper_connection.low_rank"),
            .eps = h.eps};
    if (h.hc.n_streams <= 1)
        throw Error(file.path() + ": key " + hp.key("hyper_connection.count") + " must be greater than one");

    h.attention = read_attention_shape(hp, H, h.recurrent, n_block_all, h.eps);

    h.compress_ratio = hp.per_block("attention.compress_ratios", n_block_all, 0);
    h.compress_ratio.resize(static_cast<size_t>(n_layer));
    h.indexer = {.n_head = hp.positive("attention.indexer.head_count"),
                 .head_dim = hp.positive("attention.indexer.key_length"),
                 .budget = hp.positive("attention.indexer.top_k")};
    if (h.attention.n_rot > h.indexer.head_dim)
        throw Error(file.path() + ": rope.dimension_count exceeds attention.indexer.key_length");

    h.gdn = read_gdn_shape(hp, H, h.eps);
    h.gdn.tiled_value_heads = true;               // llama.cpp's converter reorders value heads for qwen4exp
    h.gdn.output_gate = GateActivation::Sigmoid;  // qwen4exp's GDN output gate
    h.moe = read_moe_shape(hp, H, n_block_all);

    // llama.cpp's ple.layers names one block; a file with more lists them all in strata.qwen4exp.ple.layers (the
    // first the same) and gives each further block its hash arrays under strata.qwen4exp.ple.blk.N.*.
    const std::vector<int64_t> ple_layers =
        hp.has("ple.layers") ? file.get_int_array(hp.key("ple.layers")) : std::vector<int64_t>{};
    if (ple_layers.size() > 1)
        throw Error(file.path() + ": key " + hp.key("ple.layers") + " lists " + std::to_string(ple_layers.size()) +
                    " PLE blocks; llama.cpp's key takes one (further PLE blocks go in " +
                    hp.strata_key("ple.layers") + ")");
    std::vector<int64_t> blocks = ple_layers;
    if (std::vector<int64_t> all = hp.strata_int_array("ple.layers"); !all.empty()) {
        if (ple_layers.empty() || all[0] != ple_layers[0])
            throw Error(file.path() + ": key " + hp.strata_key("ple.layers") + " must start with the block " +
                        hp.key("ple.layers") + " names");
        for (size_t i = 1; i < all.size(); ++i)
            if (all[i] <= all[i - 1])
                throw Error(file.path() + ": key " + hp.strata_key("ple.layers") + " must list blocks in ascending "
                            "order, each once");
        blocks = std::move(all);
    }
    if (!blocks.empty()) {
        PleShape p;
        p.n_embd = H;
        p.n_streams = h.hc.n_streams;
        p.ngram = hp.u32("ple.ngram_size");
        p.heads_per_ngram = hp.positive("ple.heads_per_ngram");
        p.row_width = hp.positive("embedding_length_per_layer_input");
        p.conv_kernel = hp.positive("ple.conv_kernel");
        p.eos = static_cast<int32_t>(hp.u32("ple.eos_token_id"));
        p.eps = h.eps;
        if (p.ngram < 2 || p.ngram > 8) throw Error(file.path() + ": ple.ngram_size must be in 2..8");
        // The n-gram embedding (n_heads rows side by side) is hidden_size wide in every file llama.cpp loads; one
        // of another width names it in a strata key.
        const int64_t embedding = p.n_heads() * p.row_width;
        if (const auto width = hp.strata_u32("ple.embedding_length"); width && *width != embedding)
            throw Error(file.path() + ": key " + hp.strata_key("ple.embedding_length") + " is " +
                        std::to_string(*width) + ", but " + std::to_string(p.n_heads()) + " PLE heads of " +
                        std::to_string(p.row_width) + " make " + std::to_string(embedding));
        for (size_t k = 0; k < blocks.size(); ++k) {
            const int64_t block = blocks[k];
            if (block < 0 || block >= n_layer || !h.recurrent[static_cast<size_t>(block)])
                throw Error(file.path() + ": PLE layer " + std::to_string(block) +
                            " is not a linear attention layer");
            const std::string prefix = "ple.blk." + std::to_string(block) + ".";
            PleShape shape = p;
            shape.multipliers = k == 0 ? hp.u64_array("ple.layer_multipliers")
                                       : hp.strata_u64_array(prefix + "layer_multipliers");
            shape.offsets =
                k == 0 ? hp.u64_array("ple.head_offsets") : hp.strata_u64_array(prefix + "head_offsets");
            shape.sizes =
                k == 0 ? hp.u64_array("ple.head_vocab_sizes") : hp.strata_u64_array(prefix + "head_vocab_sizes");
            if (static_cast<int64_t>(shape.multipliers.size()) < p.ngram ||
                static_cast<int64_t>(shape.offsets.size()) < p.n_heads() ||
                static_cast<int64_t>(shape.sizes.size()) < p.n_heads())
                throw Error(file.path() + ": the PLE hash arrays of block " + std::to_string(block) +
                            " are shorter than ngram_size / the number of PLE heads");
            h.ple_blocks.push_back(block);
            h.ple_shapes.push_back(std::move(shape));
        }
        h.ple = h.ple_shapes.front();
    }
    return h;
}


std::vector<Qwen4ExpBlock> bind_qwen4exp_blocks(const TensorBinder& binder, const Qwen4ExpHparams& h,
                                                int64_t n_layer) {
    std::vector<Qwen4ExpBlock> blocks;
    for (int64_t il = 0; il < n_layer; ++il) {
        Qwen4ExpBlock b;
        b.recurrent = h.recurrent[static_cast<size_t>(il)];
        b.hc_attn = bind_hyper_connection(binder, block_tensor(il, "hc_attn"), h.hc, true);
        b.hc_ffn = bind_hyper_connection(binder, block_tensor(il, "hc_ffn"), h.hc, true);
        if (b.recurrent) {
            b.gdn = bind_gdn(binder, il, h.gdn);
        } else {
            b.indexer = h.indexer;
            b.indexer.ratio = h.compress_ratio[static_cast<size_t>(il)];
            b.attention = bind_attention(binder, il, h.attention, &b.indexer);
        }
        b.moe = bind_moe(binder, il, h.moe);
        if (const auto at = std::find(h.ple_blocks.begin(), h.ple_blocks.end(), il); at != h.ple_blocks.end()) {
            const size_t k = static_cast<size_t>(at - h.ple_blocks.begin());
            b.has_ple = true;
            b.ple_shape = h.ple_shapes[k];
            b.ple = bind_ple(binder, il, b.ple_shape, ple_table_name(il, k == 0));
        }
        blocks.push_back(std::move(b));
    }
    return blocks;
}

std::unique_ptr<Model> load_qwen4exp(std::unique_ptr<gguf::File> file, const LoadOptions& options) {
#if STRATA_HAS_CUDA
    if (options.backend == Backend::Cuda) return load_qwen4exp_cuda(std::move(file), options);
#endif
    return std::make_unique<Qwen4ExpModel>(std::move(file), options);
}

}  // namespace strata
