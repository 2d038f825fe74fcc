#include "runtime/stop_strings.h"

#include <algorithm>

namespace strata {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
    for (auto& s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

void StopMatcher::reset() {
    pending_.clear();
    stopped_ = false;
    matched_.clear();
}

std::string StopMatcher::push(std::string_view text) {
    if (stopped_) return {};
    pending_.append(text);
    // Earliest match wins; at the same start, the longer stop string (it covers more of what must not be shown).
    size_t best = std::string::npos;
    for (const std::string& s : stops_) {
        const size_t at = pending_.find(s);
        if (at == std::string::npos) continue;
        if (at < best || (at == best && s.size() > matched_.size())) {
            best = at;
            matched_ = s;
        }
    }
    if (best != std::string::npos) {
        std::string out = pending_.substr(0, best);
        pending_.clear();
        stopped_ = true;
        return out;
    }
    // Hold back the longest suffix that could still grow into a stop string. Everything shown earlier had no such
    // suffix, so a later match can only start inside pending_.
    size_t hold = 0;
    for (const std::string& s : stops_) {
        for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
            if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
                hold = len;
                break;
            }
        }
    }
    std::string out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out;
}

std::string StopMatcher::flush() {
    std::string out;
    if (!stopped_) out.swap(pending_);
    pending_.clear();
    return out;
}

}  // namespace strata
