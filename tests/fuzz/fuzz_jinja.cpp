// libFuzzer entry for the Jinja subset engine (chat templates). Any input must either parse or throw
// strata::Error, and a parsed template must either render a fixed tool-calling conversation or throw strata::Error,
// within small output and step limits. A message must be one line.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tokenizer/jinja_interp.h"

namespace {

const strata::jinja::Object& context() {
    static const strata::jinja::Value value = strata::jinja::Value::from_json(nlohmann::ordered_json::parse(R"({
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "héllo"}]},
            {"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "reasoning_content": "r",
             "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null]}}},
                            {"type": "function", "function": {"name": "g", "arguments": "{\"b\": true}"}}]},
            {"role": "tool", "content": "42"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                   "properties": {"a": {"type": "array"}}}}}],
        "add_generation_prompt": true, "enable_thinking": false, "eos_token": "<|im_end|>"})"));
    return value.as_object();
}

void check_message(const strata::Error& e) {
    if (std::strchr(e.what(), '\n') != nullptr) {
        std::fprintf(stderr, "fuzz_jinja: error message has a newline: %s\n", e.what());
        std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string source(reinterpret_cast<const char*>(data), size);
    strata::jinja::RenderLimits limits;
    limits.max_output_bytes = 1 << 20;
    limits.max_steps = 200000;
    limits.max_call_depth = 16;
    try {
        const strata::jinja::Template t = strata::jinja::Template::parse(source);
        (void)t.render(context(), limits);
    } catch (const strata::Error& e) {
        check_message(e);
    }
    return 0;
}
