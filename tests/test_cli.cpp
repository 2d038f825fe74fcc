// The `strata` command as scripts see it (DESIGN.md section 8): exit status 0 on success, 2 with exactly one line on
// stderr for anything a user can get wrong, and the logits / generate contracts on a synthesized tiny model.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using CliRun = strata::testing::ShellRun;
using strata::testing::expect_user_error;
using strata::testing::read_text;
const auto& quote = strata::testing::shell_quote;

class CliTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("strata_cli_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
        tiny_ = dir_ / "tiny.gguf";
        CliRun r = strata("synth --preset tiny --seed 3 --out " + quote(tiny_));
        synth_error_ = r.status == 0 ? "" : "strata synth failed (status " + std::to_string(r.status) + "): " + r.err;
    }
    static void TearDownTestSuite() {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }

    static CliRun strata(const std::string& args) { return strata::testing::run_strata(args); }

    void require_tiny() const {
        if (!synth_error_.empty()) {
            GTEST_FAIL() << synth_error_;
        }
    }

    static std::vector<float> read_floats(const fs::path& path) {
        std::string bytes = read_text(path);
        std::vector<float> v(bytes.size() / sizeof(float));
        std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
        return v;
    }

    static inline fs::path dir_;
    static inline fs::path tiny_;
    static inline std::string synth_error_;
};

TEST_F(CliTest, HelpListsCommandsAndExitsZero) {
    CliRun r = strata("--help");
    EXPECT_EQ(r.status, 0);
    for (const char* cmd : {"convert", "synth", "info", "logits", "generate"}) {
        EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd;
        CliRun h = strata(std::string(cmd) + " --help");
        EXPECT_EQ(h.status, 0) << cmd;
        EXPECT_NE(h.out.find(std::string("usage: strata ") + cmd), std::string::npos) << h.out;
    }
    EXPECT_EQ(strata("--version").status, 0);
}

TEST_F(CliTest, UnknownCommandAndFlagAreOneLineErrors) {
    expect_user_error(strata("frobnicate"), "unknown command 'frobnicate'");
    expect_user_error(strata(""), "no command");
    expect_user_error(strata("logits --frobnicate"), "unknown flag '--frobnicate'");
    expect_user_error(strata("info a.gguf b.gguf"), "unexpected argument");
    expect_user_error(strata("logits --model"), "--model expects a value");
    expect_user_error(strata("logits --model x --model y"), "more than once");
}

TEST_F(CliTest, MissingFilesAreOneLineErrors) {
    const std::string missing = quote((dir_ / "does-not-exist.gguf").string());
    expect_user_error(strata("info " + missing), "does-not-exist.gguf");
    expect_user_error(strata("logits --model " + missing + " --tokens 1 --out " + quote(dir_ / "x.f32")),
                      "does-not-exist.gguf");
    expect_user_error(strata("generate --model " + missing + " --tokens 1 -n 1"), "does-not-exist.gguf");
    expect_user_error(strata("convert --hf " + quote(dir_ / "no-such-folder") + " --out " + quote(dir_ / "o.gguf")),
                      "no-such-folder");
}

TEST_F(CliTest, MalformedGgufIsOneLineError) {
    // Byte strings with embedded zeros, whole (a literal's terminating zero left out).
    auto bytes = [](const auto& literal) { return std::string(literal, sizeof(literal) - 1); };
    std::vector<std::string> images = {
        "",
        "x",
        bytes("\x13\x37\xca\xfe random bytes, not a GGUF at all"),
        bytes("GGUF\x03\0\0\0"),                                                  // header cut short
        bytes("GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\x7f\0\0\0\0\0\0\0\0"),  // absurd tensor count
        bytes("GGUF\x63\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"),                  // version 99
    };
    // A valid file cut at several points, from inside the metadata to inside the tensor data.
    if (synth_error_.empty()) {
        std::string whole = read_text(tiny_);
        for (size_t cut : {size_t{12}, size_t{100}, whole.size() / 3, whole.size() / 2, whole.size() - 1})
            if (cut < whole.size()) images.push_back(whole.substr(0, cut));
    }
    for (size_t i = 0; i < images.size(); ++i) {
        const fs::path path = dir_ / ("bad" + std::to_string(i) + ".gguf");
        std::ofstream(path, std::ios::binary) << images[i];
        SCOPED_TRACE("image " + std::to_string(i) + " (" + std::to_string(images[i].size()) + " bytes)");
        expect_user_error(strata("info " + quote(path)));
        expect_user_error(strata("logits --model " + quote(path) + " --tokens 1 --out " + quote(dir_ / "x.f32")));
    }
}

TEST_F(CliTest, BadFlagValuesAreOneLineErrors) {
    require_tiny();
    const std::string model = "--model " + quote(tiny_) + " --out " + quote(dir_ / "x.f32");
    expect_user_error(strata("logits " + model + " --tokens '1 2 x'"), "'x' is not a token id");
    expect_user_error(strata("logits " + model + " --tokens ''"), "no token ids");
    expect_user_error(strata("logits " + model + " --tokens '1 99999999999999'"), "out of range");
    expect_user_error(strata("logits " + model + " --tokens '1 2000000000'"), "outside the vocabulary");
    expect_user_error(strata("logits " + model + " --tokens '-1'"), "outside the vocabulary");
    expect_user_error(strata("logits " + model + " --tokens 1 --tokens-file " + quote(tiny_)), "not both");
    expect_user_error(strata("logits " + model), "--tokens");
    expect_user_error(strata("logits " + model + " --tokens 1 --threads abc"),
                      "--threads expects a positive integer, got 'abc'");
    expect_user_error(strata("logits " + model + " --tokens 1 --threads 0"), "--threads expects a positive integer");
    expect_user_error(strata("logits " + model + " --tokens 1 --mode chunk=0"), "--mode");
    expect_user_error(strata("logits " + model + " --tokens 1 --mode sideways"), "--mode");
#if !STRATA_HAS_CUDA  // a CUDA build runs it (tests/test_cuda_model.cpp)
    expect_user_error(strata("logits " + model + " --tokens 1 --backend cuda"), "no CUDA backend");
#endif
    expect_user_error(strata("logits " + model + " --tokens 1 --vram-budget 1G"), "--backend cuda only");
    expect_user_error(strata("logits " + model + " --tokens 1 --backend cuda --vram-budget lots"), "--vram-budget");
    expect_user_error(strata("logits " + model + " --tokens 1 --gdn-recurrence shuffle"), "--backend cuda only");
    expect_user_error(strata("logits " + model + " --tokens 1 --backend cuda --gdn-recurrence fast"),
                      "--gdn-recurrence expects one of auto|column|shuffle");
    expect_user_error(strata("logits " + model + " --tokens 1 --backend tpu"), "--backend");
    expect_user_error(strata("logits --model " + quote(tiny_) + " --tokens 1"), "--out is required");
    expect_user_error(strata("generate --model " + quote(tiny_) + " --tokens 1 -n 0"), "-n expects");
    expect_user_error(strata("generate --model " + quote(tiny_) + " --tokens 1"), "-n N is required");
    expect_user_error(strata("generate --model " + quote(tiny_) + " --prompt hello --tokens 1 -n 2"), "not both");
    expect_user_error(strata("generate --model " + quote(tiny_) + " --prompt '' -n 2"), "--prompt is empty");
    expect_user_error(strata("convert --hf " + quote(dir_) + " --out " + quote(dir_ / "o.gguf") + " --outtype q3"),
                      "--outtype");
    expect_user_error(strata("synth --preset no-such-preset --out " + quote(dir_ / "o.gguf")));
    EXPECT_FALSE(fs::exists(dir_ / "x.f32")) << "a failed run must not leave an output file";
}

TEST_F(CliTest, InfoDescribesTheModel) {
    require_tiny();
    CliRun r = strata("info " + quote(tiny_));
    ASSERT_EQ(r.status, 0) << r.err;
    for (const char* part : {"architecture:", "hyperparameters:", "tensors:", "vocabulary:", "memory plan", "total"})
        EXPECT_NE(r.out.find(part), std::string::npos) << part << " missing from:\n" << r.out;
    EXPECT_TRUE(r.out.find("does not fit") != std::string::npos || r.out.find("fits") != std::string::npos);
    EXPECT_EQ(strata("info --model " + quote(tiny_) + " --ctx 128").status, 0);
}

TEST_F(CliTest, LogitsModesAgree) {
    require_tiny();
    const std::string tokens = "--tokens '1 5 9 2 7 3 8 4 6 10 11 12 13'";
    const size_t n_tokens = 13;
    std::vector<std::vector<float>> outputs;
    for (const char* mode : {"prefill", "incremental", "chunk=4"}) {
        const fs::path out = dir_ / (std::string("logits_") + mode + ".f32");
        CliRun r = strata("logits --model " + quote(tiny_) + " " + tokens + " --mode " + mode + " --threads 2 --out " +
                          quote(out));
        ASSERT_EQ(r.status, 0) << mode << ": " << r.err;
        outputs.push_back(read_floats(out));
    }
    ASSERT_FALSE(outputs[0].empty());
    ASSERT_EQ(outputs[0].size() % n_tokens, 0u) << "not [n_tokens x n_vocab]";
    const size_t n_vocab = outputs[0].size() / n_tokens;
    for (size_t m = 1; m < outputs.size(); ++m) {
        ASSERT_EQ(outputs[m].size(), outputs[0].size());
        for (size_t t = 0; t < n_tokens; ++t) {
            // Relative to the row's largest magnitude: the modes only reorder float sums.
            const float* a = outputs[0].data() + t * n_vocab;
            const float* b = outputs[m].data() + t * n_vocab;
            float scale = 1e-6f, worst = 0.0f;
            for (size_t v = 0; v < n_vocab; ++v) {
                ASSERT_TRUE(std::isfinite(a[v]) && std::isfinite(b[v])) << "row " << t;
                scale = std::max(scale, std::fabs(a[v]));
                worst = std::max(worst, std::fabs(a[v] - b[v]));
            }
            EXPECT_LE(worst / scale, 1e-4) << "mode " << m << " row " << t;
        }
    }

    // The same ids from a file give the same bytes.
    const fs::path ids = dir_ / "ids.txt";
    std::ofstream(ids) << "1, 5, 9, 2\n7 3 8 4\n6 10 11 12 13\n";
    const fs::path out = dir_ / "from_file.f32";
    ASSERT_EQ(strata("logits --model " + quote(tiny_) + " --tokens-file " + quote(ids) + " --out " + quote(out)).status,
              0);
    EXPECT_EQ(read_floats(out), outputs[0]);
}

TEST_F(CliTest, GenerateGreedyPrintsIds) {
    require_tiny();
    const std::string args = "generate --model " + quote(tiny_) + " --tokens '1 5 9 2' --ids -n 5 --greedy";
    CliRun r = strata(args);
    ASSERT_EQ(r.status, 0) << r.err;
    std::istringstream in(r.out);
    std::vector<long> ids;
    long id = 0;
    while (in >> id) ids.push_back(id);
    EXPECT_EQ(ids.size(), 5u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line expected: " << r.out;
    EXPECT_EQ(strata(args).out, r.out) << "greedy decoding must be deterministic";

    // The first greedy token is the argmax of the prompt's last logits row (ties: lowest id).
    const fs::path out = dir_ / "gen_check.f32";
    ASSERT_EQ(strata("logits --model " + quote(tiny_) + " --tokens '1 5 9 2' --out " + quote(out)).status, 0);
    std::vector<float> logits = read_floats(out);
    ASSERT_EQ(logits.size() % 4, 0u);
    const size_t n_vocab = logits.size() / 4;
    const float* last = logits.data() + 3 * n_vocab;
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], std::max_element(last, last + n_vocab) - last);

    // A text prompt goes through the model's tokenizer: the same ids as `strata tokenize` gives, fed as --tokens.
    CliRun tok = strata("tokenize --model " + quote(tiny_) + " --text 'hello world'");
    ASSERT_EQ(tok.status, 0) << tok.err;
    std::string ids_text = tok.out.substr(0, tok.out.find('\n'));
    CliRun by_text = strata("generate --model " + quote(tiny_) + " --prompt 'hello world' --ids --greedy -n 4");
    CliRun by_ids = strata("generate --model " + quote(tiny_) + " --tokens '" + ids_text + "' --ids --greedy -n 4");
    EXPECT_EQ(by_text.status, 0) << by_text.err;
    EXPECT_EQ(by_text.out, by_ids.out);

    // Sampling: same seed, same tokens.
    const std::string sampled = "generate --model " + quote(tiny_) + " --tokens '1 5 9 2' --ids -n 6 --seed 42";
    CliRun s1 = strata(sampled), s2 = strata(sampled);
    EXPECT_EQ(s1.status, 0) << s1.err;
    EXPECT_EQ(s1.out, s2.out);
}

}  // namespace
