// `strata bench` as scripts see it: one valid JSON object per line per test with the documented fields, the test
// names llama-bench uses (pp<P>, tg<N>, @d<DEPTH>), one run per thread count, and one-line user errors (exit 2).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using strata::testing::expect_user_error;
using strata::testing::process_temp_dir;
using strata::testing::run_strata;
using strata::testing::shell_quote;
using strata::testing::ShellRun;

// A strict JSON reader, just enough to check the lines (RFC 8259 values; no duplicate-key or depth checks).
struct Json {
    enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
    double number = 0;
    std::string text;
    std::vector<Json> items;
    std::map<std::string, Json> fields;
};

class JsonReader {
  public:
    explicit JsonReader(const std::string& s) : s_(s) {}
    // nullopt-like: ok() false on any syntax error or trailing garbage.
    Json read_document() {
        Json v = value();
        skip_space();
        if (pos_ != s_.size()) ok_ = false;
        return v;
    }
    bool ok() const { return ok_; }

  private:
    void skip_space() {
        while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    bool eat(char c) {
        skip_space();
        if (pos_ < s_.size() && s_[pos_] == c) {
            ++pos_;
            return true;
        }
        return false;
    }
    bool literal(const std::string& word) {
        if (s_.compare(pos_, word.size(), word) != 0) return false;
        pos_ += word.size();
        return true;
    }
    std::string string_body() {
        std::string out;
        while (pos_ < s_.size() && s_[pos_] != '"') {
            char c = s_[pos_++];
            if (static_cast<unsigned char>(c) < 0x20) ok_ = false;
            if (c == '\\') {
                if (pos_ >= s_.size()) break;
                char e = s_[pos_++];
                if (e == 'u') {
                    if (pos_ + 4 > s_.size()) ok_ = false;
                    pos_ += 4;
                    out += '?';
                    continue;
                }
                if (std::string("\"\\/bfnrt").find(e) == std::string::npos) ok_ = false;
                c = e;
            }
            out += c;
        }
        if (!eat('"')) ok_ = false;
        return out;
    }
    Json value() {
        Json v;
        skip_space();
        if (pos_ >= s_.size()) {
            ok_ = false;
            return v;
        }
        const char c = s_[pos_];
        if (c == '{') {
            ++pos_;
            v.kind = Json::Kind::Object;
            if (eat('}')) return v;
            do {
                if (!eat('"')) {
                    ok_ = false;
                    return v;
                }
                std::string key = string_body();
                if (!eat(':')) ok_ = false;
                v.fields[key] = value();
            } while (ok_ && eat(','));
            if (!eat('}')) ok_ = false;
        } else if (c == '[') {
            ++pos_;
            v.kind = Json::Kind::Array;
            if (eat(']')) return v;
            do v.items.push_back(value());
            while (ok_ && eat(','));
            if (!eat(']')) ok_ = false;
        } else if (c == '"') {
            ++pos_;
            v.kind = Json::Kind::String;
            v.text = string_body();
        } else if (literal("true") || literal("false")) {
            v.kind = Json::Kind::Bool;
        } else if (literal("null")) {
            v.kind = Json::Kind::Null;
        } else {
            // JSON numbers: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
            const size_t start = pos_;
            if (s_[pos_] == '-') ++pos_;
            auto digits = [&] {
                const size_t d = pos_;
                while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
                return pos_ - d;
            };
            const size_t int_start = pos_;
            if (digits() == 0 || (s_[int_start] == '0' && pos_ - int_start > 1)) ok_ = false;
            if (pos_ < s_.size() && s_[pos_] == '.' && (++pos_, digits() == 0)) ok_ = false;
            if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
                ++pos_;
                if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
                if (digits() == 0) ok_ = false;
            }
            v.kind = Json::Kind::Number;
            v.number = std::strtod(s_.substr(start, pos_ - start).c_str(), nullptr);
        }
        return v;
    }

    const std::string& s_;
    size_t pos_ = 0;
    bool ok_ = true;
};

class BenchCliTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        tiny_ = process_temp_dir() / "tiny.gguf";
        const ShellRun r = run_strata("synth --preset tiny --out " + shell_quote(tiny_));
        synth_error_ = r.status == 0 ? "" : "strata synth failed (status " + std::to_string(r.status) + "): " + r.err;
    }

    // Runs `strata bench` on the tiny model and parses every stdout line as one JSON object.
    std::vector<Json> bench_json(const std::string& flags) {
        EXPECT_TRUE(synth_error_.empty()) << synth_error_;
        const ShellRun r = run_strata("bench --model " + shell_quote(tiny_) + " " + flags + " --json");
        EXPECT_EQ(r.status, 0) << r.err;
        std::vector<Json> lines;
        std::istringstream in(r.out);
        for (std::string line; std::getline(in, line);) {
            JsonReader reader(line);
            Json v = reader.read_document();
            EXPECT_TRUE(reader.ok() && v.kind == Json::Kind::Object) << "not a JSON object: " << line;
            lines.push_back(std::move(v));
        }
        return lines;
    }

    // The documented fields, with their types and the values these flags imply.
    static void expect_fields(const Json& v, const std::string& test, int threads, int64_t depth, int reps) {
        using K = Json::Kind;
        for (const char* key : {"test", "model", "backend"}) {
            ASSERT_TRUE(v.fields.count(key) && v.fields.at(key).kind == K::String) << key;
        }
        for (const char* key : {"tokens_per_s", "sd", "threads", "n_prompt", "n_gen", "depth", "repetitions"}) {
            ASSERT_TRUE(v.fields.count(key) && v.fields.at(key).kind == K::Number) << key;
        }
        ASSERT_TRUE(v.fields.count("samples") && v.fields.at("samples").kind == K::Array);
        EXPECT_EQ(v.fields.at("test").text, test);
        EXPECT_EQ(v.fields.at("model").text, tiny_);
        EXPECT_EQ(v.fields.at("backend").text, "cpu");
        EXPECT_EQ(v.fields.at("threads").number, threads);
        EXPECT_EQ(v.fields.at("depth").number, static_cast<double>(depth));
        EXPECT_EQ(v.fields.at("repetitions").number, reps);
        const bool prompt = test.rfind("pp", 0) == 0;
        EXPECT_EQ(v.fields.at("n_prompt").number, prompt ? 8 : 0);
        EXPECT_EQ(v.fields.at("n_gen").number, prompt ? 0 : 4);
        EXPECT_GT(v.fields.at("tokens_per_s").number, 0);
        EXPECT_GE(v.fields.at("sd").number, 0);
        const auto& samples = v.fields.at("samples").items;
        ASSERT_EQ(samples.size(), static_cast<size_t>(reps));
        double sum = 0;
        for (const Json& s : samples) {
            ASSERT_EQ(s.kind, K::Number);
            EXPECT_GT(s.number, 0);
            sum += s.number;
        }
        // tokens_per_s is the mean of the samples (printed with 6 significant digits).
        EXPECT_NEAR(v.fields.at("tokens_per_s").number, sum / reps, 1e-4 * sum / reps);
    }

    static inline std::string tiny_;
    static inline std::string synth_error_;
};

TEST_F(BenchCliTest, JsonLinesHaveTheDocumentedFields) {
    const auto lines = bench_json("-p 8 -n 4 -r 2 --threads 1");
    ASSERT_EQ(lines.size(), 2u);
    expect_fields(lines[0], "pp8", 1, 0, 2);
    expect_fields(lines[1], "tg4", 1, 0, 2);
}

TEST_F(BenchCliTest, DepthIsNamedInTheTest) {
    const auto lines = bench_json("-p 8 -n 4 -r 2 -d 16 --threads 1");
    ASSERT_EQ(lines.size(), 2u);
    expect_fields(lines[0], "pp8@d16", 1, 16, 2);
    expect_fields(lines[1], "tg4@d16", 1, 16, 2);
}

TEST_F(BenchCliTest, EveryThreadCountRunsEveryTest) {
    const auto lines = bench_json("-p 8 -n 4 -r 2 --threads 1,2");
    ASSERT_EQ(lines.size(), 4u);
    expect_fields(lines[0], "pp8", 1, 0, 2);
    expect_fields(lines[1], "tg4", 1, 0, 2);
    expect_fields(lines[2], "pp8", 2, 0, 2);
    expect_fields(lines[3], "tg4", 2, 0, 2);
}

TEST_F(BenchCliTest, TableByDefault) {
    ASSERT_TRUE(synth_error_.empty()) << synth_error_;
    const ShellRun r = run_strata("bench --model " + shell_quote(tiny_) + " -p 8 -n 4 -r 2 --threads 1");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("| model | size | params | backend | threads | test | t/s |"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("| pp8 |"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("| tg4 |"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("tiny.gguf"), std::string::npos) << r.out;
}

// --window-costs: one line per window of 1..8 tokens, its cost against one token and the projection at
// --acceptance (the arithmetic itself: test_speculation's WindowProjection tests).
TEST_F(BenchCliTest, WindowCostsGiveOneLinePerWindowSize) {
    const auto lines = bench_json("--window-costs --acceptance 0.8 -d 16 -r 2 --threads 1");
    ASSERT_EQ(lines.size(), 8u);
    for (size_t i = 0; i < lines.size(); ++i) {
        const Json& v = lines[i];
        for (const char* key : {"window", "ms", "cost_ratio", "acceptance", "tokens_per_round", "speedup",
                                "speedup_refeed", "threads", "depth", "repetitions"})
            ASSERT_TRUE(v.fields.count(key) && v.fields.at(key).kind == Json::Kind::Number) << key;
        const double w = static_cast<double>(i + 1);
        EXPECT_EQ(v.fields.at("test").text, "window" + std::to_string(i + 1) + "@d16");
        EXPECT_EQ(v.fields.at("window").number, w);
        EXPECT_EQ(v.fields.at("depth").number, 16);
        EXPECT_EQ(v.fields.at("acceptance").number, 0.8);
        EXPECT_GT(v.fields.at("ms").number, 0);
        EXPECT_NEAR(v.fields.at("tokens_per_round").number, (1 - std::pow(0.8, w)) / 0.2, 1e-4);
        EXPECT_NEAR(v.fields.at("speedup").number,
                    v.fields.at("tokens_per_round").number / v.fields.at("cost_ratio").number, 1e-3);
        EXPECT_LE(v.fields.at("speedup_refeed").number, v.fields.at("speedup").number + 1e-9);
    }
    EXPECT_EQ(lines[0].fields.at("cost_ratio").number, 1.0);
    // The table names the best window.
    const ShellRun r = run_strata("bench --model " + shell_quote(tiny_) + " --window-costs -r 1 --threads 1");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("| window | ms | x 1 token |"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("best window at 0.90 per draft"), std::string::npos) << r.out;
    const std::string model = "--model " + shell_quote(tiny_);
    expect_user_error(run_strata("bench " + model + " --window-costs --acceptance 1.5"), "--acceptance");
    expect_user_error(run_strata("bench " + model + " --acceptance 0.9"), "--acceptance needs --window-costs");
    expect_user_error(run_strata("bench " + model + " --window-costs --spec 2"), "--window-costs and --spec");
}

TEST_F(BenchCliTest, UserErrorsAreOneLine) {
    const std::string model = "--model " + shell_quote(tiny_);
    expect_user_error(run_strata("bench --model " + shell_quote(process_temp_dir() / "missing.gguf") + " -p 8 -n 4"),
                      "missing.gguf");
    expect_user_error(run_strata("bench " + model + " -p abc"), "-p");
    expect_user_error(run_strata("bench " + model + " -p -3"), "-p");
    expect_user_error(run_strata("bench " + model + " -p 0 -n 0"));
    expect_user_error(run_strata("bench " + model + " -r 0"), "-r");
    expect_user_error(run_strata("bench " + model + " --threads 1,x"), "--threads");
    expect_user_error(run_strata("bench " + model + " --threads 0"), "--threads");
#if !STRATA_HAS_CUDA  // a CUDA build runs it (tests/test_cuda_model.cpp)
    expect_user_error(run_strata("bench " + model + " -p 8 -n 4 --backend cuda"), "no CUDA backend");
    expect_user_error(run_strata("bench doorbell"), "needs the CUDA backend");
    expect_user_error(run_strata("bench gdn-recurrence"), "needs the CUDA backend");
    expect_user_error(run_strata("bench qsa-union"), "needs the CUDA backend");
#endif
    expect_user_error(run_strata("bench no-such-benchmark"), "unknown benchmark 'no-such-benchmark'");
    expect_user_error(run_strata("bench gdn-recurrence --tokens 0"), "--tokens");
    expect_user_error(run_strata("bench gdn-recurrence --tokens 8,x"), "--tokens");
    expect_user_error(run_strata("bench gdn-recurrence --heads 0"), "--heads");
    expect_user_error(run_strata("bench " + model + " --tokens 8"), "apply to `strata bench gdn-recurrence`");
    expect_user_error(run_strata("bench " + model + " --positions 64"), "apply to `strata bench qsa-union`");
    expect_user_error(run_strata("bench qsa-union --positions 3"), "--positions");
    expect_user_error(run_strata("bench " + model + " --rounds 10"), "--rounds applies to `strata bench doorbell`");
    expect_user_error(run_strata("bench doorbell --rounds 0"), "--rounds");
    expect_user_error(run_strata("bench " + model + " --backend tpu"), "--backend");
    expect_user_error(run_strata("bench " + model + " --gdn-recurrence fast"), "--gdn-recurrence");
    expect_user_error(run_strata("bench " + model + " --gdn-recurrence column"), "apply to --backend cuda only");
}

}  // namespace
