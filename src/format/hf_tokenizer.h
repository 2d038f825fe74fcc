// HF tokenizer.json + tokenizer_config.json -> llama.cpp's `gpt2` (byte-level BPE) vocabulary keys
// (shared/reference/gguf-qwen4exp.md section 5), and a byte-level placeholder vocabulary for checkpoints that come
// without a tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/gguf.h"

namespace strata {

// llama.cpp token types (tokenizer.ggml.token_type)
enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct HfVocab {
    std::vector<std::string> tokens;  // one per id, GPT-2 byte-to-unicode alphabet
    std::vector<int32_t> token_types;
    std::vector<std::string> merges;  // "left right", rank = index
    std::string pre = "qwen2";        // tokenizer.ggml.pre
    std::optional<uint32_t> bos_id;
    std::optional<uint32_t> eos_id;
    std::optional<uint32_t> pad_id;
    bool add_bos = false;
    std::string chat_template;  // empty: none
};

struct HfTokenizerOptions {
    std::string dir;                      // folder with tokenizer.json (and tokenizer_config.json, chat_template.jinja)
    int64_t vocab_size = 0;               // config.json vocab_size: the token list is padded to it
    std::optional<int64_t> fallback_eos;  // config eos_token_id, used when tokenizer_config names none
};

// Reads DIR/tokenizer.json; nullopt when the file does not exist. Throws Error on malformed files or ids that do not
// fit vocab_size.
std::optional<HfVocab> load_hf_tokenizer(const HfTokenizerOptions& options);

// A vocabulary llama.cpp loads when the checkpoint has no tokenizer: the 256 byte tokens (id = byte value) in GPT-2
// byte-to-unicode form, then unique control tokens "<|placeholder_N|>" up to vocab_size, no merges, pre "qwen2".
// The token at eos_id (if given and in range) is "<|endoftext|>".
HfVocab placeholder_vocab(int64_t vocab_size, std::optional<int64_t> eos_id);

// Pre-tokenizer name for a tokenizer.json pre_tokenizer regex: "qwen35" when its letter class takes \p{M}, else
// "qwen2".
std::string detect_pre_tokenizer(const std::string& regex);

// GPT-2's byte-to-unicode map as UTF-8 strings, indexed by byte.
const std::vector<std::string>& byte_to_unicode_table();

// Writes the tokenizer.ggml.* / tokenizer.chat_template keys.
void add_vocab_keys(gguf::Writer& writer, const HfVocab& vocab);

}  // namespace strata
