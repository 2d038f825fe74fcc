// The Jinja subset engine against jinja2: tests/data/chat/jinja_cases.golden.json holds templates with the output
// (or the error) of jinja2 3.1 configured as transformers configures it (tools/goldens/make_chat_goldens.py jinja).
// Also: transformers-only tags, bounded rendering, and malformed input giving a one-line Error without crashing.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/jinja_interp.h"

namespace {

using strata::Error;
using strata::jinja::Object;
using strata::jinja::RenderLimits;
using strata::jinja::Template;
using strata::jinja::Value;
using ojson = nlohmann::ordered_json;

ojson load_json(const std::string& path) {
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << path;
    return ojson::parse(f);
}

std::string render(const std::string& source, const ojson& vars = ojson::object(), const RenderLimits& limits = {}) {
    const Value context = Value::from_json(vars.is_object() ? vars : ojson::object());
    return Template::parse(source).render(context.as_object(), limits);
}

// The first byte where two renders differ, with some context, for readable failures.
std::string describe_diff(const std::string& want, const std::string& got) {
    size_t i = 0;
    while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
    const size_t from = i > 40 ? i - 40 : 0;
    return "first difference at byte " + std::to_string(i) + "\n  want: " + ojson(want.substr(from, 100)).dump() +
           "\n  got:  " + ojson(got.substr(from, 100)).dump();
}

TEST(Jinja, MatchesJinja2Goldens) {
    const ojson golden = load_json(std::string(STRATA_TEST_DATA) + "/chat/jinja_cases.golden.json");
    ASSERT_GT(golden["cases"].size(), 100u);
    for (const auto& c : golden["cases"]) {
        const std::string name = c["name"];
        const std::string tmpl = c["template"];
        const ojson& vars = c.contains("vars") ? c["vars"] : golden["vars"];
        SCOPED_TRACE(name + ": " + tmpl);
        if (c.contains("error")) {
            try {
                const std::string out = render(tmpl, vars);
                ADD_FAILURE() << "rendered " << ojson(out).dump() << " but jinja2 failed: " << c["error"].get<std::string>();
            } catch (const Error& e) {
                EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
            }
            continue;
        }
        try {
            const std::string want = c["rendered"];
            const std::string got = render(tmpl, vars);
            EXPECT_EQ(got, want) << describe_diff(want, got);
        } catch (const Error& e) {
            ADD_FAILURE() << "error: " << e.what();
        }
    }
}

TEST(Jinja, GenerationTagRendersItsBody) {
    // transformers' AssistantTracker adds {% generation %}; plain jinja2 lacks it, so it is checked here by hand.
    EXPECT_EQ(render("A{% generation %}gen {{ 1 }}{% endgeneration %}B"), "Agen 1B");
    EXPECT_EQ(render("A\n  {% generation %}\n  x\n  {% endgeneration %}\nB"), "A\n  x\nB");
}

TEST(Jinja, KeyOrderIsInsertionOrder) {
    const ojson vars = ojson::parse(R"({"tool": {"type": "function", "function": {"name": "f", "b": 1, "a": 2}}})");
    EXPECT_EQ(render("{{ tool | tojson }}", vars), R"({"type": "function", "function": {"name": "f", "b": 1, "a": 2}})");
    EXPECT_EQ(render("{% for k in tool.function %}{{ k }}{% endfor %}", vars), "nameba");
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
    strata::testing::expect_error([] { Template::parse("line one\n{{ 1 + }}"); }, "line 2:");
    strata::testing::expect_error([] { Template::parse("{% if x %}\n{% for %}"); }, "line 2:");
    strata::testing::expect_error([] { Template::parse("{% if x %}"); }, "expected 'elif' or 'else' or 'endif'");
    strata::testing::expect_error([] { Template::parse("ok\n\n  {{ 'abc }}"); }, "line 3:6");
    strata::testing::expect_error([] { Template::parse("{% include 'x' %}"); }, "unsupported tag 'include'");
    strata::testing::expect_error([] { Template::parse("{% break %}"); }, "outside of a loop");
}

TEST(Jinja, RuntimeErrorsAreOneLine) {
    strata::testing::expect_error([] { render("\n{{ raise_exception('boom') }}"); }, "boom");
    strata::testing::expect_error([] { render("\n{{ raise_exception('boom') }}"); }, "line 2:");
    strata::testing::expect_error([] { render("{{ missing.attr }}"); }, "'missing' is undefined");
    strata::testing::expect_error([] { render("{{ [1].append(2) }}"); }, "unsafe");
    strata::testing::expect_error([] { render("{{ 1 | nosuch }}"); }, "no filter named 'nosuch'");
    // A key with control characters (found by fuzz_jinja) is named with escapes, so the message stays one line.
    try {
        (void)render("{% set d = {} %}{{ d['a\nb\x01'].c }}");
        ADD_FAILURE() << "no error for an attribute of an undefined value";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        EXPECT_NE(msg.find("a\\nb\\x01"), std::string::npos) << msg;
    }
}

TEST(Jinja, RenderingIsBounded) {
    RenderLimits small;
    small.max_output_bytes = 1 << 16;
    small.max_steps = 200000;
    strata::testing::expect_error([&] { render("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", {}, small); }, "exceeds");
    strata::testing::expect_error([&] { render("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", {}, small); }, "too long");
    strata::testing::expect_error([&] { render("{{ 'x' * 1000000000000 }}", {}, small); }, "too large");
    strata::testing::expect_error([&] { render("{{ range(1000000)|list|length }}"); }, "range too big");
    strata::testing::expect_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); }, "nest deeper");
    strata::testing::expect_error([] { Template::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"); }, "nests deeper");
    strata::testing::expect_error([] { Template::parse("{{ " + std::string(5000, '-') + "1 }}"); }, "nests deeper");
    std::string deep_ifs;
    for (int i = 0; i < 500; ++i) deep_ifs += "{% if true %}";
    strata::testing::expect_error([&] { Template::parse(deep_ifs); }, "nests deeper");
}

TEST(Jinja, InvalidUtf8SurvivesUnchanged) {
    const std::string bytes = "a\xff\xfe b\xc3";
    EXPECT_EQ(render("{{ s }}|{{ s|length }}|{{ s[1:3] }}", ojson{{"s", bytes}}), bytes + "|6|\xff\xfe");
    EXPECT_EQ(render(bytes + "{{ 1 }}"), bytes + "1");
}

// Mutations of real-looking templates: each must parse or throw Error, and render or throw Error.
TEST(Jinja, MalformedTemplatesNeverCrash) {
    const std::string base =
        "{%- set ns = namespace(x=0) %}{% for m in messages[::-1] if m.role != 'x' %}{{- m.content | trim ~ '\\n' }}"
        "{% set ns.x = loop.index0 + 1 %}{% if m.tool_calls is defined and m.tool_calls %}{{ m.tool_calls | tojson(indent=2) }}"
        "{% elif m.content is string %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}{% else %}{{ raise_exception('no') }}"
        "{% endif %}{% endfor %}{# c #}{% macro f(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ f(1, b=[1, {'k': (2, 3)}]) }}";
    const ojson vars = ojson::parse(R"({"messages": [{"role": "user", "content": " hi "},
        {"role": "assistant", "content": "<think>x</think>\n\nyo", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]})");
    const std::string alphabet = "{}%#-+()[]'\".|:,=~*/ \nabisnotfor";
    std::mt19937 rng(1234);
    int parsed = 0;
    for (int iter = 0; iter < 4000; ++iter) {
        std::string t = base;
        const int edits = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < edits; ++k) {
            const size_t pos = rng() % (t.size() + 1);
            switch (rng() % 3) {
                case 0: t.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
                case 1:
                    if (pos < t.size()) t.erase(pos, 1 + rng() % 5);
                    break;
                default:
                    if (pos < t.size()) t[pos] = alphabet[rng() % alphabet.size()];
            }
        }
        try {
            const Template tmpl = Template::parse(t);
            ++parsed;
            RenderLimits limits;
            limits.max_steps = 100000;
            tmpl.render(Value::from_json(vars).as_object(), limits);
        } catch (const Error& e) {
            ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
        }
    }
    EXPECT_GT(parsed, 100);
}

}  // namespace
