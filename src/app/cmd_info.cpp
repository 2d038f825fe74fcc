// `strata info`: one screen about a GGUF: what model, which hyperparameters, what the tensors weigh, the vocabulary,
// and whether the memory plan for a context fits in this machine's available RAM.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

#include "app/commands.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/memory_info.h"
#include "format/gguf.h"
#include "model/model.h"
#include "runtime/memory_plan.h"
#include "runtime/stage_plan.h"

namespace strata::app {

namespace {

constexpr size_t kLargestShown = 5;
constexpr int64_t kDefaultCtx = 4096;

std::string scalar_text(const gguf::Value& v) {
    using gguf::ValueType;
    char buf[64];
    switch (v.type) {
        case ValueType::U8:
        case ValueType::U16:
        case ValueType::U32:
        case ValueType::U64:
            return std::to_string(v.u);
        case ValueType::I8:
        case ValueType::I16:
        case ValueType::I32:
        case ValueType::I64:
            return std::to_string(v.i);
        case ValueType::F32:
        case ValueType::F64:
            std::snprintf(buf, sizeof buf, "%g", v.f);
            return buf;
        case ValueType::BOOL:
            return v.b ? "true" : "false";
        case ValueType::STRING: {
            std::string s = v.str.size() > 60 ? v.str.substr(0, 57) + "..." : v.str;
            for (char& c : s)
                if (c == '\n' || c == '\r' || c == '\t') c = ' ';
            return "\"" + s + "\"";
        }
        case ValueType::ARRAY:
            break;
    }
    return "?";
}

std::string value_text(const gguf::Value& v) {
    if (v.type != gguf::ValueType::ARRAY) return scalar_text(v);
    constexpr size_t kShown = 8;
    std::string out = "[";
    for (size_t i = 0; i < v.arr.size() && i < kShown; ++i)
        out += (i ? ", " : "") + (v.arr[i].type == gguf::ValueType::ARRAY ? "[...]" : scalar_text(v.arr[i]));
    if (v.arr.size() > kShown) out += ", ... (" + std::to_string(v.arr.size()) + " entries)";
    return out + "]";
}

// llama.cpp's llama_ftype values for the types strata writes (display only).
const char* file_type_text(const gguf::Value& v) {
    if (v.type != gguf::ValueType::U32 && v.type != gguf::ValueType::I32) return "";
    switch (v.type == gguf::ValueType::U32 ? static_cast<int64_t>(v.u) : v.i) {
        case 0:
            return " (all F32)";
        case 1:
            return " (mostly F16)";
        case 7:
            return " (mostly Q8_0)";
        case 32:
            return " (mostly BF16)";
        default:
            return "";
    }
}

std::string shape_text(const gguf::TensorInfo& t) {
    std::string out = "[";
    for (int d = 0; d < t.n_dims; ++d) out += (d ? " x " : "") + std::to_string(t.ne[d]);
    return out + "]";
}

void print_vocabulary(const gguf::File& file, const std::string& arch) {
    std::string line = "vocabulary:   ";
    if (const auto* tokens = file.find("tokenizer.ggml.tokens"); tokens && tokens->type == gguf::ValueType::ARRAY)
        line += std::to_string(tokens->arr.size()) + " tokens";
    else if (auto n = file.get_u32_opt(arch + ".vocab_size"))
        line += std::to_string(*n) + " tokens (no token list)";
    else
        line += "none";
    const auto* model = file.find("tokenizer.ggml.model");
    const auto* pre = file.find("tokenizer.ggml.pre");
    line += ", model " + (model ? scalar_text(*model) : std::string("-"));
    line += ", pre-tokenizer " + (pre ? scalar_text(*pre) : std::string("-"));
    line += std::string(", chat template ") + (file.find("tokenizer.chat_template") ? "present" : "absent");
    std::printf("%s\n", line.c_str());
}

void print_tensors(const gguf::File& file) {
    struct TypeTotal {
        size_t count = 0;
        uint64_t bytes = 0;
    };
    std::map<std::string, TypeTotal> by_type;
    uint64_t total = 0;
    for (const auto& t : file.tensors()) {
        auto& tt = by_type[dtype_name(t.type)];
        ++tt.count;
        tt.bytes += t.n_bytes;
        total += t.n_bytes;
    }
    std::printf("tensors:      %zu, %s\n", file.tensors().size(), format_bytes(total).c_str());
    for (const auto& [type, tt] : by_type)
        std::printf("  %-8s %6zu tensors  %s\n", type.c_str(), tt.count, format_bytes(tt.bytes).c_str());

    std::vector<const gguf::TensorInfo*> largest;
    for (const auto& t : file.tensors()) largest.push_back(&t);
    const size_t shown = std::min(kLargestShown, largest.size());
    std::partial_sort(largest.begin(), largest.begin() + static_cast<std::ptrdiff_t>(shown), largest.end(),
                      [](const auto* a, const auto* b) { return a->n_bytes > b->n_bytes; });
    if (shown) std::printf("largest:\n");
    for (size_t i = 0; i < shown; ++i)
        std::printf("  %-40s %-6s %-24s %s\n", largest[i]->name.c_str(), dtype_name(largest[i]->type),
                    shape_text(*largest[i]).c_str(), format_bytes(largest[i]->n_bytes).c_str());
}

void print_memory_plan(const gguf::File& file, int64_t n_ctx) {
    std::printf("memory plan for %lld tokens of context:\n", static_cast<long long>(n_ctx));
    const std::vector<MemoryPlanItem> plan = plan_memory(file, n_ctx);
    int width = 5;
    uint64_t total = 0;
    for (const auto& item : plan) {
        width = std::max(width, static_cast<int>(item.what.size()));
        total += item.bytes;
    }
    for (const auto& item : plan)
        std::printf("  %-*s  %12s\n", width, item.what.c_str(), format_bytes(item.bytes).c_str());
    std::printf("  %-*s  %12s\n", width, "total", format_bytes(total).c_str());
    if (auto ram = available_ram_bytes())
        std::printf("this machine: %s available RAM: %s\n", format_bytes(*ram).c_str(),
                    total <= *ram ? "fits" : "does not fit");
    else
        std::printf("this machine: available RAM unknown (no MemAvailable in /proc/meminfo)\n");
}

int run_info(const Args& args) {
    auto flag_model = args.get("--model");
    if (flag_model && !args.positional().empty())
        throw Error("info: give the file either as FILE or as --model, not both");
    if (!flag_model && args.positional().empty())
        throw Error("info: which file? (usage: strata info FILE.gguf [--ctx N])");
    const std::string path = flag_model ? *flag_model : args.positional().front();
    auto ctx_flag = args.get_int("--ctx", 1, int64_t{1} << 30);
    require_file(path, "model file");

    auto file = gguf::File::open(path);
    const std::string arch = file->get_str("general.architecture");
    std::printf("file:         %s (GGUF v%u, %d file%s)\n", path.c_str(), file->version(), file->n_splits(),
                file->n_splits() == 1 ? "" : "s");
    std::printf("architecture: %s\n", arch.c_str());
    if (const auto* name = file->find("general.name")) std::printf("name:         %s\n", value_text(*name).c_str());
    if (const auto* ft = file->find("general.file_type"))
        std::printf("file type:    %s%s\n", value_text(*ft).c_str(), file_type_text(*ft));

    std::printf("hyperparameters:\n");
    const std::string prefix = arch + ".";
    for (const auto& kv : file->kvs())
        if (kv.key.rfind(prefix, 0) == 0)
            std::printf("  %-40s %s\n", kv.key.substr(prefix.size()).c_str(), value_text(kv.value).c_str());

    print_tensors(*file);
    print_vocabulary(*file, arch);

    int64_t n_ctx = kDefaultCtx;
    if (ctx_flag) {
        n_ctx = *ctx_flag;
    } else if (auto train = file->get_u32_opt(arch + ".context_length"); train && *train > 0) {
        n_ctx = std::min<int64_t>(kDefaultCtx, *train);
    }
    print_memory_plan(*file, n_ctx);
    // The CUDA plan needs no GPU: it is worked out for a card of --vram-budget (people plan a purchase with it), not
    // for the device this machine may have.
    if (args.has("--vram-budget") || args.has("--ram-budget") || args.has("--kv-cache") || args.has("--qsa-union") ||
        args.has("--prompt-chunk") || args.has("--split") || args.has("--no-expert-stream") ||
        args.has("--expert-ring")) {
        MemoryPlanInputs in{
            .n_ctx = n_ctx,
            .qsa_union = args.has("--qsa-union"),
            .prompt_chunk = args.get_int("--prompt-chunk", kMinPromptChunk, kMaxPromptChunk).value_or(0),
            .stream_experts = !args.has("--no-expert-stream"),
            .stream_buffers = expert_ring_flag(args)};
        const auto size_flag = [&](const char* flag, const char* example) -> std::optional<uint64_t> {
            const auto text = args.get(flag);
            if (!text) return std::nullopt;
            const auto size = parse_size(*text);
            if (!size || *size < (uint64_t{1} << 20))
                throw Error(std::string(flag) + " expects a size of at least 1M (e.g. " + example + "), got '" + *text +
                            "'");
            return size;
        };
        in.ram_budget = size_flag("--ram-budget", "64G");
        if (args.has("--kv-cache"))
            in.kv_cache =
                args.get_choice("--kv-cache", {"f16", "int8"}) == "int8" ? KvCacheType::Int8 : KvCacheType::F16;
        if (const auto split = args.get("--split")) {
            // One budget a card: --vram-budget 12G,24G (each card's plan; the RAM budget is each stage's as well).
            const StageSplit stages = parse_stage_split(*split);
            const std::string budgets = args.get("--vram-budget").value_or("");
            std::vector<MemoryPlanInputs> cards;
            for (size_t start = 0; start <= budgets.size();) {
                const size_t comma = std::min(budgets.find(',', start), budgets.size());
                const std::string one = budgets.substr(start, comma - start);
                const auto size = parse_size(one);
                if (!size || *size < (uint64_t{1} << 20))
                    throw Error("info --split: --vram-budget expects one size a card, like 12G,12G, got '" + budgets +
                                "'");
                cards.push_back(in);
                cards.back().vram_budget = *size;
                start = comma + 1;
            }
            const std::optional<ExpertProfile> profile = expert_profile_flag(args, *file);
            const ExpertProfile* routing = profile ? &*profile : nullptr;
            std::fflush(stdout);
            std::printf("%s", stages_table(plan_stages(*file, stages, cards, routing), routing).c_str());
            return 0;
        }
        const auto vram = size_flag("--vram-budget", "12G");
        if (!vram) throw Error("info: the CUDA memory plan needs --vram-budget SIZE (e.g. 12G)");
        in.vram_budget = *vram;
        std::fflush(stdout);  // what is printed so far stays in front of an error
        std::printf("%s", plan_device_memory(*file, in).table().c_str());
    }
    return 0;
}

}  // namespace

Command info_command() {
    return {
        .spec =
            {
                .name = "info",
                .summary = "show a GGUF's metadata, tensors, vocabulary and memory plan for this machine",
                .usage = "strata info FILE.gguf [--ctx N] [--vram-budget SIZE[,SIZE...] [--split auto|K1,K2,... "
                         "[--expert-profile FILE]] "
                         "[--ram-budget SIZE] [--kv-cache TYPE] [--qsa-union] [--prompt-chunk N] [--no-expert-stream] "
                         "[--expert-ring N]]",
                .flags =
                    {
                        {"--model", "FILE.gguf", "the file (instead of the positional FILE)"},
                        {"--ctx", "N",
                         "context length for the memory plan (default: min(4096, the model's "
                         "context_length))"},
                        {"--vram-budget", "SIZE",
                         "also print the CUDA memory plan for a card of SIZE (e.g. 12G; no GPU needed)"},
                        {"--ram-budget", "SIZE",
                         "host memory the plan may pin for experts and the PLE table (default: what is available)"},
                        {"--kv-cache", "TYPE", "the CUDA plan's KV cache storage: f16 (default) or int8"},
                        {"--qsa-union", "", "the CUDA plan includes the workspace of --qsa-union"},
                        {"--prompt-chunk", "N",
                         "the CUDA plan's prompt window in tokens (default: the plan's choice, as --backend cuda)"},
                        {"--no-expert-stream", "",
                         "the CUDA plan without the ring that streams prompt windows' misses"},
                        {"--expert-ring", "N", "the CUDA plan's ring of N buffers (1, 2, 4 (default), 8 or 16)"},
                        {"--expert-profile", "FILE",
                         "with --split auto: weigh each layer by this routing profile (strata profile, strata bench "
                         "expert-cache --write-profile) instead of uniform routing"},
                        {"--split", "auto|K1,K2,...",
                         "plan the trunk split over several cards, one --vram-budget each (e.g. 12G,12G): auto by "
                         "the budgets, or K_i blocks on card i (what --backend cuda --split runs)"},
                    },
                .positional_name = "FILE.gguf",
                .notes = "For a split model, give any of its NAME-0000i-of-0000n.gguf files. With --vram-budget, "
                         "the CUDA memory plan (where the dense weights, KV cache, expert cache, routed experts and "
                         "PLE table go) is printed as `strata run --backend cuda` would make it; an impossible plan "
                         "is an error (exit 2).",
            },
        .run = run_info,
    };
}

}  // namespace strata::app
