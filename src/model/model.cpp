// load_model(): dispatch on general.architecture. plan_memory(): what a file and a context of n_ctx tokens take.
#include "model/model.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "format/gguf.h"
#include "format/gguf_names.h"
#include "model/hybrid.h"

namespace strata {

std::unique_ptr<Model> load_model(const std::string& path, const LoadOptions& options) {
    std::unique_ptr<gguf::File> file = gguf::File::open(path);
    const std::string arch = file->get_str("general.architecture");
#if !STRATA_HAS_CUDA
    if (options.backend == Backend::Cuda) throw Error("this build has no CUDA backend (configure with -DSTRATA_CUDA=ON)");
#else
    if (options.backend == Backend::Cuda && !options.split.empty()) return load_split_cuda(path, options);
#endif
    if (!options.split.empty() && options.backend != Backend::Cuda)
        throw Error("a split over several GPUs (--split) needs --backend cuda");
    if (options.backend == Backend::Cuda && options.routing_trace)
        throw Error("--routing-trace records the CPU backend's routing only (use --backend cpu)");
    if (arch == "qwen4exp") return load_qwen4exp(std::move(file), options);
    if (arch == "qwen35moe") return load_qwen35moe(std::move(file), options);
    if (arch == "qwen3next") return load_qwen3next(std::move(file), options);
    throw Error(path + ": architecture '" + arch + "' is not supported (supported: qwen4exp, qwen35moe, qwen3next)");
}

namespace {

std::string weight_kind(const std::string& name) {
    if (name == "token_embd.weight") return "weights: token embeddings";
    if (name == "output.weight") return "weights: output head";
    if (is_ple_table(name)) return "weights: PLE table";
    if (name.find("_exps") != std::string::npos) return "weights: routed experts";
    if (name.find("nextn") != std::string::npos) return "weights: MTP";
    return "weights: dense (attention, GDN, shared experts, norms, routers)";
}

}  // namespace

std::vector<MemoryPlanItem> plan_memory(const gguf::File& file, int64_t n_ctx) {
    std::vector<MemoryPlanItem> items;
    auto add = [&](const std::string& what, uint64_t bytes) {
        for (auto& it : items)
            if (it.what == what) {
                it.bytes += bytes;
                return;
            }
        items.push_back({what, bytes});
    };
    for (const gguf::TensorInfo& t : file.tensors()) add(weight_kind(t.name), t.n_bytes);

    const std::string arch = file.get_str("general.architecture");
    if (arch != "qwen4exp" && arch != "qwen35moe" && arch != "qwen3next") return items;
    HparamReader hp(file, arch);
    const int64_t H = hp.positive("embedding_length");
    const int64_t n_all = hp.positive("block_count");
    const int64_t n_layer = n_all - hp.u32_or("nextn_predict_layers", 0);
    const std::vector<bool> recurrent = recurrent_layer_map(hp, n_all, std::max<int64_t>(n_layer, 0));
    const int64_t n_recurrent = std::count(recurrent.begin(), recurrent.end(), true);
    const int64_t n_attention = static_cast<int64_t>(recurrent.size()) - n_recurrent;
    const uint64_t f = sizeof(float);
    const uint64_t ctx = static_cast<uint64_t>(n_ctx);

    const AttentionShape attn = read_attention_shape(hp, H, recurrent, n_all, 1e-6f);
    add("sequence: KV cache (f32)", ctx * static_cast<uint64_t>(2 * n_attention * attn.n_head_kv * attn.head_dim) * f);
    if (n_recurrent > 0) {
        const GdnShape g = read_gdn_shape(hp, H, 1e-6f);
        add("sequence: GDN state and conv history",
            static_cast<uint64_t>(n_recurrent *
                                  (g.n_v_heads * g.k_head_dim * g.v_head_dim + (g.conv_kernel - 1) * g.conv_dim())) *
                f);
    }
    int64_t hc = 1;
    if (arch == "qwen4exp") {
        hc = hp.u32("hyper_connection.count");
        const int64_t di = hp.u32_or("attention.indexer.key_length", 0);
        const std::vector<int64_t> ratios = hp.per_block("attention.compress_ratios", n_all, 0);
        uint64_t idx = 0;
        for (int64_t i = 0; i < n_layer; ++i)
            if (!recurrent[static_cast<size_t>(i)] && ratios[static_cast<size_t>(i)] > 0)
                idx += ctx * static_cast<uint64_t>(di) * f +
                       ctx / static_cast<uint64_t>(ratios[static_cast<size_t>(i)]) * static_cast<uint64_t>(di) * f;
        add("sequence: QSA indexer keys (raw and pooled)", idx);
        if (hp.has("ple.layers") && !file.get_int_array(hp.key("ple.layers")).empty()) {
            const int64_t N = hp.u32("ple.ngram_size");
            const int64_t Kp = hp.u32("ple.conv_kernel");
            // every PLE block keeps its own history (strata.qwen4exp.ple.layers lists them when there are several)
            const uint64_t n_ple = std::max<uint64_t>(1, hp.strata_int_array("ple.layers").size());
            add("sequence: PLE token and conv history",
                n_ple * (static_cast<uint64_t>((Kp - 1) * N * hc * H) * f +
                         static_cast<uint64_t>(N - 1) * sizeof(int32_t)));
        }
    }
    // Scratch for one forward of a 512-token batch: a handful of residual-wide rows per token plus the logits.
    const gguf::TensorInfo* te = file.find_tensor("token_embd.weight");
    const uint64_t vocab = te ? static_cast<uint64_t>(te->ne[1]) : 0;
    const uint64_t batch = static_cast<uint64_t>(std::min<int64_t>(512, std::max<int64_t>(n_ctx, 1)));
    add("scratch (512-token batch)", batch * (vocab + 16 * static_cast<uint64_t>(hc * H)) * f);
    return items;
}

DecodeTraffic decode_traffic(const gguf::File& file, int64_t depth, KvCacheType kv) {
    DecodeTraffic d;
    const std::string arch = file.get_str("general.architecture");
    HparamReader hp(file, arch);
    const int64_t n_all = hp.positive("block_count");
    const int64_t n_layer = n_all - hp.u32_or("nextn_predict_layers", 0);
    const int64_t n_expert = hp.u32_or("expert_count", 0), n_used = hp.u32_or("expert_used_count", 0);
    const gguf::TensorInfo* output = file.find_tensor("output.weight");
    int64_t ple_rows = 0;
    if (hp.has("ple.ngram_size")) ple_rows = (hp.u32("ple.ngram_size") - 1) * hp.u32_or("ple.heads_per_ngram", 1);
    for (const gguf::TensorInfo& t : file.tensors()) {
        const int64_t n_rows = t.ne[1] * t.ne[2] * t.ne[3];
        const uint64_t row = n_rows > 0 ? t.n_bytes / static_cast<uint64_t>(n_rows) : 0;
        if (is_mtp_block_tensor(t.name, n_layer)) continue;
        if (is_ple_table(t.name))
            d.weights += static_cast<uint64_t>(ple_rows) * row;
        else if (t.name == "token_embd.weight")
            d.weights += output ? row : t.n_bytes;  // one row, or the whole table when it is also the head
        else if (t.name.find("_exps") != std::string::npos && n_expert > 0)
            d.weights += t.n_bytes / static_cast<uint64_t>(n_expert) * static_cast<uint64_t>(n_used);
        else
            d.weights += t.n_bytes;
    }
    const int64_t H = hp.positive("embedding_length");
    const std::vector<bool> recurrent = recurrent_layer_map(hp, n_all, n_layer);
    const AttentionShape attn = read_attention_shape(hp, H, recurrent, n_all, 1e-6f);
    const std::vector<int64_t> ratios =
        arch == "qwen4exp" ? hp.per_block("attention.compress_ratios", n_all, 0) : std::vector<int64_t>(n_all, 0);
    const int64_t di = hp.u32_or("attention.indexer.key_length", 0), budget = hp.u32_or("attention.indexer.top_k", 0);
    // K and V: fp16 values, or int8 values and an fp16 scale per 64 (the CUDA cache's int8 layout, attention.h)
    const uint64_t cell_values = static_cast<uint64_t>(2 * attn.n_head_kv * attn.head_dim);
    const uint64_t cell_bytes = kv == KvCacheType::Int8 ? cell_values + cell_values / 64 * 2 : cell_values * 2;
    for (int64_t il = 0; il < n_layer; ++il) {
        if (recurrent[static_cast<size_t>(il)]) continue;
        const int64_t ratio = ratios[static_cast<size_t>(il)];
        const int64_t cells = ratio > 0 ? std::min(depth + 1, budget / ratio * ratio + ratio) : depth + 1;
        d.cache += static_cast<uint64_t>(cells) * cell_bytes;
        if (ratio > 0) d.cache += static_cast<uint64_t>((depth + 1) / ratio * di) * sizeof(float);  // pooled keys
    }
    return d;
}

HostFloats::HostFloats(size_t n)
    : data_(n ? new float[n]() : nullptr), size_(n), release_([](float* p) { delete[] p; }) {}

HostFloats::HostFloats(HostFloats&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      release_(std::exchange(other.release_, nullptr)) {}

HostFloats& HostFloats::operator=(HostFloats&& other) noexcept {
    if (this != &other) {
        reset();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        release_ = std::exchange(other.release_, nullptr);
    }
    return *this;
}

void HostFloats::reset() noexcept {
    if (data_ && release_) release_(data_);
    data_ = nullptr;
    size_ = 0;
    release_ = nullptr;
}

// Defaults for models without a batched path or checkpoints: one forward() per entry; no checkpoints.
void Model::forward_batch(std::span<const BatchEntry> batch) const {
    for (size_t i = 0; i < batch.size(); ++i) {
        for (size_t j = 0; j < i; ++j)
            if (batch[i].seq == batch[j].seq) throw Error("forward_batch: the same sequence appears twice in a batch");
    }
    for (const BatchEntry& entry : batch) {
        if (entry.seq == nullptr) throw Error("forward_batch: an entry has no sequence");
        if (entry.residual.empty())
            forward(*entry.seq, entry.tokens, entry.logits, entry.last_only);
        else
            forward_with_residual(*entry.seq, entry.tokens, entry.logits, entry.residual, entry.last_only);
    }
}

std::unique_ptr<SequenceCheckpoint> Model::checkpoint(const SequenceState&) const {
    throw Error("this model does not support sequence checkpoints");
}

void Model::restore(SequenceState&, const SequenceCheckpoint&) const {
    throw Error("this model does not support sequence checkpoints");
}

bool Model::commit(SequenceState&, const SequenceCheckpoint&, int64_t) const {
    return false;
}

// Models without an MTP draft layer (draft_residual_width() == 0).
void Model::forward_with_residual(SequenceState&, std::span<const int32_t>, std::span<float>, std::span<float>,
                                  bool) const {
    throw Error("this model has no MTP draft layer (no trunk residual to hand out)");
}

std::unique_ptr<DraftState> Model::new_draft_state(int64_t) const {
    throw Error("this model has no MTP draft layer");
}

void Model::draft_forward(DraftState&, int64_t, std::span<const float>, std::span<const int32_t>, std::span<float>,
                          std::span<float>) const {
    throw Error("this model has no MTP draft layer");
}

}  // namespace strata
