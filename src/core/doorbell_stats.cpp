#include "core/doorbell_stats.h"

#include <mutex>

namespace strata {

namespace {

std::mutex g_mutex;
DoorbellStats g_stats;

}  // namespace

void add_doorbell_timeouts(int64_t count, const std::string& report) {
    std::lock_guard lock(g_mutex);
    g_stats.timeouts_total += count;
    if (!report.empty()) g_stats.last_stall_report = report;
}

DoorbellStats doorbell_stats() {
    std::lock_guard lock(g_mutex);
    return g_stats;
}

}  // namespace strata
