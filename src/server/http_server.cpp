// The HTTP side of `strata serve`: security checks before routing, the small endpoints (health, metrics, status,
// tokenize, detokenize, the web app), error bodies for everything httplib answers itself, one log line per request,
// and start-up and graceful shutdown.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "format/gguf.h"
#include "model/model.h"
#include "runtime/expert_profile.h"
#include "server/api_common.h"
#include "server/security.h"
#include "server/server.h"
#include "server/webapp_assets.h"
#include "tokenizer/tokenizer.h"

#ifndef STRATA_VERSION
#define STRATA_VERSION "unknown"
#endif

namespace strata::server {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

Clock::time_point& request_start() {
    thread_local Clock::time_point t;
    return t;
}

bool is_anthropic_path(const std::string& path) {
    return path.rfind("/v1/messages", 0) == 0;
}

void send_error(httplib::Response& res, const std::string& path, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump_json(is_anthropic_path(path) ? anthropic_error_body(e) : openai_error_body(e)),
                    "application/json");
    current_log().error = e.message;
}

std::string content_type_of(const std::string& path) {
    const std::string ext = std::filesystem::path(path).extension().string();
    if (ext == ".html") return "text/html; charset=utf-8";
    if (ext == ".js" || ext == ".mjs") return "text/javascript; charset=utf-8";
    if (ext == ".css") return "text/css; charset=utf-8";
    if (ext == ".svg") return "image/svg+xml";
    if (ext == ".png") return "image/png";
    if (ext == ".ico") return "image/x-icon";
    if (ext == ".json" || ext == ".webmanifest") return "application/json";
    if (ext == ".woff2") return "font/woff2";
    if (ext == ".txt" || ext == ".md") return "text/plain; charset=utf-8";
    return "application/octet-stream";
}

const WebAsset* find_asset(const std::string& path) {
    const std::string want = path == "/" ? "/index.html" : path;
    for (const WebAsset* a = web_assets(); a->path != nullptr; ++a)
        if (want == a->path) return a;
    return nullptr;
}

// Routes a browser may load without a key (the web app asks for the key itself) and the liveness probe.
bool open_route(const httplib::Request& req) {
    if (req.method != "GET" && req.method != "HEAD") return false;
    return req.path == "/health" || req.path == "/favicon.ico" || find_asset(req.path) != nullptr;
}

std::string served_name(const ModelInfo& info, const std::string& path) {
    if (!info.name.empty()) return info.name;
    return std::filesystem::path(path).stem().string();
}

void print_log_line(const httplib::Request& req, const httplib::Response& res) {
    const RequestLog& log = current_log();
    const double total = std::chrono::duration<double>(Clock::now() - request_start()).count();
    std::string line = "strata serve: " + (log.id.empty() ? std::string("-") : log.id) + " " + req.method + " " +
                       req.path + " " + std::to_string(res.status);
    char buf[256];
    if (log.prompt_tokens >= 0) {
        const double rate = log.decode_seconds > 0 && log.completion_tokens > 1
                                ? static_cast<double>(log.completion_tokens - 1) / log.decode_seconds
                                : 0.0;
        std::snprintf(buf, sizeof(buf), " in=%lld cached=%lld out=%lld ttft=%.3fs %.1f tok/s finish=%s",
                      static_cast<long long>(log.prompt_tokens), static_cast<long long>(log.cached_tokens),
                      static_cast<long long>(log.completion_tokens), log.ttft, rate,
                      log.finish_reason.empty() ? "-" : log.finish_reason.c_str());
        line += buf;
    }
    std::snprintf(buf, sizeof(buf), " %.3fs", total);
    line += buf;
    if (!log.error.empty()) {
        std::string e = log.error.substr(0, 200);
        for (char& c : e)
            if (c == '\n' || c == '\r') c = ' ';
        line += " error=\"" + e + "\"";
    }
    std::fprintf(stderr, "%s\n", line.c_str());
}

Json tokenize_pieces(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
    Json out = Json::array();
    for (int32_t id : ids) {
        const std::string bytes = tokenizer.token_bytes(id);
        const Json as_text = Json(bytes);
        // Pieces that are not whole UTF-8 go out as byte lists (as llama.cpp's server does).
        std::string dumped = as_text.dump(-1, ' ', false, Json::error_handler_t::ignore);
        if (dumped.size() - 2 < bytes.size()) {
            Json b = Json::array();
            for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
            out.push_back({{"id", id}, {"piece", b}});
        } else {
            out.push_back({{"id", id}, {"piece", bytes}});
        }
    }
    return out;
}

// The CUDA memory plan (runtime/memory_plan.h) as /v1/status shows it; null with --backend cpu.
// /v1/status's expert_cache (the Monitor's Expert cache panel): rates over the tokens since loading; null when every
// expert is in VRAM or the backend is the CPU.
Json expert_cache_json(const std::optional<ExpertOffloadStats>& s) {
    if (!s) return nullptr;
    const double tokens = static_cast<double>(std::max<int64_t>(s->tokens, 1));
    const double lookups = static_cast<double>(std::max<int64_t>(s->lookups, 1));
    return {{"tokens", s->tokens},
            {"hit_rate", static_cast<double>(s->hits) / lookups},
            {"misses_per_token", static_cast<double>(s->lookups - s->hits) / tokens},
            {"cpu_misses_per_token", static_cast<double>(s->cpu_pairs) / tokens},
            {"pcie_mb_per_token", static_cast<double>(s->pcie_bytes) / tokens / 1e6},
            {"cpu_mb_per_token", static_cast<double>(s->cpu_bytes) / tokens / 1e6},
            {"swaps_per_token", static_cast<double>(s->swaps) / tokens},
            {"swap_mb_per_token", static_cast<double>(s->swap_bytes) / tokens / 1e6},
            {"cpu_share", s->cpu_share},
            {"doorbell_timeouts", s->doorbell_timeouts},
            {"streamed_windows", s->streamed_windows},
            {"vram_slots", s->cache_slots}};
}

Json cuda_plan_json(const MemoryPlan* plan) {
    if (!plan) return nullptr;
    Json lines = Json::array();
    for (const PlanLine& l : plan->lines)
        lines.push_back({{"what", l.what}, {"where", plan_place_name(l.place)}, {"bytes", l.bytes}});
    return {{"summary", plan->summary()},
            {"vram_budget_bytes", plan->vram_budget},
            {"vram_bytes", plan->vram_total()},
            {"ram_budget_bytes", plan->ram_budget},
            {"pinned_bytes", plan->pinned_total()},
            {"experts_in_vram", plan->experts_in_vram},
            {"expert_cache_slots", plan->cache_slots},
            {"lines", lines}};
}

Json status_json(const ServerContext& ctx, const gguf::File& file) {
    const EngineSnapshot snap = ctx.engine->snapshot();
    Json slots = Json::array();
    for (const auto& s : snap.slots)
        slots.push_back({{"id", s.id},
                         {"state", s.state},
                         {"request_id", s.request_id},
                         {"n_past", s.n_past},
                         {"capacity", s.capacity},
                         {"prompt_tokens", s.prompt_tokens},
                         {"generated", s.generated},
                         {"checkpoints", s.checkpoints}});
    Json plan = Json::array();
    uint64_t total = 0;
    try {
        for (const auto& item : plan_memory(file, ctx.engine->options().ctx_per_slot)) {
            plan.push_back({{"what", item.what}, {"bytes", item.bytes}});
            total += item.bytes;
        }
    } catch (const std::exception& e) {
        plan.push_back({{"what", std::string("unavailable: ") + e.what()}, {"bytes", 0}});
    }
    const ModelInfo& info = ctx.model->info();
    const EngineOptions& o = ctx.engine->options();
    return {{"version", STRATA_VERSION},
            {"uptime_seconds", std::chrono::duration<double>(Clock::now() - ctx.started).count()},
            {"model",
             {{"id", ctx.model_id},
              {"name", info.name},
              {"arch", info.arch},
              {"path", ctx.model_path},
              {"n_vocab", info.n_vocab},
              {"n_layer", info.n_layer},
              {"n_embd", info.n_embd},
              {"n_ctx_train", info.n_ctx_train},
              {"chat_template", ctx.builtin_template ? "built-in ChatML" : "from the model"}}},
            {"memory_plan", {{"per_slot_context", o.ctx_per_slot}, {"items", plan}, {"total_bytes", total}}},
            {"cuda_memory_plan", cuda_plan_json(ctx.cuda_plan)},
            {"cuda_stages", cuda_stages_json(ctx.cuda_stages, ctx.cuda_split)},
            {"expert_cache", expert_cache_json(ctx.model->expert_offload_stats())},
            {"slots", slots},
            {"queue", {{"waiting", snap.load.waiting}, {"limit", snap.queue_limit}, {"running", snap.load.running}}},
            {"kv_cache_usage", snap.load.kv_usage},
            {"generation_tokens_per_second", ctx.metrics->tokens_per_second()},
            {"requests_cancelled", ctx.metrics->cancelled()},
            {"settings",
             {{"parallel", o.n_slots},
              {"ctx_size", o.ctx_per_slot},
              {"queue", o.queue_limit},
              {"chunk_size", o.chunk_size},
              {"prefix_cache", o.prefix_cache},
              {"checkpoints_supported", snap.checkpoints_supported},
              {"constraints", ctx.constraints->available()}}}};
}

void register_basic_routes(httplib::Server& server, ServerContext& ctx, const gguf::File& file) {
    server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
        res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    server.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
        const std::optional<ExpertOffloadStats> offload = ctx.model->expert_offload_stats();
        res.set_content(ctx.metrics->render(ctx.engine->snapshot().load, offload ? &*offload : nullptr),
                        "text/plain; version=0.0.4; charset=utf-8");
    });
    server.Get("/v1/status", [&ctx, &file](const httplib::Request&, httplib::Response& res) {
        guarded(res, false, [&] { res.set_content(dump_json(status_json(ctx, file)), "application/json"); });
    });
    post_route(server, ctx, "/tokenize", false, [&ctx](const httplib::Request& req, httplib::Response& res) {
        guarded(res, false, [&] {
            const Json body = parse_body(req.body, ctx.limits);
            auto content = get_string(body, "content");
            if (!content) throw ApiError(400, "'content' (a string) is required", "content");
            const bool parse_special = get_bool(body, "parse_special").value_or(true);
            const bool with_pieces = get_bool(body, "with_pieces").value_or(false);
            std::vector<int32_t> ids;
            if (get_bool(body, "add_special").value_or(false))
                if (auto bos = ctx.tokenizer->bos_id()) ids.push_back(*bos);
            const auto encoded = ctx.tokenizer->encode(*content, parse_special);
            ids.insert(ids.end(), encoded.begin(), encoded.end());
            Json out = {{"tokens", with_pieces ? tokenize_pieces(*ctx.tokenizer, ids) : Json(ids)}};
            res.set_content(dump_json(out), "application/json");
        });
    });
    post_route(server, ctx, "/detokenize", false, [&ctx](const httplib::Request& req, httplib::Response& res) {
        guarded(res, false, [&] {
            const Json body = parse_body(req.body, ctx.limits);
            auto it = body.find("tokens");
            if (it == body.end() || !it->is_array()) throw ApiError(400, "'tokens' (a list of token ids) is required", "tokens");
            if (it->size() > ctx.limits.max_tokens_per_request_list) throw ApiError(400, "'tokens' is too long", "tokens");
            std::vector<int32_t> ids;
            const int64_t n = ctx.tokenizer->n_vocab();
            for (const auto& t : *it) {
                if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n)
                    throw ApiError(400, "'tokens' must hold integers in 0.." + std::to_string(n - 1), "tokens");
                ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
            }
            res.set_content(dump_json(Json{{"content", ctx.tokenizer->decode(ids)}}), "application/json");
        });
    });
    auto serve_asset = [](const httplib::Request& req, httplib::Response& res) {
        const WebAsset* a = find_asset(req.path);
        if (!a) {
            send_error(res, req.path, ApiError(404, "no such page: " + req.path.substr(0, 200), "", "not_found"));
            return;
        }
        res.set_content(reinterpret_cast<const char*>(a->data), a->size, content_type_of(a->path));
        res.set_header("Content-Security-Policy", kContentSecurityPolicy);
        res.set_header("Cache-Control", "no-cache");
    };
    server.Get("/", serve_asset);
    server.Get(R"(/[A-Za-z0-9_.\-]+)", serve_asset);
}

// Blocks SIGINT and SIGTERM in every thread started after it, so that one thread can wait for them with sigwait.
sigset_t shutdown_signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return set;
}

}  // namespace

// The routing this run saw, added to the profile at `path` (when it has this model's shape), written through a
// temporary file so a crash never leaves half a profile. Problems are reported, never thrown: the server is stopping.
static void save_expert_profile(const Model& model, const std::string& path) {
    const std::optional<ExpertOffloadStats> stats = model.expert_offload_stats();
    if (!stats || stats->tokens == 0) return;
    try {
        ExpertProfile profile{.n_layer = static_cast<int64_t>(stats->routing_counts.size()), .n_expert = 0,
                              .counts = stats->routing_counts};
        for (auto& layer : profile.counts) profile.n_expert = std::max<int64_t>(profile.n_expert, layer.size());
        for (auto& layer : profile.counts) layer.resize(static_cast<size_t>(profile.n_expert), 0);
        if (std::filesystem::exists(path)) {
            const ExpertProfile before = read_expert_profile(path);
            if (before.n_expert == profile.n_expert && before.n_layer == profile.n_layer)
                for (size_t l = 0; l < before.counts.size(); ++l)
                    for (size_t e = 0; e < before.counts[l].size(); ++e) profile.counts[l][e] += before.counts[l][e];
        }
        const std::string temp = path + ".tmp";
        write_expert_profile(temp, profile);
        std::filesystem::rename(temp, path);
        std::fprintf(stderr, "strata serve: expert profile of %lld tokens added to %s\n",
                     static_cast<long long>(stats->tokens), path.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "strata serve: the expert profile was not saved: %s\n", e.what());
    }
}

int serve(const ServeOptions& options) {
    if (!is_loopback_host(options.host) && options.api_key.empty())
        throw Error("--host " + options.host +
                    " is not a loopback address: give --api-key KEY (or set STRATA_API_KEY) to serve beyond this machine");
    if (options.port < 0 || options.port > 65535) throw Error("--port must be between 0 and 65535");

    // Signals: waited for by one thread (below); a client that disconnects must not kill the server with SIGPIPE.
    const sigset_t signals = shutdown_signals();
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    ServerContext ctx;
    ctx.started = Clock::now();
    ctx.created_unix = static_cast<int64_t>(std::time(nullptr));
    ctx.model_path = options.model_path;
    ctx.cuda_plan = options.cuda_plan ? &*options.cuda_plan : nullptr;
    ctx.cuda_stages = &options.cuda_stages;
    ctx.cuda_split = &options.load.split;
    std::unique_ptr<Model> model = load_model(options.model_path, options.load);
    std::unique_ptr<gguf::File> file = gguf::File::open(options.model_path);
    if (!file->find("tokenizer.ggml.model"))
        throw Error(options.model_path + " has no tokenizer (tokenizer.ggml.* keys): the server needs one");
    std::unique_ptr<Tokenizer> tokenizer = Tokenizer::from_gguf(*file);
    if (tokenizer->n_vocab() > model->info().n_vocab)
        throw Error(options.model_path + ": the tokenizer has more tokens than the model's embedding");
    ctx.model = model.get();
    ctx.tokenizer = tokenizer.get();
    if (!tokenizer->chat_template().empty()) {
        ctx.chat_template = ChatTemplate::parse(tokenizer->chat_template());
    } else {
        ctx.chat_template = ChatTemplate::parse(builtin_chat_template());
        ctx.builtin_template = true;
    }
    std::vector<int32_t> eog = model->info().eog_tokens;
    for (int32_t id : tokenizer->eog_ids())
        if (std::find(eog.begin(), eog.end(), id) == eog.end()) eog.push_back(id);

    EngineOptions engine_options = options.engine;
    if (engine_options.ctx_per_slot <= 0) {
        const int64_t trained = model->info().n_ctx_train;
        engine_options.ctx_per_slot = trained > 0 ? std::min<int64_t>(trained, 4096) : 4096;
    }
    Metrics metrics;
    Engine engine(*model, *tokenizer, eog, engine_options, metrics);
    ConstraintFactory constraints(*tokenizer, model->info().n_vocab, eog);
    ctx.engine = &engine;
    ctx.metrics = &metrics;
    ctx.constraints = &constraints;
    ctx.model_id = served_name(model->info(), options.model_path);
    ctx.model_aliases = options.aliases;
    const std::filesystem::path model_file(options.model_path);
    ctx.model_aliases.push_back(model_file.filename().string());
    ctx.model_aliases.push_back(model_file.stem().string());
    ctx.model_aliases.push_back("default");
    ctx.limits.max_body = options.max_body;

    httplib::Server server;
    const size_t http_threads = options.http_threads > 0
                                    ? static_cast<size_t>(options.http_threads)
                                    : static_cast<size_t>(engine_options.n_slots + engine_options.queue_limit + 8);
    server.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
    server.set_payload_max_length(options.max_body);
    server.set_read_timeout(30, 0);
    server.set_write_timeout(30, 0);
    server.set_keep_alive_timeout(5);
    // Only SO_REUSEADDR: httplib's default also sets SO_REUSEPORT, which would let a second server share the port.
    server.set_socket_options([](socket_t sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    server.set_default_headers({{"X-Content-Type-Options", "nosniff"}, {"Referrer-Policy", "no-referrer"}});

    OriginPolicy policy{.allowed = options.cors_origins, .loopback_bind = is_loopback_host(options.host)};
    const std::string api_key = options.api_key;
    server.set_pre_routing_handler([policy, api_key](const httplib::Request& req, httplib::Response& res) {
        current_log() = RequestLog{};
        request_start() = Clock::now();
        const OriginVerdict verdict = check_origin(policy, req.get_header_value("Origin"),
                                                   req.get_header_value("Sec-Fetch-Site"), req.get_header_value("Host"));
        if (!verdict.allowed) {
            send_error(res, req.path, ApiError(403, verdict.reason, "", "forbidden", "permission_error"));
            return httplib::Server::HandlerResponse::Handled;
        }
        if (!verdict.allow_origin.empty()) {
            res.set_header("Access-Control-Allow-Origin", verdict.allow_origin);
            res.set_header("Vary", "Origin");
        }
        if (req.method == "OPTIONS") {
            // Preflight: only an allowed origin gets the methods and headers.
            if (!verdict.allow_origin.empty()) {
                res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
                res.set_header("Access-Control-Allow-Headers",
                               "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
                res.set_header("Access-Control-Max-Age", "600");
            }
            res.status = 204;
            return httplib::Server::HandlerResponse::Handled;
        }
        if (!api_key.empty() && !open_route(req)) {
            const auto key = request_key(req.get_header_value("Authorization"), req.get_header_value("x-api-key"));
            if (!key || !constant_time_equal(*key, api_key)) {
                send_error(res, req.path,
                           ApiError(401, key ? "the API key is not valid" : "an API key is required (Authorization: Bearer KEY)",
                                    "", "invalid_api_key", "authentication_error"));
                return httplib::Server::HandlerResponse::Handled;
            }
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    const size_t max_body = options.max_body;
    server.set_error_handler([max_body](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.status == 204) return;
        if (res.status == 413) {
            send_error(res, req.path, ApiError(413, "the request body is larger than " + std::to_string(max_body) +
                                                         " bytes (--max-body)", "", "request_too_large"));
        } else if (res.status == 404) {
            send_error(res, req.path,
                       ApiError(404, "no route " + req.method + " " + req.path.substr(0, 200), "", "not_found"));
        } else {
            send_error(res, req.path, ApiError(res.status, "bad request (HTTP " + std::to_string(res.status) + ")"));
        }
    });
    server.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        send_error(res, req.path, ApiError(500, "internal error: " + what, "", "", "server_error"));
    });
    server.set_logger([&metrics](const httplib::Request& req, const httplib::Response& res) {
        metrics.http_response(res.status);
        const bool quiet = res.status < 400 && (req.method == "GET" || req.method == "HEAD");
        if (!quiet) print_log_line(req, res);
    });

    register_basic_routes(server, ctx, *file);
    register_openai_routes(server, ctx);
    register_anthropic_routes(server, ctx);

    int port = options.port;
    if (port == 0) {
        port = server.bind_to_any_port(options.host);
        if (port < 0) throw Error("cannot listen on " + options.host + ": no free port");
    } else if (!server.bind_to_port(options.host, port)) {
        throw Error("cannot listen on " + options.host + ":" + std::to_string(port) +
                    " (in use, or not an address of this machine); choose another --port or --host");
    }
    const bool v6 = options.host.find(':') != std::string::npos;
    std::fprintf(stderr,
                 "strata serve: %s (%s) with %d slots x %lld tokens; listening on http://%s%s%s:%d%s\n",
                 ctx.model_id.c_str(), model->info().arch.c_str(), engine_options.n_slots,
                 static_cast<long long>(engine_options.ctx_per_slot), v6 ? "[" : "", options.host.c_str(),
                 v6 ? "]" : "", port, options.api_key.empty() ? "" : " (API key required)");
    std::fflush(stderr);

    std::atomic<bool> stopping{false};
    std::thread watcher([&] {
        int sig = 0;
        sigset_t set = signals;
        sigwait(&set, &sig);
        if (!stopping.exchange(true))
            std::fprintf(stderr, "strata serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        engine.stop();  // running requests end now; their streams close
        server.stop();
    });
    const bool listened = server.listen_after_bind();
    if (!stopping.exchange(true)) pthread_kill(watcher.native_handle(), SIGTERM);  // wake the watcher
    watcher.join();
    engine.stop();
    if (!options.expert_profile_path.empty()) save_expert_profile(*model, options.expert_profile_path);
    std::fprintf(stderr, "strata serve: stopped\n");
    if (!listened && !stopping) throw Error("the server stopped unexpectedly");
    return 0;
}

// --split (issue 29): each stage's card, its blocks and their share of the trunk, and its plan's VRAM; null on one
// card.
Json cuda_stages_json(const std::vector<StagePlan>* plans, const std::vector<CudaStage>* split) {
    if (!plans || plans->empty()) return nullptr;
    const std::vector<StagePlan>& stages = *plans;
    const double n_trunk = static_cast<double>(std::max<int64_t>(stages.back().end_block, 1));
    Json out = Json::array();
    for (size_t k = 0; k < stages.size(); ++k) {
        const StagePlan& s = stages[k];
        const bool known = split && k < split->size();
        out.push_back({{"stage", k},
                       {"device", known ? (*split)[k].device : -1},
                       {"first_block", s.first_block},
                       {"last_block", s.end_block - 1},
                       {"block_share", static_cast<double>(s.end_block - s.first_block) / n_trunk},
                       {"vram_budget_bytes", s.plan.vram_budget},
                       {"vram_bytes", s.plan.vram_total()},
                       {"expert_cache_slots", s.plan.cache_slots},
                       {"summary", s.plan.summary()}});
    }
    return out;
}

}  // namespace strata::server
