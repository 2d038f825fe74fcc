// What the three hybrid architectures share: the per-sequence state (one entry per trunk block), token embedding and
// head, the thread pool, and the checks around forward(). Each architecture file supplies its trunk.
#pragma once

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

namespace strata {

// The state of one trunk block for one sequence; only the parts the block uses are allocated.
struct LayerState {
    GdnState gdn;
    AttentionCache attention;
    PleState ple;
    size_t bytes() const { return gdn.bytes() + attention.bytes() + ple.bytes(); }
};

// A sequence belongs to the model that made it and must not outlive it.
class HybridSequence : public SequenceState {
  public:
    using Init = std::function<void(std::vector<LayerState>&, int64_t capacity)>;
    HybridSequence(const void* owner, int64_t capacity, Init init)
        : owner_(owner), capacity_(capacity), init_(std::move(init)) {
        reset();
    }

    const void* owner() const { return owner_; }
    int64_t n_past() const override { return n_past_; }
    int64_t capacity() const override { return capacity_; }
    size_t memory_bytes() const override;
    void reset() override;

    std::vector<LayerState> layers;
    int64_t n_past_ = 0;

  private:
    const void* owner_;
    int64_t capacity_;
    Init init_;
};

class HybridModel : public Model {
  public:
    const ModelInfo& info() const override { return info_; }
    std::unique_ptr<SequenceState> new_sequence(int64_t max_tokens) const override;
    void forward(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                 bool last_only) const override;

  protected:
    HybridModel(std::unique_ptr<gguf::File> file, const LoadOptions& options);

    // Binds token_embd and output (falling back to token_embd); call from the derived constructor once n_embd is known.
    void bind_embeddings(const TensorBinder& binder);
    // Allocates (and zeroes) each block's state for `capacity` tokens.
    virtual void init_layers(std::vector<LayerState>& layers, int64_t capacity) const = 0;
    // Runs the trunk over the tokens after what `seq` holds and writes the head's input rows [n_tokens x H].
    virtual void trunk(HybridSequence& seq, std::span<const int32_t> tokens, float* hidden) const = 0;

    void embed(std::span<const int32_t> tokens, float* out) const;  // token_embd rows
    ThreadPool* pool() const { return &pool_; }

    std::unique_ptr<gguf::File> file_;
    ModelInfo info_;
    int64_t n_block_all_ = 0;  // block_count, MTP blocks included
    Tensor token_embd_;
    Tensor output_;

  private:
    mutable ThreadPool pool_;
    mutable std::mutex mutex_;  // one forward at a time: the pool is shared
};

// Shapes every hybrid architecture reads the same way from its `{arch}.*` keys (gguf-qwen4exp.md 1.1-1.4).
AttentionShape read_attention_shape(const HparamReader& hp, int64_t n_embd, const std::vector<bool>& recurrent,
                                    int64_t n_block_all, float eps);
GdnShape read_gdn_shape(const HparamReader& hp, int64_t n_embd, float eps);  // head order and gate: the caller's
MoeShape read_moe_shape(const HparamReader& hp, int64_t n_embd, int64_t n_block_all);

// Per-architecture factories (qwen4exp.cpp, qwen35moe.cpp, qwen3next.cpp).
std::unique_ptr<Model> load_qwen4exp(std::unique_ptr<gguf::File> file, const LoadOptions& options);
std::unique_ptr<Model> load_qwen35moe(std::unique_ptr<gguf::File> file, const LoadOptions& options);
std::unique_ptr<Model> load_qwen3next(std::unique_ptr<gguf::File> file, const LoadOptions& options);

}  // namespace strata
