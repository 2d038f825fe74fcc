#include "tokenizer/jinja_lexer.h"

#include <cstring>

#include "core/error.h"
#include "tokenizer/jinja_value.h"

namespace strata::jinja {

std::string describe_position(const std::string& source, size_t offset) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < offset && i < source.size(); ++i) {
        if (source[i] == '\n') {
            ++line;
            col = 1;
        } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
            ++col;
        }
    }
    return "line " + std::to_string(line) + ":" + std::to_string(col);
}

namespace {

[[noreturn]] void fail_at(const std::string& source, size_t offset, const std::string& what) {
    throw Error("chat template syntax error at " + describe_position(source, offset) + ": " + what);
}

// Python's \s on str patterns: one whitespace code point at `pos`, or 0.
size_t space_length(const std::string& s, size_t pos) {
    const unsigned char c = static_cast<unsigned char>(s[pos]);
    if (c < 0x80) return python_isspace(c) ? 1 : 0;
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (pos + len > s.size()) return 0;
    const auto cps = utf8_decode(s.substr(pos, len));
    return cps.size() == 1 && python_isspace(cps[0]) ? len : 0;
}

size_t skip_spaces(const std::string& s, size_t pos) {
    while (pos < s.size()) {
        const size_t n = space_length(s, pos);
        if (n == 0) break;
        pos += n;
    }
    return pos;
}

// Python's str.rstrip() with no argument.
std::string rstrip_spaces(const std::string& s) {
    auto cps = utf8_decode(s);
    size_t end = cps.size();
    while (end > 0 && python_isspace(cps[end - 1])) --end;
    return utf8_encode(cps, 0, end);
}

bool all_spaces(const std::string& s, size_t from) { return skip_spaces(s, from) == s.size(); }

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Python's "unicode-escape" decoding of a string literal's body, which is what jinja2 applies.
std::string unescape_literal(const std::string& body, const std::string& source, size_t offset) {
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
        const char c = body[i];
        if (c != '\\' || i + 1 >= body.size()) {
            out.push_back(c);
            continue;
        }
        const char e = body[++i];
        switch (e) {
            case '\n': break;
            case '\\': out.push_back('\\'); break;
            case '\'': out.push_back('\''); break;
            case '"': out.push_back('"'); break;
            case 'a': out.push_back('\a'); break;
            case 'b': out.push_back('\b'); break;
            case 'f': out.push_back('\f'); break;
            case 'n': out.push_back('\n'); break;
            case 'r': out.push_back('\r'); break;
            case 't': out.push_back('\t'); break;
            case 'v': out.push_back('\v'); break;
            case 'x':
            case 'u':
            case 'U': {
                const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                char32_t cp = 0;
                for (size_t k = 0; k < digits; ++k) {
                    const int h = i + 1 + k < body.size() ? hex_value(body[i + 1 + k]) : -1;
                    if (h < 0) fail_at(source, offset, "truncated \\" + std::string(1, e) + " escape in a string");
                    cp = cp * 16 + static_cast<char32_t>(h);
                }
                if (cp > 0x10FFFF) fail_at(source, offset, "invalid \\U escape in a string");
                i += digits;
                utf8_append(out, cp);
                break;
            }
            default:
                if (e >= '0' && e <= '7') {
                    char32_t cp = static_cast<char32_t>(e - '0');
                    for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
                        cp = cp * 8 + static_cast<char32_t>(body[++i] - '0');
                    utf8_append(out, cp);
                } else {
                    out.push_back('\\');  // unknown escapes keep their backslash
                    out.push_back(e);
                }
        }
    }
    return out;
}

class Lexer {
public:
    explicit Lexer(std::string source) { out_.source = std::move(source); }

    LexedTemplate run() {
        const std::string& s = out_.source;
        size_t pos = 0;
        while (pos < s.size()) {
            // The next tag start: {{, {% or {#.
            size_t tag = pos;
            while (true) {
                tag = s.find('{', tag);
                if (tag == std::string::npos || tag + 1 >= s.size()) {
                    tag = std::string::npos;
                    break;
                }
                const char k = s[tag + 1];
                if (k == '{' || k == '%' || k == '#') break;
                ++tag;
            }
            if (tag == std::string::npos) {
                emit_data(s.substr(pos), pos);
                break;
            }
            const char kind = s[tag + 1];
            const char sign = tag + 2 < s.size() && (s[tag + 2] == '-' || s[tag + 2] == '+') ? s[tag + 2] : 0;
            const bool line_starting = pos == 0 || s[pos - 1] == '\n';
            std::string text = s.substr(pos, tag - pos);
            size_t after = tag + 2 + (sign ? 1 : 0);

            size_t raw_body = 0;
            if (kind == '%' && match_raw_begin(after, raw_body)) {
                emit_data(control_text(text, sign, false, line_starting), pos);
                pos = lex_raw(raw_body);
                continue;
            }
            emit_data(control_text(text, sign, kind == '{', line_starting), pos);
            if (kind == '#') {
                pos = skip_comment(after, tag);
            } else {
                out_.tokens.push_back({kind == '{' ? TokenType::VariableBegin : TokenType::BlockBegin, "", tag});
                pos = lex_tag(after, kind == '{', tag);
            }
        }
        out_.tokens.push_back({TokenType::End, "", s.size()});
        return std::move(out_);
    }

private:
    LexedTemplate out_;

    void emit_data(const std::string& text, size_t offset) {
        if (!text.empty()) out_.tokens.push_back({TokenType::Data, text, offset});
    }

    // The text before a tag after the tag's whitespace control: `-` strips all trailing whitespace; otherwise
    // lstrip_blocks removes the spaces before a block or comment tag when nothing else precedes it on its line.
    static std::string control_text(const std::string& text, char sign, bool variable, bool line_starting) {
        if (sign == '-') return rstrip_spaces(text);
        if (sign == '+' || variable) return text;
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_spaces(text, l_pos))
            return text.substr(0, l_pos);
        return text;
    }

    // `{%` already consumed (with its sign); matches `\s*raw\s*(-%}\s*|%})` and returns where the body starts.
    bool match_raw_begin(size_t p, size_t& body) const {
        const std::string& s = out_.source;
        p = skip_spaces(s, p);
        if (s.compare(p, 3, "raw") != 0 || (p + 3 < s.size() && is_name_char(s[p + 3]))) return false;
        p = skip_spaces(s, p + 3);
        if (s.compare(p, 3, "-%}") == 0) {
            body = skip_spaces(s, p + 3);
            return true;
        }
        if (s.compare(p, 2, "%}") == 0) {
            body = p + 2;
            return true;
        }
        return false;
    }

    size_t lex_raw(size_t body) {
        const std::string& s = out_.source;
        for (size_t p = s.find("{%", body); p != std::string::npos; p = s.find("{%", p + 1)) {
            size_t q = p + 2;
            const char sign = q < s.size() && (s[q] == '-' || s[q] == '+') ? s[q] : 0;
            if (sign) ++q;
            q = skip_spaces(s, q);
            if (s.compare(q, 6, "endraw") != 0) continue;
            q = skip_spaces(s, q + 6);
            size_t end;
            if (s.compare(q, 3, "+%}") == 0) end = q + 3;
            else if (s.compare(q, 3, "-%}") == 0) end = skip_spaces(s, q + 3);
            else if (s.compare(q, 2, "%}") == 0) end = q + 2 + (q + 2 < s.size() && s[q + 2] == '\n' ? 1 : 0);
            else continue;
            const bool line_starting = body == 0 || s[body - 1] == '\n';
            emit_data(control_text(s.substr(body, p - body), sign, false, line_starting), body);
            return end;
        }
        fail_at(s, body, "missing {% endraw %}");
    }

    size_t skip_comment(size_t p, size_t start) {
        const std::string& s = out_.source;
        for (size_t q = s.find("#}", p); q != std::string::npos; q = s.find("#}", q + 1)) {
            if (q > p && s[q - 1] == '-') return skip_spaces(s, q + 2);
            if (q > p && s[q - 1] == '+') return q + 2;
            return q + 2 + (q + 2 < s.size() && s[q + 2] == '\n' ? 1 : 0);
        }
        fail_at(s, start, "missing end of comment tag");
    }

    // Expression tokens up to the tag's end; returns the position after the end marker (and its trimming).
    size_t lex_tag(size_t p, bool variable, size_t start) {
        const std::string& s = out_.source;
        int balance = 0;  // open ( [ {: an end marker inside brackets is an operator, as in jinja2
        while (true) {
            if (p >= s.size()) fail_at(s, start, variable ? "missing '}}' for this '{{'" : "missing '%}' for this '{%'");
            if (balance == 0) {
                if (variable) {
                    if (s.compare(p, 3, "-}}") == 0) return end_tag(TokenType::VariableEnd, p, skip_spaces(s, p + 3));
                    if (s.compare(p, 2, "}}") == 0) return end_tag(TokenType::VariableEnd, p, p + 2);
                } else {
                    if (s.compare(p, 3, "+%}") == 0) return end_tag(TokenType::BlockEnd, p, p + 3);
                    if (s.compare(p, 3, "-%}") == 0) return end_tag(TokenType::BlockEnd, p, skip_spaces(s, p + 3));
                    if (s.compare(p, 2, "%}") == 0)
                        return end_tag(TokenType::BlockEnd, p, p + 2 + (p + 2 < s.size() && s[p + 2] == '\n' ? 1 : 0));
                }
            }
            const size_t sp = space_length(s, p);
            if (sp) {
                p += sp;
                continue;
            }
            const char c = s[p];
            if (is_digit(c)) {
                p = lex_number(p);
            } else if (is_name_start(c)) {
                size_t q = p;
                while (q < s.size() && is_name_char(s[q])) ++q;
                out_.tokens.push_back({TokenType::Name, s.substr(p, q - p), p});
                p = q;
            } else if (c == '\'' || c == '"') {
                size_t q = p + 1;
                while (q < s.size() && s[q] != c) q += s[q] == '\\' ? 2 : 1;
                if (q >= s.size()) fail_at(s, p, "unterminated string");
                out_.tokens.push_back({TokenType::String, unescape_literal(s.substr(p + 1, q - p - 1), s, p), p});
                p = q + 1;
            } else {
                static const char* const two[] = {"//", "**", "==", "!=", ">=", "<="};
                std::string op;
                for (const char* t : two)
                    if (s.compare(p, 2, t) == 0) op = t;
                if (op.empty()) {
                    if (!std::strchr("+-/*%~[](){}><=.:|,;", c)) fail_at(s, p, "unexpected character '" + std::string(1, c) + "'");
                    op = std::string(1, c);
                }
                if (op == "(" || op == "[" || op == "{") ++balance;
                if (op == ")" || op == "]" || op == "}") {
                    if (balance == 0) fail_at(s, p, "unexpected '" + op + "'");
                    --balance;
                }
                out_.tokens.push_back({TokenType::Operator, op, p});
                p += op.size();
            }
        }
    }

    size_t end_tag(TokenType type, size_t at, size_t next) {
        out_.tokens.push_back({type, "", at});
        return next;
    }

    // Integers and floats with optional underscores between digits, as jinja2's integer and float rules.
    size_t lex_number(size_t p) {
        const std::string& s = out_.source;
        auto digits = [&](size_t q) {
            if (q >= s.size() || !is_digit(s[q])) return std::string::npos;
            while (q < s.size() && (is_digit(s[q]) || (s[q] == '_' && q + 1 < s.size() && is_digit(s[q + 1])))) ++q;
            return q;
        };
        size_t q = digits(p);
        bool is_float = false;
        if (q < s.size() && s[q] == '.') {
            const size_t f = digits(q + 1);
            if (f != std::string::npos) {
                q = f;
                is_float = true;
            }
        }
        if (q < s.size() && (s[q] == 'e' || s[q] == 'E')) {
            size_t e = q + 1;
            if (e < s.size() && (s[e] == '+' || s[e] == '-')) ++e;
            const size_t f = digits(e);
            if (f != std::string::npos) {
                q = f;
                is_float = true;
            }
        }
        std::string text;
        for (size_t i = p; i < q; ++i)
            if (s[i] != '_') text.push_back(s[i]);
        out_.tokens.push_back({is_float ? TokenType::Float : TokenType::Integer, text, p});
        return q;
    }
};

}  // namespace

LexedTemplate lex_template(const std::string& source) {
    // jinja2 normalizes \r\n and \r to \n, then drops a single trailing newline (keep_trailing_newline=False).
    std::string s;
    s.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
        if (source[i] == '\r') {
            s.push_back('\n');
            if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
        } else {
            s.push_back(source[i]);
        }
    }
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return Lexer(std::move(s)).run();
}

}  // namespace strata::jinja
