#include "runtime/speculation.h"

#include <algorithm>

namespace strata {

namespace {
constexpr double kEma = 0.1;  // weight of a new measurement
}

double expected_round_tokens(std::span<const double> acceptance, int k, double* all_accepted) {
    double expected = 1.0, chain = 1.0;
    for (int i = 0; i < k && i < std::ssize(acceptance); ++i) {
        chain *= acceptance[static_cast<size_t>(i)];
        expected += chain;
    }
    if (all_accepted) *all_accepted = chain;
    return expected;
}

int refeed_window(double expected_tokens) {
    return std::clamp(static_cast<int>(expected_tokens + 0.5), 1, SpeculationPolicy::kMaxDraft + 1);
}

std::vector<WindowProjection> project_windows(std::span<const double> costs, double acceptance) {
    std::vector<WindowProjection> out;
    if (costs.empty() || !(costs[0] > 0)) return out;
    const size_t n = std::min<size_t>(costs.size(), SpeculationPolicy::kMaxDraft + 1);
    const std::vector<double> per_draft(n, std::clamp(acceptance, 0.0, 1.0));
    for (size_t i = 0; i < n; ++i) {
        const int w = static_cast<int>(i) + 1;
        double chain = 1;
        const double tokens = expected_round_tokens(per_draft, w - 1, &chain);
        const double ratio = costs[i] / costs[0];
        const double refeed = costs[static_cast<size_t>(std::min<int>(refeed_window(tokens), static_cast<int>(n))) - 1];
        out.push_back({.window = w,
                       .cost_ratio = ratio,
                       .tokens = tokens,
                       .speedup = tokens / ratio,
                       .speedup_refeed = tokens / (ratio + (1.0 - chain) * refeed / costs[0])});
    }
    return out;
}

WindowProjection best_window(std::span<const WindowProjection> projections, bool refeed) {
    WindowProjection best;
    for (const WindowProjection& p : projections) {
        const double s = refeed ? p.speedup_refeed : p.speedup, b = refeed ? best.speedup_refeed : best.speedup;
        if (s > b) best = p;
    }
    return best;
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
    const double x = tokens - 1;
    if (fit_.n <= 0) return 1.0 + 0.15 * x;  // nothing measured: a guess in units of one token
    // cost(w) = a + b (w - 1), least squares over the decayed measurements of every window size: one noisy pass
    // fades instead of pricing its size for good, and sizes the policy no longer picks are priced from the others.
    const double det = fit_.n * fit_.xx - fit_.x * fit_.x;
    if (det <= 1e-6 * fit_.n * fit_.xx + 1e-12) {
        // One size measured: each extra token at 15% of a token (a batched forward reads the weights once: extra
        // tokens cost little while decoding is bound by memory) until a second size says otherwise.
        const double x0 = fit_.x / fit_.n, unit = (fit_.y / fit_.n) / (1.0 + 0.15 * x0);
        return unit * (1.0 + 0.15 * x);
    }
    const double b = std::max(0.0, (fit_.n * fit_.xy - fit_.x * fit_.y) / det);
    const double a = std::max(1e-9, (fit_.y - b * fit_.x) / fit_.n);
    return a + b * x;
}

double SpeculationPolicy::draft_pass_cost() const {
    // Unmeasured: one layer and the head of a trunk of several layers, guessed at a quarter of a token's pass.
    return draft_pass_ > 0 ? draft_pass_ : 0.25 * cost(1);
}

double SpeculationPolicy::rate(Drafter d, int k) const {
    if (k <= 0) return 1.0 / cost(1);
    double chain = 1.0;
    const double expected = expected_round_tokens(accept_[static_cast<size_t>(d)], k, &chain);
    // A round that rejects a draft (probability 1 - chain) pays a second pass for the accepted prefix.
    const int refeed = refeed_window(expected);
    // MTP: k passes, and the cells kept in step for every token the round gives.
    const double drafting = d == Drafter::Mtp ? k * draft_pass_cost() + expected * cell_cost_ : 0.0;
    return expected / (drafting + cost(k + 1) + (commits_ ? 0.0 : (1.0 - chain) * cost(refeed)));
}

DraftPlan SpeculationPolicy::plan(int lookup_available) {
    DraftPlan best{};
    double best_rate = rate(Drafter::PromptLookup, 0);
    const int lookup_max = std::min(lookup_available, max_draft_);
    for (int k = 1; k <= lookup_max; ++k)
        if (const double r = rate(Drafter::PromptLookup, k); r > best_rate)
            best = {Drafter::PromptLookup, k}, best_rate = r;
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
    constexpr double kKeep = 0.98;  // a measurement's weight halves after ~35 more
    const double x = tokens - 1;
    // A pass slowed by something else on the machine (another process on a shared core) counts as at most 2.5x what
    // the line says, once it has a few points: one stall must not price a window size out for dozens of rounds. A
    // window slower than its tokens fed one at a time (with a margin for noise) is such a stall and is left out: as
    // the only point off one token, even clamped it would set the slope and stop all drafting until probes correct it.
    if (fit_.n >= 8) {
        if (tokens > 1 && seconds > 1.2 * tokens * cost(1)) return;
        seconds = std::min(seconds, 2.5 * cost(tokens));
    }
    fit_ = {.n = kKeep * fit_.n + 1,
            .x = kKeep * fit_.x + x,
            .y = kKeep * fit_.y + seconds,
            .xx = kKeep * fit_.xx + x * x,
            .xy = kKeep * fit_.xy + x * seconds};
}

void SpeculationPolicy::record_draft_cost(int passes, double seconds) {
    if (passes < 1 || !(seconds > 0)) return;
    const double per = seconds / passes;
    draft_pass_ = draft_pass_ > 0 ? (1 - kEma) * draft_pass_ + kEma * per : per;
}

void SpeculationPolicy::record_cell_cost(int64_t cells, double seconds) {
    if (cells < 1 || !(seconds > 0)) return;
    const double per = seconds / static_cast<double>(cells);
    cell_cost_ = cell_cost_ > 0 ? (1 - kEma) * cell_cost_ + kEma * per : per;
}

bool SpeculationPolicy::mtp_may_pay() const {
    // Judged only on measured costs: a draft pass and at least two window sizes.
    if (!has_mtp_ || draft_pass_ <= 0 || fit_.n < 4) return has_mtp_;
    const double det = fit_.n * fit_.xx - fit_.x * fit_.x;
    if (det <= 1e-6 * fit_.n * fit_.xx + 1e-12) return true;
    const double plain = 1.0 / cost(1);
    // After a few MTP rounds their measured acceptance decides; before, only drafts always accepted would.
    if (mtp_rounds_ >= kMtpRoundsToJudge) {
        for (int k = 1; k <= max_draft_; ++k)
            if (rate(Drafter::Mtp, k) > plain) return true;
        return false;
    }
    for (int k = 1; k <= max_draft_; ++k) {
        // Every draft accepted: k + 1 tokens for k passes, a window of k + 1 and k + 1 cells.
        const double best_case = (k + 1) / (k * draft_pass_ + cost(k + 1) + (k + 1) * cell_cost_);
        if (best_case > plain) return true;
    }
    return false;
}

void SpeculationPolicy::record_round(Drafter drafter, int offered, int accepted) {
    offered = std::clamp(offered, 0, max_draft_);
    accepted = std::clamp(accepted, 0, offered);
    if (drafter == Drafter::Mtp && offered > 0) ++mtp_rounds_;
    auto& acc = accept_[static_cast<size_t>(drafter)];
    // Position i is judged only when every draft before it was accepted (the verification stops at the first
    // rejection), so a_i estimates P(accept i | accepted 1..i-1), the factor E(k) multiplies.
    for (int i = 0; i <= accepted && i < offered; ++i) {
        double& a = acc[static_cast<size_t>(i)];
        a = (1 - kEma) * a + kEma * (i < accepted ? 1.0 : 0.0);
    }
}

}  // namespace strata
