// `strata run` and `strata chat` as a user and a script see them, on the qwen4exp fixture converted with its
// tokenizer and ChatML template. The weights are random, so the text is noise: these tests check behaviour (exit
// status, streaming bounded by -n, determinism, stop strings, the chat commands, context reuse, one-line errors),
// never the words.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using CliRun = strata::testing::ShellRun;
using strata::testing::expect_user_error;
using strata::testing::read_text;
const auto& quote = strata::testing::shell_quote;

fs::path dir() {
    return fs::path(strata::testing::process_temp_dir().path());
}

CliRun strata(const std::string& args, const std::string& input = "") {
    return strata::testing::run_strata(args, input);
}

// A copy of the fixture's HF folder whose tokenizer_config.json carries `chat_template` (none when empty).
std::string hf_with_template(const std::string& name, const std::string& chat_template) {
    const fs::path src = fs::path(STRATA_TEST_DATA) / "qwen4exp" / "hf";
    const fs::path dst = dir() / name;
    fs::create_directories(dst);
    for (const auto& entry : fs::directory_iterator(src))
        fs::copy_file(entry.path(), dst / entry.path().filename(), fs::copy_options::overwrite_existing);
    nlohmann::json config = nlohmann::json::parse(read_text(src / "tokenizer_config.json"));
    if (chat_template.empty())
        config.erase("chat_template");
    else
        config["chat_template"] = chat_template;
    std::ofstream(dst / "tokenizer_config.json") << config.dump(2);
    return dst.string();
}

std::string convert(const std::string& hf_dir, const std::string& name) {
    const std::string out = (dir() / name).string();
    if (!fs::exists(out))
        strata::convert_hf_to_gguf({.hf_dir = hf_dir, .out_path = out, .out_type = strata::DType::F32});
    return out;
}

// The fixture's own ChatML template.
const std::string& chatml_model() {
    static const std::string path = convert((fs::path(STRATA_TEST_DATA) / "qwen4exp" / "hf").string(), "chatml.gguf");
    return path;
}

// The same model with a template that reads enable_thinking the way Qwen3's does (an empty think block when off).
const std::string& thinking_model() {
    static const std::string path =
        convert(hf_with_template(
                    "think_hf",
                    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' "
                    "}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% if "
                    "enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' "
                    "}}{% endif %}{% endif %}"),
                "think.gguf");
    return path;
}

const std::string& no_template_model() {
    static const std::string path = convert(hf_with_template("plain_hf", ""), "plain.gguf");
    return path;
}

int64_t token_id(const std::string& model, const std::string& text) {
    CliRun r = strata("tokenize --model " + quote(model) + " --text " + quote(text));
    EXPECT_EQ(r.status, 0) << r.err;
    std::istringstream in(r.out);
    std::vector<int64_t> ids;
    int64_t id = 0;
    while (in >> id) ids.push_back(id);
    EXPECT_EQ(ids.size(), 1u) << text << " should be one token: " << r.out;
    return ids.empty() ? -1 : ids[0];
}

// "--logit-bias" pushing every end-of-generation token of the fixture up (+100, so replies end at once) or banning it
// (-inf, so generation runs to -n).
std::string eog_bias(const std::string& model, const std::string& bias) {
    std::string out;
    for (const char* t : {"<|im_end|>", "<|endoftext|>"})
        out += (out.empty() ? "" : ",") + std::to_string(token_id(model, t)) + "=" + bias;
    return "--logit-bias " + quote(out);
}

// Numbers from the timings line: "prompt: P tokens ... | generation: G tokens ...".
int64_t stat(const std::string& err, const std::string& what) {
    std::smatch m;
    if (!std::regex_search(err, m, std::regex(what + ": ([0-9]+) tokens"))) return -1;
    return std::stoll(m[1].str());
}

std::vector<std::pair<int64_t, int64_t>> reuse_lines(const std::string& err) {  // (reused, fed) per chat turn
    std::vector<std::pair<int64_t, int64_t>> out;
    const std::regex line("\\(context: ([0-9]+) tokens reused, ([0-9]+) fed");
    for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it)
        out.emplace_back(std::stoll((*it)[1].str()), std::stoll((*it)[2].str()));
    return out;
}

TEST(RunCommand, StreamsTextBoundedByN) {
    const std::string& model = chatml_model();
    for (int n : {1, 7, 24}) {
        CliRun r = strata("run --model " + quote(model) + " -n " + std::to_string(n) + " --seed 5 " +
                          eog_bias(model, "-inf") + " 'Tell me a story'");
        ASSERT_EQ(r.status, 0) << r.err;
        EXPECT_GT(r.out.size(), 1u) << "no text";
        EXPECT_EQ(r.out.back(), '\n');
        EXPECT_EQ(stat(r.err, "generation"), n) << r.err;
        EXPECT_NE(r.err.find("stopped: -n reached"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("time to first token"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
    }
    // An end-of-generation token ends the text before -n.
    CliRun eog = strata("run --model " + quote(model) + " -n 30 " + eog_bias(model, "100") + " hi");
    ASSERT_EQ(eog.status, 0) << eog.err;
    EXPECT_EQ(eog.out, "\n");
    EXPECT_NE(eog.err.find("stopped: end-of-generation token"), std::string::npos) << eog.err;
}

TEST(RunCommand, SameSeedSameTextAndGreedyIsDeterministic) {
    const std::string& model = chatml_model();
    const std::string base = "run --model " + quote(model) + " -n 16 " + eog_bias(model, "-inf") + " ";
    EXPECT_EQ(strata(base + "--seed 11 hello").out, strata(base + "--seed 11 hello").out);
    EXPECT_NE(strata(base + "--seed 11 hello").out, strata(base + "--seed 12 hello").out);
    EXPECT_EQ(strata(base + "--greedy hello").out, strata(base + "--greedy --seed 99 hello").out);
    EXPECT_EQ(strata(base + "--greedy hello").out, strata(base + "--temp 0 hello").out);
}

TEST(RunCommand, TemplateRawSystemAndThink) {
    const std::string& model = chatml_model();
    const std::string base = "run --model " + quote(model) + " -n 2 --seed 1 ";
    const int64_t templated = stat(strata(base + "hello").err, "prompt");
    const int64_t raw = stat(strata(base + "--raw hello").err, "prompt");
    const int64_t with_system = stat(strata(base + "--system 'Be brief.' hello").err, "prompt");
    EXPECT_GT(raw, 0);
    EXPECT_GT(templated, raw) << "the chat template wraps the prompt in role markers";
    EXPECT_GT(with_system, templated);

    const std::string think = "run --model " + quote(thinking_model()) + " -n 2 --seed 1 ";
    const int64_t on = stat(strata(think + "--think on hello").err, "prompt");
    const int64_t off = stat(strata(think + "--think off hello").err, "prompt");
    EXPECT_GT(on, 0);
    EXPECT_GT(off, on) << "thinking off adds the empty think block";

    // Without a template the prompt goes as it is.
    CliRun plain = strata("run --model " + quote(no_template_model()) + " -n 2 --seed 1 hello");
    EXPECT_EQ(plain.status, 0) << plain.err;
    EXPECT_EQ(stat(plain.err, "prompt"), raw);
}

TEST(RunCommand, StopStringCutsTheTextExactly) {
    const std::string& model = chatml_model();
    const std::string base = "run --model " + quote(model) + " -n 40 --greedy " + eog_bias(model, "-inf") + " ";
    CliRun full = strata(base + "story");
    ASSERT_EQ(full.status, 0) << full.err;
    const std::string text = full.out.substr(0, full.out.size() - 1);
    // A stop string from the middle of the greedy text, cut at UTF-8 character boundaries.
    auto boundary = [&](size_t i) {
        while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
        return i;
    };
    const size_t a = boundary(text.size() / 3), b = boundary(a + 3);
    ASSERT_LT(b, text.size()) << "greedy text too short: " << text;
    const std::string stop = text.substr(a, b - a);
    CliRun cut = strata(base + "--stop " + quote(stop) + " --stop 'never-appears-xyz' story");
    ASSERT_EQ(cut.status, 0) << cut.err;
    EXPECT_EQ(cut.out, text.substr(0, text.find(stop)) + "\n");
    EXPECT_NE(cut.err.find("stopped: stop string"), std::string::npos) << cut.err;
}

TEST(ChatCommand, CommandsResetThinkAndContextReuse) {
    const std::string& model = thinking_model();
    // Replies end at once (end-of-generation pushed up), so every turn's rendering extends the last one.
    const std::string base = "chat --model " + quote(model) + " --verbose --seed 2 " + eog_bias(model, "100");
    CliRun r = strata(base, "hello\n/think off\nsecond\n/think on\n/reset\nthird\n/exit\nnever read\n");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("(thinking off)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(thinking on)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(conversation cleared)"), std::string::npos) << r.err;
    const auto turns = reuse_lines(r.err);
    ASSERT_EQ(turns.size(), 3u) << r.err;  // "never read" comes after /exit
    EXPECT_EQ(turns[0].first, 0);
    EXPECT_GT(turns[1].first, 0) << "the second turn should feed only its new tokens";
    EXPECT_EQ(turns[2].first, 0) << "/reset starts the context over";

    // /think off changes what the template renders: the same first message takes more tokens.
    const auto on = reuse_lines(strata(base, "/think on\nhello\n").err);
    const auto off = reuse_lines(strata(base, "/think off\nhello\n").err);
    ASSERT_EQ(on.size(), 1u);
    ASSERT_EQ(off.size(), 1u);
    EXPECT_GT(off[0].second, on[0].second);
}

TEST(ChatCommand, StreamsRepliesBoundedByNAndReadsMultiLineInput) {
    const std::string& model = chatml_model();
    const std::string base = "chat --model " + quote(model) + " --verbose -n 6 --seed 4 " + eog_bias(model, "-inf");
    // Two messages: a continued line, then a """ block; Ctrl-D (end of input) leaves.
    CliRun r = strata(base, "first line \\\nsecond line\n\"\"\"\nblock one\nblock two\n\"\"\"\n");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(reuse_lines(r.err).size(), 2u) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n') >= 2, true) << r.out;
    const std::string err = r.err;
    const std::regex generation("generation: ([0-9]+) tokens");
    int generation_lines = 0;
    for (auto it = std::sregex_iterator(err.begin(), err.end(), generation); it != std::sregex_iterator(); ++it) {
        ++generation_lines;
        EXPECT_EQ(std::stoll((*it)[1].str()), 6) << err;
    }
    EXPECT_EQ(generation_lines, 2);
    // The joined message is one user turn: a continued line does not send the first half alone.
    CliRun single = strata(base, "first line \\\nsecond line\n");
    EXPECT_EQ(reuse_lines(single.err).size(), 1u) << single.err;
    // Unknown commands are reported and the chat goes on; empty input ends cleanly.
    CliRun unknown = strata(base, "/frobnicate\nhi\n");
    EXPECT_EQ(unknown.status, 0);
    EXPECT_NE(unknown.err.find("unknown command /frobnicate"), std::string::npos) << unknown.err;
    EXPECT_EQ(reuse_lines(unknown.err).size(), 1u);
    EXPECT_EQ(strata(base, "").status, 0);
}

TEST(ChatCommand, ErrorsAreOneLine) {
    const std::string& model = chatml_model();
    const std::string missing = quote((dir() / "no-such-model.gguf").string());
    expect_user_error(strata("run --model " + missing + " hi"), "no-such-model.gguf");
    expect_user_error(strata("chat --model " + missing), "no-such-model.gguf");
    expect_user_error(strata("run --model " + quote(model)), "give the prompt");
    expect_user_error(strata("run --model " + quote(model) + " --temp abc hi"), "--temp expects a number");
    expect_user_error(strata("run --model " + quote(model) + " --temp -1 hi"), "temperature");
    expect_user_error(strata("run --model " + quote(model) + " --top-p 1.5 hi"), "top-p");
    expect_user_error(strata("run --model " + quote(model) + " --min-p 2 hi"), "min-p");
    expect_user_error(strata("run --model " + quote(model) + " --repeat-penalty 0 hi"), "repetition penalty");
    expect_user_error(strata("run --model " + quote(model) + " --logit-bias 5 hi"), "--logit-bias");
    expect_user_error(strata("run --model " + quote(model) + " --logit-bias 99999999=1 hi"), "outside the vocabulary");
    expect_user_error(strata("run --model " + quote(model) + " -n 0 hi"), "-n expects");
    expect_user_error(strata("run --model " + quote(model) + " --think maybe hi"), "--think");
    expect_user_error(strata("run --model " + quote(model) + " --raw --system x hi"), "--raw");
    expect_user_error(strata("run --model " + quote(model) + " --ctx 4 -n 1 hi"), "context");
    expect_user_error(strata("chat --model " + quote(no_template_model())), "no chat template");
    expect_user_error(strata("chat --model " + quote(model) + " --top-k -3"), "--top-k");
}

TEST(ChatCommand, ProgressBarOnlyOnATerminal) {
    const std::string& model = chatml_model();
    // Piped stderr: no bar, the timings line only.
    CliRun piped = strata("run --model " + quote(model) + " -n 2 --seed 1 hi");
    EXPECT_EQ(piped.err.find("loading"), std::string::npos) << piped.err;
    // A pseudo-terminal through script(1), when it is installed.
    if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "script(1) not installed";
    const std::string inner = quote(STRATA_BINARY) + " run --model " + quote(model) + " -n 2 --seed 1 hi";
    CliRun tty = strata::testing::run_shell("script -qec " + quote(inner) + " /dev/null");
    EXPECT_EQ(tty.status, 0) << tty.out << tty.err;
    EXPECT_NE(tty.out.find("loading chatml.gguf ["), std::string::npos) << tty.out;
    EXPECT_NE(tty.out.find("100%"), std::string::npos) << tty.out;
}

}  // namespace
