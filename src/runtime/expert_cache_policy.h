// Per-layer expert cache policies as plain data, replayed against a routing trace (`strata bench expert-cache`,
// DESIGN.md section 9): which of a layer's experts sit in its VRAM slots after each token, and so how many of the
// experts a token routes to are hits. No GPU here; the CUDA trunk will ask the same policy objects where an expert is.
//
// Model of a token: the K experts it routes to are looked up first (a hit is an expert resident before the token),
// then the policy may change residents; every expert it brings in is one swap (one expert's bytes over PCIe). A miss
// needs no swap (CPU workers compute it from host RAM), so a policy may decline to admit an expert.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace strata {

enum class ExpertCachePolicyKind {
    Lru,       // every miss is admitted, evicting the least recently routed resident
    LfuDecay,  // Strata's adaptive tier: decayed routing counts, periodic swaps (strata-architecture.md 3.3)
    Belady,    // the oracle: knows the future; the best hit rate any policy can reach (admission optional)
    Static,    // never a swap: the warm set (an expert profile's) is all there is; empty slots stay empty
};

// Strata's adaptive tier (include/strata/core/adaptive_tier.hpp as the reference describes it): each token adds 1 to
// the count of every expert it routes to; every `every` tokens the most-counted non-resident experts fill the empty
// slots (the replay starts empty where Strata starts from a profile), then up to `max_swaps` of them (counted at
// least `min_count`) replace the least-counted residents while they are counted more, then all counts are multiplied
// by `decay`. Strata's defaults: decay 0.7, every 4 windows, 96 swaps over 48 layers (2 a layer), routed >= 2 times.
// The reference does not say whether the decay runs every window or every adaptation; here it is every adaptation.
struct LfuDecayParams {
    double decay = 0.7;
    int64_t every = 4;
    int64_t max_swaps = 2;
    double min_count = 2.0;
};

struct ExpertCachePolicySpec {
    ExpertCachePolicyKind kind = ExpertCachePolicyKind::Lru;
    LfuDecayParams lfu;
};

// "lru", "lfu-decay", "belady", "static"; throws Error listing the known names on anything else.
ExpertCachePolicySpec parse_expert_cache_policy(const std::string& name);
std::string expert_cache_policy_name(ExpertCachePolicyKind kind);

// One layer's routing: token t chose ids[t * k .. t * k + k) (distinct experts in [0, n_expert)).
struct LayerRouting {
    int64_t n_expert = 0;
    int64_t k = 0;
    std::span<const uint16_t> ids;
    int64_t n_tokens() const { return k > 0 ? static_cast<int64_t>(ids.size()) / k : 0; }
};

struct CacheReplayCounts {
    int64_t tokens = 0;
    int64_t lookups = 0;  // tokens * k
    int64_t hits = 0;
    int64_t swaps = 0;  // experts brought into a slot
    double hit_rate() const { return lookups > 0 ? static_cast<double>(hits) / static_cast<double>(lookups) : 0.0; }
    CacheReplayCounts& operator+=(const CacheReplayCounts& o) {
        tokens += o.tokens, lookups += o.lookups, hits += o.hits, swaps += o.swaps;
        return *this;
    }
};

// Replays one layer against `slots` slots, starting empty, or holding `warm` (distinct expert ids, e.g. an expert
// profile's warm_experts; at most `slots` of them are taken, in order, into slots 0..; loading them is not counted as
// swaps). slots may be 0 (nothing is ever a hit) or more than n_expert (then every expert fits: only first uses
// miss).
CacheReplayCounts replay_expert_cache(const ExpertCachePolicySpec& policy, int64_t slots, const LayerRouting& routing,
                                      std::span<const int32_t> warm = {});

}  // namespace strata
