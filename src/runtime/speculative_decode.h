// Greedy decoding with speculation (issue 28), the CPU-side first version: each round drafts with the prompt-lookup
// drafter, runs the last token plus the drafts as one batched forward pass, accepts the longest prefix of drafts equal
// to the model's own picks plus the model's next token, and brings the sequence back to the accepted prefix (a
// checkpoint before the round, restored and re-fed when a draft was rejected). Lossless: the tokens equal plain
// greedy decoding's, since a forward pass gives the same logits however its tokens are batched.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/prompt_lookup.h"

namespace strata {

struct SpeculativeOptions {
    int max_draft = 4;  // --spec K: the longest draft (0: plain greedy decoding)
    PromptLookupOptions lookup;
};

struct SpeculativeStats {
    int64_t rounds = 0;    // forward passes after the prompt (re-feeds after a rejection included)
    int64_t drafted = 0;   // draft tokens offered
    int64_t accepted = 0;  // of them, accepted
    int64_t refeeds = 0;   // rounds that had to restore and re-feed the accepted prefix
};

// Decodes up to n tokens greedily after `seq`, whose last fed token's logits are `logits` (n_vocab floats; they are
// overwritten). `history` is every token the sequence holds (for the drafter). `emit` gets each token in order and
// returns false to stop (an end-of-generation token). The sequence must have room for n + max_draft more tokens. On
// return it holds every emitted token but the last, or the last too when that one was an accepted draft (and, after
// `emit` stopped it inside a round, the rest of that round's accepted drafts).
SpeculativeStats greedy_speculative_decode(const Model& model, SequenceState& seq, std::span<float> logits,
                                           std::vector<int32_t> history, int64_t n, const SpeculativeOptions& options,
                                           const std::function<bool(int32_t)>& emit);

// The same with any rule that picks the token at a position from the logits before it: `pick(row, position)` must be
// a function of its arguments alone (Sampler::sample_at: sampling keyed by (seed, position)), and then the tokens are
// those decoding one token a call with the same rule gives. position: the token's index in the sequence.
using TokenPicker = std::function<int32_t(std::span<const float> row, int64_t position)>;
SpeculativeStats speculative_decode(const Model& model, SequenceState& seq, std::span<float> logits,
                                    std::vector<int32_t> history, int64_t n, const SpeculativeOptions& options,
                                    const TokenPicker& pick, const std::function<bool(int32_t)>& emit);

}  // namespace strata
