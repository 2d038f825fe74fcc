// `strata logits` (raw logits after each input token, for parity checks) and `strata generate` (token-id
// continuation; text comes with the tokenizer).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <random>
#include <span>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "model/model.h"
#include "runtime/mtp_drafter.h"
#include "runtime/sampler.h"
#include "runtime/speculative_decode.h"
#include "tokenizer/tokenizer.h"

namespace strata::app {

namespace {

static_assert(std::endian::native == std::endian::little, "logits files are little-endian float32");

constexpr int64_t kMaxGenerate = 1 << 20;

// Tokens per forward call: the whole input (prefill), one (incremental) or N (chunk=N).
int64_t tokens_per_call(const Args& args, int64_t n_tokens) {
    std::string mode = args.get("--mode").value_or("prefill");
    if (mode == "prefill") return n_tokens;
    if (mode == "incremental") return 1;
    if (mode.rfind("chunk=", 0) == 0) {
        auto n = parse_int(mode.substr(6));
        if (n && *n > 0) return std::min(*n, n_tokens);
    }
    throw Error("--mode expects prefill, incremental or chunk=N with N a positive integer, got '" + mode + "'");
}

int run_logits(const Args& args) {
    std::string model_path = args.require("--model");
    std::string out_path = args.require("--out");
    LoadOptions options = load_options(args);
    std::vector<int32_t> tokens = read_tokens(args);
    const auto n_tokens = static_cast<int64_t>(tokens.size());
    const int64_t per_call = tokens_per_call(args, n_tokens);
    require_file(model_path, "--model");
    plan_memory_for_load(args, model_path, options, n_tokens);

    auto model = load_model(model_path, options);
    const int64_t n_vocab = model->info().n_vocab;
    check_token_range(tokens, n_vocab);
    auto seq = model->new_sequence(n_tokens);

    // Rows stream to the file call by call, so incremental and chunked runs hold one call's logits at a time.
    AtomicFile out(out_path);
    std::vector<float> logits(static_cast<size_t>(per_call * n_vocab));
    for (int64_t start = 0; start < n_tokens; start += per_call) {
        const int64_t count = std::min(per_call, n_tokens - start);
        std::span<float> rows(logits.data(), static_cast<size_t>(count * n_vocab));
        model->forward(*seq, std::span<const int32_t>(tokens).subspan(start, count), rows);
        out.write(rows.data(), rows.size_bytes());
    }
    out.commit();
    std::printf("wrote %s: %lld x %lld float32 logits\n", out_path.c_str(), static_cast<long long>(n_tokens),
                static_cast<long long>(n_vocab));
    return 0;
}

int run_generate(const Args& args) {
    auto n_generate = args.get_int("-n", 1, kMaxGenerate);
    if (!n_generate) throw Error("generate: -n N is required (how many tokens to generate)");
    const auto text_prompt = args.get("--prompt");
    if (text_prompt && (args.has("--tokens") || args.has("--tokens-file")))
        throw Error("generate: give the prompt either as --prompt TEXT or as token ids, not both");
    std::vector<int32_t> prompt = text_prompt ? std::vector<int32_t>{} : read_tokens(args);
    const bool stop_at_eog = args.has("--stop-at-eog");
    LoadOptions options = load_options(args);
    const std::string model_path = model_path_or_default(args);
    // A text prompt is tokenized after loading; it has at most one token a byte.
    const int64_t prompt_bound = text_prompt ? static_cast<int64_t>(text_prompt->size()) : std::ssize(prompt);
    plan_memory_for_load(args, model_path, options, prompt_bound + *n_generate);

    auto model = load_model(model_path, options);
    const ModelInfo& info = model->info();
    // The tokenizer is needed for a text prompt, and for text output (without --ids) when the file has one.
    std::unique_ptr<Tokenizer> tokenizer;
    const auto file = gguf::File::open(model_path);
    if (text_prompt || (!args.has("--ids") && file->find("tokenizer.ggml.tokens") != nullptr))
        tokenizer = Tokenizer::from_gguf(*file);
    if (text_prompt) {
        prompt = tokenizer->encode(*text_prompt);
        if (prompt.empty()) throw Error("generate: --prompt is empty");
    }
    check_token_range(prompt, info.n_vocab);

    // Temperature-1 sampling from the whole distribution unless --greedy (the same sampler as `strata run`).
    Sampler sampler({.temperature = args.has("--greedy") ? 0.0f : 1.0f,
                     .top_k = 0,
                     .top_p = 1.0f,
                     .min_p = 0.0f,
                     .seed = args.get_u64("--seed").value_or(std::random_device{}())},
                    info.n_vocab);
    const SpecSettings spec = spec_settings(args, *model);
    const int64_t capacity = static_cast<int64_t>(prompt.size()) + *n_generate + spec.max_draft;
    auto seq = model->new_sequence(capacity);
    HostFloats logits = model->host_floats(static_cast<size_t>(info.n_vocab));
    std::optional<MtpDrafter> mtp;
    if (spec.max_draft > 0 && spec.mtp) mtp.emplace(*model, capacity);
    speculative_prefill(*model, *seq, mtp ? &*mtp : nullptr, prompt, logits);

    std::optional<StreamDecoder> decoder;
    if (tokenizer && !args.has("--ids")) decoder.emplace(*tokenizer);
    // Decode speed (after the prompt) on stderr, so that --spec and --no-spec compare in one run of each.
    const auto decode_start = std::chrono::steady_clock::now();
    const auto report_decode = [&](int64_t tokens) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - decode_start).count();
        std::fprintf(stderr, "strata: decode: %lld tokens in %.3f s (%.1f tokens/s)\n", static_cast<long long>(tokens),
                     s, s > 0 ? static_cast<double>(tokens) / s : 0.0);
    };
    if (spec.max_draft > 0) {
        // Drafts by the MTP layer or prompt lookup, verified in one batched pass a round (runtime/speculative_decode.h).
        int64_t i = 0;
        const SpeculativeStats st = speculative_decode(
            *model, *seq, logits, prompt, *n_generate,
            {.max_draft = spec.max_draft,
             .prompt_lookup = spec.lookup,
             .mtp = mtp ? &*mtp : nullptr,
             .mtp_min_p = spec.min_p,
             .adaptive = spec.adaptive},
            [&](std::span<const float> row, int64_t position) {
                return sampler.sample_at(row, static_cast<uint64_t>(position));
            },
            [&](int32_t token) {
                if (decoder) {
                    const std::string piece = decoder->push(token);
                    std::fwrite(piece.data(), 1, piece.size(), stdout);
                } else {
                    std::printf(i == 0 ? "%d" : " %d", token);
                }
                ++i;
                std::fflush(stdout);
                return !(stop_at_eog &&
                         std::find(info.eog_tokens.begin(), info.eog_tokens.end(), token) != info.eog_tokens.end());
            });
        if (decoder) {
            const std::string rest = decoder->flush();
            std::fwrite(rest.data(), 1, rest.size(), stdout);
        }
        std::printf("\n");
        report_decode(i);
        print_speculation_stats(st);
        return 0;
    }
    int64_t emitted = 0;
    for (int64_t i = 0; i < *n_generate; ++i) {
        // Keyed by position (Sampler::sample_at), so that --spec gives the same tokens for the same seed.
        int32_t token = sampler.sample_at(logits, static_cast<uint64_t>(prompt.size()) + static_cast<uint64_t>(i));
        if (decoder) {
            const std::string piece = decoder->push(token);
            std::fwrite(piece.data(), 1, piece.size(), stdout);
        } else {
            std::printf(i == 0 ? "%d" : " %d", token);
        }
        std::fflush(stdout);
        ++emitted;
        if (stop_at_eog && std::find(info.eog_tokens.begin(), info.eog_tokens.end(), token) != info.eog_tokens.end())
            break;
        if (i + 1 < *n_generate) model->forward(*seq, std::span<const int32_t>(&token, 1), logits, true);
    }
    if (decoder) {
        const std::string rest = decoder->flush();
        std::fwrite(rest.data(), 1, rest.size(), stdout);
    }
    std::printf("\n");
    report_decode(emitted);
    return 0;
}

const std::vector<FlagSpec> kTokenFlags = {
    {"--tokens", "\"1 2 3\"", "input token ids, separated by spaces or commas"},
    {"--tokens-file", "F", "read the input token ids from a file (same format)"},
};

}  // namespace

// The bundled model (assets/strata-code-19m.gguf, docs/bundled-model.md) in the working folder, else beside the build
// folder of this executable (build/strata -> assets/...), so `scripts/run.sh` and a run from the repository root both
// find it.
std::string default_model_path() {
    namespace fs = std::filesystem;
    const fs::path relative = kBundledModelPath;
    std::error_code ec;
    if (fs::is_regular_file(relative, ec)) return relative.string();
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        fs::path beside = exe.parent_path().parent_path() / relative;
        if (fs::is_regular_file(beside, ec)) return beside.string();
    }
    throw Error(std::string("no --model given and the bundled model ") + kBundledModelPath +
                " is not in the working folder or beside the build folder: run from the repository root or pass "
                "--model FILE.gguf");
}

Command logits_command() {
    std::vector<FlagSpec> flags = {{"--model", "FILE.gguf", "the model"}};
    flags.insert(flags.end(), kTokenFlags.begin(), kTokenFlags.end());
    flags.insert(flags.end(), {
                                  {"--out", "FILE.f32",
                                   "output: little-endian float32, row-major "
                                   "[n_tokens x n_vocab], the logits after each input token"},
                                  {"--mode", "M",
                                   "prefill (all tokens in one call, default), incremental (one "
                                   "token per call) or chunk=N (N tokens per call)"},
                              });
    flags.insert(flags.end(), kLoadFlags.begin(), kLoadFlags.end());
    return {
        .spec =
            {
                .name = "logits",
                .summary = "write the logits after each input token (parity checks against other engines)",
                .usage = "strata logits --model FILE.gguf (--tokens \"1 2 3\" | --tokens-file F) --out FILE.f32 "
                         "[--mode prefill|incremental|chunk=N] [--backend cpu|cuda] [--threads N] "
                         "[--vram-budget SIZE]",
                .flags = flags,
                .notes = "All three modes feed the same sequence state and give the same logits up to rounding.",
            },
        .run = run_logits,
    };
}

Command generate_command() {
    std::vector<FlagSpec> flags = {
        {"--model", "FILE.gguf", kDefaultModelHelp}};
    flags.insert(flags.end(), kTokenFlags.begin(), kTokenFlags.end());
    flags.insert(flags.end(),
                 {
                     {"--prompt", "TEXT", "a text prompt, tokenized as it is (no chat template; see strata run)"},
                     {"-n", "N", "how many tokens to generate (required)"},
                     {"--greedy", "", "always take the most likely token (ties: the lowest id)"},
                     {"--ids", "", "print the generated token ids on one line, space separated (default: the text)"},
                     {"--seed", "S", "seed of the sampler (default: random); same seed, same tokens"},
                     {"--stop-at-eog", "", "stop after an end-of-generation token (default: generate all N)"},
                 });
    flags.insert(flags.end(), kSpecFlags.begin(), kSpecFlags.end());
    flags.insert(flags.end(), kLoadFlags.begin(), kLoadFlags.end());
    return {
        .spec =
            {
                .name = "generate",
                .summary = "continue a prompt (token ids or raw text), greedy or sampled",
                .usage = "strata generate [--model FILE.gguf] (--tokens \"1 2 3\" | --tokens-file F | --prompt "
                         "TEXT) -n N [--greedy] [--ids] [--seed S] [--stop-at-eog] [--spec K | --no-spec] [--backend cpu|cuda]",
                .flags = flags,
                .notes = "Without --greedy the next token is drawn from softmax(logits) at temperature 1.\n"
                         "Without --ids the output is the decoded text, or the ids when the model has no vocabulary.",
            },
        .run = run_generate,
    };
}

std::string model_path_or_default(const Args& args) {
    if (auto m = args.get("--model")) {
        require_file(*m, "--model");
        return *m;
    }
    return default_model_path();
}

}  // namespace strata::app
