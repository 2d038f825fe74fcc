// Quantizers of the grid i-quants IQ2_XS, IQ3_XXS, IQ3_S and IQ1_M. The method follows ggml's
// quantize_row_iq2_xs_impl / iq3_xxs / iq3_s / iq1_m (ggml-quants.c) as llama.cpp runs them with an importance matrix
// of all ones: per-element weights w_i = sqrt(sigma2 + x_i^2) (sigma2 = mean x^2 of the super-block, times 2 for the
// 3-bit and 1-bit types), a search over candidate sub-block scales in which each group of 8 (or 4) magnitudes is
// rounded to a level pattern and, when that pattern is not a grid entry, replaced by the best of its precomputed
// nearest grid entries, then 4-bit (3-bit for IQ1_M) sub-block scales relative to one f16 super-block scale.
// Differences from ggml, each chosen to lower the error: the searches score grid entries with the values the
// dequantizer really produces (IQ2_XS's levels are 8/25/43, not 1/3/5 times a step; IQ3_XXS's top level is 62, not
// 60); after the sub-block scales are rounded to their 4 (3) bits each group's grid entry is chosen again for the
// rounded scale when that lowers its error; and the super-block scale is the weighted least-squares fit of the final
// values, in place of ggml's fixed fudge factors (1.0125, 1.033, 1.1125). Blocks are first divided by their largest
// magnitude, so that squares and weights neither overflow nor underflow whatever the input's range.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/quant_blocks.h"
#include "core/quant_tables.h"

namespace strata::quant {
namespace {

// ---- search tables, built once per grid on first use ----

// For one grid: the level (0..n_levels-1) of every element of every entry, and for every pattern of levels the
// entry it is (map >= 0) or, for patterns off the grid, the entries nearest to it: all entries at the n_want
// smallest squared distances, by distance then index (ggml's iq2xs_init_impl / iq3xs_init_impl lists).
struct GridTables {
    int group = 0;     // elements per grid entry
    int bits = 0;      // bits per element in a pattern key
    int n_levels = 0;  // levels per element
    int n_grid = 0;
    std::vector<uint8_t> level;        // n_grid * group
    std::vector<int32_t> map;          // key -> entry index, or -(1 + offset into neighbours)
    std::vector<uint16_t> neighbours;  // at each offset: count, then that many entry indices
    int max_neighbours = 0;

    const uint8_t* entry(int g) const { return level.data() + static_cast<size_t>(g) * group; }
    const uint16_t* neighbours_of(int key) const { return neighbours.data() + (-map[static_cast<size_t>(key)] - 1); }
};

constexpr int32_t kNoPattern = std::numeric_limits<int32_t>::min();  // a key with a level >= n_levels

template <typename LevelOf>
GridTables build_tables(int n_grid, int group, int bits, int n_levels, int n_want, LevelOf level_of) {
    GridTables t;
    t.group = group;
    t.bits = bits;
    t.n_levels = n_levels;
    t.n_grid = n_grid;
    t.level.resize(static_cast<size_t>(n_grid * group));
    const int n_keys = 1 << (bits * group);
    t.map.assign(static_cast<size_t>(n_keys), kNoPattern);
    for (int g = 0; g < n_grid; ++g) {
        int key = 0;
        for (int i = 0; i < group; ++i) {
            const int l = level_of(g, i);
            STRATA_ASSERT(l >= 0 && l < n_levels);
            t.level[static_cast<size_t>(g * group + i)] = static_cast<uint8_t>(l);
            key |= l << (bits * i);
        }
        STRATA_ASSERT(t.map[static_cast<size_t>(key)] == kNoPattern);  // grid entries are distinct
        t.map[static_cast<size_t>(key)] = g;
    }
    std::vector<int> d2(static_cast<size_t>(n_grid));
    STRATA_ASSERT(n_want >= 1 && n_want <= 4);
    std::array<int, 4> want{};
    int pattern[8];
    for (int key = 0; key < n_keys; ++key) {
        if (t.map[static_cast<size_t>(key)] != kNoPattern) continue;
        bool valid = true;
        for (int i = 0; i < group; ++i) {
            pattern[i] = (key >> (bits * i)) & ((1 << bits) - 1);
            valid = valid && pattern[i] < n_levels;
        }
        if (!valid) continue;
        // The n_want smallest distinct distances, ascending.
        int n_have = 0;
        for (int g = 0; g < n_grid; ++g) {
            const uint8_t* e = t.entry(g);
            int d = 0;
            for (int i = 0; i < group; ++i) d += (e[i] - pattern[i]) * (e[i] - pattern[i]);
            d2[static_cast<size_t>(g)] = d;
            int pos = 0;
            while (pos < n_have && want[static_cast<size_t>(pos)] < d) ++pos;
            if (pos >= n_want || (pos < n_have && want[static_cast<size_t>(pos)] == d)) continue;
            for (int k = std::min(n_have, n_want - 1); k > pos; --k)
                want[static_cast<size_t>(k)] = want[static_cast<size_t>(k - 1)];
            want[static_cast<size_t>(pos)] = d;
            n_have = std::min(n_have + 1, n_want);
        }
        const size_t offset = t.neighbours.size();
        t.neighbours.push_back(0);
        for (int k = 0; k < n_have; ++k)
            for (int g = 0; g < n_grid; ++g)
                if (d2[static_cast<size_t>(g)] == want[static_cast<size_t>(k)])
                    t.neighbours.push_back(static_cast<uint16_t>(g));
        const auto count = static_cast<int>(t.neighbours.size() - offset - 1);
        STRATA_ASSERT(count > 0);
        t.neighbours[offset] = static_cast<uint16_t>(count);
        t.max_neighbours = std::max(t.max_neighbours, count);
        t.map[static_cast<size_t>(key)] = -static_cast<int32_t>(offset) - 1;
    }
    return t;
}

// Index of a byte value in a grid's list of levels.
int level_index(const uint8_t* values, int n, uint8_t byte) {
    for (int l = 0; l < n; ++l)
        if (values[l] == byte) return l;
    return -1;
}

const GridTables& iq2xs_tables() {
    // Only the nearest shell (ggml takes two): as good in tests, and ggml's 292-entry lists cost 7x the time.
    static const GridTables t = build_tables(512, 8, 2, 3, 1, [](int g, int i) {
        static constexpr uint8_t kBytes[3] = {8, 25, 43};
        return level_index(kBytes, 3, grid_byte(kIQ2XSGrid[g], i));
    });
    return t;
}

const GridTables& iq3xxs_tables() {
    static const GridTables t = build_tables(256, 4, 3, 8, 2, [](int g, int i) {
        static constexpr uint8_t kBytes[8] = {4, 12, 20, 28, 36, 44, 52, 62};
        return level_index(kBytes, 8, grid_byte(kIQ3XXSGrid[g], i));
    });
    return t;
}

const GridTables& iq3s_tables() {
    static const GridTables t = build_tables(512, 4, 3, 8, 3, [](int g, int i) {
        static constexpr uint8_t kBytes[8] = {1, 3, 5, 7, 9, 11, 13, 15};
        return level_index(kBytes, 8, grid_byte(kIQ3SGrid[g], i));
    });
    return t;
}

const GridTables& iq1_tables() {
    static const GridTables t = build_tables(2048, 8, 2, 3, 3, [](int g, int i) {
        return static_cast<int8_t>(grid_byte(kIQ1SGrid[g], i)) + 1;  // -1, 0, 1 -> levels 0, 1, 2
    });
    return t;
}

// ---- shared pieces ----

// Per-block scratch: the largest magnitude of a super-block and the block divided by it.
struct Normalized {
    float amax = 0;
    float x[kQK_K];
    float sigma2 = 0;  // mean of x^2 over the super-block (normalized)
};

// False for a block that quantizes to zero (all (near) zero, or not finite).
bool normalize(const float* x, float sigma_factor, Normalized* n) {
    float amax = 0;
    for (int i = 0; i < kQK_K; ++i) amax = std::max(amax, std::fabs(x[i]));
    if (!(amax >= 1e-30f) || !std::isfinite(amax)) return false;
    n->amax = amax;
    const float inv = 1.0f / amax;
    float sumx2 = 0;
    for (int i = 0; i < kQK_K; ++i) {
        n->x[i] = x[i] * inv;
        sumx2 += n->x[i] * n->x[i];
    }
    n->sigma2 = sigma_factor * sumx2 / kQK_K;
    return true;
}

// f16 of a scale, kept finite.
uint16_t scale_to_f16(float d) {
    constexpr float kF16Max = 65504.0f;
    return f32_to_f16(std::isfinite(d) ? std::min(d, kF16Max) : 0.0f);
}

// Magnitudes and sign bits of a group of 8 under the even-parity rule (IQ2_XS, IQ3_XXS): 7 stored signs, the 8th
// implied so that the number of negatives is even. With an odd count the element of least w*x^2 keeps its wrong
// sign: its target magnitude becomes negative (the quantizer then gives it the smallest level).
uint8_t even_parity_signs(const float* x, const float* w, float* xval) {
    uint8_t s = 0;
    int n_neg = 0;
    for (int i = 0; i < 8; ++i) {
        xval[i] = std::fabs(x[i]);
        if (x[i] < 0) {
            s = static_cast<uint8_t>(s | (1 << i));
            ++n_neg;
        }
    }
    if (n_neg % 2) {
        int imin = 0;
        float min = w[0] * x[0] * x[0];
        for (int i = 1; i < 8; ++i) {
            const float v = w[i] * x[i] * x[i];
            if (v < min) {
                min = v;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s = static_cast<uint8_t>(s ^ (1 << imin));
    }
    return static_cast<uint8_t>(s & 127);
}

// ---- IQ2_XS / IQ3_XXS / IQ3_S: scale search over groups on a grid of magnitudes ----

// The grid entry chosen for a group and its weighted sums sum(w x q) and sum(w q^2) (q: dequantized level values
// in units of the sub-block scale).
struct Choice {
    int index = 0;
    float sqx = 0, sq2 = 0;
};

// Error of a choice at scale s, up to a constant: sum w (s q - x)^2 - sum w x^2.
inline float choice_error(const Choice& c, float s) {
    return s * s * c.sq2 - 2 * s * c.sqx;
}

constexpr int kMaxCandidates = 256;  // longest neighbour lists: 68 (IQ2_XS), 36 (IQ3_XXS), 38 (IQ3_S)

// Chooses grid entries for one group of G magnitudes at a given scale; remembers the candidates of the last pattern
// it saw, since a scale search visits each pattern of a group for several consecutive scales. The four sums a
// candidate needs are sums over its elements of per-(element, level) terms, tabulated once per group by reset().
template <int G>
class GroupChooser {
public:
    void reset(const GridTables* t, const float* values, const float* x, const float* w, const float* wa) {
        t_ = t;
        x_ = x;
        key_ = -1;
        for (int i = 0; i < G; ++i)
            for (int l = 0; l < t->n_levels; ++l) {
                const float q = values[l];
                Terms& e = terms_[i][l];
                e.v[0] = wa[i] * q * q;     // a: candidate search (ggml weighs it by sqrt(w))
                e.v[1] = wa[i] * q * x[i];  // b
                e.v[2] = w[i] * q * x[i];   // sqx: the sub-block's least-squares scale
                e.v[3] = w[i] * q * q;      // sq2
            }
    }

    Choice choose(float id, float scale) {
        int key = 0;
        const int top = t_->n_levels - 1;
        for (int i = 0; i < G; ++i) {
            const int l = std::clamp(nearest_int(0.5f * (id * x_[i] - 1)), 0, top);
            key |= l << (t_->bits * i);
        }
        if (key != key_) load(key);
        if (n_ == 0) return on_grid_;
        // Candidate of least sum wa (scale q - x)^2 = scale^2 a - 2 scale b + c; ties to the first, as ggml.
        int best = 0;
        float best_d = scale * cand_[0].v[0] - 2 * cand_[0].v[1];
        for (int j = 1; j < n_; ++j) {
            const float d = scale * cand_[j].v[0] - 2 * cand_[j].v[1];
            if (d < best_d) {
                best_d = d;
                best = j;
            }
        }
        return Choice{.index = cand_index_[best], .sqx = cand_[best].v[2], .sq2 = cand_[best].v[3]};
    }

private:
    struct alignas(16) Terms {
        float v[4];
    };

    Terms sums(int g) const {
        const uint8_t* e = t_->entry(g);
        Terms s = terms_[0][e[0]];
        for (int i = 1; i < G; ++i)
            for (int k = 0; k < 4; ++k) s.v[k] += terms_[i][e[i]].v[k];
        return s;
    }

    void load(int key) {
        key_ = key;
        const int32_t m = t_->map[static_cast<size_t>(key)];
        if (m >= 0) {
            n_ = 0;
            const Terms s = sums(m);
            on_grid_ = Choice{.index = m, .sqx = s.v[2], .sq2 = s.v[3]};
            return;
        }
        const uint16_t* nb = t_->neighbours_of(key);
        n_ = nb[0];
        STRATA_ASSERT(n_ <= kMaxCandidates);
        for (int j = 0; j < n_; ++j) {
            cand_index_[j] = nb[1 + j];
            cand_[j] = sums(nb[1 + j]);
        }
    }

    const GridTables* t_ = nullptr;
    const float* x_ = nullptr;
    int key_ = -1;
    int n_ = 0;
    Choice on_grid_;
    Terms terms_[G][8];
    // Left uninitialized: only the first n_ entries are ever read.
    Terms cand_[kMaxCandidates];
    int cand_index_[kMaxCandidates];
};

struct ScaleTrials {
    int half_range;  // candidates is = -half_range..half_range
    float step;      // id = (2 n_levels - 1 + is * step) / max
};


// One sub-block of B magnitudes in groups of G: its scale (0 for a sub-block of zeros) and the choice of each group.
// Every candidate scale of `trials` is tried; then the least-squares scale of the best candidate gets one more pass.
template <int B, int G>
float search_sub_block(const GridTables& t, const float* values, const float* xval, const float* w, const float* wa,
                       ScaleTrials trials, float eps, GroupChooser<G>* chooser, Choice* out) {
    constexpr int kGroups = B / G;
    float max = xval[0];
    for (int i = 1; i < B; ++i) max = std::max(max, xval[i]);
    for (int k = 0; k < kGroups; ++k) out[k] = Choice{};
    if (!(max >= eps)) return 0;
    for (int k = 0; k < kGroups; ++k) chooser[k].reset(&t, values, xval + G * k, w + G * k, wa + G * k);
    const float top = static_cast<float>(2 * t.n_levels - 1);
    float best = 0, scale = 0;
    Choice trial[kGroups];
    const auto try_scale = [&](float id, float s) {
        float sqx = 0, sq2 = 0;
        for (int k = 0; k < kGroups; ++k) {
            trial[k] = chooser[k].choose(id, s);
            sqx += trial[k].sqx;
            sq2 += trial[k].sq2;
        }
        if (sqx > 0 && sq2 > 0 && sqx * sqx > best * sq2) {
            scale = sqx / sq2;
            best = scale * sqx;
            std::copy(trial, trial + kGroups, out);
        }
    };
    for (int is = -trials.half_range; is <= trials.half_range; ++is) {
        const float id = (top + static_cast<float>(is) * trials.step) / max;
        try_scale(id, 1 / id);
    }
    if (scale > 0) try_scale(1 / scale, scale);
    return scale;
}

// The super-block part shared by IQ2_XS, IQ3_XXS and IQ3_S: sub-block scales become 4-bit codes l with effective
// scale d (2 l + 1), d = max / 31; each group's entry is chosen again for its rounded scale when that lowers its
// error; then d is refitted by weighted least squares over the whole super-block. Returns d (0: all zero).
template <int G>
float finish_super_block(const GridTables& t, const float* values, int n_sub, int groups_per_sub, const float* scales,
                         const float* xval, const float* w, const float* wa, GroupChooser<G>& chooser,
                         Choice* choices, uint8_t* codes) {
    float max_scale = 0;
    for (int ib = 0; ib < n_sub; ++ib) max_scale = std::max(max_scale, scales[ib]);
    if (!(max_scale > 0)) return 0;
    float d = max_scale / 31;
    double num = 0, den = 0;
    for (int ib = 0; ib < n_sub; ++ib) {
        const int l = std::clamp(nearest_int(0.5f * (scales[ib] / d - 1)), 0, 15);
        codes[ib] = static_cast<uint8_t>(l);
        const float s = d * static_cast<float>(2 * l + 1);
        for (int k = 0; k < groups_per_sub; ++k) {
            const int g = ib * groups_per_sub + k;
            if (scales[ib] > 0) {
                chooser.reset(&t, values, xval + G * g, w + G * g, wa + G * g);
                const Choice again = chooser.choose(1 / s, s);
                if (choice_error(again, s) < choice_error(choices[g], s)) choices[g] = again;
            }
            const float m = static_cast<float>(2 * l + 1);
            num += static_cast<double>(m * choices[g].sqx);
            den += static_cast<double>(m * m * choices[g].sq2);
        }
    }
    if (num > 0 && den > 0) d = static_cast<float>(num / den);
    return d;
}

// Per-element weights of a block of n from the normalized super-block: w = sqrt(sigma2 + x^2), wa = sqrt(w).
void element_weights(const float* x, int n, float sigma2, float* w, float* wa) {
    for (int i = 0; i < n; ++i) {
        w[i] = std::sqrt(sigma2 + x[i] * x[i]);
        wa[i] = std::sqrt(w[i]);
    }
}

// Level values in units of the sub-block scale, as the dequantizers compute them.
constexpr float kIQ2XSValues[3] = {8 / 8.0f, 25 / 8.0f, 43 / 8.0f};
constexpr float kIQ3XXSValues[8] = {1, 3, 5, 7, 9, 11, 13, 15.5f};
constexpr float kIQ3SValues[8] = {1, 3, 5, 7, 9, 11, 13, 15};

// ggml tries 19 (IQ2_XS, IQ3_S) and 31 (IQ3_XXS) scales over the same span; with the least-squares pass, the
// re-choice after scale rounding and the refit of d, 5 spread over that span measured the same RMSE at ~1/4 the time.
constexpr ScaleTrials kIQ2XSTrials{.half_range = 2, .step = 0.4f};
constexpr ScaleTrials kIQ3XXSTrials{.half_range = 2, .step = 1.2f};
constexpr ScaleTrials kIQ3STrials{.half_range = 2, .step = 0.8f};

}  // namespace

// ---- IQ2_XS ----

void quantize_iq2_xs(const float* src, void* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const GridTables& t = iq2xs_tables();
    auto* y = static_cast<BlockIQ2_XS*>(dst);
    Normalized nx;
    float xval[kQK_K], w[kQK_K], wa[kQK_K], scales[kQK_K / 16];
    uint8_t signs[kQK_K / 8], codes[kQK_K / 16];
    Choice choices[kQK_K / 8];
    static thread_local GroupChooser<8> chooser[2];
    for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
        BlockIQ2_XS& b = y[ibl];
        std::memset(&b, 0, sizeof b);
        if (!normalize(src + ibl * kQK_K, 1.0f, &nx)) continue;
        element_weights(nx.x, kQK_K, nx.sigma2, w, wa);
        for (int g = 0; g < kQK_K / 8; ++g) signs[g] = even_parity_signs(nx.x + 8 * g, w + 8 * g, xval + 8 * g);
        for (int ib = 0; ib < kQK_K / 16; ++ib)
            scales[ib] = search_sub_block<16, 8>(t, kIQ2XSValues, xval + 16 * ib, w + 16 * ib, wa + 16 * ib,
                                                 kIQ2XSTrials, 1e-15f, chooser, choices + 2 * ib);
        const float d = finish_super_block<8>(t, kIQ2XSValues, kQK_K / 16, 2, scales, xval, w, wa, chooser[0], choices, codes);
        if (!(d > 0)) continue;
        b.d = scale_to_f16(d * nx.amax);
        for (int g = 0; g < kQK_K / 8; ++g) b.qs[g] = static_cast<uint16_t>(choices[g].index | (signs[g] << 9));
        for (int ib = 0; ib < kQK_K / 16; ++ib)
            b.scales[ib / 2] = static_cast<uint8_t>(b.scales[ib / 2] | (codes[ib] << (4 * (ib % 2))));
    }
}

// ---- IQ3_XXS ----

void quantize_iq3_xxs(const float* src, void* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const GridTables& t = iq3xxs_tables();
    auto* y = static_cast<BlockIQ3_XXS*>(dst);
    Normalized nx;
    float xval[kQK_K], w[kQK_K], wa[kQK_K], scales[kQK_K / 32];
    uint8_t signs[kQK_K / 8], codes[kQK_K / 32];
    Choice choices[kQK_K / 4];
    static thread_local GroupChooser<4> chooser[8];
    for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
        BlockIQ3_XXS& b = y[ibl];
        std::memset(&b, 0, sizeof b);
        if (!normalize(src + ibl * kQK_K, 2.0f, &nx)) continue;
        element_weights(nx.x, kQK_K, nx.sigma2, w, wa);
        for (int g = 0; g < kQK_K / 8; ++g) signs[g] = even_parity_signs(nx.x + 8 * g, w + 8 * g, xval + 8 * g);
        for (int ib = 0; ib < kQK_K / 32; ++ib)
            scales[ib] = search_sub_block<32, 4>(t, kIQ3XXSValues, xval + 32 * ib, w + 32 * ib, wa + 32 * ib,
                                                 kIQ3XXSTrials, 1e-8f, chooser, choices + 8 * ib);
        const float d = finish_super_block<4>(t, kIQ3XXSValues, kQK_K / 32, 8, scales, xval, w, wa, chooser[0], choices, codes);
        if (!(d > 0)) continue;
        b.d = scale_to_f16(d * nx.amax);
        uint8_t* scales_and_signs = b.qs + kQK_K / 4;
        for (int g = 0; g < kQK_K / 4; ++g) b.qs[g] = static_cast<uint8_t>(choices[g].index);
        for (int ib = 0; ib < kQK_K / 32; ++ib) {
            const uint32_t word = static_cast<uint32_t>(signs[4 * ib]) | static_cast<uint32_t>(signs[4 * ib + 1]) << 7 |
                                  static_cast<uint32_t>(signs[4 * ib + 2]) << 14 |
                                  static_cast<uint32_t>(signs[4 * ib + 3]) << 21 | static_cast<uint32_t>(codes[ib]) << 28;
            for (int k = 0; k < 4; ++k) scales_and_signs[4 * ib + k] = static_cast<uint8_t>(word >> (8 * k));
        }
    }
}

// ---- IQ3_S ----

void quantize_iq3_s(const float* src, void* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const GridTables& t = iq3s_tables();
    auto* y = static_cast<BlockIQ3_S*>(dst);
    Normalized nx;
    float xval[kQK_K], w[kQK_K], wa[kQK_K], scales[kQK_K / 32];
    uint8_t codes[kQK_K / 32];
    Choice choices[kQK_K / 4];
    static thread_local GroupChooser<4> chooser[8];
    for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
        BlockIQ3_S& b = y[ibl];
        std::memset(&b, 0, sizeof b);
        if (!normalize(src + ibl * kQK_K, 2.0f, &nx)) continue;
        element_weights(nx.x, kQK_K, nx.sigma2, w, wa);
        // Explicit sign bits: every element keeps its own sign.
        for (int i = 0; i < kQK_K; ++i) {
            xval[i] = std::fabs(nx.x[i]);
            if (nx.x[i] < 0) b.signs[i / 8] = static_cast<uint8_t>(b.signs[i / 8] | (1 << (i % 8)));
        }
        for (int ib = 0; ib < kQK_K / 32; ++ib)
            scales[ib] = search_sub_block<32, 4>(t, kIQ3SValues, xval + 32 * ib, w + 32 * ib, wa + 32 * ib,
                                                 kIQ3STrials, std::numeric_limits<float>::min(), chooser,
                                                 choices + 8 * ib);
        const float d = finish_super_block<4>(t, kIQ3SValues, kQK_K / 32, 8, scales, xval, w, wa, chooser[0], choices, codes);
        if (!(d > 0)) {
            std::memset(&b, 0, sizeof b);
            continue;
        }
        b.d = scale_to_f16(d * nx.amax);
        for (int g = 0; g < kQK_K / 4; ++g) {
            b.qs[g] = static_cast<uint8_t>(choices[g].index & 255);
            b.qh[g / 8] = static_cast<uint8_t>(b.qh[g / 8] | ((choices[g].index >> 8) << (g % 8)));
        }
        for (int ib = 0; ib < kQK_K / 32; ib += 2)
            b.scales[ib / 2] = static_cast<uint8_t>(codes[ib] | (codes[ib + 1] << 4));
    }
}

// ---- IQ1_M ----

namespace {

constexpr float kIQ1MDelta = 0.125f;
constexpr int kIQ1MBlock = 16;  // elements per 3-bit scale; two groups of 8, each with its own shift sign

// A level's value in units of the sub-block scale: -1, 0, 1 shifted by +delta (minus = 0) or -delta (minus = 1).
inline float iq1_value(int level, int minus) {
    return static_cast<float>(level - 1) + (minus ? -kIQ1MDelta : kIQ1MDelta);
}

Choice iq1_stats(const GridTables& t, int g, const float* x, const float* w, int minus) {
    const uint8_t* e = t.entry(g);
    Choice c{.index = g};
    for (int i = 0; i < 8; ++i) {
        const float q = iq1_value(e[i], minus);
        c.sqx += w[i] * x[i] * q;
        c.sq2 += w[i] * q * q;
    }
    return c;
}

// The grid entry for a group of 8 whose levels are `levels`: that pattern if it is on the grid, else the neighbour of
// least weighted error at scale s.
Choice iq1_choose(const GridTables& t, const uint8_t* levels, const float* x, const float* w, float s, int minus) {
    int key = 0;
    for (int i = 0; i < 8; ++i) key |= levels[i] << (2 * i);
    const int32_t m = t.map[static_cast<size_t>(key)];
    if (m >= 0) return iq1_stats(t, m, x, w, minus);
    const uint16_t* nb = t.neighbours_of(key);
    Choice best = iq1_stats(t, nb[1], x, w, minus);
    for (int j = 2; j <= nb[0]; ++j) {
        const Choice c = iq1_stats(t, nb[j], x, w, minus);
        if (choice_error(c, s) < choice_error(best, s)) best = c;
    }
    return best;
}

// The levels nearest to x / s, then the grid entry for them.
Choice iq1_choose_nearest(const GridTables& t, const float* x, const float* w, float s, int minus) {
    uint8_t levels[8];
    for (int i = 0; i < 8; ++i) {
        int best = 0;
        float best_d = std::fabs(s * iq1_value(0, minus) - x[i]);
        for (int l = 1; l < 3; ++l) {
            const float d = std::fabs(s * iq1_value(l, minus) - x[i]);
            if (d < best_d) {
                best_d = d;
                best = l;
            }
        }
        levels[i] = static_cast<uint8_t>(best);
    }
    return iq1_choose(t, levels, x, w, s, minus);
}

// One block of 16: the exact weighted least-squares split of the sorted values into the levels -1 / 0 / 1 and of the
// two shift signs (ggml's exhaustive search, here with prefix sums), then grid entries for both groups of 8.
float iq1m_search_block(const GridTables& t, const float* x, const float* w, Choice* out, int* minus_out) {
    float max = 0;
    for (int i = 0; i < kIQ1MBlock; ++i) max = std::max(max, std::fabs(x[i]));
    minus_out[0] = minus_out[1] = 0;
    if (!(max >= 1e-7f)) {
        const uint8_t zeros[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        for (int k = 0; k < 2; ++k) out[k] = iq1_choose(t, zeros, x + 8 * k, w + 8 * k, 1.0f, 0);
        return 0;
    }
    int order[kIQ1MBlock];
    for (int i = 0; i < kIQ1MBlock; ++i) order[i] = i;
    std::stable_sort(order, order + kIQ1MBlock, [x](int a, int b) { return x[a] < x[b]; });
    // Prefix sums of w and w x over the sorted order, separately for each group of 8.
    float pw[2][kIQ1MBlock + 1] = {}, pwx[2][kIQ1MBlock + 1] = {};
    for (int j = 0; j < kIQ1MBlock; ++j) {
        const int i = order[j], h = i / 8;
        for (int g = 0; g < 2; ++g) {
            pw[g][j + 1] = pw[g][j] + (g == h ? w[i] : 0.0f);
            pwx[g][j + 1] = pwx[g][j] + (g == h ? w[i] * x[i] : 0.0f);
        }
    }
    float best = -1, scale = 0;
    int best_i1 = 0, best_i2 = 0, best_shift = 0;
    for (int i1 = 0; i1 <= kIQ1MBlock; ++i1) {
        for (int i2 = i1; i2 <= kIQ1MBlock; ++i2) {
            float qx[2][2], q2[2][2];
            for (int h = 0; h < 2; ++h) {
                const float sw[3] = {pw[h][i1], pw[h][i2] - pw[h][i1], pw[h][kIQ1MBlock] - pw[h][i2]};
                const float swx[3] = {pwx[h][i1], pwx[h][i2] - pwx[h][i1], pwx[h][kIQ1MBlock] - pwx[h][i2]};
                for (int m = 0; m < 2; ++m) {
                    qx[h][m] = q2[h][m] = 0;
                    for (int l = 0; l < 3; ++l) {
                        const float v = iq1_value(l, m);
                        qx[h][m] += v * swx[l];
                        q2[h][m] += v * v * sw[l];
                    }
                }
            }
            for (int shift = 0; shift < 4; ++shift) {
                const int m0 = shift >> 1, m1 = shift & 1;
                const float sqx = qx[0][m0] + qx[1][m1], sq2 = q2[0][m0] + q2[1][m1];
                if (sq2 > 0 && sqx * sqx > best * sq2) {
                    scale = sqx / sq2;
                    best = scale * sqx;
                    best_i1 = i1;
                    best_i2 = i2;
                    best_shift = shift;
                }
            }
        }
    }
    if (!(best > 0)) {
        const uint8_t zeros[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        for (int k = 0; k < 2; ++k) out[k] = iq1_choose(t, zeros, x + 8 * k, w + 8 * k, 1.0f, 0);
        return 0;
    }
    uint8_t levels[kIQ1MBlock];
    for (int j = 0; j < kIQ1MBlock; ++j) levels[order[j]] = static_cast<uint8_t>(j < best_i1 ? 0 : j < best_i2 ? 1 : 2);
    if (scale < 0) {  // the mirrored solution: levels and both shift signs flip
        for (uint8_t& l : levels) l = static_cast<uint8_t>(2 - l);
        best_shift = 3 - best_shift;
        scale = -scale;
    }
    minus_out[0] = best_shift >> 1;
    minus_out[1] = best_shift & 1;
    bool on_grid = true;
    float sqx = 0, sq2 = 0;
    for (int k = 0; k < 2; ++k) {
        int key = 0;
        for (int i = 0; i < 8; ++i) key |= levels[8 * k + i] << (2 * i);
        on_grid = on_grid && t.map[static_cast<size_t>(key)] >= 0;
        out[k] = iq1_choose(t, levels + 8 * k, x + 8 * k, w + 8 * k, scale, minus_out[k]);
        sqx += out[k].sqx;
        sq2 += out[k].sq2;
    }
    if (!on_grid && sqx > 0 && sq2 > 0) scale = sqx / sq2;
    return scale;
}

}  // namespace

void quantize_iq1_m(const float* src, void* dst, int64_t n) {
    STRATA_ASSERT(n % kQK_K == 0);
    const GridTables& t = iq1_tables();
    auto* y = static_cast<BlockIQ1_M*>(dst);
    constexpr int kBlocks = kQK_K / kIQ1MBlock;
    Normalized nx;
    float w[kQK_K], scales[kBlocks];
    int minus[kQK_K / 8];
    Choice choices[kQK_K / 8];
    for (int64_t ibl = 0; ibl < n / kQK_K; ++ibl) {
        BlockIQ1_M& b = y[ibl];
        std::memset(&b, 0, sizeof b);
        if (!normalize(src + ibl * kQK_K, 2.0f, &nx)) continue;
        for (int i = 0; i < kQK_K; ++i) w[i] = std::sqrt(nx.sigma2 + nx.x[i] * nx.x[i]);
        float max_scale = 0;
        for (int ib = 0; ib < kBlocks; ++ib) {
            scales[ib] = iq1m_search_block(t, nx.x + kIQ1MBlock * ib, w + kIQ1MBlock * ib, choices + 2 * ib,
                                           minus + 2 * ib);
            max_scale = std::max(max_scale, scales[ib]);
        }
        if (!(max_scale > 0)) continue;
        // 3-bit block scales d (2 l + 1) with d = max / 15, entries chosen again for the rounded scales, then d
        // refitted by least squares over the super-block.
        float d = max_scale / 15;
        uint16_t sc[4] = {};
        double num = 0, den = 0;
        for (int ib = 0; ib < kBlocks; ++ib) {
            const int l = std::clamp(nearest_int(0.5f * (scales[ib] / d - 1)), 0, 7);
            sc[ib / 4] = static_cast<uint16_t>(sc[ib / 4] | (l << (3 * (ib % 4))));
            const float m = static_cast<float>(2 * l + 1);
            const float s = d * m;
            for (int k = 0; k < 2; ++k) {
                const int g = 2 * ib + k;
                if (scales[ib] > 0) {
                    const Choice again = iq1_choose_nearest(t, nx.x + 8 * g, w + 8 * g, s, minus[g]);
                    if (choice_error(again, s) < choice_error(choices[g], s)) choices[g] = again;
                }
                num += static_cast<double>(m * choices[g].sqx);
                den += static_cast<double>(m * m * choices[g].sq2);
            }
        }
        if (num > 0 && den > 0) d = static_cast<float>(num / den);
        const uint16_t d16 = scale_to_f16(d * nx.amax);
        for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>(sc[k] | (((d16 >> (4 * k)) & 0xF) << 12));
        for (int k = 0; k < 4; ++k) {
            b.scales[2 * k] = static_cast<uint8_t>(sc[k]);
            b.scales[2 * k + 1] = static_cast<uint8_t>(sc[k] >> 8);
        }
        for (int ib = 0; ib < kBlocks; ++ib) {
            const int i0 = choices[2 * ib].index, i1 = choices[2 * ib + 1].index;
            b.qs[2 * ib] = static_cast<uint8_t>(i0 & 255);
            b.qs[2 * ib + 1] = static_cast<uint8_t>(i1 & 255);
            b.qh[ib] = static_cast<uint8_t>((i0 >> 8) | ((i1 >> 8) << 4) | (minus[2 * ib] << 3) |
                                            (minus[2 * ib + 1] << 7));
        }
    }
}

}  // namespace strata::quant
