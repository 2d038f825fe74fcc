// The single-stream hybrids (qwen35moe, qwen3next): one residual stream; each block is attn_norm -> Gated DeltaNet or
// gated attention -> residual add -> post_attention_norm -> MoE -> residual add; output_norm feeds the head; the GDN
// output gate is SiLU. What differs between the two architectures is stated in their own files.
#include "model/single_stream.h"

#include <string>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/hybrid.h"
#include "model/moe.h"

namespace strata {

namespace {

struct SingleStreamHparams {
    float eps = 1e-6f;
    std::vector<bool> recurrent;
    AttentionShape attention;
    GdnShape gdn;
    MoeShape moe;
};

struct SingleStreamBlock {
    bool recurrent = true;
    std::vector<float> attn_norm, post_attention_norm;
    GdnWeights gdn;
    AttentionWeights attention;
    MoeWeights moe;
};

class SingleStreamModel final : public HybridModel {
  public:
    SingleStreamModel(std::unique_ptr<gguf::File> file, const LoadOptions& options, const SingleStreamArch& arch)
        : HybridModel(std::move(file), options) {
        HparamReader hp(*file_, arch.name);
        const int64_t H = info_.n_embd;
        h_.eps = hp.f32("attention.layer_norm_rms_epsilon");
        h_.recurrent = recurrent_layer_map(hp, n_block_all_, info_.n_layer);
        h_.attention = read_attention_shape(hp, H, h_.recurrent, n_block_all_, h_.eps);
        h_.gdn = read_gdn_shape(hp, H, h_.eps);
        h_.gdn.tiled_value_heads = arch.tiled_value_heads;
        h_.gdn.output_gate = GateActivation::Silu;
        h_.moe = read_moe_shape(hp, H, n_block_all_);

        TensorBinder binder(*file_, packer());
        bind_embeddings(binder);
        output_norm_ = binder.require_f32("output_norm.weight", {H});
        for (int64_t il = 0; il < info_.n_layer; ++il) {
            SingleStreamBlock b;
            b.recurrent = h_.recurrent[static_cast<size_t>(il)];
            b.attn_norm = binder.require_f32(block_tensor(il, "attn_norm.weight"), {H});
            b.post_attention_norm = binder.require_f32(block_tensor(il, "post_attention_norm.weight"), {H});
            if (b.recurrent)
                b.gdn = bind_gdn(binder, il, h_.gdn);
            else
                b.attention = bind_attention(binder, il, h_.attention, nullptr);
            b.moe = bind_moe(binder, il, h_.moe);
            blocks_.push_back(std::move(b));
        }
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
                             .pool = pool()});
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
            moe_forward({.shape = h_.moe,
                         .weights = b.moe,
                         .x = normed,
                         .out = out,
                         .n_tokens = T,
                         .scratch = scratch,
                         .pool = pool()});
            for (int64_t i = 0; i < T * H; ++i) residual[i] += out[i];
        }
        for (int64_t t = 0; t < T; ++t) cpu::rms_norm(residual + t * H, H, output_norm_.data(), h_.eps, hidden + t * H);
    }

    SingleStreamHparams h_;
    std::vector<float> output_norm_;
    std::vector<SingleStreamBlock> blocks_;
};

}  // namespace

std::unique_ptr<Model> load_single_stream(std::unique_ptr<gguf::File> file, const LoadOptions& options,
                                          const SingleStreamArch& arch) {
    return std::make_unique<SingleStreamModel>(std::move(file), options, arch);
}

}  // namespace strata
