// `strata bench expert-cache --trace FILE`: replays a routing trace (--routing-trace) against per-layer expert cache
// policies and sizes (runtime/expert_cache_policy.h) and prints, per policy and size, the hit rate and the swaps a
// token costs (experts, and bytes when --model names the file the trace came from). --write-profile P also writes the
// trace's routing counts as an expert profile (runtime/expert_profile.h); --warm-profile P starts every cache from
// P's warm set instead of empty.
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "runtime/expert_cache_policy.h"
#include "runtime/expert_profile.h"
#include "runtime/routing_trace.h"

namespace strata::app {

namespace {

std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

// Mean bytes of one routed expert (gate, up and down rows) over the layers of a model file.
double expert_bytes(const std::string& path, int64_t n_expert) {
    const auto file = gguf::File::open(path);
    uint64_t total = 0;
    int64_t layers = 0, expert_count = 0;
    for (const gguf::TensorInfo& t : file->tensors()) {
        const bool routed = t.name.find("_exps.weight") != std::string::npos && t.name.rfind("blk.", 0) == 0;
        if (!routed) continue;
        total += t.n_bytes;
        expert_count = t.ne[2];
        if (t.name.find("ffn_down_exps") != std::string::npos) ++layers;
    }
    if (layers == 0) throw Error("bench expert-cache: '" + path + "' has no routed expert tensors");
    if (expert_count != n_expert)
        throw Error("bench expert-cache: '" + path + "' has " + std::to_string(expert_count) +
                    " experts a layer, the trace " + std::to_string(n_expert) + "; not the model it came from");
    return static_cast<double>(total) / static_cast<double>(layers * n_expert);
}

}  // namespace

int run_expert_cache_bench(const Args& args) {
    const std::string trace_path = args.require("--trace");
    require_file(trace_path, "--trace");
    const RoutingTrace trace = read_routing_trace(trace_path);
    if (const auto out = args.get("--write-profile")) {
        write_expert_profile(*out, profile_from_trace(trace));
        std::printf("wrote expert profile %s (%lld layers, %lld experts a layer)\n", out->c_str(),
                    static_cast<long long>(trace.n_layer), static_cast<long long>(trace.n_expert));
    }
    std::vector<int64_t> slots;
    for (const std::string& item : split_list(args.get("--slots").value_or("16,32,64,128,256"))) {
        const auto n = parse_int(item);
        if (!n || *n < 0 || *n > 65536)
            throw Error("--slots expects slot counts from 0 to 65536 separated by commas (e.g. 64,128), got '" +
                        *args.get("--slots") + "'");
        slots.push_back(*n);
    }
    std::vector<ExpertCachePolicySpec> policies;
    std::vector<std::string> policy_names = split_list(args.get("--policy").value_or("lru,lfu-decay,belady"));
    for (const std::string& name : policy_names) policies.push_back(parse_expert_cache_policy(name));
    const auto model = args.get("--model");
    const double bytes = model ? expert_bytes(*model, trace.n_expert) : 0.0;
    const int64_t tokens = trace.tokens(0);
    if (tokens == 0) throw Error("bench expert-cache: trace '" + trace_path + "' has no tokens at layer 0");
    // Caches warmed from a profile instead of starting empty.
    std::optional<ExpertProfile> profile;
    if (const auto path = args.get("--warm-profile")) {
        require_file(*path, "--warm-profile");
        profile = read_expert_profile(*path);
        if (profile->n_layer != trace.n_layer || profile->n_expert != trace.n_expert)
            throw Error("bench expert-cache: profile '" + *path + "' has " + std::to_string(profile->n_layer) +
                        " layers of " + std::to_string(profile->n_expert) + " experts, the trace " +
                        std::to_string(trace.n_layer) + " of " + std::to_string(trace.n_expert));
    }
    std::map<int64_t, std::vector<std::vector<int32_t>>> warm;  // per slot count: each layer's warm set
    auto replay = [&](const ExpertCachePolicySpec& policy, int64_t s, int64_t l) {
        if (!profile) return replay_expert_cache(policy, s, trace.layer(l));
        auto it = warm.find(s);
        if (it == warm.end())
            it = warm.emplace(s, warm_experts(*profile, std::vector<int64_t>(static_cast<size_t>(trace.n_layer), s)))
                     .first;
        return replay_expert_cache(policy, s, trace.layer(l), it->second[static_cast<size_t>(l)]);
    };

    std::printf("trace %s: %lld tokens, %lld layers, %lld experts a layer, top-%lld", trace_path.c_str(),
                static_cast<long long>(tokens), static_cast<long long>(trace.n_layer),
                static_cast<long long>(trace.n_expert), static_cast<long long>(trace.k));
    if (model) std::printf(", %.2f MiB an expert", bytes / (1 << 20));
    if (profile) std::printf("; caches warmed from %s", args.get("--warm-profile")->c_str());
    std::printf("\n\n| policy | slots/layer | hit %% | misses/token | swaps/token |%s\n",
                model ? " swap MiB/token |" : "");
    std::printf("|---|---:|---:|---:|---:|%s\n", model ? "---:|" : "");
    for (size_t p = 0; p < policies.size(); ++p) {
        for (const int64_t s : slots) {
            CacheReplayCounts total;
            for (int64_t l = 0; l < trace.n_layer; ++l) total += replay(policies[p], s, l);
            const double per_token = 1.0 / static_cast<double>(tokens);
            std::printf("| %s | %lld | %.1f | %.2f | %.2f |", policy_names[p].c_str(), static_cast<long long>(s),
                        100.0 * total.hit_rate(), static_cast<double>(total.lookups - total.hits) * per_token,
                        static_cast<double>(total.swaps) * per_token);
            if (model) std::printf(" %.1f |", static_cast<double>(total.swaps) * per_token * bytes / (1 << 20));
            std::printf("\n");
        }
    }
    if (args.has("--per-layer")) {
        std::printf("\nhit %% per layer (rows: policy and slots; columns: layers 0..%lld)\n",
                    static_cast<long long>(trace.n_layer - 1));
        for (size_t p = 0; p < policies.size(); ++p)
            for (const int64_t s : slots) {
                std::printf("%s %lld:", policy_names[p].c_str(), static_cast<long long>(s));
                for (int64_t l = 0; l < trace.n_layer; ++l)
                    std::printf(" %.1f", 100.0 * replay(policies[p], s, l).hit_rate());
                std::printf("\n");
            }
    }
    return 0;
}

}  // namespace strata::app
