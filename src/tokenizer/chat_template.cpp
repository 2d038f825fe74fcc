#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "tokenizer/jinja_interp.h"

namespace strata {

ChatTemplate ChatTemplate::parse(const std::string& source) {
    ChatTemplate t;
    t.source_ = source;
    t.compiled_ = std::make_shared<const jinja::Template>(jinja::Template::parse(source));
    return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatOptions& options) const {
    if (!compiled_) throw Error("chat template: render called on an empty template");
    if (!messages.is_array()) throw Error("chat template: messages must be a JSON array");
    if (!options.tools.is_null() && !options.tools.is_array()) throw Error("chat template: tools must be a JSON array or null");
    if (!options.extra.is_object()) throw Error("chat template: extra variables must be a JSON object");

    // The variables transformers passes: special tokens, then messages, tools, add_generation_prompt and the
    // caller's keyword arguments (which override the special tokens).
    jinja::Object context;
    if (!options.bos_token.empty()) context.set("bos_token", jinja::Value(options.bos_token));
    if (!options.eos_token.empty()) context.set("eos_token", jinja::Value(options.eos_token));
    context.set("messages", jinja::Value::from_json(messages));
    context.set("tools", jinja::Value::from_json(options.tools));
    context.set("documents", jinja::Value::none());
    context.set("add_generation_prompt", jinja::Value(options.add_generation_prompt));
    if (options.enable_thinking) context.set("enable_thinking", jinja::Value(*options.enable_thinking));
    for (auto it = options.extra.begin(); it != options.extra.end(); ++it)
        context.set(it.key(), jinja::Value::from_json(it.value()));
    return compiled_->render(context);
}

}  // namespace strata
