// Server metrics in the Prometheus text format, with vLLM-style names under the `strata:` prefix. The engine and the
// HTTP layer update them from their threads; render() reads a consistent copy.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "model/model.h"
#include "runtime/speculation.h"

namespace strata::server {

// What the engine knows at one instant (filled by Engine::snapshot()).
struct LoadGauges {
    int64_t running = 0;
    int64_t waiting = 0;
    double kv_usage = 0.0;  // tokens held by the slots / their capacity, 0..1
};

// A Prometheus histogram over fixed bucket bounds (seconds).
struct Histogram {
    static constexpr std::array<double, 16> kBounds = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                                       0.25,  0.5,   1.0,  2.5,  5.0,  10.0, 30.0, 60.0};
    std::array<uint64_t, kBounds.size()> counts{};
    uint64_t count = 0;
    double sum = 0.0;
    void observe(double v);
    void render(std::string& out, const std::string& name, const std::string& help) const;
};

class Metrics {
  public:
    void observe_time_to_first_token(double seconds);
    void observe_request(double e2e_seconds, double seconds_per_output_token);  // tpot < 0: not measured
    void add_prompt_tokens(int64_t computed, int64_t cached);
    void add_generated_tokens(int64_t n);
    // A speculative round of one slot: `drafted` tokens of `drafter` verified, the first `accepted` of them kept.
    void add_speculation(Drafter drafter, int64_t drafted, int64_t accepted);
    void request_finished(const std::string& finished_reason);  // "stop", "length", "error", ...
    void request_cancelled();
    void http_response(int status);

    int64_t cancelled() const;
    double tokens_per_second() const;  // generated tokens over the last 10 s
    // offload: the model's expert cache, when its experts live in host RAM (CUDA).
    std::string render(const LoadGauges& load, const ExpertOffloadStats* offload = nullptr) const;

  private:
    using Clock = std::chrono::steady_clock;
    mutable std::mutex mutex_;
    Histogram ttft_, e2e_, tpot_;
    int64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0, cancelled_ = 0;
    std::array<int64_t, kDrafters> spec_rounds_by_{}, spec_drafted_by_{}, spec_accepted_by_{};  // totals: their sums
    std::map<std::string, int64_t> finished_;
    std::map<int, int64_t> http_status_;
    mutable std::deque<std::pair<Clock::time_point, int64_t>> recent_;  // (when, tokens) for tokens/s
};

}  // namespace strata::server
