// The split of a trunk over several cards (stage_plan.h).
#include "runtime/stage_plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/error.h"
#include "format/gguf.h"
#include "format/gguf_names.h"
#include "model/hybrid.h"

namespace strata {

StageSplit parse_stage_split(std::string_view text) {
    if (text == "auto") return {};
    StageSplit split{.automatic = false, .blocks = {}};
    const std::string what = "--split expects auto or block counts like 24,24, got '" + std::string(text) + "'";
    while (true) {
        const size_t comma = text.find(',');
        const std::string_view part = text.substr(0, comma);
        int64_t n = 0;
        const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), n);
        if (part.empty() || ec != std::errc() || end != part.data() + part.size() || n < 1) throw Error(what);
        split.blocks.push_back(n);
        if (comma == std::string_view::npos) break;
        text.remove_prefix(comma + 1);
    }
    if (split.blocks.size() < 2) throw Error(what + ": a split needs two stages or more");
    return split;
}

std::vector<int> parse_device_list(std::string_view text) {
    const std::string what = "--devices expects CUDA device indices like 0,1 (one may repeat), got '" +
                             std::string(text) + "'";
    std::vector<int> devices;
    while (true) {
        const size_t comma = text.find(',');
        const std::string_view part = text.substr(0, comma);
        int n = 0;
        const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), n);
        if (part.empty() || ec != std::errc() || end != part.data() + part.size() || n < 0 || n > 1023)
            throw Error(what);
        devices.push_back(n);
        if (devices.size() > 64) throw Error(what + ": at most 64 stages");
        if (comma == std::string_view::npos) break;
        text.remove_prefix(comma + 1);
    }
    return devices;
}

namespace {

// "auto": the block counts whose weights (each block's tensors, the token table with block 0, everything else
// outside the blocks with the last) put each card's cumulative share of the weights closest to its cumulative share
// of the budgets, at least one block a card.
std::vector<int64_t> automatic_split(const gguf::File& file, int64_t n_trunk, const std::vector<uint64_t>& budgets) {
    std::vector<double> weight(static_cast<size_t>(n_trunk), 0.0);
    for (const gguf::TensorInfo& t : file.tensors()) {
        if (is_ple_table(t.name)) continue;  // in host memory whatever the split
        const int64_t block = block_of(t.name);
        if (block >= n_trunk) continue;  // the MTP block: not loaded
        const size_t at = block >= 0                      ? static_cast<size_t>(block)
                          : t.name == "token_embd.weight" ? 0
                                                          : weight.size() - 1;
        weight[at] += static_cast<double>(t.n_bytes);
    }
    double total_weight = 0, total_budget = 0;
    for (const double w : weight) total_weight += w;
    for (const uint64_t b : budgets) total_budget += static_cast<double>(b);
    const auto cards = static_cast<int64_t>(budgets.size());
    std::vector<int64_t> counts;
    double budget_before = 0, weight_before = 0;
    int64_t first = 0;
    for (int64_t k = 0; k + 1 < cards; ++k) {
        budget_before += static_cast<double>(budgets[static_cast<size_t>(k)]);
        const double target = total_weight * budget_before / total_budget;
        // The cut after block `end - 1` nearest the target, leaving a block for each card after this one.
        int64_t end = first + 1;
        double cumulative = weight_before + weight[static_cast<size_t>(first)];
        while (end < n_trunk - (cards - 1 - k) &&
               std::fabs(cumulative + weight[static_cast<size_t>(end)] - target) <= std::fabs(cumulative - target)) {
            cumulative += weight[static_cast<size_t>(end)];
            ++end;
        }
        counts.push_back(end - first);
        weight_before = cumulative;
        first = end;
    }
    counts.push_back(n_trunk - first);
    return counts;
}

}  // namespace

namespace {

// Each stage planned as its own card; the first card's RAM budget is the host's, which the stages share.
std::vector<StagePlan> plan_counts(const gguf::File& file, const std::vector<int64_t>& counts,
                                   const std::vector<MemoryPlanInputs>& cards) {
    std::vector<StagePlan> stages;
    int64_t first = 0;
    uint64_t pinned = 0;  // the cards share one host: each stage may pin what the stages before it left
    for (size_t k = 0; k < cards.size(); ++k) {
        MemoryPlanInputs in = cards[k];
        in.first_block = first;
        in.end_block = first + counts[k];
        if (k > 0) in.ram_budget = stages[0].plan.ram_budget - std::min(stages[0].plan.ram_budget, pinned);
        try {
            stages.push_back({.first_block = first, .end_block = in.end_block, .plan = plan_device_memory(file, in)});
        } catch (const Error& e) {
            throw Error("stage " + std::to_string(k) + " (blocks " + std::to_string(first) + "-" +
                        std::to_string(in.end_block - 1) + "): " + e.what());
        }
        if (k > 0) stages.back().plan.ram_budget_source = "what the stages before this one leave of the host's";
        pinned += stages.back().plan.pinned_total();
        first = in.end_block;
    }
    return stages;
}

// A routing profile as what a layer's most-routed experts hold: mass[layer][i], the share of the layer's routing its
// i most-routed experts take (mass[layer][0] = 0); empty for a layer the profile saw no routing in.
std::vector<std::vector<double>> routing_mass(const ExpertProfile& profile) {
    std::vector<std::vector<double>> mass(profile.counts.size());
    for (size_t l = 0; l < profile.counts.size(); ++l) {
        std::vector<uint64_t> sorted = profile.counts[l];
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        double total = 0;
        for (const uint64_t c : sorted) total += static_cast<double>(c);
        if (total <= 0) continue;
        mass[l].push_back(0.0);
        for (const uint64_t c : sorted) mass[l].push_back(mass[l].back() + static_cast<double>(c) / total);
    }
    return mass;
}

// worst_held_routing over routing_mass's table (empty: uniform routing), so a search over cuts sorts the profile once.
double worst_held(const std::vector<StagePlan>& stages, const std::vector<std::vector<double>>& mass) {
    double worst = 1.0;
    for (const StagePlan& s : stages) {
        const MemoryPlan& p = s.plan;
        if (p.experts_in_vram || p.n_expert == 0) continue;
        uint64_t cache = 0, row = 0;
        for (const PlanLine& l : p.lines)
            if (l.place == PlanPlace::Vram && l.what.starts_with("expert cache")) cache += l.bytes;
        for (const uint64_t b : p.expert_bytes) row += b;
        if (row == 0) continue;
        // Slots of one expert in every layer: what the cache and the budget left beside it would hold.
        const double room = static_cast<double>(cache + (p.vram_budget - std::min(p.vram_budget, p.vram_total()))) /
                            static_cast<double>(row);
        for (size_t i = 0; i < p.expert_bytes.size(); ++i) {
            if (p.expert_bytes[i] == 0) continue;
            const size_t layer = static_cast<size_t>(s.first_block) + i;
            if (layer >= mass.size() || mass[layer].empty()) {
                worst = std::min(worst, room / static_cast<double>(p.n_expert));  // uniform routing
                continue;
            }
            const std::vector<double>& m = mass[layer];
            const double at = std::clamp(room, 0.0, static_cast<double>(m.size() - 1));
            const auto whole = static_cast<size_t>(at);
            const double held = whole + 1 < m.size()
                                    ? m[whole] + (at - static_cast<double>(whole)) * (m[whole + 1] - m[whole])
                                    : m[whole];
            worst = std::min(worst, held);
        }
    }
    return worst;
}

}  // namespace

double worst_held_routing(const std::vector<StagePlan>& stages, const ExpertProfile* profile) {
    return worst_held(stages, profile ? routing_mass(*profile) : std::vector<std::vector<double>>{});
}

std::vector<StagePlan> plan_stages(const gguf::File& file, const StageSplit& split,
                                   const std::vector<MemoryPlanInputs>& cards, const ExpertProfile* profile) {
    if (cards.size() < 2) throw Error("a split needs two cards or more (one --vram-budget each)");
    int64_t n_all = 0;
    const int64_t n_trunk = read_hybrid_info(file, &n_all).n_layer;
    if (static_cast<int64_t>(cards.size()) > n_trunk)
        throw Error("a split over " + std::to_string(cards.size()) + " cards needs as many blocks; this model has " +
                    std::to_string(n_trunk));
    std::vector<int64_t> counts = split.blocks;
    if (split.automatic) {
        std::vector<uint64_t> budgets;
        for (const MemoryPlanInputs& c : cards) {
            const uint64_t b = c.vram_budget > 0 ? c.vram_budget : c.device ? c.device->free_bytes : 0;
            if (b == 0) throw Error("--split auto needs each card's VRAM budget (--vram-budget A,B,...)");
            budgets.push_back(b);
        }
        counts = automatic_split(file, n_trunk, budgets);
        // Then blocks move across the cuts while that raises the routing share the worst-served layer keeps in VRAM
        // (each card keeps its own reserve, windows and workspaces, which a cut by weights alone does not see).
        const std::vector<std::vector<double>> mass =
            profile ? routing_mass(*profile) : std::vector<std::vector<double>>{};
        auto score = [&](const std::vector<int64_t>& c) {
            try {
                return worst_held(plan_counts(file, c, cards), mass);
            } catch (const Error&) {
                return -1.0;
            }
        };
        double best = score(counts);
        for (bool moved = true; moved;) {
            moved = false;
            for (size_t b = 0; b + 1 < counts.size(); ++b)
                for (const int64_t step : {int64_t{1}, int64_t{-1}}) {
                    std::vector<int64_t> c = counts;
                    c[b] -= step;
                    c[b + 1] += step;
                    if (c[b] < 1 || c[b + 1] < 1) continue;
                    const double s = score(c);
                    if (s > best) {
                        best = s;
                        counts = c;
                        moved = true;
                    }
                }
        }
    }
    if (counts.size() != cards.size())
        throw Error("--split names " + std::to_string(counts.size()) + " stages for " + std::to_string(cards.size()) +
                    " cards");
    int64_t sum = 0;
    for (const int64_t n : counts) sum += n;
    if (sum != n_trunk)
        throw Error("--split places " + std::to_string(sum) + " blocks, this model has " + std::to_string(n_trunk));
    return plan_counts(file, counts, cards);
}

std::string stages_table(const std::vector<StagePlan>& stages, const ExpertProfile* profile) {
    std::string out;
    bool in_host = false;
    for (size_t k = 0; k < stages.size(); ++k) {
        const StagePlan& s = stages[k];
        in_host = in_host || !s.plan.experts_in_vram;
        out += "stage " + std::to_string(k) + ": blocks " + std::to_string(s.first_block) + "-" +
               std::to_string(s.end_block - 1) + (k == 0 ? " and the token table" : "") +
               (k + 1 == stages.size() ? " and the head" : "") + "\n" + s.plan.table();
    }
    if (in_host) {
        char line[160];
        std::snprintf(line, sizeof line, "the worst-served layer keeps %.1f%% of its routing in VRAM (%s)\n",
                      100.0 * worst_held_routing(stages, profile),
                      profile ? "by the routing profile" : "uniform routing");
        out += line;
    }
    return out;
}

}  // namespace strata
