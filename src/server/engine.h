// The server's engine: N slots, each with its own sequence, and ONE scheduler thread that, every step, gathers each
// busy slot's next work (a prompt chunk or one decode token) into one Model::forward_batch call.
//
// Scheduling: slots are visited round robin (the starting slot rotates every step); every decoding slot gets its
// token each step, and prompt chunks (at most chunk_size tokens each, always cut at the same offsets of the prompt)
// fill a per-step prompt budget of chunk_size tokens, so a long prompt never starves the others' decode steps. Requests
// beyond the slots wait in a bounded FIFO queue; a full queue refuses at submit().
//
// Prefix reuse: a slot keeps the tokens its sequence holds and checkpoints (Model::checkpoint) taken at the end of each
// prompt and of each reply. A new request goes to the idle slot with the longest common prefix; when its prompt
// extends what the slot holds it is simply continued, otherwise the best checkpoint at or below the common prefix is
// restored (when the model cannot checkpoint, the slot starts over). Only the rest of the prompt is computed.
//
// Speculation (issue 28): a decoding slot feeds its token plus up to EngineOptions::spec drafts as one entry of the
// batch: the model's MTP layer drafts (each slot has its own drafter, fed the slot's residual rows by forward_batch)
// or prompt lookup does (3-token matches), a per-slot policy choosing the drafter and how many each round, as
// runtime/speculative_decode.h does for one sequence. The rows are then sampled in order exactly as one-token steps
// would sample them (same sampler calls, same constraint, same random stream), so the output does not change;
// sampling stops at the first row whose token differs from the next draft, and the slot's sequence is brought back to
// what it used (Model::commit from the window's recorded inputs; where the backend cannot, restore and re-feed). A
// slot's drafter keeps a mark beside each sequence checkpoint, so a reused prefix drafts at once.
//
// Each request's tokens reach its HTTP thread through a RequestChannel (events: tokens with their visible text and
// log-probabilities, then one final event). A client that goes away cancels its channel; the scheduler notices at the
// next step, stops the request and frees the slot.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/mtp_drafter.h"
#include "runtime/sampler.h"
#include "runtime/speculative_decode.h"
#include "server/metrics.h"

namespace strata {
class Tokenizer;
}  // namespace strata

namespace strata::server {

// A grammar over the output (JSON schema, tool calls): masks the logits before sampling and follows what was chosen.
class OutputConstraint {
  public:
    virtual ~OutputConstraint() = default;
    virtual void mask(std::span<float> logits) const = 0;  // forbidden tokens to -infinity
    virtual void accept(int32_t token) = 0;
    virtual bool complete() const = 0;  // the output so far is a whole sentence of the grammar
    virtual bool must_end() const = 0;  // nothing but the end may follow
};

enum class FinishReason { kEndOfGeneration, kStopString, kConstraintDone, kMaxTokens, kContextFull, kCancelled, kError };

// "stop" or "length" (OpenAI's names); cancelled and error keep their own.
const char* openai_finish_reason(FinishReason r);

struct TokenLogprob {
    int32_t token = -1;
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;  // the most likely tokens, best first
};

struct GenerationStats {
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;      // prompt tokens reused from the slot's earlier state
    int64_t completion_tokens = 0;  // sampled tokens (an end-of-generation token included)
    double queue_seconds = 0.0;
    double time_to_first_token = 0.0;  // from arrival
    double decode_seconds = 0.0;       // after the first token
    int slot = -1;
};

struct GenerationEvent {
    enum class Kind { kToken, kDone } kind = Kind::kToken;
    // kToken: one sampled token (token -1: text released at the end) and the text it makes visible (held back while it
    // may be the start of a stop string or an incomplete UTF-8 character).
    int32_t token = -1;
    std::string text;
    std::optional<TokenLogprob> logprob;
    // kDone
    FinishReason reason = FinishReason::kEndOfGeneration;
    std::string matched_stop;
    std::string error;
    GenerationStats stats;
};

struct GenerationRequest {
    std::string id;  // for logs
    std::vector<int32_t> prompt;
    // Message ends inside the prompt (token positions, ascending): the first and the last get a checkpoint, so a
    // new conversation with the same system prompt, or the next turn of this one, computes only what differs.
    std::vector<size_t> boundaries;
    SamplingParams sampling;
    std::vector<std::string> stops;
    int64_t max_tokens = 0;     // 0: until the context is full
    int top_logprobs = -1;      // -1: no log-probabilities; 0..20: the sampled token's and that many alternatives
    bool ignore_eos = false;
    std::unique_ptr<OutputConstraint> constraint;
};

// What the HTTP thread and the scheduler share for one request.
class RequestChannel {
  public:
    // Waits up to `timeout` for the next event; false when none came.
    bool next(GenerationEvent& out, std::chrono::milliseconds timeout);
    void cancel() { cancelled_.store(true); }
    bool cancelled() const { return cancelled_.load(); }

    void push(GenerationEvent event);  // scheduler side

  private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<GenerationEvent> events_;
    std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
    int n_slots = 4;
    int64_t ctx_per_slot = 4096;
    int queue_limit = 64;
    int64_t chunk_size = 256;
    bool prefix_cache = true;
    int max_checkpoints_per_slot = 4;  // the oldest (a shared system prompt) and the latest are kept
    // Speculative decoding (--spec N): a decoding slot's window holds up to N drafts after its token (the MTP layer's
    // or prompt lookup's, a per-slot policy picking the drafter and the length each round, as `run` does); 0: off;
    // -1: 4 when the model has an MTP layer (on by default with the bundled model), else off.
    int spec = -1;
    bool spec_mtp = true;       // the MTP layer may draft, where the model has one (--spec-drafter)
    bool spec_lookup = true;    // prompt lookup may draft
    bool spec_adaptive = true;  // false (--spec-fixed): every round drafts N tokens, no policy (A/B runs)
    float spec_min_p = 0.3f;    // an MTP draft ends at a token below this probability (--spec-min-p)
};

struct SlotStatus {
    int id = 0;
    std::string state;  // "idle", "prompt", "generating"
    std::string request_id;
    int64_t n_past = 0;
    int64_t capacity = 0;
    int64_t prompt_tokens = 0;
    int64_t generated = 0;
    int64_t checkpoints = 0;
};

struct EngineSnapshot {
    LoadGauges load;
    std::vector<SlotStatus> slots;
    int queue_limit = 0;
    bool checkpoints_supported = true;
};

class QueueFull : public std::exception {
  public:
    const char* what() const noexcept override { return "the server is busy: every slot and the wait queue are full"; }
};

class ShuttingDown : public std::exception {
  public:
    const char* what() const noexcept override { return "the server is shutting down"; }
};

class Engine {
  public:
    // Creates the slots' sequences (Model::new_sequence throws Error when their memory cannot be planned) and starts
    // the scheduler thread. eog: the tokens that end a generation.
    Engine(const Model& model, const Tokenizer& tokenizer, std::vector<int32_t> eog, EngineOptions options,
           Metrics& metrics);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Queues a request; throws QueueFull when the queue is at its limit, ShuttingDown after stop(), and Error when the
    // prompt does not fit.
    std::shared_ptr<RequestChannel> submit(GenerationRequest request);
    void stop();  // finishes every request (kError "shutting down") and joins the scheduler

    EngineSnapshot snapshot() const;
    const EngineOptions& options() const { return options_; }

  private:
    struct Active;
    struct Slot;
    void loop();
    void admit_locked();
    void prepare_slot(Slot& slot);
    void step();
    void sample(Slot& slot, std::span<float> row);
    void speculate(Slot& slot, BatchEntry& entry);
    void verify(Slot& slot, int drafted, bool alone, double seconds);
    void start_drafter(Slot& slot, const MtpDrafter::Mark* mark);
    void observe(Slot& slot, std::span<const int32_t> tokens, bool build_now);
    SpeculativeOptions spec_options() const;
    void finish(Slot& slot, FinishReason reason, const std::string& error = {});
    void take_checkpoint(Slot& slot);
    std::vector<size_t> checkpoint_positions(const Active& a) const;
    void publish_status();

    const Model& model_;
    const Tokenizer& tokenizer_;
    std::vector<int32_t> eog_;
    EngineOptions options_;
    Metrics& metrics_;
    int64_t n_vocab_ = 0;
    bool checkpoints_supported_ = true;

    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Active>> waiting_;
    bool stopping_ = false;
    std::vector<std::unique_ptr<Slot>> slots_;  // scheduler thread only (after construction)
    std::vector<SlotStatus> status_;             // under mutex_
    size_t round_robin_ = 0;
    std::thread thread_;
};

}  // namespace strata::server
