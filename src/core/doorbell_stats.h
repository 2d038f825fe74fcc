// The process's count of device waits for a host doorbell that gave up (backend/cuda/doorbell_wait.h) and the last
// stall report: the backend adds to it when it checks a window, the server's /metrics reads it. Process-wide like the
// metric it feeds, so no layer between the two has to carry it; without a doorbell in use it stays at zero.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

struct DoorbellStats {
    int64_t timeouts_total = 0;
    std::string last_stall_report;  // "" until a wait gives up
};

// count waits gave up; report: the window's one-line stall report ("" keeps the last one).
void add_doorbell_timeouts(int64_t count, const std::string& report);
DoorbellStats doorbell_stats();

}  // namespace strata
