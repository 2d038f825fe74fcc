// Errors. A user can cause an Error (bad file, bad flag, unsupported type): it carries one line that says what was
// wrong, and the command prints it and exits with status 2. Broken invariants are bugs: STRATA_ASSERT aborts with
// file:line.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace strata {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] inline void fail_assert(const char* expr, const char* file, int line) {
    std::fprintf(stderr, "strata: internal error: %s (%s:%d)\n", expr, file, line);
    std::abort();
}

}  // namespace strata

#define STRATA_ASSERT(cond) \
    do { \
        if (!(cond)) ::strata::fail_assert(#cond, __FILE__, __LINE__); \
    } while (0)
