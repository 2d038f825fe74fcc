#include "runtime/mtp_drafter.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace strata {

namespace {
// Cells waiting for a draft pass beyond this many are built anyway (a bound on the queue's memory: a row of the
// residual each).
constexpr size_t kMaxQueued = 1024;
}  // namespace

MtpDrafter::MtpDrafter(const Model& model, int64_t capacity) : model_(model), width_(model.draft_residual_width()) {
    if (width_ == 0) throw Error("the model has no MTP draft layer: use prompt-lookup drafts");
    state_ = model.new_draft_state(capacity);
    last_residual_.resize(static_cast<size_t>(width_));
    out_residual_.resize(static_cast<size_t>(width_));
    logits_.resize(static_cast<size_t>(model.info().n_vocab));
}

void MtpDrafter::run(std::span<const float> residual, std::span<const int32_t> tokens, bool want_residual) {
    model_.draft_forward(*state_, cells_, residual, tokens, logits_,
                         want_residual ? std::span<float>(out_residual_) : std::span<float>());
    ++passes_;
}

void MtpDrafter::retire() {
    retired_ = true;
    queued_residual_ = {};
    queued_tokens_ = {};
}

void MtpDrafter::reset() {
    retire();
    retired_ = false;
    cells_ = observed_ = 0;
    has_last_ = false;
}

std::optional<MtpDrafter::Mark> MtpDrafter::mark() {
    if (retired_) return std::nullopt;
    build();
    Mark m{.observed = observed_};
    if (has_last_) m.last_residual = last_residual_;
    return m;
}

void MtpDrafter::rewind(const Mark& m) {
    if (!m.last_residual.empty() && std::ssize(m.last_residual) != width_)
        throw Error("MtpDrafter::rewind: the mark is another model's");
    reset();
    observed_ = m.observed;
    has_last_ = !m.last_residual.empty();
    // Cell i pairs the residual after token i with token i + 1: the cells of the first `observed` tokens.
    cells_ = std::max<int64_t>(0, m.observed - 1);
    if (has_last_) std::copy(m.last_residual.begin(), m.last_residual.end(), last_residual_.begin());
}

void MtpDrafter::observe(std::span<const int32_t> tokens, std::span<const float> residual, bool build_now) {
    if (retired_) return;
    const size_t W = static_cast<size_t>(width_);
    if (residual.size() < tokens.size() * W) throw Error("MtpDrafter::observe: fewer residual rows than tokens");
    for (size_t i = 0; i < tokens.size(); ++i) {
        // Cell: the residual after the token before, paired with this token.
        if (has_last_) {
            queued_residual_.insert(queued_residual_.end(), last_residual_.begin(), last_residual_.end());
            queued_tokens_.push_back(tokens[i]);
        }
        std::copy_n(residual.begin() + static_cast<std::ptrdiff_t>(i * W), W, last_residual_.begin());
        has_last_ = true;
    }
    observed_ += std::ssize(tokens);
    if (build_now || queued_tokens_.size() >= kMaxQueued) build();
}

void MtpDrafter::build() {
    if (queued_tokens_.empty()) return;
    run(queued_residual_, queued_tokens_, false);
    cells_ += std::ssize(queued_tokens_);
    queued_residual_.clear();
    queued_tokens_.clear();
}

MtpDraft MtpDrafter::draft(int32_t next, int max_draft, float min_p) {
    MtpDraft d;
    if (retired_ || max_draft <= 0 || !has_last_) return d;
    // The cells the trunk confirmed end at n_true; the first draft cell (the last residual with `next`) sits there,
    // chained ones after it.
    const int64_t n_true = cells_ + std::ssize(queued_tokens_);
    max_draft = static_cast<int>(std::min<int64_t>(max_draft, state_->capacity() - n_true));
    if (max_draft <= 0) return d;
    // The queued catch-up cells and the first draft cell in one pass.
    rows_.assign(queued_residual_.begin(), queued_residual_.end());
    rows_.insert(rows_.end(), last_residual_.begin(), last_residual_.end());
    queued_tokens_.push_back(next);
    run(rows_, queued_tokens_, max_draft > 1);
    cells_ = n_true;
    queued_residual_.clear();
    queued_tokens_.clear();
    // The first draft cell sits at n_true; it is built again, with the same inputs, when `next` is observed.
    for (int k = 0; k < max_draft; ++k) {
        const auto best = std::max_element(logits_.begin(), logits_.end());
        double z = 0;
        for (const float v : logits_) z += std::exp(static_cast<double>(v - *best));
        const float p = static_cast<float>(1.0 / z);
        if (p < min_p) break;
        const int32_t token = static_cast<int32_t>(best - logits_.begin());
        d.tokens.push_back(token);
        d.probability.push_back(p);
        if (k + 1 == max_draft) break;
        // Chained: the cell after reads this cell's output residual and the token it drafted.
        rows_.assign(out_residual_.begin(), out_residual_.end());
        model_.draft_forward(*state_, n_true + 1 + k, rows_, std::span<const int32_t>(&token, 1), logits_,
                             k + 2 < max_draft ? std::span<float>(out_residual_) : std::span<float>());
        ++passes_;
    }
    return d;
}

}  // namespace strata
