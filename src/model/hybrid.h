// What the three hybrid architectures share: the per-sequence state (one entry per trunk block), token embedding and
// head, the thread pool, and the checks around forward(). Each architecture file supplies its trunk.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "format/gguf.h"
#include "model/attention.h"
#include "model/binding.h"
#include "model/gdn.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/ple.h"
#include "model/rollback_log.h"
#include "model/scratch.h"

namespace strata {

// The state of one trunk block for one sequence; only the parts the block uses are allocated.
struct LayerState {
    GdnState gdn;
    AttentionCache attention;
    PleState ple;
    // The last verification window's inputs to the recurrent state (BatchEntry::window; Model::commit).
    GdnWindow gdn_window;
    PleWindow ple_window;
    size_t bytes() const { return gdn.bytes() + attention.bytes() + ple.bytes(); }
};

// A sequence belongs to the model that made it and must not outlive it.
class HybridSequence : public SequenceState {
  public:
    using Init = std::function<void(std::vector<LayerState>&, int64_t capacity)>;
    HybridSequence(const void* owner, int64_t capacity, Init init);

    const void* owner() const { return owner_; }
    int64_t n_past() const override { return n_past_; }
    int64_t capacity() const override { return capacity_; }
    size_t memory_bytes() const override;
    void reset() override;

    std::vector<LayerState> layers;
    int64_t n_past_ = 0;
    RollbackLog rollback;  // when checkpoints (checkpoint.cpp) may be restored
    // The last pass, when it was a verification window whose inputs the trunk recorded: its first position and its
    // token count (window_count 0: none; any other pass clears it).
    int64_t window_pos0 = 0, window_count = 0;

  private:
    const void* owner_;
    int64_t capacity_;
    Init init_;
};

// The rows of one pass of the trunk (batch_rows.h): the sequences in batch order, their rows and all tokens.
struct TrunkBatch {
    std::span<HybridSequence* const> sequences;
    std::span<const SequenceRows> rows;
    std::span<const int32_t> tokens;  // every row's token
    Scratch& scratch;                 // reset before the pass
    // When set, the trunk also writes its final residual rows here [n_rows x draft_residual_width()] (what an MTP
    // draft layer reads); only trunks with a draft layer do.
    float* residual_out = nullptr;
    // Per-sequence parts of block `il`, as the arrays the block functions take (from scratch).
    template <class T>
    std::span<T* const> states(size_t il, T LayerState::*part) const {
        T** out = scratch.take<T*>(static_cast<int64_t>(sequences.size()));
        for (size_t i = 0; i < sequences.size(); ++i) out[i] = &(sequences[i]->layers[il].*part);
        return {out, sequences.size()};
    }
    int64_t n_rows() const { return static_cast<int64_t>(tokens.size()); }
    // Where block `il` records each sequence's window inputs: null for sequences not in a window.
    template <class T>
    std::span<T* const> windows(size_t il, T LayerState::*part) const {
        T** out = scratch.take<T*>(static_cast<int64_t>(sequences.size()));
        for (size_t i = 0; i < sequences.size(); ++i)
            out[i] = sequences[i]->window_count > 0 ? &(sequences[i]->layers[il].*part) : nullptr;
        return {out, sequences.size()};
    }
};

class HybridModel : public Model {
  public:
    const ModelInfo& info() const override { return info_; }
    std::unique_ptr<SequenceState> new_sequence(int64_t max_tokens) const override;
    // forward() is forward_batch() of one entry: the same code path, so a sequence's logits do not depend on what
    // else is in the batch (every row-wise op computes each row alone, in a fixed order).
    void forward(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                 bool last_only) const override;
    void forward_batch(std::span<const BatchEntry> batch) const override;
    void forward_with_residual(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                               std::span<float> residual, bool last_only) const override;
    std::unique_ptr<SequenceCheckpoint> checkpoint(const SequenceState& seq) const override;
    void restore(SequenceState& seq, const SequenceCheckpoint& checkpoint) const override;
    bool commit(SequenceState& seq, const SequenceCheckpoint& before, int64_t n_keep) const override;

  protected:
    HybridModel(std::unique_ptr<gguf::File> file, const LoadOptions& options);

    // Binds token_embd and output (falling back to token_embd); call from the derived constructor once n_embd is known.
    void bind_embeddings(const TensorBinder& binder);
    // Allocates (and zeroes) each block's state for `capacity` tokens.
    virtual void init_layers(std::vector<LayerState>& layers, int64_t capacity) const = 0;
    // Runs the trunk over each sequence's rows (after what it holds) and writes the head's input rows [n_rows x H].
    virtual void trunk(const TrunkBatch& batch, float* hidden) const = 0;

    void embed(std::span<const int32_t> tokens, float* out) const;  // token_embd rows
    ThreadPool* pool() const { return &pool_; }
    // Runs fn(scratch) holding the model's lock, with the scratch reset: passes that are not forward() (the MTP
    // draft layer) share the pool and the scratch with it.
    template <class F>
    void exclusive(F&& fn) const {
        std::lock_guard lock(mutex_);
        scratch_.reset();
        fn(scratch_);
    }
    RoutingSink* routing() const { return routing_.get(); }  // null unless LoadOptions::routing_trace

    std::unique_ptr<gguf::File> file_;
    ModelInfo info_;
    int64_t n_block_all_ = 0;  // block_count, MTP blocks included
    Tensor token_embd_;
    Tensor output_;
    // The CPU GEMM's copies of the weights that have a packed form; what binders pack into, or null when the load
    // options or the free memory say no.
    cpu::PackedWeights* packer() { return repack_ ? &packed_ : nullptr; }

  private:
    cpu::PackedWeights packed_;
    bool repack_ = false;
    // batch.cpp. Checks every entry before anything is touched (the sequences land in scratch_); `single` words the
    // messages as forward()'s.
    void run(std::span<const BatchEntry> batch, bool single) const;
    std::span<HybridSequence* const> validate(std::span<const BatchEntry> batch, bool single) const;
    void head(std::span<const BatchEntry> batch, std::span<const SequenceRows> rows, const float* hidden) const;

    mutable ThreadPool pool_;
    std::shared_ptr<RoutingSink> routing_;
    mutable std::mutex mutex_;  // one forward at a time: the pool and the scratch are shared
    mutable Scratch scratch_;
};

// general.* and the {arch}.* sizes every hybrid architecture reads the same way (n_vocab and the end-of-generation
// ids come with the embeddings); *n_block_all gets block_count, MTP blocks included.
ModelInfo read_hybrid_info(const gguf::File& file, int64_t* n_block_all);
struct HybridEmbeddings {
    Tensor token_embd;
    Tensor output;  // token_embd when the file has no output.weight
};
// Binds token_embd and output, and fills info's n_vocab and eog_tokens.
HybridEmbeddings bind_hybrid_embeddings(const gguf::File& file, const TensorBinder& binder, ModelInfo& info);

// Shapes every hybrid architecture reads the same way from its `{arch}.*` keys (gguf-qwen4exp.md 1.1-1.4).
AttentionShape read_attention_shape(const HparamReader& hp, int64_t n_embd, const std::vector<bool>& recurrent,
                                    int64_t n_block_all, float eps);
GdnShape read_gdn_shape(const HparamReader& hp, int64_t n_embd, float eps);  // head order and gate: the caller's
MoeShape read_moe_shape(const HparamReader& hp, int64_t n_embd, int64_t n_block_all);

// Per-architecture factories (qwen4exp.cpp, qwen35moe.cpp, qwen3next.cpp).
std::unique_ptr<Model> load_qwen4exp(std::unique_ptr<gguf::File> file, const LoadOptions& options);
std::unique_ptr<Model> load_qwen35moe(std::unique_ptr<gguf::File> file, const LoadOptions& options);
std::unique_ptr<Model> load_qwen3next(std::unique_ptr<gguf::File> file, const LoadOptions& options);
#if STRATA_HAS_CUDA
std::unique_ptr<Model> load_qwen4exp_cuda(std::unique_ptr<gguf::File> file, const LoadOptions& options);  // cuda/
// LoadOptions::split: one CUDA model a stage (each loaded by load_model), run as one (cuda/split_cuda.cpp).
std::unique_ptr<Model> load_split_cuda(const std::string& path, const LoadOptions& options);
#endif

}  // namespace strata
