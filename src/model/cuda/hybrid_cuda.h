// What the CUDA forward passes of the hybrid architectures share (qwen4exp_cuda.cpp, single_stream_cuda.cpp): the
// device state of a sequence, the window buffers, the GDN and attention blocks over the backend's ops, and the
// Model interface around them. Tokens go through in windows: decode windows of up to kWindow tokens, each window size
// captured once per sequence as a CUDA graph and replayed (the window's tokens and positions written to device memory
// before each replay), and prompt windows of up to LoadOptions::prompt_chunk tokens launched one by one.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/model_ops.h"
#include "backend/cuda/qsa_union.h"
#include "model/attention.h"
#include "model/cuda/device_weights.h"
#include "model/cuda/expert_cache.h"
#include "model/gdn.h"
#include "model/moe.h"
#include "model/model.h"
#include "model/ple.h"
#include "model/rollback_log.h"

namespace strata::cuda_model {

constexpr int64_t kWindow = cuda::kMaxMatvecTokens;
// The windows a sequence that verifies drafts keeps its inputs to the recurrent state for (CudaSequence::records): a
// token and at least one draft, within a decode window.
constexpr bool keeps_window_inputs(int64_t T) {
    return T >= 2 && T <= kWindow;
}

// Prompts longer than a decode window go through in prompt windows (LoadOptions::prompt_chunk tokens, 512 by
// default); a window longer than kWindow is launched one by one (no graph), every dense product through the matmul's
// GEMM path (cuBLAS from kBlasMinTokens), attention for all its queries in one launch, and the MoE through the grouped
// expert GEMM where its experts average kGroupedMinPairs pairs or more (else in slices of kWindow on the decode path's
// gathered kernels). The grouped GEMM reads an expert's blocks once per window: at Flash-Next's 512 experts top-10 a
// window of 64 gives an expert 1.25 pairs, too few to pay for decoding its weights into fp16 tiles
// (bench/notes/prompts.md); longer windows read each weight, and each expert missed in VRAM, for more tokens.
// The head writes the logits of at most kHeadRows tokens at a time (a prompt window's head runs only for the rows
// the caller wants).
constexpr int64_t kHeadRows = 64;
// The QSA selections of a prompt window go kQsaSelectGroup queries a launch, each with its own workspace (scores and
// keys: 12 bytes a block, so 768 bytes a block of context in all).
constexpr int64_t kQsaSelectGroup = 64;
// The grouped GEMM decodes each weight once per 64 pairs at ~0.55 T weights/s on the H200, the gathered products read
// each once per pair at ~1.9 T/s: below ~3.5 pairs an expert the slices win.
constexpr int64_t kGroupedMinPairs = 4;

// The op kinds of the profile (LoadOptions::cuda_profile).
enum OpKind {
    kEmbed,
    kPle,
    kResidual,  // hyper-connections, or the norms and adds of a single stream
    kGdnProjections,
    kGdnRecurrence,
    kAttentionProjections,
    kAttention,
    kMoe,
    kHead,
};

struct GdnDevice {
    const Tensor *qkv, *gate, *out;
    const Tensor *beta = nullptr, *alpha = nullptr;  // separate projections (qwen4exp, qwen35moe), or
    const Tensor* ba = nullptr;                       // ssm_ba: per key group, its beta rows then its alpha rows
    const float *conv, *dt_bias, *a, *norm;
};

struct AttentionDevice {
    const Tensor *q, *k, *v, *o;
    const float *q_norm, *k_norm;
    IndexerShape indexer;  // ratio 0: dense
    const Tensor *index_q = nullptr, *index_k = nullptr;
    const float *index_q_norm = nullptr, *index_k_norm = nullptr;
    bool sparse() const { return indexer.ratio > 0; }
};

struct MoeDevice {
    int64_t block = -1;
    cuda::MoeLayerShape shape;
    cuda::MoeLayerWeights weights;
    std::unique_ptr<cuda::MoeWorkspace> workspace;
};

// Which state a trunk block keeps (for allocating a sequence).
struct BlockLayout {
    bool recurrent = true;
    IndexerShape indexer;  // attention blocks; ratio 0: dense
    bool has_ple = false;
};

// One trunk block's state of one sequence in device memory (only the parts the block uses are allocated).
struct LayerDeviceState {
    cuda::DeviceBuffer conv_history, recurrent;  // GDN
    std::unique_ptr<cuda::KvCache> kv;           // attention
    cuda::DeviceBuffer page_table, kv_length, index_raw, index_pooled;
    cuda::DeviceBuffer ple_tokens, ple_conv_history;  // PLE
    // A decode window's inputs to the state above, kept where the window's kernels write them when the sequence
    // verifies drafts (CudaSequence::records): GDN's conv input rows, its q, k, v after the conv, its decay and write
    // strength; PLE's conv input rows. kWindow rows each; CudaHybridModel::commit replays a prefix of them.
    cuda::DeviceBuffer window_raw, window_conv, window_alpha, window_beta, window_ple;
};

struct CheckpointPool;  // checkpoint_cuda.cpp

class CudaSequence final : public SequenceState {
  public:
    CudaSequence(const void* owner, int64_t capacity) : owner_(owner), capacity_(capacity) {}
    int64_t n_past() const override { return n_past_; }
    int64_t capacity() const override { return capacity_; }
    size_t memory_bytes() const override { return bytes_; }
    void reset() override { reset_(*this); }

    const void* owner_;
    int64_t capacity_;
    int64_t n_past_ = 0;
    size_t bytes_ = 0;
    std::vector<LayerDeviceState> layers;
    cuda::DeviceBuffer qsa_scores, qsa_keys, attention_workspace;  // qsa_*: the workspace of qsa_group queries
    int64_t qsa_group = 1;                                         // queries a qsa_select launch takes
    int64_t dense_splits = 1, sparse_splits = 1;
    cuda::DeviceBuffer union_workspace;  // --qsa-union: empty when the union path does not apply
    int64_t union_splits = 1;
    // PLE rows read on the host (LoadOptions::ple_from_file): the last ngram - 1 tokens, oldest first, as the
    // device's ple_tokens would hold them (the device history is not used then).
    std::vector<int32_t> ple_history;
    std::array<cuda::Graph, kWindow + 1> graphs;  // by window size; they hold this sequence's buffers
    const void* graphs_scratch = nullptr;          // the context scratch the graphs were captured with
    std::function<void(CudaSequence&)> reset_;
    RollbackLog rollback;  // when checkpoints may be restored
    // Device copies of the recurrent state that checkpoints took and gave back, for the next checkpoint to reuse
    // (checkpoint_cuda.cpp): a speculation round takes one each time.
    std::shared_ptr<CheckpointPool> checkpoint_pool;
    // Speculation (BatchEntry::window): decode windows of 2..kWindow tokens keep their inputs to the recurrent state
    // in the layers' window_* buffers, and the last such window is described here for commit().
    bool records = false;
    int64_t window_pos0 = 0, window_count = 0;  // count 0: the last pass kept nothing
    std::vector<int32_t> window_tokens;
};

// Device buffers of one window, shared by every block and sequence (a forward runs one window at a time). A
// single-stream model has one residual stream and leaves the hyper-connection and PLE parts empty.
struct WindowBuffers {
    cuda::DeviceBuffer buffer;
    int32_t *tokens, *positions, *lengths;  // a prompt window each, consecutive: the host writes them per window
    float *residual, *mixed, *out, *inject, *hc_work;
    void* mixed_q8_0;  // one token of mixed as Q8_0 activations, when the hyper-connection read writes them
    float *qkv, *z, *beta, *alpha, *ba, *conv, *core;          // GDN
    float *qg, *k_new, *v_new, *heads, *index_raw, *index_q;  // attention
    int32_t *cells, *n_selected;
    int64_t max_cells = 0;
    int64_t* ple_rows;  // PLE
    void* ple_staging;
    float *ple_emb, *ple_key, *ple_value, *ple_query, *ple_gated;
    float *ple_normed, *ple_conv;  // in ple_key's and ple_query's bytes (dead by then)
    float *hidden, *logits;  // head: logits of kHeadRows tokens
    void* embed_staging;
};

// The sizes the window buffers are cut for.
struct WindowShape {
    int64_t n_streams = 1;  // residual streams (hyper-connections), 1 for a single stream
    int64_t hc_work_floats = 0;
    const PleShape* ple = nullptr;
    size_t ple_row_bytes = 0;
    // The architecture leaves each block's write into the residual pending for the next block's read to apply
    // (hyper-connections): a stage of a split hands that write on with the residual (CudaHybridModel::handoff_rows).
    bool pending_write = false;
};

class CudaHybridModel : public Model {
  public:
    ~CudaHybridModel() override;
    const ModelInfo& info() const override { return info_; }
    std::unique_ptr<SequenceState> new_sequence(int64_t max_tokens) const override;
    void forward(SequenceState& state, std::span<const int32_t> tokens, std::span<float> logits,
                 bool last_only) const override;
    // Also downloads the trunk's final residual rows after each window (a small copy: tokens x streams x n_embd).
    void forward_with_residual(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                               std::span<float> residual, bool last_only) const override;
    // A device copy of the recurrent part (GDN, conv and PLE state, the KV lengths; checkpoint_cuda.cpp), taken and
    // restored on the stream by one captured graph each: what a speculation round rolls back to after a rejection.
    std::unique_ptr<SequenceCheckpoint> checkpoint(const SequenceState& seq) const override;
    void restore(SequenceState& seq, const SequenceCheckpoint& checkpoint) const override;
    // Windows flagged BatchEntry::window keep their inputs (allocated on the first, booked by the memory plan), so
    // that commit() keeps a prefix of the last one without a second pass: the checkpoint restored, then each GDN
    // block's conv history and delta rule, each PLE block's history and conv advanced over the kept rows by the same
    // kernels, and the cache lengths set.
    void forward_batch(std::span<const BatchEntry> batch) const override;
    bool commit(SequenceState& seq, const SequenceCheckpoint& before, int64_t n_keep) const override;
    // Page-locked (heap memory when the system will not pin more).
    HostFloats host_floats(size_t n) const override;
    std::optional<ExpertOffloadStats> expert_offload_stats() const override;

    // ---- one stage of a split over several GPUs (LoadOptions::first_block; split_cuda.cpp) ----
    // One window through every stage: the window's tokens, and the head to queue after the last stage's part.
    using WindowRun = std::function<void(std::span<const int32_t> tokens, const std::function<void()>& head)>;
    // forward() (with the residual rows of forward_with_residual, or residual empty) of the split whose last stage
    // this is, on this stage's sequence: the windows cut, the head run and the logits and residual downloaded as
    // forward() does, each window run by `run` (which runs this stage's part with stage_window).
    void forward_windows(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                         std::span<float> residual, bool last_only, const WindowRun& run) const;
    // This stage's part of one window on its sequence, queued on its stream (head: a no-op but on the last stage).
    // The caller holds the split's lock and has made this stage's device current.
    void stage_window(SequenceState& seq, std::span<const int32_t> tokens, const std::function<void()>& head) const;
    // The device rows a window of T tokens hands from this stage to the next, which takes them into the same rows of
    // its own: the residual streams, and where the architecture leaves a block's write pending (WindowShape::
    // pending_write), that write's block output and inject, which the next stage's first read applies.
    std::vector<std::pair<void*, size_t>> handoff_rows(int64_t T) const;
    cuda::Context& context() const { return *ctx_; }
    int64_t first_block() const { return first_block_; }
    int64_t end_block() const { return end_block_; }
    int64_t prompt_window() const { return prompt_window_; }

  protected:
    // Reads general.* and the sizes, starts the device, checks that the weights fit the budget.
    CudaHybridModel(std::unique_ptr<gguf::File> file, const LoadOptions& options);

    // For the derived constructor, after binding: the shapes every block uses, then the window buffers.
    void set_shapes(const GdnShape& gdn, const AttentionShape& attention, std::vector<BlockLayout> layout,
                    const PleShape* ple);
    void finish_loading(const WindowShape& shape, const Tensor* token_embd, const Tensor* output);

    GdnDevice upload_gdn(const GdnWeights& w);
    AttentionDevice upload_attention(const AttentionWeights& w, const IndexerShape& indexer);
    // With experts in host RAM, the routed experts go to the expert cache instead (block: the trunk block's index).
    MoeDevice upload_moe(const MoeWeights& w, const MoeShape& shape, int64_t block);

    // Host work a window needs before it is queued or replayed, with its tokens (PLE rows read from the file).
    virtual void prepare_window(CudaSequence& s, std::span<const int32_t> tokens) const {
        (void)s;
        (void)tokens;
    }
    // commit(): each PLE block's token history and conv advanced over the first kept.size() rows the last window
    // recorded (LayerDeviceState::window_ple), queued on the stream; the caller holds the lock.
    virtual void commit_ple(CudaSequence& s, std::span<const int32_t> kept) const {
        (void)s;
        (void)kept;
    }
    // A conv history of `rows` rows of `width` floats, oldest first, as after n more input rows `in`: what the
    // causal conv leaves (commit; no rows when rows is 0).
    void advance_history(float* history, int64_t rows, const float* in, int64_t n, int64_t width) const;
    // The work of one window: embedding to the head's input (w_.hidden), queued on the context's stream.
    virtual void enqueue_window(CudaSequence& s, int64_t T) const = 0;
    // The logits of the window's rows [row0, row0 + n) (n <= kHeadRows) into w_.logits.
    void enqueue_head(int64_t row0, int64_t n) const;
    // The head on one row of host floats (n_embd; the MTP layer's output, computed on the host), logits to the host.
    void head_from_host(std::span<const float> hidden, std::span<float> logits) const;

    // Block pieces for enqueue_window: x is the block input [T x H], out its output [T x H]; x_q8_0, when not null,
    // holds x already quantized for the input products (one token; matmul_shared_input's x_q8_0).
    void gdn_window(const GdnDevice& w, LayerDeviceState& l, const float* x, float* out, int64_t T,
                    const void* x_q8_0 = nullptr) const;
    // The GDN block's delta rule over T tokens on its state: q, k, v rows conv_dim apart (after the conv), the decay
    // and strength per token and value head; outputs to w_.core (the window's and commit()'s kernel).
    void delta_rule(LayerDeviceState& l, const float* conv, const float* alpha, const float* beta, int64_t T) const;
    void attention_window(const AttentionDevice& w, CudaSequence& s, LayerDeviceState& l, const float* x, float* out,
                          int64_t T, const void* x_q8_0 = nullptr) const;
    // With `deferred` (a decode window: T <= kWindow) the combine is left out and described there (moe_layer).
    // Whether a prompt window of T tokens takes the grouped MoE path (every MoE layer of the model's shape does).
    bool grouped_window(int64_t T) const;
    void moe_window(const MoeDevice& m, const float* x, float* out, int64_t T,
                    cuda::MoeCombine* deferred = nullptr) const;
    void mark(OpKind kind) const {
        if (profiler_) profiler_->mark(*ctx_, kind);
    }
    // A stage of a split (LoadOptions::first_block): the first embeds the tokens, the last runs the head; a model on
    // one card is both. Block indices in blocks_, layout_ and a sequence's layers count from first_block_; the expert
    // cache and the routing are by trunk block.
    bool first_stage() const { return first_block_ == 0; }
    bool last_stage() const { return end_block_ == info_.n_layer; }

    std::unique_ptr<gguf::File> file_;
    ModelInfo info_;
    int64_t n_block_all_ = 0;
    int64_t first_block_ = 0, end_block_ = 0;  // the trunk blocks this model runs (all of them on one card)
    std::unique_ptr<cuda::Context> ctx_;
    std::unique_ptr<DeviceWeights> weights_;
    std::unique_ptr<ExpertCache> experts_;  // experts in host RAM (LoadOptions::experts.in_host), else null
    // The grouped MoE of prompt windows (issue 26), for the shape of the first MoE layer whose weights it takes, in
    // the window buffers; null: no such layer.
    std::unique_ptr<cuda::MoePromptWorkspace> moe_prompt_;
    std::optional<cuda::MoeLayerShape> moe_prompt_shape_;
    std::vector<const int32_t*> routing_ids_;  // by block: its MoE workspace's expert ids (null: no MoE)
    const Tensor* token_embd_ = nullptr;
    const Tensor* output_ = nullptr;
    int64_t prompt_window_ = kDefaultPromptChunk;  // LoadOptions::prompt_chunk
    bool ple_from_file_ = false;                   // LoadOptions::ple_from_file
    WindowBuffers w_{};

  private:
    void check_weights_fit() const;
    // forward() and forward_with_residual(): residual empty, or [tokens x n_streams x n_embd] floats.
    // run: a split's window over its stages (forward_windows); null: run_window on this model alone.
    void forward_rows(CudaSequence& seq, std::span<const int32_t> tokens, std::span<float> logits, bool last_only,
                      std::span<float> residual, const WindowRun& run = nullptr) const;
    CudaSequence& own(const SequenceState& seq, const char* call) const;
    void allocate_sequence(CudaSequence& s) const;
    // The window_* buffers of a sequence that verifies drafts; false (said once) when the budget refuses them.
    bool allocate_records(CudaSequence& s) const;
    void clear_sequence(CudaSequence& s) const;
    // head: queued after the window (inside a decode window's graph).
    void run_window(CudaSequence& s, std::span<const int32_t> tokens, const std::function<void()>& head) const;

    mutable std::vector<int32_t> window_host_;  // tokens, positions, lengths of the next window
    bool graphs_ = true;
    bool grouped_moe_ = true;  // LoadOptions::cuda_grouped_moe
    bool experts_in_host_ = false;
    cuda::GdnRecurrence gdn_recurrence_ = cuda::GdnRecurrence::Auto;  // --gdn-recurrence
    cuda::KvStorage kv_storage_ = cuda::KvStorage::F16;
    // --qsa-union: asked for, and why it does not apply to this model ("" when it does; said once on stderr).
    bool qsa_union_ = false;
    std::string qsa_union_off_;
    mutable bool qsa_union_scratch_reported_ = false;
    mutable bool records_refused_ = false;  // the budget refused a sequence its records: re-feed from then on
    int64_t ncu_replay_ = 0;  // LoadOptions::cuda_ncu_replay
    mutable int64_t replays_ = 0;
    GdnShape gdn_;
    AttentionShape attention_;
    std::vector<BlockLayout> layout_;
    PleShape ple_;
    bool has_ple_ = false;
    int64_t n_streams_ = 1;  // residual streams (WindowShape::n_streams)
    bool pending_write_ = false;  // WindowShape::pending_write
    std::unique_ptr<cuda::StreamProfiler> profiler_;
    mutable int64_t profiled_tokens_ = 0;
    mutable std::mutex mutex_;
};

}  // namespace strata::cuda_model
