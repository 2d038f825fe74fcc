#include "model/cuda/hybrid_cuda.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/block_ops.h"
#include "backend/cuda/model_ops.h"
#include "core/error.h"
#include "format/gguf_names.h"
#include "model/hybrid.h"

namespace strata::cuda_model {

namespace {

const std::vector<std::string> kOpKindNames = {"embedding",          "PLE",
                                               "residual (hc, norms)", "GDN projections",
                                               "GDN recurrence",     "attention projections",
                                               "attention (KV, QSA)", "MoE",
                                               "head"};

cuda::GdnRecurrence gdn_recurrence_kernel(GdnRecurrenceKernel choice) {
    switch (choice) {
        case GdnRecurrenceKernel::Column: return cuda::GdnRecurrence::Column;
        case GdnRecurrenceKernel::Shuffle: return cuda::GdnRecurrence::Shuffle;
        case GdnRecurrenceKernel::Auto: break;
    }
    return cuda::GdnRecurrence::Auto;
}

}  // namespace

CudaHybridModel::CudaHybridModel(std::unique_ptr<gguf::File> file, const LoadOptions& options)
    : file_(std::move(file)),
      graphs_(options.cuda_graphs && !options.cuda_profile),
      grouped_moe_(options.cuda_grouped_moe),
      gdn_recurrence_(gdn_recurrence_kernel(options.gdn_recurrence)),
      kv_storage_(options.kv_cache == KvCacheType::Int8 ? cuda::KvStorage::Int8 : cuda::KvStorage::F16),
      qsa_union_(options.qsa_union),
      ncu_replay_(options.cuda_ncu_replay) {
    if (options.prompt_chunk != 0 &&
        (options.prompt_chunk < kMinPromptChunk || options.prompt_chunk > kMaxPromptChunk))
        throw Error("--prompt-chunk " + std::to_string(options.prompt_chunk) + " is outside " +
                    std::to_string(kMinPromptChunk) + ".." + std::to_string(kMaxPromptChunk));
    // A prompt window is at least a decode window and a head block (the window logits buffer holds kHeadRows rows).
    prompt_window_ = options.prompt_chunk ? std::max(options.prompt_chunk, kWindow + 1) : kDefaultPromptChunk;
    window_host_.assign(static_cast<size_t>(3 * prompt_window_), 0);
    info_ = read_hybrid_info(*file_, &n_block_all_);
    first_block_ = options.first_block;
    end_block_ = options.end_block ? options.end_block : info_.n_layer;
    if (first_block_ < 0 || end_block_ > info_.n_layer || first_block_ >= end_block_)
        throw Error(file_->path() + ": blocks " + std::to_string(first_block_) + ".." + std::to_string(end_block_ - 1) +
                    " are not a stage of this " + std::to_string(info_.n_layer) + "-block model");
    ctx_ = std::make_unique<cuda::Context>(cuda::ContextOptions{
        .device = options.cuda_device, .vram_budget = options.vram_budget, .blas_products = options.cuda_blas});
    experts_in_host_ = options.experts.in_host;
    ple_from_file_ = options.ple_from_file;
    check_weights_fit();
    weights_ = std::make_unique<DeviceWeights>(*ctx_, *file_);
    if (experts_in_host_)
        experts_ = std::make_unique<ExpertCache>(*ctx_, *file_, end_block_, prompt_window_, options.experts,
                                                 first_block_);
    routing_ids_.assign(static_cast<size_t>(end_block_), nullptr);
    if (options.cuda_profile) profiler_ = std::make_unique<cuda::StreamProfiler>(kOpKindNames);
}

CudaHybridModel::~CudaHybridModel() {
    if (profiler_)
        std::fprintf(stderr, "strata: CUDA time by op kind over %lld tokens (kernels launched one by one):\n%s",
                     static_cast<long long>(profiled_tokens_), profiler_->report(profiled_tokens_).c_str());
}

void CudaHybridModel::set_shapes(const GdnShape& gdn, const AttentionShape& attention, std::vector<BlockLayout> layout,
                                 const PleShape* ple) {
    gdn_ = gdn;
    attention_ = attention;
    layout_ = std::move(layout);
    has_ple_ = ple != nullptr;
    if (ple) ple_ = *ple;
}

GdnDevice CudaHybridModel::upload_gdn(const GdnWeights& w) {
    DeviceWeights& dw = *weights_;
    if (w.projection == GdnProjection::LegacyFused)
        throw Error(file_->path() + ": the CUDA backend does not run the old fused ssm_in GDN layout yet; reconvert "
                    "the model or use --backend cpu");
    return {.qkv = dw.tensor(w.qkv),
            .gate = dw.tensor(w.gate),
            .out = dw.tensor(w.out),
            .beta = dw.tensor(w.beta),
            .alpha = dw.tensor(w.alpha),
            .ba = dw.tensor(w.ba),
            .conv = dw.floats(w.conv),
            .dt_bias = dw.floats(w.dt_bias),
            .a = dw.floats(w.a),
            .norm = dw.floats(w.norm)};
}

AttentionDevice CudaHybridModel::upload_attention(const AttentionWeights& w, const IndexerShape& indexer) {
    DeviceWeights& dw = *weights_;
    return {.q = dw.tensor(w.q),
            .k = dw.tensor(w.k),
            .v = dw.tensor(w.v),
            .o = dw.tensor(w.o),
            .q_norm = dw.floats(w.q_norm),
            .k_norm = dw.floats(w.k_norm),
            .indexer = indexer,
            .index_q = dw.tensor(w.index_q),
            .index_k = dw.tensor(w.index_k),
            .index_q_norm = dw.floats(w.index_q_norm),
            .index_k_norm = dw.floats(w.index_k_norm)};
}

MoeDevice CudaHybridModel::upload_moe(const MoeWeights& m, const MoeShape& s, int64_t block) {
    DeviceWeights& dw = *weights_;
    MoeDevice d;
    d.block = block;
    d.shape = {.n_embd = s.n_embd,
               .n_expert = s.n_expert,
               .n_expert_used = s.n_expert_used,
               .n_ff = s.n_ff,
               .n_ff_shared = s.n_ff_shared,
               .normalize_weights = s.normalize_weights};
    d.weights = {.router = dw.tensor(m.router),
                 .shared_gate = dw.floats(m.shared_gate),
                 .shared_gate_proj = dw.tensor(m.shared_gate_proj),
                 .shared_up = dw.tensor(m.shared_up),
                 .shared_down = dw.tensor(m.shared_down)};
    if (experts_) {
        experts_->add_layer(block, m, s, d.weights);
    } else {
        d.weights.gate_up = dw.tensor(m.gate_up);
        d.weights.gate = dw.tensor(m.gate);
        d.weights.up = dw.tensor(m.up);
        d.weights.down = dw.tensor(m.down);
    }
    d.workspace = std::make_unique<cuda::MoeWorkspace>(*ctx_, d.shape, d.weights);
    const bool grouped = grouped_moe_ && cuda::moe_prompt_supported(d.shape, d.weights);
    if (grouped && !moe_prompt_shape_) moe_prompt_shape_ = d.shape;  // its workspace goes into the window buffers
    // Only a layer whose prompt windows take the grouped path (the workspace's shape) streams its misses.
    if (experts_) experts_->set_streams(block, grouped && cuda::same_shape(d.shape, *moe_prompt_shape_));
    STRATA_ASSERT(block >= 0 && block < static_cast<int64_t>(routing_ids_.size()));
    routing_ids_[static_cast<size_t>(block)] = d.workspace->expert_ids();
    return d;
}

bool CudaHybridModel::grouped_window(int64_t T) const {
    if (T <= kWindow || !moe_prompt_) return false;
    const cuda::MoeLayerShape& s = moe_prompt_->shape();
    return T * s.n_expert_used >= kGroupedMinPairs * s.n_expert;
}

void CudaHybridModel::moe_window(const MoeDevice& m, const float* x, float* out, int64_t T,
                                 cuda::MoeCombine* deferred) const {
    mark(kMoe);
    const int64_t H = m.shape.n_embd;
    STRATA_ASSERT(!deferred || T <= kWindow);
    // Experts in host RAM: a prompt window streams its misses into VRAM or reads them over PCIe; a decode window
    // hands the CPU workers theirs.
    cuda::MoeExpertStream* streamed = experts_ ? experts_->expert_stream(m.block) : nullptr;
    const cuda::MoeLayerWeights prompt =
        experts_ && T > kWindow ? experts_->prompt_weights(m.weights, streamed != nullptr) : m.weights;
    const cuda::MoeHostShare* share = experts_ && T <= kWindow ? experts_->host_share(m.block) : nullptr;
    if (grouped_window(T) && same_shape(m.shape, moe_prompt_->shape()) && cuda::moe_prompt_supported(m.shape, prompt)) {
        cuda::moe_layer_prompt(*ctx_, {.shape = m.shape,
                                       .weights = prompt,
                                       .x = x,
                                       .out = out,
                                       .n_tokens = T,
                                       .workspace = *moe_prompt_,
                                       .stream = streamed});
        if (experts_) experts_->copy_routing(m.block, 0, T, moe_prompt_->expert_ids());
        return;
    }
    if (streamed)
        throw Error("CUDA MoE: block " + std::to_string(m.block) +
                    " cannot take the grouped path in a window whose experts are streamed");
    for (int64_t start = 0, n = 0; start < T; start += n) {
        n = std::min(kWindow, T - start);
        cuda::moe_layer(*ctx_, {.shape = m.shape,
                                .weights = prompt,
                                .x = x + start * H,
                                .out = out + start * H,
                                .n_tokens = n,
                                .workspace = *m.workspace,
                                .deferred_combine = deferred,
                                .host_share = share});
        // A prompt window's routing goes to the host slice by slice (a decode window's, all layers at once at its end).
        if (experts_ && T > kWindow) experts_->copy_routing(m.block, start, n);
    }
}

// The window buffers, carved from one allocation, and the context scratch every product of a window needs
// (reserved now: a captured graph keeps its address).
void CudaHybridModel::finish_loading(const WindowShape& shape, const Tensor* token_embd, const Tensor* output) {
    token_embd_ = token_embd;
    output_ = output;
    STRATA_ASSERT((token_embd_ != nullptr) == first_stage() && (output_ != nullptr) == last_stage());
    n_streams_ = shape.n_streams;
    pending_write_ = shape.pending_write;
    const int64_t T = prompt_window_, H = info_.n_embd, hc = shape.n_streams, HC = hc * H, V = info_.n_vocab;
    const GdnShape& g = gdn_;
    const AttentionShape& a = attention_;
    int64_t max_cells = 1, index_heads = 0, index_dim = 0;
    for (const BlockLayout& b : layout_)
        if (!b.recurrent && b.indexer.ratio > 0) {
            max_cells = std::max(max_cells, qsa_max_cells(b.indexer));
            index_heads = std::max(index_heads, b.indexer.n_head);
            index_dim = std::max(index_dim, b.indexer.head_dim);
        }
    if (kv_storage_ == cuda::KvStorage::Int8 && !(a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256))
        throw Error(file_->path() + ": --kv-cache int8 needs an attention head_dim of 64, 128 or 256, this model's " +
                    "is " + std::to_string(a.head_dim) + "; use --kv-cache f16");
    if (qsa_union_) {
        const bool any_sparse = std::any_of(layout_.begin(), layout_.end(),
                                            [](const BlockLayout& b) { return !b.recurrent && b.indexer.ratio > 0; });
        const cuda::KvCacheShape kv{.n_head_kv = a.n_head_kv, .head_dim = a.head_dim, .n_pages = 1,
                                    .storage = kv_storage_};
        qsa_union_off_ = !any_sparse ? "the model has no QSA layers" : cuda::qsa_union_unsupported(*ctx_, kv, a.n_head);
        if (!qsa_union_off_.empty())
            std::fprintf(stderr, "strata: --qsa-union does not apply (%s): QSA layers attend once per position\n",
                         qsa_union_off_.c_str());
    }
    const int64_t ple_heads = shape.ple ? shape.ple->n_heads() : 0;
    const int64_t ple_width = shape.ple ? ple_heads * shape.ple->row_width : 0;
    const int64_t ple_rows = shape.ple ? HC : 0;
    // The parts every stage of a block uses, then stages that are never live at once (the embedding's staging, the
    // GDN, attention and PLE buffers, and the grouped MoE's prompt workspace), each carved from the start of one
    // shared region (runtime/memory_plan.cpp window_bytes counts the same).
    struct Part {
        void** ptr;
        size_t bytes;
        int stage;  // 0: always
    };
    std::vector<Part> parts;
    int stage = 0;
    auto f32 = [&](float** ptr, int64_t n) { parts.push_back({reinterpret_cast<void**>(ptr), size_t(n) * 4, stage}); };
    auto i32 = [&](int32_t** ptr, int64_t n) {
        parts.push_back({reinterpret_cast<void**>(ptr), size_t(n) * 4, stage});
    };
    i32(&w_.tokens, 3 * T);  // tokens, positions, lengths: one block, written by one copy per window
    f32(&w_.residual, T * HC);
    f32(&w_.mixed, T * H);
    f32(&w_.out, T * H);
    f32(&w_.inject, T * hc);
    parts.push_back({&w_.mixed_q8_0, cuda::q8_0_activation_bytes(H), stage});
    f32(&w_.hc_work, shape.hc_work_floats);
    f32(&w_.hidden, T * H);
    f32(&w_.logits, output_ ? std::min(T, kHeadRows) * V : 0);  // the stage with the head
    stage = 1;
    parts.push_back({&w_.embed_staging, token_embd_ ? cuda::embed_staging_bytes(*token_embd_, T) : 0, stage});
    stage = 2;
    f32(&w_.qkv, T * g.conv_dim());
    f32(&w_.z, T * g.value_dim());
    f32(&w_.beta, T * g.n_v_heads);
    f32(&w_.alpha, T * g.n_v_heads);
    f32(&w_.ba, T * 2 * g.n_v_heads);
    f32(&w_.conv, T * g.conv_dim());
    f32(&w_.core, T * g.value_dim());
    stage = 3;
    f32(&w_.qg, T * 2 * a.head_dim * a.n_head);
    f32(&w_.k_new, T * a.n_head_kv * a.head_dim);
    f32(&w_.v_new, T * a.n_head_kv * a.head_dim);
    f32(&w_.heads, T * a.n_head * a.head_dim);
    f32(&w_.index_raw, T * index_dim);
    f32(&w_.index_q, T * index_heads * index_dim);
    i32(&w_.cells, T * max_cells);
    i32(&w_.n_selected, T);
    w_.max_cells = max_cells;
    stage = 4;
    parts.push_back({reinterpret_cast<void**>(&w_.ple_rows), size_t(T * ple_heads) * 8, stage});
    parts.push_back({&w_.ple_staging, size_t(T * ple_heads) * shape.ple_row_bytes, stage});
    f32(&w_.ple_emb, T * ple_width);
    for (float** p : {&w_.ple_key, &w_.ple_query, &w_.ple_gated}) f32(p, T * ple_rows);
    f32(&w_.ple_value, shape.ple ? T * H : 0);
    constexpr int kStages = 5;
    auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    size_t sizes[kStages] = {};
    for (const Part& p : parts) sizes[p.stage] += rounded(p.bytes);
    const size_t moe_prompt = moe_prompt_shape_ ? cuda::MoePromptWorkspace::bytes(*moe_prompt_shape_, T) : 0;
    const size_t region = std::max(*std::max_element(sizes + 1, sizes + kStages), rounded(moe_prompt));
    w_.buffer = ctx_->allocate(sizes[0] + region, "window");
    uint8_t* const region_start = static_cast<uint8_t*>(w_.buffer.data()) + sizes[0];
    uint8_t* at[kStages] = {static_cast<uint8_t*>(w_.buffer.data())};
    for (int k = 1; k < kStages; ++k) at[k] = region_start;
    for (const Part& p : parts) {
        *p.ptr = p.bytes ? at[p.stage] : nullptr;
        at[p.stage] += rounded(p.bytes);
    }
    // Once the gate has read the key and the query, the conv's input and output take their bytes.
    w_.ple_normed = w_.ple_key;
    w_.ple_conv = w_.ple_query;
    if (moe_prompt_shape_) moe_prompt_ = std::make_unique<cuda::MoePromptWorkspace>(*moe_prompt_shape_, T, region_start);
    w_.positions = w_.tokens + T;
    w_.lengths = w_.tokens + 2 * T;
    // Every matrix a window multiplies by was uploaded through weights_: the largest scratch any of them takes, for
    // a decode window (the graphs keep its address) and a prompt window (its GEMM path takes more), the head at
    // kHeadRows tokens at most (the embedding table is read by rows, unless it is the head).
    ctx_->scratch(std::max({weights_->max_matmul_scratch(kWindow), weights_->max_matmul_scratch(T, {output_, token_embd_}),
                            output_ ? cuda::matmul_scratch_bytes(*output_, std::min(T, kHeadRows)) : size_t{0}}));
    if (ctx_->blas_products() && T >= cuda::kBlasMinTokens) ctx_->blas();  // its workspace in the plan below
    if (experts_) experts_->set_routing_sources(routing_ids_);
    std::fprintf(stderr, "strata: CUDA %s, VRAM plan after loading:\n%s", ctx_->info().name.c_str(),
                 ctx_->memory().plan().c_str());
}

std::unique_ptr<SequenceState> CudaHybridModel::new_sequence(int64_t max_tokens) const {
    if (max_tokens <= 0)
        throw Error("a sequence needs room for at least one token, asked for " + std::to_string(max_tokens));
    if (max_tokens > (int64_t{1} << 31) - prompt_window_)
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

std::optional<ExpertOffloadStats> CudaHybridModel::expert_offload_stats() const {
    if (!experts_) return std::nullopt;
    return experts_->snapshot();
}

HostFloats CudaHybridModel::host_floats(size_t n) const {
    if (float* pinned = cuda::allocate_pinned_floats(n)) return HostFloats(pinned, n, cuda::free_pinned_floats);
    return HostFloats(n);
}

CudaSequence& CudaHybridModel::own(const SequenceState& state, const char* call) const {
    auto* seq = dynamic_cast<const CudaSequence*>(&state);
    if (seq == nullptr || seq->owner_ != this)
        throw Error(std::string(call) + ": the sequence belongs to another model");
    return const_cast<CudaSequence&>(*seq);
}

void CudaHybridModel::forward(SequenceState& state, std::span<const int32_t> tokens, std::span<float> logits,
                              bool last_only) const {
    forward_rows(own(state, "forward"), tokens, logits, last_only, {});
}

void CudaHybridModel::forward_with_residual(SequenceState& state, std::span<const int32_t> tokens,
                                            std::span<float> logits, std::span<float> residual, bool last_only) const {
    const int64_t width = draft_residual_width();
    if (width == 0) throw Error("forward_with_residual: this model has no MTP draft layer");
    STRATA_ASSERT(width == n_streams_ * info_.n_embd);
    if (std::ssize(residual) < std::ssize(tokens) * width)
        throw Error("forward_with_residual: the residual buffer holds " + std::to_string(residual.size()) +
                    " floats, needs " + std::to_string(std::ssize(tokens) * width));
    forward_rows(own(state, "forward_with_residual"), tokens, logits, last_only, residual);
}

void CudaHybridModel::forward_windows(SequenceState& seq, std::span<const int32_t> tokens, std::span<float> logits,
                                      std::span<float> residual, bool last_only, const WindowRun& run) const {
    STRATA_ASSERT(last_stage() && run);
    if (!residual.empty() && std::ssize(residual) < std::ssize(tokens) * n_streams_ * info_.n_embd)
        throw Error("forward_with_residual: the residual buffer holds " + std::to_string(residual.size()) +
                    " floats, needs " + std::to_string(std::ssize(tokens) * n_streams_ * info_.n_embd));
    forward_rows(own(seq, "forward"), tokens, logits, last_only, residual, run);
}

void CudaHybridModel::stage_window(SequenceState& seq, std::span<const int32_t> tokens,
                                   const std::function<void()>& head) const {
    run_window(own(seq, "forward"), tokens, head);
}

std::vector<std::pair<void*, size_t>> CudaHybridModel::handoff_rows(int64_t T) const {
    STRATA_ASSERT(T >= 1 && T <= prompt_window_);
    const auto floats = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
    std::vector<std::pair<void*, size_t>> rows = {{w_.residual, floats(T * n_streams_ * info_.n_embd)}};
    if (pending_write_) {
        rows.push_back({w_.out, floats(T * info_.n_embd)});
        rows.push_back({w_.inject, floats(T * n_streams_)});
    }
    return rows;
}

void CudaHybridModel::forward_rows(CudaSequence& s, std::span<const int32_t> tokens, std::span<float> logits,
                                   bool last_only, std::span<float> residual, const WindowRun& run) const {
    CudaSequence* seq = &s;
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
    // Prompt windows while more than a decode window is left, then one decode window for the rest. A decode window's
    // graph holds the head of all its rows; a prompt window runs the head only for the rows wanted, kHeadRows at a
    // time, each block downloaded before the next overwrites it.
    for (int64_t start = 0, n = 0; start < T; start += n) {
        n = T - start > kWindow ? std::min(prompt_window_, T - start) : T - start;
        // Experts read from the mapped file: the GPU cannot read a miss in place, so a window that does not stream
        // its misses runs as decode windows (the CPU workers compute those).
        if (n > kWindow && experts_ && !experts_->reads_in_place() &&
            !(experts_->streams_every_layer() && grouped_window(n)))
            n = kWindow;
        const bool last = start + n == T;
        auto head = [&] {
            if (n <= kWindow) return enqueue_head(0, n);
            if (logits.empty()) return;
            if (last_only) {
                if (!last) return;
                enqueue_head(n - 1, 1);
                return ctx_->download(w_.logits, logits.data(), static_cast<size_t>(V) * sizeof(float));
            }
            for (int64_t row = 0; row < n; row += kHeadRows) {
                const int64_t rows = std::min(kHeadRows, n - row);
                enqueue_head(row, rows);
                ctx_->download(w_.logits, logits.data() + (start + row) * V,
                               static_cast<size_t>(rows * V) * sizeof(float));
            }
        };
        const std::span<const int32_t> window = tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(n));
        if (run)
            run(window, head);
        else
            run_window(*seq, window, head);
        // The window's final residual rows stay in w_.residual after it (the head reads w_.hidden).
        if (!residual.empty()) {
            const int64_t width = n_streams_ * info_.n_embd;
            ctx_->download(w_.residual, residual.data() + start * width,
                           static_cast<size_t>(n * width) * sizeof(float));
        }
        if (logits.empty() || n > kWindow) continue;
        if (!last_only)
            ctx_->download(w_.logits, logits.data() + start * V, static_cast<size_t>(n * V) * sizeof(float));
        else if (last)
            ctx_->download(w_.logits + (n - 1) * V, logits.data(), static_cast<size_t>(V) * sizeof(float));
    }
    ctx_->synchronize();
}

// The memory plan before anything is taken: the weights the model binds (every file tensor but the PLE table, which
// stays in host memory, and the MTP blocks) must fit in the budget.
void CudaHybridModel::check_weights_fit() const {
    uint64_t weights = 0, ple = 0, host_experts = 0;
    for (const gguf::TensorInfo& t : file_->tensors()) {
        if (is_ple_table(t.name)) {
            ple += t.n_bytes;
            continue;
        }
        if (is_mtp_block_tensor(t.name, info_.n_layer)) continue;
        // A stage of a split: its own blocks; the token table on the first, output* (or a tied table) on the last,
        // anything else outside the blocks on the first (runtime/memory_plan.cpp counts the same).
        const int64_t block = block_of(t.name);
        if (block >= 0 && (block < first_block_ || block >= end_block_)) continue;
        const bool tied_head = t.name == "token_embd.weight" && !file_->find_tensor("output.weight");
        if (block < 0 && !((first_stage() && !t.name.starts_with("output")) ||
                           (last_stage() && (t.name.starts_with("output") || tied_head))))
            continue;
        if (experts_in_host_ && t.name.find("_exps.") != std::string::npos && t.name.find("shexp") == std::string::npos)
            host_experts += t.n_bytes;
        else
            weights += t.n_bytes;
    }
    const size_t budget = ctx_->memory().budget();
    std::fprintf(stderr,
                 "strata: CUDA memory plan: weights %.2f GiB in VRAM, routed experts %.2f GiB in host RAM, PLE "
                 "tables %.2f GiB %s, budget %.2f GiB (--vram-budget; %.2f GiB free on %s)\n",
                 static_cast<double>(weights) / (1 << 30), static_cast<double>(host_experts) / (1 << 30),
                 static_cast<double>(ple) / (1 << 30),
                 ple_from_file_ ? "read from the file by rows" : "in pinned host memory",
                 static_cast<double>(budget) / (1 << 30),
                 static_cast<double>(ctx_->info().free_bytes_at_start) / (1 << 30), ctx_->info().name.c_str());
    if (weights > budget)
        throw Error(file_->path() + ": the weights " + (experts_in_host_ ? "kept in VRAM " : "") + "need " +
                    std::to_string(weights >> 20) + " MiB of device memory but the budget is " +
                    std::to_string(budget >> 20) + " MiB; raise --vram-budget" +
                    (experts_in_host_ ? "" : ", or keep the routed experts in host RAM (the memory plan does this "
                                             "when they do not fit)"));
}

// Each block's state for the sequence's capacity (KV pages in order behind an identity page table), plus the QSA and
// attention workspaces its windows share. Every allocation goes through the accountant, which refuses past the budget.
void CudaHybridModel::allocate_sequence(CudaSequence& s) const {
    const int64_t cap = s.capacity_;
    const GdnShape& g = gdn_;
    const AttentionShape& a = attention_;
    s.layers.resize(layout_.size());
    int64_t max_blocks = 1;
    bool any_dense = false, any_sparse = false;
    for (size_t il = 0; il < layout_.size(); ++il) {
        const BlockLayout& b = layout_[il];
        LayerDeviceState& l = s.layers[il];
        if (b.recurrent) {
            l.conv_history = ctx_->allocate(size_t((g.conv_kernel - 1) * g.conv_dim()) * 4, "sequence state");
            l.recurrent = ctx_->allocate(size_t(g.n_v_heads * g.k_head_dim * g.v_head_dim) * 4, "sequence state");
        } else {
            const int64_t pages = (cap + cuda::kKvPageCells - 1) / cuda::kKvPageCells;
            l.kv = std::make_unique<cuda::KvCache>(*ctx_, cuda::KvCacheShape{.n_head_kv = a.n_head_kv,
                                                                             .head_dim = a.head_dim,
                                                                             .n_pages = pages,
                                                                             .storage = kv_storage_});
            std::vector<int32_t> table(static_cast<size_t>(pages));
            for (int64_t j = 0; j < pages; ++j) table[static_cast<size_t>(j)] = static_cast<int32_t>(j);
            l.page_table = ctx_->upload(table.data(), table.size() * 4, "kv cache");
            l.kv_length = ctx_->allocate(4, "kv cache");
            if (b.indexer.ratio > 0) {
                const IndexerShape& ix = b.indexer;
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
            const PleShape& p = ple_;
            l.ple_tokens = ctx_->allocate(size_t(std::max<int64_t>(p.ngram - 1, 1)) * 4, "sequence state");
            l.ple_conv_history =
                ctx_->allocate(size_t(p.history_rows() * p.n_streams * p.n_embd) * 4, "sequence state");
        }
    }
    s.qsa_group = any_sparse ? std::min(kQsaSelectGroup, prompt_window_) : 1;
    s.qsa_scores = ctx_->allocate(size_t(s.qsa_group * max_blocks) * 4, "sequence state");
    // keys, then a tie's block indices
    s.qsa_keys = ctx_->allocate(size_t(s.qsa_group * max_blocks) * 8, "sequence state");
    s.dense_splits = any_dense ? cuda::decode_attention_splits(*ctx_, a.n_head_kv, cap) : 1;
    s.sparse_splits = any_sparse ? cuda::decode_attention_splits(*ctx_, a.n_head_kv, std::min(cap, w_.max_cells)) : 1;
    if (any_dense || any_sparse)
        s.attention_workspace = ctx_->allocate(
            cuda::decode_attention_workspace_bytes(a.n_head, a.head_dim, std::max(s.dense_splits, s.sparse_splits)),
            "sequence state");
    if (qsa_union_ && qsa_union_off_.empty() && any_sparse) {
        // Scratch for one window's unions and split results. Without room for it the sequence keeps the per-query path.
        s.union_splits = cuda::qsa_union_splits(*ctx_, kWindow, a.n_head_kv, w_.max_cells);
        try {
            s.union_workspace = ctx_->allocate(cuda::qsa_union_workspace_bytes(prompt_window_, w_.max_cells, a.n_head,
                                                                                a.head_dim, s.union_splits),
                                               "sequence state");
        } catch (const Error& e) {
            if (!qsa_union_scratch_reported_)
                std::fprintf(stderr, "strata: --qsa-union does not apply (no device memory for its scratch: %s): QSA "
                             "layers attend once per position\n", e.what());
            qsa_union_scratch_reported_ = true;
        }
    }
    size_t bytes = s.qsa_scores.size() + s.qsa_keys.size() + s.attention_workspace.size() + s.union_workspace.size();
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

// Back to empty: zero recurrent state and histories, the PLE history full of EOS, length 0. KV cells need no clearing
// (nothing reads a cell before it is written). The graphs stay valid: the buffers do not move.
void CudaHybridModel::clear_sequence(CudaSequence& s) const {
    for (LayerDeviceState& l : s.layers) {
        for (cuda::DeviceBuffer* b : {&l.conv_history, &l.recurrent, &l.kv_length, &l.index_raw, &l.index_pooled,
                                      &l.ple_conv_history})
            if (b->size()) ctx_->zero(b->data(), b->size());
        if (l.ple_tokens.size()) {
            const std::vector<int32_t> eos(l.ple_tokens.size() / 4, ple_.eos);
            ctx_->copy_to_device(l.ple_tokens.data(), eos.data(), eos.size() * 4);
        }
    }
    if (has_ple_) s.ple_history.assign(static_cast<size_t>(std::max<int64_t>(ple_.ngram - 1, 0)), ple_.eos);
    ctx_->synchronize();
    s.n_past_ = 0;
    s.window_count = 0;
    s.rollback.reset();
}

// One window: its tokens, positions and cache lengths to the device, then the sequence's graph for this window size
// (captured on first use, and again if the context scratch has moved since), or the launches one by one.
void CudaHybridModel::run_window(CudaSequence& s, std::span<const int32_t> tokens,
                                 const std::function<void()>& head) const {
    const int64_t T = static_cast<int64_t>(tokens.size()), P = prompt_window_;
    prepare_window(s, tokens);
    int32_t* host = window_host_.data();
    for (int64_t t = 0; t < T; ++t) {
        host[t] = tokens[static_cast<size_t>(t)];
        host[P + t] = static_cast<int32_t>(s.n_past_ + t);
        host[2 * P + t] = static_cast<int32_t>(s.n_past_ + t + 1);
    }
    // A pageable source: the copy has read it when the call returns, so the next window may rewrite it.
    ctx_->copy_to_device(w_.tokens, host, window_host_.size() * sizeof(int32_t));
    const bool share = experts_ && experts_->cpu_share() && T <= kWindow;
    if (experts_) experts_->begin_window(T <= kWindow, experts_->streams() && grouped_window(T));
    const auto window = [&] {
        if (share) experts_->enqueue_window_start();
        enqueue_window(s, T);
        mark(kHead);
        head();
        if (experts_ && T <= kWindow) experts_->copy_routing(-1, 0, T);
    };
    const auto started = std::chrono::steady_clock::now();
    const uint32_t doorbell_window = share ? experts_->open_window() : 0;
    if (graphs_ && T <= kWindow) {
        const void* scratch = ctx_->scratch(0);
        if (s.graphs_scratch != scratch) {
            for (cuda::Graph& g : s.graphs) g.clear();
            s.graphs_scratch = scratch;
        }
        cuda::Graph& graph = s.graphs[static_cast<size_t>(T)];
        if (!graph.ready()) graph.capture(*ctx_, window);
        const bool profiled = ncu_replay_ > 0 && ++replays_ == ncu_replay_;
        if (profiled) ctx_->profiler_start();
        graph.replay(*ctx_);
        if (profiled) ctx_->profiler_stop();
    } else {
        window();
        if (profiler_) {
            profiler_->finish(*ctx_);
            profiled_tokens_ += T;
        }
    }
    if (share) {
        // The CPU workers answer each layer as the graph publishes it; then the doorbell window is checked (a wait
        // that gave up fails the request: its rows were never combined).
        try {
            experts_->serve(doorbell_window, T);
        } catch (...) {
            try {
                experts_->finish(0, T);
            } catch (...) {
            }
            throw;
        }
        experts_->finish(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), T);
    }
    // What commit() may keep a prefix of: this window, when its kernels wrote their inputs to the records.
    s.window_count = s.records && keeps_window_inputs(T) ? T : 0;
    s.window_pos0 = s.n_past_;
    if (s.window_count) s.window_tokens.assign(tokens.begin(), tokens.end());
    s.n_past_ += T;
    if (experts_) {
        ctx_->synchronize();  // the routing is on the host once the window has run
        experts_->end_window(T);
    }
}

void CudaHybridModel::head_from_host(std::span<const float> hidden, std::span<float> logits) const {
    const int64_t H = info_.n_embd, V = info_.n_vocab;
    STRATA_ASSERT(std::ssize(hidden) >= H && std::ssize(logits) >= V);
    std::lock_guard<std::mutex> lock(mutex_);
    ctx_->copy_to_device(w_.hidden, hidden.data(), static_cast<size_t>(H) * sizeof(float));
    enqueue_head(0, 1);
    ctx_->download(w_.logits, logits.data(), static_cast<size_t>(V) * sizeof(float));
}

void CudaHybridModel::enqueue_head(int64_t row0, int64_t n) const {
    STRATA_ASSERT(n >= 1 && n <= kHeadRows);
    cuda::matmul(*ctx_, {.w = *output_, .x = w_.hidden + row0 * info_.n_embd, .y = w_.logits, .n_tokens = n});
}

void CudaHybridModel::delta_rule(LayerDeviceState& l, const float* conv, const float* alpha, const float* beta,
                                 int64_t T) const {
    const GdnShape& g = gdn_;
    const int64_t CD = g.conv_dim(), KD = g.key_dim();
    cuda::gated_delta(*ctx_, {.state = l.recurrent.as<float>(),
                              .q = conv,
                              .k = conv + KD,
                              .v = conv + 2 * KD,
                              .q_stride = CD,
                              .k_stride = CD,
                              .v_stride = CD,
                              .g = alpha,
                              .beta = beta,
                              .out = w_.core,
                              .out_stride = g.value_dim(),
                              .n_tokens = T,
                              .heads = g.n_v_heads,
                              .key_heads = g.n_k_heads,
                              .tiled_value_heads = g.tiled_value_heads,
                              .dk = g.k_head_dim,
                              .dv = g.v_head_dim,
                              .recurrence = gdn_recurrence_});
}

// Gated DeltaNet (model/gdn.cpp): projections, conv + SiLU, normalised q/k, gates, the recurrence on the sequence's
// state, the gated norm, the output projection.
void CudaHybridModel::gdn_window(const GdnDevice& w, LayerDeviceState& l, const float* x, float* out, int64_t T,
                                 const void* x_q8_0) const {
    cuda::Context& ctx = *ctx_;
    const GdnShape& g = gdn_;
    const int64_t CD = g.conv_dim(), KD = g.key_dim();
    // A sequence that verifies drafts keeps a decode window's inputs to its state where the kernels write them.
    const bool keep = l.window_raw.size() && keeps_window_inputs(T);
    float* raw = keep ? l.window_raw.as<float>() : w_.qkv;
    float* conv_rows = keep ? l.window_conv.as<float>() : w_.conv;
    float* alpha = keep ? l.window_alpha.as<float>() : w_.alpha;
    float* beta = keep ? l.window_beta.as<float>() : w_.beta;
    mark(kGdnProjections);
    if (w.ba) {
        cuda::matmul_shared_input(ctx, x, T, {{w.qkv, raw}, {w.gate, w_.z}, {w.ba, w_.ba}}, x_q8_0);
        cuda::split_beta_alpha(ctx, {.ba = w_.ba,
                                     .beta = beta,
                                     .alpha = alpha,
                                     .n_tokens = T,
                                     .key_heads = g.n_k_heads,
                                     .per_group = g.n_v_heads / g.n_k_heads});
    } else {
        cuda::matmul_shared_input(ctx, x, T, {{w.qkv, raw}, {w.gate, w_.z}, {w.beta, beta}, {w.alpha, alpha}}, x_q8_0);
    }
    mark(kGdnRecurrence);
    const cuda::ConvWindowArgs conv{.x = raw,
                                    .x_stride = CD,
                                    .w = w.conv,
                                    .history = l.conv_history.as<float>(),
                                    .out = conv_rows,
                                    .out_stride = CD,
                                    .n_tokens = T,
                                    .channels = CD,
                                    .kernel = g.conv_kernel,
                                    .dilation = 1};
    const cuda::GdnActivateArgs activate{.conv = conv_rows,
                                         .n_tokens = T,
                                         .conv_dim = CD,
                                         .key_dim = KD,
                                         .head_dim = g.k_head_dim,
                                         .q_scale = 1.0f / std::sqrt(static_cast<float>(g.k_head_dim))};
    const cuda::GdnGatesArgs gates{
        .beta = beta, .alpha = alpha, .a = w.a, .dt_bias = w.dt_bias, .n_tokens = T, .n_heads = g.n_v_heads};
    if (T <= cuda::kMaxMatvecTokens) {
        cuda::gdn_conv_activate(ctx, conv, activate, gates);  // one launch instead of three
    } else {
        cuda::causal_conv(ctx, conv);
        cuda::gdn_activate(ctx, activate);
        cuda::gdn_gates(ctx, gates);
    }
    delta_rule(l, conv_rows, alpha, beta, T);
    mark(kGdnProjections);  // the norm quantizes the out-projection's activations: one launch with the product
    cuda::gated_norm_matmul(ctx,
                            {.x = w_.core,
                             .z = w_.z,
                             .gamma = w.norm,
                             .n_tokens = T,
                             .n_heads = g.n_v_heads,
                             .head_dim = g.v_head_dim,
                             .sigmoid_gate = g.output_gate == GateActivation::Sigmoid,
                             .eps = g.eps},
                            *w.out, out);
}

// Gated attention (model/attention.cpp): projections, q/k norms and rope, the KV append; with an indexer, the raw and
// pooled keys and each token's QSA selection; then decode attention per token (its own cache length) with the output
// gate fused, or with --qsa-union for a sparse layer's window of 2-8 tokens one kernel over the union of the tokens'
// selections (backend/cuda/qsa_union.h; the same contract); and the output projection.
void CudaHybridModel::attention_window(const AttentionDevice& w, CudaSequence& s, LayerDeviceState& l, const float* x,
                                       float* out, int64_t T, const void* x_q8_0) const {
    cuda::Context& ctx = *ctx_;
    const AttentionShape& a = attention_;
    const int64_t hd = a.head_dim, nh = a.n_head, nkv = a.n_head_kv;
    mark(kAttentionProjections);
    if (w.sparse())
        cuda::matmul_shared_input(
            ctx, x, T,
            {{w.q, w_.qg}, {w.k, w_.k_new}, {w.v, w_.v_new}, {w.index_k, w_.index_raw}, {w.index_q, w_.index_q}},
            x_q8_0);
    else
        cuda::matmul_shared_input(ctx, x, T, {{w.q, w_.qg}, {w.k, w_.k_new}, {w.v, w_.v_new}}, x_q8_0);
    mark(kAttention);
    // Heads of head_dim values at head_stride, each normed with gamma, then rotated at the tokens' positions: q (its
    // gate between heads), k and the indexer's q in one launch.
    auto norm_rope = [&](float* values, int64_t heads, int64_t head_dim, int64_t head_stride, const float* gamma) {
        return cuda::NormRopeArgs{.rope = {.x = values,
                                           .n_tokens = T,
                                           .n_heads = heads,
                                           .token_stride = heads * head_stride,
                                           .head_stride = head_stride,
                                           .n_rot = a.n_rot,
                                           .positions = w_.positions,
                                           .freq_base = a.freq_base},
                                  .head_dim = head_dim,
                                  .gamma = gamma,
                                  .eps = a.eps};
    };
    const cuda::NormRopeArgs heads[] = {
        norm_rope(w_.qg, nh, hd, 2 * hd, w.q_norm), norm_rope(w_.k_new, nkv, hd, hd, w.k_norm),
        norm_rope(w_.index_q, w.indexer.n_head, w.indexer.head_dim, w.indexer.head_dim, w.index_q_norm)};
    const std::span<const cuda::NormRopeArgs> sets(heads, w.sparse() ? 3 : 2);
    cuda::rms_norm_rope(ctx, sets);
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
        const int64_t max_blocks = std::max<int64_t>(s.capacity_ / ix.ratio, 1);
        // The raw key rows stored and every block they complete pooled, in one launch.
        const cuda::StoreRowsArgs store{.dst = l.index_raw.as<float>(),
                                        .dst_rows = s.capacity_,
                                        .src = w_.index_raw,
                                        .width = di,
                                        .positions = w_.positions,
                                        .n_tokens = T};
        const cuda::IndexerPoolArgs pool{.raw = l.index_raw.as<float>(),
                                         .pooled = l.index_pooled.as<float>(),
                                         .max_blocks = max_blocks,
                                         .head_dim = di,
                                         .ratio = ix.ratio,
                                         .k_norm = w.index_k_norm,
                                         .eps = a.eps,
                                         .n_rot = a.n_rot,
                                         .freq_base = a.freq_base,
                                         .positions = w_.positions,
                                         .n_tokens = T};
        cuda::indexer_store_pool(ctx, store, pool);
        // A decode window's queries one by one (the graph's launches stay small); a prompt window's s.qsa_group at a
        // time, each with its own workspace.
        const int64_t group = T > kWindow ? s.qsa_group : 1;
        for (int64_t t = 0; t < T; t += group)
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
                                   .n_selected = w_.n_selected + t,
                                   .n_queries = std::min(group, T - t),
                                   .q_stride = ix.n_head * di,
                                   .cells_stride = w_.max_cells});
    }
    const int64_t splits = w.sparse() ? s.sparse_splits : s.dense_splits;
    // --qsa-union: the window's positions attend over the union of their selections, all at once.
    const bool by_union = w.sparse() && T > 1 && s.union_workspace.size() > 0;
    if (by_union)
        cuda::qsa_union_attention(ctx, {.cache = l.kv->view(),
                                        .table = table,
                                        .n_tokens = T,
                                        .n_cells = w_.lengths,
                                        .cells = w_.cells,
                                        .cells_stride = w_.max_cells,
                                        .n_selected = w_.n_selected,
                                        .max_cells = max_cells,
                                        .q = w_.qg,
                                        .n_head = nh,
                                        .q_head_stride = 2 * hd,
                                        .q_token_stride = 2 * hd * nh,
                                        .gate = w_.qg + hd,
                                        .gate_head_stride = 2 * hd,
                                        .gate_token_stride = 2 * hd * nh,
                                        .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
                                        .out = w_.heads,
                                        .out_token_stride = nh * hd,
                                        .n_splits = s.union_splits,
                                        .workspace = s.union_workspace.data(),
                                        .workspace_bytes = s.union_workspace.size()});
    if (by_union) {
        mark(kAttentionProjections);
        cuda::matmul(ctx, {.w = *w.o, .x = w_.heads, .y = out, .n_tokens = T});
        return;
    }
    if (T > kWindow) {
        // A prompt window: every query over its own cells in one launch, then the output product.
        cuda::decode_attention(ctx, {.cache = l.kv->view(),
                                     .table = table,
                                     .n_cells = w_.lengths,
                                     .cells = w.sparse() ? w_.cells : nullptr,
                                     .n_selected = w.sparse() ? w_.n_selected : nullptr,
                                     .max_cells = max_cells,
                                     .q = w_.qg,
                                     .n_head = nh,
                                     .q_head_stride = 2 * hd,
                                     .gate = w_.qg + hd,
                                     .gate_head_stride = 2 * hd,
                                     .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
                                     .out = w_.heads,
                                     .n_splits = 1,
                                     .n_queries = T,
                                     .q_token_stride = 2 * hd * nh,
                                     .gate_token_stride = 2 * hd * nh,
                                     .out_token_stride = nh * hd,
                                     .cells_stride = w.sparse() ? w_.max_cells : 0});
        mark(kAttentionProjections);
        cuda::matmul(ctx, {.w = *w.o, .x = w_.heads, .y = out, .n_tokens = T});
        return;
    }
    // Each token attends over its own cells; the output product reads the heads as the attention's last kernels
    // quantize them (so a profile counts the product as attention).
    std::vector<cuda::DecodeAttentionArgs> per_token(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
        float* qg = w_.qg + t * 2 * hd * nh;
        per_token[static_cast<size_t>(t)] = {.cache = l.kv->view(),
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
                                             .workspace_bytes = s.attention_workspace.size()};
    }
    const std::span<const cuda::DecodeAttentionArgs> tokens(per_token);
    cuda::decode_attention_matmul(ctx, tokens, *w.o, out);
}

}  // namespace strata::cuda_model
