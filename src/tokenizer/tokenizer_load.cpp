// The two loaders: GGUF tokenizer.ggml.* keys and HF tokenizer.json (+ tokenizer_config.json).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/gguf.h"
#include "format/hf_tokenizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_spec.h"

namespace strata {

using nlohmann::json;

namespace {

// Same rule as the HF -> GGUF import (format/hf_tokenizer.cpp): <|...|> tokens are control even when not flagged
// special, so both loaders agree on what --no-special leaves alone.
bool looks_special(const std::string& t) {
    auto starts = [&](const char* p) { return t.rfind(p, 0) == 0; };
    auto ends = [&](const std::string& p) {
        return t.size() >= p.size() && t.compare(t.size() - p.size(), p.size(), p) == 0;
    };
    if (starts("<|") && ends("|>") && t.size() > 4) return true;
    return starts("<｜") && ends("｜>");
}

std::optional<int32_t> gguf_id(const gguf::File& f, const char* key) {
    auto v = f.get_u32_opt(key);
    if (!v || *v > static_cast<uint32_t>(INT32_MAX)) return std::nullopt;
    return static_cast<int32_t>(*v);
}

std::string read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

json parse_json(const std::string& path) {
    try {
        return json::parse(read_text_file(path));
    } catch (const json::exception& e) {
        throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
    }
}

std::optional<std::string> config_token_text(const json& cfg, const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        return (*it)["content"].get<std::string>();
    return std::nullopt;
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
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path file = path;
    if (fs::is_directory(file, ec)) file /= "tokenizer.json";
    if (!fs::is_regular_file(file, ec))
        throw Error(file.string() + ": no such file (expected a HF tokenizer.json or a folder with one)");
    const std::string src = file.string();
    const json tok = parse_json(src);
    auto fail = [&](const std::string& what) { throw Error(src + ": " + what); };
    if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object()) fail("no 'model' object");
    const json& model = tok["model"];
    if (model.value("type", std::string("BPE")) != "BPE")
        fail("model type '" + model.value("type", std::string()) + "' is not BPE; only byte-level BPE is supported");
    if (!model.contains("vocab") || !model["vocab"].is_object()) fail("'model.vocab' is missing or not an object");
    auto nonempty_string = [&](const char* key) {
        return model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty();
    };
    if (nonempty_string("continuing_subword_prefix") || nonempty_string("end_of_word_suffix"))
        fail("BPE with a subword prefix or suffix is not supported");
    if (model.value("byte_fallback", false)) fail("BPE with byte_fallback is not supported (not byte-level)");
    if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0.0)
        fail("BPE dropout is not supported");

    Spec spec;
    spec.source = src;
    spec.ignore_merges = model.value("ignore_merges", false);
    int64_t max_id = -1;
    std::vector<std::pair<std::string, int64_t>> entries;
    entries.reserve(model["vocab"].size());
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it->is_number_integer()) fail("vocab entry '" + it.key() + "' has a non-integer id");
        const int64_t id = it->get<int64_t>();
        if (id < 0 || id > INT32_MAX) fail("vocab entry '" + it.key() + "' has id " + std::to_string(id));
        entries.emplace_back(it.key(), id);
        max_id = std::max(max_id, id);
    }
    if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
        for (const json& at : tok["added_tokens"]) {
            if (!at.is_object() || !at.contains("id") || !at["id"].is_number_integer() || !at.contains("content") ||
                !at["content"].is_string())
                fail("an added_tokens entry lacks an integer 'id' or a string 'content'");
            AddedToken a;
            const int64_t id = at["id"].get<int64_t>();
            if (id < 0 || id > INT32_MAX) fail("added token id " + std::to_string(id) + " is out of range");
            a.id = static_cast<int32_t>(id);
            a.content = at["content"].get<std::string>();
            a.special = at.value("special", false) || looks_special(a.content);
            a.lstrip = at.value("lstrip", false);
            a.rstrip = at.value("rstrip", false);
            a.single_word = at.value("single_word", false);
            a.normalized = at.value("normalized", !at.value("special", false));
            max_id = std::max(max_id, id);
            spec.added.push_back(std::move(a));
        }
    }
    if (max_id > 4'000'000) fail("token ids up to " + std::to_string(max_id) + " are implausibly large");
    spec.tokens.assign(static_cast<size_t>(max_id + 1), std::string());
    spec.special.assign(spec.tokens.size(), false);
    for (auto& [text, id] : entries) spec.tokens[static_cast<size_t>(id)] = std::move(text);
    for (const AddedToken& a : spec.added) {
        spec.tokens[static_cast<size_t>(a.id)] = a.content;
        spec.special[static_cast<size_t>(a.id)] = a.special;
    }
    if (model.contains("merges")) {
        if (!model["merges"].is_array()) fail("'model.merges' is not a list");
        for (const json& m : model["merges"]) {
            if (m.is_string()) {
                const std::string s = m.get<std::string>();
                const size_t sp = s.find(' ', 1);
                if (sp == std::string::npos) fail("merge '" + s + "' has no space between its parts");
                spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
            } else {
                fail("a merges entry is neither \"a b\" nor [\"a\", \"b\"]");
            }
        }
    }

    // Normalizer: none or NFC (alone or in a Sequence).
    spec.nfc = false;
    if (tok.contains("normalizer") && !tok["normalizer"].is_null()) {
        const json& norm = tok["normalizer"];
        std::vector<json> parts;
        if (norm.value("type", "") == "Sequence" && norm.contains("normalizers") && norm["normalizers"].is_array())
            parts.assign(norm["normalizers"].begin(), norm["normalizers"].end());
        else
            parts.push_back(norm);
        for (const json& p : parts) {
            const std::string type = p.is_object() ? p.value("type", "") : "";
            if (type != "NFC") fail("normalizer '" + type + "' is not supported (only NFC)");
            spec.nfc = true;
        }
    }

    // Pre-tokenizer: Split(Regex, Isolated) + ByteLevel(use_regex = false), or ByteLevel(use_regex = true).
    std::vector<json> pres;
    if (tok.contains("pre_tokenizer") && tok["pre_tokenizer"].is_object()) {
        const json& pt = tok["pre_tokenizer"];
        if (pt.value("type", "") == "Sequence" && pt.contains("pretokenizers") && pt["pretokenizers"].is_array())
            pres.assign(pt["pretokenizers"].begin(), pt["pretokenizers"].end());
        else
            pres.push_back(pt);
    }
    std::optional<std::string> pattern;
    bool byte_level = false;
    for (const json& p : pres) {
        const std::string type = p.is_object() ? p.value("type", "") : "";
        if (type == "Split") {
            if (pattern) fail("more than one Split pre-tokenizer is not supported");
            if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex") ||
                !p["pattern"]["Regex"].is_string())
                fail("a Split pre-tokenizer without a Regex pattern is not supported");
            if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
                fail("only Split pre-tokenizers with behavior Isolated are supported");
            pattern = p["pattern"]["Regex"].get<std::string>();
        } else if (type == "ByteLevel") {
            byte_level = true;
            if (p.value("add_prefix_space", false)) fail("ByteLevel with add_prefix_space is not supported");
            if (p.value("use_regex", true)) {
                if (pattern) fail("ByteLevel(use_regex) after a Split is not supported");
                pattern = kGpt2Pattern;
            }
        } else {
            fail("pre-tokenizer '" + type + "' is not supported (byte-level BPE: Split + ByteLevel)");
        }
    }
    if (!byte_level) fail("the pre-tokenizer has no ByteLevel step; only byte-level BPE is supported");
    if (!pattern) pattern = std::string();
    if (*pattern == kQwen2Pattern) {
        spec.pre = Spec::Pre::Qwen2;
    } else if (*pattern == kQwen35Pattern) {
        spec.pre = Spec::Pre::Qwen35;
    } else if (pattern->empty()) {
        fail("no pre-tokenizer regex (a whole text as one BPE word is not supported)");
    } else {
        spec.pre = Spec::Pre::Regex;
        spec.regex = *pattern;
    }

    // tokenizer_config.json: bos / eos and the chat template; chat_template.jinja as a fallback.
    auto id_for = [&](const std::optional<std::string>& text) -> std::optional<int32_t> {
        if (!text) return std::nullopt;
        for (const AddedToken& a : spec.added)
            if (a.content == *text) return a.id;
        for (size_t i = 0; i < spec.tokens.size(); ++i)
            if (spec.tokens[i] == *text) return static_cast<int32_t>(i);
        return std::nullopt;
    };
    const fs::path dir = file.parent_path();
    const fs::path cfg_path = dir / "tokenizer_config.json";
    if (fs::is_regular_file(cfg_path, ec)) {
        const json cfg = parse_json(cfg_path.string());
        if (cfg.is_object()) {
            spec.bos_id = id_for(config_token_text(cfg, "bos_token"));
            spec.eos_id = id_for(config_token_text(cfg, "eos_token"));
            if (cfg.contains("chat_template")) {
                const json& ct = cfg["chat_template"];
                if (ct.is_string()) {
                    spec.chat_template = ct.get<std::string>();
                } else if (ct.is_array()) {  // [{"name": ..., "template": ...}]: "default", else the first
                    for (const json& e : ct) {
                        if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
                        if (spec.chat_template.empty() || e.value("name", "") == "default")
                            spec.chat_template = e["template"].get<std::string>();
                    }
                }
            }
        }
    }
    const fs::path jinja = dir / "chat_template.jinja";
    if (spec.chat_template.empty() && fs::is_regular_file(jinja, ec))
        spec.chat_template = read_text_file(jinja.string());
    return build(std::move(spec));
}

}  // namespace strata
