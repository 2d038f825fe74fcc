// Scalar reference (de)quantization of Q4_0 and the k-quants (Q2_K..Q6_K, Q8_K). Layouts and the quantizers' scale
// searches follow ggml's reference quantizers (quantize_row_*_ref in ggml-quants.c, which llama-quantize uses when no
// importance matrix is given), rewritten here, so strata's files quantize as llama.cpp's do.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/quant_blocks.h"

namespace strata::quant {
namespace {

constexpr float kGroupMaxEps = 1e-15f;  // a group whose |x| stays below this is all zero

float h2f(uint16_t h) {
    return f16_to_f32(h);
}

template <typename Block>
const Block* blocks_in(const void* src, int64_t n, int64_t block) {
    STRATA_ASSERT(n % block == 0);
    return static_cast<const Block*>(src);
}

template <typename Block>
Block* blocks_out(void* dst, int64_t n, int64_t block) {
    STRATA_ASSERT(n % block == 0);
    return static_cast<Block*>(dst);
}

// Symmetric levels in [-nmax, nmax-1] with a scale chosen by a small search that maximizes the weighted fit
// (ggml's make_qx_quants, weights x^2 when rmse_type == 1). L receives level + nmax.
float fit_symmetric(int n, int nmax, const float* x, int8_t* L, int rmse_type) {
    const float max = signed_absmax(x, n);
    if (std::fabs(max) < kGroupMaxEps) {
        std::fill(L, L + n, 0);
        return 0.0f;
    }
    float iscale = -nmax / max;
    auto level = [&](float s, int i) { return std::max(-nmax, std::min(nmax - 1, nearest_int(s * x[i]))); };
    if (rmse_type == 0) {
        for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + level(iscale, i));
        return 1 / iscale;
    }
    auto weight = [&](int i) {
        switch (rmse_type) {
            case 1:
                return x[i] * x[i];
            case 2:
                return 1.0f;
            case 3:
                return std::fabs(x[i]);
            default:
                return std::sqrt(std::fabs(x[i]));
        }
    };
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = level(iscale, i);
        L[i] = static_cast<int8_t>(l + nmax);
        const float w = weight(i);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            const int l = level(iscale, i);
            const float w = weight(i);
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + level(iscale, i));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q3_K's group fit (ggml's make_q3_quants with do_rmse): start from the max-based scale, then move single levels
// while the x^2-weighted fit improves. L receives level + nmax.
float fit_q3(int n, int nmax, const float* x, int8_t* L) {
    const float max = signed_absmax(x, n);
    if (std::fabs(max) < kGroupMaxEps) {
        std::fill(L, L + n, 0);
        return 0.0f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = static_cast<int8_t>(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = std::max(-nmax, std::min(nmax - 1, nearest_int(x[i] * sl2 / slx)));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = static_cast<int8_t>(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric levels 0..nmax with x ~ scale * l - min (min >= 0 returned in *the_min): tries nstep + 1 scales
// around nmax / (max - min) and keeps the weighted least-squares fit with the lowest error (ggml's
// make_qkx2_quants).
float fit_affine(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
                 float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        std::fill(L, L + n, 0);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
            Laux[i] = static_cast<uint8_t>(l);
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? std::fabs(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                std::copy(Laux, Laux + n, L);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// Packs 8 6-bit scales and 8 6-bit mins into Q4_K / Q5_K's 12 bytes (the inverse of unpack_scale_min_k4).
void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* out) {
    std::memset(out, 0, 12);
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            out[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
            out[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
        }
    }
}

// The 8 sub-block scales and mins of a Q4_K / Q5_K super-block, fitted with levels 0..nmax, quantized to 6 bits
// against the largest; then the levels are recomputed against the quantized scales. L gets 256 levels.
void quantize_k_affine(const float* x, int nmax, float rmin, int nstep, uint16_t* d_out, uint16_t* dmin_out,
                       uint8_t* scales_out, uint8_t* L) {
    float mins[8], scales[8], weights[32];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = std::sqrt(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
        scales[j] = fit_affine(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        max_scale = std::max(max_scale, scales[j]);
        max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
        ls[j] = static_cast<uint8_t>(std::min(63, nearest_int(inv_scale * scales[j]) & 0xff));
        lm[j] = static_cast<uint8_t>(std::min(63, nearest_int(inv_min * mins[j]) & 0xff));
    }
    pack_scale_min_k4(ls, lm, scales_out);
    *d_out = f32_to_f16(max_scale / 63.f);
    *dmin_out = f32_to_f16(max_min / 63.f);
    for (int j = 0; j < 8; ++j) {
        uint8_t sc = 0, m = 0;
        unpack_scale_min_k4(scales_out, j, &sc, &m);
        const float d = f16_to_f32(*d_out) * sc;
        if (!d) continue;
        const float dm = f16_to_f32(*dmin_out) * m;
        for (int ii = 0; ii < 32; ++ii) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
        }
    }
}

// 2-bit fields of 4 consecutive 32-element quarters of a 128-element half, packed into 32 bytes (Q2_K, Q3_K).
void pack_2bit_halves(const uint8_t* L, uint8_t* qs) {
    for (int j = 0; j < kQK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] =
                static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// The 2-bit field of element i (0..255) in Q2_K / Q3_K qs.
int two_bits(const uint8_t* qs, int i) {
    const int half = i / 128, within = i % 128;
    return (qs[32 * half + within % 32] >> (2 * (within / 32))) & 3;
}

}  // namespace

void unpack_scale_min_k4(const uint8_t* q, int j, uint8_t* scale, uint8_t* min) {
    if (j < 4) {
        *scale = q[j] & 63;
        *min = q[j + 4] & 63;
    } else {
        *scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

int unpack_scale_q3_k(const uint8_t* scales, int j) {
    const int low = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
    const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    return low | (high << 4);
}

// ---- Q4_0 ----

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
    const auto* b = blocks_in<BlockQ4_0>(src, n, kQ4_0Block);
    for (int64_t i = 0; i < n / kQ4_0Block; ++i, dst += kQ4_0Block) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; ++j) {
            dst[j] = d * ((b[i].qs[j] & 0xF) - 8);
            dst[j + 16] = d * ((b[i].qs[j] >> 4) - 8);
        }
    }
}

void quantize_q4_0(const float* src, void* dst, int64_t n) {
    auto* b = blocks_out<BlockQ4_0>(dst, n, kQ4_0Block);
    for (int64_t i = 0; i < n / kQ4_0Block; ++i, src += kQ4_0Block) {
        // The signed extreme maps to level 0 (-8) exactly; the other side gets at most +7.
        const float d = signed_absmax(src, kQ4_0Block) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < 16; ++j) {
            const auto lo =
                static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(src[j] * id + 8.5f))));
            const auto hi =
                static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(src[j + 16] * id + 8.5f))));
            b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
    }
}

// ---- Q2_K ----

void dequantize_q2_k(const void* src, float* dst, int64_t n) {
    const auto* b = blocks_in<BlockQ2_K>(src, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int e = 0; e < kQK_K; ++e) {
            const uint8_t sc = b[i].scales[e / 16];
            dst[e] = d * (sc & 0xF) * two_bits(b[i].qs, e) - dmin * (sc >> 4);
        }
    }
}

void quantize_q2_k(const float* src, void* dst, int64_t n) {
    auto* b = blocks_out<BlockQ2_K>(dst, n, kQK_K);
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
        const float* x = src;
        uint8_t L[kQK_K], Laux[16];
        float weights[16], mins[16], scales[16];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = fit_affine(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            max_scale = std::max(max_scale, scales[j]);
            max_min = std::max(max_min, mins[j]);
        }
        BlockQ2_K& y = b[i];
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; ++j) y.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
            y.d = f32_to_f16(max_scale / q4scale);
        } else {
            std::memset(y.scales, 0, sizeof y.scales);
            y.d = f32_to_f16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < 16; ++j) y.scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
            y.dmin = f32_to_f16(max_min / q4scale);
        } else {
            y.dmin = f32_to_f16(0.f);
        }
        for (int j = 0; j < 16; ++j) {
            const float d = h2f(y.d) * (y.scales[j] & 0xF);
            if (!d) continue;
            const float dm = h2f(y.dmin) * (y.scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, nearest_int((x[16 * j + ii] + dm) / d))));
        }
        pack_2bit_halves(L, y.qs);
    }
}

// ---- Q3_K ----

void dequantize_q3_k(const void* src, float* dst, int64_t n) {
    const auto* b = blocks_in<BlockQ3_K>(src, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
        const float d = h2f(b[i].d);
        for (int e = 0; e < kQK_K; ++e) {
            // The high bit of element e lives in hmask[e % 32], bit e / 32; a clear bit means "subtract 4".
            const int high = (b[i].hmask[e % 32] >> (e / 32)) & 1;
            const int q = two_bits(b[i].qs, e) - (high ? 0 : 4);
            dst[e] = d * (unpack_scale_q3_k(b[i].scales, e / 16) - 32) * q;
        }
    }
}

void quantize_q3_k(const float* src, void* dst, int64_t n) {
    auto* b = blocks_out<BlockQ3_K>(dst, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
        const float* x = src;
        int8_t L[kQK_K];
        float scales[16];
        for (int j = 0; j < 16; ++j) scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
        const float max_scale = signed_absmax(scales, 16);
        BlockQ3_K& y = b[i];
        std::memset(y.scales, 0, sizeof y.scales);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; ++j) {
                const int l = std::max(-32, std::min(31, nearest_int(iscale * scales[j]))) + 32;
                if (j < 8)
                    y.scales[j] = static_cast<uint8_t>(l & 0xF);
                else
                    y.scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
                y.scales[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
            }
            y.d = f32_to_f16(1 / iscale);
        } else {
            y.d = f32_to_f16(0.f);
        }
        for (int j = 0; j < 16; ++j) {
            const float d = h2f(y.d) * (unpack_scale_q3_k(y.scales, j) - 32);
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, nearest_int(x[16 * j + ii] / d))) + 4);
        }
        std::memset(y.hmask, 0, sizeof y.hmask);
        uint8_t low[kQK_K];
        for (int e = 0; e < kQK_K; ++e) {
            int l = L[e];
            if (l > 3) {
                y.hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
                l -= 4;
            }
            low[e] = static_cast<uint8_t>(l);
        }
        pack_2bit_halves(low, y.qs);
    }
}

// ---- Q4_K ----

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
    const auto* b = blocks_in<BlockQ4_K>(src, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        // Sub-block 2p is the low nibbles of qs[32p..32p+31], sub-block 2p+1 their high nibbles.
        for (int sb = 0; sb < 8; ++sb) {
            uint8_t sc = 0, m = 0;
            unpack_scale_min_k4(b[i].scales, sb, &sc, &m);
            const float dl = d * sc, ml = dmin * m;
            const uint8_t* q = b[i].qs + 32 * (sb / 2);
            const int shift = 4 * (sb % 2);
            for (int l = 0; l < 32; ++l) dst[32 * sb + l] = dl * ((q[l] >> shift) & 0xF) - ml;
        }
    }
}

void quantize_q4_k(const float* src, void* dst, int64_t n) {
    auto* b = blocks_out<BlockQ4_K>(dst, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
        uint8_t L[kQK_K];
        quantize_k_affine(src, 15, -1.f, 20, &b[i].d, &b[i].dmin, b[i].scales, L);
        for (int p = 0; p < 4; ++p)
            for (int l = 0; l < 32; ++l)
                b[i].qs[32 * p + l] = static_cast<uint8_t>(L[64 * p + l] | (L[64 * p + l + 32] << 4));
    }
}

// ---- Q5_K ----

void dequantize_q5_k(const void* src, float* dst, int64_t n) {
    const auto* b = blocks_in<BlockQ5_K>(src, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int sb = 0; sb < 8; ++sb) {
            uint8_t sc = 0, m = 0;
            unpack_scale_min_k4(b[i].scales, sb, &sc, &m);
            const float dl = d * sc, ml = dmin * m;
            const uint8_t* q = b[i].qs + 32 * (sb / 2);
            const int shift = 4 * (sb % 2);
            for (int l = 0; l < 32; ++l) {
                const int high = (b[i].qh[l] >> sb) & 1;  // bit sb of qh[l] is the fifth bit of sub-block sb
                dst[32 * sb + l] = dl * (((q[l] >> shift) & 0xF) + 16 * high) - ml;
            }
        }
    }
}

void quantize_q5_k(const float* src, void* dst, int64_t n) {
    auto* b = blocks_out<BlockQ5_K>(dst, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
        uint8_t L[kQK_K];
        quantize_k_affine(src, 31, -0.5f, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
        std::memset(b[i].qh, 0, sizeof b[i].qh);
        for (int p = 0; p < 4; ++p)
            for (int l = 0; l < 32; ++l) {
                int l1 = L[64 * p + l], l2 = L[64 * p + l + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    b[i].qh[l] |= static_cast<uint8_t>(1 << (2 * p));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    b[i].qh[l] |= static_cast<uint8_t>(1 << (2 * p + 1));
                }
                b[i].qs[32 * p + l] = static_cast<uint8_t>(l1 | (l2 << 4));
            }
    }
}

// ---- Q6_K ----

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
    const auto* b = blocks_in<BlockQ6_K>(src, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K) {
        const float d = h2f(b[i].d);
        for (int e = 0; e < kQK_K; ++e) {
            // Per 128-element half: quarter k (0..3) takes ql[l + 32 * (k % 2)] nibble k / 2 and qh[l] bits 2k..2k+1.
            const int half = e / 128, k = (e % 128) / 32, l = e % 32;
            const uint8_t* ql = b[i].ql + 64 * half;
            const uint8_t* qh = b[i].qh + 32 * half;
            const int low = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0xF;
            const int high = (qh[l] >> (2 * k)) & 3;
            dst[e] = d * b[i].scales[e / 16] * ((low | (high << 4)) - 32);
        }
    }
}

void quantize_q6_k(const float* src, void* dst, int64_t n) {
    auto* b = blocks_out<BlockQ6_K>(dst, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
        const float* x = src;
        int8_t L[kQK_K];
        float scales[16];
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < 16; ++ib) {
            scales[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib, 1);
            if (std::fabs(scales[ib]) > max_abs_scale) {
                max_abs_scale = std::fabs(scales[ib]);
                max_scale = scales[ib];
            }
        }
        BlockQ6_K& y = b[i];
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(&y, 0, sizeof y);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y.d = f32_to_f16(1 / iscale);
        for (int ib = 0; ib < 16; ++ib)
            y.scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
        for (int j = 0; j < 16; ++j) {
            const float d = h2f(y.d) * y.scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, nearest_int(x[16 * j + ii] / d))) + 32);
        }
        for (int half = 0; half < 2; ++half) {
            const int8_t* Lh = L + 128 * half;
            uint8_t* ql = y.ql + 64 * half;
            uint8_t* qh = y.qh + 32 * half;
            for (int l = 0; l < 32; ++l) {
                ql[l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
                ql[l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
                qh[l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                                             ((Lh[l + 96] >> 4) << 6));
            }
        }
    }
}

// ---- Q8_K ----

void dequantize_q8_k(const void* src, float* dst, int64_t n) {
    const auto* b = blocks_in<BlockQ8_K>(src, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, dst += kQK_K)
        for (int j = 0; j < kQK_K; ++j) dst[j] = b[i].d * b[i].qs[j];
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
    auto* b = blocks_out<BlockQ8_K>(dst, n, kQK_K);
    for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
        const float max = signed_absmax(src, kQK_K);
        BlockQ8_K& y = b[i];
        if (max == 0) {
            std::memset(&y, 0, sizeof y);
            continue;
        }
        // -127 (not -128) so that the signed extreme maps to +-127 exactly, as ggml does.
        const float iscale = -127.f / max;
        for (int j = 0; j < kQK_K; ++j) y.qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * src[j])));
        for (int j = 0; j < 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += y.qs[16 * j + ii];
            y.bsums[j] = static_cast<int16_t>(sum);
        }
        y.d = 1 / iscale;
    }
}

}  // namespace strata::quant
