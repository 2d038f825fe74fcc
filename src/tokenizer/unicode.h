// UTF-8 handling, the code point classes of the Qwen pre-tokenizer regexes, and NFC as HF tokenizers computes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::unicode {

inline constexpr uint32_t kReplacement = 0xFFFD;

// One step of UTF-8 decoding at s[pos] (pos < s.size()).
struct Utf8Step {
    enum class Status : uint8_t { Ok, Invalid, Truncated };
    Status status;
    uint32_t cp;   // Ok only
    size_t len;    // Ok: bytes of the character. Invalid: bytes of the maximal ill-formed subpart (>= 1), each such
                   // subpart stands for one U+FFFD as in the Unicode standard's recommendation (and Rust's
                   // from_utf8_lossy). Truncated: the bytes left, a valid prefix that more bytes could complete.
};
Utf8Step utf8_step(std::string_view s, size_t pos);

bool is_valid_utf8(std::string_view s);
// Invalid sequences replaced by U+FFFD (one per maximal ill-formed subpart; a truncated tail is one too).
std::string sanitize_utf8(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);
// Decodes one character of VALID UTF-8 at s[pos], advancing pos.
inline uint32_t next_cp(std::string_view s, size_t& pos) {
    const auto b0 = static_cast<uint8_t>(s[pos]);
    if (b0 < 0x80) {
        ++pos;
        return b0;
    }
    auto cont = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[pos + k]) & 0x3F); };
    uint32_t cp;
    if (b0 < 0xE0) {
        cp = ((b0 & 0x1Fu) << 6) | cont(1);
        pos += 2;
    } else if (b0 < 0xF0) {
        cp = ((b0 & 0x0Fu) << 12) | (cont(1) << 6) | cont(2);
        pos += 3;
    } else {
        cp = ((b0 & 0x07u) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
        pos += 4;
    }
    return cp;
}

enum class CharClass : uint8_t { Other = 0, Letter = 1, Mark = 2, Number = 3, Space = 4 };
// \p{L}, \p{M}, \p{N}, \s as HF tokenizers 0.23.2's regex engine (Oniguruma, Unicode 16) sees them.
CharClass char_class(uint32_t cp);

// NFC with HF tokenizers' tables: a few combining marks newer than its normalization tables count as starters there
// (canonical combining class 0), so they are treated the same way here. `s` must be valid UTF-8.
std::string nfc(std::string_view s);

}  // namespace strata::unicode
