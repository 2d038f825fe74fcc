#include "runtime/expert_cache_policy.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <set>
#include <utility>

#include "core/error.h"
#include "runtime/expert_cache_advisor.h"

namespace strata {

namespace {

// "lfu-decay:0.9:1:4:1" -> decay 0.9, every 1, 4 swaps, admitted from a count of 1; fields optional from the right.
LfuDecayParams parse_lfu_params(const std::string& name, const std::string& rest) {
    LfuDecayParams p;
    std::vector<std::string> fields;
    size_t start = 0;
    while (start <= rest.size()) {
        const size_t colon = rest.find(':', start);
        fields.push_back(rest.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
        if (colon == std::string::npos) break;
        start = colon + 1;
    }
    auto bad = [&] {
        return Error(
            "expert cache policy '" + name +
            "': expected lfu-decay[:DECAY[:EVERY[:SWAPS[:MIN]]]] with 0 <= DECAY <= 1, EVERY >= 1, SWAPS >= 1, "
            "MIN >= 0");
    };
    if (fields.size() > 4) throw bad();
    try {
        size_t used = 0;
        if (fields.size() > 0) {
            p.decay = std::stod(fields[0], &used);
            if (used != fields[0].size() || !(p.decay >= 0.0 && p.decay <= 1.0)) throw bad();
        }
        if (fields.size() > 1) {
            p.every = std::stoll(fields[1], &used);
            if (used != fields[1].size() || p.every < 1) throw bad();
        }
        if (fields.size() > 2) {
            p.max_swaps = std::stoll(fields[2], &used);
            if (used != fields[2].size() || p.max_swaps < 1) throw bad();
        }
        if (fields.size() > 3) {
            p.min_count = std::stod(fields[3], &used);
            if (used != fields[3].size() || !(p.min_count >= 0.0)) throw bad();
        }
    } catch (const std::logic_error&) {  // stod / stoll: not a number, out of range
        throw bad();
    }
    return p;
}

// LRU and lfu-decay: the online advisor (expert_cache_advisor.h) driven one token at a time, its swaps applied at once
// (as if every copy landed before the next token), hits counted against the slots as they stand before each token.
CacheReplayCounts replay_online(const ExpertCachePolicySpec& policy, int64_t slots, const LayerRouting& r,
                                std::span<const int32_t> warm) {
    const int64_t E = r.n_expert, K = r.k, T = r.n_tokens();
    const std::unique_ptr<ExpertCacheAdvisor> advisor = make_expert_cache_advisor(policy, {slots});
    std::vector<int32_t> residents(static_cast<size_t>(slots), -1), ids(static_cast<size_t>(K));
    std::vector<char> resident(static_cast<size_t>(E), 0);
    for (size_t i = 0; i < warm.size() && static_cast<int64_t>(i) < slots; ++i) {
        residents[i] = warm[i];
        resident[static_cast<size_t>(warm[i])] = 1;
    }
    std::vector<ExpertSwap> swaps;
    CacheReplayCounts c{.tokens = T, .lookups = T * K};
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < K; ++j) {
            ids[static_cast<size_t>(j)] = r.ids[static_cast<size_t>(t * K + j)];
            c.hits += resident[static_cast<size_t>(ids[static_cast<size_t>(j)])];
        }
        swaps.clear();
        advisor->observe(0, E, K, ids, residents, swaps);
        for (const ExpertSwap& s : swaps) {
            int32_t& slot = residents[static_cast<size_t>(s.slot)];
            if (slot >= 0) resident[static_cast<size_t>(slot)] = 0;
            slot = s.admit;
            resident[static_cast<size_t>(s.admit)] = 1;
        }
        c.swaps += static_cast<int64_t>(swaps.size());
    }
    return c;
}

// Belady with bypass: after each token the cache keeps, of its residents and the token's experts, the `slots` whose
// next use comes soonest (an expert never used again is never admitted). Admission being optional, this is the
// largest number of hits any policy can get.
CacheReplayCounts replay_belady(int64_t slots, const LayerRouting& r, std::span<const int32_t> warm) {
    const int64_t E = r.n_expert, K = r.k, T = r.n_tokens();
    constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    std::vector<int64_t> next_use(static_cast<size_t>(T * K));
    std::vector<int64_t> seen(static_cast<size_t>(E), kNever);
    for (int64_t t = T - 1; t >= 0; --t) {
        const uint16_t* ids = r.ids.data() + t * K;
        for (int64_t j = 0; j < K; ++j) next_use[static_cast<size_t>(t * K + j)] = seen[ids[j]];
        for (int64_t j = 0; j < K; ++j) seen[ids[j]] = t;
    }
    std::vector<int64_t> key(static_cast<size_t>(E), kNever);  // a resident's next use
    std::vector<char> resident(static_cast<size_t>(E), 0);
    std::set<std::pair<int64_t, int32_t>> by_next;  // residents by next use; the last is evicted first
    for (size_t i = 0; i < warm.size() && static_cast<int64_t>(i) < slots; ++i) {
        const int32_t e = warm[i];
        key[static_cast<size_t>(e)] = seen[static_cast<size_t>(e)];  // its first use (seen holds it after the scan)
        resident[static_cast<size_t>(e)] = 1;
        by_next.insert({key[static_cast<size_t>(e)], e});
    }
    CacheReplayCounts c{.tokens = T, .lookups = T * K};
    for (int64_t t = 0; t < T; ++t) {
        const uint16_t* ids = r.ids.data() + t * K;
        for (int64_t j = 0; j < K; ++j) {
            const int32_t e = ids[j];
            if (!resident[e]) continue;
            ++c.hits;
            by_next.erase({key[e], e});
            key[e] = next_use[static_cast<size_t>(t * K + j)];
            by_next.insert({key[e], e});
        }
        for (int64_t j = 0; j < K; ++j) {
            const int32_t e = ids[j];
            const int64_t nu = next_use[static_cast<size_t>(t * K + j)];
            if (resident[e] || slots == 0 || nu == kNever) continue;
            if (static_cast<int64_t>(by_next.size()) == slots) {
                auto last = std::prev(by_next.end());
                if (last->first <= nu) continue;  // every resident is needed sooner: bypass
                resident[last->second] = 0;
                by_next.erase(last);
            }
            key[e] = nu;
            resident[e] = 1;
            by_next.insert({nu, e});
            ++c.swaps;
        }
    }
    return c;
}

}  // namespace

ExpertCachePolicySpec parse_expert_cache_policy(const std::string& name) {
    if (name == "lru") return {.kind = ExpertCachePolicyKind::Lru};
    if (name == "belady") return {.kind = ExpertCachePolicyKind::Belady};
    if (name == "static") return {.kind = ExpertCachePolicyKind::Static};
    if (name == "lfu-decay") return {.kind = ExpertCachePolicyKind::LfuDecay};
    if (name.rfind("lfu-decay:", 0) == 0)
        return {.kind = ExpertCachePolicyKind::LfuDecay, .lfu = parse_lfu_params(name, name.substr(10))};
    throw Error("unknown expert cache policy '" + name +
                "' (known: lru, lfu-decay[:DECAY[:EVERY[:SWAPS[:MIN]]]], belady, static)");
}

std::string expert_cache_policy_name(ExpertCachePolicyKind kind) {
    switch (kind) {
        case ExpertCachePolicyKind::Lru:
            return "lru";
        case ExpertCachePolicyKind::LfuDecay:
            return "lfu-decay";
        case ExpertCachePolicyKind::Belady:
            return "belady";
        case ExpertCachePolicyKind::Static:
            return "static";
    }
    return "?";
}

CacheReplayCounts replay_expert_cache(const ExpertCachePolicySpec& policy, int64_t slots, const LayerRouting& r,
                                      std::span<const int32_t> warm) {
    STRATA_ASSERT(slots >= 0 && r.k > 0 && r.n_expert > 0 && r.n_expert <= 65536);
    STRATA_ASSERT(static_cast<int64_t>(r.ids.size()) % r.k == 0);
    slots = std::min(slots, r.n_expert);
    std::vector<char> seen(static_cast<size_t>(r.n_expert), 0);
    for (const int32_t e : warm) {
        STRATA_ASSERT(e >= 0 && e < r.n_expert && !seen[static_cast<size_t>(e)]);
        seen[static_cast<size_t>(e)] = 1;
    }
    switch (policy.kind) {
        case ExpertCachePolicyKind::Lru:
        case ExpertCachePolicyKind::LfuDecay:
        case ExpertCachePolicyKind::Static:
            return replay_online(policy, slots, r, warm);
        case ExpertCachePolicyKind::Belady:
            return replay_belady(slots, r, warm);
    }
    return {};
}

}  // namespace strata
