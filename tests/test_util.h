// Helpers the test programs share: random weight rows, temporary folders, error-message checks, where the transformers
// goldens live.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace strata::testing {

// Gaussian values with a few outliers (about one in 64 at 6..12 sigma), as weight rows have.
inline std::vector<float> gaussian_with_outliers(int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> gauss;
    std::uniform_real_distribution<float> big(6.0f, 12.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = gauss(rng);
    for (int64_t k = 0; k < n / 64 + 1; ++k) {
        const size_t i = rng() % x.size();
        x[i] = std::copysign(big(rng), x[i]);
    }
    return x;
}

// A fresh folder under the system temp dir, removed with everything in it when the object goes.
class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "strata_test_XXXXXX").string();
        STRATA_ASSERT(mkdtemp(tmpl.data()) != nullptr);
        path_ = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// One folder for the whole test program (converted models shared by its tests), removed when the program exits.
inline const TempDir& process_temp_dir() {
    static const TempDir dir;
    return dir;
}

// fn() must throw strata::Error with a one-line message that contains `what`.
template <typename Fn>
void expect_error(Fn fn, const std::string& what) {
    try {
        fn();
        ADD_FAILURE() << "no error; expected one mentioning \"" << what << "\"";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(what), std::string::npos) << "message: " << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
}

// The whole file, bytes as they are ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// s as one single-quoted shell word.
// The whitespace-separated integers of a fixture file (prompt.txt, greedy.txt).
inline std::vector<int32_t> read_ids(const std::filesystem::path& path) {
    std::ifstream f(path);
    std::vector<int32_t> ids;
    int64_t v;
    while (f >> v) ids.push_back(static_cast<int32_t>(v));
    return ids;
}

// The raw little-endian float32 values of a file (logits.f32).
inline std::vector<float> read_floats(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    f.seekg(0, std::ios::end);
    std::vector<float> v(f ? static_cast<size_t>(f.tellg()) / sizeof(float) : 0);
    f.seekg(0);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    return v;
}

inline std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

struct ShellRun {
    int status = -1;
    std::string out;
    std::string err;
    size_t err_lines() const { return static_cast<size_t>(std::count(err.begin(), err.end(), '\n')); }
};

// Runs a shell command with `input` on stdin (from a file, so stdin is never a terminal); captures both streams.
inline ShellRun run_shell(const std::string& command, const std::string& input = "") {
    const TempDir dir;
    std::ofstream(dir / "in", std::ios::binary) << input;
    const std::string cmd = "(" + command + ") >" + shell_quote(dir / "out") + " 2>" + shell_quote(dir / "err") +
                            " <" + shell_quote(dir / "in");
    const int raw = std::system(cmd.c_str());
    return {.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, .out = read_text(dir / "out"), .err = read_text(dir / "err")};
}

// `strata ARGS` (shell text, already quoted).
inline ShellRun run_strata(const std::string& args, const std::string& input = "") {
    return run_shell(shell_quote(STRATA_BINARY) + " " + args, input);
}

// The user-error contract (DESIGN.md section 8): status 2, one line on stderr, "strata: " first.
inline void expect_user_error(const ShellRun& r, const std::string& must_contain = "") {
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(r.err_lines(), 1u) << "stderr: " << r.err;
    EXPECT_EQ(r.err.rfind("strata: ", 0), 0u) << "stderr: " << r.err;
    if (!must_contain.empty()) {
        EXPECT_NE(r.err.find(must_contain), std::string::npos) << "stderr: " << r.err;
    }
}

// STRATA_FIXTURES points the fixture suites at another folder of goldens (for example the --extra output of
// tools/goldens/make_goldens.py: configurations that are not in tests/data); by default they run tests/data.
inline bool fixtures_overridden() {
    const char* env = std::getenv("STRATA_FIXTURES");
    return env != nullptr && *env != '\0';
}

inline std::filesystem::path fixtures_root() {
    return fixtures_overridden() ? std::filesystem::path(std::getenv("STRATA_FIXTURES"))
                                 : std::filesystem::path(STRATA_TEST_DATA);
}

// The fixtures under fixtures_root() that hold every one of `paths` (files or folders, relative to the fixture),
// sorted by name.
inline std::vector<std::string> fixtures_with(std::initializer_list<const char*> paths) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(fixtures_root(), ec)) {
        bool all = true;
        for (const char* p : paths) all = all && std::filesystem::exists(e.path() / p);
        if (all) names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace strata::testing
