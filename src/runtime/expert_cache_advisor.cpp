#include "runtime/expert_cache_advisor.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace strata {

namespace {

constexpr int32_t kNone = -1;

// The slots of one layer: which expert each holds (after the swaps given so far) and the empty ones.
struct SlotMap {
    std::vector<int32_t> expert_in;  // slot -> expert or kNone
    std::vector<int32_t> slot_of;    // expert -> slot or kNone
    std::vector<int32_t> free;       // empty slots, taken from the back

    void init(int64_t n_expert, std::span<const int32_t> residents) {
        expert_in.assign(residents.begin(), residents.end());
        slot_of.assign(static_cast<size_t>(n_expert), kNone);
        free.clear();
        for (size_t s = residents.size(); s-- > 0;) {
            const int32_t e = residents[s];
            if (e >= 0 && e < n_expert && slot_of[static_cast<size_t>(e)] == kNone) {
                slot_of[static_cast<size_t>(e)] = static_cast<int32_t>(s);
            } else {
                expert_in[s] = kNone;  // empty, out of range or a duplicate: the slot is free
                free.push_back(static_cast<int32_t>(s));
            }
        }
    }
    // `admit` replaces `evict` (kNone: goes into an empty slot); the swap the trunk applies.
    ExpertSwap place(int32_t admit, int32_t evict) {
        int32_t slot;
        if (evict == kNone) {
            STRATA_ASSERT(!free.empty());
            slot = free.back();
            free.pop_back();
        } else {
            slot = slot_of[static_cast<size_t>(evict)];
            STRATA_ASSERT(slot != kNone);
            slot_of[static_cast<size_t>(evict)] = kNone;
        }
        expert_in[static_cast<size_t>(slot)] = admit;
        slot_of[static_cast<size_t>(admit)] = slot;
        return {.slot = slot, .admit = admit};
    }
    bool resident(int32_t e) const { return slot_of[static_cast<size_t>(e)] != kNone; }
    int64_t size() const { return static_cast<int64_t>(expert_in.size() - free.size()); }
};

// Least recently used: an intrusive list over expert ids, most recent at the head. Every miss is admitted, evicting
// the least recently routed resident, unless that one is routed by the same token (then the miss stays a miss).
struct LruLayer {
    std::vector<int32_t> prev, next;
    std::vector<int64_t> touched;  // token that last routed to it
    int32_t head = kNone, tail = kNone;
    int64_t t = 0;  // tokens seen

    void unlink(int32_t e) {
        if (prev[e] != kNone)
            next[prev[e]] = next[e];
        else
            head = next[e];
        if (next[e] != kNone)
            prev[next[e]] = prev[e];
        else
            tail = prev[e];
        prev[e] = next[e] = kNone;
    }
    void push_front(int32_t e) {
        next[e] = head;
        prev[e] = kNone;
        if (head != kNone)
            prev[head] = e;
        else
            tail = e;
        head = e;
    }
    void init(int64_t n_expert, const SlotMap& slots) {
        prev.assign(static_cast<size_t>(n_expert), kNone);
        next.assign(static_cast<size_t>(n_expert), kNone);
        touched.assign(static_cast<size_t>(n_expert), -1);
        head = tail = kNone;
        t = 0;
        // Slot 0 most recent: pushed last.
        for (size_t s = slots.expert_in.size(); s-- > 0;)
            if (slots.expert_in[s] != kNone) push_front(slots.expert_in[s]);
    }
    void token(const int32_t* ids, int64_t k, SlotMap& slots, std::vector<ExpertSwap>& swaps) {
        const int64_t capacity = static_cast<int64_t>(slots.expert_in.size());
        for (int64_t j = 0; j < k; ++j) {
            const int32_t e = ids[j];
            touched[e] = t;
            if (slots.resident(e)) {
                unlink(e);
                push_front(e);
            }
        }
        for (int64_t j = 0; j < k; ++j) {
            const int32_t e = ids[j];
            if (slots.resident(e) || capacity == 0) continue;
            int32_t victim = kNone;
            if (slots.size() == capacity) {
                if (touched[tail] == t) continue;  // every slot holds an expert this token uses
                victim = tail;
                unlink(victim);
            }
            push_front(e);
            swaps.push_back(slots.place(e, victim));
        }
        ++t;
    }
};

// Strata's adaptive tier (expert_cache_policy.h's LfuDecayParams): counts, and every `every` tokens the most counted
// non-residents fill the empty slots, then up to max_swaps of them replace less counted residents; then the decay.
struct LfuDecayLayer {
    LfuDecayParams p;
    std::vector<double> count;
    std::vector<int32_t> in, out;  // non-resident candidates, residents (scratch of one adaptation)
    int64_t t = 0;

    void init(int64_t n_expert, const LfuDecayParams& params) {
        p = params;
        count.assign(static_cast<size_t>(n_expert), 0.0);
        in.clear();
        out.clear();
        in.reserve(static_cast<size_t>(n_expert));
        out.reserve(static_cast<size_t>(n_expert));
        t = 0;
    }
    void token(const int32_t* ids, int64_t k, SlotMap& slots, std::vector<ExpertSwap>& swaps) {
        for (int64_t j = 0; j < k; ++j) count[ids[j]] += 1.0;
        if (++t % p.every != 0) return;
        in.clear();
        out.clear();
        const auto E = static_cast<int32_t>(count.size());
        for (int32_t e = 0; e < E; ++e) {
            if (slots.resident(e))
                out.push_back(e);
            else if (count[e] > 0.0)
                in.push_back(e);
        }
        // Most counted first in, least counted first out; ties by expert id, so the policy is deterministic.
        std::sort(in.begin(), in.end(),
                  [&](int32_t a, int32_t b) { return count[a] > count[b] || (count[a] == count[b] && a < b); });
        std::sort(out.begin(), out.end(),
                  [&](int32_t a, int32_t b) { return count[a] < count[b] || (count[a] == count[b] && a < b); });
        size_t i = 0;
        // Empty slots take any routed expert, without the swap limit.
        const auto capacity = static_cast<int64_t>(slots.expert_in.size());
        for (; i < in.size() && slots.size() < capacity; ++i) swaps.push_back(slots.place(in[i], kNone));
        for (size_t o = 0, n = 0; i < in.size() && o < out.size() && static_cast<int64_t>(n) < p.max_swaps;
             ++i, ++o, ++n) {
            if (count[in[i]] < p.min_count || count[in[i]] <= count[out[o]]) break;
            swaps.push_back(slots.place(in[i], out[o]));
        }
        for (double& v : count) v *= p.decay;
    }
};

class PolicyAdvisor final : public ExpertCacheAdvisor {
  public:
    PolicyAdvisor(const ExpertCachePolicySpec& policy, std::vector<int64_t> slots)
        : policy_(policy), slots_(std::move(slots)), layers_(slots_.size()) {
        for (const int64_t s : slots_)
            if (s < 0) throw Error("expert cache: a layer's slot count is negative");
    }

    void observe(int64_t layer, int64_t n_expert, int64_t k, std::span<const int32_t> ids,
                 std::span<const int32_t> residents, std::vector<ExpertSwap>& swaps) override {
        STRATA_ASSERT(layer >= 0 && layer < static_cast<int64_t>(layers_.size()));
        STRATA_ASSERT(n_expert > 0 && k > 0 && static_cast<int64_t>(ids.size()) % k == 0);
        Layer& l = layers_[static_cast<size_t>(layer)];
        STRATA_ASSERT(static_cast<int64_t>(residents.size()) == slots_[static_cast<size_t>(layer)]);
        if (!l.ready || l.n_expert != n_expert) {
            l.n_expert = n_expert;
            l.slots.init(n_expert, residents);
            if (policy_.kind == ExpertCachePolicyKind::Lru)
                l.lru.init(n_expert, l.slots);
            else
                l.lfu.init(n_expert, policy_.lfu);
            l.ready = true;
        }
        if (policy_.kind == ExpertCachePolicyKind::Static) return;  // the warm set stays as it is
        for (size_t r = 0; r < ids.size(); r += static_cast<size_t>(k)) {
            for (int64_t j = 0; j < k; ++j)
                STRATA_ASSERT(ids[r + static_cast<size_t>(j)] >= 0 && ids[r + static_cast<size_t>(j)] < n_expert);
            if (policy_.kind == ExpertCachePolicyKind::Lru)
                l.lru.token(ids.data() + r, k, l.slots, swaps);
            else
                l.lfu.token(ids.data() + r, k, l.slots, swaps);
        }
    }

  private:
    struct Layer {
        bool ready = false;
        int64_t n_expert = 0;
        SlotMap slots;
        LruLayer lru;
        LfuDecayLayer lfu;
    };
    ExpertCachePolicySpec policy_;
    std::vector<int64_t> slots_;
    std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<ExpertCacheAdvisor> make_expert_cache_advisor(const ExpertCachePolicySpec& policy,
                                                              std::vector<int64_t> slots_per_layer) {
    if (policy.kind == ExpertCachePolicyKind::Belady)
        throw Error(
            "expert cache policy 'belady' needs the future routing: it is for trace replays only (use lru "
            "or lfu-decay while decoding)");
    return std::make_unique<PolicyAdvisor>(policy, std::move(slots_per_layer));
}

}  // namespace strata
