// Routing traces (`--routing-trace FILE`, replayed by `strata bench expert-cache --trace FILE`): the experts each
// token routed to at each MoE layer, and their combine weights.
//
// Format, version 1, little-endian:
//   header, 32 bytes: "STRTRACE" (8 bytes), u32 version = 1, u32 n_layer, u32 n_expert (1..65536), u32 k (experts
//                     per token, 1..n_expert), u64 reserved = 0
//   records until the end of the file, one per MoE call: u32 layer (< n_layer), u32 n_rows (>= 1), then
//                     n_rows * k u16 expert ids (distinct within a row, < n_expert), then n_rows * k f16 weights
//                     (finite), row-major.
// A layer's tokens are its records' rows in file order (a CLI run feeds one sequence, so they are that sequence's
// positions). n_layer is written when the trace is closed; a trace whose writer never closed it reads as an error.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "model/moe.h"
#include "runtime/expert_cache_policy.h"

namespace strata {

inline constexpr uint32_t kRoutingTraceVersion = 1;

// Opens the file at construction (Error if it cannot be written) and writes records as the model reports them.
class RoutingTraceWriter : public RoutingSink {
  public:
    explicit RoutingTraceWriter(std::string path);
    ~RoutingTraceWriter() override;  // closes (errors there are lost; call close() to see them)
    void record(int64_t layer, int64_t n_expert, int64_t k, int64_t n_rows, const int32_t* ids,
                const float* weights) override;
    // Writes n_layer into the header and closes; Error on a write failure. Idempotent.
    void close();
    int64_t tokens() const;  // rows recorded at layer 0

  private:
    std::string path_;
    std::FILE* file_ = nullptr;
    mutable std::mutex mutex_;
    uint32_t n_expert_ = 0, k_ = 0, n_layer_ = 0;
    int64_t layer0_rows_ = 0;
    bool failed_ = false;
    std::vector<uint16_t> buffer_;
};

struct RoutingTrace {
    int64_t n_layer = 0;
    int64_t n_expert = 0;
    int64_t k = 0;
    std::vector<std::vector<uint16_t>> ids;   // per layer: tokens * k
    std::vector<std::vector<float>> weights;  // per layer: tokens * k
    int64_t tokens(int64_t layer) const { return static_cast<int64_t>(ids[static_cast<size_t>(layer)].size()) / k; }
    LayerRouting layer(int64_t l) const { return {.n_expert = n_expert, .k = k, .ids = ids[static_cast<size_t>(l)]}; }
};

// Reads and checks a whole trace; Error with a one-line message naming the file and what is wrong.
RoutingTrace read_routing_trace(const std::string& path);

// The bytes of a version-1 trace of these routes (tests build traces with it).
std::vector<uint8_t> encode_routing_trace(const RoutingTrace& trace);

}  // namespace strata
