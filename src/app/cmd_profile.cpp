// `strata profile`: the routing profile of text files under a model (runtime/expert_profile.h): how often each layer
// routed to each expert. With experts in host RAM, `--expert-profile FILE` fills the VRAM expert cache with each
// layer's most-routed experts at start, so a profile of the text a user runs is the warm start DESIGN.md section 9
// describes. It runs on the CPU backend (the routing is the model's, the same on any backend up to rounding).
#include <cstdio>
#include <mutex>
#include <span>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/moe.h"
#include "runtime/expert_profile.h"
#include "tokenizer/tokenizer.h"

namespace strata::app {

namespace {

constexpr int64_t kMaxContext = 1 << 20;

// Counts every row's experts per layer.
class RoutingCounter final : public RoutingSink {
  public:
    void record(int64_t layer, int64_t n_expert, int64_t k, int64_t n_rows, const int32_t* ids, const float*) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (static_cast<int64_t>(profile_.counts.size()) <= layer)
            profile_.counts.resize(static_cast<size_t>(layer + 1));
        std::vector<uint64_t>& counts = profile_.counts[static_cast<size_t>(layer)];
        if (counts.empty()) counts.assign(static_cast<size_t>(n_expert), 0);
        for (int64_t i = 0; i < n_rows * k; ++i)
            if (ids[i] >= 0 && ids[i] < n_expert) ++counts[static_cast<size_t>(ids[i])];
        profile_.n_expert = n_expert;
    }
    ExpertProfile profile() {
        std::lock_guard<std::mutex> lock(mutex_);
        ExpertProfile p = profile_;
        p.n_layer = static_cast<int64_t>(p.counts.size());
        for (auto& layer : p.counts) layer.resize(static_cast<size_t>(p.n_expert), 0);  // blocks without experts
        return p;
    }

  private:
    std::mutex mutex_;
    ExpertProfile profile_;
};

int run_profile(const Args& args) {
    const std::vector<std::string>& files = args.positional();
    if (files.empty()) throw Error("profile: give one or more text files to route");
    const std::string out = args.get("--out").value_or("");
    if (out.empty()) throw Error("profile: give the profile to write with --out FILE");
    const int64_t ctx = args.get_int("--ctx", 1, kMaxContext).value_or(4096);
    const int64_t chunk = args.get_int("--chunk", 1, kMaxContext).value_or(512);
    const std::string model_path = model_path_or_default(args);
    const auto file = gguf::File::open(model_path);
    if (file->find("tokenizer.ggml.tokens") == nullptr)
        throw Error("profile: " + model_path + " has no tokenizer (tokenizer.ggml.* keys)");
    const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(*file);
    std::vector<std::vector<int32_t>> inputs;
    for (const std::string& path : files) {
        std::vector<int32_t> tokens = tokenizer->encode(read_text_file(path, "profile input"), /*parse_special=*/false);
        if (static_cast<int64_t>(tokens.size()) > ctx) tokens.resize(static_cast<size_t>(ctx));
        if (tokens.empty()) throw Error("profile: " + path + " holds no tokens");
        inputs.push_back(std::move(tokens));
    }
    auto counter = std::make_shared<RoutingCounter>();
    LoadOptions options{.n_threads = thread_count(args), .routing_trace = counter};
    auto model = load_model(model_path, options);
    int64_t total = 0;
    for (const std::vector<int32_t>& tokens : inputs) {
        check_token_range(tokens, model->info().n_vocab);
        auto seq = model->new_sequence(static_cast<int64_t>(tokens.size()));
        for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(chunk)) {
            const size_t n = std::min(static_cast<size_t>(chunk), tokens.size() - start);
            model->forward(*seq, std::span<const int32_t>(tokens).subspan(start, n), {});
        }
        total += static_cast<int64_t>(tokens.size());
    }
    const ExpertProfile profile = counter->profile();
    if (profile.n_layer == 0) throw Error("profile: " + model_path + " has no routed experts");
    write_expert_profile(out, profile);
    std::printf("profile: %lld tokens of %zu files through %lld MoE layers of %lld experts -> %s\n",
                static_cast<long long>(total), files.size(), static_cast<long long>(profile.n_layer),
                static_cast<long long>(profile.n_expert), out.c_str());
    return 0;
}

}  // namespace

Command profile_command() {
    return {
        .spec =
            {
                .name = "profile",
                .summary = "how often each layer routes to each expert on text files (an --expert-profile)",
                .usage = "strata profile [--model FILE.gguf] FILE... --out PROFILE [--ctx N] [--chunk N] [--threads N]",
                .flags = {{"--model", "FILE.gguf", kDefaultModelHelp},
                          {"--out", "PROFILE", "the routing profile to write (runtime/expert_profile.h's text format)"},
                          {"--ctx", "N", "tokens read from the start of each file (default 4096)"},
                          {"--chunk", "N", "tokens per forward call (default 512)"},
                          {"--threads", "N", "worker threads (default: all cores)"}},
                .positional_name = "FILE",
                .max_positional = 100000,
                .notes = "Each file is tokenized as plain text and fed as one sequence on the CPU backend. Give the "
                         "profile to\n--expert-profile (with --backend cuda and experts in host RAM) to start the VRAM "
                         "expert cache with each\nlayer's most-routed experts.",
            },
        .run = run_profile,
    };
}

}  // namespace strata::app
