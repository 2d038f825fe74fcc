// A model's trunk split over several GPUs (issue 29; DESIGN.md section 9): contiguous ranges of blocks, one stage a
// card, the token table on the first and the head (and MTP block) on the last; each stage is planned as its own card
// (runtime/memory_plan.h with first_block / end_block): its dense weights, KV and states, window buffers and an
// expert cache for its own layers. Plain arithmetic over the file like the one-card plan, so `strata info FILE
// --split auto --vram-budget 12G,12G` prints it on a machine without GPUs. What a split runs on (one CUDA context,
// stream, window graphs and expert cache a stage, the residual handed on per window) is model/cuda/split_cuda.cpp;
// app/split_load.cpp turns these plans into its LoadOptions::split.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/expert_profile.h"
#include "runtime/memory_plan.h"

namespace strata {

// --split: "auto" (blocks placed by each card's budget) or "K1,K2,...": K_i blocks on card i, in order.
struct StageSplit {
    bool automatic = true;
    std::vector<int64_t> blocks;  // when !automatic: blocks a stage, at least 1 each
};
// Throws a one-line Error for anything else (empty parts, zero, non-numbers, a single stage).
StageSplit parse_stage_split(std::string_view text);

// --devices: CUDA device indices, comma-separated, in stage order ("0,1"; one may repeat: "0,0" puts two stages on one
// device). Throws a one-line Error for anything else (empty parts, negative or non-numbers, more than 64).
std::vector<int> parse_device_list(std::string_view text);

struct StagePlan {
    int64_t first_block = 0, end_block = 0;  // the file's trunk blocks [first_block, end_block)
    MemoryPlan plan;
};

// One MemoryPlanInputs a card (its budget; first_block / end_block are set here; the first card's RAM budget is the
// host's, which the stages share: each may pin what the stages before it left). "auto" cuts the blocks where each
// card's share of the weights (its blocks' tensors, the token table on the first, the head on the last) comes
// closest to its share of the budgets, then moves blocks across the cuts while that raises the smallest share of a
// layer's experts any stage's cache holds (with uniform routing, its share of the routing mass). A split whose block
// counts do not add up to the trunk, or a stage that does not fit its card, is a one-line Error naming the stage.
// With a routing profile (--expert-profile), "auto" weighs each layer by its measured routing: the share its
// most-routed experts that fit the stage's cache take (worst_held_routing).
std::vector<StagePlan> plan_stages(const gguf::File& file, const StageSplit& split,
                                   const std::vector<MemoryPlanInputs>& cards, const ExpertProfile* profile = nullptr);

// The smallest share of a layer's routing that its stage's VRAM holds, over every layer with experts in host RAM (1
// where all fit): the stage's expert cache and the budget left beside it, in slots of one expert a layer (fractional),
// filled by the layer's most-routed experts in `profile`; without one, or for a layer it saw no routing in, slots over
// the experts a layer (uniform routing).
double worst_held_routing(const std::vector<StagePlan>& stages, const ExpertProfile* profile = nullptr);

// The stages' plans one after another, each under a line "stage i: blocks a-b".
// With experts in host RAM, a last line: worst_held_routing's share.
std::string stages_table(const std::vector<StagePlan>& stages, const ExpertProfile* profile = nullptr);

}  // namespace strata
