// `strata serve` end to end: the real binary on a random-weight tiny model (strata synth --preset tiny), started on a
// free port and driven with httplib::Client (and a raw socket where a client must vanish mid-stream).
//
// Oracles: the OpenAI / Anthropic wire formats (field names, SSE framing, event order), round trips (tokenize then
// detokenize; greedy output alone vs batched with others; a follow-up turn with and without prefix reuse), the JSON
// Schema a constrained reply must satisfy, and the HTTP status codes the security rules promise.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "format/gguf.h"
#include "runtime/stage_plan.h"
#include "server/api_common.h"
#include "server/metrics.h"
#include "server/reply_parser.h"
#include "test_util.h"

extern char** environ;

namespace strata::testing {
namespace {

using Json = nlohmann::json;
using namespace std::chrono_literals;

const std::string& tiny_model() {
    static const std::string path = [] {
        const std::string out = process_temp_dir() / "tiny.gguf";
        const ShellRun r = run_strata("synth --preset tiny --out " + shell_quote(out));
        EXPECT_EQ(r.status, 0) << r.err;
        return out;
    }();
    return path;
}

// One `strata serve` process on a free port; SIGTERM when it goes (and the exit status must then be 0).
class Server {
  public:
    explicit Server(std::vector<std::string> flags, std::vector<std::string> env_extra = {}, std::string model = {}) {
        // A request the server refuses early (413) may close the socket while the test still writes: that must be an
        // error the test sees, not SIGPIPE killing the test program (and leaving its servers running).
        ::signal(SIGPIPE, SIG_IGN);
        log_ = dir_ / "stderr";
        if (model.empty()) model = tiny_model();
        std::vector<std::string> argv = {STRATA_BINARY, "serve", "--model", model, "--port", "0"};
        if (std::find(flags.begin(), flags.end(), "--threads") == flags.end()) flags.insert(flags.end(), {"--threads", "2"});
        argv.insert(argv.end(), flags.begin(), flags.end());
        std::vector<char*> cargv;
        for (auto& a : argv) cargv.push_back(a.data());
        cargv.push_back(nullptr);
        std::vector<std::string> env;
        for (char** e = environ; *e; ++e)
            if (std::string(*e).rfind("STRATA_API_KEY=", 0) != 0) env.emplace_back(*e);
        env.insert(env.end(), env_extra.begin(), env_extra.end());
        std::vector<char*> cenv;
        for (auto& e : env) cenv.push_back(e.data());
        cenv.push_back(nullptr);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 2, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
        const int rc = posix_spawn(&pid_, argv[0].c_str(), &actions, nullptr, cargv.data(), cenv.data());
        posix_spawn_file_actions_destroy(&actions);
        if (rc != 0) {
            ADD_FAILURE() << "cannot start " << argv[0];
            pid_ = -1;
            return;
        }
        const std::string listening = "listening on http://127.0.0.1:";
        const auto deadline = std::chrono::steady_clock::now() + 60s;
        while (std::chrono::steady_clock::now() < deadline) {
            const std::string text = read_text(log_);
            if (const size_t at = text.find(listening); at != std::string::npos) {
                port_ = std::atoi(text.c_str() + at + listening.size());
                return;
            }
            int status = 0;
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                ADD_FAILURE() << "strata serve exited at start: " << text;
                pid_ = -1;
                return;
            }
            std::this_thread::sleep_for(20ms);
        }
        ADD_FAILURE() << "strata serve did not start: " << read_text(log_);
    }
    ~Server() {
        const int status = stop();
        EXPECT_EQ(status, 0) << "strata serve should exit 0 on SIGTERM; stderr:\n" << read_text(log_);
    }
    int stop() {
        if (pid_ <= 0) return 0;
        kill(pid_, SIGTERM);
        int status = 0;
        waitpid(pid_, &status, 0);
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    int port() const { return port_; }
    std::string log() const { return read_text(log_); }
    httplib::Client client() const {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(120, 0);
        return c;
    }
    httplib::Result post(const std::string& path, const Json& body, const httplib::Headers& headers = {}) const {
        return client().Post(path.c_str(), headers, body.dump(), "application/json");
    }
    Json post_json(const std::string& path, const Json& body) const {
        auto r = post(path, body);
        EXPECT_TRUE(r) << "no response from " << path;
        if (!r) return Json();
        EXPECT_EQ(r->status, 200) << r->body;
        return Json::parse(r->body);
    }
    // The server's counter or gauge value from /metrics (-1 when absent).
    double metric(const std::string& name) const {
        auto r = client().Get("/metrics");
        if (!r) return -1;
        const std::string key = "\n" + name + " ";
        const size_t at = r->body.find(key);
        if (at == std::string::npos) return -1;
        return std::strtod(r->body.c_str() + at + key.size(), nullptr);
    }

  private:
    TempDir dir_;
    std::string log_;
    pid_t pid_ = -1;
    int port_ = 0;
};

struct SseEvent {
    std::string event;
    std::string data;
};

std::vector<SseEvent> parse_sse(const std::string& body) {
    std::vector<SseEvent> out;
    size_t start = 0;
    while (start < body.size()) {
        size_t end = body.find("\n\n", start);
        if (end == std::string::npos) end = body.size();
        const std::string block = body.substr(start, end - start);
        start = end + 2;
        if (block.empty()) continue;
        SseEvent e;
        std::istringstream lines(block);
        std::string line;
        while (std::getline(lines, line)) {
            if (line.rfind("event: ", 0) == 0) e.event = line.substr(7);
            if (line.rfind("data: ", 0) == 0) e.data += line.substr(6);
        }
        out.push_back(e);
    }
    return out;
}

const Json kHello = {{"role", "user"}, {"content", "Hello, who are you?"}};

// One server for the tests that do not need special flags: started by the first of them, stopped after the last.
Server* g_shared = nullptr;

class SharedServerEnvironment : public ::testing::Environment {
  public:
    void TearDown() override {
        delete g_shared;
        g_shared = nullptr;
    }
};
[[maybe_unused]] ::testing::Environment* const g_environment =
    ::testing::AddGlobalTestEnvironment(new SharedServerEnvironment);

Server& shared_server() {
    if (!g_shared) g_shared = new Server({"--parallel", "4"});
    return *g_shared;
}

// ---- basic endpoints ----------------------------------------------------------------------------------------------

TEST(Server, HealthModelsAndStatus) {
    const Server& s = shared_server();
    auto h = s.client().Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_EQ(Json::parse(h->body)["status"], "ok");
    auto m = s.client().Get("/v1/models");
    ASSERT_TRUE(m);
    const Json models = Json::parse(m->body);
    EXPECT_EQ(models["object"], "list");
    ASSERT_EQ(models["data"].size(), 1u);
    EXPECT_EQ(models["data"][0]["id"], "strata-synth-tiny");  // general.name of the synth file
    EXPECT_EQ(models["data"][0]["object"], "model");
    auto st = s.client().Get("/v1/status");
    ASSERT_TRUE(st);
    const Json status = Json::parse(st->body);
    EXPECT_EQ(status["model"]["arch"], "qwen4exp");
    EXPECT_EQ(status["slots"].size(), 4u);
    EXPECT_GT(status["memory_plan"]["total_bytes"].get<double>(), 0);
    EXPECT_TRUE(status.contains("cuda_memory_plan"));  // the CUDA plan: null on the CPU backend
    EXPECT_TRUE(status["cuda_memory_plan"].is_null());
    // Experts in host RAM: no expert cache on the CPU backend, so neither the status field nor the counters.
    EXPECT_TRUE(status.contains("expert_cache"));
    EXPECT_TRUE(status["expert_cache"].is_null());
    EXPECT_EQ(s.metric("strata:expert_cache_lookups_total"), -1);
    // The doorbell's timeout counter is exported (zero: no device waits for a host doorbell in this model).
    EXPECT_EQ(s.metric("strata:doorbell_timeouts_total"), 0);
    auto root = s.client().Get("/");
    ASSERT_TRUE(root);
    EXPECT_EQ(root->status, 200);
    EXPECT_NE(root->get_header_value("Content-Type").find("text/html"), std::string::npos);
    EXPECT_NE(root->get_header_value("Content-Security-Policy").find("default-src 'none'"), std::string::npos);
}

TEST(Server, ChatNonStreamingAndStreamingAgree) {
    const Server& s = shared_server();
    const Json req = {{"model", "strata-synth-tiny"}, {"messages", {kHello}}, {"max_tokens", 12}, {"temperature", 0}};
    const Json r = s.post_json("/v1/chat/completions", req);
    EXPECT_EQ(r["object"], "chat.completion");
    EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
    ASSERT_TRUE(r["choices"][0]["message"]["content"].is_string());
    const std::string reason = r["choices"][0]["finish_reason"];
    EXPECT_TRUE(reason == "stop" || reason == "length") << reason;
    EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), 0);
    EXPECT_LE(r["usage"]["completion_tokens"].get<int>(), 12);
    EXPECT_EQ(r["usage"]["total_tokens"], r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>());

    Json sreq = req;
    sreq["stream"] = true;
    sreq["stream_options"] = {{"include_usage", true}};
    auto res = s.post("/v1/chat/completions", sreq);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_NE(res->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    const auto events = parse_sse(res->body);
    ASSERT_GE(events.size(), 3u);
    EXPECT_EQ(events.back().data, "[DONE]");
    std::string content;
    std::string finish;
    Json usage;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        const Json chunk = Json::parse(events[i].data);
        EXPECT_EQ(chunk["object"], "chat.completion.chunk");
        EXPECT_EQ(chunk["id"], Json::parse(events[0].data)["id"]);
        if (chunk["choices"].empty()) {
            usage = chunk["usage"];
            continue;
        }
        const Json& delta = chunk["choices"][0]["delta"];
        if (i == 0) {
            EXPECT_EQ(delta["role"], "assistant");
        }
        if (delta.contains("content")) content += delta["content"].get<std::string>();
        if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(content, r["choices"][0]["message"]["content"].get<std::string>()) << "greedy: the same text either way";
    EXPECT_EQ(finish, reason);
    ASSERT_TRUE(usage.is_object()) << "stream_options.include_usage: usage in the last chunk";
    EXPECT_EQ(usage["completion_tokens"], r["usage"]["completion_tokens"]);
}

TEST(Server, CompletionsWithTextAndTokenPrompts) {
    const Server& s = shared_server();
    const Json r = s.post_json("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0},
                                                   {"logprobs", 2}, {"ignore_eos", true}});
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_EQ(r["usage"]["completion_tokens"], 5);
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
    const Json& lp = r["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
        EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
        EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    }
    // Greedy: the chosen token is the most likely one, so its log-probability is the top one's.
    double best = -1e30;
    for (const auto& [token, value] : lp["top_logprobs"][0].items()) best = std::max(best, value.get<double>());
    EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), best, 1e-6);
    const Json t = s.post_json("/v1/completions", {{"prompt", {79, 110, 99, 101}}, {"max_tokens", 3}, {"temperature", 0}});
    EXPECT_EQ(t["usage"]["prompt_tokens"], 4);
}

TEST(Server, TokenizeDetokenizeRoundTrip) {
    const Server& s = shared_server();
    const std::string text = "Grüße, 世界! <|endoftext|> tabs\tand\nlines";
    const Json tok = s.post_json("/tokenize", {{"content", text}});
    ASSERT_TRUE(tok["tokens"].is_array());
    EXPECT_GT(tok["tokens"].size(), 5u);
    const Json back = s.post_json("/detokenize", {{"tokens", tok["tokens"]}});
    EXPECT_EQ(back["content"], text);
    const Json pieces = s.post_json("/tokenize", {{"content", "ab"}, {"with_pieces", true}});
    ASSERT_EQ(pieces["tokens"].size(), 2u);
    EXPECT_EQ(pieces["tokens"][0]["piece"], "a");
    auto bad = s.post("/detokenize", {{"tokens", {1, 99999}}});
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
}

TEST(Server, AnthropicMessagesStreamEventOrder) {
    const Server& s = shared_server();
    const Json req = {{"model", "strata-synth-tiny"},
                      {"max_tokens", 6},
                      {"system", "Be brief."},
                      {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}}},
                      {"temperature", 0},
                      {"stream", true}};
    auto res = s.post("/v1/messages", req);
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    std::vector<std::string> order;
    std::string text;
    for (const auto& e : parse_sse(res->body)) {
        const Json d = Json::parse(e.data);
        EXPECT_EQ(d["type"], e.event) << "event name and data.type agree";
        if (e.event == "ping") continue;
        order.push_back(e.event);
        if (e.event == "content_block_delta" && d["delta"]["type"] == "text_delta") text += d["delta"]["text"];
        if (e.event == "message_delta") {
            EXPECT_TRUE(d["delta"]["stop_reason"] == "end_turn" || d["delta"]["stop_reason"] == "max_tokens");
            EXPECT_TRUE(d["usage"]["output_tokens"].is_number());
        }
        if (e.event == "message_start") {
            EXPECT_EQ(d["message"]["role"], "assistant");
        }
    }
    // message_start (content_block_start content_block_delta+ content_block_stop)* message_delta message_stop
    std::string joined_order;
    for (const auto& e : order) joined_order += e + " ";
    ASSERT_GE(order.size(), 3u) << joined_order;
    EXPECT_EQ(order.front(), "message_start") << joined_order;
    EXPECT_EQ(order[order.size() - 2], "message_delta") << joined_order;
    EXPECT_EQ(order.back(), "message_stop") << joined_order;
    size_t i = 1;
    while (i + 2 < order.size()) {
        EXPECT_EQ(order[i++], "content_block_start") << joined_order;
        size_t deltas = 0;
        while (i + 2 < order.size() && order[i] == "content_block_delta") ++i, ++deltas;
        EXPECT_GE(deltas, 1u) << joined_order;
        EXPECT_EQ(order[i++], "content_block_stop") << joined_order;
    }

    Json plain = req;
    plain.erase("stream");
    const Json r = s.post_json("/v1/messages", plain);
    EXPECT_EQ(r["type"], "message");
    std::string joined;
    for (const auto& b : r["content"])
        if (b["type"] == "text") joined += b["text"].get<std::string>();
    EXPECT_EQ(joined, text);
    auto missing = s.post("/v1/messages", {{"messages", {kHello}}});
    ASSERT_TRUE(missing);
    EXPECT_EQ(missing->status, 400);
    const Json err = Json::parse(missing->body);
    EXPECT_EQ(err["type"], "error");
    EXPECT_EQ(err["error"]["type"], "invalid_request_error");
}

// ---- constrained decoding -------------------------------------------------------------------------------------------

TEST(Server, JsonSchemaOutputParsesAndValidates) {
    const Server& s = shared_server();
    const Json schema = {{"type", "object"},
                         {"properties",
                          {{"ok", {{"type", "boolean"}}},
                           {"color", {{"enum", {"red", "green", "blue"}}}},
                           {"count", {{"type", "integer"}}}}},
                         {"required", {"ok", "color", "count"}}};
    for (uint64_t seed : {1, 2, 3}) {
        const Json r = s.post_json(
            "/v1/chat/completions",
            {{"messages", {kHello}},
             {"max_tokens", 200},
             {"seed", seed},
             {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "t"}, {"schema", schema}}}}}});
        const std::string content = r["choices"][0]["message"]["content"];
        EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << content;
        const Json v = Json::parse(content, nullptr, false);
        ASSERT_TRUE(v.is_object()) << content;
        EXPECT_TRUE(v["ok"].is_boolean()) << content;
        EXPECT_TRUE(v["color"] == "red" || v["color"] == "green" || v["color"] == "blue") << content;
        EXPECT_TRUE(v["count"].is_number_integer()) << content;
        EXPECT_EQ(v.size(), 3u) << content;
    }
}

// The bundled model (a 19M code model, trained weights) on the schema of issue 30: an object with one string property,
// strict. It likes to indent by 20 spaces, which it writes as pairs of 3 + 1 spaces; with whitespace bounded only
// loosely it ran out of tokens before the closing brace. Greedy, so the answers are reproducible; several prompts, at
// the default max_tokens and at 64. Oracle: nlohmann's parser and the schema (one key "name", a string).
TEST(Server, BundledModelJsonSchemaAnswersParseWithinTheirBudget) {
    const std::string bundled = std::string(STRATA_SOURCE_DIR) + "/assets/strata-code-19m.gguf";
    Server s({"--parallel", "2"}, {}, bundled);
    const Json schema = Json::parse(R"({"type": "object", "properties": {"name": {"type": "string"}},
                                        "required": ["name"], "additionalProperties": false})");
    const Json response_format = {{"type", "json_schema"},
                                  {"json_schema", {{"name", "named"}, {"strict", true}, {"schema", schema}}}};
    for (const char* prompt : {"Give me a name as JSON.", "Name a programming language.",
                               "Reply with JSON: the name of a fruit.", "Hello, who are you?",
                               "What is the name of the function that sorts a list in Python?",
                               "Write a Python function that adds two numbers."}) {
        for (const int max_tokens : {0, 64}) {  // 0: the default (up to the context)
            Json req = {{"messages", {{{"role", "user"}, {"content", prompt}}}},
                        {"temperature", 0},
                        {"response_format", response_format}};
            if (max_tokens > 0) req["max_tokens"] = max_tokens;
            const Json r = s.post_json("/v1/chat/completions", req);
            if (r.is_null()) continue;
            const std::string content = r["choices"][0]["message"]["content"];
            const std::string where = std::string(prompt) + ", max_tokens " + std::to_string(max_tokens) + ": ";
            EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << where << content;
            const Json v = Json::parse(content, nullptr, false);
            ASSERT_TRUE(v.is_object()) << where << content;
            EXPECT_EQ(v.size(), 1u) << where << content;
            EXPECT_TRUE(v.contains("name") && v["name"].is_string()) << where << content;
        }
    }
}

TEST(Server, ToolChoiceRequiredYieldsToolCalls) {
    const Server& s = shared_server();
    const Json tools = {{{"type", "function"},
                         {"function",
                          {{"name", "get_weather"},
                           {"description", "Weather in a city"},
                           {"parameters",
                            {{"type", "object"},
                             {"properties", {{"city", {{"enum", {"Paris", "Rome"}}}}}},
                             {"required", {"city"}}}}}}}};
    const Json r = s.post_json("/v1/chat/completions", {{"messages", {kHello}},
                                                        {"tools", tools},
                                                        {"tool_choice", "required"},
                                                        {"parallel_tool_calls", false},
                                                        {"max_tokens", 200},
                                                        {"seed", 7}});
    const Json& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
    ASSERT_TRUE(choice["message"]["tool_calls"].is_array()) << r.dump();
    ASSERT_GE(choice["message"]["tool_calls"].size(), 1u);
    const Json& call = choice["message"]["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["function"]["name"], "get_weather");
    const Json args = Json::parse(call["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Rome") << args.dump();
    EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);

    // The same while streaming: the call arrives as a delta.tool_calls entry.
    auto res = s.post("/v1/chat/completions", {{"messages", {kHello}},
                                               {"tools", tools},
                                               {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                                               {"max_tokens", 200},
                                               {"stream", true}});
    ASSERT_TRUE(res);
    int calls = 0;
    std::string finish;
    for (const auto& e : parse_sse(res->body)) {
        if (e.data == "[DONE]") continue;
        const Json c = Json::parse(e.data);
        const Json& d = c["choices"][0]["delta"];
        if (d.contains("tool_calls")) {
            ++calls;
            EXPECT_EQ(d["tool_calls"][0]["function"]["name"], "get_weather");
        }
        EXPECT_FALSE(d.contains("content") && d["content"].get<std::string>().find("<tool_call>") != std::string::npos);
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_GE(calls, 1);
    EXPECT_EQ(finish, "tool_calls");
}

// ---- reply parsing (in process) ---------------------------------------------------------------------------------------

// Feeds `text` to a parser in pieces of `step` bytes and joins what comes out by kind.
struct Parsed {
    std::string reasoning, content;
    std::vector<server::ParsedToolCall> calls;
};

Parsed parse_in_pieces(const std::string& text, size_t step, server::ReplyParserOptions options) {
    server::ReplyParser parser(options);
    Parsed out;
    auto take = [&](const std::vector<server::ReplyPiece>& pieces) {
        for (const auto& p : pieces) {
            if (p.kind == server::ReplyPiece::Kind::kReasoning) out.reasoning += p.text;
            if (p.kind == server::ReplyPiece::Kind::kContent) out.content += p.text;
            if (p.kind == server::ReplyPiece::Kind::kToolCall) out.calls.push_back(p.call);
        }
    };
    for (size_t i = 0; i < text.size(); i += step) take(parser.push(text.substr(i, step)));
    take(parser.finish());
    return out;
}

TEST(ReplyParser, SplitsThinkingContentAndToolCallsWhateverThePieces) {
    const std::string text =
        "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
        "</tool_call>";
    for (size_t step : {1, 2, 3, 7, 1000}) {
        const Parsed p = parse_in_pieces(text, step, {.parse_tool_calls = true});
        EXPECT_EQ(p.reasoning, "The user wants weather.\n") << "step " << step;
        EXPECT_EQ(p.content, "Let me check.\n") << "step " << step;
        ASSERT_EQ(p.calls.size(), 2u) << "step " << step;
        EXPECT_EQ(p.calls[0].name, "get_weather");
        EXPECT_EQ(Json::parse(p.calls[0].arguments), Json({{"city", "Paris"}}));
        EXPECT_EQ(p.calls[1].name, "get_time");
        EXPECT_NE(p.calls[0].id, p.calls[1].id);
    }
}

TEST(ReplyParser, QwenXmlToolCalls) {
    const std::string text =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>";
    for (size_t step : {1, 5, 1000}) {
        const Parsed p = parse_in_pieces(text, step, {.parse_tool_calls = true});
        ASSERT_EQ(p.calls.size(), 1u);
        EXPECT_EQ(p.calls[0].name, "get_weather");
        EXPECT_EQ(Json::parse(p.calls[0].arguments), Json({{"city", "Paris"}, {"days", 3}}));
        EXPECT_EQ(p.content, "");
    }
}

TEST(ReplyParser, PromptOpenedThinkingAndPlainText) {
    // The template ended the prompt with "<think>\n": the reply starts inside the reasoning.
    const Parsed a = parse_in_pieces("Hmm, 2+2.\n</think>\n\n4", 1, {.start_in_reasoning = true});
    EXPECT_EQ(a.reasoning, "Hmm, 2+2.\n");
    EXPECT_EQ(a.content, "4");
    // Without tools a tool-call tag is text; a <think> after content is text; a truncated tag is flushed as text.
    const Parsed b = parse_in_pieces("x <tool_call>{} <think>y</think> <tool", 1, {});
    EXPECT_EQ(b.content, "x <tool_call>{} <think>y</think> <tool");
    EXPECT_TRUE(b.calls.empty());
    // A tool call whose body is not JSON stays text; an unclosed one that parses still counts.
    const Parsed c = parse_in_pieces("<tool_call>\nnot json\n</tool_call>", 1, {.parse_tool_calls = true});
    EXPECT_EQ(c.content, "<tool_call>\nnot json\n</tool_call>");
    const Parsed d = parse_in_pieces("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", 1, {.parse_tool_calls = true});
    ASSERT_EQ(d.calls.size(), 1u);
    EXPECT_EQ(d.calls[0].name, "f");
}

TEST(Server, AnthropicToolUseAndChatLogprobsStream) {
    const Server& s = shared_server();
    const Json tools = {{{"name", "lookup"},
                         {"description", "Look a word up"},
                         {"input_schema",
                          {{"type", "object"}, {"properties", {{"word", {{"enum", {"cat", "dog"}}}}}}, {"required", {"word"}}}}}};
    const Json r = s.post_json("/v1/messages", {{"model", "strata-synth-tiny"},
                                                {"max_tokens", 200},
                                                {"messages", {kHello}},
                                                {"tools", tools},
                                                {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}}});
    EXPECT_EQ(r["stop_reason"], "tool_use") << r.dump();
    bool found = false;
    for (const auto& b : r["content"]) {
        if (b["type"] != "tool_use") continue;
        found = true;
        EXPECT_EQ(b["name"], "lookup");
        EXPECT_TRUE(b["input"]["word"] == "cat" || b["input"]["word"] == "dog") << b.dump();
        EXPECT_EQ(b["id"].get<std::string>().rfind("toolu_", 0), 0u);
    }
    EXPECT_TRUE(found) << r.dump();

    // A follow-up with the tool result renders and runs.
    Json messages = {kHello, {{"role", "assistant"}, {"content", r["content"]}}};
    for (const auto& b : r["content"])
        if (b["type"] == "tool_use")
            messages.push_back({{"role", "user"},
                                {"content", {{{"type", "tool_result"}, {"tool_use_id", b["id"]}, {"content", "a small pet"}}}}});
    const Json follow = s.post_json("/v1/messages", {{"max_tokens", 4}, {"messages", messages}, {"tools", tools}});
    EXPECT_EQ(follow["type"], "message");

    auto res = s.post("/v1/chat/completions", {{"messages", {kHello}}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true},
                                               {"logprobs", true}, {"top_logprobs", 3}, {"stream", true}});
    ASSERT_TRUE(res);
    size_t n_logprobs = 0;
    for (const auto& e : parse_sse(res->body)) {
        if (e.data == "[DONE]") continue;
        const Json c = Json::parse(e.data);
        const Json& lp = c["choices"][0]["logprobs"];
        if (!lp.is_object()) continue;
        for (const auto& t : lp["content"]) {
            ++n_logprobs;
            EXPECT_LE(t["top_logprobs"].size(), 3u);
            EXPECT_EQ(t["logprob"], t["top_logprobs"][0]["logprob"]) << "greedy takes the most likely token";
        }
    }
    EXPECT_EQ(n_logprobs, 6u);
}

// ---- scheduling ------------------------------------------------------------------------------------------------

TEST(Server, BatchedEqualsSingle) {
    Server s({"--parallel", "8", "--no-prefix-cache"});
    auto request = [&](int i) {
        std::string prompt = "Request number " + std::to_string(i) + ":";
        for (int k = 0; k < i * 7; ++k) prompt += " word";
        return Json{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 0}};
    };
    std::vector<Json> alone;
    for (int i = 0; i < 8; ++i) alone.push_back(s.post_json("/v1/completions", request(i)));
    std::vector<std::future<Json>> together;
    for (int i = 0; i < 8; ++i)
        together.push_back(std::async(std::launch::async, [&, i] { return s.post_json("/v1/completions", request(i)); }));
    for (int i = 0; i < 8; ++i) {
        const Json r = together[static_cast<size_t>(i)].get();
        const Json& a = alone[static_cast<size_t>(i)]["choices"][0];
        const Json& b = r["choices"][0];
        EXPECT_EQ(a["text"], b["text"]) << "request " << i;
        EXPECT_EQ(a["logprobs"]["tokens"], b["logprobs"]["tokens"]) << "request " << i;
        EXPECT_EQ(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]) << "request " << i;
    }
}

// Speculation (on by default with the bundled model's MTP layer) samples a window's rows in order as one-token steps
// would: the same text and log-probabilities as a server without it, greedy and sampled (the request's own random
// stream, penalties), and /metrics counts its rounds.
TEST(Server, SpeculationGivesTheSameOutput) {
    const std::string bundled = std::string(STRATA_SOURCE_DIR) + "/assets/strata-code-19m.gguf";
    Server with({"--parallel", "2"}, {}, bundled);  // the default: on, the model has an MTP layer
    Server without({"--parallel", "2", "--no-spec"}, {}, bundled);
    // Code that repeats itself, so that prompt lookup finds drafts.
    std::string code = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n";
    const Json requests[] = {
        {{"prompt", code}, {"max_tokens", 64}, {"temperature", 0}, {"logprobs", 2}},
        {{"prompt", code}, {"max_tokens", 64}, {"temperature", 0.8}, {"seed", 11}, {"repetition_penalty", 1.1}},
        {{"prompt", code + "    return a * b\n\n\ndef div(a, b):\n"}, {"max_tokens", 48}, {"temperature", 0.7},
         {"seed", 3}, {"stop", Json::array({"\n\n\n"})}},
    };
    for (const Json& request : requests) {
        const Json a = with.post_json("/v1/completions", request)["choices"][0];
        const Json b = without.post_json("/v1/completions", request)["choices"][0];
        EXPECT_EQ(a["text"], b["text"]) << request.dump();
        EXPECT_EQ(a["logprobs"], b["logprobs"]) << request.dump();
        EXPECT_EQ(a["finish_reason"], b["finish_reason"]) << request.dump();
    }
    EXPECT_GT(with.metric("strata:spec_rounds_total"), 0);
    EXPECT_GT(with.metric("strata:spec_accepted_tokens_total"), 0);
    EXPECT_EQ(without.metric("strata:spec_rounds_total"), 0);
    // A second turn reuses the slot's checkpoint taken after a window: the same output as computed afresh.
    const Json again = with.post_json("/v1/completions", requests[0])["choices"][0];
    EXPECT_EQ(again["text"], without.post_json("/v1/completions", requests[0])["choices"][0]["text"]);
}

// MTP drafts in the server (each slot's drafter reads the slot's residual rows from the batched pass): the same
// output as a server without speculation, one request at a time and four batched, with MTP drafting every round
// (rejections included) and with the default policy; a sampled request, and a second turn that restores a slot's
// checkpoint and its drafter's mark. /metrics counts the rounds by drafter.
TEST(Server, MtpSpeculationGivesTheSameOutputAloneAndBatched) {
    const std::string bundled = std::string(STRATA_SOURCE_DIR) + "/assets/strata-code-19m.gguf";
    Server plain({"--parallel", "4", "--no-spec"}, {}, bundled);
    Server forced({"--parallel", "4", "--spec", "3", "--spec-drafter", "mtp", "--spec-fixed", "--spec-min-p", "0"}, {},
                  bundled);
    Server policy({"--parallel", "4"}, {}, bundled);
    const std::string prompts[] = {
        "import os\n\n\ndef list_files(path):\n",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
        "# Read a CSV file and print the sum of the second column\nimport csv\n",
        "def fib(n):\n    if n < 2:\n        return n\n",
    };
    auto request = [&](size_t i) {
        return Json{{"prompt", prompts[i]}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}};
    };
    std::vector<std::string> want;
    for (size_t i = 0; i < 4; ++i) want.push_back(plain.post_json("/v1/completions", request(i))["choices"][0]["text"]);
    for (Server* s : {&forced, &policy}) {
        for (size_t i = 0; i < 4; ++i)
            EXPECT_EQ(s->post_json("/v1/completions", request(i))["choices"][0]["text"], want[i]) << "alone " << i;
        std::vector<std::future<Json>> together;
        for (size_t i = 0; i < 4; ++i)
            together.push_back(std::async(std::launch::async, [&, i] { return s->post_json("/v1/completions", request(i)); }));
        for (size_t i = 0; i < 4; ++i) EXPECT_EQ(together[i].get()["choices"][0]["text"], want[i]) << "batched " << i;
    }
    const Json sampled = {{"prompt", prompts[1]}, {"max_tokens", 40}, {"temperature", 0.8}, {"seed", 5}};
    EXPECT_EQ(forced.post_json("/v1/completions", sampled)["choices"][0]["text"],
              plain.post_json("/v1/completions", sampled)["choices"][0]["text"]);
    // A prompt that goes on from another's end: the slot restores the checkpoint there and its drafter's mark.
    const Json follow = {{"prompt", prompts[2] + "import sys\n\n\ndef total(path):\n"}, {"max_tokens", 40},
                         {"temperature", 0}, {"ignore_eos", true}};
    const double cached = forced.metric("strata:prompt_tokens_cached_total");
    EXPECT_EQ(forced.post_json("/v1/completions", follow)["choices"][0]["text"],
              plain.post_json("/v1/completions", follow)["choices"][0]["text"]);
    EXPECT_GT(forced.metric("strata:prompt_tokens_cached_total"), cached);
    EXPECT_GT(forced.metric("strata:spec_drafter_rounds_total{drafter=\"mtp\"}"), 0);
    // A drafter out of step with its slot would still give the same text, but its drafts would rarely be accepted
    // (`strata generate` accepts 0.46 of these forced drafts on the first two prompts).
    const double mtp_drafted = forced.metric("strata:spec_drafter_draft_tokens_total{drafter=\"mtp\"}");
    const double mtp_accepted = forced.metric("strata:spec_drafter_accepted_tokens_total{drafter=\"mtp\"}");
    std::printf("[ mtp in serve ] %.0f of %.0f forced drafts accepted\n", mtp_accepted, mtp_drafted);
    EXPECT_GT(mtp_accepted, 0.3 * mtp_drafted);
    EXPECT_EQ(forced.metric("strata:spec_drafter_rounds_total{drafter=\"lookup\"}"), 0);
    EXPECT_EQ(forced.metric("strata:spec_rounds_total"),
              forced.metric("strata:spec_drafter_rounds_total{drafter=\"mtp\"}"));
    EXPECT_GT(policy.metric("strata:spec_rounds_total"), 0);
}

// The speculation flags' user errors: one line, status 2, before the server listens (timeout: a server that started
// anyway is ended, and the status then fails the test).
TEST(Server, SpeculationFlagErrors) {
    const std::string serve = "timeout 60 " + shell_quote(STRATA_BINARY) + " serve --port 0 --model ";
    expect_user_error(run_shell(serve + shell_quote(tiny_model()) + " --spec-drafter mtp"), "no MTP layer");
    expect_user_error(run_shell(serve + shell_quote(tiny_model()) + " --spec-drafter bogus"), "--spec-drafter");
    expect_user_error(run_shell(serve + shell_quote(tiny_model()) + " --spec-min-p 2"), "--spec-min-p");
}

// Opens a stream with a raw socket, reads until `min_bytes` arrived, and closes the connection.
void open_and_abandon_stream(int port, const Json& body, size_t min_bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string payload = body.dump();
    const std::string request = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                                "\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(payload.size()) + "\r\n\r\n" + payload;
    ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    size_t got = 0;
    char buf[4096];
    if (min_bytes == 0) std::this_thread::sleep_for(150ms);  // a non-streaming request: nothing comes before the end
    while (got < min_bytes) {
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
    }
    EXPECT_GE(got, min_bytes);
    ::close(fd);
}

TEST(Server, ClosingAStreamCancelsItAndFreesTheSlot) {
    Server s({"--parallel", "2", "--ctx-size", "32768", "--threads", "1"});
    const double before = s.metric("strata:requests_cancelled_total");
    ASSERT_GE(before, 0);
    const Json body = {{"messages", {kHello}}, {"max_tokens", 30000}, {"ignore_eos", true}, {"stream", true}};
    open_and_abandon_stream(s.port(), body, 2000);
    bool cancelled = false;
    for (int i = 0; i < 200 && !cancelled; ++i) {
        cancelled = s.metric("strata:requests_cancelled_total") > before;
        if (!cancelled) std::this_thread::sleep_for(25ms);
    }
    EXPECT_TRUE(cancelled) << s.log();
    EXPECT_EQ(s.metric("strata:num_requests_running"), 0);
    auto st = s.client().Get("/v1/status");
    ASSERT_TRUE(st);
    const Json status = Json::parse(st->body);
    for (const auto& slot : status["slots"]) EXPECT_EQ(slot["state"], "idle");
    // Far fewer tokens than asked for were generated.
    EXPECT_LT(s.metric("strata:generation_tokens_total"), 20000);
    // And the server still answers.
    const Json r = s.post_json("/v1/chat/completions", {{"messages", {kHello}}, {"max_tokens", 3}});
    EXPECT_EQ(r["object"], "chat.completion");
}

TEST(Server, AClientLeavingANonStreamingRequestCancelsIt) {
    Server s({"--parallel", "1", "--ctx-size", "32768", "--threads", "1"});
    const double before = s.metric("strata:requests_cancelled_total");
    open_and_abandon_stream(s.port(), {{"messages", {kHello}}, {"max_tokens", 30000}, {"ignore_eos", true}}, 0);
    bool cancelled = false;
    for (int i = 0; i < 200 && !cancelled; ++i) {
        cancelled = s.metric("strata:requests_cancelled_total") > before;
        if (!cancelled) std::this_thread::sleep_for(25ms);
    }
    EXPECT_TRUE(cancelled) << s.log();
    EXPECT_LT(s.metric("strata:generation_tokens_total"), 20000);
}

TEST(Server, ANewConversationReusesASharedSystemPrompt) {
    Server s({"--parallel", "2"});
    const Json system = {{"role", "system"}, {"content", "You answer questions about ships. Be exact and brief, always."}};
    auto ask = [&](const std::string& q) {
        return s.post_json("/v1/chat/completions", {{"messages", {system, {{"role", "user"}, {"content", q}}}},
                                                    {"max_tokens", 4}, {"temperature", 0}});
    };
    ask("What is a keel?");
    const Json other = ask("What is a rudder made of?");
    const int64_t cached = other["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_GT(cached, 40) << "the system message was computed again";
    EXPECT_LT(cached, other["usage"]["prompt_tokens"].get<int64_t>());
}

TEST(Server, PrefixReuseOnASecondTurnGivesTheSameOutput) {
    Server reuse({"--parallel", "2"});
    Server fresh({"--parallel", "2", "--no-prefix-cache"});
    Json messages = {{{"role", "system"}, {"content", "You are a helpful assistant."}}, kHello};
    const Json first = reuse.post_json("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}});
    messages.push_back(first["choices"][0]["message"]);
    messages.push_back({{"role", "user"}, {"content", "Tell me more about that, please."}});
    const Json req = {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}};
    const Json a = reuse.post_json("/v1/chat/completions", req);
    const Json b = fresh.post_json("/v1/chat/completions", req);
    const int64_t cached = a["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_GT(cached, 0);
    EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
    EXPECT_EQ(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    EXPECT_EQ(reuse.metric("strata:prompt_tokens_cached_total"), static_cast<double>(cached));
}

// A plain completion sent again keeps all of its prompt but the last token (whose logits give the first new one),
// and says the same.
TEST(Server, TheSameCompletionPromptAgainReusesAllButItsLastToken) {
    Server s({"--parallel", "1"});
    const Json req = {{"prompt", "def fibonacci(n):\n    if n < 2:\n        return n\n    return"},
                      {"max_tokens", 12},
                      {"temperature", 0}};
    const Json first = s.post_json("/v1/completions", req);
    const Json again = s.post_json("/v1/completions", req);
    EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
              again["usage"]["prompt_tokens"].get<int64_t>() - 1);
    EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);
}

TEST(Server, FullQueueAnswers503) {
    Server s({"--parallel", "1", "--queue", "0", "--ctx-size", "32768", "--threads", "1"});
    std::thread busy([&] {
        s.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 20000}, {"ignore_eos", true}});
    });
    // Once the long request holds the only slot (and there is no queue), any other request is refused.
    for (int i = 0; i < 400 && s.metric("strata:num_requests_running") < 1; ++i) std::this_thread::sleep_for(5ms);
    bool saw_503 = false;
    for (int i = 0; i < 20 && !saw_503; ++i) {
        auto r = s.post("/v1/completions", {{"prompt", "y"}, {"max_tokens", 1}});
        EXPECT_TRUE(r);
        if (!r) break;
        if (r->status == 503) {
            saw_503 = true;
            EXPECT_EQ(Json::parse(r->body)["error"]["code"], "server_busy");
        }
    }
    EXPECT_TRUE(saw_503) << s.log();
    s.stop();  // ends the long request too
    busy.join();
}

// ---- security ----------------------------------------------------------------------------------------------------

TEST(Server, NonLoopbackBindNeedsAKey) {
    const ShellRun r = run_shell("env -u STRATA_API_KEY " + shell_quote(STRATA_BINARY) + " serve --model " +
                                 shell_quote(tiny_model()) + " --host 0.0.0.0 --port 0");
    expect_user_error(r, "--api-key");
}

TEST(Server, ApiKeyAndCrossSiteChecks) {
    Server s({"--api-key", "sekret-key"});
    const Json body = {{"prompt", "a"}, {"max_tokens", 1}};
    auto none = s.post("/v1/completions", body);
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 401);
    EXPECT_EQ(Json::parse(none->body)["error"]["type"], "authentication_error");
    auto wrong = s.post("/v1/completions", body, {{"Authorization", "Bearer sekret-kez"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
    auto good = s.post("/v1/completions", body, {{"Authorization", "Bearer sekret-key"}});
    ASSERT_TRUE(good);
    EXPECT_EQ(good->status, 200);
    auto anthropic_style = s.post("/v1/completions", body, {{"x-api-key", "sekret-key"}});
    ASSERT_TRUE(anthropic_style);
    EXPECT_EQ(anthropic_style->status, 200);
    auto wrong_messages = s.post("/v1/messages", {{"max_tokens", 1}, {"messages", {kHello}}}, {{"x-api-key", "nope"}});
    ASSERT_TRUE(wrong_messages);
    EXPECT_EQ(wrong_messages->status, 401);
    EXPECT_EQ(Json::parse(wrong_messages->body)["error"]["type"], "authentication_error");
    auto health = s.client().Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);

    const httplib::Headers key = {{"Authorization", "Bearer sekret-key"}};
    auto with = [&](httplib::Headers h) {
        h.insert(key.begin(), key.end());
        return s.client().Get("/v1/models", h);
    };
    auto cross = with({{"Origin", "http://evil.example"}});
    ASSERT_TRUE(cross);
    EXPECT_EQ(cross->status, 403);
    EXPECT_FALSE(cross->has_header("Access-Control-Allow-Origin"));
    auto fetch_site = with({{"Sec-Fetch-Site", "cross-site"}});
    ASSERT_TRUE(fetch_site);
    EXPECT_EQ(fetch_site->status, 403);
    auto rebinding = with({{"Host", "evil.example:" + std::to_string(s.port())}});
    ASSERT_TRUE(rebinding);
    EXPECT_EQ(rebinding->status, 403);
    const std::string self = "http://127.0.0.1:" + std::to_string(s.port());
    auto same = with({{"Origin", self}});
    ASSERT_TRUE(same);
    EXPECT_EQ(same->status, 200);
    EXPECT_EQ(same->get_header_value("Access-Control-Allow-Origin"), self);
}

// ---- bad input ------------------------------------------------------------------------------------------------------

void expect_json_error(const httplib::Result& r, int status, const std::string& mentions, const std::string& param = "") {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    const Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j["error"]["message"].is_string()) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(mentions), std::string::npos) << r->body;
    if (status == 400) {
        EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    }
    if (!param.empty()) {
        EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
}

TEST(Server, BadRequestsGetJsonErrors) {
    Server s({"--ctx-size", "256", "--max-body", "64K"});
    auto raw = [&](const std::string& body) {
        return s.client().Post("/v1/chat/completions", body, "application/json");
    };
    expect_json_error(raw("{\"messages\": [}"), 400, "not valid JSON");
    expect_json_error(raw("[1, 2]"), 400, "must be a JSON object");
    expect_json_error(raw(std::string(200, '[') + std::string(200, ']')), 400, "nested deeper");
    expect_json_error(raw("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}"), 400, "not valid JSON");
    expect_json_error(raw(std::string(70000, ' ')), 413, "larger than");
    // A chunked body (no Content-Length) over the limit: read up to it, refused with 413 all the same.
    auto chunked = s.client().Post(
        "/tokenize",
        [](size_t offset, httplib::DataSink& sink) {
            const std::string piece(8192, ' ');
            if (offset < 200000) return sink.write(piece.data(), piece.size());
            sink.done();
            return true;
        },
        "application/json");
    expect_json_error(chunked, 413, "larger than");
    const Json hello = {kHello};
    expect_json_error(s.post("/v1/chat/completions", {{"messages", hello}, {"temperature", "hot"}}), 400, "must be a number",
                      "temperature");
    expect_json_error(s.post("/v1/chat/completions", {{"messages", hello}, {"max_tokens", 1.5}}), 400, "integer", "max_tokens");
    expect_json_error(s.post("/v1/chat/completions", {{"messages", hello}, {"max_tokens", 1e300}}), 400, "max_tokens",
                      "max_tokens");
    expect_json_error(s.post("/v1/chat/completions", {{"messages", hello}, {"n", 2}}), 400, "n=1", "n");
    expect_json_error(s.post("/v1/chat/completions", {{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400, "role");
    expect_json_error(s.post("/v1/chat/completions", {{"messages", hello}, {"stop", {1, 2}}}), 400, "stop", "stop");
    expect_json_error(s.post("/v1/chat/completions", {{"messages", hello}, {"logit_bias", {{"99999", 1}}}}), 400,
                      "logit_bias", "logit_bias");
    const std::string long_text(2000, 'z');
    expect_json_error(s.post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", long_text}}}}}), 400,
                      "context");
    expect_json_error(s.post("/v1/chat/completions", {{"model", "gpt-17"}, {"messages", hello}}), 404, "does not exist",
                      "model");
    expect_json_error(s.client().Get("/no/such/route"), 404, "no route");
    auto ok = s.client().Get("/health");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << "the server is still up";
}

// /v1/status's cuda_stages, from the plans of a real split of the tiny model (planned without a GPU, as strata info
// does) and the stages' devices: what the web app's Monitor reads (tests/e2e/webapp.test.mjs uses this shape).
TEST(ServerStatus, CudaStagesShowEachCardsShare) {
    EXPECT_TRUE(strata::server::cuda_stages_json(nullptr, nullptr).is_null());
    const auto file = strata::gguf::File::open(tiny_model());
    const int64_t n_block = file->get_u32(file->get_str("general.architecture") + ".block_count");
    ASSERT_GE(n_block, 2);
    const strata::MemoryPlanInputs card{.vram_budget = uint64_t{1} << 30, .ram_budget = uint64_t{1} << 30};
    const std::vector<strata::StagePlan> plans = strata::plan_stages(
        *file, {.automatic = false, .blocks = {1, n_block - 1}}, std::vector<strata::MemoryPlanInputs>(2, card));
    const std::vector<strata::CudaStage> split = {{.device = 0, .first_block = 0, .end_block = 1},
                                                  {.device = 1, .first_block = 1, .end_block = n_block}};
    const Json stages = strata::server::cuda_stages_json(&plans, &split);
    ASSERT_TRUE(stages.is_array());
    ASSERT_EQ(stages.size(), 2u);
    double share = 0;
    for (size_t k = 0; k < 2; ++k) {
        const Json& s = stages[k];
        EXPECT_EQ(s["stage"], k);
        EXPECT_EQ(s["device"], static_cast<int>(k));
        EXPECT_EQ(s["first_block"], k == 0 ? 0 : 1);
        EXPECT_EQ(s["last_block"], k == 0 ? 0 : n_block - 1);
        EXPECT_EQ(s["vram_budget_bytes"], uint64_t{1} << 30);
        EXPECT_GT(s["vram_bytes"].get<uint64_t>(), 0u);
        EXPECT_LE(s["vram_bytes"].get<uint64_t>(), uint64_t{1} << 30);
        EXPECT_TRUE(s["expert_cache_slots"].is_array());
        EXPECT_FALSE(s["summary"].get<std::string>().empty());
        share += s["block_share"].get<double>();
    }
    EXPECT_DOUBLE_EQ(share, 1.0);
    EXPECT_DOUBLE_EQ(stages[0]["block_share"].get<double>(), 1.0 / static_cast<double>(n_block));
    // Without the devices (a plan alone), each card is unknown.
    EXPECT_EQ(strata::server::cuda_stages_json(&plans, nullptr)[1]["device"], -1);
}

}  // namespace
}  // namespace strata::testing

// The expert cache's counters as /metrics renders them when a model has experts in host RAM (the CUDA backend; the
// values here are given, the rendering is what is checked).
TEST(ServerMetrics, RendersTheExpertCacheAndSpeculationCounters) {
    strata::server::Metrics metrics;
    const strata::ExpertOffloadStats stats{.tokens = 10,
                                           .lookups = 100,
                                           .hits = 70,
                                           .cpu_pairs = 20,
                                           .swaps = 3,
                                           .swap_bytes = 4096,
                                           .pcie_bytes = 8192,
                                           .cpu_bytes = 1024,
                                           .cpu_share = 0.5,
                                           .streamed_windows = 2};
    metrics.add_speculation(strata::Drafter::Mtp, 3, 2);
    const std::string with = metrics.render({}, &stats), without = metrics.render({});
    for (const char* line : {"strata:spec_rounds_total 1\n", "strata:spec_drafter_rounds_total{drafter=\"mtp\"} 1\n",
                             "strata:spec_drafter_draft_tokens_total{drafter=\"mtp\"} 3\n",
                             "strata:spec_drafter_accepted_tokens_total{drafter=\"mtp\"} 2\n",
                             "strata:spec_drafter_rounds_total{drafter=\"lookup\"} 0\n"})
        EXPECT_NE(with.find(line), std::string::npos) << line;
    for (const char* line : {"strata:expert_cache_lookups_total 100\n", "strata:expert_cache_hits_total 70\n",
                             "strata:expert_cpu_pairs_total 20\n", "strata:expert_cache_swaps_total 3\n",
                             "strata:expert_pcie_bytes_total 8192\n", "strata:expert_cpu_share 0.5\n",
                             "strata:expert_streamed_windows_total 2\n"}) {
        EXPECT_NE(with.find(line), std::string::npos) << line;
        EXPECT_EQ(without.find(line), std::string::npos) << line;
    }
}
