// Scalar reference dequantization of the i-quants (IQ4_NL, IQ4_XS, IQ2_XS, IQ3_XXS, IQ3_S, IQ1_M) and quantization
// of the two non-grid ones (IQ4_NL, IQ4_XS), following ggml's definitions (ggml-quants.c); plus the table that maps
// each quant type to its row functions. The grid types' quantizers are in quant_iq_grid.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::quant {
namespace {

constexpr float kGroupMaxEps = 1e-15f;
constexpr float kIQ1Delta = 0.125f;  // IQ1_S / IQ1_M: grid values are shifted by +-1/8

float h2f(uint16_t h) {
    return f16_to_f32(h);
}

uint16_t load_u16(const uint8_t* p) {
    return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t load_u32(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
           static_cast<uint32_t>(p[3]) << 24;
}

// Index of the codebook value nearest to x (ties to the upper neighbour only when strictly closer, as ggml).
int nearest_level(const int8_t* values, float x) {
    if (x <= values[0]) return 0;
    if (x >= values[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < values[mid])
            hi = mid;
        else
            lo = mid;
    }
    return x - values[hi - 1] < values[hi] - x ? hi - 1 : hi;
}

// ggml's quantize_row_iq4_nl_impl without importance weights (weights x^2): per block of 32 a scale search over
// 2 * ntry + 1 candidates; with several blocks (IQ4_XS) the block scales are then quantized to 6 bits against the
// largest and the indices recomputed. ntry = 7 is what llama-quantize uses for both types.
void quantize_iq4_super_block(int super_block, const float* x, uint16_t* dh, uint8_t* q4, uint16_t* scales_h,
                              uint8_t* scales_l, int ntry) {
    constexpr int kBlock = 32;
    const int8_t* values = kIQ4NLValues;
    float scales[kQK_K / kBlock], weight[kBlock];
    uint8_t L[kQK_K];
    std::memset(q4, 0, static_cast<size_t>(super_block / 2));
    std::memset(L, 0, sizeof L);
    *dh = f32_to_f16(0.f);
    const int n_blocks = super_block / kBlock;
    for (int ib = 0; ib < n_blocks; ++ib) {
        const float* xb = x + ib * kBlock;
        uint8_t* Lb = L + ib * kBlock;
        for (int j = 0; j < kBlock; ++j) weight[j] = xb[j] * xb[j];
        const float max = signed_absmax(xb, kBlock);
        if (std::fabs(max) < kGroupMaxEps) {
            scales[ib] = 0;
            continue;
        }
        float d = ntry > 0 ? -max / values[0] : max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < kBlock; ++j) {
            const int l = nearest_level(values, id * xb[j]);
            Lb[j] = static_cast<uint8_t>(l);
            const float q = values[l];
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; ++itry) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < kBlock; ++j) {
                const float q = values[nearest_level(values, id * xb[j])];
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
    }
    const float max_scale = signed_absmax(scales, n_blocks);
    if (n_blocks > 1) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = f32_to_f16(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < n_blocks; ++ib) {
            int l = std::max(-32, std::min(31, nearest_int(id * scales[ib])));
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < kBlock; ++j)
                L[ib * kBlock + j] = static_cast<uint8_t>(nearest_level(values, idl * x[ib * kBlock + j]));
            l += 32;
            if (ib % 2 == 0)
                scales_l[ib / 2] = static_cast<uint8_t>(l & 0xF);
            else
                scales_l[ib / 2] |= static_cast<uint8_t>((l & 0xF) << 4);
            *scales_h = static_cast<uint16_t>(*scales_h | ((l >> 4) << (2 * ib)));
        }
    } else {
        *dh = f32_to_f16(scales[0]);
        if (ntry > 0) {
            const float id = scales[0] ? 1 / scales[0] : 0;
            for (int j = 0; j < super_block; ++j) L[j] = static_cast<uint8_t>(nearest_level(values, id * x[j]));
        }
    }
    for (int i = 0; i < super_block / 32; ++i)
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

}  // namespace

// ---- IQ4_NL / IQ4_XS ----

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
    STRATA_ASSERT(n % kIQ4NLBlock == 0);
    const auto* b = static_cast<const BlockIQ4_NL*>(src);
    for (int64_t i = 0; i < n / kIQ4NLBlock; ++i, dst += kIQ4NLBlock) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; ++j) {
            dst[j] = d * kIQ4NLValues[b[i].qs[j] & 0xF];
            dst[j + 16] = d * kIQ4NLValues[b[i].qs[j] >> 4];
        }
    }
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n) {
    STRATA_ASSERT(n % kIQ4NLBlock == 0);
    auto* b = static_cast<BlockIQ4_NL*>(dst);
    uint16_t unused_h = 0;
    for (int64_t i = 0; i < n / kIQ4NLBlock; ++i)
        quantize_iq4_super_block(kIQ4NLBlock, src + i * kIQ4NLBlock, &b[i].d, b[i].qs, &unused_h, nullptr, 7);
}

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const auto* b = static_cast<const BlockIQ4_XS*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(b[i].d);
        for (int ib = 0; ib < 8; ++ib, dst += 32) {
            const int ls = ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b[i].scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * (ls - 32);
            const uint8_t* qs = b[i].qs + 16 * ib;
            for (int j = 0; j < 16; ++j) {
                dst[j] = dl * kIQ4NLValues[qs[j] & 0xF];
                dst[j + 16] = dl * kIQ4NLValues[qs[j] >> 4];
            }
        }
    }
}

void quantize_iq4_xs(const float* src, void* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    auto* b = static_cast<BlockIQ4_XS*>(dst);
    for (int64_t i = 0; i < n / kQK_K; ++i)
        quantize_iq4_super_block(kQK_K, src + i * kQK_K, &b[i].d, b[i].qs, &b[i].scales_h, b[i].scales_l, 7);
}

// ---- IQ2_XS ----

void dequantize_iq2_xs(const void* src, float* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const auto* b = static_cast<const BlockIQ2_XS*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(b[i].d);
        for (int ib32 = 0; ib32 < 8; ++ib32) {
            // Two 4-bit scales per 32 values: the low nibble covers the first 16, the high nibble the next 16.
            const float db[2] = {d * (0.5f + (b[i].scales[ib32] & 0xF)) * 0.25f,
                                 d * (0.5f + (b[i].scales[ib32] >> 4)) * 0.25f};
            for (int l = 0; l < 4; ++l, dst += 8) {
                const uint16_t q = b[i].qs[4 * ib32 + l];
                const uint64_t grid = kIQ2XSGrid[q & 511];
                const uint8_t signs = even_signs(q >> 9);
                for (int j = 0; j < 8; ++j) dst[j] = db[l / 2] * grid_byte(grid, j) * ((signs >> j) & 1 ? -1.f : 1.f);
            }
        }
    }
}

// ---- IQ3_XXS ----

void dequantize_iq3_xxs(const void* src, float* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const auto* b = static_cast<const BlockIQ3_XXS*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(b[i].d);
        const uint8_t* qs = b[i].qs;
        const uint8_t* scales_and_signs = b[i].qs + kQK_K / 4;
        for (int ib32 = 0; ib32 < 8; ++ib32, qs += 8) {
            const uint32_t aux = load_u32(scales_and_signs + 4 * ib32);
            const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; ++l, dst += 8) {
                const uint8_t signs = even_signs((aux >> (7 * l)) & 127);
                const uint32_t g1 = kIQ3XXSGrid[qs[2 * l]], g2 = kIQ3XXSGrid[qs[2 * l + 1]];
                for (int j = 0; j < 4; ++j) {
                    dst[j] = db * grid_byte(g1, j) * ((signs >> j) & 1 ? -1.f : 1.f);
                    dst[j + 4] = db * grid_byte(g2, j) * ((signs >> (j + 4)) & 1 ? -1.f : 1.f);
                }
            }
        }
    }
}

// ---- IQ3_S ----

void dequantize_iq3_s(const void* src, float* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const auto* b = static_cast<const BlockIQ3_S*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const float d = h2f(b[i].d);
        for (int ib32 = 0; ib32 < 8; ++ib32) {
            // Scale nibble ib32 % 2 of byte ib32 / 2; odd multiples 1..31 of d.
            const float db = d * (1 + 2 * ((b[i].scales[ib32 / 2] >> (4 * (ib32 % 2))) & 0xF));
            const uint8_t* qs = b[i].qs + 8 * ib32;
            const uint8_t qh = b[i].qh[ib32];
            const uint8_t* signs = b[i].signs + 4 * ib32;
            for (int l = 0; l < 4; ++l, dst += 8) {
                // Index bit 8 of grid entry k (0..7) of this group of 32 is bit k of qh.
                const uint32_t g1 = kIQ3SGrid[qs[2 * l] | (((qh >> (2 * l)) & 1) << 8)];
                const uint32_t g2 = kIQ3SGrid[qs[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8)];
                for (int j = 0; j < 4; ++j) {
                    dst[j] = db * grid_byte(g1, j) * ((signs[l] >> j) & 1 ? -1.f : 1.f);
                    dst[j + 4] = db * grid_byte(g2, j) * ((signs[l] >> (j + 4)) & 1 ? -1.f : 1.f);
                }
            }
        }
    }
}

// ---- IQ1_M ----

void dequantize_iq1_m(const void* src, float* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const auto* b = static_cast<const BlockIQ1_M*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        uint16_t sc[4];
        for (int k = 0; k < 4; ++k) sc[k] = load_u16(b[i].scales + 2 * k);
        // The f16 super-block scale: its 4 nibbles are the top nibbles of sc[0..3], low to high.
        const auto scale_bits =
            static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
        const float d = h2f(scale_bits);
        for (int ib = 0; ib < 8; ++ib) {
            const uint8_t* qs = b[i].qs + 4 * ib;
            const uint8_t* qh = b[i].qh + 2 * ib;
            for (int l = 0; l < 4; ++l, dst += 8) {
                // Group l of 8: 3-bit scale (two per uint16 of sc, 6 bits apart per group of 32), 11-bit index with
                // its high 3 bits and the delta sign in one nibble of qh.
                const int scale3 = (sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
                const float dl = d * (2 * scale3 + 1);
                const int nibble = (qh[l / 2] >> (4 * (l % 2))) & 0xF;
                const uint64_t grid = kIQ1SGrid[qs[l] | ((nibble & 7) << 8)];
                const float delta = nibble & 8 ? -kIQ1Delta : kIQ1Delta;
                for (int j = 0; j < 8; ++j) dst[j] = dl * (static_cast<int8_t>(grid_byte(grid, j)) + delta);
            }
        }
    }
}

RowFunctions row_functions(DType t) {
    switch (t) {
        case DType::Q4_0:
            return {dequantize_q4_0, quantize_q4_0};
        case DType::Q2_K:
            return {dequantize_q2_k, quantize_q2_k};
        case DType::Q3_K:
            return {dequantize_q3_k, quantize_q3_k};
        case DType::Q4_K:
            return {dequantize_q4_k, quantize_q4_k};
        case DType::Q5_K:
            return {dequantize_q5_k, quantize_q5_k};
        case DType::Q6_K:
            return {dequantize_q6_k, quantize_q6_k};
        case DType::Q8_K:
            return {dequantize_q8_k, quantize_q8_k};
        case DType::IQ4_NL:
            return {dequantize_iq4_nl, quantize_iq4_nl};
        case DType::IQ4_XS:
            return {dequantize_iq4_xs, quantize_iq4_xs};
        case DType::IQ2_XS:
            return {dequantize_iq2_xs, quantize_iq2_xs};
        case DType::IQ3_XXS:
            return {dequantize_iq3_xxs, quantize_iq3_xxs};
        case DType::IQ3_S:
            return {dequantize_iq3_s, quantize_iq3_s};
        case DType::IQ1_M:
            return {dequantize_iq1_m, quantize_iq1_m};
        default:
            return {};
    }
}

}  // namespace strata::quant
