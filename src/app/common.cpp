#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "runtime/cpu_expert_pool.h"
#include "runtime/expert_cache_advisor.h"
#include "runtime/expert_profile.h"
#include "runtime/ple_row_reader.h"
#include "runtime/routing_trace.h"
#include "runtime/speculation.h"

#if STRATA_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace strata::app {

namespace {

constexpr uint64_t kMaxTokensFileBytes = 64ull << 20;  // a token list larger than this is a mistake, not a prompt

// --vram-budget / --ram-budget: a size of at least 1M.
std::optional<uint64_t> budget_flag(const Args& args, const std::string& flag) {
    auto s = args.get(flag);
    if (!s) return std::nullopt;
    const auto bytes = parse_size(*s);
    if (!bytes || *bytes < (uint64_t{1} << 20))
        throw Error(flag + " expects a size of at least 1M (e.g. " + (flag == "--ram-budget" ? "64G" : "12G") +
                    "), got '" + *s + "'");
    return bytes;
}

}  // namespace

std::vector<int32_t> parse_token_list(const std::string& text, const std::string& source, bool allow_empty) {
    std::vector<int32_t> tokens;
    std::string item;
    auto flush = [&] {
        if (item.empty()) return;
        auto v = parse_int(item);
        if (!v) throw Error(source + ": '" + item + "' is not a token id (expected integers separated by spaces)");
        if (*v < std::numeric_limits<int32_t>::min() || *v > std::numeric_limits<int32_t>::max())
            throw Error(source + ": token id " + item + " is out of range");
        tokens.push_back(static_cast<int32_t>(*v));
        item.clear();
    };
    for (char c : text) {
        // Separators: whitespace and commas; brackets let a JSON array of ids through as well.
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == '[' || c == ']') {
            flush();
        } else {
            item += c;
            if (item.size() > 32) throw Error(source + ": '" + item.substr(0, 32) + "...' is not a token id");
        }
    }
    flush();
    if (tokens.empty() && !allow_empty) throw Error(source + ": no token ids given");
    return tokens;
}

void require_file(const std::string& path, const std::string& what) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(what + " '" + path + "': " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw Error(what + " '" + path + "' is not a regular file");
    if (::access(path.c_str(), R_OK) != 0) throw Error(what + " '" + path + "': " + std::strerror(errno));
}

std::string read_text_file(const std::string& path, const std::string& what) {
    require_file(path, what);
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in.good() && !in.eof()) throw Error("cannot read " + what + " '" + path + "'");
    return text.str();
}

std::vector<int32_t> read_tokens(const Args& args) {
    auto text = args.get("--tokens");
    auto file = args.get("--tokens-file");
    if (text && file) throw Error("give either --tokens or --tokens-file, not both");
    if (text) return parse_token_list(*text, "--tokens");
    if (!file) throw Error("no input tokens: give --tokens \"1 2 3\" or --tokens-file FILE");
    require_file(*file, "--tokens-file");
    struct stat st {};
    if (::stat(file->c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) > kMaxTokensFileBytes)
        throw Error("--tokens-file '" + *file + "' is larger than 64 MiB; that is not a token list");
    std::ifstream in(*file, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    if (in.bad()) throw Error("--tokens-file '" + *file + "': read error");
    return parse_token_list(buffer.str(), "--tokens-file '" + *file + "'");
}

void check_token_range(const std::vector<int32_t>& tokens, int64_t n_vocab) {
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            throw Error("token id " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                        " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
}

int thread_count(const Args& args) {
    auto n = args.get_int("--threads", 1, 4096);
    return n ? static_cast<int>(*n) : 0;
}

const std::vector<FlagSpec> kSpecFlags = {
    {"--spec", "N",
     "speculative decoding with windows of up to N drafted tokens (1..7), drafted by the model's MTP layer or by "
     "prompt lookup, as a measuring policy picks per round; the same tokens as without it (default: 4 when the model "
     "has an MTP layer, else off)"},
    {"--no-spec", "", "no speculative decoding"},
    {"--spec-min-p", "P", "an MTP draft stops at a token the draft layer gives less than P (0..1, default 0.3)"},
    {"--spec-drafter", "D", "auto (default: the policy picks per round), mtp or lookup (that drafter only)"},
    {"--spec-fixed", "", "no policy: every round drafts N tokens (for A/B runs; may be slower than plain)"},
};

std::optional<double> get_probability(const Args& args, const std::string& flag) {
    const auto text = args.get(flag);
    if (!text) return std::nullopt;
    char* end = nullptr;
    const double v = std::strtod(text->c_str(), &end);
    if (text->empty() || end != text->c_str() + text->size() || !(v >= 0.0 && v <= 1.0))
        throw Error(flag + " expects a probability from 0 to 1, got '" + *text + "'");
    return v;
}

SpecSettings spec_settings(const Args& args, const Model& model) {
    SpecSettings s;
    const auto spec = args.get_int("--spec", 0, SpeculationPolicy::kMaxDraft);
    if (spec && args.has("--no-spec")) throw Error("--spec and --no-spec contradict each other: give one");
    s.mtp = model.draft_residual_width() > 0;
    s.max_draft = args.has("--no-spec") ? 0 : spec.value_or(s.mtp ? kDefaultSpec : 0);
    if (const auto p = get_probability(args, "--spec-min-p")) s.min_p = static_cast<float>(*p);
    const std::string drafter = args.get_choice("--spec-drafter", {"auto", "mtp", "lookup"}).value_or("auto");
    if (drafter == "mtp" && !s.mtp) throw Error("--spec-drafter mtp: this model has no MTP layer this backend runs");
    s.mtp = s.mtp && drafter != "lookup";
    s.lookup = drafter != "mtp";
    s.adaptive = !args.has("--spec-fixed");
    return s;
}

void print_speculation_stats(const SpeculativeStats& st) {
    const auto lookup = static_cast<size_t>(Drafter::PromptLookup), mtp = static_cast<size_t>(Drafter::Mtp);
    std::fprintf(stderr,
                 "strata: speculation: %lld tokens in %lld verification rounds (%.2f tokens a round, %lld re-fed, "
                 "%lld committed); "
                 "drafts accepted %lld of %lld (%.3f): mtp %lld of %lld in %lld rounds (%lld layer passes), "
                 "lookup %lld of %lld in %lld rounds\n",
                 static_cast<long long>(st.emitted), static_cast<long long>(st.rounds - st.refeeds),
                 st.tokens_per_round(), static_cast<long long>(st.refeeds), static_cast<long long>(st.commits),
                 static_cast<long long>(st.accepted),
                 static_cast<long long>(st.drafted), st.acceptance(), static_cast<long long>(st.accepted_by[mtp]),
                 static_cast<long long>(st.drafted_by[mtp]), static_cast<long long>(st.rounds_by[mtp]),
                 static_cast<long long>(st.mtp_passes), static_cast<long long>(st.accepted_by[lookup]),
                 static_cast<long long>(st.drafted_by[lookup]), static_cast<long long>(st.rounds_by[lookup]));
    std::string costs;
    for (size_t w = 1; w < st.window_cost.size() && st.window_cost[w] > 0; ++w) {
        char buf[48];
        std::snprintf(buf, sizeof(buf), "%s%zu: %.3f", w > 1 ? ", " : "", w, st.window_cost[w] * 1e3);
        costs += buf;
    }
    std::fprintf(stderr, "strata: speculation: window cost in ms by tokens {%s}; MTP pass %.3f ms%s\n",
                 costs.c_str(), st.draft_pass_cost * 1e3,
                 st.mtp_retired ? "; MTP stopped (it cannot pay here)" : "");
    if (st.no_checkpoint)
        std::fprintf(stderr, "strata: speculation stopped: the model could not take a checkpoint of the sequence, "
                             "so a rejected draft could not be rolled back (CUDA: no device memory for the copy of "
                             "its state; raise --vram-budget)\n");
}

const std::vector<FlagSpec> kLoadFlags = {
    {"--threads", "N", "worker threads (default: all cores)"},
    {"--backend", "B", "cpu (default) or cuda (a build with -DSTRATA_CUDA=ON and an NVIDIA GPU)"},
    {"--vram-budget", "SIZE",
     "cuda: device memory strata may take, e.g. 12G (default: what is free less 5%); with --split one a stage, e.g. "
     "12G,24G"},
    {"--split", "auto|K1,K2,...",
     "cuda: split the layers over several GPUs, contiguous ranges in order (token table on the first, head on the "
     "last): auto by each card's budget, or K_i blocks on stage i; bit-exact with one card"},
    {"--devices", "LIST",
     "cuda, with --split: the GPU of each stage, e.g. 0,1 (default: 0,1,...; 0,0 puts two stages on one GPU)"},
    {"--ram-budget", "SIZE",
     "cuda: host memory the routed experts and the PLE table may pin, e.g. 64G (default: what is available)"},
    {"--expert-policy", "P",
     "cuda, experts in host RAM: how the VRAM expert cache adapts while decoding: lfu-decay (default: the trace "
     "replay's winner), lru, or static (keeps its warm set)"},
    {"--expert-profile", "FILE",
     "cuda, experts in host RAM: fill the cache at start from a routing profile (strata bench expert-cache "
     "--write-profile; strata serve adds the routing it saw to FILE when it stops)"},
    {"--cpu-experts", "N",
     "cuda, experts in host RAM: CPU expert workers that compute part of the misses (default: one per physical core "
     "less one; 0: the GPU reads every miss over PCIe)"},
    {"--cpu-share", "F",
     "cuda, experts in host RAM: the share of the misses the CPU workers compute, 0..1 (default: adapted while "
     "decoding)"},
    {"--no-cuda-graphs", "", "cuda: launch each window's kernels one by one instead of replaying a captured graph"},
    {"--ple-from-file", "",
     "cuda: read the PLE table's rows from the file with a row cache even when the table fits pinned RAM (the plan "
     "does this when it does not)"},
    {"--gdn-recurrence", "K",
     "cuda: the GDN recurrence kernel, auto (default: the faster), column or shuffle (same outputs)"},
    {"--kv-cache", "TYPE", "cuda: KV cache storage, f16 (default) or int8 (one fp16 scale per 64 values: about half)"},
    {"--qsa-union", "", "cuda: prompt windows attend over the union of 8 positions' QSA selections on tensor cores"},
    {"--prompt-chunk", "N",
     "cuda: tokens of a prompt window, 16..8192 (default: 4096 when every expert still fits in VRAM; with experts in "
     "host RAM the longest of 4096, 2048 and 1024 that keeps 3/4 of the expert cache, else 512; longer "
     "windows read each weight, and each expert missed in VRAM, once for more tokens, and take more device memory: "
     "strata info shows the plan)"},
    {"--no-cuda-blas", "",
     "cuda: dense products of prompt windows on strata's own GEMM instead of cuBLAS (for comparisons)"},
    {"--expert-ring", "N",
     "cuda, experts in host RAM: buffers of the ring that streams a prompt window's misses, 1, 2, 4 (default), 8 or "
     "16 (each holds an eighth of a layer's gate and up, or down: more let the copies run further ahead of the "
     "products, for fewer expert cache slots)"},
    {"--no-expert-stream", "",
     "cuda, experts in host RAM: prompt windows read missed experts over PCIe in place instead of streaming them "
     "into VRAM through a ring of copies (for comparisons)"},
    {"--routing-trace", "FILE",
     "cpu: write the experts every token routes to at every MoE layer to FILE (replay: strata bench expert-cache)"},
};

int expert_ring_flag(const Args& args) {
    const int buffers = static_cast<int>(args.get_int("--expert-ring", 1, 2 * kStreamRanges).value_or(0));
    if (buffers > 0 && (2 * kStreamRanges) % buffers != 0)
        throw Error("--expert-ring " + std::to_string(buffers) + ": the ring's buffers must divide the " +
                    std::to_string(2 * kStreamRanges) + " copies of a layer (1, 2, 4, 8 or 16)");
    return buffers;
}

LoadOptions load_options(const Args& args, bool read_threads) {
    LoadOptions o;
    if (read_threads) o.n_threads = thread_count(args);
    const auto backend = args.get_choice("--backend", {"cpu", "cuda"});
    o.backend = backend == "cuda" ? Backend::Cuda : Backend::Cpu;
    check_split_flags(args, o.backend);  // split_load.cpp; with --split, --vram-budget may give one size a stage
    if (!args.has("--split"))
        if (auto bytes = budget_flag(args, "--vram-budget")) o.vram_budget = static_cast<size_t>(*bytes);
    (void)budget_flag(args, "--ram-budget");  // checked here, read by plan_memory_for_load
    o.cuda_graphs = !args.has("--no-cuda-graphs");
    o.ple_from_file = args.has("--ple-from-file");
    o.ple_reader = ple_row_reader_factory(kPleRowCacheBytes);  // the plan may size the cache (plan_memory_for_load)
    const auto recurrence = args.get_choice("--gdn-recurrence", {"auto", "column", "shuffle"});
    o.gdn_recurrence = recurrence == "column"    ? GdnRecurrenceKernel::Column
                       : recurrence == "shuffle" ? GdnRecurrenceKernel::Shuffle
                                                 : GdnRecurrenceKernel::Auto;
    if (args.has("--kv-cache"))
        o.kv_cache = args.get_choice("--kv-cache", {"f16", "int8"}) == "int8" ? KvCacheType::Int8 : KvCacheType::F16;
    o.qsa_union = args.has("--qsa-union");
    o.prompt_chunk = args.get_int("--prompt-chunk", kMinPromptChunk, kMaxPromptChunk).value_or(0);
    o.cuda_blas = !args.has("--no-cuda-blas");
    o.stream_experts = !args.has("--no-expert-stream");
    o.stream_buffers = expert_ring_flag(args);
    if (o.backend == Backend::Cpu &&
        (args.has("--vram-budget") || args.has("--ram-budget") || args.has("--prompt-chunk") ||
         args.has("--no-cuda-blas") || args.has("--no-cuda-graphs") || args.has("--gdn-recurrence") ||
         args.has("--kv-cache") || o.qsa_union || args.has("--expert-policy") || args.has("--expert-profile") ||
         args.has("--cpu-experts") || args.has("--cpu-share") || o.ple_from_file || !o.stream_experts ||
         o.stream_buffers > 0))
        throw Error(
            "--vram-budget, --ram-budget, --prompt-chunk, --no-cuda-blas, --expert-policy, --expert-profile, "
            "--cpu-experts, --cpu-share, --no-expert-stream, --expert-ring, --no-cuda-graphs, --gdn-recurrence, "
            "--kv-cache, "
            "--qsa-union and --ple-from-file apply to --backend cuda only");
    (void)args.get_int("--cpu-experts", 0, 1024);
    if (auto text = args.get("--cpu-share")) {
        char* end = nullptr;
        const double share = std::strtod(text->c_str(), &end);
        if (text->empty() || *end != '\0' || !(share >= 0.0 && share <= 1.0))
            throw Error("--cpu-share must be a number between 0 and 1, got '" + *text + "'");
        o.experts.cpu_share = share;
    }
    if (auto policy = args.get("--expert-policy"))
        (void)parse_expert_cache_policy(*policy);  // a bad name fails here, before anything loads
    if (auto trace = args.get("--routing-trace")) {
        if (o.backend == Backend::Cuda)
            throw Error("--routing-trace records the CPU backend's routing only (use --backend cpu)");
        o.routing_trace = std::make_shared<RoutingTraceWriter>(*trace);
    }
    return o;
}

std::optional<ExpertProfile> expert_profile_flag(const Args& args, const gguf::File& file) {
    const auto path = args.get("--expert-profile");
    if (!path) return std::nullopt;
    if (!std::filesystem::exists(*path)) {
        std::fprintf(stderr,
                     "strata: %s does not exist yet: the expert cache starts empty (strata serve writes it "
                     "when it stops)\n",
                     path->c_str());
        return std::nullopt;
    }
    ExpertProfile profile = read_expert_profile(*path);
    const int64_t n_expert = file.get_u32(file.get_str("general.architecture") + ".expert_count");
    if (profile.n_expert != n_expert)
        throw Error(*path + ": a profile of " + std::to_string(profile.n_expert) + " experts a layer, but " +
                    file.path() + " has " + std::to_string(n_expert));
    return profile;
}

ExpertPlacement host_expert_placement(const Args& args, const gguf::File& file, const ExpertPlacement& planned,
                                      const std::vector<int64_t>& slots, const std::optional<ExpertProfile>& profile,
                                      const ExpertPlacement& flags, std::shared_ptr<HostExpertCompute>& workers,
                                      const std::string& where) {
    ExpertPlacement p = flags;  // --cpu-share
    p.in_host = true;
    p.cache_slots = slots;
    p.stream_ranges = planned.stream_ranges;
    p.stream_buffers = planned.stream_buffers;
    p.from_file = planned.from_file;
    if (profile) p.warm = warm_experts(*profile, slots);
    p.advisor =
        make_expert_cache_advisor(parse_expert_cache_policy(args.get("--expert-policy").value_or("lfu-decay")), slots);
    const int64_t n_workers = args.get_int("--cpu-experts", 0, 1024).value_or(-1);
    if (n_workers == 0 && p.from_file)
        throw Error(where +
                    "the routed experts do not fit the RAM budget, so they are read from the mapped file, "
                    "where only the CPU expert workers can compute a miss: drop --cpu-experts 0 (or raise "
                    "--ram-budget)");
    if (n_workers != 0 && !workers) {
        const std::string arch = file.get_str("general.architecture");
        workers = std::make_shared<CpuExpertPool>(
            CpuExpertPoolOptions{.n_workers = static_cast<int>(std::max<int64_t>(n_workers, 0)),
                                 .max_n_embd = file.get_u32(arch + ".embedding_length"),
                                 .max_n_ff = file.get_u32(arch + ".expert_feed_forward_length"),
                                 .max_expert_used = file.get_u32(arch + ".expert_used_count")});
    }
    p.cpu_workers = workers;
    return p;
}

std::optional<DeviceMemory> cuda_device_memory([[maybe_unused]] int device) {
#if STRATA_HAS_CUDA
    if (cuda::device_count() == 0 || device < 0 || device >= cuda::device_count()) return std::nullopt;
    const cuda::Context ctx({.device = device});
    return DeviceMemory{.name = ctx.info().name,
                        .free_bytes = ctx.info().free_bytes_at_start,
                        .multiprocessors = ctx.info().multiprocessors};
#else
    return std::nullopt;
#endif
}

MemoryPlanInputs plan_inputs(const Args& args, const LoadOptions& options, int64_t n_ctx, int64_t n_sequences,
                             int64_t checkpoints_per_sequence) {
    return {.ram_budget = budget_flag(args, "--ram-budget"),
            .n_ctx = std::max<int64_t>(n_ctx, 1),
            .n_sequences = std::max<int64_t>(n_sequences, 1),
            .checkpoints_per_sequence = std::max<int64_t>(checkpoints_per_sequence, 1),
            .kv_cache = options.kv_cache,
            .qsa_union = options.qsa_union,
            .prompt_chunk = options.prompt_chunk,
            .stream_experts = options.stream_experts,
            .stream_buffers = options.stream_buffers};
}

std::optional<MemoryPlan> plan_memory_for_load(const Args& args, const std::string& path, LoadOptions& options,
                                               int64_t n_ctx, int64_t n_sequences, int64_t checkpoints_per_sequence) {
    if (auto stages = plan_split_for_load(args, path, options, n_ctx, n_sequences, checkpoints_per_sequence))
        return stages->back().plan;
    if (options.backend != Backend::Cuda) return std::nullopt;
    MemoryPlanInputs in = plan_inputs(args, options, n_ctx, n_sequences, checkpoints_per_sequence);
    in.vram_budget = options.vram_budget;
    in.device = cuda_device_memory(options.cuda_device);
    // No budget and no device: loading says why there is no CUDA backend or device.
    if (in.vram_budget == 0 && !in.device) return std::nullopt;
    const std::unique_ptr<gguf::File> file = gguf::File::open(path);
    MemoryPlan plan = plan_device_memory(*file, in);
    std::fputs(("strata: " + plan.table()).c_str(), stderr);
    options.prompt_chunk = plan.prompt_window;
    options.experts.in_host = plan.placement().in_host;
    options.experts.cache_slots = plan.placement().cache_slots;
    options.experts.stream_ranges = plan.placement().stream_ranges;
    options.experts.stream_buffers = plan.placement().stream_buffers;
    if (plan.has_ple && !plan.ple_pinned) {
        options.ple_from_file = true;
        options.ple_reader = ple_row_reader_factory(plan.ple_row_cache_bytes);
    }
    if (!options.experts.in_host) {
        if (args.has("--expert-policy") || args.has("--expert-profile"))
            std::fprintf(stderr,
                         "strata: every expert fits in VRAM: --expert-policy and --expert-profile do nothing\n");
        return plan;
    }
    std::shared_ptr<HostExpertCompute> workers;
    options.experts = host_expert_placement(args, *file, plan.placement(), options.experts.cache_slots,
                                            expert_profile_flag(args, *file), options.experts, workers, "");
    return plan;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
    temp_path_ = path_ + ".tmp." + std::to_string(::getpid());
    file_ = std::fopen(temp_path_.c_str(), "wb");
    if (!file_) throw Error("cannot write '" + path_ + "': " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
    if (file_) {
        std::fclose(file_);
        std::remove(temp_path_.c_str());
    }
}

void AtomicFile::write(const void* data, size_t n_bytes) {
    STRATA_ASSERT(file_ != nullptr);
    if (n_bytes != 0 && std::fwrite(data, 1, n_bytes, file_) != n_bytes)
        throw Error("writing '" + path_ + "' failed: " + std::strerror(errno));
}

void AtomicFile::commit() {
    STRATA_ASSERT(file_ != nullptr);
    bool ok = std::fflush(file_) == 0;
    int err = ok ? 0 : errno;
    if (std::fclose(file_) != 0 && ok) {
        ok = false;
        err = errno;
    }
    file_ = nullptr;
    if (ok && std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        std::remove(temp_path_.c_str());
        throw Error("writing '" + path_ + "' failed: " + std::strerror(err));
    }
}

std::string format_bytes(uint64_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(n);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    char buf[32];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
    else
        std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
    return buf;
}

std::string json_escape(const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out;
}

}  // namespace strata::app
