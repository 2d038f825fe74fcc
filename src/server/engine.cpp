#include "server/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/model.h"
#include "runtime/prompt_lookup.h"
#include "runtime/speculation.h"
#include "runtime/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

// log-softmax of the raw row: the sampled token's log-probability and the `top` most likely tokens.
TokenLogprob log_probabilities(std::span<const float> logits, int32_t token, int top) {
    float max_logit = -std::numeric_limits<float>::infinity();
    for (float l : logits) max_logit = std::max(max_logit, l);
    double sum = 0.0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
    const double log_sum = static_cast<double>(max_logit) + std::log(sum);
    TokenLogprob out;
    out.token = token;
    out.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)]) - log_sum);
    if (top > 0) {
        // The top entries by a bounded selection: one pass, `top` <= 20.
        std::vector<std::pair<float, int32_t>> best;
        best.reserve(static_cast<size_t>(top) + 1);
        for (size_t i = 0; i < logits.size(); ++i) {
            const float l = logits[i];
            if (best.size() == static_cast<size_t>(top) && !(l > best.back().first)) continue;
            auto at = std::find_if(best.begin(), best.end(), [&](const auto& b) { return l > b.first; });
            best.insert(at, {l, static_cast<int32_t>(i)});
            if (best.size() > static_cast<size_t>(top)) best.pop_back();
        }
        for (const auto& [l, id] : best)
            out.top.emplace_back(id, static_cast<float>(static_cast<double>(l) - log_sum));
    }
    return out;
}

}  // namespace

const char* openai_finish_reason(FinishReason r) {
    switch (r) {
        case FinishReason::kEndOfGeneration:
        case FinishReason::kStopString:
        case FinishReason::kConstraintDone:
            return "stop";
        case FinishReason::kMaxTokens:
        case FinishReason::kContextFull:
            return "length";
        case FinishReason::kCancelled:
            return "cancelled";
        case FinishReason::kError:
            return "error";
    }
    return "stop";
}

bool RequestChannel::next(GenerationEvent& out, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
    out = std::move(events_.front());
    events_.pop_front();
    return true;
}

void RequestChannel::push(GenerationEvent event) {
    {
        std::lock_guard lock(mutex_);
        events_.push_back(std::move(event));
    }
    cv_.notify_all();
}

// One request from submit() to its final event.
struct Engine::Active {
    GenerationRequest request;
    std::shared_ptr<RequestChannel> channel;
    Clock::time_point arrived;
    Clock::time_point started;
    Clock::time_point first_token;
    std::optional<Sampler> sampler;
    std::optional<StopMatcher> matcher;
    std::optional<StreamDecoder> decoder;
    int64_t generated = 0;
    int64_t cached = 0;
};

// A slot's sequence checkpoint and where its MTP drafter stood there (none: no drafter, or it was off).
struct SlotCheckpoint {
    std::unique_ptr<SequenceCheckpoint> seq;
    std::optional<MtpDrafter::Mark> mtp;
    int64_t n_past() const { return seq->n_past(); }
};

struct Engine::Slot {
    int id = 0;
    std::unique_ptr<SequenceState> seq;
    std::vector<int32_t> history;             // the tokens the sequence holds, in order
    std::vector<SlotCheckpoint> checkpoints;  // by n_past, ascending
    std::unique_ptr<Active> active;
    size_t prompt_pos = 0;           // next prompt token to feed
    std::optional<int32_t> pending;  // sampled token to feed in the next step
    HostFloats logits;               // n_vocab x (1 + spec), in the model's own memory for them
    uint64_t last_used = 0;          // for choosing among equally good idle slots
    // Speculation: the window in flight (pending token + drafts), this step's drafts and prompt lookup's proposal
    // (judged on what follows), the state before the window, and the slot's policy.
    std::vector<int32_t> window;
    RoundDrafts round;
    std::unique_ptr<SequenceCheckpoint> before_window;
    std::optional<SpeculationPolicy> policy;
    // The slot's MTP drafter (null: no MTP drafts), whether it is in step with the sequence for this request, and
    // the step's residual rows it reads.
    std::unique_ptr<MtpDrafter> mtp;
    bool mtp_on = false;
    std::vector<float> residual;
    bool checkpoint_after_window = false;  // finish() came inside a window: checkpoint once the sequence is back

    // After a failed pass the sequence's state is unknown: empty it, with everything kept about it.
    void start_over() {
        seq->reset();
        history.clear();
        checkpoints.clear();
        mtp_on = false;
    }
};

Engine::Engine(const Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eog, EngineOptions options,
               Metrics& metrics)
    : model_(model), tokenizer_(tokenizer), eog_(std::move(eog)), options_(options), metrics_(metrics) {
    n_vocab_ = model_.info().n_vocab;
    if (options_.n_slots < 1) throw Error("--parallel must be at least 1");
    const bool has_mtp = model_.draft_residual_width() > 0;
    if (!options_.spec_lookup && !has_mtp)
        throw Error("--spec-drafter mtp: this model has no MTP layer this backend runs");
    if (options_.spec < 0) options_.spec = has_mtp ? 4 : 0;
    options_.spec = std::min(options_.spec, SpeculationPolicy::kMaxDraft);
    const bool mtp = options_.spec > 0 && options_.spec_mtp && has_mtp;
    for (int i = 0; i < options_.n_slots; ++i) {
        auto slot = std::make_unique<Slot>();
        slot->id = i;
        slot->seq = model_.new_sequence(options_.ctx_per_slot);
        slot->logits = model_.host_floats(static_cast<size_t>(n_vocab_ * (1 + options_.spec)));
        if (mtp) slot->mtp = std::make_unique<MtpDrafter>(model_, options_.ctx_per_slot);
        slots_.push_back(std::move(slot));
    }
    status_.resize(slots_.size());
    publish_status();
    thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
    stop();
}

void Engine::stop() {
    {
        std::lock_guard lock(mutex_);
        if (stopping_ && !thread_.joinable()) return;
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestChannel> Engine::submit(GenerationRequest request) {
    if (request.prompt.empty()) throw Error("the prompt is empty");
    const int64_t n = static_cast<int64_t>(request.prompt.size());
    if (n >= options_.ctx_per_slot)
        throw Error("the prompt is " + std::to_string(n) + " tokens, but the context holds " +
                    std::to_string(options_.ctx_per_slot) + " tokens per slot (prompt and reply); shorten it");
    for (int32_t t : request.prompt)
        if (t < 0 || t >= n_vocab_)
            throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                        std::to_string(n_vocab_ - 1) + ")");
    // Rows past the tokenizer's vocabulary (padding in the embedding) have no text: never sample them.
    for (int64_t id = tokenizer_.n_vocab(); id < n_vocab_; ++id)
        request.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), -std::numeric_limits<float>::infinity());
    auto active = std::make_unique<Active>();
    active->sampler.emplace(request.sampling, n_vocab_);  // throws Error on out-of-range parameters
    active->matcher.emplace(request.stops);
    active->decoder.emplace(tokenizer_);
    active->request = std::move(request);
    active->channel = std::make_shared<RequestChannel>();
    active->arrived = Clock::now();
    auto channel = active->channel;
    {
        std::lock_guard lock(mutex_);
        if (stopping_) throw ShuttingDown();
        size_t busy = 0;
        for (const auto& s : status_) busy += s.state != "idle";
        if (waiting_.size() + busy >= slots_.size() + static_cast<size_t>(options_.queue_limit)) throw QueueFull();
        waiting_.push_back(std::move(active));
    }
    cv_.notify_all();
    return channel;
}

EngineSnapshot Engine::snapshot() const {
    std::lock_guard lock(mutex_);
    EngineSnapshot s;
    s.slots = status_;
    s.queue_limit = options_.queue_limit;
    s.checkpoints_supported = checkpoints_supported_;
    s.load.waiting = static_cast<int64_t>(waiting_.size());
    int64_t held = 0, capacity = 0;
    for (const auto& st : status_) {
        s.load.running += st.state != "idle";
        held += st.n_past;
        capacity += st.capacity;
    }
    s.load.kv_usage = capacity > 0 ? static_cast<double>(held) / static_cast<double>(capacity) : 0.0;
    return s;
}

void Engine::publish_status() {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot& slot = *slots_[i];
        SlotStatus& st = status_[i];
        st.id = slot.id;
        st.n_past = slot.seq->n_past();
        st.capacity = slot.seq->capacity();
        st.checkpoints = static_cast<int64_t>(slot.checkpoints.size());
        if (!slot.active) {
            st.state = "idle";
            st.request_id.clear();
            st.prompt_tokens = st.generated = 0;
        } else {
            st.state = slot.prompt_pos < slot.active->request.prompt.size() ? "prompt" : "generating";
            st.request_id = slot.active->request.id;
            st.prompt_tokens = static_cast<int64_t>(slot.active->request.prompt.size());
            st.generated = slot.active->generated;
        }
    }
}

void Engine::loop() {
    uint64_t tick = 0;
    for (;;) {
        {
            std::unique_lock lock(mutex_);
            cv_.wait(lock, [&] {
                if (stopping_ || !waiting_.empty()) return true;
                return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->active != nullptr; });
            });
            if (stopping_) break;
            // Requests whose client left while they waited never reach a slot.
            for (auto it = waiting_.begin(); it != waiting_.end();) {
                if ((*it)->channel->cancelled()) {
                    GenerationEvent done{.kind = GenerationEvent::Kind::kDone, .reason = FinishReason::kCancelled};
                    (*it)->channel->push(std::move(done));
                    metrics_.request_cancelled();
                    it = waiting_.erase(it);
                } else {
                    ++it;
                }
            }
            admit_locked();
        }
        try {
            for (auto& s : slots_)
                if (s->active && s->active->started == Clock::time_point{}) {
                    s->active->started = Clock::now();
                    s->last_used = ++tick;
                    prepare_slot(*s);
                }
            step();
        } catch (const std::exception& e) {
            // Never expected (requests are checked on arrival): fail what runs, start those slots over, keep serving.
            for (auto& s : slots_) {
                if (!s->active) continue;
                s->start_over();
                GenerationEvent done{.kind = GenerationEvent::Kind::kDone, .reason = FinishReason::kError};
                done.error = std::string("internal error: ") + e.what();
                s->active->channel->push(std::move(done));
                s->active.reset();
                s->pending.reset();
            }
        }
        publish_status();
    }
    // Shutting down: whatever is running or waiting ends now.
    std::deque<std::unique_ptr<Active>> left;
    {
        std::lock_guard lock(mutex_);
        left.swap(waiting_);
    }
    for (auto& s : slots_)
        if (s->active) finish(*s, FinishReason::kError, "the server is shutting down");
    for (auto& a : left) {
        GenerationEvent done{.kind = GenerationEvent::Kind::kDone, .reason = FinishReason::kError};
        done.error = "the server is shutting down";
        a->channel->push(std::move(done));
    }
    publish_status();
}

// Waiting requests (FIFO) into idle slots: each takes the idle slot whose held tokens share the longest prefix with
// its prompt (the least recently used one on a tie).
void Engine::admit_locked() {
    while (!waiting_.empty()) {
        Slot* best = nullptr;
        size_t best_common = 0;
        const auto& prompt = waiting_.front()->request.prompt;
        for (auto& s : slots_) {
            if (s->active) continue;
            size_t common = 0;
            if (options_.prefix_cache) {
                const size_t n = std::min(s->history.size(), prompt.size());
                while (common < n && s->history[common] == prompt[common]) ++common;
            }
            if (!best || common > best_common || (common == best_common && s->last_used < best->last_used)) {
                best = s.get();
                best_common = common;
            }
        }
        if (!best) return;
        best->active = std::move(waiting_.front());
        waiting_.pop_front();
        status_[static_cast<size_t>(best->id)].state = "prompt";
    }
}

// Decides how much of the slot's state the new prompt can keep, and brings the sequence there.
void Engine::prepare_slot(Slot& slot) {
    Active& a = *slot.active;
    const auto& prompt = a.request.prompt;
    slot.pending.reset();
    size_t keep = 0;
    const SlotCheckpoint* restored = nullptr;
    if (options_.prefix_cache) {
        // At least the last prompt token must be fed: its logits give the first new token.
        const size_t n = std::min(slot.history.size(), prompt.size() - 1);
        size_t common = 0;
        while (common < n && slot.history[common] == prompt[common]) ++common;
        if (common == slot.history.size()) {
            keep = common;  // the prompt extends what the sequence holds: continue it
        } else {
            while (!slot.checkpoints.empty() && static_cast<size_t>(slot.checkpoints.back().n_past()) > common)
                slot.checkpoints.pop_back();
            if (!slot.checkpoints.empty()) {
                try {
                    model_.restore(*slot.seq, *slot.checkpoints.back().seq);
                    keep = static_cast<size_t>(slot.checkpoints.back().n_past());
                    restored = &slot.checkpoints.back();
                } catch (const std::exception&) {
                    slot.checkpoints.clear();
                    keep = 0;
                }
            }
        }
    }
    if (keep == 0) {
        slot.seq->reset();
        slot.checkpoints.clear();
        const MtpDrafter::Mark empty;
        start_drafter(slot, &empty);
    } else if (restored && restored->mtp) {
        start_drafter(slot, &*restored->mtp);
    } else {
        // A checkpoint taken while the drafter was off leaves it behind the sequence: off for this request.
        if (restored && slot.mtp) slot.mtp->retire();
        start_drafter(slot, nullptr);
    }
    slot.history.resize(keep);
    slot.prompt_pos = keep;
    a.cached = static_cast<int64_t>(keep);
    a.sampler->accept(std::span<const int32_t>(prompt));  // the penalties see the prompt too, as in llama.cpp
}

// The message ends of a request that get a checkpoint: the first and the last. A prompt without messages (a plain
// completion) gets one before its last token, so the same prompt again restores all of it but the token whose logits
// it needs (the checkpoint at the prompt's end lies past what such a prompt can keep).
std::vector<size_t> Engine::checkpoint_positions(const Active& a) const {
    const auto& b = a.request.boundaries;
    if (!options_.prefix_cache || !checkpoints_supported_) return {};
    if (b.empty()) {
        const size_t n = a.request.prompt.size();
        return n >= 2 ? std::vector<size_t>{n - 1} : std::vector<size_t>{};
    }
    if (b.size() == 1) return {b.front()};
    return {b.front(), b.back()};
}

void Engine::take_checkpoint(Slot& slot) {
    if (!options_.prefix_cache || !checkpoints_supported_) return;
    if (!slot.checkpoints.empty() && slot.checkpoints.back().n_past() == slot.seq->n_past()) return;
    try {
        SlotCheckpoint cp{.seq = model_.checkpoint(*slot.seq)};
        if (slot.mtp_on) cp.mtp = slot.mtp->mark();
        slot.checkpoints.push_back(std::move(cp));
    } catch (const std::exception&) {
        // Models without checkpoints: prefix reuse then works only when a prompt extends what a slot holds.
        std::lock_guard lock(mutex_);
        checkpoints_supported_ = false;
        return;
    }
    // Over the limit: drop the second oldest, so the earliest (typically the end of a shared system prompt) stays.
    while (static_cast<int>(slot.checkpoints.size()) > std::max(options_.max_checkpoints_per_slot, 2))
        slot.checkpoints.erase(slot.checkpoints.begin() + 1);
}

void Engine::step() {
    struct Work {
        Slot* slot;
        size_t n_prompt;  // prompt tokens in this entry (0: a decode token)
        bool wants_logits;
        int drafted = 0;  // a decode window's drafts after its token
    };
    std::vector<BatchEntry> batch;
    std::vector<Work> work;
    const size_t n = slots_.size();
    int64_t prompt_budget = options_.chunk_size;
    const size_t first = round_robin_++ % n;
    for (size_t k = 0; k < n; ++k) {
        Slot& slot = *slots_[(first + k) % n];
        if (!slot.active) continue;
        if (slot.active->channel->cancelled()) {
            metrics_.request_cancelled();
            finish(slot, FinishReason::kCancelled);
            continue;
        }
        if (slot.pending) {
            BatchEntry entry{.seq = slot.seq.get(),
                             .tokens = std::span<const int32_t>(&*slot.pending, 1),
                             .logits = std::span<float>(slot.logits.data(), static_cast<size_t>(n_vocab_)),
                             .last_only = true};
            speculate(slot, entry);
            if (slot.mtp_on) {
                slot.residual.resize(entry.tokens.size() * static_cast<size_t>(slot.mtp->width()));
                entry.residual = slot.residual;
            }
            batch.push_back(entry);
            work.push_back({&slot, 0, true, static_cast<int>(entry.tokens.size()) - 1});
            continue;
        }
        const auto& prompt = slot.active->request.prompt;
        if (slot.prompt_pos >= prompt.size() || prompt_budget <= 0) continue;
        // Chunks are cut at fixed offsets from where the slot starts (and at checkpointed message ends), whatever
        // else runs.
        size_t take = std::min(prompt.size() - slot.prompt_pos, static_cast<size_t>(options_.chunk_size));
        for (size_t b : checkpoint_positions(*slot.active))
            if (b > slot.prompt_pos && b < slot.prompt_pos + take) take = b - slot.prompt_pos;
        prompt_budget -= static_cast<int64_t>(take);
        const bool last = slot.prompt_pos + take == prompt.size();
        if (slot.mtp_on) slot.residual.resize(take * static_cast<size_t>(slot.mtp->width()));
        batch.push_back({.seq = slot.seq.get(),
                         .tokens = std::span<const int32_t>(prompt).subspan(slot.prompt_pos, take),
                         .logits = last ? std::span<float>(slot.logits) : std::span<float>(),
                         .last_only = true,
                         .residual = slot.mtp_on ? std::span<float>(slot.residual) : std::span<float>()});
        work.push_back({&slot, take, last, 0});
    }
    if (batch.empty()) return;
    const auto pass_start = Clock::now();
    try {
        model_.forward_batch(batch);
    } catch (const std::exception& e) {
        // Not expected (tokens and room are checked before); the sequences are in an unknown state: start them over.
        for (auto& w : work) {
            w.slot->start_over();
            finish(*w.slot, FinishReason::kError, std::string("the model failed: ") + e.what());
        }
        return;
    }
    const double pass_seconds = seconds_between(pass_start, Clock::now());
    for (size_t i = 0; i < work.size(); ++i) {
        Slot& slot = *work[i].slot;
        if (work[i].n_prompt == 0 && !slot.window.empty()) {
            verify(slot, work[i].drafted, batch.size() == 1, pass_seconds);
            continue;
        }
        const auto fed = batch[i].tokens;
        slot.history.insert(slot.history.end(), fed.begin(), fed.end());
        observe(slot, fed, /*build_now=*/work[i].n_prompt > 0);  // a prompt's cells at once, as run does
        if (work[i].n_prompt > 0) {
            slot.prompt_pos += work[i].n_prompt;
            const auto marks = checkpoint_positions(*slot.active);
            if (!work[i].wants_logits && std::find(marks.begin(), marks.end(), slot.prompt_pos) != marks.end())
                take_checkpoint(slot);  // a message end inside the prompt
            if (work[i].wants_logits) {
                metrics_.add_prompt_tokens(static_cast<int64_t>(slot.active->request.prompt.size()) - slot.active->cached,
                                           slot.active->cached);
                take_checkpoint(slot);  // a message boundary: the end of the prompt
            }
        } else {
            slot.pending.reset();
        }
        if (work[i].n_prompt == 0 && slot.policy && batch.size() == 1) slot.policy->record_cost(1, pass_seconds);
        if (work[i].wants_logits) sample(slot, std::span<float>(slot.logits.data(), static_cast<size_t>(n_vocab_)));
        if (work[i].n_prompt == 0 && slot.policy && slot.active && slot.pending)
            judge_round(*slot.policy, slot.round, 0, *slot.pending);
        if (work[i].n_prompt == 0) {
            slot.round = {};
            // As run does after every round: a drafter the measurements say cannot pay stops costing its cells.
            if (slot.mtp_on && options_.spec_adaptive && retire_mtp_if_unpaid(*slot.policy, *slot.mtp))
                slot.mtp_on = false;
        }
    }
}

SpeculativeOptions Engine::spec_options() const {
    return {.max_draft = options_.spec,
            .lookup = {.max_ngram = 4, .min_ngram = 3},
            .prompt_lookup = options_.spec_lookup,
            .mtp_min_p = options_.spec_min_p,
            .adaptive = options_.spec_adaptive};
}

// A new request's drafter: brought to `mark` (the sequence was reset or restored to a checkpoint) or left as it stands
// (the prompt continues what the slot holds). Off for the request when it is not in step with the sequence, or when
// the slot's policy measured that it cannot pay.
void Engine::start_drafter(Slot& slot, const MtpDrafter::Mark* mark) {
    slot.mtp_on = false;
    if (options_.spec <= 0) return;
    if (!slot.policy) slot.policy.emplace(options_.spec, slot.mtp != nullptr);
    if (slot.mtp && mark) slot.mtp->rewind(*mark);
    if (slot.mtp && !slot.mtp->retired() && slot.mtp->observed() == slot.seq->n_past()) {
        slot.policy->allow_mtp();
        slot.mtp_on = !options_.spec_adaptive || !retire_mtp_if_unpaid(*slot.policy, *slot.mtp);
    }
    if (!slot.mtp_on) slot.policy->retire_mtp();
}

// The tokens the sequence now holds, with their residual rows from this step's pass, for the slot's drafter.
void Engine::observe(Slot& slot, std::span<const int32_t> tokens, bool build_now) {
    if (slot.mtp_on) slot.mtp->observe(tokens, slot.residual, build_now);
}

// Drafts for a decoding slot (the MTP layer's or prompt lookup's over what it holds and its pending token), as many
// as its policy says pay; the entry then feeds the window and wants every row's logits.
void Engine::speculate(Slot& slot, BatchEntry& entry) {
    slot.window.clear();
    slot.round = {};
    if (options_.spec <= 0 || !checkpoints_supported_ || !slot.policy) return;
    const Active& a = *slot.active;
    int64_t room = std::min<int64_t>(options_.spec, slot.seq->capacity() - slot.seq->n_past() - 1);
    if (a.request.max_tokens > 0) room = std::min<int64_t>(room, a.request.max_tokens - a.generated - 1);
    if (room <= 0) return;
    slot.history.push_back(*slot.pending);
    slot.round = draft_round(*slot.policy, slot.mtp_on ? slot.mtp.get() : nullptr, slot.history,
                             static_cast<int>(room), spec_options());
    slot.history.pop_back();
    if (slot.round.tokens.empty()) return;
    try {
        slot.before_window = model_.checkpoint(*slot.seq);
    } catch (const std::exception&) {
        std::lock_guard lock(mutex_);
        checkpoints_supported_ = false;  // no way back from a rejected draft: no speculation
        slot.round.tokens.clear();
        return;
    }
    slot.window.push_back(*slot.pending);
    slot.window.insert(slot.window.end(), slot.round.tokens.begin(), slot.round.tokens.end());
    entry.tokens = slot.window;
    entry.logits = std::span<float>(slot.logits.data(), slot.window.size() * static_cast<size_t>(n_vocab_));
    entry.last_only = false;
    entry.window = true;
}

// Samples a window's rows in order, as one-token steps would, while each sampled token is the next draft; then brings
// the sequence back to the tokens whose rows were used.
void Engine::verify(Slot& slot, int drafted, bool alone, double seconds) {
    const std::vector<int32_t> window = std::move(slot.window);
    slot.window.clear();
    slot.pending.reset();
    int used = 0, accepted = 0;
    for (int r = 0; r <= drafted; ++r) {
        sample(slot, std::span<float>(slot.logits.data() + static_cast<size_t>(r) * static_cast<size_t>(n_vocab_),
                                      static_cast<size_t>(n_vocab_)));
        ++used;
        if (!slot.active || r == drafted || !slot.pending || *slot.pending != window[static_cast<size_t>(r) + 1]) break;
        ++accepted;
    }
    const std::span<const int32_t> kept(window.data(), static_cast<size_t>(used));
    if (used < static_cast<int>(window.size())) {
        try {
            // Keep the used prefix from the window's recorded inputs, or restore and feed it again.
            if (model_.commit(*slot.seq, *slot.before_window, used)) {
                if (slot.policy) slot.policy->record_commit();
            } else {
                model_.restore(*slot.seq, *slot.before_window);
                model_.forward(*slot.seq, kept, {});
            }
        } catch (const std::exception& e) {
            // Not expected (the checkpoint is this sequence's, just taken); start the slot over.
            slot.start_over();
            if (slot.active) finish(slot, FinishReason::kError, std::string("the model failed: ") + e.what());
            return;
        }
    }
    slot.before_window.reset();
    slot.history.insert(slot.history.end(), kept.begin(), kept.end());
    // The window pass's residual rows of the kept tokens (the rejected rows after them did not touch them).
    observe(slot, kept, /*build_now=*/false);
    metrics_.add_speculation(slot.round.plan.drafter, drafted, accepted);
    if (slot.policy) {
        if (alone) slot.policy->record_cost(drafted + 1, seconds);  // a pass of this slot's window alone
        const std::optional<int32_t> following =
            slot.active && slot.pending ? std::optional<int32_t>(*slot.pending) : std::nullopt;
        judge_round(*slot.policy, slot.round, accepted, following);
        if (slot.mtp_on && options_.spec_adaptive && retire_mtp_if_unpaid(*slot.policy, *slot.mtp))
            slot.mtp_on = false;
    }
    slot.round = {};
    if (slot.checkpoint_after_window) {
        slot.checkpoint_after_window = false;
        take_checkpoint(slot);
    }
}

void Engine::sample(Slot& slot, std::span<float> row) {
    Active& a = *slot.active;
    std::optional<TokenLogprob> logprob;
    int32_t token = -1;
    try {
        // log-probabilities of the raw logits, before bias, penalties, grammar and temperature
        std::vector<float> raw;
        if (a.request.top_logprobs >= 0) raw.assign(row.begin(), row.end());
        if (a.request.ignore_eos)
            for (int32_t e : eog_) row[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
        if (a.request.constraint) a.request.constraint->mask(row);
        token = a.sampler->sample_in_place(row);
        if (a.request.top_logprobs >= 0) logprob = log_probabilities(raw, token, a.request.top_logprobs);
    } catch (const std::exception& e) {
        finish(slot, FinishReason::kError, std::string("sampling failed: ") + e.what());
        return;
    }
    const auto now = Clock::now();
    if (a.generated++ == 0) {
        a.first_token = now;
        metrics_.observe_time_to_first_token(seconds_between(a.arrived, now));
    }
    metrics_.add_generated_tokens(1);
    const bool is_eog = std::find(eog_.begin(), eog_.end(), token) != eog_.end();
    if (is_eog) {
        if (logprob) a.channel->push({.kind = GenerationEvent::Kind::kToken, .token = token, .logprob = logprob});
        finish(slot, a.request.constraint ? FinishReason::kConstraintDone : FinishReason::kEndOfGeneration);
        return;
    }
    if (a.request.constraint) a.request.constraint->accept(token);
    a.sampler->accept(token);
    std::string text = a.matcher->push(a.decoder->push(token));
    a.channel->push({.kind = GenerationEvent::Kind::kToken, .token = token, .text = std::move(text), .logprob = logprob});
    if (a.matcher->stopped()) return finish(slot, FinishReason::kStopString);
    if (a.request.constraint && a.request.constraint->must_end()) return finish(slot, FinishReason::kConstraintDone);
    if (a.request.max_tokens > 0 && a.generated >= a.request.max_tokens) return finish(slot, FinishReason::kMaxTokens);
    if (slot.seq->n_past() + 1 > slot.seq->capacity()) return finish(slot, FinishReason::kContextFull);
    slot.pending = token;
}

void Engine::finish(Slot& slot, FinishReason reason, const std::string& error) {
    Active& a = *slot.active;
    if (reason != FinishReason::kStopString && reason != FinishReason::kCancelled && reason != FinishReason::kError) {
        std::string tail = a.matcher->push(a.decoder->flush());
        if (!a.matcher->stopped()) tail += a.matcher->flush();
        if (!tail.empty()) a.channel->push({.kind = GenerationEvent::Kind::kToken, .token = -1, .text = std::move(tail)});
        if (a.matcher->stopped()) reason = FinishReason::kStopString;
    }
    const auto now = Clock::now();
    GenerationEvent done{.kind = GenerationEvent::Kind::kDone, .reason = reason, .error = error};
    done.matched_stop = a.matcher->stopped() ? a.matcher->matched() : "";
    done.stats.prompt_tokens = static_cast<int64_t>(a.request.prompt.size());
    done.stats.cached_tokens = a.cached;
    done.stats.completion_tokens = a.generated;
    done.stats.slot = slot.id;
    if (a.started != Clock::time_point{}) done.stats.queue_seconds = seconds_between(a.arrived, a.started);
    if (a.generated > 0) {
        done.stats.time_to_first_token = seconds_between(a.arrived, a.first_token);
        done.stats.decode_seconds = seconds_between(a.first_token, now);
    }
    if (reason != FinishReason::kCancelled) {
        metrics_.request_finished(openai_finish_reason(reason));
        metrics_.observe_request(seconds_between(a.arrived, now),
                                 a.generated > 1 ? done.stats.decode_seconds / static_cast<double>(a.generated - 1) : -1.0);
    }
    if (reason != FinishReason::kError && reason != FinishReason::kCancelled) {
        // The reply's end; inside a speculative window the sequence still holds drafts: after it is brought back.
        if (slot.window.empty() && slot.seq->n_past() == static_cast<int64_t>(slot.history.size()))
            take_checkpoint(slot);
        else
            slot.checkpoint_after_window = true;
    }
    slot.pending.reset();
    a.channel->push(std::move(done));
    slot.active.reset();
}

}  // namespace strata::server
