// Chat templates against transformers: every tests/data/chat/*.golden.json was made by transformers 5.17's
// apply_chat_template(tokenize=False) on the GPU machine (tools/goldens/make_chat_goldens.py chat) from the template
// beside it and the conversations in conversations.json; the renders must be byte-identical, and a conversation the
// template refuses must be refused here too. STRATA_CHAT_GOLDENS=DIR runs the same check on another folder of
// templates and goldens (the published Qwen templates, which are not committed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using strata::ChatOptions;
using strata::ChatTemplate;
using strata::Error;

std::string read_file(const fs::path& path) {
    std::ifstream f(path, std::ios::binary);
    EXPECT_TRUE(f.good()) << path;
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string describe_diff(const std::string& want, const std::string& got) {
    size_t i = 0;
    while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
    const size_t from = i > 60 ? i - 60 : 0;
    return "first difference at byte " + std::to_string(i) + " of " + std::to_string(want.size()) +
           "\n  want: " + ojson(want.substr(from, 120)).dump() + "\n  got:  " + ojson(got.substr(from, 120)).dump();
}

// Checks every golden in `dir`; returns how many cases ran.
int check_goldens(const fs::path& dir) {
    std::vector<fs::path> goldens;
    for (const auto& entry : fs::directory_iterator(dir))
        if (entry.path().string().size() > 12 && entry.path().string().ends_with(".golden.json") &&
            entry.path().filename() != "jinja_cases.golden.json")
            goldens.push_back(entry.path());
    std::sort(goldens.begin(), goldens.end());
    int cases = 0;
    for (const auto& path : goldens) {
        const ojson golden = ojson::parse(read_file(path));
        const std::string name = golden["template"];
        SCOPED_TRACE(name);
        ChatTemplate tmpl;
        try {
            tmpl = ChatTemplate::parse(read_file(dir / name));
        } catch (const Error& e) {
            ADD_FAILURE() << "parse failed: " << e.what();
            continue;
        }
        for (const auto& c : golden["cases"]) {
            ++cases;
            ChatOptions options;
            options.eos_token = golden.value("eos_token", "");
            options.tools = c["tools"];
            options.add_generation_prompt = c["options"].value("add_generation_prompt", false);
            if (c["options"].contains("enable_thinking")) options.enable_thinking = c["options"]["enable_thinking"].get<bool>();
            SCOPED_TRACE(c["conversation"].get<std::string>() + " " + c["options"].dump());
            if (c.contains("error")) {
                try {
                    const std::string out = tmpl.render(c["messages"], options);
                    ADD_FAILURE() << "rendered, but transformers failed with " << c["error"].get<std::string>();
                } catch (const Error& e) {
                    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
                }
                continue;
            }
            const std::string want = c["rendered"];
            try {
                const std::string got = tmpl.render(c["messages"], options);
                EXPECT_EQ(got == want, true) << describe_diff(want, got);
            } catch (const Error& e) {
                ADD_FAILURE() << "error: " << e.what();
            }
        }
    }
    return cases;
}

TEST(ChatTemplate, MatchesTransformersGoldens) {
    const int cases = check_goldens(fs::path(STRATA_TEST_DATA) / "chat");
    EXPECT_GE(cases, 3 * 19);
}

TEST(ChatTemplate, MatchesExtraGoldens) {
    const char* dir = std::getenv("STRATA_CHAT_GOLDENS");
    if (!dir || !*dir) GTEST_SKIP() << "set STRATA_CHAT_GOLDENS=DIR to check more templates";
    EXPECT_GT(check_goldens(dir), 0);
}

const char* const kThinkTemplate =
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and enable_thinking is false %}"
    "<think></think>{% endif %}{% endif %}{{ eos_token | default('') }}{{ reasoning_effort | default('') }}";

TEST(ChatTemplate, OptionsReachTheTemplate) {
    const ChatTemplate t = ChatTemplate::parse(kThinkTemplate);
    const ojson messages = ojson::parse(R"([{"role": "user", "content": "hi"}])");
    ChatOptions o;
    EXPECT_EQ(t.render(messages, o), "<|user|>hi\n<|assistant|>");
    o.enable_thinking = true;
    EXPECT_EQ(t.render(messages, o), "<|user|>hi\n<|assistant|>");
    o.enable_thinking = false;
    EXPECT_EQ(t.render(messages, o), "<|user|>hi\n<|assistant|><think></think>");
    o.add_generation_prompt = false;
    o.eos_token = "</s>";
    o.extra = ojson{{"reasoning_effort", "high"}};
    EXPECT_EQ(t.render(messages, o), "<|user|>hi\n</s>high");
}

TEST(ChatTemplate, PlainJsonConvertsImplicitly) {
    const ChatTemplate t = ChatTemplate::parse("{{ messages[0].content }}|{{ tools | length }}");
    const nlohmann::json messages = nlohmann::json::parse(R"([{"role": "user", "content": "x"}])");
    ChatOptions o;
    o.tools = nlohmann::json::parse(R"([{"type": "function"}])");
    EXPECT_EQ(t.render(messages, o), "x|1");
}

TEST(ChatTemplate, ErrorsAreOneLine) {
    strata::testing::expect_error([] { ChatTemplate::parse("{% for m in messages %}"); }, "syntax error at line 1:");
    const ChatTemplate t = ChatTemplate::parse("{% if messages | length == 0 %}{{ raise_exception('No messages.') }}{% endif %}ok");
    strata::testing::expect_error([&] { t.render(ojson::array(), ChatOptions{}); }, "No messages.");
    strata::testing::expect_error([&] { t.render(ojson::object(), ChatOptions{}); }, "messages must be a JSON array");
    EXPECT_EQ(t.render(ojson::parse(R"([{"role": "user", "content": "x"}])"), ChatOptions{}), "ok");
}

}  // namespace
