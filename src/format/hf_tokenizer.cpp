#include "format/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

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

const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string pre_tokenizer_name(const std::string& pattern) {
    if (pattern == kQwen2Pattern) return "qwen2";
    if (pattern == kQwen35Pattern) return "qwen35";
    if (pattern == kGpt2Pattern) return "gpt-2";
    return "";
}

HfTokenizerJson read_hf_tokenizer_json(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path file = path;
    if (fs::is_directory(file, ec)) file /= "tokenizer.json";
    if (!fs::is_regular_file(file, ec))
        throw Error(file.string() + ": no such file (expected a HF tokenizer.json or a folder with one)");
    HfTokenizerJson t;
    t.source = file.string();
    const json tok = parse_json_file(t.source);
    auto fail = [&](const std::string& what) { throw Error(t.source + ": " + what); };
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
    t.ignore_merges = model.value("ignore_merges", false);

    auto checked_id = [&](int64_t id, const std::string& what) {
        if (id < 0 || id > 4'000'000) fail(what + " has id " + std::to_string(id) + ", outside 0..4000000");
        t.max_id = std::max(t.max_id, static_cast<int32_t>(id));
        return static_cast<int32_t>(id);
    };
    t.vocab.reserve(model["vocab"].size());
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it->is_number_integer()) fail("vocab entry '" + it.key() + "' has a non-integer id");
        t.vocab.emplace_back(it.key(), checked_id(it->get<int64_t>(), "vocab entry '" + it.key() + "'"));
    }
    if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
        for (const json& at : tok["added_tokens"]) {
            if (!at.is_object() || !at.contains("id") || !at["id"].is_number_integer() || !at.contains("content") ||
                !at["content"].is_string())
                fail("an added_tokens entry lacks an integer 'id' or a string 'content'");
            HfAddedToken a;
            a.content = at["content"].get<std::string>();
            a.id = checked_id(at["id"].get<int64_t>(), "added token '" + a.content + "'");
            a.special = at.value("special", false) || looks_special(a.content);
            a.lstrip = at.value("lstrip", false);
            a.rstrip = at.value("rstrip", false);
            a.single_word = at.value("single_word", false);
            a.normalized = at.value("normalized", !at.value("special", false));
            t.added.push_back(std::move(a));
        }
    }
    if (model.contains("merges")) {
        if (!model["merges"].is_array()) fail("'model.merges' is not a list");
        t.merges.reserve(model["merges"].size());
        for (const json& m : model["merges"]) {
            if (m.is_string()) {
                const std::string s = m.get<std::string>();
                const size_t sp = s.find(' ', 1);
                if (sp == std::string::npos) fail("merge '" + s + "' has no space between its parts");
                t.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                t.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
            } else {
                fail("a merges entry is neither \"a b\" nor [\"a\", \"b\"]");
            }
        }
    }

    // Normalizer: none or NFC (alone or in a Sequence).
    if (tok.contains("normalizer") && !tok["normalizer"].is_null()) {
        const json& norm = tok["normalizer"];
        std::vector<json> parts;
        if (norm.value("type", "") == "Sequence" && norm.contains("normalizers") && norm["normalizers"].is_array())
            parts.assign(norm["normalizers"].begin(), norm["normalizers"].end());
        else
            parts.push_back(norm);
        for (const json& part : parts) {
            const std::string type = part.is_object() ? part.value("type", "") : "";
            if (type != "NFC") fail("normalizer '" + type + "' is not supported (only NFC)");
            t.nfc = true;
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
    bool byte_level = false;
    for (const json& pre : pres) {
        const std::string type = pre.is_object() ? pre.value("type", "") : "";
        if (type == "Split") {
            if (!t.pattern.empty()) fail("more than one Split pre-tokenizer is not supported");
            if (!pre.contains("pattern") || !pre["pattern"].is_object() || !pre["pattern"].contains("Regex") ||
                !pre["pattern"]["Regex"].is_string())
                fail("a Split pre-tokenizer without a Regex pattern is not supported");
            if (pre.value("behavior", "") != "Isolated" || pre.value("invert", false))
                fail("only Split pre-tokenizers with behavior Isolated are supported");
            t.pattern = pre["pattern"]["Regex"].get<std::string>();
        } else if (type == "ByteLevel") {
            byte_level = true;
            if (pre.value("add_prefix_space", false)) fail("ByteLevel with add_prefix_space is not supported");
            if (pre.value("use_regex", true)) {
                if (!t.pattern.empty()) fail("ByteLevel(use_regex) after a Split is not supported");
                t.pattern = kGpt2Pattern;
            }
        } else {
            fail("pre-tokenizer '" + type + "' is not supported (byte-level BPE: Split + ByteLevel)");
        }
    }
    if (!byte_level) fail("the pre-tokenizer has no ByteLevel step; only byte-level BPE is supported");
    if (t.pattern.empty()) fail("no pre-tokenizer regex (a whole text as one BPE word is not supported)");

    // tokenizer_config.json: special token ids, add_bos, the chat template; chat_template.jinja as a fallback.
    auto id_for = [&](const std::optional<std::string>& text) -> std::optional<int32_t> {
        if (!text) return std::nullopt;
        for (const HfAddedToken& a : t.added)
            if (a.content == *text) return a.id;
        for (const auto& [content, id] : t.vocab)
            if (content == *text) return id;
        return std::nullopt;
    };
    const fs::path dir = file.parent_path();
    const fs::path cfg_path = dir / "tokenizer_config.json";
    if (fs::is_regular_file(cfg_path, ec)) {
        const json cfg = parse_json_file(cfg_path.string());
        if (cfg.is_object()) {
            t.bos_id = id_for(token_text(cfg, "bos_token"));
            t.eos_id = id_for(token_text(cfg, "eos_token"));
            t.pad_id = id_for(token_text(cfg, "pad_token"));
            if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
                t.add_bos = cfg["add_bos_token"].get<bool>();
            if (cfg.contains("chat_template")) {
                const json& ct = cfg["chat_template"];
                if (ct.is_string()) {
                    t.chat_template = ct.get<std::string>();
                } else if (ct.is_array()) {  // [{"name": ..., "template": ...}]: the default one, else the first
                    for (const json& e : ct) {
                        if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
                        if (t.chat_template.empty() || e.value("name", "") == "default")
                            t.chat_template = e["template"].get<std::string>();
                    }
                }
            }
        }
    }
    const fs::path jinja = dir / "chat_template.jinja";
    if (t.chat_template.empty() && fs::is_regular_file(jinja, ec)) t.chat_template = read_file(jinja.string());
    return t;
}

std::optional<HfVocab> load_hf_tokenizer(const HfTokenizerOptions& o) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_regular_file(fs::path(o.dir) / "tokenizer.json", ec)) return std::nullopt;
    const HfTokenizerJson t = read_hf_tokenizer_json(o.dir);
    const int64_t n_vocab = o.vocab_size;
    HfVocab v;
    v.pre = pre_tokenizer_name(t.pattern);
    if (v.pre.empty())
        throw Error(t.source + ": the pre-tokenizer regex is none of those llama.cpp names (qwen2, qwen35, gpt-2)");
    v.tokens.assign(static_cast<size_t>(n_vocab), std::string());
    v.token_types.assign(static_cast<size_t>(n_vocab), static_cast<int32_t>(TokenType::Unused));
    std::vector<bool> filled(static_cast<size_t>(n_vocab), false);
    auto place = [&](const std::string& text, int64_t id, TokenType type) {
        if (id >= n_vocab)
            throw Error(t.source + ": token '" + text + "' has id " + std::to_string(id) +
                        ", outside the model's vocab_size " + std::to_string(n_vocab));
        v.tokens[static_cast<size_t>(id)] = text;
        v.token_types[static_cast<size_t>(id)] = static_cast<int32_t>(type);
        filled[static_cast<size_t>(id)] = true;
    };
    for (const auto& [text, id] : t.vocab) place(text, id, TokenType::Normal);
    for (const HfAddedToken& a : t.added) place(a.content, a.id, a.special ? TokenType::Control : TokenType::UserDefined);
    for (int64_t i = 0; i < n_vocab; ++i)
        if (!filled[static_cast<size_t>(i)]) v.tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
    v.merges.reserve(t.merges.size());
    for (const auto& [left, right] : t.merges) v.merges.push_back(left + " " + right);
    auto to_u32 = [](std::optional<int32_t> id) -> std::optional<uint32_t> {
        return id ? std::optional<uint32_t>(static_cast<uint32_t>(*id)) : std::nullopt;
    };
    v.bos_id = to_u32(t.bos_id);
    v.eos_id = to_u32(t.eos_id);
    v.pad_id = to_u32(t.pad_id);
    v.add_bos = t.add_bos;
    v.chat_template = t.chat_template;
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
