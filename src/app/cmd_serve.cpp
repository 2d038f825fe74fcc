// `strata serve`: the OpenAI- and Anthropic-compatible HTTP server and web app (src/server). This file turns flags and
// the environment (STRATA_API_KEY) into one ServeOptions and starts it.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "runtime/speculation.h"
#include "server/server.h"

namespace strata::app {

namespace {

int run_serve(const Args& args) {
    server::ServeOptions o;
    o.model_path = model_path_or_default(args);
    if (auto h = args.get("--host")) {
        if (h->empty()) throw Error("--host expects an address, got ''");
        o.host = *h;
    }
    if (auto p = args.get_int("--port", 0, 65535)) o.port = static_cast<int>(*p);
    o.load = load_options(args);
    if (auto n = args.get_int("--parallel", 1, 256)) o.engine.n_slots = static_cast<int>(*n);
    if (auto n = args.get_int("--ctx-size", 16, int64_t{1} << 24)) o.engine.ctx_per_slot = *n;
    else o.engine.ctx_per_slot = 0;  // the server picks min(training context, 4096)
    if (auto n = args.get_int("--queue", 0, 100000)) o.engine.queue_limit = static_cast<int>(*n);
    if (auto n = args.get_int("--chunk-size", 1, 1 << 20)) o.engine.chunk_size = *n;
    o.engine.prefix_cache = !args.has("--no-prefix-cache");
    // Speculation: -1 lets the engine decide from the model (on with an MTP layer).
    const auto spec = args.get_int("--spec", 0, SpeculationPolicy::kMaxDraft);
    if (spec && args.has("--no-spec")) throw Error("--spec and --no-spec contradict each other: give one");
    o.engine.spec = args.has("--no-spec") ? 0 : static_cast<int>(spec.value_or(-1));
    const std::string drafter = args.get_choice("--spec-drafter", {"auto", "mtp", "lookup"}).value_or("auto");
    o.engine.spec_mtp = drafter != "lookup";
    o.engine.spec_lookup = drafter != "mtp";
    o.engine.spec_adaptive = !args.has("--spec-fixed");
    if (const auto p = get_probability(args, "--spec-min-p")) o.engine.spec_min_p = static_cast<float>(*p);
    if (auto n = args.get_int("--http-threads", 1, 4096)) o.http_threads = static_cast<int>(*n);
    if (auto s = args.get("--max-body")) {
        auto bytes = parse_size(*s);
        if (!bytes || *bytes < 1024 || *bytes > (uint64_t{1} << 30))
            throw Error("--max-body expects a size between 1K and 1G (e.g. 1M), got '" + *s + "'");
        o.max_body = static_cast<size_t>(*bytes);
    }
    if (auto k = args.get("--api-key")) {
        if (k->empty()) throw Error("--api-key is empty");
        o.api_key = *k;
    } else if (const char* env = std::getenv("STRATA_API_KEY"); env != nullptr && *env != '\0') {
        o.api_key = env;
    }
    if (o.load.backend == Backend::Cuda) {
        // Every slot's sequence at once; without --ctx-size the server gives each min(training context, 4096).
        int64_t per_slot = o.engine.ctx_per_slot;
        if (per_slot <= 0) {
            const std::unique_ptr<gguf::File> file = gguf::File::open(o.model_path);
            const auto trained = file->get_u32_opt(file->get_str("general.architecture") + ".context_length");
            per_slot = trained && *trained > 0 ? std::min<int64_t>(*trained, 4096) : 4096;
        }
        // A slot holds its prefix-cache checkpoints (the engine keeps at least 2) and one more during a speculation
        // round: the plan books them all.
        const int64_t checkpoints = o.engine.prefix_cache ? std::max(o.engine.max_checkpoints_per_slot, 2) + 1 : 1;
        if (auto stages = plan_split_for_load(args, o.model_path, o.load, per_slot, o.engine.n_slots, checkpoints)) {
            o.cuda_stages = std::move(*stages);
            o.cuda_plan = o.cuda_stages.back().plan;
        } else {
            o.cuda_plan = plan_memory_for_load(args, o.model_path, o.load, per_slot, o.engine.n_slots, checkpoints);
        }
        if (o.load.experts.in_host) o.expert_profile_path = args.get("--expert-profile").value_or("");
    }
    o.cors_origins = args.get_all("--cors-origin");
    o.aliases = args.get_all("--alias");
    return server::serve(o);
}

}  // namespace

Command serve_command() {
    std::vector<FlagSpec> flags = {
        {"--model", "FILE.gguf", kDefaultModelHelp},
        {"--host", "ADDR", "address to listen on (default 127.0.0.1; others need an API key)"},
        {"--port", "N", "port (default 8080; 0: any free port, printed at start)"},
        {"--parallel", "N", "requests decoded together, one slot each (default 4)"},
        {"--ctx-size", "N", "context per slot in tokens (default: 4096 or the training context)"},
        {"--api-key", "KEY", "require this key (Authorization: Bearer KEY or x-api-key); also STRATA_API_KEY"},
        {"--queue", "N", "requests that may wait for a slot before 503 (default 64)"},
        {"--chunk-size", "N", "prompt tokens per slot and step (default 256)"},
        {"--no-prefix-cache", "", "never reuse a slot's earlier tokens (every prompt computed in full)"},
        {"--cors-origin", "ORIGIN", "also allow browser requests from ORIGIN (http://host:port, or *)", true},
        {"--alias", "NAME", "another name the 'model' field may use", true},
        {"--max-body", "SIZE", "largest request body (default 1M)"},
        {"--http-threads", "N", "connection threads (default: parallel + queue + 8)"},
        {"--spec", "N",
         "speculative decoding: a slot's window holds up to N drafts, the MTP layer's or prompt lookup's, picked per "
         "round by a per-slot policy (0..7; default 4 when the model has an MTP layer, else off); the same output as "
         "without it"},
        {"--no-spec", "", "no speculative decoding"},
        {"--spec-min-p", "P", "an MTP draft ends at a token the MTP layer gives less than P (default 0.3)"},
        {"--spec-drafter", "auto|mtp|lookup",
         "for A/B runs: one drafter only (mtp: an error when the model has no MTP layer)"},
        {"--spec-fixed", "", "for A/B runs: every round drafts N tokens without the policy (may be slower than plain)"},
    };
    flags.insert(flags.end(), kLoadFlags.begin(), kLoadFlags.end());
    return {
        .spec =
            {
                .name = "serve",
                .summary = "OpenAI- and Anthropic-compatible HTTP server with a web app (batched parallel slots)",
                .usage = "strata serve [--model FILE.gguf] [--host 127.0.0.1] [--port 8080] [--parallel N] "
                         "[--ctx-size N] [--api-key KEY]",
                .flags = flags,
                .notes =
                    "Endpoints: POST /v1/chat/completions, /v1/completions, /v1/messages (Anthropic), /tokenize,\n"
                    "/detokenize; GET /v1/models, /health, /metrics (Prometheus), /v1/status, and the web app at /.\n"
                    "Listens on 127.0.0.1 unless --host says otherwise; any other address needs --api-key or\n"
                    "STRATA_API_KEY. Browser requests from other origins are refused (403) unless --cors-origin\n"
                    "allows them. SIGINT or SIGTERM stops it: running requests end, then the process exits 0.",
            },
        .run = run_serve,
    };
}

}  // namespace strata::app
