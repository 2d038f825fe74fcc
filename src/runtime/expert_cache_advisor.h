// The online expert cache policies: ExpertCacheAdvisor (model/moe.h) for `lru`, `lfu-decay` and `static` (the warm
// set, never a swap), with the exact semantics of runtime/expert_cache_policy.h's replay (which drives these same
// objects token by token, so the replay measures what the trunk runs). Belady needs the future and stays replay-only.
//
// Per layer the advisor keeps the policy's state and its own map of which expert each slot holds once every swap it
// gave has landed. A layer's first observe() takes that map from `residents` (the warm set the trunk loaded, e.g. from
// an expert profile: slot order is taken as most recent first for LRU); later calls trust that every swap given is
// applied, in order (a swap is never withdrawn), and read `residents` only for its size. Each routed token of the
// window is one step of the policy, in row order; the swaps of all of them come back together. Nothing is allocated
// per call once `swaps` has room.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/moe.h"
#include "runtime/expert_cache_policy.h"

namespace strata {

// One advisor for every layer: slots_per_layer[l] VRAM slots at layer l (0: the layer caches nothing). Error for
// belady (a replay-only policy).
std::unique_ptr<ExpertCacheAdvisor> make_expert_cache_advisor(const ExpertCachePolicySpec& policy,
                                                              std::vector<int64_t> slots_per_layer);

}  // namespace strata
