// `strata run` (one prompt in, streamed text out, then timings) and `strata chat` (an interactive conversation).
//
// Both load the model with a progress bar (stderr, only on a terminal), take the tokenizer and chat template from the
// GGUF, render prompts through the template, and generate with runtime/sampler.h: streamed through a StreamDecoder
// (whole UTF-8 characters only) and a StopMatcher (stop strings never shown), ending at an end-of-generation token, a
// stop string, -n tokens, a full context, or Ctrl-C (chat: the reply stops, the conversation stays).
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "model/model.h"
#include "runtime/mtp_drafter.h"
#include "runtime/sampler.h"
#include "runtime/speculative_decode.h"
#include "runtime/stop_strings.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::app {

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr int64_t kDefaultContext = 4096;
constexpr int64_t kMaxContext = int64_t{1} << 24;

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---------------------------------------------------------------------------------------------------------------
// Flags shared by run and chat.

const std::vector<FlagSpec> kModelFlags = {
    {"--model", "FILE.gguf", kDefaultModelHelp},
    {"--ctx", "N",
     "context size in tokens (default: run, the prompt plus -n; chat, 4096 or the training context if smaller)"},
    {"--system", "TEXT", "a system message at the start of the conversation"},
    {"--think", "on|off", "enable_thinking for templates that read it (default: the template's own)"},
};

const std::vector<FlagSpec> kSamplingFlags = {
    {"--greedy", "", "always take the most likely token (ties: the lowest id); same as --temp 0"},
    {"--temp", "T", "temperature (default 0.8; 0 is greedy)"},
    {"--top-k", "K", "keep the K most likely tokens (default 40; 0: off)"},
    {"--top-p", "P", "keep the smallest set of tokens whose probabilities sum to P (default 0.95; 1: off)"},
    {"--min-p", "P", "keep tokens with probability >= P times the top one's (default 0.05; 0: off)"},
    {"--repeat-penalty", "R", "divide positive / multiply negative logits of recent tokens by R (default 1: off)"},
    {"--repeat-last-n", "N", "how many recent tokens the penalties look at (default 64; 0: off; -1: all)"},
    {"--presence-penalty", "P", "subtract P from the logit of every recent token (default 0)"},
    {"--frequency-penalty", "F", "subtract F times its count from each recent token's logit (default 0)"},
    {"--logit-bias", "ID=B,...", "add B to token ID's logit (B may be -inf to ban it)"},
    {"--seed", "S", "seed of the sampler (default: random); same seed, same text"},
    {"--stop", "TEXT", "stop when the text contains TEXT (not shown); may be repeated", true},
};

std::optional<float> get_float(const Args& args, const std::string& flag) {
    auto v = args.get(flag);
    if (!v) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const float f = std::strtof(v->c_str(), &end);
    if (v->empty() || end != v->c_str() + v->size() || errno == ERANGE || !std::isfinite(f))
        throw Error(flag + " expects a number, got '" + *v + "'");
    return f;
}

std::vector<std::pair<int32_t, float>> parse_logit_bias(const std::string& text) {
    std::vector<std::pair<int32_t, float>> out;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t comma = std::min(text.find(',', start), text.size());
        const std::string item = text.substr(start, comma - start);
        const size_t eq = item.find('=');
        const std::string id_text = item.substr(0, eq);
        const std::string bias_text = eq == std::string::npos ? "" : item.substr(eq + 1);
        const int64_t id = parse_int(id_text).value_or(-1);
        float bias = -std::numeric_limits<float>::infinity();
        bool ok = eq != std::string::npos && id >= 0 && id <= std::numeric_limits<int32_t>::max();
        if (ok && bias_text != "-inf") {
            char* end = nullptr;
            bias = std::strtof(bias_text.c_str(), &end);
            ok = !bias_text.empty() && end == bias_text.c_str() + bias_text.size() && std::isfinite(bias);
        }
        if (!ok)
            throw Error("--logit-bias expects ID=BIAS pairs separated by commas (BIAS a number or -inf), got '" + item +
                        "'");
        out.emplace_back(static_cast<int32_t>(id), bias);
        start = comma + 1;
    }
    return out;
}

SamplingParams sampling_from_flags(const Args& args) {
    SamplingParams p;
    if (auto v = get_float(args, "--temp")) p.temperature = *v;
    if (auto v = args.get_int("--top-k", 0, std::numeric_limits<int32_t>::max())) p.top_k = static_cast<int32_t>(*v);
    if (auto v = get_float(args, "--top-p")) p.top_p = *v;
    if (auto v = get_float(args, "--min-p")) p.min_p = *v;
    if (auto v = get_float(args, "--repeat-penalty")) p.repetition_penalty = *v;
    if (auto v = args.get_int("--repeat-last-n", -1, std::numeric_limits<int32_t>::max()))
        p.penalty_last_n = static_cast<int32_t>(*v);
    if (auto v = get_float(args, "--presence-penalty")) p.presence_penalty = *v;
    if (auto v = get_float(args, "--frequency-penalty")) p.frequency_penalty = *v;
    if (auto v = args.get("--logit-bias")) p.logit_bias = parse_logit_bias(*v);
    p.greedy = args.has("--greedy");
    p.seed = args.get_u64("--seed").value_or(std::random_device{}());
    return p;
}

std::optional<bool> think_flag(const Args& args) {
    auto v = args.get_choice("--think", {"on", "off"});
    if (!v) return std::nullopt;
    return *v == "on";
}

// ---------------------------------------------------------------------------------------------------------------
// Loading: the model with a progress bar, then its tokenizer and chat template.

class ProgressBar {
  public:
    explicit ProgressBar(std::string label) : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}
    ~ProgressBar() { finish(); }
    void update(float fraction) {
        if (!enabled_) return;
        const int width = 30;
        const int filled = std::clamp(static_cast<int>(fraction * width + 0.5f), 0, width);
        const int percent = std::clamp(static_cast<int>(fraction * 100.0f), 0, 100);
        if (percent == last_percent_) return;
        last_percent_ = percent;
        std::fprintf(stderr, "\r%s [%s%s] %3d%%", label_.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                     std::string(static_cast<size_t>(width - filled), '.').c_str(), percent);
        std::fflush(stderr);
        shown_ = true;
    }
    void finish() {
        if (shown_) std::fprintf(stderr, "\r\033[K");  // clear the line: the bar leaves nothing behind
        shown_ = false;
    }
    bool enabled() const { return enabled_; }

  private:
    std::string label_;
    bool enabled_;
    bool shown_ = false;
    int last_percent_ = -1;
};

struct Engine {
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tokenizer;
    std::optional<ChatTemplate> chat_template;
    std::vector<int32_t> eog;  // model metadata and tokenizer together
    int64_t context = kDefaultContext;
    SpecSettings spec;  // --spec / --no-spec: speculative decoding (on by default with an MTP layer)
};

Engine load_engine(const Args& args) {
    const std::string path = model_path_or_default(args);
    LoadOptions options = load_options(args);
    if (options.backend == Backend::Cuda) {
        // The plan reserves the context a sequence gets without --ctx (a longer `run` prompt may ask for more).
        const std::unique_ptr<gguf::File> file = gguf::File::open(path);
        const auto trained = file->get_u32_opt(file->get_str("general.architecture") + ".context_length");
        const int64_t context = trained && *trained > 0 ? std::min<int64_t>(*trained, kDefaultContext) : kDefaultContext;
        plan_memory_for_load(args, path, options, args.get_int("--ctx", 1, kMaxContext).value_or(context));
    }
    Engine e;
    {
        ProgressBar bar("loading " + std::filesystem::path(path).filename().string());
        if (bar.enabled()) options.progress = [&bar](float f) { bar.update(f); };
        e.model = load_model(path, options);
    }
    std::unique_ptr<gguf::File> file = gguf::File::open(path);
    if (!file->find("tokenizer.ggml.model"))
        throw Error(path +
                    " has no tokenizer (tokenizer.ggml.* keys): convert the model with its tokenizer.json, "
                    "or use 'strata generate --tokens' for token ids");
    e.tokenizer = Tokenizer::from_gguf(*file);
    if (e.tokenizer->n_vocab() > e.model->info().n_vocab)
        throw Error(path + ": the tokenizer has " + std::to_string(e.tokenizer->n_vocab()) +
                    " tokens but the model's embedding only " + std::to_string(e.model->info().n_vocab));
    if (!e.tokenizer->chat_template().empty()) e.chat_template = ChatTemplate::parse(e.tokenizer->chat_template());
    e.eog = e.model->info().eog_tokens;
    for (int32_t id : e.tokenizer->eog_ids())
        if (std::find(e.eog.begin(), e.eog.end(), id) == e.eog.end()) e.eog.push_back(id);

    const int64_t trained = e.model->info().n_ctx_train;
    e.context = trained > 0 ? std::min(trained, kDefaultContext) : kDefaultContext;
    if (auto c = args.get_int("--ctx", 1, kMaxContext)) e.context = *c;
    e.spec = spec_settings(args, *e.model);
    return e;
}

// The sampler for this engine: rows past the tokenizer's vocabulary (padding in the embedding) are banned, since
// they have no text.
Sampler make_sampler(const Engine& e, SamplingParams params) {
    for (int64_t id = e.tokenizer->n_vocab(); id < e.model->info().n_vocab; ++id)
        params.logit_bias.emplace_back(static_cast<int32_t>(id), -std::numeric_limits<float>::infinity());
    return Sampler(std::move(params), e.model->info().n_vocab);
}

std::string render(const Engine& e, const Json& messages, std::optional<bool> enable_thinking) {
    ChatOptions options{.add_generation_prompt = true, .enable_thinking = enable_thinking};
    if (auto bos = e.tokenizer->bos_id()) options.bos_token = e.tokenizer->token_bytes(*bos);
    if (auto eos = e.tokenizer->eos_id()) options.eos_token = e.tokenizer->token_bytes(*eos);
    return e.chat_template->render(messages, options);
}

// ---------------------------------------------------------------------------------------------------------------
// Generation: feed the new prompt tokens, then sample, stream and feed back until something ends it.

std::atomic<bool> g_interrupted{false};

void on_sigint(int) {
    g_interrupted.store(true);
}

// SIGINT sets a flag that the generation loop checks between tokens; without SA_RESTART a read waiting at the
// prompt returns EINTR, so Ctrl-C there ends the chat.
class SigintGuard {
  public:
    SigintGuard() {
        struct sigaction sa {};
        sa.sa_handler = on_sigint;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;
        ::sigaction(SIGINT, &sa, &previous_);
    }
    ~SigintGuard() { ::sigaction(SIGINT, &previous_, nullptr); }
    SigintGuard(const SigintGuard&) = delete;
    SigintGuard& operator=(const SigintGuard&) = delete;

  private:
    struct sigaction previous_ {};
};

enum class StopReason { kEndOfGeneration, kStopString, kMaxTokens, kContextFull, kInterrupted };

const char* describe(StopReason r) {
    switch (r) {
        case StopReason::kEndOfGeneration:
            return "end-of-generation token";
        case StopReason::kStopString:
            return "stop string";
        case StopReason::kMaxTokens:
            return "-n reached";
        case StopReason::kContextFull:
            return "context full";
        case StopReason::kInterrupted:
            return "interrupted";
    }
    return "";
}

struct GenerationResult {
    std::string text;  // what was shown
    StopReason reason = StopReason::kMaxTokens;
    int64_t prompt_tokens = 0;
    double prompt_seconds = 0.0;
    int64_t generated = 0;             // tokens sampled (an end-of-generation token included)
    SpeculativeStats speculation;      // rounds == 0: decoded one token a pass
    double first_token_seconds = 0.0;  // from the start of the prompt to the first sampled token
    double decode_seconds = 0.0;       // after the first token
};

// One sequence and everything fed into it, so a later turn can feed only what is new; with speculation, the MTP
// drafter in step with it and the policy's measurements, kept from turn to turn.
struct Conversation {
    Conversation(const Engine& e, int64_t capacity) : seq(e.model->new_sequence(capacity)) {
        if (e.spec.max_draft > 0) policy.emplace(e.spec.max_draft, e.spec.mtp);
        if (e.spec.max_draft > 0 && e.spec.mtp) mtp = std::make_unique<MtpDrafter>(*e.model, capacity);
    }
    void reset(const Engine& e) {
        seq->reset();
        fed.clear();
        if (mtp) mtp = std::make_unique<MtpDrafter>(*e.model, seq->capacity());
    }
    std::unique_ptr<SequenceState> seq;
    std::vector<int32_t> fed;  // the tokens the sequence holds, in order
    std::unique_ptr<MtpDrafter> mtp;
    std::optional<SpeculationPolicy> policy;
};

// Speculation needs each position's token to depend on the logits and the position alone: penalties look at the
// tokens before, which a verification window has not accepted yet, so they turn it off.
bool can_speculate(const Engine& e, const Sampler& sampler) {
    const SamplingParams& p = sampler.params();
    return e.spec.max_draft > 0 && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
           p.frequency_penalty == 0.0f;
}

GenerationResult generate(const Engine& e, Conversation& conv, std::span<const int32_t> prompt, Sampler& sampler,
                          const std::vector<std::string>& stops, int64_t max_tokens,
                          const std::function<void(std::string_view)>& emit) {
    GenerationResult r;
    const Model& model = *e.model;
    const auto n_vocab = static_cast<size_t>(model.info().n_vocab);
    HostFloats logits = model.host_floats(n_vocab);  // the memory the backend copies into fastest
    StreamDecoder decoder(*e.tokenizer);
    StopMatcher matcher(stops);
    auto show = [&](std::string_view piece) {
        if (piece.empty()) return;
        r.text.append(piece);
        emit(piece);
    };

    const auto start = Clock::now();
    if (conv.seq->n_past() + static_cast<int64_t>(prompt.size()) >= conv.seq->capacity())
        throw Error("the prompt (" + std::to_string(conv.seq->n_past() + static_cast<int64_t>(prompt.size())) +
                    " tokens) does not fit in the context of " + std::to_string(conv.seq->capacity()) +
                    " tokens; give a larger --ctx, or /reset the chat");
    if (prompt.empty()) throw Error("the prompt is empty after tokenization");
    const bool speculate = can_speculate(e, sampler);
    if (speculate)
        speculative_prefill(model, *conv.seq, conv.mtp.get(), prompt, logits);
    else
        model.forward(*conv.seq, prompt, logits, /*last_only=*/true);
    conv.fed.insert(conv.fed.end(), prompt.begin(), prompt.end());
    sampler.accept(prompt);  // the penalties see the prompt too, as in llama.cpp
    r.prompt_tokens = static_cast<int64_t>(prompt.size());
    r.prompt_seconds = seconds_since(start);

    Clock::time_point first_token_at{};
    // Every token is drawn keyed by its position (Sampler::sample_at), so speculation gives the same text.
    if (speculate) {
        // The sequence needs room for the drafts of the last round too.
        const int64_t room = conv.seq->capacity() - conv.seq->n_past() - e.spec.max_draft;
        int64_t n = max_tokens > 0 ? max_tokens : std::numeric_limits<int64_t>::max();
        const bool context_bound = n > room;
        n = std::min(n, room);
        std::vector<int32_t> emitted;
        bool ended = false;
        auto on_token = [&](int32_t token) {
            emitted.push_back(token);
            if (r.generated++ == 0) {
                first_token_at = Clock::now();
                r.first_token_seconds = std::chrono::duration<double>(first_token_at - start).count();
            }
            ended = true;
            if (g_interrupted.load()) {
                r.reason = StopReason::kInterrupted;
                return false;
            }
            if (std::find(e.eog.begin(), e.eog.end(), token) != e.eog.end()) {
                r.reason = StopReason::kEndOfGeneration;
                return false;
            }
            sampler.accept(token);
            show(matcher.push(decoder.push(token)));
            if (matcher.stopped()) {
                r.reason = StopReason::kStopString;
                return false;
            }
            ended = false;
            return true;
        };
        if (n > 0)
            r.speculation = speculative_decode(
                model, *conv.seq, logits, conv.fed, n,
                {.max_draft = e.spec.max_draft,
                 .prompt_lookup = e.spec.lookup,
                 .mtp = conv.mtp.get(),
                 .mtp_min_p = e.spec.min_p,
                 .adaptive = e.spec.adaptive,
                 .policy = conv.policy ? &*conv.policy : nullptr},
                [&](std::span<const float> row, int64_t position) {
                    return sampler.sample_at(row, static_cast<uint64_t>(position));
                },
                on_token);
        if (!ended) r.reason = context_bound ? StopReason::kContextFull : StopReason::kMaxTokens;
        // The sequence holds the emitted tokens but (perhaps) the last.
        const size_t held = static_cast<size_t>(conv.seq->n_past()) - conv.fed.size();
        conv.fed.insert(conv.fed.end(), emitted.begin(), emitted.begin() + static_cast<std::ptrdiff_t>(held));
    }
    bool finished = speculate;
    while (!finished) {
        if (g_interrupted.load()) {
            r.reason = StopReason::kInterrupted;
            break;
        }
        if (max_tokens > 0 && r.generated >= max_tokens) {
            r.reason = StopReason::kMaxTokens;
            break;
        }
        const int32_t token = sampler.sample_at(logits, static_cast<uint64_t>(conv.seq->n_past()));
        if (r.generated++ == 0) {
            first_token_at = Clock::now();
            r.first_token_seconds = std::chrono::duration<double>(first_token_at - start).count();
        }
        if (std::find(e.eog.begin(), e.eog.end(), token) != e.eog.end()) {
            r.reason = StopReason::kEndOfGeneration;
            break;
        }
        sampler.accept(token);
        show(matcher.push(decoder.push(token)));
        if (matcher.stopped()) {
            r.reason = StopReason::kStopString;
            break;
        }
        if (max_tokens > 0 && r.generated >= max_tokens) {
            r.reason = StopReason::kMaxTokens;
            break;
        }
        if (conv.seq->n_past() + 1 > conv.seq->capacity()) {
            r.reason = StopReason::kContextFull;
            break;
        }
        model.forward(*conv.seq, std::span<const int32_t>(&token, 1), logits, /*last_only=*/true);
        conv.fed.push_back(token);
    }
    if (!matcher.stopped()) {
        show(matcher.push(decoder.flush()));
        show(matcher.flush());
    }
    if (r.generated > 0) r.decode_seconds = seconds_since(first_token_at);
    return r;
}

void print_timings(const GenerationResult& r) {
    const double prompt_rate = r.prompt_seconds > 0 ? static_cast<double>(r.prompt_tokens) / r.prompt_seconds : 0.0;
    const int64_t after_first = std::max<int64_t>(r.generated - 1, 0);
    std::string gen_rate = "n/a";
    if (after_first > 0 && r.decode_seconds > 0) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%.2f", static_cast<double>(after_first) / r.decode_seconds);
        gen_rate = buf;
    }
    std::fprintf(stderr,
                 "prompt: %lld tokens in %.3f s (%.2f tokens/s) | generation: %lld tokens, %s tokens/s after the "
                 "first | time to first token: %.3f s | stopped: %s\n",
                 static_cast<long long>(r.prompt_tokens), r.prompt_seconds, prompt_rate,
                 static_cast<long long>(r.generated), gen_rate.c_str(), r.first_token_seconds, describe(r.reason));
    if (r.speculation.rounds > 0)
        std::fprintf(stderr, "speculation: %.2f tokens a verification round, %lld of %lld drafted tokens accepted\n",
                     r.speculation.tokens_per_round(), static_cast<long long>(r.speculation.accepted),
                     static_cast<long long>(r.speculation.drafted));
}

bool g_out_ends_line = true;  // whether the text written so far ends with a newline

void write_out(std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (!piece.empty()) g_out_ends_line = piece.back() == '\n';
}

// On a terminal the timings line must not run on from the generated text; piped output stays exact.
void end_line_on_terminal() {
    if (!g_out_ends_line && isatty(STDOUT_FILENO)) write_out("\n");
}

// ---------------------------------------------------------------------------------------------------------------
// strata run

int run_run(const Args& args) {
    if (args.positional().empty()) throw Error("run: give the prompt as an argument (usage: strata run \"prompt\")");
    const std::string prompt_text = args.positional()[0];
    const auto n_predict = args.get_int("-n", 1, kMaxContext);
    const SamplingParams params = sampling_from_flags(args);
    const std::vector<std::string> stops = args.get_all("--stop");
    const bool raw = args.has("--raw");
    const std::optional<bool> thinking = think_flag(args);
    if (raw && (args.has("--system") || thinking))
        throw Error("--raw sends the prompt as it is: --system and --think need the chat template");

    Engine e = load_engine(args);
    Sampler sampler = make_sampler(e, params);
    std::string text = prompt_text;
    if (!raw && e.chat_template) {
        Json messages = Json::array();
        if (auto system = args.get("--system")) messages.push_back({{"role", "system"}, {"content", *system}});
        messages.push_back({{"role", "user"}, {"content", prompt_text}});
        text = render(e, messages, thinking);
    } else if (!raw && (args.has("--system") || thinking)) {
        throw Error("this model has no chat template, so --system and --think cannot be applied");
    }
    const std::vector<int32_t> prompt = e.tokenizer->encode(text, /*parse_special=*/true);
    const int64_t prompt_len = static_cast<int64_t>(prompt.size());
    // The context: --ctx when given, else room for the prompt and -n tokens, else the default context.
    const int64_t capacity = args.has("--ctx") ? e.context
                             : n_predict       ? prompt_len + *n_predict
                                               : std::max(e.context, prompt_len + 1);
    Conversation conv(e, capacity + e.spec.max_draft);

    SigintGuard guard;
    const GenerationResult r = generate(e, conv, prompt, sampler, stops, n_predict.value_or(0), write_out);
    write_out("\n");
    end_line_on_terminal();
    print_timings(r);
    return 0;
}

// ---------------------------------------------------------------------------------------------------------------
// strata chat

// One message from the user. A line ending in a backslash continues on the next line (the backslash becomes a line
// break); a line that is exactly """ opens a block that runs to the next such line. nullopt: end of input or Ctrl-C.
std::optional<std::string> read_message(bool interactive) {
    std::string message;
    bool in_block = false;
    bool first = true;
    char* line = nullptr;
    size_t capacity = 0;
    struct Free {
        char** p;
        ~Free() { std::free(*p); }
    } free_line{&line};
    for (;;) {
        if (interactive) {
            write_out(first ? "> " : ". ");
        }
        first = false;
        errno = 0;
        const ssize_t n = ::getline(&line, &capacity, stdin);
        if (n < 0) {
            if (g_interrupted.load() || errno == EINTR) return std::nullopt;
            if (in_block || !message.empty()) return message;  // input ended inside a message: take what there is
            return std::nullopt;
        }
        std::string text(line, static_cast<size_t>(n));
        if (!text.empty() && text.back() == '\n') text.pop_back();
        if (!text.empty() && text.back() == '\r') text.pop_back();
        if (text == "\"\"\"") {
            if (in_block) return message;
            in_block = true;
            continue;
        }
        if (in_block) {
            message += (message.empty() ? "" : "\n") + text;
            continue;
        }
        if (!text.empty() && text.back() == '\\') {
            text.pop_back();
            message += text + "\n";
            continue;
        }
        return message + text;
    }
}

void tell(const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
}

int run_chat(const Args& args) {
    const SamplingParams params = sampling_from_flags(args);
    const std::vector<std::string> stops = args.get_all("--stop");
    std::optional<bool> thinking = think_flag(args);
    const std::optional<std::string> system = args.get("--system");
    const auto max_reply = args.get_int("-n", 1, kMaxContext);
    const bool verbose = args.has("--verbose");

    Engine e = load_engine(args);
    if (!e.chat_template)
        throw Error("this model has no chat template (tokenizer.chat_template); use 'strata run --raw' instead");
    Sampler sampler = make_sampler(e, params);
    Conversation conv(e, e.context);

    Json messages = Json::array();
    auto restart = [&] {
        messages = Json::array();
        if (system) messages.push_back({{"role", "system"}, {"content", *system}});
    };
    restart();

    const bool interactive = ::isatty(STDIN_FILENO) == 1;
    if (interactive)
        tell("chat with " + (e.model->info().name.empty() ? e.model->info().arch : e.model->info().name) +
             ": /think on|off, /reset, /exit; end a line with \\ to continue it, or wrap lines in \"\"\"; Ctrl-C "
             "stops a reply, Ctrl-C or Ctrl-D at the prompt leaves");
    SigintGuard guard;
    for (;;) {
        g_interrupted.store(false);
        std::optional<std::string> input = read_message(interactive);
        if (!input) break;
        const std::string& message = *input;
        if (message.empty()) continue;
        if (message[0] == '/') {
            if (message == "/exit" || message == "/quit") break;
            if (message == "/reset") {
                restart();
                conv.reset(e);
                sampler.clear_history();
                tell("(conversation cleared)");
            } else if (message == "/think on" || message == "/think off") {
                thinking = message == "/think on";
                tell(std::string("(thinking ") + (*thinking ? "on" : "off") + ")");
            } else if (message == "/help") {
                tell("/think on|off  /reset  /exit");
            } else {
                tell("unknown command " + message + " (commands: /think on|off, /reset, /exit)");
            }
            continue;
        }

        messages.push_back({{"role", "user"}, {"content", message}});
        const std::vector<int32_t> all = e.tokenizer->encode(render(e, messages, thinking), true);
        // Feed only what is new when the sequence holds a prefix of this rendering; otherwise start it over.
        const bool extends = all.size() > conv.fed.size() && std::equal(conv.fed.begin(), conv.fed.end(), all.begin());
        if (!extends) {
            conv.reset(e);
        }
        const std::span<const int32_t> fresh = std::span<const int32_t>(all).subspan(conv.fed.size());
        if (static_cast<int64_t>(all.size()) >= conv.seq->capacity()) {
            messages.erase(messages.end() - 1);
            tell("(the conversation no longer fits in the context of " + std::to_string(conv.seq->capacity()) +
                 " tokens: /reset it, or start again with a larger --ctx)");
            continue;
        }
        const size_t reused = conv.fed.size();
        const GenerationResult r = generate(e, conv, fresh, sampler, stops, max_reply.value_or(0), write_out);
        write_out("\n");
        if (verbose) {
            tell("(context: " + std::to_string(reused) + " tokens reused, " + std::to_string(fresh.size()) + " fed, " +
                 std::to_string(conv.fed.size()) + " held of " + std::to_string(conv.seq->capacity()) + ")");
            print_timings(r);
        }
        if (r.reason == StopReason::kInterrupted) tell("(reply stopped)");
        if (r.reason == StopReason::kContextFull) tell("(context full: /reset to continue)");
        messages.push_back({{"role", "assistant"}, {"content", r.text}});
    }
    if (interactive) write_out("\n");
    return 0;
}

}  // namespace

Command run_command() {
    std::vector<FlagSpec> flags = kModelFlags;
    flags.insert(flags.end(), kLoadFlags.begin(), kLoadFlags.end());
    flags.insert(flags.end(), {{"-n", "N",
                                "generate at most N tokens (default: until end of generation or a full "
                                "context)"},
                               {"--raw", "", "send the prompt as it is, without the chat template"}});
    flags.insert(flags.end(), kSamplingFlags.begin(), kSamplingFlags.end());
    flags.insert(flags.end(), kSpecFlags.begin(), kSpecFlags.end());
    return {
        .spec =
            {
                .name = "run",
                .summary = "generate text from a prompt, streamed, then time to first token and tokens/s",
                .usage = "strata run [--model FILE.gguf] [-n N] [--greedy] [sampling flags] [--stop TEXT] \"prompt\"",
                .flags = flags,
                .positional_name = "PROMPT",
                .notes = "The prompt goes through the model's chat template as one user message (unless --raw or the\n"
                         "model has none). Text goes to stdout as it is generated; timings go to stderr at the end.\n"
                         "Sampling order (llama.cpp's): logit bias, penalties, top-k, top-p, min-p, temperature.",
            },
        .run = run_run,
    };
}

Command chat_command() {
    std::vector<FlagSpec> flags = kModelFlags;
    flags.insert(flags.end(), kLoadFlags.begin(), kLoadFlags.end());
    flags.insert(flags.end(), {{"-n", "N", "at most N tokens per reply (default: until end of generation)"},
                               {"--verbose", "", "after each reply, print timings and how much context was reused"}});
    flags.insert(flags.end(), kSamplingFlags.begin(), kSamplingFlags.end());
    flags.insert(flags.end(), kSpecFlags.begin(), kSpecFlags.end());
    return {
        .spec =
            {
                .name = "chat",
                .summary = "talk with a model: streamed replies, multi-line input, /think on|off, /reset",
                .usage = "strata chat [--model FILE.gguf] [--system TEXT] [sampling flags]",
                .flags = flags,
                .notes = "Input: a line ending with \\ continues on the next line; a line \"\"\" opens a block that\n"
                         "ends at the next \"\"\" line. Commands: /think on|off, /reset (forget the conversation),\n"
                         "/exit. Ctrl-C stops a reply and returns to the prompt; Ctrl-C or Ctrl-D at the prompt\n"
                         "leaves. Works with stdin from a pipe (no prompt markers are printed then).",
            },
        .run = run_chat,
    };
}

}  // namespace strata::app
