// Splits generated text, as it streams, into reasoning (`<think>...</think>`), content and Qwen tool calls
// (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`). Text that may be the start of a marker is held back
// until the next piece shows what it is, so a tag never leaks into the content.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::server {

struct ParsedToolCall {
    std::string id;         // "call_..." (fresh for each call)
    std::string name;
    std::string arguments;  // JSON object text
};

struct ReplyPiece {
    enum class Kind { kReasoning, kContent, kToolCall } kind = Kind::kContent;
    std::string text;
    ParsedToolCall call;  // kToolCall
};

struct ReplyParserOptions {
    bool start_in_reasoning = false;  // the prompt already opened a <think> block
    bool parse_reasoning = true;      // a leading <think> block becomes reasoning
    bool parse_tool_calls = false;    // only when the request has tools
};

class ReplyParser {
  public:
    explicit ReplyParser(ReplyParserOptions options);
    std::vector<ReplyPiece> push(std::string_view text);
    std::vector<ReplyPiece> finish();  // end of generation: whatever is held, an unclosed tool call parsed if it can be
    bool saw_tool_call() const { return n_tool_calls_ > 0; }

  private:
    enum class Mode { kContent, kReasoning, kToolCall };
    void drain(bool final, std::vector<ReplyPiece>& out);
    void emit(ReplyPiece::Kind kind, std::string text, std::vector<ReplyPiece>& out);
    bool close_tool_call(std::string_view body, std::vector<ReplyPiece>& out);

    ReplyParserOptions options_;
    Mode mode_;
    std::string buffer_;
    bool content_started_ = false;  // non-blank content was emitted (a <think> later is plain text)
    bool trim_leading_ = false;     // drop blank space after a closing tag
    int n_tool_calls_ = 0;
};

// A fresh id: prefix + 24 random letters and digits.
std::string random_id(const std::string& prefix);

}  // namespace strata::server
