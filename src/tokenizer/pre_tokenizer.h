// Splits text into the words that BPE merges within. The Qwen2 and Qwen3.5 regexes (shared/reference/
// gguf-qwen4exp.md section 5) run as hand-written matchers over HF tokenizers' Unicode classes; any other regex
// from a tokenizer.json runs through PCRE2 (JIT, Unicode properties of PCRE2's own Unicode version).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "format/hf_tokenizer.h"

namespace strata {

class PreTokenizer {
public:
    enum class Kind { Qwen2, Qwen35, Regex };

    static std::unique_ptr<PreTokenizer> qwen2();
    static std::unique_ptr<PreTokenizer> qwen35();
    // HF Split(pattern, behavior Isolated): every match is a piece, and so is every gap between matches.
    // Throws Error when PCRE2 cannot compile the pattern.
    static std::unique_ptr<PreTokenizer> regex(const std::string& pattern);
    // The pre-tokenizer for a HF Split regex: the Qwen matchers for their exact patterns, PCRE2 otherwise.
    static std::unique_ptr<PreTokenizer> for_pattern(const std::string& pattern);

    virtual ~PreTokenizer() = default;
    virtual Kind kind() const = 0;
    // Appends the pieces of `text` (valid UTF-8) to `out`, in order; they concatenate to `text`.
    virtual void split(std::string_view text, std::vector<std::string_view>& out) const = 0;
};

// The patterns themselves (kQwen2Pattern, kQwen35Pattern, kGpt2Pattern) live with the tokenizer.json parser in
// format/hf_tokenizer.h.

}  // namespace strata
