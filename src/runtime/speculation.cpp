#include "runtime/speculation.h"

#include <algorithm>

namespace strata {

namespace {
constexpr double kEma = 0.1;  // weight of a new measurement
}

const char* drafter_name(Drafter d) {
    return d == Drafter::Mtp ? "mtp" : "lookup";
}

SpeculationPolicy::SpeculationPolicy(int max_draft, bool has_mtp)
    : max_draft_(std::clamp(max_draft, 0, kMaxDraft)), has_mtp_(has_mtp) {
    // Optimistic enough to try drafting; measurements take over within a few rounds. The MTP layer starts at its
    // published depth-1 acceptance (docs/bundled-model.md: 0.698), lower further out.
    accept_[static_cast<size_t>(Drafter::PromptLookup)].fill(0.8);
    auto& mtp = accept_[static_cast<size_t>(Drafter::Mtp)];
    for (size_t i = 0; i < mtp.size(); ++i) mtp[i] = i == 0 ? 0.7 : 0.6;
}

double SpeculationPolicy::cost(int tokens) const {
    tokens = std::clamp(tokens, 1, kMaxDraft + 1);
    if (cost_[static_cast<size_t>(tokens)] > 0) return cost_[static_cast<size_t>(tokens)];
    // Not measured: from the nearest smaller measured size, each extra token at the slope between the two largest
    // measured sizes below (a CPU window is compute-bound: each token adds about half a token's cost on the bundled
    // model), or at 15% of a token while only one size is known (a batched forward reads the weights once: extra
    // tokens cost little while decoding is bound by memory); 1 when nothing is known.
    int w1 = 0, w0 = 0;
    for (int w = tokens - 1; w >= 1 && w0 == 0; --w)
        if (cost_[static_cast<size_t>(w)] > 0) (w1 == 0 ? w1 : w0) = w;
    if (w1 == 0) return 1.0 + 0.15 * (tokens - 1);
    const double c1 = cost_[static_cast<size_t>(w1)];
    const double slope = w0 > 0 ? std::max(0.0, (c1 - cost_[static_cast<size_t>(w0)]) / (w1 - w0))
                                : 0.15 * (cost_[1] > 0 ? cost_[1] : c1 / w1);
    return c1 + slope * (tokens - w1);
}

double SpeculationPolicy::draft_pass_cost() const {
    // Unmeasured: one layer and the head of a trunk of several layers, guessed at a quarter of a token's pass.
    return draft_pass_ > 0 ? draft_pass_ : 0.25 * cost(1);
}

double SpeculationPolicy::rate(Drafter d, int k) const {
    if (k <= 0) return 1.0 / cost(1);
    const auto& a = accept_[static_cast<size_t>(d)];
    double expected = 1.0, chain = 1.0;
    for (int i = 0; i < k; ++i) {
        chain *= a[static_cast<size_t>(i)];
        expected += chain;
    }
    // A round that rejects a draft (probability 1 - chain) pays a second pass for the accepted prefix.
    const int refeed = std::clamp(static_cast<int>(expected + 0.5), 1, kMaxDraft + 1);
    const double drafting = d == Drafter::Mtp ? k * draft_pass_cost() : 0.0;
    return expected / (drafting + cost(k + 1) + (1.0 - chain) * cost(refeed));
}

DraftPlan SpeculationPolicy::plan(int lookup_available) {
    DraftPlan best{};
    double best_rate = rate(Drafter::PromptLookup, 0);
    const int lookup_max = std::min(lookup_available, max_draft_);
    for (int k = 1; k <= lookup_max; ++k)
        if (const double r = rate(Drafter::PromptLookup, k); r > best_rate) best = {Drafter::PromptLookup, k}, best_rate = r;
    if (has_mtp_)
        for (int k = 1; k <= max_draft_; ++k)
            if (const double r = rate(Drafter::Mtp, k); r > best_rate) best = {Drafter::Mtp, k}, best_rate = r;
    if (best.k > 0) {
        since_draft_ = 0;
        return best;
    }
    // Drafting off: a one-token draft now and then, so that an acceptance that has recovered (the text turned
    // repetitive, the MTP layer got on with it) is seen again. One 2-token pass in kExplore costs little.
    if (max_draft_ > 0 && ++since_draft_ % kExplore == 0) {
        const bool try_mtp = has_mtp_ && (lookup_max == 0 || ++explored_ % 2 == 0);
        if (try_mtp) return {Drafter::Mtp, 1};
        if (lookup_max > 0) return {Drafter::PromptLookup, 1};
    }
    return best;
}

void SpeculationPolicy::record_cost(int tokens, double seconds) {
    if (tokens < 1 || tokens > kMaxDraft + 1 || !(seconds > 0)) return;
    double& c = cost_[static_cast<size_t>(tokens)];
    c = c > 0 ? (1 - kEma) * c + kEma * seconds : seconds;
}

void SpeculationPolicy::record_draft_cost(int passes, double seconds) {
    if (passes < 1 || !(seconds > 0)) return;
    const double per = seconds / passes;
    draft_pass_ = draft_pass_ > 0 ? (1 - kEma) * draft_pass_ + kEma * per : per;
}

void SpeculationPolicy::record_round(Drafter drafter, int offered, int accepted) {
    offered = std::clamp(offered, 0, max_draft_);
    accepted = std::clamp(accepted, 0, offered);
    auto& acc = accept_[static_cast<size_t>(drafter)];
    // Position i is judged only when every draft before it was accepted (the verification stops at the first
    // rejection), so a_i estimates P(accept i | accepted 1..i-1), the factor E(k) multiplies.
    for (int i = 0; i <= accepted && i < offered; ++i) {
        double& a = acc[static_cast<size_t>(i)];
        a = (1 - kEma) * a + kEma * (i < accepted ? 1.0 : 0.0);
    }
}

}  // namespace strata
