// qwen4exp on CUDA (issue 7): the trunk of qwen4exp.cpp, block by block, over the CUDA backend's ops. Tokens go
// through in windows of up to kWindow (prompts as consecutive windows, decode one token at a time); each window size
// is captured once per sequence as a CUDA graph and replayed, the window's tokens and positions written to device
// memory before each replay. Every weight except the PLE table lives in device memory; the PLE table sits in mapped
// pinned host memory (the real one does not fit in VRAM) and its rows are read over the bus.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/block_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/model_ops.h"
#include "core/error.h"
#include "model/cuda/device_weights.h"
#include "model/hybrid.h"
#include "model/qwen4exp.h"

namespace strata {

namespace {

constexpr int64_t kWindow = cuda::kMaxMatvecTokens;

// The op kinds of the profile (LoadOptions::cuda_profile).
enum OpKind { kEmbed, kPle, kHyperConnection, kGdnProjections, kGdnRecurrence, kAttentionProjections, kAttention,
              kMoe, kHead, kOpKinds };
const std::vector<std::string> kOpKindNames = {"embedding",  "PLE",          "hyper-connections",
                                               "GDN projections", "GDN recurrence", "attention projections",
                                               "attention (KV, QSA)", "MoE",  "head"};

struct GdnDevice {
    const Tensor *qkv, *gate, *beta, *alpha, *out;
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

struct PleDevice {
    const Tensor *key, *value;
    const float *norm_key, *norm_query, *norm_conv, *conv;
    const uint64_t *multipliers, *offsets, *sizes;
    std::unique_ptr<cuda::MappedHostBuffer> table;  // the PLE table in mapped pinned host memory
    DType table_type = DType::F16;
    int64_t table_rows = 0;
};

struct BlockDevice {
    bool recurrent = true;
    cuda::HyperConnectionDeviceWeights hc_attn, hc_ffn;
    GdnDevice gdn{};
    AttentionDevice attention{};
    cuda::MoeLayerWeights moe;
    std::unique_ptr<cuda::MoeWorkspace> moe_workspace;
    bool has_ple = false;
    PleDevice ple{};
};

// One trunk block's state of one sequence in device memory (only the parts the block uses are allocated).
struct LayerDeviceState {
    cuda::DeviceBuffer conv_history, recurrent;                   // GDN
    std::unique_ptr<cuda::KvCache> kv;                            // attention
    cuda::DeviceBuffer page_table, kv_length, index_raw, index_pooled;
    cuda::DeviceBuffer ple_tokens, ple_conv_history;              // PLE
};

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
    cuda::DeviceBuffer qsa_scores, qsa_keys, attention_workspace;
    int64_t dense_splits = 1, sparse_splits = 1;
    std::array<cuda::Graph, kWindow + 1> graphs;  // by window size; they hold this sequence's buffers
    const void* graphs_scratch = nullptr;          // the context scratch the graphs were captured with
    std::function<void(CudaSequence&)> reset_;
};

// Device buffers of one window, shared by every block and sequence (a forward runs one window at a time).
struct WindowBuffers {
    cuda::DeviceBuffer buffer;
    int32_t *tokens, *positions, *lengths;  // kWindow each, consecutive: the host writes them before each window
    float *residual, *mixed, *out, *inject, *hc_work;
    float *qkv, *z, *beta, *alpha, *conv, *core;                               // GDN
    float *qg, *k_new, *v_new, *heads, *index_raw, *index_q;                   // attention
    int32_t *cells, *n_selected;
    int64_t max_cells = 0;
    int64_t *ple_rows;                                                         // PLE
    void* ple_staging;
    float *ple_emb, *ple_key, *ple_value, *ple_query, *ple_gated, *ple_normed, *ple_conv;
    float *hidden, *logits;                                                    // head
    void* embed_staging;
};

class Qwen4ExpCudaModel final : public Model {
  public:
    Qwen4ExpCudaModel(std::unique_ptr<gguf::File> file, const LoadOptions& options)
        : file_(std::move(file)), graphs_(options.cuda_graphs && !options.cuda_profile) {
        int64_t n_block_all = 0;
        info_ = read_hybrid_info(*file_, &n_block_all);
        h_ = read_qwen4exp_hparams(*file_, info_, n_block_all);
        TensorBinder binder(*file_);
        const HybridEmbeddings embeddings = bind_hybrid_embeddings(*file_, binder, info_);
        const HyperConnectionWeights output_hc = bind_hyper_connection(binder, "output_hc", h_.hc, false);
        const std::vector<Qwen4ExpBlock> blocks = bind_qwen4exp_blocks(binder, h_, info_.n_layer);

        ctx_ = std::make_unique<cuda::Context>(
            cuda::ContextOptions{.device = options.cuda_device, .vram_budget = options.vram_budget});
        check_weights_fit();
        weights_ = std::make_unique<DeviceWeights>(*ctx_, *file_);
        DeviceWeights& dw = *weights_;
        token_embd_ = dw.tensor(embeddings.token_embd);
        output_ = dw.tensor(embeddings.output);
        output_hc_ = hc_device(output_hc);
        for (const Qwen4ExpBlock& b : blocks) blocks_.push_back(block_device(b));
        allocate_window();
        if (options.cuda_profile) profiler_ = std::make_unique<cuda::StreamProfiler>(kOpKindNames);
        std::fprintf(stderr, "strata: CUDA %s, VRAM plan after loading:\n%s", ctx_->info().name.c_str(),
                     ctx_->memory().plan().c_str());
    }

    ~Qwen4ExpCudaModel() override {
        if (profiler_)
            std::fprintf(stderr, "strata: CUDA time by op kind over %lld tokens (kernels launched one by one):\n%s",
                         static_cast<long long>(profiled_tokens_), profiler_->report(profiled_tokens_).c_str());
    }

    const ModelInfo& info() const override { return info_; }

    std::unique_ptr<SequenceState> new_sequence(int64_t max_tokens) const override {
        if (max_tokens <= 0)
            throw Error("a sequence needs room for at least one token, asked for " + std::to_string(max_tokens));
        if (max_tokens > (int64_t{1} << 31) - kWindow)
            throw Error("a sequence of " + std::to_string(max_tokens) + " tokens is more than the CUDA backend "
                        "supports (2^31 positions)");
        std::lock_guard<std::mutex> lock(mutex_);
        auto seq = std::make_unique<CudaSequence>(this, max_tokens);
        try {
            allocate_sequence(*seq);
        } catch (const Error& e) {
            throw Error("a sequence of " + std::to_string(max_tokens) + " tokens does not fit in device memory (" +
                        e.what() + "); ask for a smaller context or a larger --vram-budget");
        }
        seq->reset_ = [this](CudaSequence& s) {
            std::lock_guard<std::mutex> guard(mutex_);
            clear_sequence(s);
        };
        clear_sequence(*seq);
        return seq;
    }

    void forward(SequenceState& state, std::span<const int32_t> tokens, std::span<float> logits,
                 bool last_only) const override {
        auto* seq = dynamic_cast<CudaSequence*>(&state);
        if (seq == nullptr || seq->owner_ != this) throw Error("forward: the sequence belongs to another model");
        const int64_t T = static_cast<int64_t>(tokens.size()), V = info_.n_vocab;
        const size_t want = last_only ? static_cast<size_t>(V) : static_cast<size_t>(T * V);
        if (!logits.empty() && logits.size() < want)
            throw Error("forward: the logits buffer holds " + std::to_string(logits.size()) + " floats, " +
                        std::to_string(want) + " are needed");
        for (int32_t t : tokens)
            if (t < 0 || t >= V)
                throw Error("token id " + std::to_string(t) + " is out of range (vocabulary of " + std::to_string(V) +
                            ")");
        if (seq->n_past_ + T > seq->capacity_)
            throw Error("the sequence holds " + std::to_string(seq->n_past_) + " tokens; " + std::to_string(T) +
                        " more would pass its capacity of " + std::to_string(seq->capacity_));
        if (T == 0) return;
        std::lock_guard<std::mutex> lock(mutex_);
        for (int64_t start = 0; start < T; start += kWindow) {
            const int64_t n = std::min(kWindow, T - start);
            run_window(*seq, tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(n)));
            if (logits.empty()) continue;
            if (!last_only)
                ctx_->download(w_.logits, logits.data() + start * V, static_cast<size_t>(n * V) * sizeof(float));
            else if (start + n == T)
                ctx_->download(w_.logits + (n - 1) * V, logits.data(), static_cast<size_t>(V) * sizeof(float));
        }
        ctx_->synchronize();
    }

  private:
    // ---- loading ----------------------------------------------------------------------------------------------

    // The memory plan before anything is taken: the weights the model binds (every file tensor but the PLE table,
    // which stays in host memory, and the MTP blocks) must fit in the budget with room for the window buffers.
    void check_weights_fit() const {
        uint64_t weights = 0, ple = 0;
        const std::string mtp_prefix = "blk." + std::to_string(info_.n_layer) + ".";
        for (const gguf::TensorInfo& t : file_->tensors()) {
            if (t.name == "per_layer_token_embd.weight") {
                ple += t.n_bytes;
                continue;
            }
            bool mtp = false;
            for (int64_t il = info_.n_layer; il < info_.n_layer + 8 && !mtp; ++il)
                mtp = t.name.rfind("blk." + std::to_string(il) + ".", 0) == 0;
            if (!mtp) weights += t.n_bytes;
        }
        const size_t budget = ctx_->memory().budget();
        std::fprintf(stderr,
                     "strata: CUDA memory plan: weights %.2f GiB in VRAM, PLE table %.2f GiB in pinned host memory, "
                     "budget %.2f GiB (--vram-budget; %.2f GiB free on %s)\n",
                     static_cast<double>(weights) / (1 << 30), static_cast<double>(ple) / (1 << 30),
                     static_cast<double>(budget) / (1 << 30),
                     static_cast<double>(ctx_->info().free_bytes_at_start) / (1 << 30), ctx_->info().name.c_str());
        if (weights > budget)
            throw Error(file_->path() + ": the weights need " + std::to_string(weights >> 20) +
                        " MiB of device memory but the budget is " + std::to_string(budget >> 20) +
                        " MiB; raise --vram-budget or use a smaller model (experts in host RAM are a later issue)");
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
            if (b.gdn.projection != GdnProjection::Separate)
                throw Error(file_->path() + ": the CUDA backend expects qwen4exp's separate GDN projections");
            d.gdn = {.qkv = dw.tensor(b.gdn.qkv),
                     .gate = dw.tensor(b.gdn.gate),
                     .beta = dw.tensor(b.gdn.beta),
                     .alpha = dw.tensor(b.gdn.alpha),
                     .out = dw.tensor(b.gdn.out),
                     .conv = dw.floats(b.gdn.conv),
                     .dt_bias = dw.floats(b.gdn.dt_bias),
                     .a = dw.floats(b.gdn.a),
                     .norm = dw.floats(b.gdn.norm)};
        } else {
            const AttentionWeights& w = b.attention;
            d.attention = {.q = dw.tensor(w.q),
                           .k = dw.tensor(w.k),
                           .v = dw.tensor(w.v),
                           .o = dw.tensor(w.o),
                           .q_norm = dw.floats(w.q_norm),
                           .k_norm = dw.floats(w.k_norm),
                           .indexer = b.indexer,
                           .index_q = dw.tensor(w.index_q),
                           .index_k = dw.tensor(w.index_k),
                           .index_q_norm = dw.floats(w.index_q_norm),
                           .index_k_norm = dw.floats(w.index_k_norm)};
        }
        const MoeWeights& m = b.moe;
        d.moe = {.router = dw.tensor(m.router),
                 .gate_up = dw.tensor(m.gate_up),
                 .gate = dw.tensor(m.gate),
                 .up = dw.tensor(m.up),
                 .down = dw.tensor(m.down),
                 .shared_gate = dw.floats(m.shared_gate),
                 .shared_gate_proj = dw.tensor(m.shared_gate_proj),
                 .shared_up = dw.tensor(m.shared_up),
                 .shared_down = dw.tensor(m.shared_down)};
        d.moe_workspace = std::make_unique<cuda::MoeWorkspace>(*ctx_, moe_shape(), d.moe);
        if (b.has_ple) {
            d.has_ple = true;
            const PleWeights& p = b.ple;
            d.ple.key = dw.tensor(p.key);
            d.ple.value = dw.tensor(p.value);
            d.ple.norm_key = dw.floats(p.norm_key);
            d.ple.norm_query = dw.floats(p.norm_query);
            d.ple.norm_conv = dw.floats(p.norm_conv);
            d.ple.conv = dw.floats(p.conv);
            d.ple.multipliers = dw.u64s(h_.ple.multipliers);
            d.ple.offsets = dw.u64s(h_.ple.offsets);
            d.ple.sizes = dw.u64s(h_.ple.sizes);
            d.ple.table = std::make_unique<cuda::MappedHostBuffer>(p.table.n_bytes());
            std::copy_n(static_cast<const uint8_t*>(p.table.data), p.table.n_bytes(),
                        static_cast<uint8_t*>(d.ple.table->host()));
            d.ple.table_type = p.table.type;
            d.ple.table_rows = p.table.ne[1];
            ple_row_bytes_ = p.table.nb[1];
        }
        return d;
    }

    cuda::MoeLayerShape moe_shape() const {
        const MoeShape& s = h_.moe;
        return {.n_embd = s.n_embd,
                .n_expert = s.n_expert,
                .n_expert_used = s.n_expert_used,
                .n_ff = s.n_ff,
                .n_ff_shared = s.n_ff_shared,
                .normalize_weights = s.normalize_weights};
    }

    cuda::HyperConnectionDims hc_dims() const {
        return {.n_streams = h_.hc.n_streams, .n_embd = h_.hc.n_embd, .low_rank = h_.hc.low_rank, .eps = h_.hc.eps};
    }

    // The window buffers, carved from one allocation, and the context scratch every product of a window needs
    // (reserved now: a captured graph keeps its address).
    void allocate_window() {
        const int64_t T = kWindow, H = info_.n_embd, hc = h_.hc.n_streams, HC = hc * H, V = info_.n_vocab;
        const GdnShape& g = h_.gdn;
        const AttentionShape& a = h_.attention;
        const IndexerShape& ix = h_.indexer;
        int64_t max_cells = 1;
        for (const BlockDevice& b : blocks_)
            if (!b.recurrent && b.attention.sparse()) max_cells = std::max(max_cells, qsa_max_cells(b.attention.indexer));
        const PleShape& p = h_.ple;
        const int64_t ple_width = h_.ple_block >= 0 ? p.n_heads() * p.row_width : 0;
        std::vector<std::pair<void**, size_t>> parts;
        auto f32 = [&](float** ptr, int64_t n) { parts.push_back({reinterpret_cast<void**>(ptr), size_t(n) * 4}); };
        auto i32 = [&](int32_t** ptr, int64_t n) { parts.push_back({reinterpret_cast<void**>(ptr), size_t(n) * 4}); };
        i32(&w_.tokens, 3 * T);  // tokens, positions, lengths: one block, written by one copy per window
        f32(&w_.residual, T * HC);
        f32(&w_.mixed, T * H);
        f32(&w_.out, T * H);
        f32(&w_.inject, T * hc);
        f32(&w_.hc_work, cuda::hyper_connection_workspace_floats(hc_dims(), T));
        f32(&w_.qkv, T * g.conv_dim());
        f32(&w_.z, T * g.value_dim());
        f32(&w_.beta, T * g.n_v_heads);
        f32(&w_.alpha, T * g.n_v_heads);
        f32(&w_.conv, T * g.conv_dim());
        f32(&w_.core, T * g.value_dim());
        f32(&w_.qg, T * 2 * a.head_dim * a.n_head);
        f32(&w_.k_new, T * a.n_head_kv * a.head_dim);
        f32(&w_.v_new, T * a.n_head_kv * a.head_dim);
        f32(&w_.heads, T * a.n_head * a.head_dim);
        f32(&w_.index_raw, T * ix.head_dim);
        f32(&w_.index_q, T * ix.n_head * ix.head_dim);
        i32(&w_.cells, T * max_cells);
        i32(&w_.n_selected, T);
        w_.max_cells = max_cells;
        parts.push_back({reinterpret_cast<void**>(&w_.ple_rows), size_t(T * std::max<int64_t>(p.n_heads(), 1)) * 8});
        parts.push_back({&w_.ple_staging, size_t(T * std::max<int64_t>(p.n_heads(), 1)) * std::max<size_t>(ple_row_bytes_, 4)});
        f32(&w_.ple_emb, T * std::max<int64_t>(ple_width, 1));
        f32(&w_.ple_key, T * HC);
        f32(&w_.ple_value, T * H);
        f32(&w_.ple_query, T * HC);
        f32(&w_.ple_gated, T * HC);
        f32(&w_.ple_normed, T * HC);
        f32(&w_.ple_conv, T * HC);
        f32(&w_.hidden, T * H);
        f32(&w_.logits, T * V);
        parts.push_back({&w_.embed_staging, cuda::embed_staging_bytes(*token_embd_, T)});
        size_t total = 0;
        for (auto& [ptr, bytes] : parts) total += (bytes + 255) / 256 * 256;
        w_.buffer = ctx_->allocate(total, "window");
        auto* base = static_cast<uint8_t*>(w_.buffer.data());
        for (auto& [ptr, bytes] : parts) {
            *ptr = base;
            base += (bytes + 255) / 256 * 256;
        }
        w_.positions = w_.tokens + kWindow;
        w_.lengths = w_.tokens + 2 * kWindow;

        size_t scratch = 0;
        auto need = [&](const Tensor* t) {
            if (t) scratch = std::max(scratch, cuda::matmul_scratch_bytes(*t, kWindow));
        };
        need(output_);
        for (const cuda::HyperConnectionDeviceWeights* w : {&output_hc_}) need(w->down), need(w->up);
        for (const BlockDevice& b : blocks_) {
            for (const auto* w : {&b.hc_attn, &b.hc_ffn}) need(w->down), need(w->up), need(w->inject);
            for (const Tensor* t : {b.gdn.qkv, b.gdn.gate, b.gdn.beta, b.gdn.alpha, b.gdn.out}) need(t);
            for (const Tensor* t : {b.attention.q, b.attention.k, b.attention.v, b.attention.o, b.attention.index_q,
                                    b.attention.index_k})
                need(t);
            need(b.moe.router);
            if (b.has_ple) need(b.ple.key), need(b.ple.value);
        }
        ctx_->scratch(scratch);
    }

    // ---- sequences --------------------------------------------------------------------------------------------

    void allocate_sequence(CudaSequence& s) const {
        const int64_t cap = s.capacity_;
        const GdnShape& g = h_.gdn;
        const AttentionShape& a = h_.attention;
        s.layers.resize(blocks_.size());
        int64_t max_blocks = 1;
        bool any_dense = false, any_sparse = false;
        for (size_t il = 0; il < blocks_.size(); ++il) {
            const BlockDevice& b = blocks_[il];
            LayerDeviceState& l = s.layers[il];
            if (b.recurrent) {
                l.conv_history = ctx_->allocate(size_t((g.conv_kernel - 1) * g.conv_dim()) * 4, "sequence state");
                l.recurrent = ctx_->allocate(size_t(g.n_v_heads * g.k_head_dim * g.v_head_dim) * 4, "sequence state");
            } else {
                const int64_t pages = (cap + cuda::kKvPageCells - 1) / cuda::kKvPageCells;
                l.kv = std::make_unique<cuda::KvCache>(
                    *ctx_, cuda::KvCacheShape{.n_head_kv = a.n_head_kv, .head_dim = a.head_dim, .n_pages = pages});
                std::vector<int32_t> table(static_cast<size_t>(pages));
                for (int64_t j = 0; j < pages; ++j) table[static_cast<size_t>(j)] = static_cast<int32_t>(j);
                l.page_table = ctx_->upload(table.data(), table.size() * 4, "kv cache");
                l.kv_length = ctx_->allocate(4, "kv cache");
                if (b.attention.sparse()) {
                    const IndexerShape& ix = b.attention.indexer;
                    l.index_raw = ctx_->allocate(size_t(cap * ix.head_dim) * 4, "kv cache");
                    l.index_pooled =
                        ctx_->allocate(size_t(std::max<int64_t>(cap / ix.ratio, 1) * ix.head_dim) * 4, "kv cache");
                    max_blocks = std::max(max_blocks, cap / ix.ratio + 1);
                    any_sparse = true;
                } else {
                    any_dense = true;
                }
            }
            if (b.has_ple) {
                const PleShape& p = h_.ple;
                l.ple_tokens = ctx_->allocate(size_t(std::max<int64_t>(p.ngram - 1, 1)) * 4, "sequence state");
                l.ple_conv_history =
                    ctx_->allocate(size_t(p.history_rows() * p.n_streams * p.n_embd) * 4, "sequence state");
            }
        }
        s.qsa_scores = ctx_->allocate(size_t(max_blocks) * 4, "sequence state");
        s.qsa_keys = ctx_->allocate(size_t(max_blocks) * 4, "sequence state");
        s.dense_splits = any_dense ? cuda::decode_attention_splits(*ctx_, a.n_head_kv, cap) : 1;
        s.sparse_splits = any_sparse ? cuda::decode_attention_splits(*ctx_, a.n_head_kv, std::min(cap, w_.max_cells)) : 1;
        if (any_dense || any_sparse)
            s.attention_workspace = ctx_->allocate(
                cuda::decode_attention_workspace_bytes(a.n_head, a.head_dim, std::max(s.dense_splits, s.sparse_splits)),
                "sequence state");
        size_t bytes = s.qsa_scores.size() + s.qsa_keys.size() + s.attention_workspace.size();
        for (const LayerDeviceState& l : s.layers) {
            for (const cuda::DeviceBuffer* b : {&l.conv_history, &l.recurrent, &l.page_table, &l.kv_length,
                                                &l.index_raw, &l.index_pooled, &l.ple_tokens, &l.ple_conv_history})
                bytes += b->size();
            if (l.kv)
                bytes += 2 * size_t(l.kv->shape().n_pages) *
                         (cuda::KvCache::value_bytes_per_page(l.kv->shape()) +
                          cuda::KvCache::scale_bytes_per_page(l.kv->shape()));
        }
        s.bytes_ = bytes;
    }

    // Back to empty: zero recurrent state and histories, the PLE history full of EOS, length 0. KV cells need no
    // clearing (nothing reads a cell before it is written). The graphs stay valid: the buffers do not move.
    void clear_sequence(CudaSequence& s) const {
        for (LayerDeviceState& l : s.layers) {
            for (cuda::DeviceBuffer* b : {&l.conv_history, &l.recurrent, &l.kv_length, &l.index_raw, &l.index_pooled,
                                          &l.ple_conv_history})
                if (b->size()) ctx_->zero(b->data(), b->size());
            if (l.ple_tokens.size()) {
                const std::vector<int32_t> eos(l.ple_tokens.size() / 4, h_.ple.eos);
                ctx_->copy_to_device(l.ple_tokens.data(), eos.data(), eos.size() * 4);
            }
        }
        ctx_->synchronize();
        s.n_past_ = 0;
    }

    // ---- the forward pass -------------------------------------------------------------------------------------

    void run_window(CudaSequence& s, std::span<const int32_t> tokens) const {
        const int64_t T = static_cast<int64_t>(tokens.size());
        int32_t host[3 * kWindow] = {};
        for (int64_t t = 0; t < T; ++t) {
            host[t] = tokens[static_cast<size_t>(t)];
            host[kWindow + t] = static_cast<int32_t>(s.n_past_ + t);
            host[2 * kWindow + t] = static_cast<int32_t>(s.n_past_ + t + 1);
        }
        ctx_->copy_to_device(w_.tokens, host, sizeof(host));
        if (graphs_) {
            const void* scratch = ctx_->scratch(0);
            if (s.graphs_scratch != scratch) {
                for (cuda::Graph& g : s.graphs) g.clear();
                s.graphs_scratch = scratch;
            }
            cuda::Graph& graph = s.graphs[static_cast<size_t>(T)];
            if (!graph.ready()) graph.capture(*ctx_, [&] { enqueue_window(s, T); });
            graph.replay(*ctx_);
        } else {
            enqueue_window(s, T);
            if (profiler_) {
                profiler_->finish(*ctx_);
                profiled_tokens_ += T;
            }
        }
        s.n_past_ += T;
    }

    void mark(OpKind kind) const {
        if (profiler_) profiler_->mark(*ctx_, kind);
    }

    void mm(const Tensor* w, const float* x, float* y, int64_t T) const {
        cuda::matmul(*ctx_, {.w = *w, .x = x, .y = y, .n_tokens = T});
    }

    void enqueue_window(CudaSequence& s, int64_t T) const {
        cuda::Context& ctx = *ctx_;
        const int64_t hc = h_.hc.n_streams;
        const cuda::HyperConnectionDims dims = hc_dims();
        mark(kEmbed);
        cuda::embed_rows(ctx, {.table = token_embd_,
                               .tokens = w_.tokens,
                               .n_tokens = T,
                               .copies = hc,
                               .out = w_.residual,
                               .staging = w_.embed_staging});
        for (size_t il = 0; il < blocks_.size(); ++il) {
            const BlockDevice& b = blocks_[il];
            LayerDeviceState& l = s.layers[il];
            if (b.has_ple) ple_window(b.ple, l, T);
            mark(kHyperConnection);
            cuda::hyper_connection_read(ctx, {.shape = dims,
                                              .weights = b.hc_attn,
                                              .residual = w_.residual,
                                              .mixed = w_.mixed,
                                              .inject = w_.inject,
                                              .n_tokens = T,
                                              .workspace = w_.hc_work});
            if (b.recurrent)
                gdn_window(b.gdn, l, T);
            else
                attention_window(b.attention, s, l, T);
            mark(kHyperConnection);
            cuda::hyper_connection_write(ctx, dims, w_.residual, w_.out, w_.inject, T);
            cuda::hyper_connection_read(ctx, {.shape = dims,
                                              .weights = b.hc_ffn,
                                              .residual = w_.residual,
                                              .mixed = w_.mixed,
                                              .inject = w_.inject,
                                              .n_tokens = T,
                                              .workspace = w_.hc_work});
            mark(kMoe);
            cuda::moe_layer(ctx, {.shape = moe_shape(),
                                  .weights = b.moe,
                                  .x = w_.mixed,
                                  .out = w_.out,
                                  .n_tokens = T,
                                  .workspace = *b.moe_workspace});
            mark(kHyperConnection);
            cuda::hyper_connection_write(ctx, dims, w_.residual, w_.out, w_.inject, T);
        }
        cuda::hyper_connection_read(ctx, {.shape = dims,
                                          .weights = output_hc_,
                                          .residual = w_.residual,
                                          .mixed = w_.hidden,
                                          .inject = nullptr,
                                          .n_tokens = T,
                                          .workspace = w_.hc_work});
        mark(kHead);
        mm(output_, w_.hidden, w_.logits, T);
    }

    void gdn_window(const GdnDevice& w, LayerDeviceState& l, int64_t T) const {
        cuda::Context& ctx = *ctx_;
        const GdnShape& g = h_.gdn;
        const int64_t CD = g.conv_dim(), VD = g.value_dim(), KD = g.key_dim();
        mark(kGdnProjections);
        cuda::matmul_shared_input(ctx, w_.mixed, T,
                                  {{w.qkv, w_.qkv}, {w.gate, w_.z}, {w.beta, w_.beta}, {w.alpha, w_.alpha}});
        mark(kGdnRecurrence);
        cuda::causal_conv(ctx, {.x = w_.qkv,
                                .x_stride = CD,
                                .w = w.conv,
                                .history = l.conv_history.as<float>(),
                                .out = w_.conv,
                                .out_stride = CD,
                                .n_tokens = T,
                                .channels = CD,
                                .kernel = g.conv_kernel,
                                .dilation = 1});
        cuda::gdn_activate(ctx, {.conv = w_.conv,
                                 .n_tokens = T,
                                 .conv_dim = CD,
                                 .key_dim = KD,
                                 .head_dim = g.k_head_dim,
                                 .q_scale = 1.0f / std::sqrt(static_cast<float>(g.k_head_dim))});
        cuda::gdn_gates(ctx, {.beta = w_.beta,
                              .alpha = w_.alpha,
                              .a = w.a,
                              .dt_bias = w.dt_bias,
                              .n_tokens = T,
                              .n_heads = g.n_v_heads});
        cuda::gated_delta(ctx, {.state = l.recurrent.as<float>(),
                                .q = w_.conv,
                                .k = w_.conv + KD,
                                .v = w_.conv + 2 * KD,
                                .q_stride = CD,
                                .k_stride = CD,
                                .v_stride = CD,
                                .g = w_.alpha,
                                .beta = w_.beta,
                                .out = w_.core,
                                .out_stride = VD,
                                .n_tokens = T,
                                .heads = g.n_v_heads,
                                .key_heads = g.n_k_heads,
                                .tiled_value_heads = g.tiled_value_heads,
                                .dk = g.k_head_dim,
                                .dv = g.v_head_dim});
        cuda::gated_norm(ctx, {.x = w_.core,
                               .z = w_.z,
                               .gamma = w.norm,
                               .n_tokens = T,
                               .n_heads = g.n_v_heads,
                               .head_dim = g.v_head_dim,
                               .sigmoid_gate = g.output_gate == GateActivation::Sigmoid,
                               .eps = g.eps});
        mark(kGdnProjections);
        mm(w.out, w_.core, w_.out, T);
    }

    void attention_window(const AttentionDevice& w, CudaSequence& s, LayerDeviceState& l, int64_t T) const {
        cuda::Context& ctx = *ctx_;
        const AttentionShape& a = h_.attention;
        const int64_t hd = a.head_dim, nh = a.n_head, nkv = a.n_head_kv, kvw = nkv * hd;
        mark(kAttentionProjections);
        if (w.sparse())
            cuda::matmul_shared_input(ctx, w_.mixed, T,
                                      {{w.q, w_.qg}, {w.k, w_.k_new}, {w.v, w_.v_new}, {w.index_k, w_.index_raw},
                                       {w.index_q, w_.index_q}});
        else
            cuda::matmul_shared_input(ctx, w_.mixed, T, {{w.q, w_.qg}, {w.k, w_.k_new}, {w.v, w_.v_new}});
        mark(kAttention);
        cuda::rms_norm_grouped(ctx, {.x = w_.qg,
                                     .out = w_.qg,
                                     .n_tokens = T * nh,
                                     .row_stride = 2 * hd,
                                     .n_groups = 1,
                                     .group = hd,
                                     .gamma = w.q_norm,
                                     .gamma_shared = true,
                                     .eps = a.eps});
        cuda::rope_neox(ctx, {.x = w_.qg,
                              .n_tokens = T,
                              .n_heads = nh,
                              .token_stride = 2 * hd * nh,
                              .head_stride = 2 * hd,
                              .n_rot = a.n_rot,
                              .positions = w_.positions,
                              .freq_base = a.freq_base});
        cuda::rms_norm_grouped(ctx, {.x = w_.k_new,
                                     .out = w_.k_new,
                                     .n_tokens = T,
                                     .row_stride = kvw,
                                     .n_groups = nkv,
                                     .group = hd,
                                     .gamma = w.k_norm,
                                     .gamma_shared = true,
                                     .eps = a.eps});
        cuda::rope_neox(ctx, {.x = w_.k_new,
                              .n_tokens = T,
                              .n_heads = nkv,
                              .token_stride = kvw,
                              .head_stride = hd,
                              .n_rot = a.n_rot,
                              .positions = w_.positions,
                              .freq_base = a.freq_base});
        const cuda::PageTable table{.pages = l.page_table.as<int32_t>(), .n_logical_pages = l.kv->shape().n_pages};
        cuda::kv_append(ctx, {.cache = l.kv->view(),
                              .table = table,
                              .k = w_.k_new,
                              .v = w_.v_new,
                              .positions = w_.positions,
                              .n_cells = l.kv_length.as<int32_t>(),
                              .n_tokens = T});
        const int64_t max_cells = w.sparse() ? qsa_max_cells(w.indexer) : 0;
        if (w.sparse()) {
            const IndexerShape& ix = w.indexer;
            const int64_t di = ix.head_dim;
            cuda::store_rows(ctx, {.dst = l.index_raw.as<float>(),
                                   .dst_rows = s.capacity_,
                                   .src = w_.index_raw,
                                   .width = di,
                                   .positions = w_.positions,
                                   .n_tokens = T});
            const int64_t max_blocks = std::max<int64_t>(s.capacity_ / ix.ratio, 1);
            cuda::indexer_pool(ctx, {.raw = l.index_raw.as<float>(),
                                     .pooled = l.index_pooled.as<float>(),
                                     .max_blocks = max_blocks,
                                     .head_dim = di,
                                     .ratio = ix.ratio,
                                     .k_norm = w.index_k_norm,
                                     .eps = a.eps,
                                     .n_rot = a.n_rot,
                                     .freq_base = a.freq_base,
                                     .positions = w_.positions,
                                     .n_tokens = T});
            cuda::rms_norm_grouped(ctx, {.x = w_.index_q,
                                         .out = w_.index_q,
                                         .n_tokens = T * ix.n_head,
                                         .row_stride = di,
                                         .n_groups = 1,
                                         .group = di,
                                         .gamma = w.index_q_norm,
                                         .gamma_shared = true,
                                         .eps = a.eps});
            cuda::rope_neox(ctx, {.x = w_.index_q,
                                  .n_tokens = T,
                                  .n_heads = ix.n_head,
                                  .token_stride = ix.n_head * di,
                                  .head_stride = di,
                                  .n_rot = a.n_rot,
                                  .positions = w_.positions,
                                  .freq_base = a.freq_base});
            for (int64_t t = 0; t < T; ++t)
                cuda::qsa_select(ctx, {.n_head = ix.n_head,
                                       .head_dim = di,
                                       .budget = ix.budget,
                                       .ratio = ix.ratio,
                                       .q = w_.index_q + t * ix.n_head * di,
                                       .pooled = l.index_pooled.as<float>(),
                                       .max_blocks = max_blocks,
                                       .n_cells = w_.lengths + t,
                                       .scores = s.qsa_scores.as<float>(),
                                       .keys = s.qsa_keys.as<uint32_t>(),
                                       .cells = w_.cells + t * w_.max_cells,
                                       .n_selected = w_.n_selected + t});
        }
        const int64_t splits = w.sparse() ? s.sparse_splits : s.dense_splits;
        for (int64_t t = 0; t < T; ++t) {
            float* qg = w_.qg + t * 2 * hd * nh;
            cuda::decode_attention(ctx, {.cache = l.kv->view(),
                                         .table = table,
                                         .n_cells = w_.lengths + t,
                                         .cells = w.sparse() ? w_.cells + t * w_.max_cells : nullptr,
                                         .n_selected = w.sparse() ? w_.n_selected + t : nullptr,
                                         .max_cells = max_cells,
                                         .q = qg,
                                         .n_head = nh,
                                         .q_head_stride = 2 * hd,
                                         .gate = qg + hd,
                                         .gate_head_stride = 2 * hd,
                                         .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
                                         .out = w_.heads + t * nh * hd,
                                         .n_splits = splits,
                                         .workspace = s.attention_workspace.data(),
                                         .workspace_bytes = s.attention_workspace.size()});
        }
        mark(kAttentionProjections);
        mm(w.o, w_.heads, w_.out, T);
    }

    void ple_window(const PleDevice& w, LayerDeviceState& l, int64_t T) const {
        cuda::Context& ctx = *ctx_;
        const PleShape& p = h_.ple;
        const int64_t H = p.n_embd, hc = p.n_streams, HC = hc * H;
        mark(kPle);
        cuda::ple_gather(ctx, {.ngram = p.ngram,
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
                               .out = w_.ple_emb});
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
        norm(w_.ple_gated, w_.ple_normed, w.norm_conv);
        cuda::causal_conv(ctx, {.x = w_.ple_normed,
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

    std::unique_ptr<gguf::File> file_;
    bool graphs_ = true;
    ModelInfo info_;
    Qwen4ExpHparams h_;
    std::unique_ptr<cuda::Context> ctx_;
    std::unique_ptr<DeviceWeights> weights_;
    const Tensor* token_embd_ = nullptr;
    const Tensor* output_ = nullptr;
    cuda::HyperConnectionDeviceWeights output_hc_;
    std::vector<BlockDevice> blocks_;
    size_t ple_row_bytes_ = 0;
    WindowBuffers w_{};
    std::unique_ptr<cuda::StreamProfiler> profiler_;
    mutable int64_t profiled_tokens_ = 0;
    mutable std::mutex mutex_;
};

}  // namespace

std::unique_ptr<Model> load_qwen4exp_cuda(std::unique_ptr<gguf::File> file, const LoadOptions& options) {
    return std::make_unique<Qwen4ExpCudaModel>(std::move(file), options);
}

}  // namespace strata
