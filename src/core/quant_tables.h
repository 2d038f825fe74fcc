// Codebooks of ggml's non-linear and grid quant formats (data in quant_tables.cpp).
#pragma once

#include <cstdint>

namespace strata::quant {

extern const int8_t kIQ4NLValues[16];    // IQ4_NL / IQ4_XS: the 16 levels a 4-bit index selects
extern const uint64_t kIQ2XSGrid[512];   // IQ2_XS: 8 unsigned magnitudes (bytes 8, 25, 43) per entry
extern const uint32_t kIQ3XXSGrid[256];  // IQ3_XXS: 4 unsigned magnitudes per entry
extern const uint32_t kIQ3SGrid[512];    // IQ3_S: 4 unsigned odd magnitudes per entry
extern const uint64_t kIQ1SGrid[2048];   // IQ1_S / IQ1_M: 8 signed values in {-1, 0, 1} per entry

// Byte j (0-based, little-endian) of a grid entry: the j-th element of that group.
inline uint8_t grid_byte(uint64_t entry, int j) {
    return static_cast<uint8_t>(entry >> (8 * j));
}

// The 7 stored sign bits of a group of 8 in IQ2/IQ3 formats, completed with an 8th bit so that the number of
// negative signs is even (ggml's ksigns_iq2xs table is exactly this function).
inline uint8_t even_signs(uint32_t seven_bits) {
    const uint32_t s = seven_bits & 127;
    return static_cast<uint8_t>(s | ((__builtin_popcount(s) & 1) << 7));
}

}  // namespace strata::quant
