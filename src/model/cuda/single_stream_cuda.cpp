// qwen35moe and qwen3next on CUDA (issue 7): the single-stream trunk of single_stream.cpp over the CUDA backend's ops
// (the shared machinery, windows and graphs in hybrid_cuda.h): attn_norm -> GDN or gated attention -> residual add
// -> post_attention_norm -> MoE (or qwen3next's dense MLP) -> residual add; output_norm feeds the head.
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/block_ops.h"
#include "model/cuda/hybrid_cuda.h"
#include "model/hybrid.h"
#include "model/single_stream.h"

namespace strata {

namespace {

using namespace cuda_model;

struct BlockDevice {
    bool recurrent = true;
    const float *attn_norm = nullptr, *post_attention_norm = nullptr;
    GdnDevice gdn{};
    AttentionDevice attention{};
    MoeDevice moe;  // unless dense
    bool dense = false;
    const Tensor *ffn_gate = nullptr, *ffn_up = nullptr, *ffn_down = nullptr;  // qwen3next's dense MLP blocks
};

class SingleStreamCudaModel final : public CudaHybridModel {
  public:
    SingleStreamCudaModel(std::unique_ptr<gguf::File> file, const LoadOptions& options, const SingleStreamArch& arch)
        : CudaHybridModel(std::move(file), options) {
        h_ = read_single_stream_hparams(*file_, arch, info_, n_block_all_);
        TensorBinder binder(*file_);
        const HybridEmbeddings embeddings = bind_hybrid_embeddings(*file_, binder, info_);
        const std::vector<float> output_norm = binder.require_f32("output_norm.weight", {info_.n_embd});
        if (last_stage()) output_norm_ = weights_->floats(output_norm);
        const std::vector<SingleStreamBlock> all_blocks = bind_single_stream_blocks(binder, h_, info_.n_layer);
        // This model's blocks (all of them, or a stage's of a split).
        const std::span<const SingleStreamBlock> blocks(all_blocks.data() + first_block_,
                                                        static_cast<size_t>(end_block_ - first_block_));
        std::vector<BlockLayout> layout;
        for (const SingleStreamBlock& b : blocks) layout.push_back({.recurrent = b.recurrent});
        set_shapes(h_.gdn, h_.attention, std::move(layout), nullptr);
        for (const SingleStreamBlock& b : blocks) {
            BlockDevice d;
            d.recurrent = b.recurrent;
            d.attn_norm = weights_->floats(b.attn_norm);
            d.post_attention_norm = weights_->floats(b.post_attention_norm);
            if (b.recurrent)
                d.gdn = upload_gdn(b.gdn);
            else
                d.attention = upload_attention(b.attention, IndexerShape{});
            d.dense = b.dense;
            if (b.dense) {
                d.ffn_gate = weights_->tensor(b.ffn.gate);
                d.ffn_up = weights_->tensor(b.ffn.up);
                d.ffn_down = weights_->tensor(b.ffn.down);
            } else {
                d.moe = upload_moe(b.moe, h_.moe, first_block_ + static_cast<int64_t>(blocks_.size()));
            }
            blocks_.push_back(std::move(d));
        }
        // The dense MLP's gate and up rows of one window (its own buffer: the shared window buffers are cut for
        // the MoE).
        if (h_.n_ff_dense > 0) {
            const size_t floats = static_cast<size_t>(prompt_window_ * ((h_.n_ff_dense + 3) / 4 * 4));
            ffn_buffer_ = ctx_->allocate(2 * floats * sizeof(float), "window");
            ffn_gate_ = static_cast<float*>(ffn_buffer_.data());
            ffn_up_ = ffn_gate_ + floats;
        }
        finish_loading({.n_streams = 1}, first_stage() ? weights_->tensor(embeddings.token_embd) : nullptr,
                       last_stage() ? weights_->tensor(embeddings.output) : nullptr);
    }

  private:
    void norm(const float* x, float* out, const float* gamma, int64_t T) const {
        cuda::rms_norm_grouped(*ctx_, {.x = x,
                                       .out = out,
                                       .n_tokens = T,
                                       .n_groups = 1,
                                       .group = info_.n_embd,
                                       .gamma = gamma,
                                       .eps = h_.eps});
    }

    void enqueue_window(CudaSequence& s, int64_t T) const override {
        cuda::Context& ctx = *ctx_;
        const int64_t H = info_.n_embd;
        mark(kEmbed);
        if (first_stage())  // a later stage of a split: the residual was handed in (handoff_rows)
            cuda::embed_rows(ctx, {.table = token_embd_,
                                   .tokens = w_.tokens,
                                   .n_tokens = T,
                                   .copies = 1,
                                   .out = w_.residual,
                                   .staging = w_.embed_staging});
        for (size_t il = 0; il < blocks_.size(); ++il) {
            const BlockDevice& b = blocks_[il];
            LayerDeviceState& l = s.layers[il];
            mark(kResidual);
            norm(w_.residual, w_.mixed, b.attn_norm, T);
            if (b.recurrent)
                gdn_window(b.gdn, l, w_.mixed, w_.out, T);
            else
                attention_window(b.attention, s, l, w_.mixed, w_.out, T);
            mark(kResidual);
            cuda::add_inplace(ctx, w_.residual, w_.out, T * H);
            norm(w_.residual, w_.mixed, b.post_attention_norm, T);
            if (b.dense)
                dense_ffn_window(b, w_.mixed, w_.out, T);
            else
                moe_window(b.moe, w_.mixed, w_.out, T);
            mark(kResidual);
            cuda::add_inplace(ctx, w_.residual, w_.out, T * H);
        }
        if (last_stage()) norm(w_.residual, w_.hidden, output_norm_, T);
    }

    // out = down . (silu(gate . x) * up . x), as dense_ffn_forward (the CPU's) computes it.
    void dense_ffn_window(const BlockDevice& b, const float* x, float* out, int64_t T) const {
        cuda::Context& ctx = *ctx_;
        mark(kMoe);
        cuda::matmul_shared_input(ctx, x, T, {{b.ffn_gate, ffn_gate_}, {b.ffn_up, ffn_up_}});
        cuda::silu_mul(ctx, ffn_gate_, ffn_up_, T * h_.n_ff_dense);
        cuda::matmul(ctx, {.w = *b.ffn_down, .x = ffn_gate_, .y = out, .n_tokens = T});
    }

    SingleStreamHparams h_;
    const float* output_norm_ = nullptr;
    std::vector<BlockDevice> blocks_;
    cuda::DeviceBuffer ffn_buffer_;
    float *ffn_gate_ = nullptr, *ffn_up_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> load_single_stream_cuda(std::unique_ptr<gguf::File> file, const LoadOptions& options,
                                               const SingleStreamArch& arch) {
    return std::make_unique<SingleStreamCudaModel>(std::move(file), options, arch);
}

}  // namespace strata
