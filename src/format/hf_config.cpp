#include "format/hf_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace strata {

using nlohmann::json;

const char* gguf_arch_name(HfArch arch) {
    switch (arch) {
        case HfArch::Qwen4Exp:
            return "qwen4exp";
        case HfArch::Qwen35Moe:
            return "qwen35moe";
        case HfArch::Qwen3Next:
            return "qwen3next";
    }
    return "?";
}

int64_t HfConfig::n_attention_layers() const {
    return static_cast<int64_t>(std::count(is_attention.begin(), is_attention.end(), true));
}

int64_t HfConfig::n_dense_mlp_layers() const {
    return static_cast<int64_t>(std::count(is_dense_mlp.begin(), is_dense_mlp.end(), true));
}

namespace {

// Reads typed fields from the text config, falling back to the top level (a ConditionalGeneration config keeps
// some ids, e.g. eos_token_id, at either place).
class FieldReader {
  public:
    FieldReader(const json& text, const json& root, std::string source)
        : text_(text), root_(root), source_(std::move(source)) {}

    const json* find(const std::string& key) const {
        if (text_.is_object()) {
            auto it = text_.find(key);
            if (it != text_.end() && !it->is_null()) return &*it;
        }
        if (&root_ != &text_ && root_.is_object()) {
            auto it = root_.find(key);
            if (it != root_.end() && !it->is_null()) return &*it;
        }
        return nullptr;
    }

    [[noreturn]] void fail(const std::string& key, const std::string& what) const {
        throw Error(source_ + ": field '" + key + "' " + what);
    }

    int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
        const json* v = find(key);
        if (!v) {
            if (fallback) return *fallback;
            fail(key, "is missing");
        }
        return as_integer(key, *v);
    }

    std::optional<int64_t> optional_integer(const std::string& key) const {
        const json* v = find(key);
        if (!v) return std::nullopt;
        return as_integer(key, *v);
    }

    int64_t positive(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
        int64_t v = integer(key, fallback);
        if (v <= 0) fail(key, "must be positive, got " + std::to_string(v));
        return v;
    }

    double number(const std::string& key, double fallback) const {
        const json* v = find(key);
        if (!v) return fallback;
        return as_number(key, *v);
    }

    bool boolean(const std::string& key, bool fallback) const {
        const json* v = find(key);
        if (!v) return fallback;
        if (!v->is_boolean()) fail(key, "must be true or false");
        return v->get<bool>();
    }

    std::string string(const std::string& key, const std::string& fallback) const {
        const json* v = find(key);
        if (!v) return fallback;
        if (!v->is_string()) fail(key, "must be a string");
        return v->get<std::string>();
    }

    std::vector<int64_t> integer_list(const std::string& key) const {
        const json* v = find(key);
        if (!v) return {};
        if (!v->is_array()) fail(key, "must be a list of integers");
        std::vector<int64_t> out;
        for (const json& e : *v) out.push_back(as_integer(key, e));
        return out;
    }

    // int or list of ints (eos_token_id)
    std::vector<int64_t> integer_or_list(const std::string& key) const {
        const json* v = find(key);
        if (!v) return {};
        if (v->is_array()) return integer_list(key);
        return {as_integer(key, *v)};
    }

    int64_t as_integer(const std::string& key, const json& v) const {
        if (v.is_number_integer()) return v.get<int64_t>();
        if (v.is_number_float()) {
            double d = v.get<double>();
            if (d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
        }
        fail(key, "must be an integer");
    }

    double as_number(const std::string& key, const json& v) const {
        if (!v.is_number()) fail(key, "must be a number");
        return v.get<double>();
    }

    const std::string& source() const { return source_; }

  private:
    const json& text_;
    const json& root_;
    std::string source_;
};

void read_rope(const FieldReader& f, HfConfig& c) {
    c.rope_theta = f.number("rope_theta", 10000.0);
    c.partial_rotary_factor = f.number("partial_rotary_factor", 1.0);
    if (const json* rp = f.find("rope_parameters")) {
        if (!rp->is_object()) f.fail("rope_parameters", "must be an object");
        FieldReader inner(*rp, *rp, f.source() + ": rope_parameters");
        c.rope_theta = inner.number("rope_theta", c.rope_theta);
        c.partial_rotary_factor = inner.number("partial_rotary_factor", c.partial_rotary_factor);
        c.mrope_section = inner.integer_list("mrope_section");
    }
    if (c.mrope_section.empty()) c.mrope_section = f.integer_list("mrope_section");
    if (!(c.partial_rotary_factor > 0.0 && c.partial_rotary_factor <= 1.0))
        f.fail("partial_rotary_factor", "must be in (0, 1]");
    if (c.mrope_section.size() > 4) f.fail("mrope_section", "has more than 4 entries");
}

void read_layer_types(const FieldReader& f, HfConfig& c) {
    const json* lt = f.find("layer_types");
    if (!lt) {
        int64_t interval = f.positive("full_attention_interval", 4);
        for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.is_attention.push_back((i + 1) % interval == 0);
        return;
    }
    if (!lt->is_array()) f.fail("layer_types", "must be a list of strings");
    if (static_cast<int64_t>(lt->size()) != c.num_hidden_layers)
        f.fail("layer_types", "has " + std::to_string(lt->size()) + " entries, num_hidden_layers is " +
                                  std::to_string(c.num_hidden_layers));
    for (const json& e : *lt) {
        if (!e.is_string()) f.fail("layer_types", "must be a list of strings");
        const std::string s = e.get<std::string>();
        if (s == "linear_attention") {
            c.is_attention.push_back(false);
        } else if (s == "full_attention" || (c.arch == HfArch::Qwen4Exp && s == "qwen_sparse_attention")) {
            c.is_attention.push_back(true);
        } else {
            f.fail("layer_types", "has unsupported entry '" + s + "'");
        }
    }
}

// Qwen3NextDecoderLayer: layer i (0-based) gets Qwen3NextSparseMoeBlock iff i is not in mlp_only_layers and
// (i + 1) % decoder_sparse_step == 0, else Qwen3NextMLP(intermediate_size). Entries of mlp_only_layers outside the
// layers match no layer there, so they change nothing here either. (Qwen3.5-MoE's config deletes both fields: every
// layer is MoE.)
void read_dense_mlp_layers(const FieldReader& f, HfConfig& c) {
    const int64_t step = f.positive("decoder_sparse_step", 1);
    const std::vector<int64_t> mlp_only = f.integer_list("mlp_only_layers");
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        const bool listed = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
        c.is_dense_mlp.push_back(listed || (i + 1) % step != 0);
    }
}

void read_qwen4exp(const FieldReader& f, HfConfig& c) {
    c.hc_count = f.integer("hc_count", 4);
    if (c.hc_count <= 1) f.fail("hc_count", "must be greater than 1");
    c.hc_lowrank = f.positive("hc_lowrank", 320);
    std::vector<int64_t> ple = f.integer_list("ple_layer_ids");
    std::sort(ple.begin(), ple.end());
    ple.erase(std::unique(ple.begin(), ple.end()), ple.end());
    c.ple_layer_ids = ple;
    c.ple_embed_dim = f.positive("ple_embed_dim", c.hidden_size);
    c.ple_conv_kernel_size = f.positive("ple_conv_kernel_size", 4);
    c.ngram_size = f.integer("ngram_size", 3);
    c.heads_per_ngram = f.integer("heads_per_ngram", 8);
    c.ngram_vocab_size_base = f.integer("ngram_vocab_size_base", 20000000);
    c.make_ngram_vocab_size_divisible_by = f.positive("make_ngram_vocab_size_divisible_by", 128);
    c.seed = f.integer("seed", 1234);
    c.split_ngram_parts = f.positive("split_ngram_parts", 512);
    c.indexer_n_heads = f.optional_integer("indexer_n_heads");
    c.indexer_kv_heads = f.optional_integer("indexer_kv_heads");
    c.indexer_head_dim = f.optional_integer("indexer_head_dim");
    c.indexer_budget = f.optional_integer("indexer_budget");
    c.indexer_compress_ratio = f.optional_integer("indexer_compress_ratio");
    c.output_gate_type = f.string("output_gate_type", "");
    for (int64_t id : c.ple_layer_ids) {
        if (id < 1 || id > c.num_hidden_layers)
            f.fail("ple_layer_ids", "entry " + std::to_string(id) + " is not in [1, num_hidden_layers]");
        if (c.is_attention[static_cast<size_t>(id - 1)])
            f.fail("ple_layer_ids", "entry " + std::to_string(id) + " is not a linear_attention layer");
    }
    if (!c.ple_layer_ids.empty()) {
        if (c.ngram_size < 2) f.fail("ngram_size", "must be at least 2");
        if (c.heads_per_ngram <= 0) f.fail("heads_per_ngram", "must be positive");
        if (c.eos_token_ids.empty()) f.fail("eos_token_id", "must be set when PLE layers are enabled");
    }
}

}  // namespace

HfConfig parse_hf_config(const std::string& json_text, const std::string& source) {
    json root;
    try {
        root = json::parse(json_text);
    } catch (const json::exception& e) {
        throw Error(source + ": not valid JSON (" + std::string(e.what()) + ")");
    }
    if (!root.is_object()) throw Error(source + ": expected a JSON object");

    HfConfig c;
    auto archs = root.find("architectures");
    if (archs == root.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
        throw Error(source + ": field 'architectures' is missing or not a list of strings");
    c.hf_architecture = (*archs)[0].get<std::string>();
    const std::string& a = c.hf_architecture;
    if (a == "Qwen4ExpForCausalLM" || a == "Qwen4ExpForConditionalGeneration") {
        c.arch = HfArch::Qwen4Exp;
    } else if (a == "Qwen3_5MoeForCausalLM" || a == "Qwen3_5MoeForConditionalGeneration") {
        c.arch = HfArch::Qwen35Moe;
    } else if (a == "Qwen3NextForCausalLM") {
        c.arch = HfArch::Qwen3Next;
    } else {
        throw Error(source + ": architecture '" + a +
                    "' is not supported (supported: Qwen4ExpForCausalLM, Qwen4ExpForConditionalGeneration, "
                    "Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3NextForCausalLM)");
    }
    c.conditional_generation = a.find("ForConditionalGeneration") != std::string::npos;

    const json* text = &root;
    if (c.conditional_generation) {
        auto tc = root.find("text_config");
        if (tc == root.end() || !tc->is_object())
            throw Error(source + ": field 'text_config' is missing or not an object (needed for " + a + ")");
        text = &*tc;
    }
    FieldReader f(*text, root, source);

    c.vocab_size = f.positive("vocab_size");
    c.hidden_size = f.positive("hidden_size");
    c.num_hidden_layers = f.positive("num_hidden_layers");
    c.num_attention_heads = f.positive("num_attention_heads");
    c.num_key_value_heads = f.positive("num_key_value_heads", c.num_attention_heads);
    c.head_dim = f.positive("head_dim", 256);
    c.max_position_embeddings = f.positive("max_position_embeddings", 32768);
    c.intermediate_size = c.arch == HfArch::Qwen3Next ? f.positive("intermediate_size", 5632) : 0;
    c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
    c.hidden_act = f.string("hidden_act", "silu");
    c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
    read_rope(f, c);

    c.linear_conv_kernel_dim = f.positive("linear_conv_kernel_dim", 4);
    c.linear_key_head_dim = f.positive("linear_key_head_dim", 128);
    c.linear_value_head_dim = f.positive("linear_value_head_dim", 128);
    c.linear_num_key_heads = f.positive("linear_num_key_heads", 16);
    c.linear_num_value_heads = f.positive("linear_num_value_heads", 32);
    if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
        f.fail("linear_num_value_heads", "must be a multiple of linear_num_key_heads");

    c.num_experts = f.positive("num_experts");
    c.num_experts_per_tok = f.positive("num_experts_per_tok");
    if (c.num_experts_per_tok > c.num_experts) f.fail("num_experts_per_tok", "is larger than num_experts");
    c.moe_intermediate_size = f.positive("moe_intermediate_size");
    c.shared_expert_intermediate_size = f.positive("shared_expert_intermediate_size", 512);

    c.eos_token_ids = f.integer_or_list("eos_token_id");
    c.bos_token_id = f.optional_integer("bos_token_id");
    c.pad_token_id = f.optional_integer("pad_token_id");
    if (root.contains("image_token_id") && !root["image_token_id"].is_null())
        c.image_token_id = f.as_integer("image_token_id", root["image_token_id"]);
    c.mtp_num_hidden_layers = f.integer("mtp_num_hidden_layers", 0);
    if (c.mtp_num_hidden_layers < 0) f.fail("mtp_num_hidden_layers", "must not be negative");

    read_layer_types(f, c);
    if (c.arch == HfArch::Qwen4Exp) read_qwen4exp(f, c);
    if (c.arch == HfArch::Qwen3Next) read_dense_mlp_layers(f, c);
    return c;
}

HfConfig load_hf_config(const std::string& dir) {
    const std::string path = dir + "/config.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open (is this a HF save_pretrained folder?)");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_hf_config(ss.str(), path);
}

}  // namespace strata
