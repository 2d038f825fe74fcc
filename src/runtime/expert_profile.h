// Routing profiles (`--expert-profile FILE`): how often each expert of each MoE layer was routed to, so that a VRAM
// expert cache can start warm (issue 25) instead of empty. Written from a routing trace by `strata bench expert-cache
// --trace T --write-profile P`.
//
// Format, version 1: UTF-8 text, lines ending in "\n", fields separated by single spaces.
//   line 1:          strata-expert-profile 1
//   line 2:          layers N experts E              (1 <= N <= 4096, 1 <= E <= 65536)
//   lines 3..N+2:    L: C_0 C_1 ... C_{E-1}          (L = 0..N-1 in order; C_e the routing count of expert e, a
//                                                     decimal integer 0 <= C_e < 2^63)
// Nothing else: no blank or comment lines, no trailing spaces; the last line ends in "\n". A layer with no MoE (or no
// routing seen) has all counts 0.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/routing_trace.h"

namespace strata {

struct ExpertProfile {
    int64_t n_layer = 0;
    int64_t n_expert = 0;
    std::vector<std::vector<uint64_t>> counts;  // [layer][expert]
};

// Every token's routed experts counted, per layer.
ExpertProfile profile_from_trace(const RoutingTrace& trace);

std::string encode_expert_profile(const ExpertProfile& profile);
// Parses `text` (read from `name`, used in messages); Error with a one-line message naming the file, the line and
// what is wrong.
ExpertProfile parse_expert_profile(const std::string& text, const std::string& name);

void write_expert_profile(const std::string& path, const ExpertProfile& profile);  // Error when it cannot be written
ExpertProfile read_expert_profile(const std::string& path);                        // Error: unreadable or malformed

// The warm set of each layer l < slots.size() (ExpertPlacement::warm for its cache_slots): its min(slots[l], routed
// experts) most-routed experts, most routed first (equal counts: lower id first); experts never routed are left out,
// so the rest of the slots start empty. A layer past the profile's last (a trace ends at its last MoE layer) gets an
// empty set. The caller checks that the profile's n_expert is the model's.
std::vector<std::vector<int32_t>> warm_experts(const ExpertProfile& profile, std::span<const int64_t> slots);

}  // namespace strata
