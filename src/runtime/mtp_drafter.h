// The MTP drafter (issue 28): the model's own draft layer proposes the tokens after the target's next pick. It keeps
// the layer's cells in step with the trunk: every token the trunk keeps (prompt chunks, accepted window prefixes)
// becomes a cell pairing the trunk's residual after the token before it with it: a prompt's per chunk, a decode
// round's with the next draft. A draft runs the cells not yet built together with the first draft cell in one pass
// (the catch-up rides along), then one pass per chained draft, each
// reading the previous cell's output residual in place of the trunk's, while the draft's probability stays at or
// above a floor. Chained cells are overwritten by the next catch-up, so rejected drafts leave nothing behind.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/model.h"

namespace strata {

struct MtpDraft {
    std::vector<int32_t> tokens;
    std::vector<float> probability;  // the drafter's softmax probability of each token
};

class MtpDrafter {
  public:
    // capacity: the tokens the sequence can hold (the cells needed, plus the longest draft). Throws Error when the
    // model has no MTP draft layer.
    MtpDrafter(const Model& model, int64_t capacity);

    // The trunk kept `tokens` (right after those observed before), and `residual` [tokens x width] is its final
    // residual after each. With build_now (a prompt chunk) the layer runs over the new cells at once; otherwise they
    // wait for the next draft's pass (a decode round: while the policy drafts by lookup or not at all, the MTP layer
    // costs nothing; measured 5-8% of decode time on the bundled model when every round built its cells).
    void observe(std::span<const int32_t> tokens, std::span<const float> residual, bool build_now = false);
    // Up to max_draft tokens to follow `next` (the target's pick after the observed tokens, not observed itself):
    // each the drafter's most likely token, kept while its probability is at least min_p. Needs at least one
    // observed token.
    MtpDraft draft(int32_t next, int max_draft, float min_p);

    // Stops: observe() and draft() do nothing until reset() or rewind() (the policy found the layer cannot pay here).
    void retire();
    // Back to no tokens observed, drafting again (the sequence was reset).
    void reset();
    // Where the drafter stands after some tokens (a server keeps one beside each sequence checkpoint): rewind() brings
    // it back there, drafting again, when the sequence is brought back to the checkpoint. Its cells below stay valid
    // as long as the sequence's cells do (drafts write cells at or above the observed tokens only). mark() builds
    // the waiting cells first; nullopt when retired.
    struct Mark {
        int64_t observed = 0;
        std::vector<float> last_residual;  // empty: no token observed
    };
    std::optional<Mark> mark();
    void rewind(const Mark& mark);
    bool retired() const { return retired_; }
    // Builds the cells waiting for a draft now (a long backlog, so that the draft's own pass is timed alone).
    void build();
    int64_t queued() const { return std::ssize(queued_tokens_); }
    int64_t observed() const { return observed_; }  // tokens observed: the sequence's length when in step
    int64_t cells() const { return cells_; }        // cells built with the trunk's residuals
    int64_t passes() const { return passes_; }      // draft layer passes so far
    int64_t width() const { return width_; }

  private:
    void run(std::span<const float> residual, std::span<const int32_t> tokens, bool want_residual);
    const Model& model_;
    std::unique_ptr<DraftState> state_;
    int64_t width_ = 0;
    int64_t cells_ = 0;
    int64_t observed_ = 0;
    bool has_last_ = false;
    std::vector<float> last_residual_;    // the trunk's residual after the last observed token
    std::vector<float> queued_residual_;  // cells observed but not yet run: their residual rows and tokens
    std::vector<int32_t> queued_tokens_;
    std::vector<float> logits_, out_residual_, rows_;
    int64_t passes_ = 0;
    bool retired_ = false;
};

}  // namespace strata
