// Scalar reference dot products of IQ2_XS / IQ1_M weights with Q8_K activations: llama.cpp's generic integer
// algorithm. Each group of 16 weights is an exact integer sum of grid value x activation, multiplied by the group's
// odd integer scale 2 * ls + 1; the super-block's float scales (weight d times activation d) multiply the integer total
// once. IQ2_XS's dequantized value is d * (2 * ls + 1) / 8 * grid, hence the final factor 1/8; IQ1_M's grid values
// are shifted by +-1/8, which is a second integer sum (of the activations) times 1/8.
#include <cstring>

#include "backend/cpu/dot_kernels.h"
#include "backend/cpu/dot_scalar.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::cpu {

namespace {

float dot_iq2_xs_one(int64_t n, const BlockIQ2_XS* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        const int8_t* a = y[i].qs;
        int32_t isum = 0;
        for (int ib16 = 0; ib16 < 16; ++ib16) {
            int32_t s = 0;
            for (int l = 0; l < 2; ++l, a += 8) {
                const uint16_t q = x[i].qs[2 * ib16 + l];
                s += signed_grid_dot(quant::kIQ2XSGrid[q & 511], 8, quant::even_signs(q >> 9), a);
            }
            // Scale nibble ib16 % 2 of byte ib16 / 2.
            const int32_t ls = (x[i].scales[ib16 / 2] >> (4 * (ib16 % 2))) & 0xF;
            isum += (2 * ls + 1) * s;
        }
        sum += f16_to_f32(x[i].d) * y[i].d * static_cast<float>(isum);
    }
    return 0.125f * sum;
}

float dot_iq1_m_one(int64_t n, const BlockIQ1_M* x, const BlockQ8_K* y) {
    float sum = 0;
    for (int64_t i = 0; i < n / kQK_K; ++i) {
        uint16_t sc[4];
        std::memcpy(sc, x[i].scales, sizeof(sc));
        // The f16 super-block scale: its 4 nibbles are the top nibbles of sc[0..3], low to high.
        const auto scale_bits =
            static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
        const int8_t* a = y[i].qs;
        int32_t grid_sum = 0, delta_sum = 0;
        for (int ib = 0; ib < 8; ++ib) {
            const uint8_t* qs = x[i].qs + 4 * ib;
            const uint8_t* qh = x[i].qh + 2 * ib;
            for (int half = 0; half < 2; ++half) {
                const int32_t ls = 2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * half)) & 7) + 1;
                int32_t gs = 0, ds = 0;
                for (int l = 2 * half; l < 2 * half + 2; ++l, a += 8) {
                    // Nibble l % 2 of qh[l / 2]: bits 0-2 are index bits 8-10, bit 3 the sign of the 1/8 shift.
                    const int nibble = (qh[l / 2] >> (4 * (l % 2))) & 0xF;
                    const uint64_t entry = quant::kIQ1SGrid[qs[l] | ((nibble & 7) << 8)];
                    int32_t g = 0, s = 0;
                    for (int j = 0; j < 8; ++j) {
                        g += static_cast<int8_t>(quant::grid_byte(entry, j)) * a[j];
                        s += a[j];
                    }
                    gs += g;
                    ds += nibble & 8 ? -s : s;
                }
                grid_sum += ls * gs;
                delta_sum += ls * ds;
            }
        }
        sum +=
            f16_to_f32(scale_bits) * y[i].d * (static_cast<float>(grid_sum) + 0.125f * static_cast<float>(delta_sum));
    }
    return sum;
}

}  // namespace

void register_dots_iq2_scalar(DotTable& t) {
    t.set(DType::IQ2_XS, scalar_q8k_columns<BlockIQ2_XS, dot_iq2_xs_one>);
    t.set(DType::IQ1_M, scalar_q8k_columns<BlockIQ1_M, dot_iq1_m_one>);
}

}  // namespace strata::cpu
