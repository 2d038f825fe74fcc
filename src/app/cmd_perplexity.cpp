// `strata perplexity`: teacher-forced negative log-likelihood of text files under a model, file by file. It is how a
// kernel change that alters rounding (issue 8's QSA union attention) is judged on real text: run it once per arm and
// compare the per-file figures (tools/nll_compare.py gives the difference with a bootstrap interval over the files).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <span>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace strata::app {

namespace {

constexpr int64_t kMaxContext = 1 << 20;

struct FileScore {
    std::string path;
    int64_t scored = 0;     // predicted tokens
    double nll_sum = 0.0;   // natural log, summed over them
    std::vector<int32_t> argmax;  // the model's top token at each scored position (ties: lowest id)
};

// -log softmax(row)[target] in double, and the row's argmax.
std::pair<double, int32_t> token_nll(std::span<const float> row, int32_t target) {
    const auto top = std::max_element(row.begin(), row.end());
    double sum = 0.0;
    for (float v : row) sum += std::exp(static_cast<double>(v) - *top);
    const double nll = std::log(sum) - (static_cast<double>(row[static_cast<size_t>(target)]) - *top);
    return {nll, static_cast<int32_t>(top - row.begin())};
}

// Feeds the tokens in calls of `chunk` and scores token i + 1 from the logits after token i for i + 1 >= score_from.
FileScore score_tokens(const Model& model, const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t chunk, int64_t score_from) {
    const int64_t n = static_cast<int64_t>(tokens.size()), n_vocab = model.info().n_vocab;
    FileScore score{.path = path};
    auto seq = model.new_sequence(n);
    std::vector<float> logits(static_cast<size_t>(std::min(chunk, n) * n_vocab));
    // The last token predicts nothing, so it is never fed.
    for (int64_t start = 0; start < n - 1; start += chunk) {
        const int64_t count = std::min(chunk, n - 1 - start);
        std::span<float> rows(logits.data(), static_cast<size_t>(count * n_vocab));
        model.forward(*seq, std::span<const int32_t>(tokens).subspan(static_cast<size_t>(start), count), rows);
        for (int64_t i = 0; i < count; ++i) {
            const int64_t target_pos = start + i + 1;
            if (target_pos < score_from) continue;
            const auto [nll, top] = token_nll(rows.subspan(static_cast<size_t>(i * n_vocab), n_vocab),
                                              tokens[static_cast<size_t>(target_pos)]);
            score.nll_sum += nll;
            score.argmax.push_back(top);
            ++score.scored;
        }
    }
    return score;
}

void write_jsonl_line(std::FILE* out, const FileScore& s) {
    std::fprintf(out, "{\"file\":\"%s\",\"tokens\":%lld,\"nll_sum\":%.17g,\"argmax\":[", json_escape(s.path).c_str(),
                 static_cast<long long>(s.scored), s.nll_sum);
    for (size_t i = 0; i < s.argmax.size(); ++i) std::fprintf(out, i ? ",%d" : "%d", s.argmax[i]);
    std::fprintf(out, "]}\n");
}

int run_perplexity(const Args& args) {
    const std::vector<std::string>& files = args.positional();
    if (files.empty()) throw Error("perplexity: give one or more text files");
    const int64_t ctx = args.get_int("--ctx", 2, kMaxContext).value_or(4096);
    const int64_t chunk = args.get_int("--chunk", 1, kMaxContext).value_or(512);
    const int64_t score_from = args.get_int("--score-from", 1, kMaxContext).value_or(1);
    LoadOptions options = load_options(args);
    const std::string model_path = model_path_or_default(args);
    // Every input is read and tokenized before the model loads, so a bad file costs no load.
    const bool ids = args.has("--ids");
    std::unique_ptr<Tokenizer> tokenizer;
    if (!ids) {
        const auto file = gguf::File::open(model_path);
        if (file->find("tokenizer.ggml.tokens") == nullptr)
            throw Error("perplexity: " + model_path + " has no tokenizer (tokenizer.ggml.* keys); give token ids with "
                        "--ids");
        tokenizer = Tokenizer::from_gguf(*file);
    }
    std::vector<std::vector<int32_t>> inputs;
    for (const std::string& path : files) {
        const std::string text = read_text_file(path, "perplexity input");
        std::vector<int32_t> tokens =
            ids ? parse_token_list(text, path) : tokenizer->encode(text, /*parse_special=*/false);
        if (static_cast<int64_t>(tokens.size()) > ctx) tokens.resize(static_cast<size_t>(ctx));
        if (static_cast<int64_t>(tokens.size()) <= score_from)
            throw Error("perplexity: " + path + " has " + std::to_string(tokens.size()) +
                        " tokens, none of them at or after --score-from " + std::to_string(score_from));
        inputs.push_back(std::move(tokens));
    }
    std::FILE* jsonl = nullptr;
    if (auto path = args.get("--jsonl")) {
        jsonl = std::fopen(path->c_str(), "w");
        if (!jsonl) throw Error("perplexity: cannot write --jsonl " + *path);
    }

    int64_t longest = 1;
    for (const std::vector<int32_t>& tokens : inputs) longest = std::max(longest, std::ssize(tokens));
    plan_memory_for_load(args, model_path, options, longest);
    auto model = load_model(model_path, options);
    for (const auto& tokens : inputs) check_token_range(tokens, model->info().n_vocab);
    std::printf("| file | tokens scored | mean NLL | perplexity |\n| --- | ---: | ---: | ---: |\n");
    double total_nll = 0.0, mean_of_files = 0.0;
    int64_t total_scored = 0;
    for (size_t f = 0; f < files.size(); ++f) {
        const FileScore s = score_tokens(*model, files[f], inputs[f], chunk, score_from);
        const double mean = s.nll_sum / static_cast<double>(s.scored);
        std::printf("| %s | %lld | %.4f | %.3f |\n", files[f].c_str(), static_cast<long long>(s.scored), mean,
                    std::exp(mean));
        std::fflush(stdout);
        if (jsonl) write_jsonl_line(jsonl, s);
        total_nll += s.nll_sum;
        total_scored += s.scored;
        mean_of_files += mean;
    }
    if (jsonl && std::fclose(jsonl) != 0) throw Error("perplexity: writing --jsonl failed");
    std::printf("%zu files, %lld tokens scored: mean NLL %.4f per token (perplexity %.3f), mean of the files' means "
                "%.4f\n",
                files.size(), static_cast<long long>(total_scored), total_nll / static_cast<double>(total_scored),
                std::exp(total_nll / static_cast<double>(total_scored)),
                mean_of_files / static_cast<double>(files.size()));
    return 0;
}

}  // namespace

Command perplexity_command() {
    std::vector<FlagSpec> flags = {
        {"--model", "FILE.gguf", kDefaultModelHelp},
        {"--ctx", "N", "tokens read from the start of each file (default 4096; the rest is ignored)"},
        {"--chunk", "N", "tokens per forward call (default 512; the prompt path runs each call)"},
        {"--score-from", "K", "score tokens at positions K and later (default 1: every token after the first)"},
        {"--ids", "", "the files hold token ids (spaces, commas or newlines between them) instead of text"},
        {"--jsonl", "F", "also write one JSON line per file: file, tokens, nll_sum, argmax (for tools/nll_compare.py)"},
    };
    flags.insert(flags.end(), kLoadFlags.begin(), kLoadFlags.end());
    return {
        .spec =
            {
                .name = "perplexity",
                .summary = "teacher-forced NLL and perplexity of text files, file by file",
                .usage = "strata perplexity [--model FILE.gguf] FILE... [--ctx N] [--chunk N] [--score-from K] "
                         "[--ids] [--jsonl F] [--backend cpu|cuda]",
                .flags = flags,
                .positional_name = "FILE",
                .max_positional = 100000,
                .notes = "Each file is tokenized as plain text (special tokens are not parsed) and read from the "
                         "start in one sequence;\nthe NLL of token i+1 is taken from the logits after token i, in "
                         "nats. Ties of the argmax take the lowest id.",
            },
        .run = run_perplexity,
    };
}

}  // namespace strata::app
