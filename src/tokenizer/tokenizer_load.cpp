// The two loaders: GGUF tokenizer.ggml.* keys and HF tokenizer.json (+ tokenizer_config.json).
#include "core/error.h"
#include "format/gguf.h"
#include "format/hf_tokenizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_spec.h"

namespace strata {

namespace {

std::optional<int32_t> gguf_id(const gguf::File& f, const char* key) {
    auto v = f.get_u32_opt(key);
    if (!v || *v > static_cast<uint32_t>(INT32_MAX)) return std::nullopt;
    return static_cast<int32_t>(*v);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
    Spec spec;
    spec.source = f.path();
    const gguf::Value* model = f.find("tokenizer.ggml.model");
    if (model == nullptr)
        throw Error(f.path() + ": no tokenizer in this file (tokenizer.ggml.model is missing); use --tokenizer "
                              "tokenizer.json or convert the model with its tokenizer.json");
    const std::string model_name = f.get_str("tokenizer.ggml.model");
    if (model_name != "gpt2")
        throw Error(f.path() + ": tokenizer.ggml.model is '" + model_name +
                    "'; only byte-level BPE ('gpt2') vocabularies are supported");
    spec.tokens = f.get_str_array("tokenizer.ggml.tokens");
    const size_t n = spec.tokens.size();
    if (f.find("tokenizer.ggml.merges") == nullptr)
        throw Error(f.path() + ": cannot find tokenizer merges (tokenizer.ggml.merges) in the file");
    for (const std::string& m : f.get_str_array("tokenizer.ggml.merges")) {
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos) throw Error(f.path() + ": merge '" + m + "' has no space between its parts");
        spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    std::vector<int64_t> types;
    if (f.find("tokenizer.ggml.token_type") != nullptr) {
        types = f.get_int_array("tokenizer.ggml.token_type");
        if (types.size() < n)
            throw Error(f.path() + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                        " entries for " + std::to_string(n) + " tokens");
    }
    spec.special.assign(n, false);
    for (size_t i = 0; i < types.size() && i < n; ++i) {
        const auto type = static_cast<TokenType>(types[i]);
        if (type != TokenType::Control && type != TokenType::UserDefined) continue;
        if (spec.tokens[i].empty()) continue;
        AddedToken a;
        a.content = spec.tokens[i];
        a.id = static_cast<int32_t>(i);
        a.special = type == TokenType::Control;
        spec.special[i] = a.special;
        spec.added.push_back(std::move(a));
    }
    std::string pre = "default";
    if (f.find("tokenizer.ggml.pre") != nullptr) pre = f.get_str("tokenizer.ggml.pre");
    if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "kormo" || pre == "f2llmv2") {
        spec.pre = Spec::Pre::Qwen2;
    } else if (pre == "qwen35") {
        spec.pre = Spec::Pre::Qwen35;
    } else if (pre == "default" || pre == "gpt-2" || pre == "gpt2") {
        spec.pre = Spec::Pre::Regex;
        spec.regex = kGpt2Pattern;
    } else {
        throw Error(f.path() + ": unknown pre-tokenizer type '" + pre + "' (supported: qwen2, qwen35, gpt-2)");
    }
    // The HF originals of the Qwen vocabularies normalize to NFC (llama.cpp skips this step; strata follows HF).
    spec.nfc = spec.pre != Spec::Pre::Regex;
    spec.bos_id = gguf_id(f, "tokenizer.ggml.bos_token_id");
    spec.eos_id = gguf_id(f, "tokenizer.ggml.eos_token_id");
    spec.eot_id = gguf_id(f, "tokenizer.ggml.eot_token_id");
    spec.eom_id = gguf_id(f, "tokenizer.ggml.eom_token_id");
    if (f.find("tokenizer.chat_template") != nullptr) spec.chat_template = f.get_str("tokenizer.chat_template");
    return build(std::move(spec));
}

std::unique_ptr<Tokenizer> Tokenizer::from_hf_dir_or_file(const std::string& path) {
    HfTokenizerJson t = read_hf_tokenizer_json(path);
    Spec spec;
    spec.source = t.source;
    spec.ignore_merges = t.ignore_merges;
    spec.tokens.assign(static_cast<size_t>(t.max_id + 1), std::string());
    spec.special.assign(spec.tokens.size(), false);
    for (auto& [text, id] : t.vocab) spec.tokens[static_cast<size_t>(id)] = std::move(text);
    for (const HfAddedToken& h : t.added) {
        spec.tokens[static_cast<size_t>(h.id)] = h.content;
        spec.special[static_cast<size_t>(h.id)] = h.special;
        spec.added.push_back({.content = h.content,
                              .id = h.id,
                              .special = h.special,
                              .lstrip = h.lstrip,
                              .rstrip = h.rstrip,
                              .single_word = h.single_word,
                              .normalized = h.normalized});
    }
    spec.merges = std::move(t.merges);
    spec.nfc = t.nfc;
    const std::string name = ::strata::pre_tokenizer_name(t.pattern);
    if (name == "qwen2") {
        spec.pre = Spec::Pre::Qwen2;
    } else if (name == "qwen35") {
        spec.pre = Spec::Pre::Qwen35;
    } else {
        spec.pre = Spec::Pre::Regex;
        spec.regex = t.pattern;
    }
    spec.bos_id = t.bos_id;
    spec.eos_id = t.eos_id;
    spec.chat_template = std::move(t.chat_template);
    return build(std::move(spec));
}

}  // namespace strata
