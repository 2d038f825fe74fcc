// How much to speculate (issue 28): a policy as plain data. It keeps the measured cost of a forward pass of w tokens
// and the measured acceptance of each draft position, and picks the draft length k that maximizes the expected tokens
// a round gives per second: E(k) = 1 + a_1 + a_1 a_2 + ... (a_i: the rate at which the i-th draft token was accepted
// when every draft before it was) over cost(k + 1), plus the second pass a rejection costs (1 - a_1 ... a_k times
// the cost of re-feeding about E(k) tokens). k = 0 (plain decoding) whenever nothing beats it, so speculation never
// makes decoding slower than the measurements say plain decoding is.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace strata {

class SpeculationPolicy {
  public:
    static constexpr int kMaxDraft = 7;
    explicit SpeculationPolicy(int max_draft);

    // The draft length to ask for this round (0..max_draft). While drafting does not pay, every kExplore-th call asks
    // for one token anyway, to keep measuring its acceptance.
    static constexpr int kExplore = 32;
    int choose();
    // A forward pass of `tokens` tokens took `seconds`.
    void record_cost(int tokens, double seconds);
    // A round offered `offered` draft tokens and the target accepted the first `accepted` of them.
    void record_round(int offered, int accepted);

    double acceptance(int position) const { return accept_[static_cast<size_t>(position)]; }  // position 0..
    double cost(int tokens) const;  // seconds, measured or extrapolated

  private:
    int max_draft_;
    std::array<double, kMaxDraft + 2> cost_{};  // by window size; 0: not measured
    std::array<double, kMaxDraft> accept_{};    // EMA of acceptance at each draft position
    int since_draft_ = 0;                       // calls since the last that drafted
};

}  // namespace strata
