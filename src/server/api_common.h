// What the API handlers share: the served model and engine (ServerContext), request errors (ApiError), typed access to
// request JSON that reports wrong types as 400s, chat prompts, and streaming a generation to an HTTP client.
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/memory_plan.h"
#include "runtime/stage_plan.h"
#include "server/constraints.h"
#include "server/engine.h"
#include "server/reply_parser.h"
#include "tokenizer/chat_template.h"

namespace strata {
class Model;
class Tokenizer;
}  // namespace strata

namespace strata::server {

using Json = nlohmann::ordered_json;

// A request the server refuses: HTTP status, a message that says what is wrong, the parameter at fault.
struct ApiError : std::exception {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;
    std::string code;
    ApiError(int status_, std::string message_, std::string param_ = {}, std::string code_ = {},
             std::string type_ = "invalid_request_error")
        : status(status_), message(std::move(message_)), type(std::move(type_)), param(std::move(param_)),
          code(std::move(code_)) {}
    const char* what() const noexcept override { return message.c_str(); }
};

struct ServerLimits {
    size_t max_body = 1 << 20;
    int max_json_depth = 64;
    size_t max_messages = 2048;
    size_t max_tools = 128;
    size_t max_stops = 16;
    size_t max_stop_length = 256;
    size_t max_logit_bias = 1024;
    int max_top_logprobs = 20;
    size_t max_tokens_per_request_list = 1 << 20;  // /detokenize and token prompts
};

struct ServerContext {
    const Model* model = nullptr;
    const Tokenizer* tokenizer = nullptr;
    ChatTemplate chat_template;        // the model's, or the built-in ChatML one
    bool builtin_template = false;
    Engine* engine = nullptr;
    Metrics* metrics = nullptr;
    ConstraintFactory* constraints = nullptr;
    std::string model_id;              // served name
    std::vector<std::string> model_aliases;
    std::string model_path;
    ServerLimits limits;
    std::chrono::steady_clock::time_point started;
    int64_t created_unix = 0;
    const MemoryPlan* cuda_plan = nullptr;  // --backend cuda: the plan the load followed
    const std::vector<StagePlan>* cuda_stages = nullptr;  // --split: each stage's plan (empty: one card)
    const std::vector<CudaStage>* cuda_split = nullptr;   // --split: each stage's device
};

// /v1/status's cuda_stages (issue 29): each stage of a split, its card (split; -1 where unknown), blocks and their
// share of the trunk, VRAM budget and planned use, expert cache slots by block and the plan's summary; null without a
// split.
Json cuda_stages_json(const std::vector<StagePlan>* plans, const std::vector<CudaStage>* split);

// Per-request facts for the one log line the server writes per request (filled by the handlers, printed by the
// logger on the same connection thread).
struct RequestLog {
    std::string id;
    std::string finish_reason;
    int64_t prompt_tokens = -1, cached_tokens = 0, completion_tokens = 0;
    double ttft = 0.0, decode_seconds = 0.0;
    std::string error;
};
RequestLog& current_log();

// ---- request JSON ------------------------------------------------------------------------------------------------

// The body as a JSON object: 400 on bad JSON (with the parser's position), nesting deeper than the limit, invalid
// UTF-8, or anything but an object.
Json parse_body(const std::string& body, const ServerLimits& limits);

// Typed fields: absent or null gives nullopt; a wrong type is a 400 naming `name`.
std::optional<std::string> get_string(const Json& j, const char* name);
std::optional<bool> get_bool(const Json& j, const char* name);
std::optional<double> get_number(const Json& j, const char* name, double min, double max);
std::optional<int64_t> get_int(const Json& j, const char* name, int64_t min, int64_t max);

// A structural check of a JSON Schema (known "type" names, properties/items/anyOf... holding schemas, "required" a
// list of strings); 400 naming `param` and the path of the first problem.
void check_json_schema(const Json& schema, const std::string& param, const std::string& path);

// `model` must be absent, the served id or an alias; 404 model_not_found otherwise.
void check_model(const ServerContext& ctx, const Json& body);
// The text of a message's content: a string, null (""), or a list of {type: "text"|"input_text", text} parts (OpenAI
// "content parts", Anthropic "content blocks"); anything else is a 400 naming `where` (the path of the content field).
std::string text_of_content(const Json& content, const std::string& where);

// Sampling fields shared by the APIs (temperature, top_p, top_k, min_p, penalties, seed, logit_bias).
SamplingParams parse_sampling(const ServerContext& ctx, const Json& body);
// `stop` (OpenAI: string or list) / `stop_sequences` (Anthropic: list).
std::vector<std::string> parse_stops(const ServerContext& ctx, const Json& body, const char* name);

// ---- chat prompts ---------------------------------------------------------------------------------------------------

struct ChatPrompt {
    std::vector<int32_t> tokens;
    bool starts_in_reasoning = false;  // the template opened a <think> block at the end of the prompt
};

struct ChatRequest {
    Json messages = Json::array();  // OpenAI-style, content as strings
    Json tools = nullptr;           // OpenAI-style tool list, or null
    std::optional<bool> enable_thinking;
    Json extra_template_args = Json::object();
};

ChatPrompt render_chat(const ServerContext& ctx, const ChatRequest& chat);

// The source of the built-in ChatML template (Qwen tool-call format) used when the GGUF has none.
const std::string& builtin_chat_template();

// ---- streaming ------------------------------------------------------------------------------------------------------

// Receives the engine's events for one request until its final event. `on_event` returns false when the client is
// gone; the request is then cancelled. `client_alive` is polled while no event comes (null: never). Returns the final
// event (reason kCancelled when the client went away).
GenerationEvent drive(RequestChannel& channel, const std::function<bool(const GenerationEvent&)>& on_event,
                      const std::function<bool()>& client_alive);

// Answers a non-streaming request from inside a chunked response once its generation ends, so that a client that goes
// away meanwhile cancels it (httplib only lets a content provider see the connection). `on_event` sees every token;
// `body` turns the final event into the response (an ApiError it throws becomes the error body, status 200 being
// already sent).
void respond_when_done(httplib::Response& res, std::shared_ptr<RequestChannel> channel, bool anthropic,
                       std::function<void(const GenerationEvent&)> on_event,
                       std::function<Json(const GenerationEvent&)> body);

// Token positions in `tokens` right after each message end ("<|im_end|>" and a following newline, or an
// end-of-generation token's text) in the text they encode: where the engine may keep checkpoints.
std::vector<size_t> message_boundaries(const ServerContext& ctx, const std::vector<int32_t>& tokens);

// Submits to the engine, turning QueueFull into 503 and prompt errors into 400.
std::shared_ptr<RequestChannel> submit(const ServerContext& ctx, GenerationRequest request);

// A content provider that never lets an exception reach httplib: on one, the request is cancelled and the connection
// closed.
httplib::ContentProviderWithoutLength guard_stream(std::shared_ptr<RequestChannel> channel,
                                                   httplib::ContentProviderWithoutLength provider);

// A token's bytes; "" for rows past the tokenizer's vocabulary (embedding padding).
std::string token_text(const Tokenizer& tokenizer, int32_t id);

// "data: {json}\n\n" with invalid UTF-8 replaced.
std::string sse_data(const Json& j);
std::string sse_event(const std::string& event, const Json& j);
std::string dump_json(const Json& j);

// The log-probability object OpenAI chat uses for one token: {token, logprob, bytes, top_logprobs}.
Json openai_token_logprob(const Tokenizer& tokenizer, const TokenLogprob& lp);

// Registers the API routes (openai_api.cpp, anthropic_api.cpp).
void register_openai_routes(httplib::Server& server, ServerContext& ctx);
void register_anthropic_routes(httplib::Server& server, ServerContext& ctx);

// Error bodies: OpenAI's {"error": {...}} and Anthropic's {"type": "error", "error": {...}}.
Json openai_error_body(const ApiError& e);
Json anthropic_error_body(const ApiError& e);

// Registers a POST route whose body is read here: a Content-Length body over the limit gets httplib's 413 before
// this; a chunked body is read up to ctx.limits.max_body, the rest drained (up to 64 MiB, so the 413 reaches the client
// instead of a reset connection). The handler sees the body in req.body.
void post_route(httplib::Server& server, const ServerContext& ctx, const std::string& pattern, bool anthropic,
                std::function<void(const httplib::Request&, httplib::Response&)> handler);

// Runs `fn`, turning ApiError, Error and anything else into the right JSON error response (never throws).
void guarded(httplib::Response& res, bool anthropic, const std::function<void()>& fn);

}  // namespace strata::server
