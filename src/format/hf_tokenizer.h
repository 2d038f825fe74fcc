// HF tokenizer.json + tokenizer_config.json -> llama.cpp's `gpt2` (byte-level BPE) vocabulary keys
// (shared/reference/gguf-qwen4exp.md section 5), and a byte-level placeholder vocabulary for checkpoints that come
// without a tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/gguf.h"

namespace strata {

// llama.cpp token types (tokenizer.ggml.token_type)
enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// What a HF tokenizer.json says (with tokenizer_config.json and chat_template.jinja beside it), validated: a
// byte-level BPE with an NFC normalizer or none, and a Split regex + ByteLevel (or ByteLevel with its own regex)
// pre-tokenizer. The one parser of these files: `strata convert` turns it into GGUF keys, the tokenizer runs it.
struct HfAddedToken {
    int32_t id = 0;
    std::string content;
    bool special = false;  // HF's flag, or a <|...|> name (llama.cpp's converter treats those as control too)
    bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct HfTokenizerJson {
    std::string source;                                     // the tokenizer.json path, for messages
    std::vector<std::pair<std::string, int32_t>> vocab;     // model.vocab
    std::vector<HfAddedToken> added;                        // added_tokens
    std::vector<std::pair<std::string, std::string>> merges;  // rank order
    bool ignore_merges = false;
    bool nfc = false;
    std::string pattern;  // the pre-tokenizer's split regex
    int32_t max_id = -1;
    std::optional<int32_t> bos_id, eos_id, pad_id;  // from tokenizer_config.json
    bool add_bos = false;
    std::string chat_template;  // empty: none
};

// path: a tokenizer.json or the folder holding one. Throws Error naming the file and the problem.
HfTokenizerJson read_hf_tokenizer_json(const std::string& path);

// The split regexes as HF tokenizer.json files spell them (gguf-qwen4exp.md section 5).
extern const char* const kQwen2Pattern;
extern const char* const kQwen35Pattern;
extern const char* const kGpt2Pattern;  // ByteLevel(use_regex = true)

// llama.cpp's tokenizer.ggml.pre name for a split regex: "qwen2", "qwen35", "gpt-2", or "" for one it has no name for.
std::string pre_tokenizer_name(const std::string& pattern);

// The llama.cpp `gpt2` vocabulary keys of a model.
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

// Reads DIR/tokenizer.json into GGUF vocabulary keys; nullopt when the file does not exist. Throws Error on malformed
// files, ids that do not fit vocab_size, or a pre-tokenizer llama.cpp has no name for.
std::optional<HfVocab> load_hf_tokenizer(const HfTokenizerOptions& options);

// A vocabulary llama.cpp loads when the checkpoint has no tokenizer: the 256 byte tokens (id = byte value) in GPT-2
// byte-to-unicode form, then unique control tokens "<|placeholder_N|>" up to vocab_size, no merges, pre "qwen2".
// The token at eos_id (if given and in range) is "<|endoftext|>".
HfVocab placeholder_vocab(int64_t vocab_size, std::optional<int64_t> eos_id);

// GPT-2's byte-to-unicode map as UTF-8 strings, indexed by byte.
const std::vector<std::string>& byte_to_unicode_table();

// Writes the tokenizer.ggml.* / tokenizer.chat_template keys.
void add_vocab_keys(gguf::Writer& writer, const HfVocab& vocab);

}  // namespace strata
