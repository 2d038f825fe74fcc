// Where the transformers goldens live. STRATA_FIXTURES points the fixture suites at another folder (for example the
// --extra output of tools/goldens/make_goldens.py: configurations that are not in tests/data); by default they run
// tests/data.
#pragma once

#include <cstdlib>
#include <filesystem>

namespace strata::testing {

inline bool fixtures_overridden() {
    const char* env = std::getenv("STRATA_FIXTURES");
    return env != nullptr && *env != '\0';
}

inline std::filesystem::path fixtures_root() {
    return fixtures_overridden() ? std::filesystem::path(std::getenv("STRATA_FIXTURES"))
                                 : std::filesystem::path(STRATA_TEST_DATA);
}

}  // namespace strata::testing
