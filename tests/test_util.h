// Helpers the test programs share: temporary folders, error-message checks, where the transformers goldens live.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace strata::testing {

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

}  // namespace strata::testing
