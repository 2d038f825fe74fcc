// libFuzzer entry for constrained decoding (src/runtime/token_constraint.h). Input: a JSON Schema (or, as a JSON
// array, an OpenAI tool list: JSON or XML call form by the text's length), a NUL byte, then text fed one byte per token
// over a 256-byte vocabulary. The schema must either compile or throw a one-line strata::Error; then, for every byte,
// mask() must allow it exactly when accept() takes it, and the end token exactly when complete() says so.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/token_constraint.h"

namespace {

constexpr int32_t kEnd = 256;

std::shared_ptr<const strata::ConstraintVocabulary> vocabulary() {
    static const auto vocab = [] {
        auto v = std::make_shared<strata::ConstraintVocabulary>();
        for (int b = 0; b < 256; ++b) v->token_bytes.push_back(std::string(1, static_cast<char>(b)));
        v->token_bytes.push_back("<|im_end|>");
        v->end_tokens = {kEnd};
        return v;
    }();
    return vocab;
}

void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz_token_constraint: %s\n", what);
        std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto* begin = reinterpret_cast<const char*>(data);
    const char* nul = static_cast<const char*>(std::memchr(begin, 0, size));
    const std::string schema_text(begin, nul ? nul : begin + size);
    const std::string text = nul ? std::string(nul + 1, begin + size) : std::string();
    const nlohmann::json schema = nlohmann::json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return 0;
    std::unique_ptr<strata::TokenConstraint> c;
    try {
        if (schema.is_array() && text.size() % 4 >= 2) {
            c = strata::make_xml_tool_call_constraint(vocabulary(), schema, std::nullopt, text.size() % 2 == 1);
        } else if (schema.is_array()) {
            c = strata::make_tool_call_constraint(vocabulary(), schema, std::nullopt, text.size() % 2 == 1);
        } else {
            c = strata::make_json_schema_constraint(vocabulary(), schema);
        }
    } catch (const strata::Error& e) {
        check(std::strchr(e.what(), '\n') == nullptr, "error message has a newline");
        return 0;
    }
    std::vector<float> logits(257);
    for (char ch : text) {
        const auto token = static_cast<uint8_t>(ch);
        std::fill(logits.begin(), logits.end(), 0.0f);
        c->mask(logits);
        check(std::isfinite(logits[kEnd]) == c->complete(), "end token allowed but not complete, or the reverse");
        bool accepted = true;
        try {
            c->accept(token);
        } catch (const strata::Error&) {
            accepted = false;
        }
        check(accepted == std::isfinite(logits[token]), "mask() and accept() disagree");
        if (!accepted) break;
        (void)c->must_end();
    }
    return 0;
}
