// Byte-level BPE tokenizer (the Qwen2 / Qwen3.5 vocabularies) loaded from GGUF tokenizer.ggml.* keys or from a HF
// tokenizer.json; ids match HF tokenizers' encode (without added BOS/EOS) for every text.
//
// Behaviour worth knowing:
//  - Invalid UTF-8 in the input is replaced by U+FFFD before anything else (one per maximal ill-formed subpart, as
//    Rust's String::from_utf8_lossy does), so the text HF would get from a lossy conversion tokenizes identically.
//  - Added tokens are found in the raw text first (leftmost, then longest), honoring lstrip / rstrip / single_word /
//    normalized from tokenizer.json; the text between them is NFC-normalized (when the tokenizer has HF's NFC
//    normalizer; GGUF vocabularies with the qwen2 / qwen35 pre-tokenizer always do, since their HF originals have it),
//    pre-tokenized and BPE-merged.
//  - parse_special = false (llama.cpp's meaning, `strata tokenize --no-special`): special (control) tokens are not
//    recognized and their text is tokenized as ordinary text; non-special added tokens are still recognized.
//  - decode gives exact bytes: special and added tokens as their text, other tokens through GPT-2's byte map.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata {

namespace gguf {
class File;
}
class Bpe;
class PreTokenizer;

class Tokenizer {
public:
    // tokenizer.ggml.* keys (model "gpt2"); throws Error when they are absent or malformed.
    static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
    // A tokenizer.json file, or a folder holding one; tokenizer_config.json (and chat_template.jinja) beside it are
    // read when present. Throws Error on a missing or unsupported file.
    static std::unique_ptr<Tokenizer> from_hf_dir_or_file(const std::string& path);

    ~Tokenizer();
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
    std::string decode(std::span<const int32_t> ids) const;  // exact bytes; ids out of range throw Error
    std::string token_bytes(int32_t id) const;               // bytes of one token; Error when out of range
    int32_t n_vocab() const { return static_cast<int32_t>(token_text_.size()); }
    std::optional<int32_t> find_token(std::string_view text) const;  // exact token text, e.g. "<|im_end|>"
    bool is_special(int32_t id) const;                               // control / special added tokens
    const std::string& chat_template() const { return chat_template_; }
    std::vector<int32_t> eog_ids() const;  // eos / eot / eom and <|im_end|>, <|endoftext|> when present
    std::optional<int32_t> bos_id() const { return bos_id_; }
    std::optional<int32_t> eos_id() const { return eos_id_; }

    // The pre-tokenizer in use: "qwen2", "qwen35" or "regex".
    std::string pre_tokenizer_name() const;
    bool normalizes_nfc() const { return nfc_; }

    struct AddedToken {
        std::string content;
        int32_t id = 0;
        bool special = false;
        bool lstrip = false, rstrip = false, single_word = false, normalized = false;
    };

private:
    Tokenizer();
    struct Spec;  // what both loaders produce
    static std::unique_ptr<Tokenizer> build(Spec spec);

    class AddedMatcher;
    void encode_segment(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const;
    void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;

    std::vector<std::string> token_text_;   // as stored (byte-level alphabet for ordinary tokens)
    std::vector<std::string> token_bytes_;  // decoded bytes
    std::vector<bool> special_;
    std::unordered_map<std::string, int32_t> id_of_text_;
    std::vector<AddedToken> added_;
    std::unique_ptr<AddedMatcher> raw_added_;         // normalized = false: matched in the raw text
    std::unique_ptr<AddedMatcher> normalized_added_;  // normalized = true: matched after NFC
    std::unique_ptr<PreTokenizer> pre_;
    std::unique_ptr<Bpe> bpe_;
    bool nfc_ = false;
    std::string chat_template_;
    std::optional<int32_t> bos_id_, eos_id_, eot_id_, eom_id_;
};

// Streaming detokenizer: push ids one at a time and get back only complete UTF-8; a multi-byte character split
// across tokens is held until its last byte arrives. Bytes that can no longer form a valid character are emitted as
// U+FFFD (one per maximal ill-formed subpart, like HF's lossy decode), so the concatenated output is always valid
// UTF-8 and equals sanitize(decode(all ids)). flush() emits what is still held (an incomplete tail as U+FFFD).
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& t) : tokenizer_(t) {}
    std::string push(int32_t id);
    std::string flush();

private:
    std::string drain(bool final);
    const Tokenizer& tokenizer_;
    std::string pending_;
};

}  // namespace strata
