// Lexer of the Jinja subset engine. It applies jinja2's whitespace rules while it splits the template, exactly as
// transformers configures jinja2: trim_blocks (drop the first newline after a block or comment tag), lstrip_blocks
// (drop the spaces and tabs before a block or comment tag that starts its line), `-`/`+` markers on tags, newline
// normalization, and keep_trailing_newline=False (one newline at the very end of the template is dropped).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace strata::jinja {

enum class TokenType {
    Data,           // literal text between tags
    VariableBegin,  // {{
    VariableEnd,    // }}
    BlockBegin,     // {%
    BlockEnd,       // %}
    Name,
    String,  // value already unescaped
    Integer,
    Float,
    Operator,
    End,
};

struct Token {
    TokenType type;
    std::string value;
    size_t offset;  // byte offset in the normalized source, for line:column in messages
};

struct LexedTemplate {
    std::string source;  // after newline normalization
    std::vector<Token> tokens;
};

// Throws Error("line L:C: ...") on an unterminated tag, comment or string, or an unexpected character.
LexedTemplate lex_template(const std::string& source);

// "line L:C" of a byte offset.
std::string describe_position(const std::string& source, size_t offset);

}  // namespace strata::jinja
