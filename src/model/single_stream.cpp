// The single-stream hybrids (qwen35moe, qwen3next): one residual stream; each block is attn_norm -> Gated DeltaNet or
// gated attention -> residual add -> post_attention_norm -> MoE (or qwen3next's dense MLP) -> residual add;
// output_norm feeds the head; the GDN output gate is SiLU. What differs between the two architectures is stated in
// their own files.
#include "model/single_stream.h"

#include <string>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/hybrid.h"
#include "model/moe.h"

namespace strata {

namespace {

class SingleStreamModel final : public HybridModel {
  public:
    SingleStreamModel(std::unique_ptr<gguf::File> file, const LoadOptions& options, const SingleStreamArch& arch)
        : HybridModel(std::move(file), options) {
        h_ = read_single_stream_hparams(*file_, arch, info_, n_block_all_);
        TensorBinder binder(*file_, packer());
        bind_embeddings(binder);
        output_norm_ = binder.require_f32("output_norm.weight", {info_.n_embd});
        blocks_ = bind_single_stream_blocks(binder, h_, info_.n_layer);
    }

  private:
    void init_layers(std::vector<LayerState>& layers, int64_t capacity) const override {
        layers.resize(blocks_.size());
        for (size_t il = 0; il < blocks_.size(); ++il) {
            if (blocks_[il].recurrent)
                layers[il].gdn.init(h_.gdn);
            else
                layers[il].attention.init(h_.attention, nullptr, capacity);
        }
    }

    void trunk(const TrunkBatch& batch, float* hidden) const override {
        const int64_t T = batch.n_rows();
        const int64_t H = info_.n_embd;
        Scratch& scratch = batch.scratch;
        float* residual = scratch.take<float>(T * H);
        float* normed = scratch.take<float>(T * H);
        float* out = scratch.take<float>(T * H);
        embed(batch.tokens, residual);
        for (size_t il = 0; il < blocks_.size(); ++il) {
            const SingleStreamBlock& b = blocks_[il];
            const ScratchFrame frame(scratch);  // this block's buffers are reused by the next
            for (int64_t t = 0; t < T; ++t)
                cpu::rms_norm(residual + t * H, H, b.attn_norm.data(), h_.eps, normed + t * H);
            if (b.recurrent) {
                gdn_forward({.shape = h_.gdn,
                             .weights = b.gdn,
                             .states = batch.states(il, &LayerState::gdn),
                             .sequences = batch.rows,
                             .x = normed,
                             .out = out,
                             .n_tokens = T,
                             .scratch = scratch,
                             .pool = pool(),
                             .windows = batch.windows(il, &LayerState::gdn_window)});
            } else {
                attention_forward({.shape = h_.attention,
                                   .indexer = nullptr,
                                   .weights = b.attention,
                                   .caches = batch.states(il, &LayerState::attention),
                                   .sequences = batch.rows,
                                   .x = normed,
                                   .out = out,
                                   .n_tokens = T,
                                   .scratch = scratch,
                                   .pool = pool()});
            }
            for (int64_t i = 0; i < T * H; ++i) residual[i] += out[i];

            for (int64_t t = 0; t < T; ++t)
                cpu::rms_norm(residual + t * H, H, b.post_attention_norm.data(), h_.eps, normed + t * H);
            if (b.dense)
                dense_ffn_forward({.weights = b.ffn,
                                   .n_embd = H,
                                   .x = normed,
                                   .out = out,
                                   .n_tokens = T,
                                   .scratch = scratch,
                                   .pool = pool()});
            else
                moe_forward({.shape = h_.moe,
                             .weights = b.moe,
                             .x = normed,
                             .out = out,
                             .n_tokens = T,
                             .scratch = scratch,
                             .pool = pool(),
                             .layer = static_cast<int64_t>(il),
                             .routing = routing()});
            for (int64_t i = 0; i < T * H; ++i) residual[i] += out[i];
        }
        for (int64_t t = 0; t < T; ++t) cpu::rms_norm(residual + t * H, H, output_norm_.data(), h_.eps, hidden + t * H);
    }

    SingleStreamHparams h_;
    std::vector<float> output_norm_;
    std::vector<SingleStreamBlock> blocks_;
};

}  // namespace

SingleStreamHparams read_single_stream_hparams(const gguf::File& file, const SingleStreamArch& arch,
                                               const ModelInfo& info, int64_t n_block_all) {
    HparamReader hp(file, arch.name);
    const int64_t H = info.n_embd;
    SingleStreamHparams h;
    h.eps = hp.f32("attention.layer_norm_rms_epsilon");
    h.recurrent = recurrent_layer_map(hp, n_block_all, info.n_layer);
    h.attention = read_attention_shape(hp, H, h.recurrent, n_block_all, h.eps);
    h.gdn = read_gdn_shape(hp, H, h.eps);
    h.gdn.tiled_value_heads = arch.tiled_value_heads;
    h.gdn.output_gate = GateActivation::Silu;
    h.moe = read_moe_shape(hp, H, n_block_all);
    h.dense_mlp.assign(static_cast<size_t>(info.n_layer), false);
    const std::vector<int64_t> dense = hp.strata_int_array("dense_mlp_layers");
    for (size_t i = 0; i < dense.size(); ++i) {
        if (dense[i] < 0 || dense[i] >= info.n_layer || (i > 0 && dense[i] <= dense[i - 1]))
            throw Error(file.path() + ": key " + hp.strata_key("dense_mlp_layers") +
                        " must list trunk blocks in ascending order, each once");
        h.dense_mlp[static_cast<size_t>(dense[i])] = true;
    }
    if (!dense.empty()) {
        h.n_ff_dense = hp.per_block("feed_forward_length", n_block_all, 0)[static_cast<size_t>(dense[0])];
        if (h.n_ff_dense <= 0)
            throw Error(file.path() + ": key " + hp.key("feed_forward_length") + " is missing (the width of the " +
                        "dense MLP blocks " + hp.strata_key("dense_mlp_layers") + " lists)");
    }
    return h;
}

std::vector<SingleStreamBlock> bind_single_stream_blocks(const TensorBinder& binder, const SingleStreamHparams& h,
                                                         int64_t n_layer) {
    const int64_t H = h.attention.n_embd;
    std::vector<SingleStreamBlock> blocks;
    for (int64_t il = 0; il < n_layer; ++il) {
        SingleStreamBlock b;
        b.recurrent = h.recurrent[static_cast<size_t>(il)];
        b.attn_norm = binder.require_f32(block_tensor(il, "attn_norm.weight"), {H});
        b.post_attention_norm = binder.require_f32(block_tensor(il, "post_attention_norm.weight"), {H});
        if (b.recurrent)
            b.gdn = bind_gdn(binder, il, h.gdn);
        else
            b.attention = bind_attention(binder, il, h.attention, nullptr);
        b.dense = h.dense_mlp[static_cast<size_t>(il)];
        if (b.dense)
            b.ffn = bind_dense_ffn(binder, il, H, h.n_ff_dense);
        else
            b.moe = bind_moe(binder, il, h.moe);
        blocks.push_back(std::move(b));
    }
    return blocks;
}

std::unique_ptr<Model> load_single_stream(std::unique_ptr<gguf::File> file, const LoadOptions& options,
                                          const SingleStreamArch& arch) {
#if STRATA_HAS_CUDA
    if (options.backend == Backend::Cuda) return load_single_stream_cuda(std::move(file), options, arch);
#endif
    return std::make_unique<SingleStreamModel>(std::move(file), options, arch);
}

}  // namespace strata
