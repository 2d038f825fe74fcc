// Decoding with speculation (issue 28), CPU side: each round a policy (runtime/speculation.h) picks the drafter
// (prompt lookup, or the model's MTP layer: runtime/mtp_drafter.h) and the draft length from measured costs and
// acceptance; the last token plus the drafts run as one batched forward pass; the longest prefix of drafts equal to
// the model's own picks is accepted, plus the model's next token; after a rejection the sequence keeps the accepted
// prefix: committed from the window's recorded inputs where the backend can (the CPU), else the checkpoint taken
// before the round is restored and the prefix re-fed. Lossless: the tokens equal those of decoding one token a call,
// since a forward pass gives the same logits however its tokens are batched.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/mtp_drafter.h"
#include "runtime/prompt_lookup.h"
#include "runtime/speculation.h"

namespace strata {

struct SpeculativeOptions {
    int max_draft = 4;  // --spec K: the longest draft (0: plain decoding)
    // A match of 3 tokens or more: shorter ones propose what the text happened to hold once (the code prompt of
    // bench/NOTES.md 2026-12-07: 0.85 of drafts accepted from any match, 0.99 from 3-token ones).
    PromptLookupOptions lookup{.min_ngram = 3};
    bool prompt_lookup = true;  // may draft by prompt lookup
    // The MTP drafter, in step with the sequence (speculative_prefill fed it the prompt), or null: no MTP drafts.
    MtpDrafter* mtp = nullptr;
    float mtp_min_p = 0.3f;  // an MTP draft token below this probability ends the draft (--spec-min-p)
    // false: no policy, every round drafts max_draft tokens (prompt lookup where it matches, else MTP), for tests and
    // A/B runs; true: the policy picks the drafter and the length from measurements.
    bool adaptive = true;
    // Keeps measurements across calls (chat turns); null: a fresh policy for this call.
    SpeculationPolicy* policy = nullptr;
};

struct SpeculativeStats {
    int64_t rounds = 0;    // forward passes after the prompt (re-feeds after a rejection included)
    int64_t drafted = 0;   // draft tokens offered
    int64_t accepted = 0;  // of them, accepted
    int64_t refeeds = 0;   // rounds that had to restore and re-feed the accepted prefix
    int64_t commits = 0;   // rounds whose accepted prefix was kept by Model::commit (no second pass)
    int64_t emitted = 0;   // tokens emitted
    std::array<int64_t, kDrafters> drafted_by{}, accepted_by{}, rounds_by{};  // per drafter
    int64_t mtp_passes = 0;    // passes of the MTP layer (catch-up included)
    bool mtp_retired = false;  // the policy found the MTP layer cannot pay here and stopped it
    // The model could not take a checkpoint (CUDA: no device memory for a copy of the state): from then on the call
    // decoded without drafts, since a rejected draft could not be rolled back.
    bool no_checkpoint = false;
    // The policy's view at the end: seconds of a forward pass of w tokens (index w; 0 unused) and of an MTP pass.
    std::array<double, SpeculationPolicy::kMaxDraft + 2> window_cost{};
    double draft_pass_cost = 0;
    double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0; }
    // Tokens per verification round (re-feeds not counted as rounds).
    double tokens_per_round() const {
        const int64_t verify = rounds - refeeds;
        return verify > 0 ? static_cast<double>(emitted) / static_cast<double>(verify) : 0;
    }
    SpeculativeStats& operator+=(const SpeculativeStats& o);
};

// One round's drafts, picked as speculative_decode picks them (the server's slots use the same): prompt lookup's
// proposal over `history` (every token the sequence holds plus the target's next token, last), the policy's plan
// (or, not adaptive, `room` tokens: lookup where it matches, else MTP), and the drafts. MTP passes are timed into the
// policy. `room`: the most drafts the sequence and the request allow.
struct RoundDrafts {
    DraftPlan plan;
    std::vector<int32_t> lookup;  // prompt lookup's whole proposal (judged after the round whoever drafted)
    std::vector<int32_t> tokens;  // the drafts to feed after the target's token
    int64_t mtp_passes = 0;
};
RoundDrafts draft_round(SpeculationPolicy& policy, MtpDrafter* mtp, std::span<const int32_t> history, int room,
                        const SpeculativeOptions& options);
// What verification found: the first `accepted` drafts kept, then the target's own token `following` (nullopt when
// the round ended before one was picked: only the accepted positions are judged).
void judge_round(SpeculationPolicy& policy, const RoundDrafts& round, int accepted, std::optional<int32_t> following);
// After a round, adaptive: stops the MTP drafter where the policy finds it cannot pay (true when it did).
bool retire_mtp_if_unpaid(SpeculationPolicy& policy, MtpDrafter& mtp);

// Feeds `prompt` after what `seq` holds, `chunk` tokens a pass, and writes the last token's logits (n_vocab floats).
// With an MTP drafter, also builds its cells for the prompt, chunk by chunk. An empty prompt is a no-op.
void speculative_prefill(const Model& model, SequenceState& seq, MtpDrafter* mtp, std::span<const int32_t> prompt,
                         std::span<float> logits, int64_t chunk = 512);

// Decodes up to n tokens after `seq`, whose last fed token's logits are `logits` (n_vocab floats; they are
// overwritten). `history` is every token the sequence holds (for prompt lookup). `pick(row, position)` chooses the
// token at a position from the logits before it and must be a function of its arguments alone (argmax, or
// Sampler::sample_at: sampling keyed by (seed, position)); then the tokens are those decoding one token a call with
// the same rule gives. `emit` gets each token in order and returns false to stop (an end-of-generation token). The
// sequence must have room for n + max_draft more tokens. On return it holds every emitted token but the last, or the
// last too when that one was an accepted draft (and, after `emit` stopped it inside a round, the rest of that
// round's accepted drafts). Throws Error when options.mtp is not in step with the sequence.
using TokenPicker = std::function<int32_t(std::span<const float> row, int64_t position)>;
SpeculativeStats speculative_decode(const Model& model, SequenceState& seq, std::span<float> logits,
                                    std::vector<int32_t> history, int64_t n, const SpeculativeOptions& options,
                                    const TokenPicker& pick, const std::function<bool(int32_t)>& emit);

// speculative_decode with argmax picks.
SpeculativeStats greedy_speculative_decode(const Model& model, SequenceState& seq, std::span<float> logits,
                                           std::vector<int32_t> history, int64_t n, const SpeculativeOptions& options,
                                           const std::function<bool(int32_t)>& emit);

}  // namespace strata
