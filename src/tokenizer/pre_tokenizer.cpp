#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace strata {

namespace {

using unicode::CharClass;

// The Qwen regexes, alternative by alternative, with the regex engine's leftmost-first / greedy-with-backtracking
// semantics worked out by hand. `marks_are_letters` is the only difference between qwen2 and qwen35: qwen35's letter
// run takes \p{M} and its punctuation run excludes it.
class QwenPreTokenizer final : public PreTokenizer {
public:
    explicit QwenPreTokenizer(bool marks_are_letters) : marks_are_letters_(marks_are_letters) {}
    Kind kind() const override { return marks_are_letters_ ? Kind::Qwen35 : Kind::Qwen2; }

    void split(std::string_view text, std::vector<std::string_view>& out) const override {
        thread_local std::vector<uint32_t> cps;
        thread_local std::vector<uint8_t> cls;
        thread_local std::vector<uint32_t> offs;
        cps.clear();
        cls.clear();
        offs.clear();
        for (size_t pos = 0; pos < text.size();) {
            offs.push_back(static_cast<uint32_t>(pos));
            uint32_t cp = unicode::next_cp(text, pos);
            cps.push_back(cp);
            cls.push_back(static_cast<uint8_t>(unicode::char_class(cp)));
        }
        offs.push_back(static_cast<uint32_t>(text.size()));
        const size_t n = cps.size();
        size_t i = 0;
        while (i < n) {
            size_t end = match(cps.data(), cls.data(), n, i);
            out.push_back(text.substr(offs[i], offs[end] - offs[i]));
            i = end;
        }
    }

private:
    bool marks_are_letters_;

    static uint32_t fold(uint32_t cp) {
        if (cp >= 'A' && cp <= 'Z') return cp + 32;
        if (cp == 0x17F) return 's';  // LATIN SMALL LETTER LONG S case-folds to s (the oracle agrees)
        return cp;
    }

    // Returns the end (exclusive) of the piece that starts at i.
    size_t match(const uint32_t* cp, const uint8_t* cls_raw, size_t n, size_t i) const {
        auto cls = [&](size_t k) { return static_cast<CharClass>(cls_raw[k]); };
        auto is_letter = [&](size_t k) {
            return cls(k) == CharClass::Letter || (marks_are_letters_ && cls(k) == CharClass::Mark);
        };
        auto is_number = [&](size_t k) { return cls(k) == CharClass::Number; };
        auto is_space = [&](size_t k) { return cls(k) == CharClass::Space; };
        auto is_newline = [&](size_t k) { return cp[k] == '\r' || cp[k] == '\n'; };
        auto is_punct = [&](size_t k) { return !is_space(k) && !is_letter(k) && !is_number(k); };

        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if (cp[i] == '\'' && i + 1 < n) {
            const uint32_t a = fold(cp[i + 1]);
            if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
            if (i + 2 < n) {
                const uint32_t b = fold(cp[i + 2]);
                if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+   (qwen35: [\p{L}\p{M}]+)
        {
            size_t start = n;
            if (is_letter(i)) {
                start = i;
            } else if (!is_newline(i) && cls(i) != CharClass::Letter && !is_number(i) && i + 1 < n &&
                       is_letter(i + 1)) {
                start = i + 1;
            }
            if (start < n) {
                size_t k = start;
                while (k < n && is_letter(k)) ++k;
                return k;
            }
        }
        // \p{N}
        if (is_number(i)) return i + 1;
        // " ?[^\s\p{L}\p{N}]+[\r\n]*"
        {
            size_t j = (cp[i] == ' ' && i + 1 < n && is_punct(i + 1)) ? i + 1 : i;
            if (is_punct(j)) {
                size_t k = j;
                while (k < n && is_punct(k)) ++k;
                while (k < n && is_newline(k)) ++k;
                return k;
            }
        }
        if (is_space(i)) {
            size_t j = i;
            size_t last_newline = n;
            while (j < n && is_space(j)) {
                if (is_newline(j)) last_newline = j;
                ++j;
            }
            // \s*[\r\n]+ : up to the last newline of the run
            if (last_newline < n) return last_newline + 1;
            // \s+(?!\S) : the whole run at the end of the text, else all but its last character
            if (j == n) return j;
            if (j - i >= 2) return j - 1;
            // \s+
            return j;
        }
        return i + 1;  // not reached: every code point is a letter, number, space or punctuation
    }
};

class RegexPreTokenizer final : public PreTokenizer {
public:
    explicit RegexPreTokenizer(const std::string& pattern) {
        int err = 0;
        PCRE2_SIZE err_offset = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                              &err, &err_offset, nullptr);
        if (code_ == nullptr) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            throw Error("pre-tokenizer regex does not compile at offset " + std::to_string(err_offset) + ": " +
                        reinterpret_cast<const char*>(msg));
        }
        jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    }
    ~RegexPreTokenizer() override { pcre2_code_free(code_); }
    RegexPreTokenizer(const RegexPreTokenizer&) = delete;
    RegexPreTokenizer& operator=(const RegexPreTokenizer&) = delete;

    Kind kind() const override { return Kind::Regex; }

    void split(std::string_view text, std::vector<std::string_view>& out) const override {
        pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        size_t gap_start = 0;
        size_t pos = 0;
        while (pos <= text.size()) {
            int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr)
                          : pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
            if (rc < 0) break;
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            const size_t ms = ov[0], me = ov[1];
            if (me == ms) {  // empty match: step one character on
                if (ms >= text.size()) break;
                size_t p = ms;
                unicode::next_cp(text, p);
                pos = p;
                continue;
            }
            if (ms > gap_start) out.push_back(text.substr(gap_start, ms - gap_start));
            out.push_back(text.substr(ms, me - ms));
            gap_start = pos = me;
        }
        if (gap_start < text.size()) out.push_back(text.substr(gap_start));
        pcre2_match_data_free(md);
    }

private:
    pcre2_code* code_ = nullptr;
    bool jit_ = false;
};

}  // namespace

std::unique_ptr<PreTokenizer> PreTokenizer::qwen2() { return std::make_unique<QwenPreTokenizer>(false); }
std::unique_ptr<PreTokenizer> PreTokenizer::qwen35() { return std::make_unique<QwenPreTokenizer>(true); }
std::unique_ptr<PreTokenizer> PreTokenizer::regex(const std::string& pattern) {
    return std::make_unique<RegexPreTokenizer>(pattern);
}
std::unique_ptr<PreTokenizer> PreTokenizer::for_pattern(const std::string& pattern) {
    if (pattern == kQwen2Pattern) return qwen2();
    if (pattern == kQwen35Pattern) return qwen35();
    return regex(pattern);
}

}  // namespace strata
