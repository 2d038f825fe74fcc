// Constrained decoding: a grammar that masks the logits of tokens that cannot come next, so that the generated text is
// a JSON value valid against a JSON Schema (OpenAI response_format json_schema) or Qwen's tool-call text (tool_choice
// "required" or a named function). Nothing is checked afterwards: every prefix of the output is a prefix of a string
// of the language, and end tokens are allowed only once the text is a whole string of it.
//
// The runtime layer cannot see the tokenizer: the caller hands over each token's exact bytes. A token with no bytes is
// never allowed (give a token no bytes to ban it, e.g. control tokens that must not appear inside JSON).
//
// Language details (json_schema_grammar.h has the full list):
//  - Whitespace between tokens: nothing, one space, or one LF and an indent of at most 4 spaces/tabs per open object
//    or array and 20 in all (llama.cpp's rule, with the indent also bounded by the depth), so a model cannot spend its
//    tokens on whitespace; none before or after the top-level value.
//  - Object properties may come in any order; required ones must appear, each property at most once. An object schema
//    with "properties" and no "additionalProperties" allows no other keys (stricter than JSON Schema's default, as
//    llama.cpp and OpenAI's strict mode do: the output is still valid against the schema).
//  - enum/const values must be written as nlohmann::json's compact dump() writes them.
//  - Numbers: at most 20 integer digits, 20 fraction digits and 4 exponent digits (no endless "0.3333...").
//  - anyOf and oneOf both mean anyOf (alternatives are followed in parallel until the text tells them apart).
//
// Thread safety: one constraint per request; mask() uses scratch space inside the object (it is const but not
// reentrant). clone() gives an independent copy sharing the immutable grammar and vocabulary trie.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace strata {

// The vocabulary as the constraint sees it: each token's exact bytes (special tokens as their text, e.g.
// "<tool_call>"), and which ids end generation.
struct ConstraintVocabulary {
    std::vector<std::string> token_bytes;
    std::vector<int32_t> end_tokens;  // eog ids: allowed only when the constrained text is complete
};

class TokenConstraint {
  public:
    virtual ~TokenConstraint() = default;
    // Sets to -infinity the logits of every token that cannot come next (a token is allowed when ALL its bytes keep the
    // text a valid prefix of some string of the language; end tokens only once the text is complete). Logits past the
    // vocabulary's size are set to -infinity too.
    virtual void mask(std::span<float> logits) const = 0;
    // Advances by a token mask() allowed; throws Error for a token it does not allow. Accepting an end token (when
    // complete) ends the text: from then on only end tokens are allowed.
    virtual void accept(int32_t token) = 0;
    virtual bool complete() const = 0;  // the text so far is a whole string of the language
    virtual bool must_end() const = 0;  // complete and nothing can follow: only end tokens remain
    virtual std::unique_ptr<TokenConstraint> clone() const = 0;
};

// A JSON value valid against `schema` (JSON Schema subset: type (string|number|integer|boolean|null|object|array, or a
// list of them), properties, required, additionalProperties (false/true/schema), items, minItems, maxItems, enum,
// const, anyOf/oneOf, $ref to #/$defs|#/definitions, minLength/maxLength, nullable; annotations such as title,
// description, default, examples and format are ignored). {} or true: any JSON value.
// Throws Error (one line, naming the keyword and its path) for unsupported keywords (pattern, minimum, ...) or invalid
// and unsatisfiable schemas.
std::unique_ptr<TokenConstraint> make_json_schema_constraint(std::shared_ptr<const ConstraintVocabulary> vocab,
                                                             const nlohmann::json& schema);

// Qwen's tool-call text: "<tool_call>\n{\"name\": \"NAME\", \"arguments\": ARGS}\n</tool_call>" where NAME is one of
// the tools (or the forced one) and ARGS is valid against that tool's "parameters" schema (a tool without parameters
// takes {}); OpenAI tool list format [{type:"function", function:{name, description, parameters}}]. With
// allow_parallel, one or more calls separated by "\n". Throws Error for a malformed tool list, an unknown forced name
// or an unsupported parameters schema.
std::unique_ptr<TokenConstraint> make_tool_call_constraint(std::shared_ptr<const ConstraintVocabulary> vocab,
                                                           const nlohmann::json& tools,
                                                           std::optional<std::string> forced_name, bool allow_parallel);

// The same for Qwen3.5 / Qwen3-Coder's XML form (an addition to the JSON form above): "<tool_call>\n<function=NAME>\n",
// then for each parameter "<parameter=P>\nVALUE\n</parameter>\n", then "</function>\n</tool_call>"; calls separated
// by "\n". Parameters come from the tool's "parameters" object schema, in any order, each at most once, the required
// ones mandatory, no others. VALUE is raw text for a parameter of type "string" (any UTF-8 text without
// "\n</parameter>\n", or one of its enum strings; minLength/maxLength are not enforced) and a JSON value valid against
// the parameter's schema for any other parameter, as the template writes them (`value | tojson` for objects and
// arrays) and reply parsers read them back.
std::unique_ptr<TokenConstraint> make_xml_tool_call_constraint(std::shared_ptr<const ConstraintVocabulary> vocab,
                                                               const nlohmann::json& tools,
                                                               std::optional<std::string> forced_name,
                                                               bool allow_parallel);

}  // namespace strata
