// The online expert cache policies (src/runtime/expert_cache_advisor.h) and the replay that now drives them. Oracles:
// the replay functions as they were before the advisor existed (commit c1e0231, copied below verbatim), whose counts
// the replay must keep on every trace; hand-worked swaps for a warm start; and the validity of every swap the advisor
// gives (a free or evicted slot, never an expert already held).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/error.h"
#include "runtime/expert_cache_advisor.h"
#include "runtime/expert_cache_policy.h"

namespace strata {
namespace {

namespace before {
using strata::CacheReplayCounts;
using strata::LayerRouting;
using strata::LfuDecayParams;
// Least recently used: an intrusive list over expert ids, most recent at the head.
CacheReplayCounts replay_lru(int64_t slots, const LayerRouting& r) {
    const int64_t E = r.n_expert, K = r.k, T = r.n_tokens();
    constexpr int32_t kNone = -1;
    std::vector<int32_t> prev(static_cast<size_t>(E), kNone), next(static_cast<size_t>(E), kNone);
    std::vector<int64_t> touched(static_cast<size_t>(E), -1);  // token that last routed to it
    std::vector<char> resident(static_cast<size_t>(E), 0);
    int32_t head = kNone, tail = kNone;
    int64_t size = 0;
    auto unlink = [&](int32_t e) {
        if (prev[e] != kNone)
            next[prev[e]] = next[e];
        else
            head = next[e];
        if (next[e] != kNone)
            prev[next[e]] = prev[e];
        else
            tail = prev[e];
        prev[e] = next[e] = kNone;
    };
    auto push_front = [&](int32_t e) {
        next[e] = head;
        prev[e] = kNone;
        if (head != kNone)
            prev[head] = e;
        else
            tail = e;
        head = e;
    };
    CacheReplayCounts c{.tokens = T, .lookups = T * K};
    for (int64_t t = 0; t < T; ++t) {
        const uint16_t* ids = r.ids.data() + t * K;
        for (int64_t j = 0; j < K; ++j) {
            const int32_t e = ids[j];
            touched[e] = t;
            if (resident[e]) {
                ++c.hits;
                unlink(e);
                push_front(e);
            }
        }
        for (int64_t j = 0; j < K; ++j) {
            const int32_t e = ids[j];
            if (resident[e] || slots == 0) continue;
            if (size == slots) {
                if (touched[tail] == t) continue;  // every slot holds an expert this token uses
                const int32_t victim = tail;
                unlink(victim);
                resident[victim] = 0;
                --size;
            }
            push_front(e);
            resident[e] = 1;
            ++size;
            ++c.swaps;
        }
    }
    return c;
}

CacheReplayCounts replay_lfu_decay(int64_t slots, const LayerRouting& r, const LfuDecayParams& p) {
    const int64_t E = r.n_expert, K = r.k, T = r.n_tokens();
    std::vector<double> count(static_cast<size_t>(E), 0.0);
    std::vector<char> resident(static_cast<size_t>(E), 0);
    std::vector<int32_t> in, out;  // non-resident candidates, residents
    int64_t size = 0;
    CacheReplayCounts c{.tokens = T, .lookups = T * K};
    for (int64_t t = 0; t < T; ++t) {
        const uint16_t* ids = r.ids.data() + t * K;
        for (int64_t j = 0; j < K; ++j) {
            c.hits += resident[ids[j]];
            count[ids[j]] += 1.0;
        }
        if ((t + 1) % p.every != 0) continue;
        in.clear();
        out.clear();
        for (int32_t e = 0; e < E; ++e) {
            if (resident[e])
                out.push_back(e);
            else if (count[e] > 0.0)
                in.push_back(e);
        }
        // Most counted first in, least counted first out; ties by expert id, so the replay is deterministic.
        std::sort(in.begin(), in.end(),
                  [&](int32_t a, int32_t b) { return count[a] > count[b] || (count[a] == count[b] && a < b); });
        std::sort(out.begin(), out.end(),
                  [&](int32_t a, int32_t b) { return count[a] < count[b] || (count[a] == count[b] && a < b); });
        size_t i = 0;
        // Empty slots take any routed expert, without the swap limit: Strata fills its slots from a profile before
        // decoding, which a replay from an empty cache stands in for.
        for (; i < in.size() && size < slots; ++i, ++size, ++c.swaps) resident[in[i]] = 1;
        for (size_t o = 0, n = 0; i < in.size() && o < out.size() && static_cast<int64_t>(n) < p.max_swaps;
             ++i, ++o, ++n) {
            if (count[in[i]] < p.min_count || count[in[i]] <= count[out[o]]) break;
            resident[out[o]] = 0;
            resident[in[i]] = 1;
            ++c.swaps;
        }
        for (double& v : count) v *= p.decay;
    }
    return c;
}

}  // namespace before

// Random traces: uniform, skewed toward low ids, and bursty (a token repeats its predecessor's experts).
std::vector<uint16_t> trace(std::mt19937& rng, int64_t n_expert, int64_t k, int64_t tokens, int kind) {
    std::vector<uint16_t> ids;
    std::vector<uint16_t> all(static_cast<size_t>(n_expert));
    for (int64_t e = 0; e < n_expert; ++e) all[static_cast<size_t>(e)] = static_cast<uint16_t>(e);
    for (int64_t t = 0; t < tokens; ++t) {
        if (kind == 2 && t > 0 && rng() % 2 == 0) {
            for (int64_t j = 0; j < k; ++j) ids.push_back(ids[static_cast<size_t>((t - 1) * k + j)]);
            continue;
        }
        std::shuffle(all.begin(), all.end(), rng);
        if (kind == 1)
            std::stable_sort(all.begin(), all.end(), [&](uint16_t a, uint16_t b) {
                return (a < n_expert / 8) > (b < n_expert / 8) && rng() % 4 != 0;
            });
        ids.insert(ids.end(), all.begin(), all.begin() + k);
    }
    return ids;
}

TEST(ExpertCacheAdvisor, ReplayCountsAreThoseOfTheReplayBeforeTheAdvisor) {
    std::mt19937 rng(2025);
    const char* lfu_specs[] = {"lfu-decay", "lfu-decay:0.9:1:4:1", "lfu-decay:1:2:1", "lfu-decay:0.5:3:2:0"};
    int64_t compared = 0;
    for (int trial = 0; trial < 40; ++trial) {
        const int64_t n_expert = 8 + 8 * (trial % 8), k = 1 + trial % 4, tokens = 300;
        const std::vector<uint16_t> ids = trace(rng, n_expert, k, tokens, trial % 3);
        const LayerRouting r{.n_expert = n_expert, .k = k, .ids = ids};
        for (const int64_t slots : {int64_t{0}, int64_t{1}, k, n_expert / 4, n_expert / 2, n_expert, n_expert + 3}) {
            SCOPED_TRACE("trial " + std::to_string(trial) + " slots " + std::to_string(slots));
            const CacheReplayCounts lru = replay_expert_cache(parse_expert_cache_policy("lru"), slots, r);
            const CacheReplayCounts lru_before = before::replay_lru(std::min(slots, n_expert), r);
            EXPECT_EQ(lru.hits, lru_before.hits);
            EXPECT_EQ(lru.swaps, lru_before.swaps);
            for (const char* spec : lfu_specs) {
                const ExpertCachePolicySpec p = parse_expert_cache_policy(spec);
                const CacheReplayCounts got = replay_expert_cache(p, slots, r);
                const CacheReplayCounts want = before::replay_lfu_decay(std::min(slots, n_expert), r, p.lfu);
                EXPECT_EQ(got.hits, want.hits) << spec;
                EXPECT_EQ(got.swaps, want.swaps) << spec;
                ++compared;
            }
        }
    }
    EXPECT_EQ(compared, 40 * 7 * 4);
}

// Windows of several tokens, several layers: every swap names a slot that is free or holds an expert the policy
// evicts, never admits an expert already held, and the slots then hold what a one-token-at-a-time replay holds.
TEST(ExpertCacheAdvisor, WindowsGiveValidSwapsAndTheReplaysResidents) {
    std::mt19937 rng(7);
    for (const char* spec : {"lru", "lfu-decay:0.8:1:3:1"}) {
        SCOPED_TRACE(spec);
        const int64_t n_expert = 32, k = 4, layers = 3;
        const std::vector<int64_t> slots = {8, 0, 12};
        auto windowed = make_expert_cache_advisor(parse_expert_cache_policy(spec), slots);
        auto single = make_expert_cache_advisor(parse_expert_cache_policy(spec), slots);
        std::vector<std::vector<int32_t>> res_w(layers), res_s(layers);
        for (int64_t l = 0; l < layers; ++l) {
            res_w[static_cast<size_t>(l)].assign(static_cast<size_t>(slots[static_cast<size_t>(l)]), -1);
            res_s[static_cast<size_t>(l)] = res_w[static_cast<size_t>(l)];
        }
        auto apply = [&](std::vector<int32_t>& res, const std::vector<ExpertSwap>& swaps) {
            for (const ExpertSwap& s : swaps) {
                ASSERT_GE(s.slot, 0);
                ASSERT_LT(s.slot, static_cast<int64_t>(res.size()));
                ASSERT_TRUE(std::find(res.begin(), res.end(), s.admit) == res.end()) << "admits a held expert";
                res[static_cast<size_t>(s.slot)] = s.admit;
            }
        };
        for (int window = 0; window < 200; ++window) {
            const int64_t T = 1 + window % 8;
            for (int64_t l = 0; l < layers; ++l) {
                const auto li = static_cast<size_t>(l);
                const std::vector<uint16_t> ids16 = trace(rng, n_expert, k, T, 1);
                const std::vector<int32_t> ids(ids16.begin(), ids16.end());
                std::vector<ExpertSwap> swaps;
                windowed->observe(l, n_expert, k, ids, res_w[li], swaps);
                apply(res_w[li], swaps);
                for (int64_t t = 0; t < T; ++t) {
                    std::vector<ExpertSwap> one;
                    single->observe(l, n_expert, k,
                                    std::span<const int32_t>(ids).subspan(static_cast<size_t>(t * k), k), res_s[li],
                                    one);
                    apply(res_s[li], one);
                }
                std::vector<int32_t> a = res_w[li], b = res_s[li];
                std::sort(a.begin(), a.end());
                std::sort(b.begin(), b.end());
                ASSERT_EQ(a, b) << "layer " << l << " window " << window;
            }
        }
    }
}

TEST(ExpertCacheAdvisor, WarmStartFromTheResidentsGiven) {
    // LRU, 3 slots warmed with 7, 4, 9 (slot 0 most recent). A token routing {1} evicts the least recent, 9 in slot 2.
    auto lru = make_expert_cache_advisor(parse_expert_cache_policy("lru"), {3});
    std::vector<int32_t> residents = {7, 4, 9};
    std::vector<ExpertSwap> swaps;
    lru->observe(0, 16, 1, std::vector<int32_t>{1}, residents, swaps);
    ASSERT_EQ(swaps.size(), 1u);
    EXPECT_EQ(swaps[0].slot, 2);
    EXPECT_EQ(swaps[0].admit, 1);
    // A hit on 4 makes it most recent: the next miss (2) evicts 7, in slot 0.
    residents[2] = 1;
    swaps.clear();
    lru->observe(0, 16, 1, std::vector<int32_t>{4}, residents, swaps);
    EXPECT_TRUE(swaps.empty());
    lru->observe(0, 16, 1, std::vector<int32_t>{2}, residents, swaps);
    ASSERT_EQ(swaps.size(), 1u);
    EXPECT_EQ(swaps[0].slot, 0);
    EXPECT_EQ(swaps[0].admit, 2);

    // lfu-decay every token, one swap, from a count of 1: a warm slot holding an unrouted expert (count 0) gives way
    // to the first routed expert; an empty slot is filled first.
    auto lfu = make_expert_cache_advisor(parse_expert_cache_policy("lfu-decay:1:1:1:1"), {2});
    residents = {5, -1};
    swaps.clear();
    lfu->observe(0, 8, 1, std::vector<int32_t>{3}, residents, swaps);
    ASSERT_EQ(swaps.size(), 1u);
    EXPECT_EQ(swaps[0].slot, 1);
    EXPECT_EQ(swaps[0].admit, 3);
    residents[1] = 3;
    swaps.clear();
    lfu->observe(0, 8, 1, std::vector<int32_t>{6}, residents, swaps);
    ASSERT_EQ(swaps.size(), 1u);
    EXPECT_EQ(swaps[0].slot, 0);  // 5 (count 0) out, 6 (count 1) in
    EXPECT_EQ(swaps[0].admit, 6);
}

TEST(ExpertCacheAdvisor, BeladyIsReplayOnly) {
    try {
        make_expert_cache_advisor(parse_expert_cache_policy("belady"), {4});
        FAIL() << "belady made an online advisor";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("replay"), std::string::npos) << e.what();
    }
}

// Replays from a warm set (an expert profile's): the slots hold it before the first token, and loading it is no swap.
TEST(ExpertCacheAdvisor, WarmReplaysByHand) {
    auto replay = [](const char* policy, int64_t slots, int64_t n_expert, int64_t k, const std::vector<uint16_t>& ids,
                     const std::vector<int32_t>& warm) {
        return replay_expert_cache(parse_expert_cache_policy(policy), slots, {.n_expert = n_expert, .k = k, .ids = ids},
                                   warm);
    };
    // 2 slots warm with {0, 1}; 0 1 0 1: every lookup hits, nothing is swapped (cold: 2 misses, 2 swaps).
    for (const char* p : {"lru", "lfu-decay:1:1:1:1", "belady", "static"}) {
        SCOPED_TRACE(p);
        const CacheReplayCounts c = replay(p, 2, 4, 1, {0, 1, 0, 1}, {0, 1});
        EXPECT_EQ(c.hits, 4);
        EXPECT_EQ(c.swaps, 0);
    }
    EXPECT_EQ(replay("lru", 2, 4, 1, {0, 1, 0, 1}, {}).hits, 2);
    // static never swaps: warm {0}, 0 1 0 1 0: the 0s hit (3), the 1s miss; cold static hits nothing.
    EXPECT_EQ(replay("static", 2, 4, 1, {0, 1, 0, 1, 0}, {0}).hits, 3);
    EXPECT_EQ(replay("static", 2, 4, 1, {0, 1, 0, 1, 0}, {0}).swaps, 0);
    EXPECT_EQ(replay("static", 2, 4, 1, {0, 1, 0, 1, 0}, {}).hits, 0);
    // Only the first `slots` of the warm set are taken: 1 slot, warm {3, 0}: 0 0 -> LRU admits 0 over 3 (1 hit).
    const CacheReplayCounts lru = replay("lru", 1, 4, 1, {0, 0}, {3, 0});
    EXPECT_EQ(lru.hits, 1);
    EXPECT_EQ(lru.swaps, 1);
    // Belady evicts a warm expert that is never used (its next use: never) for one that is: 1 slot, warm {3}, 0 0.
    const CacheReplayCounts belady = replay("belady", 1, 4, 1, {0, 0}, {3});
    EXPECT_EQ(belady.hits, 1);
    EXPECT_EQ(belady.swaps, 1);
    // ... and keeps a warm expert needed sooner than the newcomer: warm {3}, 0 3 0 -> 0 bypassed, 3 hits, then 0
    // misses again (2 slots would hold both).
    const CacheReplayCounts keep = replay("belady", 1, 4, 1, {0, 3, 0}, {3});
    EXPECT_EQ(keep.hits, 1);
    EXPECT_EQ(keep.swaps, 0);
}

TEST(ExpertCacheAdvisor, StaticAdvisorNeverSwaps) {
    auto advisor = make_expert_cache_advisor(parse_expert_cache_policy("static"), {2});
    std::vector<ExpertSwap> swaps;
    advisor->observe(0, 8, 2, std::vector<int32_t>{1, 2, 3, 4}, std::vector<int32_t>{5, -1}, swaps);
    EXPECT_TRUE(swaps.empty());
}

}  // namespace
}  // namespace strata
