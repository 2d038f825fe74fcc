// Constrained decoding (src/runtime/token_constraint.h). Oracles: the JSON grammar of RFC 8259 and JSON Schema's
// meaning, written out as accepted / rejected texts; nlohmann::json's parser (independent of ours) for random walks,
// whose results are checked against the schema by a small validator written here; and, for every step, the mask
// compared with accept() token by token (the trie walk against stepping the bytes one at a time).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/token_constraint.h"

namespace strata {
namespace {

using json = nlohmann::json;

constexpr int32_t kByteEnd = 256;

std::shared_ptr<const ConstraintVocabulary> byte_vocab() {
    static const auto vocab = [] {
        auto v = std::make_shared<ConstraintVocabulary>();
        for (int b = 0; b < 256; ++b) v->token_bytes.push_back(std::string(1, static_cast<char>(b)));
        v->token_bytes.push_back("<|im_end|>");
        v->end_tokens = {kByteEnd};
        return v;
    }();
    return vocab;
}

// All single bytes plus JSON-ish fragments (some plain text, some with quotes, escapes, partial UTF-8), special
// tokens as their text, an empty (banned) token and two end tokens.
std::shared_ptr<const ConstraintVocabulary> multi_vocab() {
    static const auto vocab = [] {
        auto v = std::make_shared<ConstraintVocabulary>();
        for (int b = 0; b < 256; ++b) v->token_bytes.push_back(std::string(1, static_cast<char>(b)));
        const std::vector<std::string> pieces = {"{\"",
                                                 "\":",
                                                 "\": ",
                                                 "\": \"",
                                                 "\",",
                                                 "\", \"",
                                                 "\"}",
                                                 "}}",
                                                 "]}",
                                                 "}]",
                                                 "[{",
                                                 "[\"",
                                                 "\"]",
                                                 "\",\"",
                                                 "true",
                                                 "false",
                                                 "null",
                                                 "tr",
                                                 "ue",
                                                 "nu",
                                                 "ll",
                                                 "123",
                                                 "0.",
                                                 "1.5",
                                                 "e+",
                                                 "E-",
                                                 "-1",
                                                 "00",
                                                 "10",
                                                 "99",
                                                 "name",
                                                 "age",
                                                 "city",
                                                 "value",
                                                 "children",
                                                 "Paris",
                                                 " Paris",
                                                 "get",
                                                 "_weather",
                                                 "get_weather",
                                                 "get_time",
                                                 "unit",
                                                 "arguments",
                                                 "\"name\"",
                                                 "\"arguments\"",
                                                 "\": {",
                                                 "\": [",
                                                 "}\n",
                                                 "\n",
                                                 "\n  ",
                                                 "\n    ",
                                                 "  ",
                                                 "    ",
                                                 ",\n",
                                                 ", ",
                                                 ": ",
                                                 " ",
                                                 "\t",
                                                 "\\",
                                                 "\\n",
                                                 "\\\"",
                                                 "\\u",
                                                 "\\ud83d",
                                                 "\\ude00",
                                                 "\\u00e9",
                                                 "00e9",
                                                 "ud83d",
                                                 "\xc3\xa9",
                                                 "\xe6\x97\xa5\xe6\x9c\xac",
                                                 "\xe6\x97",
                                                 "\xa5",
                                                 "\xf0\x9f\x98\x80",
                                                 "\xf0\x9f",
                                                 "\x98\x80",
                                                 "hello",
                                                 " world",
                                                 "hello\"",
                                                 "a\"b",
                                                 "x\\",
                                                 "red",
                                                 "green",
                                                 "blue",
                                                 "Hello",
                                                 " the",
                                                 " of",
                                                 "ing",
                                                 "tion",
                                                 "ab",
                                                 "abc",
                                                 "abcd",
                                                 "xy",
                                                 "\"x\"",
                                                 "\"a\"",
                                                 "\":1",
                                                 "\":\"",
                                                 ",\"",
                                                 "<tool_call>",
                                                 "</tool_call>",
                                                 "<tool_call>\n",
                                                 "\n</tool_call>",
                                                 "{\"name\": \"",
                                                 "\", \"arguments\": ",
                                                 "<|im_start|>",
                                                 "}\n</tool_call>",
                                                 "\"}}\n</tool_call>",
                                                 "ok",
                                                 "\"\"",
                                                 "[]",
                                                 "{}",
                                                 "[ ",
                                                 " ]",
                                                 "\r\n",
                                                 "\xed\xa0\x80",
                                                 "\xc0\xaf",
                                                 "\xff",
                                                 "NaN",
                                                 "Infinity"};
        for (const std::string& p : pieces) v->token_bytes.push_back(p);
        v->token_bytes.push_back("");  // banned
        v->token_bytes.push_back("<|im_end|>");
        v->token_bytes.push_back("<|endoftext|>");
        const auto n = static_cast<int32_t>(v->token_bytes.size());
        v->end_tokens = {n - 2, n - 1};
        return v;
    }();
    return vocab;
}

// Longest match, left to right (every byte is a token, so this always succeeds).
std::vector<int32_t> tokenize(const ConstraintVocabulary& v, const std::string& text, bool bytes_only) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
        int32_t best = static_cast<uint8_t>(text[i]);
        size_t best_len = 1;
        if (!bytes_only) {
            for (size_t id = 256; id < v.token_bytes.size(); ++id) {
                const std::string& t = v.token_bytes[id];
                if (t.size() > best_len && text.compare(i, t.size(), t) == 0 &&
                    std::find(v.end_tokens.begin(), v.end_tokens.end(), static_cast<int32_t>(id)) ==
                        v.end_tokens.end()) {
                    best = static_cast<int32_t>(id);
                    best_len = t.size();
                }
            }
        }
        ids.push_back(best);
        i += best_len;
    }
    return ids;
}

bool allowed_by_mask(const TokenConstraint& c, size_t n_vocab, int32_t token) {
    std::vector<float> logits(n_vocab, 0.0f);
    c.mask(logits);
    return std::isfinite(logits[static_cast<size_t>(token)]);
}

// The mask must allow exactly the tokens that accept() takes, and the end tokens exactly when complete.
void check_mask_against_accept(const TokenConstraint& c, const ConstraintVocabulary& v, const std::string& context) {
    std::vector<float> logits(v.token_bytes.size() + 3, 1.0f);
    c.mask(logits);
    for (size_t k = v.token_bytes.size(); k < logits.size(); ++k) ASSERT_TRUE(std::isinf(logits[k]));
    const bool complete = c.complete();
    for (size_t id = 0; id < v.token_bytes.size(); ++id) {
        auto copy = c.clone();
        bool accepted = true;
        try {
            copy->accept(static_cast<int32_t>(id));
        } catch (const Error&) {
            accepted = false;
        }
        const bool is_end =
            std::find(v.end_tokens.begin(), v.end_tokens.end(), static_cast<int32_t>(id)) != v.end_tokens.end();
        if (is_end) {
            ASSERT_EQ(accepted, complete) << context;
        }
        ASSERT_EQ(std::isfinite(logits[id]), accepted)
            << context << " token " << id << " '" << v.token_bytes[id] << "'";
    }
}

// Feeds `text` (bytes one by one, or longest-match tokens); true when every token is allowed and the text is complete.
bool feeds(const std::shared_ptr<const ConstraintVocabulary>& v, std::unique_ptr<TokenConstraint> c,
           const std::string& text, bool bytes_only, bool cross_check) {
    const std::vector<int32_t> ids = tokenize(*v, text, bytes_only);
    std::string done;
    for (int32_t id : ids) {
        if (cross_check) check_mask_against_accept(*c, *v, "after '" + done + "'");
        const bool allowed = allowed_by_mask(*c, v->token_bytes.size(), id);
        bool accepted = true;
        try {
            c->accept(id);
        } catch (const Error&) {
            accepted = false;
        }
        EXPECT_EQ(allowed, accepted) << "after '" << done << "' token '" << v->token_bytes[static_cast<size_t>(id)]
                                     << "'";
        if (!accepted) return false;
        done += v->token_bytes[static_cast<size_t>(id)];
    }
    if (cross_check) check_mask_against_accept(*c, *v, "at the end of '" + done + "'");
    const bool complete = c->complete();
    EXPECT_EQ(allowed_by_mask(*c, v->token_bytes.size(), v->end_tokens[0]), complete) << text;
    if (complete) {
        c->accept(v->end_tokens[0]);
        EXPECT_TRUE(c->must_end());
    }
    return complete;
}

struct Case {
    json schema;
    std::vector<std::string> accept;
    std::vector<std::string> reject;
};

void run_schema_case(const Case& k) {
    for (const bool bytes_only : {true, false}) {
        const auto v = bytes_only ? byte_vocab() : multi_vocab();
        for (const std::string& text : k.accept)
            EXPECT_TRUE(feeds(v, make_json_schema_constraint(v, k.schema), text, bytes_only, !bytes_only))
                << "schema " << k.schema.dump() << " should accept: " << text << (bytes_only ? " (bytes)" : "");
        for (const std::string& text : k.reject)
            EXPECT_FALSE(feeds(v, make_json_schema_constraint(v, k.schema), text, bytes_only, false))
                << "schema " << k.schema.dump() << " should reject: " << text << (bytes_only ? " (bytes)" : "");
    }
}

TEST(TokenConstraint, AnyJsonValueFollowsRfc8259) {
    run_schema_case({json::object(),
                     {"{}",
                      "[]",
                      "\"x\"",
                      "0",
                      "-0",
                      "1.5e+10",
                      "1E5",
                      "0.0",
                      "-12.25E-3",
                      "true",
                      "false",
                      "null",
                      "{\"a\":[1,{\"b\":null}],\"c\":\"\\u00e9\\ud83d\\ude00\"}",
                      "{\"a\" : 1 }",
                      "[1, 2 ,3]",
                      "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
                      "\"\xc3\xa9\xe6\x97\xa5\xe6\x9c\xac\xf0\x9f\x98\x80\"",
                      "{\"\":1}",
                      "{\"a\\u0041\":1}",
                      "\"\x7f\"",
                      "[[[[]]]]",
                      "\"\\u0000\"",
                      "{\"a\":{\"a\":{}}}",
                      "[\n  1,\n  2\n]",
                      "\"hello\\\"world\"",
                      "\"\\uD83D\\uDE00\""},
                     {"{",
                      "[1,]",
                      "{\"a\":1,}",
                      "01",
                      "-",
                      "1.",
                      ".5",
                      "+1",
                      "1e",
                      "1e+",
                      "tru",
                      "nul",
                      "True",
                      "\"abc",
                      "\"\\x\"",
                      "\"\\u12\"",
                      "\"\\ud800\"",
                      "\"\\udc00\"",
                      "\"\\ud800\\u0041\"",
                      std::string("\"a\x01\""),
                      "\"\xc0\xaf\"",
                      "\"\xed\xa0\x80\"",
                      "\"\xf4\x90\x80\x80\"",
                      "\"\xff\"",
                      "\"\xe6\x97\"",
                      "'a'",
                      "[1 2]",
                      "{\"a\" 1}",
                      "{a:1}",
                      "NaN",
                      "Infinity",
                      "1 2",
                      "{}{}",
                      "[" + std::string(21, ' ') + "]",
                      "[\n\n\n1]",
                      std::string("\"a\"\0", 4),
                      "[,]",
                      "{,}",
                      "\"\n\"",
                      "-01",
                      "0x1",
                      "{\"a\":}",
                      "[1,2",
                      ""}});
}

TEST(TokenConstraint, ObjectPropertiesRequiredAndAnyOrder) {
    const json schema = json::parse(R"({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "integer"}}, "required": ["name"]})");
    run_schema_case({schema,
                     {"{\"name\":\"x\"}", "{\"name\":\"x\",\"age\":3}", "{\"age\":3,\"name\":\"x\"}",
                      "{ \"name\" : \"x\" , \"age\" : -12 }", "{\n  \"name\": \"Paris\",\n  \"age\": 10\n}"},
                     {"{}", "{\"age\":3}", "{\"name\":\"x\",\"name\":\"y\"}", "{\"name\":\"x\",\"extra\":1}",
                      "{\"name\":1}", "{\"name\":\"x\",\"age\":3.5}", "{\"name\":\"x\",\"age\":1e3}", "{\"nam\":\"x\"}",
                      "{\"names\":\"x\"}", "{\"name\":\"x\",}", "[]", "{\"n\\u0061me\":\"x\"}", "null"}});
}

TEST(TokenConstraint, AdditionalProperties) {
    run_schema_case({json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                    "additionalProperties": true})"),
                     {"{\"a\":1,\"b\":\"x\"}", "{\"ab\":[1]}", "{\"b\":{\"c\":null}}", "{}", "{\"\":1,\"a\":2}"},
                     {"{\"a\":\"x\"}", "{\"a\":1,\"a\":2}", "{\"b\\n\":1}"}});
    run_schema_case({json::parse(R"({"type": "object", "additionalProperties": {"type": "number"}})"),
                     {"{\"x\":1,\"y\":2.5}", "{}", "{\"\\n\":1}"},
                     {"{\"x\":\"s\"}", "{\"x\":null}"}});
    run_schema_case({json::parse(R"({"type": "object", "properties": {"a": false, "b": {"type": "null"}},
                                    "additionalProperties": true})"),
                     {"{\"b\":null}", "{\"c\":1,\"b\":null}", "{\"ab\":1}"},
                     {"{\"a\":1}", "{\"b\":1}"}});
    run_schema_case({json::parse(R"({"type": "object", "properties": {}, "additionalProperties": false})"),
                     {"{}", "{ }"},
                     {"{\"a\":1}"}});
    // Names that need escapes are written with them.
    run_schema_case({json::parse(R"({"type": "object", "properties": {"a\"b": {"type": "null"},
                                    "\u00e9": {"type": "null"}}})"),
                     {"{\"a\\\"b\":null}", "{\"\xc3\xa9\":null}", "{\"\xc3\xa9\":null,\"a\\\"b\":null}"},
                     {"{\"a\\u0022b\":null}", "{\"a\"b\":null}"}});
    // A required name that is not declared takes the additionalProperties schema.
    run_schema_case(
        {json::parse(R"({"type": "object", "required": ["k"], "additionalProperties": {"type": "string"}})"),
         {"{\"k\":\"v\"}", "{\"j\":\"w\",\"k\":\"v\"}"},
         {"{}", "{\"k\":1}", "{\"j\":\"w\"}"}});
}

TEST(TokenConstraint, Arrays) {
    run_schema_case({json::parse(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3})"),
                     {"[true]", "[true,false,true]", "[ false ]", "[\n  true\n]"},
                     {"[]", "[true,true,true,true]", "[1]", "[true,]", "[true false]"}});
    run_schema_case({json::parse(R"({"type": "array", "items": false})"), {"[]", "[ ]"}, {"[1]", "[null]"}});
    run_schema_case({json::parse(R"({"type": "array"})"), {"[]", "[1,\"a\",null,[{}]]"}, {"{}", "[1,]"}});
}

TEST(TokenConstraint, StringLengthCountsCodePoints) {
    run_schema_case({json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"),
                     {"\"ab\"", "\"abc\"", "\"\xc3\xa9\xe6\x97\xa5\"", "\"\\u00e9\\n\"",
                      "\"\xf0\x9f\x98\x80\xf0\x9f\x98\x80\"", "\"\\ud83d\\ude00a\""},
                     {"\"a\"", "\"abcd\"", "\"\"", "\"\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5x\"", "\"\\ud83d\"",
                      "\"\\u00e9\\u00e9\\u00e9\\u00e9\""}});
    run_schema_case({json::parse(R"({"type": "string", "maxLength": 0})"), {"\"\""}, {"\"a\""}});
}

TEST(TokenConstraint, EnumAndConst) {
    run_schema_case({json::parse(R"({"enum": ["red", "green", 1, 10, null, {"a": 1}, [true]]})"),
                     {"\"red\"", "\"green\"", "1", "10", "null", "{\"a\":1}", "[true]"},
                     {"\"blue\"", "100", "\"re\"", "2", "{\"a\": 1}", "\"red\"x", "true"}});
    run_schema_case({json::parse(R"({"type": "string", "enum": ["a", 1]})"), {"\"a\""}, {"1"}});
    run_schema_case({json::parse(R"({"const": "x"})"), {"\"x\""}, {"\"y\"", "x"}});
    run_schema_case({json::parse(R"({"type": "array", "items": {"enum": [1, 12]}})"),
                     {"[1,12]", "[12, 1]", "[1]"},
                     {"[123]", "[2]", "[1,]"}});
}

TEST(TokenConstraint, UnionsTypeListsAndNullable) {
    run_schema_case({json::parse(R"({"anyOf": [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
        {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]})"),
                     {"{\"a\":\"x\"}", "{\"b\":1}"},
                     {"{\"a\":1}", "{\"a\":\"x\",\"b\":1}", "{}"}});
    run_schema_case({json::parse(R"({"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})"),
                     {"1", "\"a\""},
                     {"1.5", "\"ab\""}});
    run_schema_case({json::parse(R"({"type": ["string", "null"]})"), {"\"x\"", "null"}, {"1", "nul"}});
    // Two alternatives alive through a whole string (the mask's plain-text shortcut with more than one stack).
    run_schema_case({json::parse(R"({"anyOf": [{"type": "string"}, {"type": "string", "minLength": 3}]})"),
                     {"\"hello world\"", "\"\"", "\"a\\\"b\\u00e9\xe6\x97\xa5\""},
                     {"\"a", "\"\xe6\x97\"", "\"a\"b\""}});
    run_schema_case({json::parse(R"({"type": "integer", "nullable": true})"), {"5", "null"}, {"\"5\"", "5.5"}});
    run_schema_case({json::parse(R"({"type": ["integer", "number"]})"), {"5", "5.5"}, {"\"5\""}});
    run_schema_case({json::parse(R"({"anyOf": [{"type": "string"}, {"type": "null"}], "description": "d",
                                    "default": null, "title": "t"})"),
                     {"\"x\"", "null"},
                     {"1"}});
}

TEST(TokenConstraint, RefsAndRecursion) {
    const json tree = json::parse(R"({"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"]}}, "$ref": "#/$defs/node"})");
    run_schema_case({tree,
                     {"{\"value\":1,\"children\":[{\"value\":2},{\"value\":3,\"children\":[]}]}", "{\"value\":0}"},
                     {"{\"value\":1,\"children\":[{}]}", "{\"children\":[]}"}});
    run_schema_case({json::parse(R"({"definitions": {"x": {"type": "boolean"}}, "type": "array",
                                    "items": {"$ref": "#/definitions/x"}})"),
                     {"[true]", "[]"},
                     {"[1]"}});
    // A recursive value through anyOf (a linked list that may end in null).
    run_schema_case({json::parse(R"({"$defs": {"list": {"anyOf": [{"type": "null"}, {"type": "object",
        "properties": {"next": {"$ref": "#/$defs/list"}}, "required": ["next"]}]}}, "$ref": "#/$defs/list"})"),
                     {"null", "{\"next\":null}", "{\"next\":{\"next\":null}}"},
                     {"{}", "{\"next\":1}"}});
}

TEST(TokenConstraint, NumbersFollowRfc8259) {
    run_schema_case(
        {json::parse(R"({"type": "number"})"),
         {"0", "-0.5", "1e10", "1E-2", "123.456e+7", "12345678901234567890", "-0", "0e0", "0.0e-0"},
         {"1.", "-", "00", "1e", "1e+", ".1", "123456789012345678901", "0x1", "1.2.3", "--1", "1e1e1", "- 1", "1 .5"}});
    run_schema_case({json::parse(R"({"type": "integer"})"), {"0", "-7", "42"}, {"1.0", "1e2", "-0.0", "0.5"}});
}

// llama.cpp's json-schema-to-grammar rule (`space ::= | " " | "\n" [ \t]{0,20}`) with the indent also bounded by the
// depth: between tokens nothing, one space, or one LF and at most 4 spaces/tabs per open object or array (20 in all);
// nothing around the top-level value.
TEST(TokenConstraint, WhitespaceIsBounded) {
    const std::string four(4, ' '), five(5, ' ');
    const json integers = json::parse(R"({"type": "array", "items": {"type": "integer"}})");
    run_schema_case({integers,
                     {"[1,2]", "[ 1 , 2 ]", "[\n1,\n2\n]", "[\n" + four + "1,\n" + four + "2\n]", "[\n\t\t1,\n \t2\n]",
                      "[1\n\t\t\t\t]"},
                     {"[  1]", "[1,  2]", "[1 ,\t2]", "[\n\n1]", "[1\n\n]", "[ \n1]", "[\t1]", "[\r\n1]", "[1\r]",
                      "[\n" + five + "1]", "[1\n\t\t\t\t\t]", " [1]", "\n[1]", "[1] ", "[1]\n", "[1]\n  "}});
    // The indent bound grows by 4 a level up to 20.
    const auto depth = [](int levels, int indent) {
        return std::string(static_cast<size_t>(levels), '[') + "\n" + std::string(static_cast<size_t>(indent), ' ') +
               "1" + std::string(static_cast<size_t>(levels), ']');
    };
    run_schema_case({json::object(),
                     {depth(2, 8), depth(3, 12), depth(5, 20), depth(6, 20), depth(8, 20)},
                     {depth(2, 9), depth(3, 13), depth(5, 21), depth(6, 21), depth(8, 21)}});
    // The issue's case: an object with one string property.
    const json one_string = json::parse(
        R"({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
            "additionalProperties": false})");
    run_schema_case(
        {one_string,
         {"{\"name\":\"Ada\"}", "{\"name\": \"Ada\"}", "{ \"name\" : \"Ada\" }", "{\n  \"name\": \"Ada\"\n}",
          "{\n\t\"name\": \"a  b\"\n}", "{\n    \"name\"\n    : \"Ada\"\n    }"},
         {"    {\n                   \"name\"\n                   :                    ",
          "{\n" + std::string(20, ' ') + "\"name\": \"Ada\"}", "{\"name\":  \"Ada\"}", "{\n\n\"name\":\"Ada\"}",
          "{\"name\":\"Ada\"}\n"}});
    // json_object mode (response_format type json_object) is the schema {"type": "object"}: the same rule.
    run_schema_case({json::parse(R"({"type": "object"})"),
                     {"{\n    \"a\": [\n        1\n    ]\n}", "{\"a\": {\"b\": []}}"},
                     {"{\n     \"a\": 1}", "{\"a\":  1}", " {}", "{}\n"}});
}

// Nested containers whose innermost items sit at an indent of depth * indent: objects and arrays in turn.
json nested_value(int depth) {
    if (depth == 1) return json::array({1, "x"});
    if (depth % 2 == 0) return json{{"a", nested_value(depth - 1)}, {"b", true}};
    return json::array({nested_value(depth - 1), nullptr});
}

// Pretty-printed JSON (nlohmann's dump(indent), the same layout as Python's json.dumps(indent=...)) is accepted while
// its deepest indent fits the bound of 20: to a depth of 10 at an indent of 2, 5 at an indent of 4.
TEST(TokenConstraint, PrettyPrintedJsonFitsUpToTheIndentBound) {
    for (const int indent : {2, 4}) {
        const int deepest = 20 / indent;
        for (int depth = 1; depth <= deepest + 1; ++depth) {
            const std::string text = nested_value(depth).dump(indent);
            const bool fits = depth <= deepest;
            for (const bool bytes_only : {true, false}) {
                const auto v = bytes_only ? byte_vocab() : multi_vocab();
                EXPECT_EQ(feeds(v, make_json_schema_constraint(v, json::object()), text, bytes_only, false), fits)
                    << "indent " << indent << " depth " << depth << ":\n"
                    << text;
            }
        }
    }
}

TEST(TokenConstraint, CompleteAndMustEnd) {
    const auto v = byte_vocab();
    auto c = make_json_schema_constraint(v, json::parse(R"({"type": "integer"})"));
    EXPECT_FALSE(c->complete());
    c->accept('1');
    EXPECT_TRUE(c->complete());  // "1" is whole, but "12" could follow
    EXPECT_FALSE(c->must_end());
    c->accept('2');
    auto copy = c->clone();
    c->accept(kByteEnd);
    EXPECT_TRUE(c->must_end());
    EXPECT_FALSE(allowed_by_mask(*c, v->token_bytes.size(), '3'));
    EXPECT_TRUE(allowed_by_mask(*c, v->token_bytes.size(), kByteEnd));
    EXPECT_THROW(c->accept('3'), Error);
    // The clone is independent.
    EXPECT_FALSE(copy->must_end());
    copy->accept('3');
    EXPECT_THROW(copy->accept('x'), Error);
    EXPECT_THROW(copy->accept(-1), Error);
    EXPECT_THROW(copy->accept(100000), Error);

    auto obj = make_json_schema_constraint(v, json::parse(R"({"type": "object"})"));
    EXPECT_THROW(obj->accept(kByteEnd), Error);  // not complete yet
    obj->accept('{');
    obj->accept('}');
    EXPECT_TRUE(obj->complete());
    EXPECT_TRUE(obj->must_end());  // nothing may follow the top-level value, not even whitespace
}

TEST(TokenConstraint, RejectedTokenLeavesStateUnchanged) {
    const auto v = multi_vocab();
    auto c =
        make_json_schema_constraint(v, json::parse(R"({"type": "object", "properties": {"a": {"type": "null"}}})"));
    c->accept('{');
    const auto ids = tokenize(*v, "\"b", false);
    EXPECT_THROW(c->accept(ids[0] == '"' ? ids[1] : ids[0]), Error);                  // 'b' cannot start a key here
    EXPECT_THROW(c->accept(static_cast<int32_t>(v->token_bytes.size() - 3)), Error);  // the empty (banned) token
    for (int32_t id : tokenize(*v, "\"a\":null}", false)) c->accept(id);
    EXPECT_TRUE(c->complete());
}

TEST(TokenConstraint, DeepNestingStaysLinear) {
    const auto v = byte_vocab();
    auto c = make_json_schema_constraint(v, json::object());
    const int depth = 10000;
    auto feed = [&](const std::string& text) {
        for (char ch : text) c->accept(static_cast<uint8_t>(ch));
    };
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < depth; ++i) feed("{\"\":[");
    EXPECT_FALSE(c->complete());
    std::vector<float> logits(v->token_bytes.size(), 0.0f);
    c->mask(logits);
    EXPECT_TRUE(std::isfinite(logits['{']));
    EXPECT_TRUE(std::isfinite(logits[']']));
    EXPECT_TRUE(std::isinf(logits['}']));
    for (int i = 0; i < depth; ++i) feed(i == 0 ? "1]}" : "]}");
    EXPECT_TRUE(c->complete());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 5.0);  // copying the whole stack per byte would take minutes
}

// --- tool calls ------------------------------------------------------------------------------------------------

const json& weather_tools() {
    static const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                          "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
      {"type": "function", "function": {"name": "get"}}])");
    return tools;
}

std::string call_text(const std::string& name, const std::string& args) {
    return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
}

TEST(TokenConstraint, ToolCalls) {
    for (const bool bytes_only : {true, false}) {
        const auto v = bytes_only ? byte_vocab() : multi_vocab();
        auto check = [&](std::optional<std::string> forced, bool parallel, const std::string& text) {
            return feeds(v, make_tool_call_constraint(v, weather_tools(), forced, parallel), text, bytes_only,
                         !bytes_only);
        };
        const std::string weather = call_text("get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}");
        EXPECT_TRUE(check(std::nullopt, false, weather));
        EXPECT_TRUE(check(std::nullopt, false, call_text("get", "{}")));
        EXPECT_TRUE(check(std::nullopt, false, call_text("get_time", "{ }")));
        EXPECT_TRUE(check("get_weather", false, weather));
        EXPECT_FALSE(check("get_time", false, weather));
        EXPECT_FALSE(check(std::nullopt, false, call_text("get_weather", "{}")));  // city is required
        EXPECT_FALSE(check(std::nullopt, false, call_text("get_weathers", "{\"city\": \"x\"}")));
        EXPECT_FALSE(check(std::nullopt, false, call_text("get", "{\"a\": 1}")));
        EXPECT_FALSE(check(std::nullopt, false, "<tool_call>{\"name\": \"get\", \"arguments\": {}}\n</tool_call>"));
        EXPECT_FALSE(check(std::nullopt, false, "<tool_call>\n{\"name\":\"get\",\"arguments\":{}}\n</tool_call>"));
        EXPECT_FALSE(check(std::nullopt, false, "hello"));
        const std::string two = weather + "\n" + call_text("get", "{}");
        EXPECT_TRUE(check(std::nullopt, true, two));
        EXPECT_TRUE(check(std::nullopt, true, weather));
        EXPECT_FALSE(check(std::nullopt, false, two));
        EXPECT_FALSE(check(std::nullopt, true, weather + "\n"));
        // The arguments sit inside the call's object: pretty-printed at an indent of 4, their keys are at 8.
        EXPECT_TRUE(check(std::nullopt, false, call_text("get_weather", "{\n        \"city\": \"Paris\"\n    }")));
        EXPECT_FALSE(check(std::nullopt, false, call_text("get_weather", "{\n         \"city\": \"Paris\"}")));
        EXPECT_FALSE(check(std::nullopt, false, call_text("get_weather", "{\"city\":  \"Paris\"}")));
    }
    const auto v = byte_vocab();
    auto single = make_tool_call_constraint(v, weather_tools(), std::nullopt, false);
    for (char ch : call_text("get", "{}")) single->accept(static_cast<uint8_t>(ch));
    EXPECT_TRUE(single->complete());
    EXPECT_TRUE(single->must_end());
    auto parallel = make_tool_call_constraint(v, weather_tools(), std::nullopt, true);
    for (char ch : call_text("get", "{}")) parallel->accept(static_cast<uint8_t>(ch));
    EXPECT_TRUE(parallel->complete());
    EXPECT_FALSE(parallel->must_end());
}

// --- tool calls, Qwen3.5's XML form ---------------------------------------------------------------------------

const json& xml_tools() {
    static const json tools = [] {
        json t = weather_tools();
        t.push_back(json::parse(R"({"type": "function", "function": {"name": "book", "parameters": {"type": "object",
            "properties": {"days": {"type": "integer"}, "extra": {"type": "object", "properties": {
            "hourly": {"type": "boolean"}}}, "note": {"type": ["string", "null"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["days"]}}})"));
        return t;
    }();
    return tools;
}

std::string xml_call(const std::string& name, const std::vector<std::pair<std::string, std::string>>& params) {
    std::string text = "<tool_call>\n<function=" + name + ">\n";
    for (const auto& [p, value] : params) text += "<parameter=" + p + ">\n" + value + "\n</parameter>\n";
    return text + "</function>\n</tool_call>";
}

TEST(TokenConstraint, XmlToolCalls) {
    for (const bool bytes_only : {true, false}) {
        const auto v = bytes_only ? byte_vocab() : multi_vocab();
        auto check = [&](std::optional<std::string> forced, bool parallel, const std::string& text) {
            return feeds(v, make_xml_tool_call_constraint(v, xml_tools(), forced, parallel), text, bytes_only,
                         !bytes_only);
        };
        const std::string weather = xml_call("get_weather", {{"city", "Z\xc3\xbcrich"}, {"unit", "c"}});
        EXPECT_TRUE(check(std::nullopt, false, weather));
        EXPECT_TRUE(
            check("get_weather", false, xml_call("get_weather", {{"unit", "f"}, {"city", "a</parameter>b\n\"c\\"}})));
        EXPECT_TRUE(check(std::nullopt, false, xml_call("get_weather", {{"city", ""}})));
        EXPECT_TRUE(check(std::nullopt, false, xml_call("get", {})));
        EXPECT_TRUE(check(
            std::nullopt, false,
            xml_call("book", {{"days", "3"}, {"extra", "{\"hourly\": true}"}, {"note", "null"}, {"unit", "celsius"}})));
        EXPECT_TRUE(check(std::nullopt, false, xml_call("book", {{"note", "\"x\""}, {"days", "-1"}})));
        EXPECT_TRUE(check(std::nullopt, true, weather + "\n" + xml_call("get", {})));
        EXPECT_FALSE(check(std::nullopt, false, weather + "\n" + xml_call("get", {})));
        EXPECT_FALSE(check("get", false, weather));
        EXPECT_FALSE(check(std::nullopt, false, xml_call("get_weather", {{"unit", "c"}})));  // city is required
        EXPECT_FALSE(check(std::nullopt, false, xml_call("get_weather", {{"city", "a"}, {"city", "b"}})));
        EXPECT_FALSE(check(std::nullopt, false, xml_call("get_weather", {{"city", "a"}, {"unit", "k"}})));
        EXPECT_FALSE(check(std::nullopt, false, xml_call("get_weather", {{"city", "a"}, {"zone", "k"}})));
        EXPECT_FALSE(check(std::nullopt, false, xml_call("book", {{"days", "3.5"}})));
        EXPECT_FALSE(check(std::nullopt, false, xml_call("book", {{"days", "3"}, {"note", "x"}})));  // JSON: "x"
        EXPECT_FALSE(check(std::nullopt, false, xml_call("book", {{"days", "3"}, {"unit", "\"celsius\""}})));
        EXPECT_FALSE(check(std::nullopt, false, xml_call("nope", {})));
        EXPECT_FALSE(check(std::nullopt, false, xml_call("get_weather", {{"city", "\xff"}})));
        EXPECT_FALSE(check(std::nullopt, false, "<tool_call>\n<function=get>\n</function></tool_call>"));
    }
    EXPECT_THROW(make_xml_tool_call_constraint(byte_vocab(), json::parse(R"([{"function": {"name": "a>b"}}])"),
                                               std::nullopt, false),
                 Error);
    EXPECT_THROW(make_xml_tool_call_constraint(byte_vocab(), json::parse(R"([{"function": {"name": "a",
                     "parameters": {"type": "object", "properties": {}, "required": ["x"]}}}])"),
                                               std::nullopt, false),
                 Error);
}

// --- bad schemas -----------------------------------------------------------------------------------------------

void expect_schema_error(const json& schema, const std::string& needle) {
    try {
        make_json_schema_constraint(byte_vocab(), schema);
        ADD_FAILURE() << "no error for " << schema.dump();
    } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(needle), std::string::npos) << what;
        EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
}

TEST(TokenConstraint, BadSchemasThrowOneLineErrors) {
    expect_schema_error(json::parse(R"({"type": "string", "pattern": "^a$"})"), "'pattern'");
    expect_schema_error(json::parse(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}})"),
                        "#/properties/n: unsupported keyword 'minimum'");
    expect_schema_error(json::parse(R"({"type": "foo"})"), "unknown type 'foo'");
    expect_schema_error(json::parse(R"({"type": 5})"), "'type'");
    expect_schema_error(json::parse(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})"),
                        "required property 'b'");
    expect_schema_error(json::parse(R"({"type": "array", "minItems": 3, "maxItems": 2})"), "minItems");
    expect_schema_error(json::parse(R"({"type": "string", "minLength": 3, "maxLength": 2})"), "minLength");
    expect_schema_error(json::parse(R"({"type": "string", "minLength": -1})"), "minLength");
    expect_schema_error(json::parse(R"({"enum": []})"), "enum");
    expect_schema_error(json::parse(R"({"type": "string", "enum": [1, 2]})"), "enum");
    expect_schema_error(json::parse(R"({"$ref": "http://example.com/s.json"})"), "$ref");
    expect_schema_error(json::parse(R"({"$ref": "#/$defs/missing"})"), "#/$defs/missing");
    expect_schema_error(json::parse(R"({"$ref": "#"})"), "loop");
    expect_schema_error(json::parse(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
                                       "$ref": "#/$defs/a"})"),
                        "loop");
    expect_schema_error(json(false), "no value");
    expect_schema_error(json(5), "must be an object or a boolean");
    expect_schema_error(json::parse(R"({"anyOf": []})"), "anyOf");
    expect_schema_error(json::parse(R"({"type": "object", "anyOf": [{}]})"), "anyOf");
    expect_schema_error(json::parse(R"({"type": "array", "items": [{}]})"), "tuple");
    expect_schema_error(json::parse(R"({"type": "array", "items": false, "minItems": 1})"), "no value");
    // Required recursion with no way out admits no finite value.
    expect_schema_error(json::parse(R"({"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
                                       "required": ["x"]}}, "$ref": "#/$defs/a"})"),
                        "no value");
    json many = {{"type", "object"}, {"properties", json::object()}};
    for (int i = 0; i < 65; ++i) {
        std::string name = "p";  // built with append: g++ 12 at -O3 warns falsely (-Wrestrict) on "p" + to_string
        name.append(std::to_string(i));
        many["properties"][name] = json::object();
    }
    expect_schema_error(many, "64");
    expect_schema_error(json::parse(R"({"nullable": "yes"})"), "nullable");
    expect_schema_error(json::parse(R"({"properties": {"a\nb": {"pattern": "x"}}})"), "#/properties/a b:");
    json deep = json::object();
    for (int i = 0; i < 1000; ++i) deep = json{{"type", "array"}, {"items", deep}};
    expect_schema_error(deep, "nested deeper");
    expect_schema_error(json::parse(R"({"const": 1, "enum": [2]})"), "const");

    auto tool_error = [](const json& tools, std::optional<std::string> forced, const std::string& needle) {
        try {
            make_tool_call_constraint(byte_vocab(), tools, forced, false);
            ADD_FAILURE() << "no error for " << tools.dump();
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    tool_error(json::object(), std::nullopt, "non-empty array");
    tool_error(json::array(), std::nullopt, "non-empty array");
    tool_error(weather_tools(), "nope", "'nope'");
    tool_error(json::parse(R"([{"type": "code_interpreter"}])"), std::nullopt, "function");
    tool_error(json::parse(R"([{"type": "function", "function": {}}])"), std::nullopt, "name");
    tool_error(json::parse(R"([{"function": {"name": "a"}}, {"function": {"name": "a"}}])"), std::nullopt, "two");
    tool_error(json::parse(R"([{"function": {"name": "a", "parameters": {"type": "string", "pattern": "x"}}}])"),
               std::nullopt, "tools[0].function.parameters#: unsupported keyword 'pattern'");
    EXPECT_THROW(make_json_schema_constraint(nullptr, json::object()), Error);
}

// --- random walks, checked by an independent parser and validator ---------------------------------------------

size_t code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char ch : s) n += (ch & 0xc0) != 0x80;
    return n;
}

// JSON Schema's meaning for the keywords we support, plus our stricter rule (declared properties exclude others).
bool validates(const json& v, const json& s, const json& root, std::string& why) {
    if (s.is_boolean()) {
        if (!s.get<bool>()) why = "false schema";
        return s.get<bool>();
    }
    if (s.contains("$ref"))
        return validates(v, root.at(json::json_pointer(s["$ref"].get<std::string>().substr(1))), root, why);
    if (s.value("nullable", false) && v.is_null()) return true;
    for (const char* kw : {"anyOf", "oneOf"}) {
        if (!s.contains(kw)) continue;
        for (const json& alt : s[kw])
            if (validates(v, alt, root, why)) return true;
        why = std::string("no ") + kw + " alternative matches " + v.dump();
        return false;
    }
    if (s.contains("const") && v != s["const"]) return why = "const", false;
    if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end())
        return why = "enum " + v.dump(), false;
    if (s.contains("type")) {
        const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
        bool ok = false;
        for (const json& t : types) {
            const std::string name = t.get<std::string>();
            ok = ok || (name == "string" && v.is_string()) || (name == "number" && v.is_number()) ||
                 // JSON Schema's integer: any number without a fractional part (beyond uint64, nlohmann reads
                 // a double).
                 (name == "integer" && (v.is_number_integer() || v.is_number_unsigned() ||
                                        (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))) ||
                 (name == "boolean" && v.is_boolean()) || (name == "null" && v.is_null()) ||
                 (name == "object" && v.is_object()) || (name == "array" && v.is_array());
        }
        if (!ok) return why = "type " + types.dump() + " vs " + v.dump(), false;
    }
    if (v.is_string()) {
        const size_t n = code_points(v.get<std::string>());
        if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return why = "minLength", false;
        if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return why = "maxLength", false;
    }
    if (v.is_array()) {
        if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return why = "minItems", false;
        if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return why = "maxItems", false;
        if (s.contains("items"))
            for (const json& e : v)
                if (!validates(e, s["items"], root, why)) return false;
    }
    if (v.is_object()) {
        for (const json& r : s.value("required", json::array()))
            if (!v.contains(r.get<std::string>())) return why = "required " + r.dump(), false;
        const json props = s.value("properties", json::object());
        for (const auto& [key, value] : v.items()) {
            if (props.contains(key)) {
                if (!validates(value, props[key], root, why)) return false;
            } else if (s.contains("additionalProperties")) {
                if (!validates(value, s["additionalProperties"], root, why)) return why += " (additional)", false;
            } else if (s.contains("properties")) {
                return why = "undeclared key " + key, false;  // our stricter default
            }
        }
    }
    return true;
}

// Random logits; after a while, prefer tokens that close things so that walks end.
// `terminator`: text the walk also steers towards, one byte at a time (the end of a raw XML parameter value).
std::string random_walk(TokenConstraint& c, const ConstraintVocabulary& v, std::mt19937& rng, bool& ended,
                        bool cross_check = false, const std::string& terminator = "") {
    std::string text;
    std::vector<float> logits(v.token_bytes.size());
    std::normal_distribution<float> normal(0.0f, 2.0f);
    const std::vector<std::string> closers = {"\"", "}", "]", "0", "n", "\"}", "}}", "]}"};
    ended = false;
    for (int step = 0; step < 4000; ++step) {
        if (c.must_end()) {
            ended = true;
            break;
        }
        if (cross_check) check_mask_against_accept(c, v, "random walk after '" + text + "'");
        for (float& l : logits) l = normal(rng);
        c.mask(logits);
        std::vector<int32_t> allowed;
        for (size_t id = 0; id < logits.size(); ++id)
            if (std::isfinite(logits[id])) allowed.push_back(static_cast<int32_t>(id));
        EXPECT_FALSE(allowed.empty()) << "dead end after: " << text;
        if (allowed.empty()) break;
        int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        if (step > 25 && std::uniform_int_distribution<int>(0, 9)(rng) < 8) {
            bool found = false;
            for (int32_t id : v.end_tokens)
                if (!found && std::isfinite(logits[static_cast<size_t>(id)])) pick = id, found = true;
            size_t matched = std::min(terminator.size(), text.size());
            while (matched > 0 && text.compare(text.size() - matched, matched, terminator, 0, matched) != 0) --matched;
            if (!found && matched < terminator.size()) {
                const auto next = static_cast<uint8_t>(terminator[matched]);
                if (std::isfinite(logits[next])) pick = next, found = true;
            }
            for (const std::string& closer : closers)
                for (int32_t id : allowed)
                    if (!found && v.token_bytes[static_cast<size_t>(id)] == closer) pick = id, found = true;
        }
        c.accept(pick);
        if (std::find(v.end_tokens.begin(), v.end_tokens.end(), pick) != v.end_tokens.end()) {
            ended = true;
            break;
        }
        text += v.token_bytes[static_cast<size_t>(pick)];
    }
    return text;
}

const std::vector<json>& walk_schemas() {
    static const std::vector<json> schemas = {
        json::object(),
        json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 3},
            "ok": {"type": "boolean"}, "score": {"type": ["number", "null"]}}, "required": ["name", "ok"]})"),
        json::parse(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}},
            "$ref": "#/$defs/node"})"),
        json::parse(R"({"type": "array", "items": {"anyOf": [{"type": "string", "minLength": 2, "maxLength": 4},
            {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
            {"type": "object", "properties": {"y": {"const": [1, {"z": null}]}}, "required": ["y"]}]},
            "minItems": 1, "maxItems": 4})"),
        json::parse(R"({"type": "object", "properties": {"a": {"type": "string"}},
            "additionalProperties": {"type": "integer"}})"),
        json::parse(R"({"type": "object", "additionalProperties": false})"),
    };
    return schemas;
}

TEST(TokenConstraint, RandomWalksParseAndValidate) {
    for (const bool bytes_only : {true, false}) {
        const auto v = bytes_only ? byte_vocab() : multi_vocab();
        std::mt19937 rng(bytes_only ? 1 : 2);
        for (const json& schema : walk_schemas()) {
            for (int walk = 0; walk < 40; ++walk) {
                auto c = make_json_schema_constraint(v, schema);
                bool ended = false;
                const std::string text = random_walk(*c, *v, rng, ended, !bytes_only && walk < 4);
                ASSERT_TRUE(ended) << "walk did not end: " << text;
                json parsed;
                try {
                    parsed = json::parse(text);
                } catch (const json::out_of_range& e) {
                    continue;  // a number beyond double range ("1e999"): valid JSON, nlohmann's own limit
                } catch (const json::exception& e) {
                    ADD_FAILURE() << "nlohmann rejects " << text << ": " << e.what();
                    continue;
                }
                std::string why;
                EXPECT_TRUE(validates(parsed, schema, schema, why)) << text << " vs " << schema.dump() << ": " << why;
            }
        }
    }
}

TEST(TokenConstraint, RandomToolCallsParse) {
    for (const bool bytes_only : {true, false}) {
        const auto v = bytes_only ? byte_vocab() : multi_vocab();
        std::mt19937 rng(bytes_only ? 3 : 4);
        for (int walk = 0; walk < 40; ++walk) {
            const bool parallel = walk % 2 == 1;
            auto c = make_tool_call_constraint(v, weather_tools(), std::nullopt, parallel);
            bool ended = false;
            const std::string text = random_walk(*c, *v, rng, ended, !bytes_only && walk < 4);
            ASSERT_TRUE(ended) << text;
            // Split into calls and parse each one's JSON.
            const std::string open = "<tool_call>\n", close = "\n</tool_call>";
            size_t pos = 0, calls = 0;
            while (pos < text.size()) {
                if (calls > 0) {
                    ASSERT_EQ(text[pos], '\n') << text;
                    ++pos;
                }
                ASSERT_EQ(text.compare(pos, open.size(), open), 0) << text;
                const size_t end = text.find(close, pos);
                ASSERT_NE(end, std::string::npos) << text;
                const json call = json::parse(text.substr(pos + open.size(), end - pos - open.size()));
                ASSERT_TRUE(call.is_object() && call.size() == 2) << text;
                const std::string name = call.at("name").get<std::string>();
                bool found = false;
                for (const json& tool : weather_tools()) {
                    if (tool["function"]["name"] != name) continue;
                    found = true;
                    const json params =
                        tool["function"].value("parameters", json::parse(R"({"type": "object", "properties": {}})"));
                    std::string why;
                    EXPECT_TRUE(validates(call.at("arguments"), params, params, why)) << text << ": " << why;
                }
                EXPECT_TRUE(found) << name;
                pos = end + close.size();
                ++calls;
            }
            EXPECT_GE(calls, 1u);
            if (!parallel) {
                EXPECT_EQ(calls, 1u);
            }
        }
    }
}

// Splits Qwen XML calls and reads each parameter back as the template wrote it (raw text for string parameters).
TEST(TokenConstraint, RandomXmlToolCallsParse) {
    for (const bool bytes_only : {true, false}) {
        const auto v = bytes_only ? byte_vocab() : multi_vocab();
        std::mt19937 rng(bytes_only ? 5 : 6);
        for (int walk = 0; walk < 40; ++walk) {
            auto c = make_xml_tool_call_constraint(v, xml_tools(), std::nullopt, walk % 2 == 1);
            bool ended = false;
            const std::string text = random_walk(*c, *v, rng, ended, !bytes_only && walk < 4, "\n</parameter>\n");
            ASSERT_TRUE(ended) << text;
            size_t pos = 0, calls = 0;
            while (pos < text.size()) {
                if (calls > 0) {
                    ASSERT_EQ(text[pos++], '\n') << text;
                }
                const std::string open = "<tool_call>\n<function=";
                ASSERT_EQ(text.compare(pos, open.size(), open), 0) << text;
                pos += open.size();
                const size_t name_end = text.find(">\n", pos);
                ASSERT_NE(name_end, std::string::npos) << text;
                const std::string name = text.substr(pos, name_end - pos);
                pos = name_end + 2;
                json tool;
                for (const json& t : xml_tools())
                    if (t["function"]["name"] == name) tool = t["function"];
                ASSERT_FALSE(tool.is_null()) << name;
                const json params = tool.value("parameters", json::parse(R"({"type": "object", "properties": {}})"));
                json args = json::object();
                while (text.compare(pos, 11, "<parameter=") == 0) {
                    const size_t p_end = text.find(">\n", pos);
                    const std::string p = text.substr(pos + 11, p_end - pos - 11);
                    const size_t value_end = text.find("\n</parameter>\n", p_end + 2);
                    ASSERT_NE(value_end, std::string::npos) << text;
                    const std::string value = text.substr(p_end + 2, value_end - p_end - 2);
                    ASSERT_FALSE(args.contains(p)) << text;
                    const json& schema = params["properties"][p];
                    const bool raw = schema.value("type", json()) == "string" ||
                                     (!schema.contains("type") && schema.contains("enum"));
                    try {
                        args[p] = raw ? json(value) : json::parse(value);
                    } catch (const json::out_of_range&) {
                        args[p] = 0;  // a number beyond double range: valid JSON, nlohmann's own limit
                    }
                    pos = value_end + 14;
                }
                const std::string close = "</function>\n</tool_call>";
                ASSERT_EQ(text.compare(pos, close.size(), close), 0) << text;
                pos += close.size();
                std::string why;
                EXPECT_TRUE(validates(args, params, params, why)) << text << ": " << why;
                ++calls;
            }
            EXPECT_GE(calls, 1u);
        }
    }
}

// --- speed -----------------------------------------------------------------------------------------------------

// A BPE-like synthetic vocabulary: all bytes, then words with and without a leading space, capitalized words,
// numbers, punctuation runs (some with quotes and newlines), CJK text, partial UTF-8 and whitespace runs.
std::shared_ptr<const ConstraintVocabulary> synthetic_vocab(size_t size, uint32_t seed) {
    auto v = std::make_shared<ConstraintVocabulary>();
    std::set<std::string> seen;
    for (int b = 0; b < 256; ++b) {
        v->token_bytes.push_back(std::string(1, static_cast<char>(b)));
        seen.insert(v->token_bytes.back());
    }
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
    const std::string punct = "\"',.:;!?()[]{}<>-_=+*/\\|@#$%^&~`";
    while (v->token_bytes.size() + 1 < size) {
        std::string t;
        const int kind = pick(100);
        if (kind < 70) {
            if (pick(2)) t += ' ';
            const int len = 2 + pick(9);
            for (int i = 0; i < len; ++i) t += static_cast<char>('a' + pick(26));
            if (kind < 10) t[t[0] == ' ' ? 1 : 0] = static_cast<char>(t[t[0] == ' ' ? 1 : 0] - 32);
        } else if (kind < 75) {
            const int len = 1 + pick(3);
            for (int i = 0; i < len; ++i) t += static_cast<char>('0' + pick(10));
        } else if (kind < 82) {
            const int len = 1 + pick(3);
            for (int i = 0; i < len; ++i) t += punct[static_cast<size_t>(pick(static_cast<int>(punct.size())))];
            if (pick(4) == 0) t += '\n';
        } else if (kind < 92) {
            const int len = 1 + pick(3);
            for (int i = 0; i < len; ++i) {
                const int cp = 0x4e00 + pick(0x5000);
                t += static_cast<char>(0xe0 | (cp >> 12));
                t += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
                t += static_cast<char>(0x80 | (cp & 0x3f));
            }
        } else if (kind < 96) {
            t += static_cast<char>(0xc2 + pick(0x30));
            if (pick(2)) t += static_cast<char>(0x80 + pick(0x40));
            t += static_cast<char>(0x80 + pick(0x40));
        } else {
            const int len = 2 + pick(15);
            t = std::string(static_cast<size_t>(len), pick(3) ? ' ' : '\n');
            if (pick(2)) t = "\n" + t;
        }
        if (seen.insert(t).second) v->token_bytes.push_back(t);
    }
    v->token_bytes.push_back("<|im_end|>");
    v->end_tokens = {static_cast<int32_t>(v->token_bytes.size() - 1)};
    return v;
}

double mask_microseconds(const TokenConstraint& c, size_t n_vocab) {
    std::vector<float> logits(n_vocab, 0.0f);
    c.mask(logits);  // warm the scratch space
    const int reps = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) c.mask(logits);
    const auto end = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(end - start).count() / reps;
}

TEST(TokenConstraint, MaskSpeed) {
    const json schema = json::parse(R"({"type": "object", "properties": {"text": {"type": "string"},
        "n": {"type": "number"}, "list": {"type": "array", "items": {"type": "string"}}}, "required": ["text"]})");
    for (const size_t size : {size_t{8192}, size_t{151665}}) {
        const auto v = synthetic_vocab(size, 7);
        const auto build_start = std::chrono::steady_clock::now();
        auto c = make_json_schema_constraint(v, schema);
        const double build_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - build_start).count();
        auto feed = [&](TokenConstraint& k, const std::string& text) {
            for (char ch : text) k.accept(static_cast<uint8_t>(ch));
        };
        const double at_start = mask_microseconds(*c, size);
        feed(*c, "{\"text\": \"Hello wor");
        const double in_string = mask_microseconds(*c, size);
        auto after_key = c->clone();
        feed(*c, "ld\", \"n\": 12");
        const double in_number = mask_microseconds(*c, size);
        feed(*after_key, "ld\", ");
        const double before_key = mask_microseconds(*after_key, size);
        std::printf(
            "mask() over %zu tokens: first call (trie build + compile) %.1f ms; at start %.0f us, inside a "
            "string %.0f us, in a number %.0f us, before a key %.0f us\n",
            size, build_ms, at_start, in_string, in_number, before_key);
        // Loose bound that still catches a walk that forgets to share prefixes (that takes ~100 ms at 150k).
        EXPECT_LT(in_string, 50000.0);
        // The allowed set inside the string is the bytes-level truth: spot-check a few tokens against accept().
        std::mt19937 rng(1);
        std::vector<float> logits(size, 0.0f);
        auto in_text = make_json_schema_constraint(v, schema);
        feed(*in_text, "{\"text\": \"Hello wor");
        in_text->mask(logits);
        for (int k = 0; k < 2000; ++k) {
            const auto id = static_cast<int32_t>(std::uniform_int_distribution<size_t>(0, size - 1)(rng));
            auto copy = in_text->clone();
            bool accepted = true;
            try {
                copy->accept(id);
            } catch (const Error&) {
                accepted = false;
            }
            ASSERT_EQ(std::isfinite(logits[static_cast<size_t>(id)]), accepted) << id;
        }
    }
}

}  // namespace
}  // namespace strata
