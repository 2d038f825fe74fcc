// PLE hash constants, recomputed the way transformers' Qwen4ExpTextNGramEmbedding builds its buffers (used when a
// checkpoint does not carry `layer_multipliers` / `ngram_heads_offsets` / `ngram_heads_vocab_sizes`).
#include <algorithm>
#include <cmath>

#include "convert/gguf_plan.h"
#include "core/error.h"

namespace strata {

namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kMix2 = 0x94D049BB133111EBull;
constexpr uint64_t kLayerPrime = 10007;

uint64_t splitmix64(uint64_t v) {
    v += kGamma;
    v = (v ^ (v >> 30)) * kMix1;
    v = (v ^ (v >> 27)) * kMix2;
    return v ^ (v >> 31);
}

bool is_prime(uint64_t v) {
    if (v < 2) return false;
    if (v % 2 == 0) return v == 2;
    for (uint64_t d = 3; d * d <= v; d += 2)
        if (v % d == 0) return false;
    return true;
}

}  // namespace

PleHash compute_ple_hash(const HfConfig& c, int64_t ple_layer_index) {
    const int64_t n_heads = (c.ngram_size - 1) * c.heads_per_ngram;
    if (n_heads <= 0 || c.ngram_vocab_size_base < 1)
        throw Error("PLE config: ngram_size, heads_per_ngram and ngram_vocab_size_base must be positive");
    PleHash h;
    // Head g of PLE layer i takes the (i * n_heads + g + 1)-th prime at or above ngram_vocab_size_base. Primes are
    // found once, in order, instead of restarting the search for every head.
    const int64_t first_global = ple_layer_index * n_heads;
    uint64_t p = static_cast<uint64_t>(c.ngram_vocab_size_base - 1);
    uint64_t total = 0;
    for (int64_t k = 0; k < first_global + n_heads; ++k) {
        do {
            ++p;
        } while (!is_prime(p));
        if (k >= first_global) {
            h.head_vocab_sizes.push_back(p);
            h.head_offsets.push_back(total);
            total += p;
        }
    }
    const uint64_t div = static_cast<uint64_t>(c.make_ngram_vocab_size_divisible_by);
    h.padded_rows = (total + div - 1) / div * div;

    // Odd multipliers below (2^63 - 1) / vocab so that token * multiplier stays within int64.
    const uint64_t max_long = (uint64_t{1} << 63) - 1;
    const uint64_t multiplier_max = max_long / static_cast<uint64_t>(std::max<int64_t>(c.vocab_size, 1));
    const uint64_t half_bound = std::max<uint64_t>(1, multiplier_max / 2);
    const uint64_t base_seed = static_cast<uint64_t>(c.seed) + kLayerPrime * static_cast<uint64_t>(ple_layer_index);
    for (int64_t i = 0; i < c.ngram_size; ++i) {
        const uint64_t value = base_seed + kGamma * static_cast<uint64_t>(i + 1);
        h.multipliers.push_back(2 * (splitmix64(value) % half_bound) + 1);
    }
    return h;
}

}  // namespace strata
