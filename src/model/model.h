// The model interface the commands use. Each architecture lives in its own file (qwen4exp.cpp, qwen35moe.cpp,
// qwen3next.cpp) and is created from a GGUF by load_model().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace strata::gguf {
class File;
}

namespace strata {

struct ModelInfo {
    std::string arch;          // general.architecture
    std::string name;          // general.name, if any
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;       // trunk blocks (MTP blocks excluded)
    int64_t n_ctx_train = 0;
    std::vector<int32_t> eog_tokens;  // end-of-generation ids from the vocabulary metadata
};

// Everything one sequence carries between calls: KV cache, GDN recurrent and conv state, indexer pooled keys and tail,
// PLE token and conv history. Feeding a prompt at once, token by token or in chunks gives the same logits.
class SequenceState {
public:
    virtual ~SequenceState() = default;
    virtual int64_t n_past() const = 0;        // tokens consumed so far
    virtual int64_t capacity() const = 0;      // tokens it can hold
    virtual size_t memory_bytes() const = 0;   // what it allocated
    virtual void reset() = 0;                  // back to empty, memory kept
};

// The recurrent part of a sequence at one point (GDN and conv state, indexer tail, PLE history, n_past). With the KV
// cells below that point, which later tokens never change, it is all that is needed to come back there: a server
// keeps checkpoints at message boundaries so that a follow-up turn feeds only its new tokens.
class SequenceCheckpoint {
public:
    virtual ~SequenceCheckpoint() = default;
    virtual int64_t n_past() const = 0;
    virtual size_t memory_bytes() const = 0;
};

// The MTP draft layer's own cache for one sequence (Model::new_draft_state): the K/V of its cells. Cell i pairs the
// trunk's final residual after token i with token i + 1, at rope position i, and predicts token i + 2
// (strata-architecture.md 1.7; llama.cpp's nextn block). Cells are written in place, so drafting past the true cells
// and writing them again later needs no rollback.
class DraftState {
  public:
    virtual ~DraftState() = default;
    virtual int64_t capacity() const = 0;  // cells it can hold
};

// Host floats a model's forward() writes logits into (Model::host_floats): plain heap memory, or memory a backend
// copies into directly (CUDA: page-locked). Zero-initialised, move-only, freed with the object.
class HostFloats {
  public:
    using Release = void (*)(float*);
    HostFloats() = default;
    explicit HostFloats(size_t n);  // heap memory
    HostFloats(float* data, size_t n, Release release) : data_(data), size_(n), release_(release) {}
    ~HostFloats() { reset(); }
    HostFloats(HostFloats&& other) noexcept;
    HostFloats& operator=(HostFloats&& other) noexcept;
    HostFloats(const HostFloats&) = delete;
    HostFloats& operator=(const HostFloats&) = delete;

    float* data() const { return data_; }
    size_t size() const { return size_; }
    std::span<float> span() const { return {data_, size_}; }
    operator std::span<float>() const { return span(); }
    operator std::span<const float>() const { return {data_, size_}; }

  private:
    void reset() noexcept;
    float* data_ = nullptr;
    size_t size_ = 0;
    Release release_ = nullptr;
};

// One sequence's share of a batched forward pass (Model::forward_batch).
struct BatchEntry {
    SequenceState* seq = nullptr;
    std::span<const int32_t> tokens;
    std::span<float> logits;  // as in Model::forward
    bool last_only = false;
    // Empty, or room for the trunk's final residual after each token [tokens x draft_residual_width()], as
    // forward_with_residual writes it (what the MTP draft layer of this sequence reads).
    std::span<float> residual;
    // A speculative verification window: where the backend can, the pass keeps its per-token inputs to the
    // sequence's recurrent state, so that Model::commit keeps a prefix of it without a second pass.
    bool window = false;
};

enum class Backend { Cpu, Cuda };

// CUDA: which kernel runs the GDN blocks' gated delta rule (same bits either way; --gdn-recurrence). Auto: the one
// measured faster.
enum class GdnRecurrenceKernel { Auto, Column, Shuffle };
// How the CUDA backend stores the KV cache: fp16, or int8 with one fp16 scale per 64 values (backend/cuda/attention.h).
enum class KvCacheType { F16, Int8 };

class RoutingSink;         // model/moe.h
class ExpertCacheAdvisor;  // model/moe.h
class HostExpertCompute;   // model/moe.h
struct PleTableInFile;     // model/ple.h
class PleRowSource;        // model/ple.h

// Makes the reader of one PLE table that stays in its file; max_rows: the most rows one fetch asks for.
using PleRowSourceFactory = std::function<std::unique_ptr<PleRowSource>(const PleTableInFile& table, int64_t max_rows)>;

// CUDA: where the routed experts live (issue 25). Made by the memory planner (runtime/memory_plan.h) from the budgets;
// the trunk follows it. Default: every expert in VRAM.
struct ExpertPlacement {
    // Routed experts stay in pinned host RAM (registered pages of the mapped file): the GPU reads a miss over PCIe, or
    // CPU workers compute it. Dense weights, routers, shared experts, head, KV and states stay in VRAM.
    bool in_host = false;
    std::vector<int64_t> cache_slots;        // per trunk block: VRAM slots for its experts (missing: 0)
    std::vector<std::vector<int32_t>> warm;  // per trunk block: the experts the slots hold at start (a profile)
    std::shared_ptr<ExpertCacheAdvisor> advisor;  // adapts the slots while decoding; null: they keep the warm set
    std::shared_ptr<HostExpertCompute> cpu_workers;  // null: every miss is read by the GPU over PCIe
    // With cpu_workers: the share of each layer's non-resident experts the workers compute (the rest the GPU reads
    // over PCIe). Negative: adapted while decoding, from measured window times.
    double cpu_share = -1;
    // Prompt windows on the grouped MoE path stream every expert no slot holds into VRAM on a copy stream, through a
    // ring of stream_buffers buffers, each holding one of a layer's stream_ranges ranges of experts for gate and up
    // or for down (stream_ranges 0: such windows read their misses over PCIe in place, tile by tile).
    int stream_ranges = 0;
    int stream_buffers = 0;
    // The RAM budget cannot pin the experts: they stay in the mapped file (page cache / SSD). The GPU cannot read
    // such pages over PCIe, so the CPU workers (required) compute every miss, and copies into VRAM are staged.
    bool from_file = false;
};

// CUDA prompt windows (LoadOptions::prompt_chunk): the default and the range --prompt-chunk takes.
inline constexpr int64_t kDefaultPromptChunk = 512;
inline constexpr int64_t kMinPromptChunk = 16;
inline constexpr int64_t kMaxPromptChunk = 8192;

// CUDA: one stage of a model split over several GPUs (issue 29; model/cuda/split_cuda.cpp): the trunk blocks
// [first_block, end_block) on one device, with their own budget and expert placement (cache_slots and warm by trunk
// block: the stage's blocks alone are read).
struct CudaStage {
    int device = 0;
    size_t vram_budget = 0;  // 0: what is free on the device less 5%
    int64_t first_block = 0, end_block = 0;
    ExpertPlacement experts;
};

struct LoadOptions {
    Backend backend = Backend::Cpu;
    int n_threads = 0;  // 0: all cores
    // When set, loading reads the weights once (so the first tokens do not wait on page faults) and reports the
    // fraction read, from 0 to 1, as it goes, on the loading thread (at most about 200 calls). Weights larger than
    // half the machine's RAM, and the SSD-resident PLE table, are not read ahead: progress then jumps to 1.
    std::function<void(float fraction)> progress;
    // With AVX-512, Q8_0 and Q4_K matrices are copied into the CPU GEMM's packed layout (backend/cpu/packed.h) when
    // the copies fit in the free memory with a margin; the file pages they came from are handed back.
    bool repack = true;
    // CUDA: the device, the bytes of device memory strata may take (0: what is free less 5%), and whether decode
    // windows replay captured CUDA graphs (false: the same kernels launched one by one, for parity checks).
    int cuda_device = 0;
    size_t vram_budget = 0;
    bool cuda_graphs = true;
    // CUDA: the tokens of a prompt window (--prompt-chunk; 0: kDefaultPromptChunk). A longer window reads each
    // weight, and each expert missed in VRAM, once for more tokens, and its buffers take more device memory (the
    // memory plan counts them).
    int64_t prompt_chunk = 0;
    // CUDA: dense products of prompt windows (cuda::kBlasMinTokens tokens or more) through cuBLAS on weights
    // dequantized to fp16 (false: the backend's own tensor-core GEMM; for parity checks and A/B benchmarks).
    bool cuda_blas = true;
    // CUDA with experts in host RAM: the plan may stream prompt windows' misses into VRAM (ExpertPlacement::
    // stream_ranges); false (--no-expert-stream): they are read over PCIe in place, for comparisons.
    bool stream_experts = true;
    // With stream_experts: the ring's buffers (--expert-ring; 0: the plan's default, runtime/memory_plan.h). More run
    // the copies further ahead of the products, for fewer cache slots.
    int stream_buffers = 0;
    // CUDA: prompt windows' MoE through the grouped expert GEMM (fp16 operands on tensor cores; false: in slices on
    // the decode windows' kernels, for parity checks and A/B benchmarks).
    bool cuda_grouped_moe = true;
    // CUDA: time each kind of op with events (launches one by one) and print the split per token to stderr when the
    // model goes away.
    bool cuda_profile = false;
    GdnRecurrenceKernel gdn_recurrence = GdnRecurrenceKernel::Auto;
    // CUDA: the KV cache's storage (--kv-cache).
    KvCacheType kv_cache = KvCacheType::F16;
    // CUDA: prompt windows of QSA layers attend over the union of 8 positions' selections on tensor cores
    // (--qsa-union; issue 8, seed 003) instead of once per position. Logits differ by rounding: fp16 products.
    bool qsa_union = false;
    // CUDA: the N-th captured-graph replay (from 1) is bracketed with the profiler's start and stop, so that Nsight
    // Compute run with --profile-from-start off measures one decode window (bench --ncu-replay; 0: off).
    int64_t cuda_ncu_replay = 0;
    // CPU: every MoE layer reports the experts each token routed to (--routing-trace; runtime/routing_trace.h).
    std::shared_ptr<RoutingSink> routing_trace;
    ExpertPlacement experts;
    // CUDA, PLE: the tables stay in the file and each window's rows are read from it on the host through ple_reader
    // (the memory plan's choice when the tables do not fit pinned RAM; --ple-from-file forces it), instead of the
    // whole tables copied into mapped pinned memory. The factory carries the planned row cache size.
    bool ple_from_file = false;
    PleRowSourceFactory ple_reader;
    // CUDA: the trunk split over several GPUs (--split, --devices), one stage a device in block order, the token table
    // on the first and the head (and MTP layer) on the last; empty: one card. Each stage loads as a model of its
    // blocks with these options, but for the stage's device, budget and expert placement. A device may repeat (two
    // stages on one GPU: the test path of a split without two GPUs).
    std::vector<CudaStage> split;
    // CUDA: the blocks this model runs when it is one stage of a split (set by the split for each stage; end_block 0:
    // to the last). A stage after the first takes the residual from the one before it instead of the token table, a
    // stage before the last hands it on instead of running the head.
    int64_t first_block = 0, end_block = 0;
};

// Experts in host RAM (CUDA, ExpertPlacement::in_host): what the VRAM expert cache and the CPU workers did since
// loading. Counts; rates are the reader's (the server's /metrics and /v1/status, bench).
struct ExpertOffloadStats {
    int64_t tokens = 0;
    int64_t lookups = 0;    // (token, expert) pairs routed
    int64_t hits = 0;       // of them, served from a VRAM slot
    int64_t cpu_pairs = 0;  // of the misses, computed by the CPU workers (the rest read over PCIe)
    int64_t swaps = 0;
    int64_t swap_bytes = 0, pcie_bytes = 0, cpu_bytes = 0;
    double cpu_share = 0;           // the share of misses the CPU workers own now
    int64_t doorbell_timeouts = 0;  // waits for the CPU workers that hit their bound
    int64_t cache_slots = 0;        // VRAM slots, all layers together
    int64_t streamed_windows = 0;   // prompt windows whose misses were streamed into VRAM (pcie_bytes counts them)
    std::vector<std::vector<uint64_t>> routing_counts;  // [block][expert]: routed since loading (a profile's counts)
};

class Model {
public:
    virtual ~Model() = default;
    virtual const ModelInfo& info() const = 0;
    // A new empty sequence that can hold max_tokens tokens. Throws Error if the memory cannot be planned.
    virtual std::unique_ptr<SequenceState> new_sequence(int64_t max_tokens) const = 0;
    // Feeds tokens after what the sequence holds. logits: either empty, or room for tokens.size() * n_vocab floats
    // (the logits after each input token, row-major); with last_only, room for n_vocab floats (the last token's).
    // Throws Error on a token id out of range or a sequence that would overflow.
    virtual void forward(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                         bool last_only = false) const = 0;
    // Feeds several distinct sequences in one pass (the weights are read once for all of them). Each entry gets
    // exactly the logits forward() would give it alone, whatever else is in the batch. Throws Error as forward() does,
    // and when a sequence appears twice.
    // (Hybrid models: every entry is checked before anything runs, so after an Error no sequence has moved. Entries
    // may mix prompt chunks and single tokens; an entry with no tokens is a no-op. Calls on one model are serialised.)
    virtual void forward_batch(std::span<const BatchEntry> batch) const;
    // n floats of host memory that forward() fills fastest as its logits (zeros). The default is heap memory; the
    // CUDA backend's is page-locked, so the device copies a decode token's logits (~1 MB) straight into it, where a
    // copy into pageable memory goes through the driver's staging at a fraction of the bus's speed. Outlives the
    // model if kept.
    virtual HostFloats host_floats(size_t n) const { return HostFloats(n); }
    // With experts in host RAM, what the expert cache did so far (any thread); nullopt otherwise.
    virtual std::optional<ExpertOffloadStats> expert_offload_stats() const { return std::nullopt; }
    // The MTP draft layer (issue 28), where the file has one and this backend runs it: the width of the trunk
    // residual it reads (streams x n_embd); 0 when there is none (the calls below then throw Error).
    virtual int64_t draft_residual_width() const { return 0; }
    // forward() that also writes the trunk's final residual after each input token into `residual`
    // [tokens x draft_residual_width()].
    virtual void forward_with_residual(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                                       std::span<float> residual, bool last_only = false) const;
    virtual std::unique_ptr<DraftState> new_draft_state(int64_t capacity) const;
    // Runs the draft layer over cells pos0 .. pos0 + n - 1, attending to the cells below pos0 and to each other:
    // cell pos0 + i pairs residual row i [n x width] with tokens[i]. Writes the last cell's logits into `logits` (n_vocab
    // floats) and, when `residual_out` is not empty, the last cell's output residual (width floats: a chained draft
    // reads it in place of the trunk's). Throws Error on cells past the capacity or a bad token id.
    virtual void draft_forward(DraftState& state, int64_t pos0, std::span<const float> residual,
                               std::span<const int32_t> tokens, std::span<float> logits,
                               std::span<float> residual_out) const;
    // The sequence's recurrent state now; restore() brings the sequence back to it, provided the sequence has only
    // been fed forward since (tokens appended, no reset). Throws Error on a checkpoint from another sequence or model,
    // or one that is ahead of the sequence.
    // (Hybrid models: a restore to a point below a checkpoint, followed by new tokens, overwrites cells that
    // checkpoint relies on, so restoring it later throws Error too; a reset makes every earlier checkpoint stale.
    // Restoring an earlier point keeps the checkpoints at or below it valid. Neither call may run while the same
    // sequence is in a forward on another thread.)
    virtual std::unique_ptr<SequenceCheckpoint> checkpoint(const SequenceState& seq) const;
    virtual void restore(SequenceState& seq, const SequenceCheckpoint& checkpoint) const;
    // After a verification window (BatchEntry::window) fed right after checkpoint `before`: brings the sequence to
    // `before` plus the window's first n_keep tokens without running them again (their KV cells stay; those past
    // them are overwritten later), as restore() and a forward() of those tokens would, bit for bit. False when the
    // backend cannot (nothing changed: restore and re-feed instead). Throws Error when the sequence's last pass was
    // not a window after `before`, or n_keep is past the window.
    virtual bool commit(SequenceState& seq, const SequenceCheckpoint& before, int64_t n_keep) const;
};

// Loads the model in a GGUF (weights stay mapped from the file; with the CUDA backend they are copied to the device).
// Throws Error for an unknown architecture, missing or misshapen tensors, or unsupported tensor types, naming what is
// wrong, and for the CUDA backend in a build without it, without a device, or over the VRAM budget.
std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& options = {});

// What loading the file for n_ctx tokens would take, part by part (for `strata info`).
struct MemoryPlanItem {
    std::string what;
    uint64_t bytes = 0;
};
std::vector<MemoryPlanItem> plan_memory(const gguf::File& file, int64_t n_ctx);

// The bytes one decoded token reads at a given depth (the numerator of a roofline figure): every weight once, except
// the routed experts (the used share), the token table (one row, unless it is also the head) and the PLE table (one
// row per head); plus the KV cells attention reads (QSA layers: at most the budget plus a block), fp16 or int8 with an
// fp16 scale per 64 values (--kv-cache), and the pooled indexer keys QSA scores. For the hybrid architectures.
struct DecodeTraffic {
    uint64_t weights = 0;
    uint64_t cache = 0;
    uint64_t total() const { return weights + cache; }
};
DecodeTraffic decode_traffic(const gguf::File& file, int64_t depth, KvCacheType kv = KvCacheType::F16);

}  // namespace strata
