#include "model/hybrid.h"

#include <cstdio>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "core/error.h"
#include "core/memory_info.h"
#include "format/gguf_names.h"

namespace strata {

namespace {

// Touches one byte per page of every weight, so the file is in the page cache before the first token, reporting the
// fraction done. The PLE table is read a few rows per token and may be larger than RAM: it is skipped, as is
// everything when the weights would take more than half the RAM.
void read_ahead(const gguf::File& file, const std::function<void(float)>& progress) {
    constexpr size_t kPage = 4096;
    uint64_t total = 0;
    for (const gguf::TensorInfo& t : file.tensors())
        if (!is_ple_table(t.name)) total += t.n_bytes;
    const uint64_t ram = physical_ram_bytes();
    if (total == 0 || (ram > 0 && total > ram / 2)) {
        progress(1.0f);
        return;
    }
    uint64_t done = 0;
    int reported = -1;
    volatile uint8_t sink = 0;
    for (const gguf::TensorInfo& t : file.tensors()) {
        if (is_ple_table(t.name) || t.data == nullptr) continue;
        uint8_t acc = 0;
        for (size_t off = 0; off < t.n_bytes; off += kPage) {
            acc ^= t.data[off];
            const uint64_t now = done + off;
            const int step = static_cast<int>(now * 200 / total);
            if (step != reported && (off & ((size_t{1} << 20) - 1)) == 0) {
                reported = step;
                progress(static_cast<float>(static_cast<double>(now) / static_cast<double>(total)));
            }
        }
        sink = sink ^ acc;
        done += t.n_bytes;
    }
    progress(1.0f);
}

}  // namespace

HybridSequence::HybridSequence(const void* owner, int64_t capacity, Init init)
    : owner_(owner), capacity_(capacity), init_(std::move(init)) {
    reset();
}

size_t HybridSequence::memory_bytes() const {
    // The state buffers (what plan_memory() plans) and the rollback log.
    size_t total = rollback.bytes();
    for (const LayerState& l : layers) total += l.bytes();
    return total;
}

void HybridSequence::reset() {
    init_(layers, capacity_);
    n_past_ = 0;
    window_count = 0;
    rollback.reset();
}

namespace {

// Whether the packed copies of the file's matrices fit: they take about as much memory as the weights they copy, so
// a model larger than the free memory (streamed from the file) keeps the row kernels on the mapped weights.
bool packed_copies_fit(const gguf::File& file) {
    uint64_t total = 0;
    for (const gguf::TensorInfo& t : file.tensors()) {
        if (t.name == "token_embd.weight" || is_ple_table(t.name)) continue;  // tables: not packed
        const Tensor view = t.view();
        if (cpu::packable(view)) total += cpu::packed_bytes(view);
    }
    if (total == 0) return false;
    constexpr uint64_t kMargin = uint64_t{1} << 30;
    const std::optional<uint64_t> available = available_ram_bytes();
    if (available && total + kMargin > *available) {
        std::fprintf(stderr,
                     "strata: not repacking %.1f GiB of weights for the packed GEMMs: %.1f GiB of memory "
                     "is free; using the row kernels on the mapped file\n",
                     static_cast<double>(total) / (1 << 30), static_cast<double>(*available) / (1 << 30));
        return false;
    }
    return true;
}

}  // namespace

ModelInfo read_hybrid_info(const gguf::File& f, int64_t* n_block_all) {
    ModelInfo info;
    info.arch = f.get_str("general.architecture");
    if (const gguf::Value* name = f.find("general.name"); name && name->type == gguf::ValueType::STRING)
        info.name = name->str;
    HparamReader hp(f, info.arch);
    info.n_embd = hp.positive("embedding_length");
    *n_block_all = hp.positive("block_count");
    const int64_t n_nextn = hp.u32_or("nextn_predict_layers", 0);
    if (n_nextn >= *n_block_all)
        throw Error(f.path() + ": key " + hp.key("nextn_predict_layers") + " (" + std::to_string(n_nextn) +
                    ") must be smaller than block_count (" + std::to_string(*n_block_all) + ")");
    info.n_layer = *n_block_all - n_nextn;
    info.n_ctx_train = hp.u32_or("context_length", 0);
    return info;
}

HybridEmbeddings bind_hybrid_embeddings(const gguf::File& file, const TensorBinder& binder, ModelInfo& info) {
    const gguf::TensorInfo* te = file.find_tensor("token_embd.weight");
    if (!te) throw Error(file.path() + ": tensor token_embd.weight is missing");
    info.n_vocab = te->ne[1];
    HybridEmbeddings e;
    e.token_embd = binder.require_table("token_embd.weight", {info.n_embd, info.n_vocab});
    e.output = binder.optional("output.weight", {info.n_embd, info.n_vocab}).value_or(e.token_embd);
    HparamReader hp(file, info.arch);
    if (hp.has("vocab_size") && hp.u32("vocab_size") != info.n_vocab)
        throw Error(file.path() + ": key " + hp.key("vocab_size") + " says " + std::to_string(hp.u32("vocab_size")) +
                    " tokens but token_embd.weight has " + std::to_string(info.n_vocab));
    info.eog_tokens.clear();
    for (const char* key :
         {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
        const auto id = file.get_u32_opt(key);
        if (id && *id < info.n_vocab) {
            bool seen = false;
            for (int32_t eog : info.eog_tokens) seen = seen || eog == static_cast<int32_t>(*id);
            if (!seen) info.eog_tokens.push_back(static_cast<int32_t>(*id));
        }
    }
    return e;
}

HybridModel::HybridModel(std::unique_ptr<gguf::File> file, const LoadOptions& options)
    : file_(std::move(file)), pool_(options.n_threads > 0 ? options.n_threads : default_thread_count()) {
    info_ = read_hybrid_info(*file_, &n_block_all_);
    if (options.progress) read_ahead(*file_, options.progress);
    repack_ = options.repack && packed_copies_fit(*file_);
    routing_ = options.routing_trace;
}

void HybridModel::bind_embeddings(const TensorBinder& binder) {
    const HybridEmbeddings e = bind_hybrid_embeddings(*file_, binder, info_);
    token_embd_ = e.token_embd;
    output_ = e.output;
}

std::unique_ptr<SequenceState> HybridModel::new_sequence(int64_t max_tokens) const {
    if (max_tokens <= 0)
        throw Error("a sequence needs room for at least one token, asked for " + std::to_string(max_tokens));
    // Plan before taking: the state a sequence of this size holds must fit in this machine's RAM.
    constexpr int64_t kMaxTokens = int64_t{1} << 32;
    if (max_tokens > kMaxTokens)
        throw Error("a sequence of " + std::to_string(max_tokens) + " tokens is more than this engine supports (" +
                    std::to_string(kMaxTokens) + ")");
    uint64_t planned = 0;
    for (const MemoryPlanItem& item : plan_memory(*file_, max_tokens))
        if (item.what.rfind("sequence", 0) == 0) planned += item.bytes;
    if (const uint64_t ram = physical_ram_bytes(); ram > 0 && planned > ram)
        throw Error("a sequence of " + std::to_string(max_tokens) + " tokens needs " + std::to_string(planned >> 20) +
                    " MiB of state, more than this machine's " + std::to_string(ram >> 20) +
                    " MiB of RAM; ask for a smaller context");
    try {
        return std::make_unique<HybridSequence>(
            this, max_tokens,
            [this](std::vector<LayerState>& layers, int64_t capacity) { init_layers(layers, capacity); });
    } catch (const std::bad_alloc&) {
        throw Error("not enough memory for a sequence of " + std::to_string(max_tokens) +
                    " tokens; ask for a smaller context");
    } catch (const std::length_error&) {
        throw Error("a sequence of " + std::to_string(max_tokens) + " tokens is too large to allocate");
    }
}

void HybridModel::embed(std::span<const int32_t> tokens, float* out) const {
    for (size_t t = 0; t < tokens.size(); ++t) cpu::get_row(token_embd_, tokens[t], out + t * info_.n_embd);
}

namespace {

// A per-block key that must agree on every block where it is used; 0 entries are ignored.
int64_t common_value(const std::vector<int64_t>& values, const std::vector<bool>& use, const std::string& what) {
    int64_t v = 0;
    for (size_t i = 0; i < use.size(); ++i) {
        if (!use[i] || values[i] == 0) continue;
        if (v != 0 && values[i] != v) throw Error("key " + what + " differs between blocks; not supported");
        v = values[i];
    }
    return v;
}

}  // namespace

AttentionShape read_attention_shape(const HparamReader& hp, int64_t H, const std::vector<bool>& recurrent,
                                    int64_t n_block_all, float eps) {
    std::vector<bool> is_attention(recurrent.size());
    bool any_attention = false;
    for (size_t i = 0; i < recurrent.size(); ++i) any_attention = any_attention || (is_attention[i] = !recurrent[i]);
    const int64_t n_head = common_value(hp.per_block("attention.head_count", n_block_all, 0), is_attention,
                                        hp.key("attention.head_count"));
    if (!any_attention) return {.n_embd = H};
    if (n_head <= 0) throw Error("key " + hp.key("attention.head_count") + " is missing");
    const int64_t n_head_kv = common_value(hp.per_block("attention.head_count_kv", n_block_all, n_head), is_attention,
                                           hp.key("attention.head_count_kv"));
    const int64_t head_dim = hp.u32_or("attention.key_length", H / n_head);
    if (hp.u32_or("attention.value_length", head_dim) != head_dim)
        throw Error("keys " + hp.key("attention.key_length") +
                    " and value_length differ; this architecture needs them equal");
    AttentionShape s{.n_embd = H,
                     .n_head = n_head,
                     .n_head_kv = n_head_kv > 0 ? n_head_kv : n_head,
                     .head_dim = head_dim,
                     .n_rot = hp.u32_or("rope.dimension_count", head_dim),
                     .freq_base = hp.f32_or("rope.freq_base", 10000.0f),
                     .eps = eps};
    if (s.n_rot > head_dim || s.n_rot % 2 != 0)
        throw Error("key " + hp.key("rope.dimension_count") + " (" + std::to_string(s.n_rot) +
                    ") must be even and at most the head dim " + std::to_string(head_dim));
    if (s.n_head % s.n_head_kv != 0) throw Error("attention.head_count must be a multiple of head_count_kv");
    return s;
}

GdnShape read_gdn_shape(const HparamReader& hp, int64_t H, float eps) {
    const int64_t nv = hp.positive("ssm.time_step_rank");
    const int64_t nk = hp.positive("ssm.group_count");
    const int64_t inner = hp.positive("ssm.inner_size");
    if (inner % nv != 0 || nv % nk != 0)
        throw Error("key " + hp.key("ssm.inner_size") +
                    " must be a multiple of ssm.time_step_rank, and that of "
                    "ssm.group_count");
    // llama.cpp takes the value head size from ssm.state_size too; a file whose value heads differ from the key heads
    // names their size in a strata key, which must agree with ssm.inner_size.
    const int64_t dv = inner / nv;
    if (const auto value_length = hp.strata_u32("ssm.value_length"); value_length && *value_length != dv)
        throw Error("key " + hp.strata_key("ssm.value_length") + " is " + std::to_string(*value_length) + ", but " +
                    hp.key("ssm.inner_size") + " / ssm.time_step_rank is " + std::to_string(dv));
    return {.n_embd = H,
            .n_k_heads = nk,
            .n_v_heads = nv,
            .k_head_dim = hp.positive("ssm.state_size"),
            .v_head_dim = dv,
            .conv_kernel = hp.positive("ssm.conv_kernel"),
            .eps = eps};
}

MoeShape read_moe_shape(const HparamReader& hp, int64_t H, int64_t n_block_all) {
    const int64_t n_ff = hp.per_block("feed_forward_length", n_block_all, 0)[0];
    MoeShape s{.n_embd = H, .n_expert = hp.positive("expert_count"), .n_expert_used = hp.positive("expert_used_count")};
    if (s.n_expert_used > s.n_expert) throw Error("key " + hp.key("expert_used_count") + " exceeds expert_count");
    s.n_ff = hp.per_block("expert_feed_forward_length", n_block_all, 0)[0];
    if (s.n_ff == 0 && n_ff > 0) s.n_ff = n_ff / s.n_expert_used;
    if (s.n_ff <= 0) throw Error("key " + hp.key("expert_feed_forward_length") + " is missing");
    s.n_ff_shared = hp.u32_or("expert_shared_feed_forward_length", n_ff);
    return s;
}

}  // namespace strata
