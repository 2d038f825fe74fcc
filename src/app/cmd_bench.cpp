// `strata bench`: prompt (pp) and decode (tg) throughput in the llama-bench style (DESIGN.md section 7): each test
// runs once to warm up, then -r times; the table or the JSON lines report the mean tokens/s and its spread.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "model/model.h"
#include "runtime/mtp_drafter.h"
#include "runtime/sampler.h"
#include "runtime/speculation.h"
#include "runtime/speculative_decode.h"
#include "tokenizer/tokenizer.h"

#if STRATA_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/doorbell.h"
#include "backend/cuda/gdn_bench.h"
#endif

namespace strata::app {

namespace {

constexpr int64_t kMaxTokens = 1 << 20;
// Context before a test (-d) is filled in calls of this many tokens, so its activations stay small; it is not timed.
constexpr int64_t kDepthChunk = 512;
// Fixed seed: the same ids on every run, so runs and engines compare on the same input.
constexpr uint64_t kTokenSeed = 0x5eed5eedULL;
// --window-costs: windows of 1 .. kMaxWindow tokens (the last token and up to SpeculationPolicy::kMaxDraft drafts,
// as verification runs them; CUDA captures one graph per size up to 8); each timed sample is the mean of this many.
constexpr int kMaxWindow = SpeculationPolicy::kMaxDraft + 1;
constexpr int kWindowsPerSample = 10;

struct BenchPlan {
    std::string model_path;
    int64_t n_prompt = 512;
    int64_t n_gen = 128;
    int64_t depth = 0;
    int repetitions = 5;
    std::vector<int> thread_counts;  // 0: all cores (resolved before running)
    bool json = false;
    int spec = 0;                    // --spec N: also greedy decoding with and without speculation after spec_prompt
    std::vector<int32_t> spec_prompt;  // --spec-prompt FILE's tokens (default: the pseudo-random prompt ids)
    bool window_costs = false;  // --window-costs: decode windows of 1..kMaxWindow tokens instead of pp/tg
    double acceptance = 0.90;   // --acceptance: the per-draft acceptance the window costs are projected at
    LoadOptions load;  // backend, VRAM budget, graphs (threads per run)
    const char* backend_name() const { return load.backend == Backend::Cuda ? "cuda" : "cpu"; }
};

struct ModelSummary {
    std::string file_name;
    uint64_t size_bytes = 0;  // tensor data, as llama-bench counts it
    uint64_t n_params = 0;
};

struct TestResult {
    std::string name;  // "pp512", "tg128@d8192"
    int64_t n_prompt = 0;
    int64_t n_gen = 0;
    int threads = 0;
    std::vector<double> samples;  // tokens/s of each timed run
    double mean = 0;
    double sd = 0;
    SpeculativeStats spec;  // speculation tests: summed over the timed runs
};

// "1,2,4" -> {1, 2, 4}, each in [1, max_value]; Error naming the flag on anything else.
std::vector<int64_t> parse_count_list(const std::string& flag, const std::string& text, int64_t max_value) {
    std::vector<int64_t> counts;
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const auto n = parse_int(item);
        if (!n || *n < 1 || *n > max_value)
            throw Error(flag + " expects positive integers separated by commas (e.g. 1,2), got '" + text + "'");
        counts.push_back(*n);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return counts;
}

std::vector<int> parse_thread_list(const std::string& text) {
    std::vector<int> counts;
    for (const int64_t n : parse_count_list("--threads", text, 4096)) counts.push_back(static_cast<int>(n));
    return counts;
}

BenchPlan read_plan(const Args& args) {
    BenchPlan plan;
    plan.model_path = model_path_or_default(args);
    plan.n_prompt = args.get_int("-p", 0, kMaxTokens).value_or(plan.n_prompt);
    plan.n_gen = args.get_int("-n", 0, kMaxTokens).value_or(plan.n_gen);
    plan.depth = args.get_int("-d", 0, kMaxTokens).value_or(0);
    plan.repetitions = static_cast<int>(args.get_int("-r", 1, 1000).value_or(plan.repetitions));
    plan.window_costs = args.has("--window-costs");
    if (plan.n_prompt == 0 && plan.n_gen == 0 && !plan.window_costs)
        throw Error("bench: -p 0 and -n 0 leave nothing to measure");
    if (auto t = args.get("--threads")) {
        plan.thread_counts = parse_thread_list(*t);
    } else {
        plan.thread_counts = {default_thread_count()};
    }
    plan.load = load_options(args, /*read_threads=*/false);
    plan.load.cuda_profile = args.has("--profile");
    if (plan.load.cuda_profile && plan.load.backend != Backend::Cuda)
        throw Error("bench: --profile applies to --backend cuda only");
    plan.load.cuda_ncu_replay = args.get_int("--ncu-replay", 1, int64_t{1} << 40).value_or(0);
    if (plan.load.cuda_ncu_replay > 0 && plan.load.backend != Backend::Cuda)
        throw Error("bench: --ncu-replay applies to --backend cuda only");
    plan.json = args.has("--json");
    plan.spec = static_cast<int>(args.get_int("--spec", 1, SpeculationPolicy::kMaxDraft).value_or(0));
    if (args.has("--spec-prompt") && plan.spec == 0) throw Error("bench: --spec-prompt needs --spec N");
    if (plan.spec > 0 && plan.n_gen == 0) throw Error("bench: --spec N times decoding: give -n N > 0");
    if (plan.window_costs && plan.spec > 0) throw Error("bench: --window-costs and --spec are separate runs: give one");
    if (args.has("--acceptance") && !plan.window_costs) throw Error("bench: --acceptance needs --window-costs");
    plan.acceptance = get_probability(args, "--acceptance").value_or(plan.acceptance);
    return plan;
}

ModelSummary summarize(const gguf::File& file) {
    ModelSummary s{.file_name = std::filesystem::path(file.path()).filename().string()};
    for (const auto& t : file.tensors()) {
        s.size_bytes += t.n_bytes;
        s.n_params += static_cast<uint64_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
    }
    return s;
}

std::vector<int32_t> pseudo_random_tokens(int64_t count, int64_t n_vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n_vocab - 1));
    std::vector<int32_t> ids(static_cast<size_t>(count));
    for (auto& id : ids) id = pick(rng);
    return ids;
}

// One test on one loaded model: what it feeds, untimed context first, then the timed part.
class TestRunner {
  public:
    TestRunner(const Model& model, SequenceState& seq, const BenchPlan& plan)
        : model_(model), seq_(seq), logits_(model.host_floats(static_cast<size_t>(model.info().n_vocab))) {
        const int64_t n_vocab = model.info().n_vocab;
        context_ = pseudo_random_tokens(plan.depth, n_vocab, kTokenSeed);
        // Another seed for the measured ids, so a prompt does not repeat its context.
        measured_ = pseudo_random_tokens(std::max({plan.n_prompt, plan.n_gen + 1, int64_t{kMaxWindow + 1}}), n_vocab,
                                         kTokenSeed + 1);
    }

    // Seconds for one prompt of n tokens in one forward call, after the context.
    double time_prompt(int64_t n) {
        start_fresh();
        const auto t0 = Clock::now();
        model_.forward(seq_, std::span<const int32_t>(measured_).first(static_cast<size_t>(n)), logits_, true);
        return seconds_since(t0);
    }

    // Seconds for n single-token decode steps after the context and a one-token prompt (untimed, like llama-bench's
    // first token).
    double time_decode(int64_t n) {
        start_fresh();
        model_.forward(seq_, std::span<const int32_t>(measured_).first(1), logits_, true);
        const auto t0 = Clock::now();
        for (int64_t i = 0; i < n; ++i) {
            const auto next = static_cast<size_t>(1 + i) % measured_.size();
            model_.forward(seq_, std::span<const int32_t>(measured_).subspan(next, 1), logits_, true);
        }
        return seconds_since(t0);
    }

    // Seconds for n greedy tokens after the context and `prompt` (untimed, fed in chunks), with speculation (windows
    // of up to `spec` drafts by the MTP layer where the model has one, and prompt lookup) or without (spec 0).
    double time_greedy(std::span<const int32_t> prompt, int64_t n, int spec, SpeculativeStats* stats) {
        seq_.reset();
        std::optional<MtpDrafter> mtp;
        if (spec > 0 && model_.draft_residual_width() > 0) mtp.emplace(model_, seq_.capacity());
        std::vector<int32_t> history = context_;
        history.insert(history.end(), prompt.begin(), prompt.end());
        speculative_prefill(model_, seq_, mtp ? &*mtp : nullptr, history, logits_, kDepthChunk);
        const auto t0 = Clock::now();
        if (spec > 0) {
            *stats += greedy_speculative_decode(model_, seq_, logits_, std::move(history), n,
                                                {.max_draft = spec, .mtp = mtp ? &*mtp : nullptr},
                                                [](int32_t) { return true; });
        } else {
            for (int64_t i = 0; i < n; ++i) {
                const int32_t t = argmax_lowest(std::span<const float>(logits_.data(), logits_.size()));
                if (i + 1 < n) model_.forward(seq_, std::span<const int32_t>(&t, 1), logits_, true);
            }
        }
        return seconds_since(t0);
    }

    // Seconds of a decode window of w = 1 .. kMaxWindow tokens after the context and a one-token prompt (untimed),
    // with every row's logits as verification takes them, each run from the same point (a checkpoint restored
    // before it, untimed): repetitions rounds over the sizes, interleaved so that drift on a shared machine hits
    // every size alike; a sample is the mean of kWindowsPerSample windows. With experts in host RAM, *hits gets each
    // size's (hits, lookups) over the timed windows.
    std::vector<std::vector<double>> time_windows(int repetitions, std::vector<std::pair<int64_t, int64_t>>* hits) {
        start_fresh();
        model_.forward(seq_, std::span<const int32_t>(measured_).first(1), logits_, true);
        const auto at = model_.checkpoint(seq_);
        const int64_t V = model_.info().n_vocab;
        HostFloats rows = model_.host_floats(static_cast<size_t>(kMaxWindow * V));
        std::vector<std::vector<double>> samples(kMaxWindow);
        hits->assign(kMaxWindow, {0, 0});
        const auto window = [&](int w) {
            model_.restore(seq_, *at);
            const auto ids = std::span<const int32_t>(measured_).subspan(1, static_cast<size_t>(w));
            const auto t0 = Clock::now();
            model_.forward(seq_, ids, std::span<float>(rows.data(), static_cast<size_t>(w * V)));
            return seconds_since(t0);
        };
        for (int w = 1; w <= kMaxWindow; ++w) window(w);  // warm-up; CUDA captures each size's graph
        for (int rep = 0; rep < repetitions; ++rep)
            for (int w = 1; w <= kMaxWindow; ++w) {
                const auto before = model_.expert_offload_stats();
                double seconds = 0;
                for (int i = 0; i < kWindowsPerSample; ++i) seconds += window(w);
                samples[static_cast<size_t>(w - 1)].push_back(seconds / kWindowsPerSample);
                if (const auto after = model_.expert_offload_stats(); after && before) {
                    (*hits)[static_cast<size_t>(w - 1)].first += after->hits - before->hits;
                    (*hits)[static_cast<size_t>(w - 1)].second += after->lookups - before->lookups;
                }
            }
        return samples;
    }

  private:
    using Clock = std::chrono::steady_clock;
    static double seconds_since(Clock::time_point t0) {
        return std::chrono::duration<double>(Clock::now() - t0).count();
    }
    void start_fresh() {
        seq_.reset();
        for (size_t start = 0; start < context_.size(); start += kDepthChunk) {
            const size_t count = std::min<size_t>(kDepthChunk, context_.size() - start);
            model_.forward(seq_, std::span<const int32_t>(context_).subspan(start, count), logits_, true);
        }
    }

    const Model& model_;
    SequenceState& seq_;
    HostFloats logits_;  // the model's own memory for them, as a server's decode loop would take
    std::vector<int32_t> context_;
    std::vector<int32_t> measured_;
};

// Mean and sample standard deviation (n - 1, as llama-bench; 0 for one sample).
void fill_stats(TestResult& r) {
    double sum = 0;
    for (double s : r.samples) sum += s;
    r.mean = sum / static_cast<double>(r.samples.size());
    double sq = 0;
    for (double s : r.samples) sq += (s - r.mean) * (s - r.mean);
    r.sd = r.samples.size() > 1 ? std::sqrt(sq / static_cast<double>(r.samples.size() - 1)) : 0.0;
}

std::string format_params(uint64_t n) {
    char buf[32];
    if (n >= 1000000000ULL)
        std::snprintf(buf, sizeof buf, "%.2f B", static_cast<double>(n) / 1e9);
    else if (n >= 1000000ULL)
        std::snprintf(buf, sizeof buf, "%.2f M", static_cast<double>(n) / 1e6);
    else
        std::snprintf(buf, sizeof buf, "%.2f K", static_cast<double>(n) / 1e3);
    return buf;
}

void print_json(const BenchPlan& plan, const ModelSummary& model, const TestResult& r) {
    std::string spec_json;
    if (r.spec.rounds > 0) {
        char buf[160];
        std::snprintf(buf, sizeof buf, ",\"spec_acceptance\":%.6g,\"spec_tokens_per_round\":%.6g,\"spec_drafted\":%lld",
                      r.spec.acceptance(), r.spec.tokens_per_round(), static_cast<long long>(r.spec.drafted));
        spec_json = buf;
    }
    std::string samples;
    for (size_t i = 0; i < r.samples.size(); ++i) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.6g", i ? "," : "", r.samples[i]);
        samples += buf;
    }
    std::printf(
        "{\"test\":\"%s\",\"tokens_per_s\":%.6g,\"sd\":%.6g,\"threads\":%d,\"model\":\"%s\",\"model_size\":%llu,"
        "\"model_params\":%llu,\"n_prompt\":%lld,\"n_gen\":%lld,\"depth\":%lld,\"backend\":\"%s\","
        "\"repetitions\":%d,\"samples\":[%s]%s}\n",
        r.name.c_str(), r.mean, r.sd, r.threads, json_escape(plan.model_path).c_str(),
        static_cast<unsigned long long>(model.size_bytes), static_cast<unsigned long long>(model.n_params),
        static_cast<long long>(r.n_prompt), static_cast<long long>(r.n_gen), static_cast<long long>(plan.depth),
        plan.backend_name(), plan.repetitions, samples.c_str(), spec_json.c_str());
    std::fflush(stdout);
}

// With --spec, a last column: drafts accepted and tokens per verification round of the speculation tests.
void print_table_header(bool spec) {
    std::printf("| model | size | params | backend | threads | test | t/s |%s\n", spec ? " spec |" : "");
    std::printf("| --- | ---: | ---: | --- | ---: | ---: | ---: |%s\n", spec ? " ---: |" : "");
    std::fflush(stdout);
}

std::string spec_cell(const TestResult& r) {
    if (r.spec.rounds == 0) return "-";
    char buf[96];
    std::snprintf(buf, sizeof buf, "acc %.3f, %.2f t/round", r.spec.acceptance(), r.spec.tokens_per_round());
    return buf;
}

void print_table_row(const BenchPlan& plan, const ModelSummary& model, const TestResult& r) {
    std::string cell;
    if (plan.spec > 0) cell.append(" ").append(spec_cell(r)).append(" |");
    std::printf("| %s | %s | %s | %s | %d | %s | %.2f ± %.2f |%s\n", model.file_name.c_str(),
                format_bytes(model.size_bytes).c_str(), format_params(model.n_params).c_str(), plan.backend_name(),
                r.threads, r.name.c_str(), r.mean, r.sd, cell.c_str());
    std::fflush(stdout);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --window-costs: each window size's median cost, against one token, and what it gives at the plan's per-draft
// acceptance (runtime/speculation.h project_windows), as a table or one JSON line per size.
void report_window_costs(const BenchPlan& plan, const ModelSummary& model, int threads,
                         const std::vector<std::vector<double>>& samples,
                         const std::vector<std::pair<int64_t, int64_t>>& hits) {
    std::vector<double> costs;
    for (const auto& s : samples) costs.push_back(median(s));
    const std::vector<WindowProjection> proj = project_windows(costs, plan.acceptance);
    const bool offload = std::any_of(hits.begin(), hits.end(), [](const auto& h) { return h.second > 0; });
    const auto hit_rate = [&](size_t i) { return hits[i].second > 0 ? 100.0 * hits[i].first / hits[i].second : 0.0; };
    if (plan.json) {
        for (size_t i = 0; i < proj.size(); ++i) {
            const WindowProjection& p = proj[i];
            char extra[64] = "";
            if (offload) std::snprintf(extra, sizeof extra, ",\"expert_hit_pct\":%.4g", hit_rate(i));
            std::printf("{\"test\":\"window%d@d%lld\",\"window\":%d,\"ms\":%.6g,\"cost_ratio\":%.6g,"
                        "\"acceptance\":%.6g,\"tokens_per_round\":%.6g,\"speedup\":%.6g,\"speedup_refeed\":%.6g,"
                        "\"threads\":%d,\"model\":\"%s\",\"depth\":%lld,\"backend\":\"%s\",\"repetitions\":%d%s}\n",
                        p.window, static_cast<long long>(plan.depth), p.window, 1e3 * costs[i], p.cost_ratio,
                        plan.acceptance, p.tokens, p.speedup, p.speedup_refeed, threads,
                        json_escape(plan.model_path).c_str(), static_cast<long long>(plan.depth),
                        plan.backend_name(), plan.repetitions, extra);
        }
        std::fflush(stdout);
        return;
    }
    std::printf("decode windows of %s (%s, %d threads) after %lld tokens: median of %d samples of %d windows, every "
                "row's logits; projected at %.2f acceptance per draft\n",
                model.file_name.c_str(), plan.backend_name(), threads, static_cast<long long>(plan.depth),
                plan.repetitions, kWindowsPerSample, plan.acceptance);
    std::printf("| window | ms | x 1 token | tokens / round | speedup | speedup, re-feed |%s\n",
                offload ? " expert hits |" : "");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |%s\n", offload ? " ---: |" : "");
    for (size_t i = 0; i < proj.size(); ++i) {
        const WindowProjection& p = proj[i];
        char extra[32] = "";
        if (offload) std::snprintf(extra, sizeof extra, " %.1f%% |", hit_rate(i));
        std::printf("| %d | %.3f | %.3f | %.2f | %.2fx | %.2fx |%s\n", p.window, 1e3 * costs[i], p.cost_ratio,
                    p.tokens, p.speedup, p.speedup_refeed, extra);
    }
    const WindowProjection best = best_window(proj), best_refeed = best_window(proj, /*refeed=*/true);
    const auto tokens = [](int w) { return std::to_string(w) + (w == 1 ? " token" : " tokens"); };
    std::printf(
        "best window at %.2f per draft: %s, %.2fx plain decoding with a commit step; %s, %.2fx restoring "
        "and re-feeding after a rejection (where the backend cannot keep a prefix); drafting not counted\n",
        plan.acceptance, tokens(best.window).c_str(), best.speedup, tokens(best_refeed.window).c_str(),
        best_refeed.speedup_refeed);
    std::fflush(stdout);
}

// The copy bandwidth of the device, measured before the model takes its memory (0 without CUDA).
double device_copy_bandwidth(const BenchPlan& plan, std::string* device_name) {
#if STRATA_HAS_CUDA
    cuda::Context ctx({.device = plan.load.cuda_device});
    *device_name = ctx.info().name;
    return cuda::measure_copy_bandwidth(ctx);
#else
    (void)plan;
    (void)device_name;
    return 0;
#endif
}

// A decode result next to its roofline: the bytes a token reads over the copy bandwidth.
void print_roofline(const BenchPlan& plan, const gguf::File& file, const TestResult& r, double bandwidth_gbs,
                    const std::string& device) {
    // The middle of the timed tokens: depth plus the prompt token plus half the generated ones.
    const DecodeTraffic traffic = decode_traffic(file, plan.depth + 1 + r.n_gen / 2, plan.load.kv_cache);
    const double roofline = bandwidth_gbs * 1e9 / static_cast<double>(traffic.total());
    std::printf("roofline (%s, copy %.0f GB/s): a token of %s reads %.1f MB (weights %.1f, KV and indexer keys %.1f) "
                "-> at most %.0f t/s; measured %.1f t/s = %.1f%% of it\n",
                device.c_str(), bandwidth_gbs, r.name.c_str(), static_cast<double>(traffic.total()) / 1e6,
                static_cast<double>(traffic.weights) / 1e6, static_cast<double>(traffic.cache) / 1e6, roofline,
                r.mean, 100.0 * r.mean / roofline);
    std::fflush(stdout);
}

// `strata bench doorbell` (issue 8, seed 000): the host/GPU ping-pong through mapped pinned memory for every way the
// device can read the flag, with and without backoff and write-combined memory: the seed's table.
int run_doorbell_bench(const Args& args) {
    const int64_t rounds = args.get_int("--rounds", 1, 10'000'000).value_or(10000);
#if STRATA_HAS_CUDA
    cuda::Context ctx{cuda::ContextOptions{}};
    std::printf("doorbell ping-pong on %s: %lld rounds per row, device waits bounded at 1 ms, host waits at 20 ms; "
                "cudaDevAttrHostNativeAtomicSupported = %d\n",
                ctx.info().name.c_str(), static_cast<long long>(rounds), cuda::host_native_atomics(ctx) ? 1 : 0);
    std::printf("| device read of the host flag | backoff | host memory | median us | p90 us | max us | device "
                "timeouts | host misses |\n");
    std::printf("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (const bool write_combined : {false, true})
        for (const cuda::DoorbellRead read : {cuda::DoorbellRead::Plain, cuda::DoorbellRead::Volatile,
                                              cuda::DoorbellRead::AcquireSystem, cuda::DoorbellRead::RelaxedRmw})
            for (const bool backoff : {false, true}) {
                const cuda::DoorbellResult r = cuda::doorbell_ping_pong(
                    ctx, {.read = read, .backoff = backoff, .write_combined = write_combined, .rounds = rounds});
                std::printf("| %s | %s | %s | %.2f | %.2f | %.1f | %lld / %lld | %lld |\n",
                            cuda::doorbell_read_name(read), backoff ? "nanosleep" : "none",
                            write_combined ? "mapped, write-combined" : "mapped", r.median_us, r.p90_us, r.max_us,
                            static_cast<long long>(r.device_timeouts), static_cast<long long>(r.rounds),
                            static_cast<long long>(r.host_misses));
                std::fflush(stdout);
            }
    return 0;
#else
    (void)rounds;
    throw Error("bench doorbell needs the CUDA backend (configure with -DSTRATA_CUDA=ON) and an NVIDIA GPU");
#endif
}

// `strata bench gdn-recurrence` (issue 8, seed 001): the column and shuffle kernels of the GDN recurrence on the same
// window (flash-next's 128 x 128 heads), bit for bit and timed: the seed's table.
int run_gdn_recurrence_bench(const Args& args) {
    const std::vector<int64_t> windows =
        args.has("--tokens") ? parse_count_list("--tokens", *args.get("--tokens"), kMaxTokens)
                             : std::vector<int64_t>{8192, 32768};
    const int64_t heads = args.get_int("--heads", 1, 65535).value_or(48);
    const int repeats = static_cast<int>(args.get_int("-r", 1, 1000).value_or(5));
#if STRATA_HAS_CUDA
    cuda::Context ctx{cuda::ContextOptions{}};
    // Flash-next pairs 48 value heads with 16 key heads; other counts keep that ratio when they can.
    const int64_t key_heads = heads % 3 == 0 ? heads / 3 : heads;
    std::printf("GDN recurrence on %s: %lld value heads / %lld key heads of 128 x 128, median of %d calls each; "
                "Auto runs %s\n",
                ctx.info().name.c_str(), static_cast<long long>(heads), static_cast<long long>(key_heads), repeats,
                cuda::gdn_recurrence_name(cuda::resolve_gdn_recurrence(cuda::GdnRecurrence::Auto)));
    std::printf("| tokens | column ms | shuffle ms | speed-up | mismatches |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: |\n");
    int64_t mismatches = 0;
    for (const int64_t tokens : windows) {
        const cuda::GdnRecurrenceBenchResult r = cuda::time_gdn_recurrences(
            ctx, {.tokens = tokens, .heads = heads, .key_heads = key_heads, .repeats = repeats});
        std::printf("| %lld | %.2f | %.2f | %.2fx | %lld / %lld |\n", static_cast<long long>(tokens), r.column_ms,
                    r.shuffle_ms, r.column_ms / r.shuffle_ms, static_cast<long long>(r.mismatches),
                    static_cast<long long>(r.compared));
        std::fflush(stdout);
        mismatches += r.mismatches;
    }
    if (mismatches == 0) return 0;
    // A failed check, not a user error: status 1.
    std::fprintf(stderr, "strata: bench gdn-recurrence: the kernels disagree on %lld values (state, FP32 or FP16 "
                 "outputs); they must be bit-identical\n", static_cast<long long>(mismatches));
    return 1;
#else
    (void)windows, (void)heads, (void)repeats;
    throw Error("bench gdn-recurrence needs the CUDA backend (configure with -DSTRATA_CUDA=ON) and an NVIDIA GPU");
#endif
}

int run_bench(const Args& args) {
    if (!args.positional().empty()) {
        const std::string& name = args.positional()[0];
        if (name == "doorbell") return run_doorbell_bench(args);
        if (name == "gdn-recurrence") return run_gdn_recurrence_bench(args);
        if (name == "qsa-union") return run_qsa_union_bench(args);
        if (name == "expert-cache") return run_expert_cache_bench(args);
        if (name == "cpu-experts") return run_cpu_experts_bench(args);
        throw Error("bench: unknown benchmark '" + name +
                    "' (known: doorbell, gdn-recurrence, qsa-union, expert-cache, cpu-experts; without a name, the "
                    "model benchmark)");
    }
    if (args.has("--trace") || args.has("--slots") || args.has("--policy") || args.has("--per-layer") ||
        args.has("--write-profile") || args.has("--warm-profile"))
        throw Error(
            "bench: --trace, --slots, --policy, --per-layer, --write-profile and --warm-profile apply to `strata "
            "bench expert-cache` only");
    if (args.has("--rounds")) throw Error("bench: --rounds applies to `strata bench doorbell` only");
    if (args.has("--tokens") || args.has("--heads"))
        throw Error("bench: --tokens and --heads apply to `strata bench gdn-recurrence` only");
    if (args.has("--positions") || args.has("--context"))
        throw Error("bench: --positions and --context apply to `strata bench qsa-union` only");
    BenchPlan plan = read_plan(args);
    // The CUDA memory plan (stderr) for the one sequence below; +1: the decode test's prompt.
    plan_memory_for_load(args, plan.model_path, plan.load,
                         plan.depth + std::max<int64_t>(plan.n_prompt + plan.n_gen, kMaxWindow) + 1);
    const auto file = gguf::File::open(plan.model_path);  // for the summary and the rooflines; the model maps its own
    const ModelSummary summary = summarize(*file);
    std::string device;
    const double bandwidth = plan.load.backend == Backend::Cuda ? device_copy_bandwidth(plan, &device) : 0.0;
    const std::string depth_suffix = plan.depth > 0 ? "@d" + std::to_string(plan.depth) : "";
    if (plan.window_costs) {
        for (const int threads : plan.thread_counts) {
            LoadOptions options = plan.load;
            options.n_threads = threads;
            auto model = load_model(plan.model_path, options);
            auto seq = model->new_sequence(plan.depth + 1 + kMaxWindow);
            TestRunner runner(*model, *seq, plan);
            std::vector<std::pair<int64_t, int64_t>> hits;
            const auto samples = runner.time_windows(plan.repetitions, &hits);
            report_window_costs(plan, summary, threads, samples, hits);
        }
        return 0;
    }
    if (!plan.json) print_table_header(plan.spec > 0);
    if (plan.spec > 0 && args.has("--spec-prompt")) {
        const std::string path = *args.get("--spec-prompt");
        plan.spec_prompt = Tokenizer::from_gguf(*file)->encode(read_text_file(path, "--spec-prompt"));
        if (plan.spec_prompt.empty()) throw Error("bench: --spec-prompt " + path + " is empty");
    }

    for (const int threads : plan.thread_counts) {
        LoadOptions options = plan.load;
        options.n_threads = threads;
        auto model = load_model(plan.model_path, options);
        // Planned up front, so a context that does not fit fails before anything runs. +1: the decode test's prompt.
        const int64_t spec_prompt = plan.spec > 0 ? std::max<int64_t>(std::ssize(plan.spec_prompt), plan.n_prompt) : 0;
        auto seq = model->new_sequence(plan.depth + std::max(plan.n_prompt, spec_prompt) + plan.n_gen + plan.spec + 1);
        TestRunner runner(*model, *seq, plan);

        struct Test {
            std::string name;
            int64_t n_prompt, n_gen;
            int greedy_spec = -1;  // >= 0: greedy decoding after the spec prompt, with windows of this many drafts
        };
        std::vector<Test> tests;
        if (plan.n_prompt > 0) tests.push_back({"pp" + std::to_string(plan.n_prompt) + depth_suffix, plan.n_prompt, 0});
        if (plan.n_gen > 0) tests.push_back({"tg" + std::to_string(plan.n_gen) + depth_suffix, 0, plan.n_gen});
        // Speculation needs the model's own picks fed back: greedy decoding of real text, without and with it.
        std::vector<int32_t> prompt = plan.spec_prompt;
        if (prompt.empty() && plan.spec > 0) prompt = pseudo_random_tokens(std::max<int64_t>(plan.n_prompt, 1),
                                                                            model->info().n_vocab, kTokenSeed + 1);
        if (plan.spec > 0) {
            const std::string tg = "tg" + std::to_string(plan.n_gen) + depth_suffix;
            tests.push_back({tg + " greedy", 0, plan.n_gen, 0});
            tests.push_back({tg + " spec" + std::to_string(plan.spec), 0, plan.n_gen, plan.spec});
        }

        for (const Test& test : tests) {
            TestResult r{.name = test.name, .n_prompt = test.n_prompt, .n_gen = test.n_gen, .threads = threads};
            const int64_t n_tokens = test.n_prompt > 0 ? test.n_prompt : test.n_gen;
            SpeculativeStats warmup;
            SpeculativeStats* spec_sink = &warmup;  // the timed runs' counts go in r.spec
            auto once = [&] {
                if (test.greedy_spec >= 0) return runner.time_greedy(prompt, n_tokens, test.greedy_spec, spec_sink);
                return test.n_prompt > 0 ? runner.time_prompt(n_tokens) : runner.time_decode(n_tokens);
            };
            once();  // warm-up: page faults, caches, first-call allocations
            spec_sink = &r.spec;
            for (int rep = 0; rep < plan.repetitions; ++rep) {
                const double seconds = once();
                r.samples.push_back(static_cast<double>(n_tokens) / std::max(seconds, 1e-9));
            }
            fill_stats(r);
            if (plan.json)
                print_json(plan, summary, r);
            else
                print_table_row(plan, summary, r);
            if (bandwidth > 0 && !plan.json && test.n_gen > 0) print_roofline(plan, *file, r, bandwidth, device);
        }
    }
    return 0;
}

}  // namespace

Command bench_command() {
    std::vector<FlagSpec> flags = {
        {"--model", "FILE.gguf",
         kDefaultModelHelp},
        {"-p", "P", "prompt test ppP: P tokens in one forward call (default 512; 0 skips it)"},
        {"-n", "N", "decode test tgN: N single-token steps (default 128; 0 skips it)"},
        {"-d", "DEPTH", "run both tests after DEPTH tokens of context (untimed; names get @dDEPTH)"},
        {"-r", "R", "timed repetitions of each test, after one warm-up run (default 5)"},
        {"--threads", "N[,N...]",
         "worker threads; a list runs every test for each (default: all cores)"},
        {"--profile", "",
         "cuda: time each kind of op (kernels launched one by one) and print the split per token"},
        {"--ncu-replay", "N",
         "cuda: bracket the N-th decode graph replay with the profiler's start/stop (ncu --profile-from-start off; "
         "scripts/gpu_ncu.sh)"},
        {"--rounds", "N", "bench doorbell: ping-pong rounds per variant (default 10000)"},
        {"--tokens", "N[,N...]", "bench gdn-recurrence: window lengths (default 8192,32768)"},
        {"--heads", "H", "bench gdn-recurrence: value heads (default 48, flash-next)"},
        {"--positions", "N", "bench qsa-union: prompt positions in the timed chunk (default 8192)"},
        {"--context", "N", "bench qsa-union: cells of context before the chunk's first position (default 24576)"},
        {"--trace", "FILE", "bench expert-cache: the routing trace to replay (written by --routing-trace)"},
        {"--slots", "N[,N...]", "bench expert-cache: expert slots per layer (default 16,32,64,128,256)"},
        {"--policy", "P[,P...]",
         "bench expert-cache: lru, lfu-decay[:DECAY[:EVERY[:SWAPS[:MIN]]]] (Strata's adaptive tier, default "
         "0.7:4:2:2), "
         "belady (the oracle bound), static (the warm set only, never a swap); default the first three"},
        {"--per-layer", "", "bench expert-cache: also print each layer's hit rate"},
        {"--warm-profile", "FILE",
         "bench expert-cache: start each cache from this profile's most-routed experts instead of empty (a "
         "profile from another run: one from the same trace knows its future)"},
        {"--write-profile", "FILE",
         "bench expert-cache: also write the trace's routing counts as an expert profile (runtime/expert_profile.h: "
         "what --warm-profile reads)"},
        {"--json", "", "one JSON object per line per test instead of the table"},
        {"--spec", "N",
         "also greedy decoding of -n tokens after the spec prompt without and with speculation (windows of up to N "
         "drafts, the drafter and length picked per round as on run), with a spec column: acceptance and tokens per "
         "verification round"},
        {"--spec-prompt", "FILE", "with --spec: the text the greedy tests continue (default: the -p pseudo-random ids)"},
        {"--window-costs", "",
         "instead of pp/tg: time decode windows of 1..8 tokens after -d DEPTH (as speculative verification runs them: "
         "every row's logits; CUDA: each size's captured graph), with each one's cost against one token and the "
         "decode speedup it gives at --acceptance"},
        {"--acceptance", "A",
         "with --window-costs: the chance each draft is accepted given the ones before it (default 0.90, vLLM's "
         "published per-draft figure for Flash-Next's MTP at n = 3)"},
    };
    // The model-loading flags but --threads, which bench takes as a list.
    for (const FlagSpec& f : kLoadFlags)
        if (f.name != "--threads") flags.push_back(f);
    return {
        .spec =
            {
                .name = "bench",
                .summary = "prompt and decode speed in tokens/s (llama-bench style)",
                .usage = "strata bench --model FILE.gguf [-p 512] [-n 128] [-d DEPTH] [-r 5] [--threads N[,N...]] "
                         "[--backend cpu|cuda] [--spec N [--spec-prompt FILE]] [--json]\n"
                         "       strata bench --model FILE.gguf --window-costs [--acceptance A] [-d DEPTH] [-r R] "
                         "[--backend cpu|cuda] [--json]\n"
                         "       strata bench doorbell [--rounds N]\n"
                         "       strata bench gdn-recurrence [--tokens N[,N...]] [--heads H] [-r R]\n"
                         "       strata bench qsa-union [--positions N] [--context N] [-r R] [--kv-cache f16|int8]\n"
                         "       strata bench expert-cache --trace FILE [--slots N,...] [--policy P,...] "
                         "[--model FILE.gguf] [--warm-profile FILE] [--write-profile FILE]\n"
                         "       strata bench cpu-experts --model FILE.gguf [--threads N[,N...]] [-r JOBS]",
                .flags = flags,
                .positional_name = "doorbell|gdn-recurrence|qsa-union|expert-cache|cpu-experts",
                .notes = "`strata bench doorbell` times the host/GPU ping-pong through mapped pinned memory for each way "
                         "the GPU can read the host's flag (CUDA only; exit status 2 without it).\n"
                         "`strata bench gdn-recurrence` times the GDN recurrence's column and shuffle kernels on the "
                         "same window and checks that their state and outputs agree bit for bit (CUDA only; exit "
                         "status 2 without it).\n"
                         "`strata bench qsa-union` times one prompt chunk of QSA attention at the Flash-Next shape, "
                         "per query (FP32) and over 8-position selection unions (CUDA only; exit status 2 without "
                         "it).\n"
                         "`strata bench expert-cache` replays a routing trace (--routing-trace FILE on any run) "
                         "against per-layer expert caches that start empty: hit % of routed experts, misses (computed "
                         "from host RAM) and swaps (experts copied into a slot) per token, over all layers; with "
                         "--model, the swaps in MiB from that file's expert size.\n"
                         "`strata bench cpu-experts` times the CPU expert workers on the model's routed experts: jobs "
                         "of 1, 2, 4 and 8 tokens, each token routed to random experts of a random layer, all computed "
                         "by the workers (--threads: worker counts, default one per physical core less one; -r: jobs "
                         "per size, default 200); prints us per job and GB/s of expert bytes read, in all and per "
                         "worker.\n"
                         "Token ids are pseudo-random within the vocabulary (fixed seed), so every run feeds the same "
                         "input. t/s is the mean over the repetitions, ± the sample standard deviation.",
            },
        .run = run_bench,
    };
}

}  // namespace strata::app
