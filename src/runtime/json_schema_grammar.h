// The grammar behind a TokenConstraint: a graph of nodes compiled from a JSON Schema (or a tool list), walked byte by
// byte by the recognizer in json_schema_recognizer.h.
//
// Language, decided here once for every schema:
//  - Whitespace where JSON allows it between tokens: nothing, one space, or one LF followed by at most
//    min(kMaxIndent, kIndentPerLevel * depth) spaces/tabs, depth being the objects and arrays open there (1 inside the
//    top-level one); no CR, no lone tab, no second LF. That is llama.cpp's json-schema-to-grammar rule with the indent
//    also bounded by the depth. None before the top-level value or after it: a reply ends with its closing bracket.
//  - Objects: keys are the exact property names (as JSON strings, written without escapes unless the name needs
//    them), in any order, each at most once; every "required" key must appear before "}". Without
//    "additionalProperties", an object schema that has "properties" allows no other keys (JSON Schema would allow
//    them; a narrower language keeps models on the schema and its output still validates). additionalProperties true
//    or a schema: other keys are strings without escape sequences whose text is not a declared name. An object schema
//    without "properties" (or {}) allows any keys, escapes included. At most kMaxProperties declared names.
//  - Strings: UTF-8 validated (no overlong forms, no surrogates, nothing above U+10FFFF), no raw control bytes,
//    escapes per RFC 8259 with \uXXXX surrogates only as high-low pairs; minLength/maxLength count code points.
//  - Numbers per RFC 8259 (integer: no fraction or exponent), at most kMaxIntegerDigits / kMaxFractionDigits /
//    kMaxExponentDigits digits so a model cannot write digits forever.
//  - enum/const: the values as nlohmann::json's compact dump() writes them (keys sorted, no spaces).
//  - anyOf and oneOf: both anyOf. A schema without "type" takes its type from its keywords (properties -> object,
//    items -> array, minLength -> string); with none of them it is any JSON value.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace strata::constraint {

inline constexpr int kMaxIndent = 20;
inline constexpr int kIndentPerLevel = 4;
inline constexpr int kMaxIntegerDigits = 20;
inline constexpr int kMaxFractionDigits = 20;
inline constexpr int kMaxExponentDigits = 4;
inline constexpr int kMaxProperties = 64;
inline constexpr uint32_t kNoNode = 0xffffffffu;

enum class NodeKind : uint8_t {
    Never,      // no value (the schema false)
    Object,     // keys / key_nodes / additional
    Array,      // items, min_items, max_items
    String,     // min_length, max_length
    Number,     // RFC 8259 number
    Integer,    // RFC 8259 number without fraction or exponent
    Literal,    // one of `candidates`, byte for byte (enum, const, booleans, null, fixed text)
    Union,      // any of `children`
    Sequence,   // `children` one after the other
    Dispatch,   // one of `candidates`, then the value of `children[i]` for the candidate matched
    Ref,        // the same as children[0] (a $ref); resolved after compiling
    XmlParams,  // Qwen XML tool parameters: keys are "<parameter=NAME>\n" texts, each followed by its value node
    RawText,    // UTF-8 text up to and including the terminator candidates[0] (matched through `dfa`)
};

struct Node {
    NodeKind kind = NodeKind::Never;
    // Object: declared keys as they appear between the quotes, sorted bytewise, and their value nodes.
    std::vector<std::string> keys;
    std::vector<uint32_t> key_nodes;
    uint64_t required_mask = 0;  // bit i: keys[i] is required
    uint64_t allowed_mask = 0;   // bit i: keys[i] may appear (its schema is not false)
    uint32_t additional = kNoNode;
    // Array
    uint32_t items = kNoNode;
    uint32_t min_items = 0;
    uint32_t max_items = UINT32_MAX;
    // String
    uint32_t min_length = 0;
    uint32_t max_length = UINT32_MAX;
    // Literal / Dispatch: sorted bytewise; Dispatch's children[i] follows candidates[i].
    std::vector<std::string> candidates;
    // Union / Sequence / Dispatch / Ref
    std::vector<uint32_t> children;
    // RawText: dfa[k * 256 + b] = terminator bytes matched after byte b when k were matched before (KMP automaton).
    std::vector<uint8_t> dfa;
};

struct Grammar {
    std::vector<Node> nodes;
    uint32_t root = kNoNode;    // the value (JSON mode) or one tool call (tool mode)
    uint32_t repeat = kNoNode;  // tool mode with parallel calls: what may follow a whole call, again and again
    uint8_t root_depth = 0;     // objects open around the root (1 for the JSON tool call: its arguments' indent)
};

// Throws Error naming the keyword and its path for unsupported, invalid or unsatisfiable schemas.
Grammar compile_json_schema(const nlohmann::json& schema);
Grammar compile_tool_calls(const nlohmann::json& tools, const std::optional<std::string>& forced_name,
                           bool allow_parallel);
// Qwen3.5 / Qwen3-Coder's XML form (see make_xml_tool_call_constraint).
Grammar compile_xml_tool_calls(const nlohmann::json& tools, const std::optional<std::string>& forced_name,
                               bool allow_parallel);

}  // namespace strata::constraint
