// Unaligned loads from packed weight bytes, for the GEMM kernel files. Internal linkage on purpose: each file is
// compiled for its own instruction set, and a shared inline copy built for one could be the one another calls.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata::cpu {
namespace {  // NOLINT(google-build-namespaces): one copy per instruction set's file, see above

inline int32_t load4(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline float load_float(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
}

}  // namespace
}  // namespace strata::cpu
