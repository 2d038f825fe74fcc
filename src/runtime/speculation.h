// How to speculate (issue 28): a policy as plain data. Per round it picks the drafter (prompt lookup or the model's
// MTP layer) and the draft length k from what it measured: the cost of a forward pass of w tokens, the cost of an MTP
// draft pass, and each drafter's acceptance at each draft position. It maximizes the expected tokens a round gives per
// second: E(k) = 1 + a_1 + a_1 a_2 + ... (a_i: the rate at which the i-th draft token was accepted when every draft
// before it was) over the round's cost: drafting (k MTP passes; prompt lookup is free), cost(k + 1) (a line fitted to
// the measured passes of every window size), plus the second
// pass a rejection costs (1 - a_1 ... a_k times the cost of re-feeding about E(k) tokens; nothing once the model has
// committed a prefix instead). k = 0 (plain decoding)
// whenever nothing beats it, so speculation never makes decoding slower than the measurements say plain decoding is.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace strata {

enum class Drafter : uint8_t { PromptLookup = 0, Mtp = 1 };
inline constexpr int kDrafters = 2;
const char* drafter_name(Drafter d);

// The tokens a round of k drafts gives on average when the i-th draft is accepted at acceptance[i] given that every
// draft before it was: 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k (the target's own token always comes). *all_accepted, when
// given, gets a_1 ... a_k: the chance that no draft is rejected (a rejection costs a re-feed today).
double expected_round_tokens(std::span<const double> acceptance, int k, double* all_accepted = nullptr);
// The window a round re-feeds after a rejection: about the tokens it keeps, at least one.
int refeed_window(double expected_tokens);

// What measured window costs give at a per-draft acceptance (`strata bench --window-costs`): for each window of w
// tokens (the last token plus w - 1 drafts, each accepted at `acceptance` given the ones before it), its cost against
// one token, the tokens a round gives, and the decode speedup over plain decoding. Drafting is taken as free (prompt
// lookup; an MTP pass adds its own cost per draft).
struct WindowProjection {
    int window = 1;
    double cost_ratio = 1;      // cost(w) / cost(1)
    double tokens = 1;          // expected tokens a round gives
    double speedup = 1;         // with a commit step (a rejection costs nothing more): tokens / cost_ratio
    // Without a commit step: a rejection restores the checkpoint and re-feeds the kept tokens.
    double speedup_refeed = 1;
};
// costs[w - 1]: seconds of a window of w tokens (w = 1 .. costs.size(), at most SpeculationPolicy::kMaxDraft + 1).
std::vector<WindowProjection> project_windows(std::span<const double> costs, double acceptance);
// The entry with the largest speedup (the first on ties; window 1 when nothing beats plain decoding).
WindowProjection best_window(std::span<const WindowProjection> projections, bool refeed = false);

struct DraftPlan {
    Drafter drafter = Drafter::PromptLookup;
    int k = 0;  // 0: plain decoding this round
};

class SpeculationPolicy {
  public:
    static constexpr int kMaxDraft = 7;
    explicit SpeculationPolicy(int max_draft, bool has_mtp = false);

    // The plan for this round. lookup_available: how many tokens prompt lookup proposes now (0: no match). While
    // no drafting pays, every kExplore-th call asks for one token anyway (from the drafter measured less recently),
    // to keep measuring acceptance.
    static constexpr int kExplore = 32;
    DraftPlan plan(int lookup_available);
    // Prompt lookup alone, as many tokens as it may propose (the first version's interface).
    int choose() { return plan(max_draft_).k; }

    // A forward pass of `tokens` tokens took `seconds`.
    void record_cost(int tokens, double seconds);
    // Drafting with the MTP layer took `seconds` for `passes` passes of the layer.
    void record_draft_cost(int passes, double seconds);
    // Building `cells` MTP cells (keeping the layer in step with the trunk) took `seconds`.
    void record_cell_cost(int64_t cells, double seconds);
    // Whether the MTP layer could pay at all: false once its measured costs (a draft pass, a window, the cells kept in
    // step for every token) leave every MTP round slower than plain decoding even if every draft were accepted, or,
    // after kMtpRoundsToJudge MTP rounds, at the acceptance measured. The caller then stops drafting with it and
    // stops building its cells (which cost every token something).
    bool mtp_may_pay() const;
    void retire_mtp() { has_mtp_ = false; }
    // The MTP layer may draft again (a server slot's next request), judged on what was measured so far.
    void allow_mtp() { has_mtp_ = true; }
    bool has_mtp() const { return has_mtp_; }

    // The model kept a prefix of a window without a second pass (Model::commit): from now on a rejection is priced
    // at nothing more than the window.
    void record_commit() { commits_ = true; }

    // A round offered `offered` draft tokens of `drafter` and the target accepted the first `accepted` of them.
    void record_round(Drafter drafter, int offered, int accepted);
    void record_round(int offered, int accepted) { record_round(Drafter::PromptLookup, offered, accepted); }

    double acceptance(int position, Drafter d = Drafter::PromptLookup) const {
        return accept_[static_cast<size_t>(d)][static_cast<size_t>(position)];
    }
    double cost(int tokens) const;   // seconds, measured or extrapolated
    double draft_pass_cost() const;  // seconds per MTP pass, measured or a guess from cost(1)
    // Expected tokens per second of a round with drafter d and k drafts (k = 0: plain decoding).
    double rate(Drafter d, int k) const;

  private:
    int max_draft_;
    bool has_mtp_;
    struct CostFit {  // decayed sums for the least-squares line cost = a + b (tokens - 1)
        double n = 0, x = 0, y = 0, xx = 0, xy = 0;
    } fit_;
    double draft_pass_ = 0;                      // 0: not measured
    double cell_cost_ = 0;                       // seconds per MTP cell kept in step; 0: not measured
    static constexpr int kMtpRoundsToJudge = 4;  // MTP rounds before their acceptance may retire the layer
    int mtp_rounds_ = 0;
    std::array<std::array<double, kMaxDraft>, kDrafters> accept_{};  // EMA of acceptance at each draft position
    int since_draft_ = 0;                                            // calls since the last that drafted
    bool commits_ = false;                                           // rejections cost no re-feed
    int explored_ = 0;
};

}  // namespace strata
