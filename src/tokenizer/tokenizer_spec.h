// What the GGUF and tokenizer.json loaders hand to Tokenizer::build (internal to the tokenizer layer).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace strata {

struct Tokenizer::Spec {
    std::vector<std::string> tokens;  // id -> text (byte-level alphabet for ordinary tokens; "" for holes)
    std::vector<bool> special;        // id -> control / special
    std::vector<AddedToken> added;    // recognized inside text before pre-tokenization
    std::vector<std::pair<std::string, std::string>> merges;  // rank order
    enum class Pre { Qwen2, Qwen35, Regex } pre = Pre::Qwen2;
    std::string regex;  // Pre::Regex
    bool nfc = true;
    bool ignore_merges = false;
    std::string chat_template;
    std::optional<int32_t> bos_id, eos_id, eot_id, eom_id;
    std::string source;  // file name for messages
};

}  // namespace strata
