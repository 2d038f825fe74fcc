// --split and --devices on the commands that load a model (issue 29): the stages' memory plans (runtime/stage_plan.h)
// made from the flags and the devices, printed, and turned into LoadOptions::split, which model/cuda/split_cuda.cpp
// loads: one CUDA model a stage, each with its device, budget and expert placement.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "runtime/cpu_expert_pool.h"
#include "runtime/expert_cache_advisor.h"
#include "runtime/expert_profile.h"
#include "runtime/ple_row_reader.h"

#if STRATA_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace strata::app {

namespace {

int visible_devices() {
#if STRATA_HAS_CUDA
    return cuda::device_count();
#else
    return 0;
#endif
}

}  // namespace

std::vector<uint64_t> parse_budget_list(const std::string& text) {
    std::vector<uint64_t> sizes;
    for (size_t start = 0; start <= text.size();) {
        const size_t comma = std::min(text.find(',', start), text.size());
        const auto size = parse_size(text.substr(start, comma - start));
        if (!size || *size < (uint64_t{1} << 20))
            throw Error("--vram-budget expects a size of at least 1M, or one a stage like 12G,12G, got '" + text + "'");
        sizes.push_back(*size);
        start = comma + 1;
    }
    return sizes;
}

void check_split_flags(const Args& args, Backend backend) {
    if (!args.has("--split") && !args.has("--devices")) return;
    if (backend != Backend::Cuda) throw Error("--split and --devices apply to --backend cuda only");
    if (!args.has("--split")) throw Error("--devices names the GPUs of a split: give --split auto or --split K1,K2");
    (void)parse_stage_split(*args.get("--split"));
    if (const auto devices = args.get("--devices")) (void)parse_device_list(*devices);
    if (const auto budgets = args.get("--vram-budget")) (void)parse_budget_list(*budgets);
}

std::optional<std::vector<StagePlan>> plan_split_for_load(const Args& args, const std::string& path,
                                                          LoadOptions& options, int64_t n_ctx, int64_t n_sequences,
                                                          int64_t checkpoints_per_sequence) {
    if (!args.has("--split")) return std::nullopt;
    check_split_flags(args, options.backend);
    StageSplit split = parse_stage_split(*args.get("--split"));
    std::vector<int> devices;
    if (const auto text = args.get("--devices")) devices = parse_device_list(*text);
    std::vector<uint64_t> budgets;
    if (const auto text = args.get("--vram-budget")) budgets = parse_budget_list(*text);
    // Stages: the block counts', else --devices', else one a budget, else one a visible device.
    const size_t n = !split.automatic    ? split.blocks.size()
                     : !devices.empty()  ? devices.size()
                     : budgets.size() > 1 ? budgets.size()
                                          : static_cast<size_t>(std::max(visible_devices(), 0));
    if (n < 2)
        throw Error("--split auto needs two stages or more: give --devices LIST (e.g. 0,1, or 0,0 for two stages on "
                    "one GPU) or one --vram-budget a card");
    if (devices.empty())
        for (size_t k = 0; k < n; ++k) devices.push_back(static_cast<int>(k));
    if (devices.size() != n)
        throw Error("--devices names " + std::to_string(devices.size()) + " devices for a split of " +
                    std::to_string(n) + " stages");
    if (budgets.size() == 1) budgets.assign(n, budgets[0]);
    if (!budgets.empty() && budgets.size() != n)
        throw Error("--vram-budget gives " + std::to_string(budgets.size()) + " sizes for a split of " +
                    std::to_string(n) + " stages (give one, or one a stage)");
    std::map<int, int> stages_on;  // device -> stages that share it
    for (const int d : devices) ++stages_on[d];
    std::vector<MemoryPlanInputs> cards;
    for (size_t k = 0; k < n; ++k) {
        MemoryPlanInputs in = plan_inputs(args, options, n_ctx, n_sequences, checkpoints_per_sequence);
        in.vram_budget = budgets.empty() ? 0 : budgets[k];
        in.device = cuda_device_memory(devices[k]);
        // Stages on one device share its free memory.
        if (in.device) in.device->free_bytes /= static_cast<uint64_t>(stages_on[devices[k]]);
        if (in.vram_budget == 0 && !in.device)
            throw Error("split stage " + std::to_string(k) + ": no CUDA device " + std::to_string(devices[k]) +
                        " to plan for; give --vram-budget (one a stage) or --devices with devices this machine has");
        cards.push_back(in);
    }
    const std::unique_ptr<gguf::File> file = gguf::File::open(path);
    // --expert-profile: "auto" weighs each layer by the routing it measured (and the caches start from it, below).
    const std::optional<ExpertProfile> profile = expert_profile_flag(args, *file);
    const ExpertProfile* routing = profile ? &*profile : nullptr;
    std::vector<StagePlan> stages = plan_stages(*file, split, cards, routing);
    // One prompt window for all (every stage cuts a call into the same windows): the shortest any stage planned.
    int64_t window = stages.front().plan.prompt_window;
    for (const StagePlan& s : stages) window = std::min(window, s.plan.prompt_window);
    if (std::any_of(stages.begin(), stages.end(), [&](const StagePlan& s) { return s.plan.prompt_window != window; })) {
        split = {.automatic = false, .blocks = {}};
        for (const StagePlan& s : stages) split.blocks.push_back(s.end_block - s.first_block);
        for (MemoryPlanInputs& c : cards) c.prompt_chunk = window;
        stages = plan_stages(*file, split, cards, routing);
    }
    std::fputs(("strata: " + stages_table(stages, routing)).c_str(), stderr);
    options.prompt_chunk = window;

    const std::string arch = file->get_str("general.architecture");
    const int64_t n_trunk = stages.back().end_block;
    std::shared_ptr<HostExpertCompute> workers;  // one pool for every stage: the host drives them one at a time
    options.split.clear();
    options.experts.in_host = false;
    for (size_t k = 0; k < stages.size(); ++k) {
        const StagePlan& s = stages[k];
        CudaStage stage{.device = devices[k],
                        // A shared device's budget is its share (the plan's); else the flag's, or 0: what is free.
                        .vram_budget = stages_on[devices[k]] > 1 || !budgets.empty()
                                           ? static_cast<size_t>(s.plan.vram_budget)
                                           : 0,
                        .first_block = s.first_block,
                        .end_block = s.end_block,
                        .experts = {}};
        const ExpertPlacement placement = s.plan.placement();
        if (placement.in_host) {
            // The stage's cache slots by trunk block (the plan counts its own blocks from 0).
            std::vector<int64_t> slots(static_cast<size_t>(n_trunk), 0);
            std::copy(placement.cache_slots.begin(), placement.cache_slots.end(), slots.begin() + s.first_block);
            stage.experts = host_expert_placement(args, *file, placement, slots, profile, options.experts, workers,
                                                  "split stage " + std::to_string(k) + ": ");
            options.experts.in_host = true;  // what the server asks (the profile it writes when it stops)
        }
        if (s.plan.has_ple && !s.plan.ple_pinned) {
            options.ple_from_file = true;
            options.ple_reader = ple_row_reader_factory(s.plan.ple_row_cache_bytes);
        }
        options.split.push_back(stage);
    }
    return stages;
}

}  // namespace strata::app
