#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/error.h"
#include "format/hf_tokenizer.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_spec.h"
#include "tokenizer/unicode.h"

namespace strata {

namespace {

bool is_whitespace_at(std::string_view s, size_t pos, size_t& len) {
    size_t p = pos;
    uint32_t cp = unicode::next_cp(s, p);
    len = p - pos;
    return unicode::char_class(cp) == unicode::CharClass::Space;
}

// Length of the UTF-8 character that ends at s[end-1] (s valid UTF-8, end > 0).
size_t char_len_before(std::string_view s, size_t end) {
    size_t k = end - 1;
    while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
    return end - k;
}

bool is_word_char_at(std::string_view s, size_t pos) {
    size_t p = pos;
    uint32_t cp = unicode::next_cp(s, p);
    auto c = unicode::char_class(cp);
    return cp == '_' || c == unicode::CharClass::Letter || c == unicode::CharClass::Number;
}

}  // namespace

// Finds added tokens in text: at the leftmost position where any token occurs, the longest one there.
class Tokenizer::AddedMatcher {
public:
    AddedMatcher(const std::vector<AddedToken>& all, bool normalized) : all_(all) {
        for (size_t i = 0; i < all.size(); ++i) {
            if (all[i].normalized != normalized || all[i].content.empty()) continue;
            buckets_[static_cast<uint8_t>(all[i].content[0])].push_back(i);
        }
        for (auto& b : buckets_) {
            std::stable_sort(b.begin(), b.end(),
                             [&](size_t x, size_t y) { return all_[x].content.size() > all_[y].content.size(); });
            empty_ = empty_ && b.empty();
        }
    }
    bool empty() const { return empty_; }

    struct Match {
        size_t start, end;  // including stripped whitespace
        int32_t id;
    };
    // The first match at or after `from`.
    std::optional<Match> find(std::string_view text, size_t from, bool parse_special) const {
        for (size_t pos = from; pos < text.size(); ++pos) {
            const auto& bucket = buckets_[static_cast<uint8_t>(text[pos])];
            if (bucket.empty()) continue;
            for (size_t idx : bucket) {
                const AddedToken& t = all_[idx];
                if (!parse_special && t.special) continue;
                if (t.content.size() > text.size() - pos ||
                    std::memcmp(text.data() + pos, t.content.data(), t.content.size()) != 0)
                    continue;
                size_t start = pos, end = pos + t.content.size();
                if (t.single_word) {
                    if (start > 0 && is_word_char_at(text, start - char_len_before(text, start))) continue;
                    if (end < text.size() && is_word_char_at(text, end)) continue;
                }
                if (t.lstrip) {
                    while (start > from) {
                        size_t cl = char_len_before(text, start), len = 0;
                        if (!is_whitespace_at(text, start - cl, len)) break;
                        start -= cl;
                    }
                }
                if (t.rstrip) {
                    size_t len = 0;
                    while (end < text.size() && is_whitespace_at(text, end, len)) end += len;
                }
                return Match{start, end, t.id};
            }
        }
        return std::nullopt;
    }

private:
    const std::vector<AddedToken>& all_;
    std::array<std::vector<size_t>, 256> buckets_;
    bool empty_ = true;
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::build(Spec spec) {
    std::unique_ptr<Tokenizer> t(new Tokenizer());
    const size_t n = spec.tokens.size();
    if (n == 0) throw Error(spec.source + ": the vocabulary is empty");
    t->token_text_ = std::move(spec.tokens);
    t->special_ = std::move(spec.special);
    t->special_.resize(n, false);
    t->added_ = std::move(spec.added);
    t->nfc_ = spec.nfc;
    t->chat_template_ = std::move(spec.chat_template);
    auto in_range = [&](std::optional<int32_t> id) -> std::optional<int32_t> {
        if (id && *id >= 0 && static_cast<size_t>(*id) < n) return id;
        return std::nullopt;
    };
    t->bos_id_ = in_range(spec.bos_id);
    t->eos_id_ = in_range(spec.eos_id);
    t->eot_id_ = in_range(spec.eot_id);
    t->eom_id_ = in_range(spec.eom_id);

    // Ordinary tokens by text (for merges); added tokens take precedence in find_token.
    std::vector<bool> is_added(n, false);
    for (const AddedToken& a : t->added_) {
        if (a.id < 0 || static_cast<size_t>(a.id) >= n)
            throw Error(spec.source + ": added token '" + a.content + "' has id " + std::to_string(a.id) +
                        " outside the vocabulary of " + std::to_string(n));
        is_added[static_cast<size_t>(a.id)] = true;
    }
    std::unordered_map<std::string, int32_t> vocab;
    vocab.reserve(n * 2);
    for (size_t i = 0; i < n; ++i) {
        if (is_added[i] || t->token_text_[i].empty()) continue;
        vocab.emplace(t->token_text_[i], static_cast<int32_t>(i));
    }
    for (const AddedToken& a : t->added_) t->id_of_text_.emplace(a.content, a.id);
    for (const auto& [text, id] : vocab) t->id_of_text_.emplace(text, id);

    // Decoded bytes of every token: GPT-2's byte map reversed; text that is not in that alphabet (and added
    // tokens) as it is.
    std::array<int, 0x200> byte_of{};
    byte_of.fill(-1);
    const auto& b2u = byte_to_unicode_table();
    for (int b = 0; b < 256; ++b) {
        size_t p = 0;
        uint32_t cp = unicode::next_cp(b2u[static_cast<size_t>(b)], p);
        byte_of[cp] = b;
    }
    t->token_bytes_.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const std::string& text = t->token_text_[i];
        if (is_added[i] || !unicode::is_valid_utf8(text)) {
            t->token_bytes_[i] = text;
            continue;
        }
        std::string bytes;
        bool mapped = true;
        for (size_t p = 0; p < text.size();) {
            uint32_t cp = unicode::next_cp(text, p);
            if (cp >= byte_of.size() || byte_of[cp] < 0) {
                mapped = false;
                break;
            }
            bytes += static_cast<char>(byte_of[cp]);
        }
        t->token_bytes_[i] = mapped ? std::move(bytes) : text;
    }

    std::vector<int32_t> byte_token(256, -1);
    for (int b = 0; b < 256; ++b) {
        auto it = vocab.find(b2u[static_cast<size_t>(b)]);
        if (it != vocab.end()) byte_token[static_cast<size_t>(b)] = it->second;
    }
    std::vector<Bpe::Merge> merges;
    std::vector<int32_t> results;
    merges.reserve(spec.merges.size());
    results.reserve(spec.merges.size());
    for (const auto& [left, right] : spec.merges) {
        auto l = vocab.find(left), r = vocab.find(right), m = vocab.find(left + right);
        if (l == vocab.end() || r == vocab.end() || m == vocab.end()) continue;  // cannot apply: HF refuses these
        merges.push_back({l->second, r->second});
        results.push_back(m->second);
    }
    std::unordered_map<std::string, int32_t> whole_words;
    if (spec.ignore_merges) whole_words = vocab;
    t->bpe_ = std::make_unique<Bpe>(std::move(byte_token), merges, results, spec.ignore_merges, std::move(whole_words));

    switch (spec.pre) {
        case Spec::Pre::Qwen2: t->pre_ = PreTokenizer::qwen2(); break;
        case Spec::Pre::Qwen35: t->pre_ = PreTokenizer::qwen35(); break;
        case Spec::Pre::Regex: t->pre_ = PreTokenizer::for_pattern(spec.regex); break;
    }
    t->raw_added_ = std::make_unique<AddedMatcher>(t->added_, false);
    t->normalized_added_ = std::make_unique<AddedMatcher>(t->added_, true);
    return t;
}

std::string Tokenizer::pre_tokenizer_name() const {
    switch (pre_->kind()) {
        case PreTokenizer::Kind::Qwen2: return "qwen2";
        case PreTokenizer::Kind::Qwen35: return "qwen35";
        case PreTokenizer::Kind::Regex: return "regex";
    }
    return "regex";
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
    thread_local std::vector<std::string_view> pieces;
    pieces.clear();
    pre_->split(text, pieces);
    for (std::string_view piece : pieces) bpe_->encode_word(piece, ids);
}

// A stretch of text between raw-matched added tokens: normalize, find normalized added tokens, encode the rest.
void Tokenizer::encode_segment(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const {
    if (text.empty()) return;
    std::string normalized;
    std::string_view view = text;
    if (nfc_) {
        normalized = unicode::nfc(text);
        view = normalized;
    }
    if (normalized_added_->empty()) {
        encode_plain(view, ids);
        return;
    }
    size_t pos = 0;
    while (pos < view.size()) {
        auto m = normalized_added_->find(view, pos, parse_special);
        if (!m) break;
        encode_plain(view.substr(pos, m->start - pos), ids);
        ids.push_back(m->id);
        pos = m->end;
    }
    encode_plain(view.substr(pos), ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
    std::string sanitized;
    if (!unicode::is_valid_utf8(text)) {
        sanitized = unicode::sanitize_utf8(text);
        text = sanitized;
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    size_t pos = 0;
    while (pos < text.size()) {
        auto m = raw_added_->empty() ? std::nullopt : raw_added_->find(text, pos, parse_special);
        if (!m) break;
        encode_segment(text.substr(pos, m->start - pos), parse_special, ids);
        ids.push_back(m->id);
        pos = m->end;
    }
    encode_segment(text.substr(pos), parse_special, ids);
    return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const {
    if (id < 0 || id >= n_vocab())
        throw Error("token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                    std::to_string(n_vocab() - 1) + ")");
    return token_bytes_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) {
        if (id < 0 || id >= n_vocab()) token_bytes(id);  // throws
        out += token_bytes_[static_cast<size_t>(id)];
    }
    return out;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
    auto it = id_of_text_.find(std::string(text));
    if (it == id_of_text_.end()) return std::nullopt;
    return it->second;
}

bool Tokenizer::is_special(int32_t id) const {
    return id >= 0 && id < n_vocab() && special_[static_cast<size_t>(id)];
}

std::vector<int32_t> Tokenizer::eog_ids() const {
    std::vector<int32_t> out;
    auto add = [&](std::optional<int32_t> id) {
        if (id && std::find(out.begin(), out.end(), *id) == out.end()) out.push_back(*id);
    };
    add(eos_id_);
    add(eot_id_);
    add(eom_id_);
    add(find_token("<|im_end|>"));
    add(find_token("<|endoftext|>"));
    return out;
}

std::string StreamDecoder::drain(bool final) {
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        auto st = unicode::utf8_step(pending_, i);
        if (st.status == unicode::Utf8Step::Status::Truncated && !final) break;  // wait for more bytes
        if (st.status == unicode::Utf8Step::Status::Ok)
            out.append(pending_, i, st.len);
        else
            unicode::append_utf8(out, unicode::kReplacement);
        i += st.len;
    }
    pending_.erase(0, i);
    return out;
}

std::string StreamDecoder::push(int32_t id) {
    pending_ += tokenizer_.token_bytes(id);
    return drain(false);
}

std::string StreamDecoder::flush() { return drain(true); }

}  // namespace strata
