// qwen4exp on CUDA (issue 7): the trunk of qwen4exp.cpp, block by block, over the CUDA backend's ops (the shared
// machinery, windows and graphs in hybrid_cuda.h). Every weight except the PLE tables lives in device memory; each PLE
// table sits in mapped pinned host memory (the real one does not fit in VRAM) and its rows are read over the bus, or,
// when the tables do not fit pinned RAM (LoadOptions::ple_from_file), stays in the file: before each window the host
// hashes the window's rows (it knows the tokens and keeps the n-gram history) and reads them through a PleRowSource
// into pinned staging, which the window copies to the device (the same copy in a decode window's graph).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/block_ops.h"
#include "backend/cuda/model_ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/cuda/hybrid_cuda.h"
#include "model/hybrid.h"
#include "model/qwen4exp.h"

namespace strata {

namespace {

using namespace cuda_model;

struct PleDevice {
    const Tensor *key, *value;
    const float *norm_key, *norm_query, *norm_conv, *conv;
    const uint64_t *multipliers, *offsets, *sizes;
    std::unique_ptr<cuda::MappedHostBuffer> table;  // the PLE table in mapped pinned host memory
    DType table_type = DType::F16;
    int64_t table_rows = 0;
    // Rows read from the file (ple_from_file; table stays null): the block's hash constants, its reader, one prompt
    // window's rows as read (while the previous window may still run), and the same in the pinned staging the
    // window copies from (written once the stream is idle).
    PleShape hash;
    size_t row_bytes = 0;
    std::unique_ptr<PleRowSource> reader;
    mutable std::vector<uint8_t> rows_read;
    std::unique_ptr<cuda::MappedHostBuffer> staged_rows;
};

struct BlockDevice {
    bool recurrent = true;
    cuda::HyperConnectionDeviceWeights hc_attn, hc_ffn;
    GdnDevice gdn{};
    AttentionDevice attention{};
    MoeDevice moe;
    bool has_ple = false;
    PleDevice ple{};
};

class Qwen4ExpCudaModel final : public CudaHybridModel {
  public:
    Qwen4ExpCudaModel(std::unique_ptr<gguf::File> file, const LoadOptions& options)
        : CudaHybridModel(std::move(file), options) {
        if (ple_from_file_ && !options.ple_reader)
            throw Error(
                "LoadOptions::ple_from_file needs a ple_reader (runtime/ple_row_reader.h: "
                "ple_row_reader_factory)");
        ple_reader_ = options.ple_reader;
        h_ = read_qwen4exp_hparams(*file_, info_, n_block_all_);
        TensorBinder binder(*file_);
        const HybridEmbeddings embeddings = bind_hybrid_embeddings(*file_, binder, info_);
        const HyperConnectionWeights output_hc = bind_hyper_connection(binder, "output_hc", h_.hc, false);
        const std::vector<Qwen4ExpBlock> all_blocks = bind_qwen4exp_blocks(binder, h_, info_.n_layer);
        // This model's blocks (all of them, or a stage's of a split).
        const std::span<const Qwen4ExpBlock> blocks(all_blocks.data() + first_block_,
                                                    static_cast<size_t>(end_block_ - first_block_));
        std::vector<BlockLayout> layout;
        for (const Qwen4ExpBlock& b : blocks) {
            layout.push_back({.recurrent = b.recurrent, .indexer = b.indexer, .has_ple = b.has_ple});
            has_ple_blocks_ = has_ple_blocks_ || b.has_ple;
        }
        set_shapes(h_.gdn, h_.attention, std::move(layout), has_ple_blocks_ ? &h_.ple : nullptr);
        if (last_stage()) output_hc_ = hc_device(output_hc);
        for (const Qwen4ExpBlock& b : blocks) blocks_.push_back(block_device(b));
        if (last_stage()) bind_draft_layer(binder, embeddings.token_embd, options);
        if (ple_from_file_ && has_ple_blocks_) {  // prepare_window's scratch, sized once
            ple_rows_.assign(static_cast<size_t>(prompt_window_ * h_.ple.n_heads()), 0);
            ple_window_history_.reserve(static_cast<size_t>(h_.ple.ngram - 1 + prompt_window_));
        }
        finish_loading({.n_streams = h_.hc.n_streams,
                        .hc_work_floats = cuda::hyper_connection_workspace_floats(hc_dims(), prompt_window_),
                        .ple = has_ple_blocks_ ? &h_.ple : nullptr,
                        .ple_row_bytes = ple_row_bytes_,
                        .pending_write = true},
                       first_stage() ? weights_->tensor(embeddings.token_embd) : nullptr,
                       last_stage() ? weights_->tensor(embeddings.output) : nullptr);
    }

    int64_t draft_residual_width() const override { return draft_ ? draft_->layer.width() : 0; }

    std::unique_ptr<DraftState> new_draft_state(int64_t capacity) const override {
        if (!draft_) throw Error("this model has no MTP draft layer");
        return draft_->layer.new_state(capacity);
    }

    // The layer on the host over its cells, the head on the device (its weights are there; on the host the head of a
    // large vocabulary would cost more than the layer).
    void draft_forward(DraftState& state, int64_t pos0, std::span<const float> residual,
                       std::span<const int32_t> tokens, std::span<float> logits,
                       std::span<float> residual_out) const override {
        if (!draft_) throw Error("this model has no MTP draft layer");
        std::lock_guard<std::mutex> lock(draft_->mutex);
        draft_->scratch.reset();
        const float* hidden =
            draft_->layer.run(state, pos0, residual, tokens, logits, residual_out, draft_->scratch, &draft_->pool);
        head_from_host(std::span<const float>(hidden, static_cast<size_t>(info_.n_embd)), logits);
    }

  private:
    // The MTP draft layer (issue 28) runs on the host from the mapped file (its block is not uploaded: it is small,
    // and one draft pass of one token is a matrix-vector walk the host does in a fraction of a device window);
    // the trunk hands it its final residual rows (forward_with_residual).
    struct DraftLayer {
        DraftLayer(Qwen4ExpDraftLayer l, int threads) : layer(std::move(l)), pool(threads) {}
        Qwen4ExpDraftLayer layer;
        ThreadPool pool;
        Scratch scratch;
        std::mutex mutex;
    };

    void bind_draft_layer(const TensorBinder& binder, const Tensor& token_embd, const LoadOptions& options) {
        try {
            if (auto mtp = bind_qwen4exp_mtp(binder, h_, info_.n_layer, n_block_all_))
                draft_ = std::make_unique<DraftLayer>(
                    Qwen4ExpDraftLayer(this, h_, std::move(*mtp), token_embd, info_.n_vocab),
                    options.n_threads > 0 ? options.n_threads : default_thread_count());
        } catch (const Error& e) {
            std::fprintf(stderr, "strata: no MTP drafts: %s\n", e.what());
        }
    }

    cuda::HyperConnectionDeviceWeights hc_device(const HyperConnectionWeights& w) {
        return {.norm = weights_->floats(w.norm),
                .down = weights_->tensor(w.down),
                .up = weights_->tensor(w.up),
                .inject = weights_->tensor(w.inject)};
    }

    BlockDevice block_device(const Qwen4ExpBlock& b) {
        DeviceWeights& dw = *weights_;
        BlockDevice d;
        d.recurrent = b.recurrent;
        d.hc_attn = hc_device(b.hc_attn);
        d.hc_ffn = hc_device(b.hc_ffn);
        if (b.recurrent) {
            d.gdn = upload_gdn(b.gdn);
        } else {
            d.attention = upload_attention(b.attention, b.indexer);
        }
        d.moe = upload_moe(b.moe, h_.moe, first_block_ + static_cast<int64_t>(blocks_.size()));
        if (b.has_ple) {
            d.has_ple = true;
            const PleWeights& p = b.ple;
            d.ple.key = dw.tensor(p.key);
            d.ple.value = dw.tensor(p.value);
            d.ple.norm_key = dw.floats(p.norm_key);
            d.ple.norm_query = dw.floats(p.norm_query);
            d.ple.norm_conv = dw.floats(p.norm_conv);
            d.ple.conv = dw.floats(p.conv);
            d.ple.multipliers = dw.u64s(b.ple_shape.multipliers);  // each PLE block hashes with its own
            d.ple.offsets = dw.u64s(b.ple_shape.offsets);
            d.ple.sizes = dw.u64s(b.ple_shape.sizes);
            if (ple_from_file_) {
                const std::optional<gguf::File::Location> at = file_->locate(p.table.data, p.table.n_bytes());
                if (!at) throw Error(file_->path() + ": the PLE table is not in a file to read its rows from");
                const int64_t window_rows = prompt_window_ * b.ple_shape.n_heads();
                d.ple.hash = b.ple_shape;
                d.ple.row_bytes = p.table.nb[1];
                d.ple.reader = ple_reader_(
                    {.path = at->path, .offset = at->offset, .row_bytes = p.table.nb[1], .n_rows = p.table.ne[1]},
                    window_rows);
                d.ple.rows_read.assign(static_cast<size_t>(window_rows) * p.table.nb[1], 0);
                d.ple.staged_rows = std::make_unique<cuda::MappedHostBuffer>(d.ple.rows_read.size());
            } else {
                d.ple.table = std::make_unique<cuda::MappedHostBuffer>(p.table.n_bytes());
                std::copy_n(static_cast<const uint8_t*>(p.table.data), p.table.n_bytes(),
                            static_cast<uint8_t*>(d.ple.table->host()));
            }
            d.ple.table_type = p.table.type;
            d.ple.table_rows = p.table.ne[1];
            ple_row_bytes_ = std::max(ple_row_bytes_, p.table.nb[1]);
        }
        return d;
    }

    cuda::HyperConnectionDims hc_dims() const {
        return {.n_streams = h_.hc.n_streams, .n_embd = h_.hc.n_embd, .low_rank = h_.hc.low_rank, .eps = h_.hc.eps};
    }

    void enqueue_window(CudaSequence& s, int64_t T) const override {
        cuda::Context& ctx = *ctx_;
        const int64_t hc = h_.hc.n_streams;
        const cuda::HyperConnectionDims dims = hc_dims();
        mark(kEmbed);
        if (first_stage())
            cuda::embed_rows(ctx, {.table = token_embd_,
                                   .tokens = w_.tokens,
                                   .n_tokens = T,
                                   .copies = hc,
                                   .out = w_.residual,
                                   .staging = w_.embed_staging});
        // A block's write into the residual streams waits for the next read, whose first kernel applies it (fused
        // read, backend/cuda/hyper_connection.cu); the PLE and the final mixer need it applied first. In a decode
        // window the MoE leaves its combine to that kernel too (pending_moe). A stage of a split after the first
        // starts with the previous stage's last write pending: its block output and inject were handed in with the
        // residual (handoff_rows).
        const float* pending = first_stage() ? nullptr : w_.out;
        cuda::MoeCombine moe_combine{};
        const cuda::MoeCombine* pending_moe = nullptr;
        const bool defer_combine = T <= kWindow;
        auto apply_pending = [&] {
            if (pending_moe) cuda::moe_combine(ctx, *pending_moe);
            if (pending) cuda::hyper_connection_write(ctx, dims, w_.residual, pending, w_.inject, T);
            pending = nullptr;
            pending_moe = nullptr;
        };
        // mixed_q8_0: where the read may also write mixed as the Q8_0 activations the block's input products read
        // (one launch fewer on a decode token's path); returns it when it did, else null.
        auto read = [&](const cuda::HyperConnectionDeviceWeights& weights, float* mixed, float* inject,
                        void* mixed_q8_0 = nullptr) -> const void* {
            const bool quantized =
                cuda::hyper_connection_read(ctx, {.shape = dims,
                                                  .weights = weights,
                                                  .residual = w_.residual,
                                                  .mixed = mixed,
                                                  .inject = inject,
                                                  .n_tokens = T,
                                                  .workspace = w_.hc_work,
                                                  .pending_block_out = pending_moe ? nullptr : pending,
                                                  .pending_combine = pending_moe,
                                                  .mixed_q8_0 = mixed_q8_0});
            pending = nullptr;
            pending_moe = nullptr;
            return quantized ? mixed_q8_0 : nullptr;
        };
        for (size_t il = 0; il < blocks_.size(); ++il) {
            const BlockDevice& b = blocks_[il];
            LayerDeviceState& l = s.layers[il];
            if (b.has_ple) {
                mark(kResidual);
                apply_pending();
                ple_window(b.ple, l, T);
            }
            mark(kResidual);
            // The read writes the block input's Q8_0 activations when its first input product reads them.
            const bool input_q8_0 = cuda::reads_q8_0_activations(b.recurrent ? b.gdn.qkv->type : b.attention.q->type);
            const void* x_q8_0 = read(b.hc_attn, w_.mixed, w_.inject, input_q8_0 ? w_.mixed_q8_0 : nullptr);
            if (b.recurrent)
                gdn_window(b.gdn, l, w_.mixed, w_.out, T, x_q8_0);
            else
                attention_window(b.attention, s, l, w_.mixed, w_.out, T, x_q8_0);
            mark(kResidual);
            pending = w_.out;
            read(b.hc_ffn, w_.mixed, w_.inject);
            moe_window(b.moe, w_.mixed, w_.out, T, defer_combine ? &moe_combine : nullptr);
            pending = w_.out;
            if (defer_combine) pending_moe = &moe_combine;
        }
        mark(kResidual);
        if (!last_stage()) {
            // The next stage's first read applies this stage's last write. A deferred combine runs here (its values
            // with the bits the fused read forms them with), so that the write handed on is a block output.
            if (pending_moe) cuda::moe_combine(ctx, *pending_moe);
            return;
        }
        apply_pending();
        read(output_hc_, w_.hidden, nullptr);
    }

    // PLE rows from the file: every PLE block's rows of the window, hashed from the sequence's history and the
    // window's tokens and read while the previous window may still run on the device; once the stream is idle (the
    // previous window's copy out of the staging has run) they go into the pinned staging. Then the history moves
    // past the window.
    void prepare_window(CudaSequence& s, std::span<const int32_t> tokens) const override {
        if (!ple_from_file_ || !has_ple_blocks_) return;
        const PleShape& p = h_.ple;
        const int64_t T = static_cast<int64_t>(tokens.size()), n_heads = p.n_heads(), N = p.ngram;
        STRATA_ASSERT(T <= prompt_window_ && static_cast<int64_t>(s.ple_history.size()) == N - 1);
        ple_window_history_.resize(static_cast<size_t>(N - 1 + T));
        std::copy(s.ple_history.begin(), s.ple_history.end(), ple_window_history_.begin());
        std::copy(tokens.begin(), tokens.end(), ple_window_history_.begin() + (N - 1));
        for (const BlockDevice& b : blocks_) {
            if (!b.has_ple) continue;
            // Token t's predecessors are the N - 1 entries before it in history + tokens.
            for (int64_t t = 0; t < T; ++t)
                ple_rows_into(b.ple.hash, ple_window_history_.data() + t, tokens[static_cast<size_t>(t)],
                              ple_rows_.data() + t * n_heads);
            b.ple.reader->fetch(std::span<const int64_t>(ple_rows_.data(), static_cast<size_t>(T * n_heads)),
                                b.ple.rows_read.data());
        }
        ctx_->synchronize();
        for (const BlockDevice& b : blocks_)
            if (b.has_ple)
                std::copy_n(b.ple.rows_read.data(), static_cast<size_t>(T * n_heads) * b.ple.row_bytes,
                            static_cast<uint8_t*>(b.ple.staged_rows->host()));
        std::copy(ple_window_history_.end() - (N - 1), ple_window_history_.end(), s.ple_history.begin());
    }

    // The table rows of the window's first T tokens (w_.tokens) into w_.ple_emb, the device history advanced past them.
    cuda::PleGatherArgs gather_args(const PleDevice& w, LayerDeviceState& l, int64_t T) const {
        const PleShape& p = h_.ple;
        return {.ngram = p.ngram,
                .heads_per_ngram = p.heads_per_ngram,
                .eos = p.eos,
                .multipliers = w.multipliers,
                .offsets = w.offsets,
                .sizes = w.sizes,
                .table = w.table->device(),
                .table_type = w.table_type,
                .row_width = p.row_width,
                .table_rows = w.table_rows,
                .tokens = w_.tokens,
                .history = l.ple_tokens.as<int32_t>(),
                .n_tokens = T,
                .rows = w_.ple_rows,
                .staging = w_.ple_staging,
                .out = w_.ple_emb};
    }

    void commit_ple(CudaSequence& s, std::span<const int32_t> kept) const override {
        if (!has_ple_blocks_ || kept.empty()) return;
        cuda::Context& ctx = *ctx_;
        const PleShape& p = h_.ple;
        const int64_t n = std::ssize(kept), HC = p.n_streams * p.n_embd, N = p.ngram;
        if (ple_from_file_) {  // the host keeps the token history: the last N - 1 of it and the kept tokens
            std::vector<int32_t> history = s.ple_history;
            history.insert(history.end(), kept.begin(), kept.end());
            std::copy(history.end() - (N - 1), history.end(), s.ple_history.begin());
        } else {
            ctx.copy_to_device(w_.tokens, kept.data(), kept.size() * sizeof(int32_t));
        }
        for (size_t il = 0; il < blocks_.size(); ++il) {
            const BlockDevice& b = blocks_[il];
            if (!b.has_ple) continue;
            LayerDeviceState& l = s.layers[il];
            // The device history advances as the window's gather advanced it (its rows are not needed again).
            if (!ple_from_file_) cuda::ple_gather(ctx, gather_args(b.ple, l, n));
            advance_history(l.ple_conv_history.as<float>(), p.history_rows(), l.window_ple.as<float>(), n, HC);
        }
    }

    void ple_window(const PleDevice& w, LayerDeviceState& l, int64_t T) const {
        cuda::Context& ctx = *ctx_;
        const PleShape& p = h_.ple;  // the parts every PLE block shares; w holds this block's hash arrays
        const int64_t H = p.n_embd, hc = p.n_streams, HC = hc * H;
        mark(kPle);
        if (w.staged_rows)
            cuda::ple_rows_from_host(ctx, {.host_rows = w.staged_rows->host(),
                                           .table_type = w.table_type,
                                           .row_width = p.row_width,
                                           .n_rows = T * p.n_heads(),
                                           .staging = w_.ple_staging,
                                           .out = w_.ple_emb});
        else
            cuda::ple_gather(ctx, gather_args(w, l, T));
        cuda::matmul_shared_input(ctx, w_.ple_emb, T, {{w.key, w_.ple_key}, {w.value, w_.ple_value}});
        auto norm = [&](const float* x, float* out, const float* gamma) {
            cuda::rms_norm_grouped(ctx, {.x = x,
                                         .out = out,
                                         .n_tokens = T,
                                         .row_stride = HC,
                                         .n_groups = hc,
                                         .group = H,
                                         .gamma = gamma,
                                         .eps = p.eps});
        };
        norm(w_.ple_key, w_.ple_key, w.norm_key);
        norm(w_.residual, w_.ple_query, w.norm_query);
        cuda::ple_gate(ctx, {.key = w_.ple_key,
                             .query = w_.ple_query,
                             .value = w_.ple_value,
                             .gated = w_.ple_gated,
                             .n_tokens = T,
                             .n_streams = hc,
                             .n_embd = H});
        // A sequence that verifies drafts keeps a decode window's conv input rows (commit_ple replays them).
        float* normed = l.window_ple.size() && keeps_window_inputs(T) ? l.window_ple.as<float>() : w_.ple_normed;
        norm(w_.ple_gated, normed, w.norm_conv);
        cuda::causal_conv(ctx, {.x = normed,
                                .x_stride = HC,
                                .w = w.conv,
                                .history = l.ple_conv_history.as<float>(),
                                .out = w_.ple_conv,
                                .out_stride = HC,
                                .n_tokens = T,
                                .channels = HC,
                                .kernel = p.conv_kernel,
                                .dilation = p.ngram});
        cuda::ple_residual_add(ctx, w_.residual, w_.ple_gated, w_.ple_conv, T * HC);
    }

    Qwen4ExpHparams h_;
    std::unique_ptr<DraftLayer> draft_;  // null: the file has no (complete) MTP block
    cuda::HyperConnectionDeviceWeights output_hc_;
    std::vector<BlockDevice> blocks_;
    size_t ple_row_bytes_ = 0;
    bool has_ple_blocks_ = false;  // a PLE block is among this model's (a stage of a split may have none)
    PleRowSourceFactory ple_reader_;
    mutable std::vector<int64_t> ple_rows_;            // a window's row ids, [T x n_heads]
    mutable std::vector<int32_t> ple_window_history_;  // the history, then the window's tokens
};

}  // namespace

std::unique_ptr<Model> load_qwen4exp_cuda(std::unique_ptr<gguf::File> file, const LoadOptions& options) {
    return std::make_unique<Qwen4ExpCudaModel>(std::move(file), options);
}

}  // namespace strata
