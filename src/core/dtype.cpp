#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/quant_blocks.h"

namespace strata {
namespace {

struct Entry {
    uint32_t id;
    DTypeTraits t;
};

// Block sizes and bytes from the GGUF format (ggml's type table).
constexpr std::array kTypes{
    Entry{0, {"f32", 1, 4, true}},         Entry{1, {"f16", 1, 2, true}},
    Entry{2, {"q4_0", 32, 18, true}},      Entry{3, {"q4_1", 32, 20, false}},
    Entry{6, {"q5_0", 32, 22, false}},     Entry{7, {"q5_1", 32, 24, false}},
    Entry{8, {"q8_0", 32, 34, true}},      Entry{9, {"q8_1", 32, 36, false}},
    Entry{10, {"q2_k", 256, 84, true}},    Entry{11, {"q3_k", 256, 110, true}},
    Entry{12, {"q4_k", 256, 144, true}},   Entry{13, {"q5_k", 256, 176, true}},
    Entry{14, {"q6_k", 256, 210, true}},   Entry{15, {"q8_k", 256, 292, true}},
    Entry{16, {"iq2_xxs", 256, 66, false}}, Entry{17, {"iq2_xs", 256, 74, true}},
    Entry{18, {"iq3_xxs", 256, 98, true}}, Entry{19, {"iq1_s", 256, 50, false}},
    Entry{20, {"iq4_nl", 32, 18, true}},   Entry{21, {"iq3_s", 256, 110, true}},
    Entry{22, {"iq2_s", 256, 82, false}},  Entry{23, {"iq4_xs", 256, 136, true}},
    Entry{24, {"i8", 1, 1, false}},        Entry{25, {"i16", 1, 2, false}},
    Entry{26, {"i32", 1, 4, false}},       Entry{27, {"i64", 1, 8, false}},
    Entry{28, {"f64", 1, 8, false}},       Entry{29, {"iq1_m", 256, 56, true}},
    Entry{30, {"bf16", 1, 2, true}},
};

}  // namespace

std::optional<DTypeTraits> dtype_traits(uint32_t id) {
    for (const auto& e : kTypes)
        if (e.id == id) return e.t;
    return std::nullopt;
}

const DTypeTraits& traits(DType t) {
    for (const auto& e : kTypes)
        if (e.id == static_cast<uint32_t>(t)) return e.t;
    fail_assert("known dtype", __FILE__, __LINE__);
}

const char* dtype_name(DType t) { return traits(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
    std::string lower(name);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const auto& e : kTypes)
        if (lower == e.t.name) return static_cast<DType>(e.id);
    return std::nullopt;
}

size_t row_bytes(DType t, int64_t n) {
    const auto& tr = traits(t);
    STRATA_ASSERT(n % tr.block_size == 0);
    return static_cast<size_t>(n / tr.block_size) * tr.block_bytes;
}

namespace {

float f16_bits_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: renormalize
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400) == 0);
            bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    return std::bit_cast<float>(bits);
}

// Every f16 code decoded once: decoding weights is a table lookup instead of bit manipulation per element.
const float* f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t h = 0; h < 65536; ++h) t[h] = f16_bits_to_f32(static_cast<uint16_t>(h));
        return t;
    }();
    return table.data();
}

}  // namespace

float f16_to_f32(uint16_t h) { return f16_table()[h]; }

uint16_t f32_to_f16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t abs = x & 0x7fffffff;
    if (abs > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);  // NaN
    if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to inf
    if (abs < 0x38800000) {  // subnormal or zero in f16
        if (abs < 0x33000000) return static_cast<uint16_t>(sign);
        const uint32_t e = abs >> 23;
        const uint32_t m = (abs & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - e;  // 14..24
        uint32_t v = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (v & 1))) ++v;
        return static_cast<uint16_t>(sign | v);
    }
    uint32_t v = ((abs >> 23) - 127 + 15) << 10 | (abs >> 13 & 0x3ff);
    const uint32_t rem = abs & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (v & 1))) ++v;
    return static_cast<uint16_t>(sign | v);
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
    x += 0x7fff + ((x >> 16) & 1);
    return static_cast<uint16_t>(x >> 16);
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
    switch (t) {
        case DType::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * 4);
            return;
        case DType::F16: {
            const auto* s = static_cast<const uint16_t*>(src);
            const float* table = f16_table();
            for (int64_t i = 0; i < n; ++i) dst[i] = table[s[i]];
            return;
        }
        case DType::BF16: {
            const auto* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
            return;
        }
        case DType::Q8_0: {
            STRATA_ASSERT(n % kQ8_0Block == 0);
            const auto* b = static_cast<const BlockQ8_0*>(src);
            const float* table = f16_table();
            for (int64_t i = 0; i < n / kQ8_0Block; ++i) {
                const float d = table[b[i].d];
                for (int64_t j = 0; j < kQ8_0Block; ++j) dst[i * kQ8_0Block + j] = d * b[i].qs[j];
            }
            return;
        }
        default:
            if (auto fn = quant::row_functions(t).to_f32) return fn(src, dst, n);
            throw Error(std::string("tensor type ") + dtype_name(t) + " is not supported by this build yet");
    }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
    switch (t) {
        case DType::F32:
            std::memcpy(dst, src, static_cast<size_t>(n) * 4);
            return;
        case DType::F16: {
            auto* d = static_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
            return;
        }
        case DType::BF16: {
            auto* d = static_cast<uint16_t*>(dst);
            for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
            return;
        }
        case DType::Q8_0: {
            // Same rule as ggml's reference quantizer: d = max|x| / 127, q = round(x / d).
            STRATA_ASSERT(n % kQ8_0Block == 0);
            auto* b = static_cast<BlockQ8_0*>(dst);
            for (int64_t i = 0; i < n / kQ8_0Block; ++i) {
                const float* x = src + i * kQ8_0Block;
                float amax = 0.0f;
                for (int64_t j = 0; j < kQ8_0Block; ++j) amax = std::max(amax, std::fabs(x[j]));
                const float d = amax / 127.0f;
                const float id = d != 0.0f ? 1.0f / d : 0.0f;
                b[i].d = f32_to_f16(d);
                // roundf (half away from zero) without a libm call per value: |x * id| <= 127 truncates exactly to
                // an int, and the fraction left decides the step away from zero. The loop vectorizes.
                for (int64_t j = 0; j < kQ8_0Block; ++j) {
                    const float v = x[j] * id;
                    const int q = static_cast<int>(v);
                    const float frac = v - static_cast<float>(q);
                    b[i].qs[j] = static_cast<int8_t>(q + (frac >= 0.5f) - (frac <= -0.5f));
                }
            }
            return;
        }
        default:
            if (auto fn = quant::row_functions(t).from_f32) return fn(src, dst, n);
            throw Error(std::string("cannot quantize to ") + dtype_name(t) + " yet");
    }
}

}  // namespace strata
