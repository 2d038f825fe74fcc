#include "format/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace strata {

using nlohmann::json;

namespace {

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

json parse_json_file(const std::string& path) {
    try {
        return json::parse(read_file(path));
    } catch (const json::exception& e) {
        throw Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
    }
}

std::string utf8_of(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

// Collects every "Regex" string in a pre_tokenizer tree (Sequence / Split nest them).
void collect_regexes(const json& node, std::vector<std::string>& out) {
    if (node.is_object()) {
        for (auto it = node.begin(); it != node.end(); ++it) {
            if (it.key() == "Regex" && it->is_string())
                out.push_back(it->get<std::string>());
            else
                collect_regexes(*it, out);
        }
    } else if (node.is_array()) {
        for (const json& e : node) collect_regexes(e, out);
    }
}

// tokenizer_config's special token fields are a string or {"content": ...}.
std::optional<std::string> token_text(const json& cfg, const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        return (*it)["content"].get<std::string>();
    return std::nullopt;
}

// Tokens such as <|im_end|> or <think> are treated as control even when not flagged special (llama.cpp's
// converter does the same).
bool looks_special(const std::string& t) {
    auto starts = [&](const char* p) { return t.rfind(p, 0) == 0; };
    auto ends = [&](const std::string& p) {
        return t.size() >= p.size() && t.compare(t.size() - p.size(), p.size(), p) == 0;
    };
    if (starts("<|") && ends("|>") && t.size() > 4) return true;
    return starts("<｜") && ends("｜>");
}

}  // namespace

const std::vector<std::string>& byte_to_unicode_table() {
    static const std::vector<std::string> table = [] {
        std::vector<std::string> t(256);
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            t[b] = utf8_of(printable ? b : next++);
        }
        return t;
    }();
    return table;
}

std::string detect_pre_tokenizer(const std::string& regex) {
    return regex.find("\\p{M}") != std::string::npos ? "qwen35" : "qwen2";
}

std::optional<HfVocab> load_hf_tokenizer(const HfTokenizerOptions& o) {
    namespace fs = std::filesystem;
    const std::string tok_path = o.dir + "/tokenizer.json";
    if (!fs::exists(tok_path)) return std::nullopt;
    const json tok = parse_json_file(tok_path);
    auto fail = [&](const std::string& what) -> void { throw Error(tok_path + ": " + what); };

    if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object()) fail("no 'model' object");
    const json& model = tok["model"];
    if (model.contains("type") && model["type"].is_string() && model["type"].get<std::string>() != "BPE")
        fail("model type '" + model["type"].get<std::string>() + "' is not BPE; only byte-level BPE is supported");
    if (!model.contains("vocab") || !model["vocab"].is_object()) fail("'model.vocab' is missing or not an object");

    const int64_t n_vocab = o.vocab_size;
    HfVocab v;
    v.tokens.assign(static_cast<size_t>(n_vocab), std::string());
    v.token_types.assign(static_cast<size_t>(n_vocab), static_cast<int32_t>(TokenType::Unused));
    std::vector<bool> filled(static_cast<size_t>(n_vocab), false);
    std::unordered_map<std::string, int64_t> id_of;

    auto place = [&](const std::string& text, int64_t id, TokenType type) {
        if (id < 0 || id >= n_vocab)
            fail("token '" + text + "' has id " + std::to_string(id) + ", outside the model's vocab_size " +
                 std::to_string(n_vocab));
        v.tokens[static_cast<size_t>(id)] = text;
        v.token_types[static_cast<size_t>(id)] = static_cast<int32_t>(type);
        filled[static_cast<size_t>(id)] = true;
        id_of[text] = id;
    };
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it->is_number_integer()) fail("vocab entry '" + it.key() + "' has a non-integer id");
        place(it.key(), it->get<int64_t>(), TokenType::Normal);
    }
    if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
        for (const json& at : tok["added_tokens"]) {
            if (!at.is_object() || !at.contains("id") || !at["id"].is_number_integer() || !at.contains("content") ||
                !at["content"].is_string())
                fail("an added_tokens entry lacks an integer 'id' or a string 'content'");
            const std::string text = at["content"].get<std::string>();
            const bool special = at.value("special", false);
            place(text, at["id"].get<int64_t>(),
                  special || looks_special(text) ? TokenType::Control : TokenType::UserDefined);
        }
    }
    for (int64_t i = 0; i < n_vocab; ++i) {
        if (!filled[static_cast<size_t>(i)]) v.tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
    }

    if (model.contains("merges")) {
        if (!model["merges"].is_array()) fail("'model.merges' is not a list");
        v.merges.reserve(model["merges"].size());
        for (const json& m : model["merges"]) {
            if (m.is_string()) {
                v.merges.push_back(m.get<std::string>());
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
            } else {
                fail("a merges entry is neither \"a b\" nor [\"a\", \"b\"]");
            }
        }
    }

    std::vector<std::string> regexes;
    if (tok.contains("pre_tokenizer")) collect_regexes(tok["pre_tokenizer"], regexes);
    v.pre = "qwen2";
    for (const std::string& r : regexes)
        if (detect_pre_tokenizer(r) == "qwen35") v.pre = "qwen35";

    auto id_for = [&](const std::optional<std::string>& text) -> std::optional<uint32_t> {
        if (!text) return std::nullopt;
        auto it = id_of.find(*text);
        if (it == id_of.end()) return std::nullopt;
        return static_cast<uint32_t>(it->second);
    };
    const std::string cfg_path = o.dir + "/tokenizer_config.json";
    if (fs::exists(cfg_path)) {
        const json cfg = parse_json_file(cfg_path);
        if (cfg.is_object()) {
            v.eos_id = id_for(token_text(cfg, "eos_token"));
            v.pad_id = id_for(token_text(cfg, "pad_token"));
            v.bos_id = id_for(token_text(cfg, "bos_token"));
            if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
                v.add_bos = cfg["add_bos_token"].get<bool>();
            if (cfg.contains("chat_template")) {
                const json& ct = cfg["chat_template"];
                if (ct.is_string()) {
                    v.chat_template = ct.get<std::string>();
                } else if (ct.is_array()) {  // [{"name": ..., "template": ...}]: the default one, else the first
                    for (const json& e : ct) {
                        if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
                        if (v.chat_template.empty() || e.value("name", "") == "default")
                            v.chat_template = e["template"].get<std::string>();
                    }
                }
            }
        }
    }
    if (v.chat_template.empty() && fs::exists(o.dir + "/chat_template.jinja"))
        v.chat_template = read_file(o.dir + "/chat_template.jinja");
    if (!v.eos_id && o.fallback_eos && *o.fallback_eos >= 0 && *o.fallback_eos < n_vocab)
        v.eos_id = static_cast<uint32_t>(*o.fallback_eos);
    return v;
}

HfVocab placeholder_vocab(int64_t vocab_size, std::optional<int64_t> eos_id) {
    if (vocab_size < 256)
        throw Error("a placeholder vocabulary needs vocab_size >= 256 (the byte tokens), got " +
                    std::to_string(vocab_size));
    HfVocab v;
    v.pre = "qwen2";
    const auto& bytes = byte_to_unicode_table();
    v.tokens.reserve(static_cast<size_t>(vocab_size));
    for (int b = 0; b < 256; ++b) {
        v.tokens.push_back(bytes[static_cast<size_t>(b)]);
        v.token_types.push_back(static_cast<int32_t>(TokenType::Normal));
    }
    for (int64_t i = 256; i < vocab_size; ++i) {
        v.tokens.push_back("<|placeholder_" + std::to_string(i) + "|>");
        v.token_types.push_back(static_cast<int32_t>(TokenType::Control));
    }
    if (eos_id && *eos_id >= 256 && *eos_id < vocab_size) {
        v.tokens[static_cast<size_t>(*eos_id)] = "<|endoftext|>";
        v.eos_id = static_cast<uint32_t>(*eos_id);
    }
    return v;
}

void add_vocab_keys(gguf::Writer& w, const HfVocab& v) {
    using gguf::Value;
    w.set("tokenizer.ggml.model", Value::of_str("gpt2"));
    w.set("tokenizer.ggml.pre", Value::of_str(v.pre));
    w.set("tokenizer.ggml.tokens", Value::of_str_array(v.tokens));
    w.set("tokenizer.ggml.token_type", Value::of_i32_array(v.token_types));
    w.set("tokenizer.ggml.merges", Value::of_str_array(v.merges));
    if (v.bos_id) w.set("tokenizer.ggml.bos_token_id", Value::of_u32(*v.bos_id));
    if (v.eos_id) w.set("tokenizer.ggml.eos_token_id", Value::of_u32(*v.eos_id));
    if (v.pad_id) w.set("tokenizer.ggml.padding_token_id", Value::of_u32(*v.pad_id));
    w.set("tokenizer.ggml.add_bos_token", Value::of_bool(v.add_bos));
    if (!v.chat_template.empty()) w.set("tokenizer.chat_template", Value::of_str(v.chat_template));
}

}  // namespace strata
