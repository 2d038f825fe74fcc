#include "server/metrics.h"

#include <cstdio>
#include <numeric>

#include "core/doorbell_stats.h"

namespace strata::server {

namespace {

constexpr double kRateWindowSeconds = 10.0;

std::string number(double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    return buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Histogram::observe(double v) {
    for (size_t i = 0; i < kBounds.size(); ++i)
        if (v <= kBounds[i]) ++counts[i];
    ++count;
    sum += v;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
    header(out, name.c_str(), "histogram", help.c_str());
    for (size_t i = 0; i < kBounds.size(); ++i)
        out += name + "_bucket{le=\"" + number(kBounds[i]) + "\"} " + std::to_string(counts[i]) + "\n";
    out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count) + "\n";
    out += name + "_sum " + number(sum) + "\n";
    out += name + "_count " + std::to_string(count) + "\n";
}

void Metrics::observe_time_to_first_token(double seconds) {
    std::lock_guard lock(mutex_);
    ttft_.observe(seconds);
}

void Metrics::observe_request(double e2e_seconds, double seconds_per_output_token) {
    std::lock_guard lock(mutex_);
    e2e_.observe(e2e_seconds);
    if (seconds_per_output_token >= 0) tpot_.observe(seconds_per_output_token);
}

void Metrics::add_prompt_tokens(int64_t computed, int64_t cached) {
    std::lock_guard lock(mutex_);
    prompt_tokens_ += computed + cached;
    cached_tokens_ += cached;
}

void Metrics::add_speculation(Drafter drafter, int64_t drafted, int64_t accepted) {
    std::lock_guard lock(mutex_);
    const auto d = static_cast<size_t>(drafter);
    ++spec_rounds_by_[d];
    spec_drafted_by_[d] += drafted;
    spec_accepted_by_[d] += accepted;
}

void Metrics::add_generated_tokens(int64_t n) {
    std::lock_guard lock(mutex_);
    generated_tokens_ += n;
    const auto now = Clock::now();
    recent_.emplace_back(now, n);
    while (!recent_.empty() && std::chrono::duration<double>(now - recent_.front().first).count() > kRateWindowSeconds)
        recent_.pop_front();
}

void Metrics::request_finished(const std::string& finished_reason) {
    std::lock_guard lock(mutex_);
    ++finished_[finished_reason];
}

void Metrics::request_cancelled() {
    std::lock_guard lock(mutex_);
    ++cancelled_;
}

void Metrics::http_response(int status) {
    std::lock_guard lock(mutex_);
    ++http_status_[status];
}

int64_t Metrics::cancelled() const {
    std::lock_guard lock(mutex_);
    return cancelled_;
}

double Metrics::tokens_per_second() const {
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    while (!recent_.empty() && std::chrono::duration<double>(now - recent_.front().first).count() > kRateWindowSeconds)
        recent_.pop_front();
    int64_t total = 0;
    for (const auto& [when, n] : recent_) total += n;
    return static_cast<double>(total) / kRateWindowSeconds;
}

std::string Metrics::render(const LoadGauges& load, const ExpertOffloadStats* offload) const {
    const double rate = tokens_per_second();
    std::lock_guard lock(mutex_);
    std::string out;
    header(out, "strata:num_requests_running", "gauge", "Requests in a slot (prompt or generation).");
    out += "strata:num_requests_running " + number(static_cast<double>(load.running)) + "\n";
    header(out, "strata:num_requests_waiting", "gauge", "Requests waiting for a free slot.");
    out += "strata:num_requests_waiting " + number(static_cast<double>(load.waiting)) + "\n";
    header(out, "strata:kv_cache_usage_perc", "gauge", "Fraction of the slots' context in use (1 = full).");
    out += "strata:kv_cache_usage_perc " + number(load.kv_usage) + "\n";
    header(out, "strata:generation_tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.");
    out += "strata:generation_tokens_per_second " + number(rate) + "\n";
    header(out, "strata:prompt_tokens_total", "counter", "Prompt tokens, computed and cached.");
    out += "strata:prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
    header(out, "strata:prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's earlier state.");
    out += "strata:prompt_tokens_cached_total " + std::to_string(cached_tokens_) + "\n";
    header(out, "strata:generation_tokens_total", "counter", "Generated tokens.");
    out += "strata:generation_tokens_total " + std::to_string(generated_tokens_) + "\n";
    const auto total = [](const std::array<int64_t, kDrafters>& by) {
        return std::accumulate(by.begin(), by.end(), int64_t{0});
    };
    header(out, "strata:spec_rounds_total", "counter",
           "Speculative verification rounds (a slot's window with drafts); tokens per round = (accepted + rounds) / "
           "rounds.");
    out += "strata:spec_rounds_total " + std::to_string(total(spec_rounds_by_)) + "\n";
    header(out, "strata:spec_draft_tokens_total", "counter", "Draft tokens verified.");
    out += "strata:spec_draft_tokens_total " + std::to_string(total(spec_drafted_by_)) + "\n";
    header(out, "strata:spec_accepted_tokens_total", "counter", "Draft tokens accepted (acceptance = accepted / draft).");
    out += "strata:spec_accepted_tokens_total " + std::to_string(total(spec_accepted_by_)) + "\n";
    // The same counts by drafter (prompt lookup, the MTP layer).
    struct ByDrafter {
        const char* name;
        const char* help;
        const std::array<int64_t, kDrafters>* counts;
    };
    const ByDrafter by_drafter[] = {
        {"strata:spec_drafter_rounds_total", "Speculative verification rounds by drafter (mtp, lookup).", &spec_rounds_by_},
        {"strata:spec_drafter_draft_tokens_total", "Draft tokens verified by drafter.", &spec_drafted_by_},
        {"strata:spec_drafter_accepted_tokens_total", "Draft tokens accepted by drafter.", &spec_accepted_by_}};
    for (const auto& [name, help, counts] : by_drafter) {
        header(out, name, "counter", help);
        for (size_t d = 0; d < counts->size(); ++d)
            out += std::string(name) + "{drafter=\"" + drafter_name(static_cast<Drafter>(d)) + "\"} " +
                   std::to_string((*counts)[d]) + "\n";
    }
    header(out, "strata:request_success_total", "counter", "Finished requests by finish reason.");
    for (const char* reason : {"stop", "length", "tool_calls"})
        if (!finished_.count(reason)) out += std::string("strata:request_success_total{finished_reason=\"") + reason + "\"} 0\n";
    for (const auto& [reason, n] : finished_)
        out += "strata:request_success_total{finished_reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
    header(out, "strata:requests_cancelled_total", "counter", "Requests stopped because the client went away.");
    out += "strata:requests_cancelled_total " + std::to_string(cancelled_) + "\n";
    header(out, "strata:http_responses_total", "counter", "HTTP responses by status code.");
    for (const auto& [status, n] : http_status_)
        out += "strata:http_responses_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
    header(out, "strata:doorbell_timeouts_total", "counter",
           "Device waits for a host doorbell that hit their bound (each such window was redone without waits, or "
           "its request failed).");
    out += "strata:doorbell_timeouts_total " + std::to_string(doorbell_stats().timeouts_total) + "\n";
    if (offload) {
        const ExpertOffloadStats& x = *offload;
        const std::pair<const char*, const char*> help[] = {
            {"strata:expert_cache_lookups_total", "(token, expert) pairs routed, experts in host RAM."},
            {"strata:expert_cache_hits_total", "Routed pairs served from a VRAM expert cache slot."},
            {"strata:expert_cpu_pairs_total", "Missed pairs computed by the CPU expert workers."},
            {"strata:expert_cache_swaps_total", "Experts copied into VRAM cache slots."},
            {"strata:expert_swap_bytes_total", "Bytes copied into VRAM cache slots."},
            {"strata:expert_pcie_bytes_total", "Expert bytes the GPU read over PCIe for misses."},
            {"strata:expert_cpu_bytes_total", "Expert bytes the CPU workers read from host RAM."},
            {"strata:expert_tokens_total", "Tokens that went through the expert cache."},
            {"strata:expert_streamed_windows_total",
             "Prompt windows that copied every expert no slot holds into VRAM (their bytes count as PCIe bytes)."}};
        const int64_t values[] = {x.lookups,    x.hits,      x.cpu_pairs, x.swaps,           x.swap_bytes,
                                  x.pcie_bytes, x.cpu_bytes, x.tokens,    x.streamed_windows};
        for (size_t i = 0; i < std::size(values); ++i) {
            header(out, help[i].first, "counter", help[i].second);
            out += std::string(help[i].first) + " " + std::to_string(values[i]) + "\n";
        }
        header(out, "strata:expert_cpu_share", "gauge", "Share of the missed experts the CPU workers own now.");
        out += "strata:expert_cpu_share " + number(x.cpu_share) + "\n";
    }
    ttft_.render(out, "strata:time_to_first_token_seconds", "Time from arrival to the first generated token.");
    tpot_.render(out, "strata:time_per_output_token_seconds", "Time per generated token after the first.");
    e2e_.render(out, "strata:e2e_request_latency_seconds", "Time from arrival to the last token.");
    return out;
}

}  // namespace strata::server
