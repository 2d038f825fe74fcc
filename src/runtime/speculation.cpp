#include "runtime/speculation.h"

#include <algorithm>

namespace strata {

namespace {
constexpr double kEma = 0.1;  // weight of a new measurement
}

SpeculationPolicy::SpeculationPolicy(int max_draft) : max_draft_(std::clamp(max_draft, 0, kMaxDraft)) {
    accept_.fill(0.8);  // optimistic enough to try drafting; measurements take over within a few rounds
}

double SpeculationPolicy::cost(int tokens) const {
    tokens = std::clamp(tokens, 1, kMaxDraft + 1);
    if (cost_[static_cast<size_t>(tokens)] > 0) return cost_[static_cast<size_t>(tokens)];
    // Not measured: the nearest smaller measured size plus 15% of a token's cost per extra token (a batched forward
    // reads the weights once: extra tokens cost little while decoding is bound by memory), or 1 when nothing is known.
    for (int w = tokens - 1; w >= 1; --w)
        if (cost_[static_cast<size_t>(w)] > 0) {
            const double unit = cost_[1] > 0 ? cost_[1] : cost_[static_cast<size_t>(w)] / w;
            return cost_[static_cast<size_t>(w)] + 0.15 * (tokens - w) * unit;
        }
    return 1.0 + 0.15 * (tokens - 1);
}

int SpeculationPolicy::choose() {
    int best = 0;
    double best_rate = 1.0 / cost(1), expected = 1.0, chain = 1.0;
    for (int k = 1; k <= max_draft_; ++k) {
        chain *= accept_[static_cast<size_t>(k - 1)];
        expected += chain;
        // A round that rejects a draft (probability 1 - chain) pays a second pass for the accepted prefix.
        const int refeed = std::clamp(static_cast<int>(expected + 0.5), 1, kMaxDraft + 1);
        const double rate = expected / (cost(k + 1) + (1.0 - chain) * cost(refeed));
        if (rate > best_rate) best = k, best_rate = rate;
    }
    // Drafting off: a one-token draft now and then, so that an acceptance that has recovered (the text turned
    // repetitive) is seen again. One 2-token pass in kExplore costs little.
    if (best == 0 && max_draft_ > 0 && ++since_draft_ % kExplore == 0) return 1;
    if (best > 0) since_draft_ = 0;
    return best;
}

void SpeculationPolicy::record_cost(int tokens, double seconds) {
    if (tokens < 1 || tokens > kMaxDraft + 1 || !(seconds > 0)) return;
    double& c = cost_[static_cast<size_t>(tokens)];
    c = c > 0 ? (1 - kEma) * c + kEma * seconds : seconds;
}

void SpeculationPolicy::record_round(int offered, int accepted) {
    offered = std::clamp(offered, 0, max_draft_);
    accepted = std::clamp(accepted, 0, offered);
    // Position i is judged only when every draft before it was accepted (the verification stops at the first
    // rejection), so a_i estimates P(accept i | accepted 1..i-1), the factor E(k) multiplies.
    for (int i = 0; i <= accepted && i < offered; ++i) {
        double& a = accept_[static_cast<size_t>(i)];
        a = (1 - kEma) * a + kEma * (i < accepted ? 1.0 : 0.0);
    }
}

}  // namespace strata
