// Chat templates: renders a model's own Jinja chat template (GGUF `tokenizer.chat_template`, HF
// `chat_template`) byte-identically to transformers' apply_chat_template(..., tokenize=False).
//
// JSON is taken as nlohmann::ordered_json because key order is part of the output (`tool | tojson` prints keys in
// insertion order, as Python does); a plain nlohmann::json converts implicitly but arrives with sorted keys.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace strata {

namespace jinja {
class Template;
}

struct ChatOptions {
    bool add_generation_prompt = true;
    std::optional<bool> enable_thinking;                                   // the template sees it only when set
    nlohmann::ordered_json tools = nullptr;                                // OpenAI-style tool list, or null
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();     // more template variables
    std::string bos_token, eos_token;                                      // passed when not empty
};

class ChatTemplate {
public:
    // Throws Error("chat template syntax error at line L:C: ...") on a syntax error.
    static ChatTemplate parse(const std::string& source);

    // messages: OpenAI-style array of {role, content (string, null, or list of {type: "text", text} parts),
    // reasoning_content, tool_calls [{type, function {name, arguments (object or JSON string)}}], tool_call_id,
    // name}. Throws Error with one line on a template error or when the template calls raise_exception.
    std::string render(const nlohmann::ordered_json& messages, const ChatOptions& options) const;

    const std::string& source() const { return source_; }

private:
    std::string source_;
    std::shared_ptr<const jinja::Template> compiled_;
};

}  // namespace strata
