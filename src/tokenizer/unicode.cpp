#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <vector>

namespace strata::unicode {

Utf8Step utf8_step(std::string_view s, size_t pos) {
    using S = Utf8Step::Status;
    const size_t n = s.size();
    const auto b = [&](size_t k) { return static_cast<uint8_t>(s[pos + k]); };
    const uint8_t b0 = b(0);
    if (b0 < 0x80) return {S::Ok, b0, 1};
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;  // no surrogates
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return {S::Invalid, 0, 1};
    }
    for (size_t k = 1; k < need; ++k) {
        if (pos + k >= n) return {S::Truncated, 0, k};
        const uint8_t c = b(k);
        const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
        if (!ok) return {S::Invalid, 0, k};
    }
    size_t p = pos;
    return {S::Ok, next_cp(s, p), need};
}

bool is_valid_utf8(std::string_view s) {
    size_t i = 0;
    const size_t n = s.size();
    while (i < n) {
        // ASCII runs eight bytes at a time
        while (i + 8 <= n) {
            uint64_t w;
            __builtin_memcpy(&w, s.data() + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        Utf8Step st = utf8_step(s, i);
        if (st.status != Utf8Step::Status::Ok) return false;
        i += st.len;
    }
    return true;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

std::string sanitize_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 8);
    size_t i = 0;
    while (i < s.size()) {
        Utf8Step st = utf8_step(s, i);
        if (st.status == Utf8Step::Status::Ok)
            out.append(s.data() + i, st.len);
        else
            append_utf8(out, kReplacement);
        i += st.len;
    }
    return out;
}

namespace {

struct ClassRange {
    uint32_t first, last;
    CharClass cls;
};
constexpr CharClass kLetter = CharClass::Letter, kMark = CharClass::Mark, kNumber = CharClass::Number,
                    kSpace = CharClass::Space;
constexpr ClassRange kClassRanges[] = {
#include "tokenizer/unicode_classes.inc"
};

constexpr uint32_t kMaxCp = 0x110000;

const std::vector<uint8_t>& class_table() {
    static const std::vector<uint8_t> table = [] {
        std::vector<uint8_t> t(kMaxCp, static_cast<uint8_t>(CharClass::Other));
        for (const ClassRange& r : kClassRanges)
            for (uint32_t cp = r.first; cp <= r.last && cp < kMaxCp; ++cp) t[cp] = static_cast<uint8_t>(r.cls);
        return t;
    }();
    return table;
}

// Combining marks that HF tokenizers' normalization tables (older than utf8proc's) do not know: there they have
// combining class 0, so they neither move in canonical reordering nor let marks move across them. Found by
// comparing HF tokenizers 0.23.2's NFC normalizer with utf8proc over every code point, each probed as c, a+c+U+0316,
// a+U+0301+c, c+U+0301 and a+c: these 54 were the only differences, all marks that HF leaves unordered.
constexpr uint32_t kHfStarters[] = {
    0x898,   0x89C,   0x89D,   0x89E,   0x89F,   0x8CA,   0x8CB,   0x8CC,   0x8CD,   0x8CE,   0x9FE,
    0x1AC1,  0x1AC2,  0x1AC5,  0x1AC6,  0x1AC7,  0x1AC8,  0x1AC9,  0x1ACB,  0x1ACC,  0x1ACD,  0x1ACE,
    0x1DF6,  0x1DF7,  0x1DF8,  0x10D24, 0x10D25, 0x10D26, 0x10D27, 0x10EAB, 0x10EAC, 0x10F48, 0x10F49,
    0x10F4A, 0x10F4C, 0x10F82, 0x10F84, 0x1145E, 0x1E08F, 0x1E130, 0x1E131, 0x1E132, 0x1E133, 0x1E134,
    0x1E135, 0x1E136, 0x1E2AE, 0x1E2EC, 0x1E2ED, 0x1E2EE, 0x1E2EF, 0x1E4EC, 0x1E4ED, 0x1E4EF,
};

bool is_hf_starter(uint32_t cp) {
    return std::binary_search(std::begin(kHfStarters), std::end(kHfStarters), cp);
}

int combining_class(uint32_t cp) {
    if (is_hf_starter(cp)) return 0;
    return utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class;
}

// Code points that NFC may change or that may change what precedes them: a combining class, a canonical
// decomposition, or being the second half of a canonical composition (Hangul jamo included). Text without any of
// them is already NFC.
const std::vector<bool>& nfc_trigger_table() {
    static const std::vector<bool> table = [] {
        std::vector<bool> t(kMaxCp, false);
        utf8proc_int32_t buf[8];
        for (uint32_t cp = 0x300; cp < kMaxCp; ++cp) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            const auto* prop = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
            if (prop->combining_class != 0) t[cp] = true;
            int bound = 0;
            utf8proc_ssize_t n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 8,
                                                         UTF8PROC_DECOMPOSE, &bound);
            if (n > 1 || (n == 1 && static_cast<uint32_t>(buf[0]) != cp)) {
                t[cp] = true;
                if (n == 2) t[static_cast<uint32_t>(buf[1])] = true;  // may compose with what precedes it
            }
        }
        for (uint32_t cp = 0x1161; cp <= 0x1175; ++cp) t[cp] = true;  // Hangul V jamo
        for (uint32_t cp = 0x11A8; cp <= 0x11C2; ++cp) t[cp] = true;  // Hangul T jamo
        return t;
    }();
    return table;
}

}  // namespace

CharClass char_class(uint32_t cp) {
    if (cp >= kMaxCp) return CharClass::Other;
    if (cp < 0x80) {
        static const std::array<uint8_t, 128> ascii = [] {
            std::array<uint8_t, 128> a{};
            for (uint32_t c = 0; c < 128; ++c) a[c] = static_cast<uint8_t>(CharClass::Other);
            for (const ClassRange& r : kClassRanges)
                for (uint32_t c = r.first; c <= r.last && c < 128; ++c) a[c] = static_cast<uint8_t>(r.cls);
            return a;
        }();
        return static_cast<CharClass>(ascii[cp]);
    }
    return static_cast<CharClass>(class_table()[cp]);
}

namespace {

// NFC of a short stretch that starts at a boundary and ends before one (see nfc()).
void nfc_region(std::string_view s, std::string& out) {
    // Canonical decomposition, then canonical reordering with HF's combining classes.
    std::vector<utf8proc_int32_t> dec;
    dec.reserve(s.size() + 8);
    utf8proc_int32_t buf[32];
    for (size_t i = 0; i < s.size();) {
        const auto cp = static_cast<utf8proc_int32_t>(next_cp(s, i));
        int bound = 0;
        utf8proc_ssize_t n = utf8proc_decompose_char(cp, buf, 32, UTF8PROC_DECOMPOSE, &bound);
        if (n < 1 || n > 32) {
            dec.push_back(cp);
        } else {
            dec.insert(dec.end(), buf, buf + n);
        }
    }
    std::vector<int> ccc(dec.size());
    for (size_t i = 0; i < dec.size(); ++i) ccc[i] = combining_class(static_cast<uint32_t>(dec[i]));
    for (size_t i = 0; i < dec.size();) {
        if (ccc[i] == 0) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < dec.size() && ccc[j] != 0) ++j;
        for (size_t a = i + 1; a < j; ++a) {  // stable insertion sort by class (runs are short)
            for (size_t b = a; b > i && ccc[b - 1] > ccc[b]; --b) {
                std::swap(ccc[b - 1], ccc[b]);
                std::swap(dec[b - 1], dec[b]);
            }
        }
        i = j;
    }
    // Composition. HF's extra starters never compose, so the text is composed in pieces that start at them.
    size_t seg = 0;
    auto compose = [&](size_t end) {
        if (end <= seg) return;
        utf8proc_ssize_t n =
            utf8proc_normalize_utf32(dec.data() + seg, static_cast<utf8proc_ssize_t>(end - seg),
                                     static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE));
        for (utf8proc_ssize_t k = 0; k < n; ++k)
            append_utf8(out, static_cast<uint32_t>(dec[seg + static_cast<size_t>(k)]));
        seg = end;
    };
    for (size_t i = 0; i < dec.size(); ++i)
        if (i > seg && is_hf_starter(static_cast<uint32_t>(dec[i]))) compose(i);
    compose(dec.size());
}

}  // namespace

std::string nfc(std::string_view s) {
    // Characters below U+0300 never change under NFC nor combine with what precedes them.
    bool any_high = false;
    for (char ch : s) {
        if (static_cast<uint8_t>(ch) >= 0xCC) {
            any_high = true;
            break;
        }
    }
    if (!any_high) return std::string(s);
    // Only stretches around trigger characters change. A non-trigger character has combining class 0 and neither
    // decomposes nor composes with what precedes it, so there is a normalization boundary right before it: each
    // stretch runs from the last non-trigger character before a trigger to the next non-trigger character after it.
    const std::vector<bool>& trigger = nfc_trigger_table();
    std::string out;
    size_t copied = 0;      // s[0, copied) is in out
    size_t last_start = 0;  // start of the latest non-trigger character
    size_t pos = 0;
    while (pos < s.size()) {
        const size_t start = pos;
        if (static_cast<uint8_t>(s[pos]) < 0xCC) {  // below U+0300: never a trigger
            pos += (static_cast<uint8_t>(s[pos]) < 0x80) ? 1 : 2;
            last_start = start;
            continue;
        }
        const uint32_t cp = next_cp(s, pos);
        if (!trigger[cp]) {
            last_start = start;
            continue;
        }
        const size_t region_start = std::max(last_start, copied);
        size_t region_end = pos;
        while (region_end < s.size()) {
            size_t q = region_end;
            if (!trigger[next_cp(s, q)]) break;
            region_end = q;
        }
        if (out.empty()) out.reserve(s.size() + 16);
        out.append(s.data() + copied, region_start - copied);
        nfc_region(s.substr(region_start, region_end - region_start), out);
        copied = pos = region_end;
    }
    if (copied == 0) return std::string(s);
    out.append(s.data() + copied, s.size() - copied);
    return out;
}

}  // namespace strata::unicode
