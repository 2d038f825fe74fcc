// Anthropic Messages API: POST /v1/messages (streaming with the event sequence the Anthropic SDK expects: message_start,
// content_block_start / content_block_delta / content_block_stop per block, message_delta, message_stop) and
// POST /v1/messages/count_tokens.
#include <map>

#include "core/error.h"
#include "model/model.h"
#include "server/api_common.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

namespace {

// Anthropic messages and system prompt -> the OpenAI-style messages the chat templates take.
Json convert_messages(const ServerContext& ctx, const Json& body) {
    Json out = Json::array();
    if (auto it = body.find("system"); it != body.end() && !it->is_null())
        out.push_back({{"role", "system"}, {"content", text_of_content(*it, "system")}});
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array()) throw ApiError(400, "messages: a list of messages is required", "messages");
    if (it->empty()) throw ApiError(400, "messages: at least one message is required", "messages");
    if (it->size() > ctx.limits.max_messages)
        throw ApiError(400, "messages: more than " + std::to_string(ctx.limits.max_messages) + " messages", "messages");
    for (size_t i = 0; i < it->size(); ++i) {
        const Json& m = (*it)[i];
        const std::string where = "messages." + std::to_string(i);
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
            throw ApiError(400, where + ": a message needs a string 'role'", "messages");
        const std::string role = m["role"].get<std::string>();
        if (role != "user" && role != "assistant")
            throw ApiError(400, where + ".role must be \"user\" or \"assistant\"", "messages");
        if (!m.contains("content")) throw ApiError(400, where + ": 'content' is required", "messages");
        const Json& content = m["content"];
        if (content.is_string()) {
            out.push_back({{"role", role}, {"content", content}});
            continue;
        }
        if (!content.is_array()) throw ApiError(400, where + ".content must be a string or a list of blocks", "messages");
        std::string text, thinking;
        Json tool_calls = Json::array();
        for (size_t k = 0; k < content.size(); ++k) {
            const Json& b = content[k];
            const std::string bw = where + ".content." + std::to_string(k);
            if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
                throw ApiError(400, bw + ": a block needs a string 'type'", "messages");
            const std::string type = b["type"].get<std::string>();
            if (type == "text") {
                if (!b.contains("text") || !b["text"].is_string())
                    throw ApiError(400, bw + ".text must be a string", "messages");
                text += b["text"].get<std::string>();
            } else if (type == "thinking" && role == "assistant") {
                if (b.contains("thinking") && b["thinking"].is_string()) thinking += b["thinking"].get<std::string>();
            } else if (type == "redacted_thinking" && role == "assistant") {
                continue;
            } else if (type == "tool_use" && role == "assistant") {
                if (!b.contains("name") || !b["name"].is_string())
                    throw ApiError(400, bw + ".name must be a string", "messages");
                Json input = b.contains("input") ? b["input"] : Json::object();
                if (!input.is_object()) throw ApiError(400, bw + ".input must be an object", "messages");
                tool_calls.push_back({{"id", b.contains("id") && b["id"].is_string() ? b["id"] : Json("")},
                                      {"type", "function"},
                                      {"function", {{"name", b["name"]}, {"arguments", input}}}});
            } else if (type == "tool_result" && role == "user") {
                Json tool = {{"role", "tool"},
                             {"content", text_of_content(b.contains("content") ? b["content"] : Json(""), bw + ".content")}};
                if (b.contains("tool_use_id") && b["tool_use_id"].is_string()) tool["tool_call_id"] = b["tool_use_id"];
                out.push_back(std::move(tool));
            } else {
                throw ApiError(400, bw + ": blocks of type '" + type.substr(0, 40) + "' are not supported in a " + role +
                                        " message",
                               "messages");
            }
        }
        if (role == "user") {
            if (!text.empty() || out.empty() || out.back()["role"] != "tool") out.push_back({{"role", "user"}, {"content", text}});
        } else {
            Json a = {{"role", "assistant"}, {"content", text}};
            if (!thinking.empty()) a["reasoning_content"] = thinking;
            if (!tool_calls.empty()) a["tool_calls"] = tool_calls;
            out.push_back(std::move(a));
        }
    }
    return out;
}

Json convert_tools(const ServerContext& ctx, const Json& tools) {
    if (!tools.is_array()) throw ApiError(400, "tools must be a list", "tools");
    if (tools.size() > ctx.limits.max_tools)
        throw ApiError(400, "tools: more than " + std::to_string(ctx.limits.max_tools) + " tools", "tools");
    Json out = Json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const Json& t = tools[i];
        const std::string where = "tools." + std::to_string(i);
        if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
            throw ApiError(400, where + ".name must be a non-empty string", "tools");
        if (t.contains("type") && t["type"].is_string() && t["type"] != "custom")
            throw ApiError(400, where + ": server tools ('" + t["type"].get<std::string>().substr(0, 40) +
                                    "') are not supported",
                           "tools");
        Json schema = t.contains("input_schema") ? t["input_schema"] : Json{{"type", "object"}};
        if (!schema.is_object()) throw ApiError(400, where + ".input_schema must be a JSON Schema object", "tools");
        check_json_schema(schema, "tools", where + ".input_schema");
        Json f = {{"name", t["name"]}};
        if (t.contains("description") && t["description"].is_string()) f["description"] = t["description"];
        f["parameters"] = schema;
        out.push_back({{"type", "function"}, {"function", f}});
    }
    return out;
}

const char* stop_reason(const GenerationEvent& done, bool tool_use) {
    switch (done.reason) {
        case FinishReason::kStopString:
            return "stop_sequence";
        case FinishReason::kMaxTokens:
        case FinishReason::kContextFull:
            return "max_tokens";
        default:
            return tool_use ? "tool_use" : "end_turn";
    }
}

Json tool_input(const std::string& arguments) {
    Json j = Json::parse(arguments, nullptr, false);
    return j.is_object() ? j : Json::object();
}

struct MessagesSetup {
    ChatRequest chat;
    GenerationRequest gen;
    ReplyParserOptions parser;
    bool stream = false;
};

MessagesSetup parse_messages(const ServerContext& ctx, const Json& body, bool count_only) {
    MessagesSetup s;
    check_model(ctx, body);
    s.chat.messages = convert_messages(ctx, body);
    if (!count_only) {
        auto max_tokens = get_int(body, "max_tokens", 1, ctx.engine->options().ctx_per_slot);
        if (!max_tokens) throw ApiError(400, "max_tokens: field required", "max_tokens");
        s.gen.max_tokens = *max_tokens;
    }
    s.stream = get_bool(body, "stream").value_or(false);
    s.gen.sampling = parse_sampling(ctx, body);
    s.gen.stops = parse_stops(ctx, body, "stop_sequences");
    if (auto it = body.find("thinking"); it != body.end() && !it->is_null()) {
        if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
            throw ApiError(400, "thinking must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
                           "thinking");
        const std::string type = (*it)["type"].get<std::string>();
        if (type == "enabled") {
            s.chat.enable_thinking = true;
            get_int(*it, "budget_tokens", 1, 1 << 30);  // checked; the model decides when to stop thinking
        } else if (type == "disabled") {
            s.chat.enable_thinking = false;
        } else {
            throw ApiError(400, "thinking.type must be \"enabled\" or \"disabled\"", "thinking");
        }
    }
    Json tools = nullptr;
    if (auto it = body.find("tools"); it != body.end() && !it->is_null()) tools = convert_tools(ctx, *it);
    const bool have_tools = tools.is_array() && !tools.empty();
    std::string choice = "auto";
    std::optional<std::string> forced;
    bool parallel = true;
    if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
        if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
            throw ApiError(400, "tool_choice must be an object with a 'type' (auto, any, tool, none)", "tool_choice");
        choice = (*it)["type"].get<std::string>();
        if (choice != "auto" && choice != "any" && choice != "tool" && choice != "none")
            throw ApiError(400, "tool_choice.type must be auto, any, tool or none", "tool_choice");
        if (choice == "tool") {
            auto name = get_string(*it, "name");
            if (!name) throw ApiError(400, "tool_choice.name is required for type \"tool\"", "tool_choice");
            forced = *name;
        }
        parallel = !get_bool(*it, "disable_parallel_tool_use").value_or(false);
    }
    if ((choice == "any" || choice == "tool") && !have_tools)
        throw ApiError(400, "tool_choice " + choice + " needs tools", "tool_choice");
    if (forced) {
        bool known = false;
        for (const auto& t : tools) known = known || t["function"]["name"] == *forced;
        if (!known) throw ApiError(400, "tool_choice names '" + forced->substr(0, 80) + "', which is not in tools", "tool_choice");
    }
    if (have_tools && choice != "none") {
        s.chat.tools = tools;
        s.parser.parse_tool_calls = true;
    }
    if (!count_only && (choice == "any" || choice == "tool")) {
        s.gen.constraint = ctx.constraints->tool_call(nlohmann::json(tools), forced, parallel && choice == "any");
        s.chat.enable_thinking = false;
    }
    return s;
}

Json usage_json(const GenerationStats& s) {
    return {{"input_tokens", s.prompt_tokens},
            {"output_tokens", s.completion_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", s.cached_tokens}};
}

void record(const GenerationEvent& done, const std::string& finish) {
    RequestLog& log = current_log();
    log.prompt_tokens = done.stats.prompt_tokens;
    log.cached_tokens = done.stats.cached_tokens;
    log.completion_tokens = done.stats.completion_tokens;
    log.ttft = done.stats.time_to_first_token;
    log.decode_seconds = done.stats.decode_seconds;
    log.finish_reason = finish;
    if (!done.error.empty()) log.error = done.error;
}

// The stream's content blocks: a block opens when the kind of text changes and closes before the next one.
class BlockWriter {
  public:
    explicit BlockWriter(std::function<bool(const std::string&)> send) : send_(std::move(send)) {}

    bool add(const ReplyPiece& p) {
        if (p.kind == ReplyPiece::Kind::kToolCall) {
            if (!close()) return false;
            const Json block = {{"type", "tool_use"}, {"id", "toolu_" + p.call.id.substr(5)}, {"name", p.call.name},
                                {"input", Json::object()}};
            if (!start(block)) return false;
            if (!delta({{"type", "input_json_delta"}, {"partial_json", dump_json(tool_input(p.call.arguments))}}))
                return false;
            tool_use_ = true;
            return close();
        }
        const bool thinking = p.kind == ReplyPiece::Kind::kReasoning;
        const std::string type = thinking ? "thinking" : "text";
        if (open_type_ != type) {
            if (!close()) return false;
            if (!start(thinking ? Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                : Json{{"type", "text"}, {"text", ""}}))
                return false;
            open_type_ = type;
        }
        return delta(thinking ? Json{{"type", "thinking_delta"}, {"thinking", p.text}}
                              : Json{{"type", "text_delta"}, {"text", p.text}});
    }
    bool close() {
        if (open_type_.empty()) return true;
        open_type_.clear();
        return send_(sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_++}}));
    }
    bool tool_use() const { return tool_use_; }

  private:
    bool start(const Json& block) {
        open_type_ = block["type"].get<std::string>();
        return send_(sse_event("content_block_start",
                               {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}}));
    }
    bool delta(const Json& d) {
        return send_(sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}}));
    }
    std::function<bool(const std::string&)> send_;
    std::string open_type_;
    int index_ = 0;
    bool tool_use_ = false;
};

void messages(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
    const Json body = parse_body(req.body, ctx.limits);
    MessagesSetup setup = parse_messages(ctx, body, false);
    const ChatPrompt prompt = render_chat(ctx, setup.chat);
    setup.parser.start_in_reasoning = prompt.starts_in_reasoning;
    setup.gen.prompt = prompt.tokens;
    setup.gen.boundaries = message_boundaries(ctx, prompt.tokens);
    const std::string id = current_log().id = random_id("msg_");
    setup.gen.id = id;
    const int64_t n_prompt = static_cast<int64_t>(prompt.tokens.size());
    auto channel = submit(ctx, std::move(setup.gen));
    const std::string model = ctx.model_id;
    res.set_header("request-id", id);

    if (!setup.stream) {
        struct Collected {
            ReplyParser parser;
            Json content = Json::array();
            bool tool_use = false;
            void add(const std::vector<ReplyPiece>& pieces) {
                for (const auto& p : pieces) {
                    if (p.kind == ReplyPiece::Kind::kToolCall) {
                        tool_use = true;
                        content.push_back({{"type", "tool_use"},
                                           {"id", "toolu_" + p.call.id.substr(5)},
                                           {"name", p.call.name},
                                           {"input", tool_input(p.call.arguments)}});
                        continue;
                    }
                    const bool thinking = p.kind == ReplyPiece::Kind::kReasoning;
                    const char* type = thinking ? "thinking" : "text";
                    const char* field = thinking ? "thinking" : "text";
                    if (!content.empty() && content.back()["type"] == type) {
                        content.back()[field] = content.back()[field].get<std::string>() + p.text;
                    } else if (thinking) {
                        content.push_back({{"type", "thinking"}, {"thinking", p.text}, {"signature", ""}});
                    } else {
                        content.push_back({{"type", "text"}, {"text", p.text}});
                    }
                }
            }
        };
        auto c = std::make_shared<Collected>(Collected{.parser = ReplyParser(setup.parser)});
        respond_when_done(
            res, channel, true, [c](const GenerationEvent& e) { c->add(c->parser.push(e.text)); },
            [c, id, model](const GenerationEvent& done) {
                c->add(c->parser.finish());
                if (done.reason == FinishReason::kError) {
                    record(done, "error");
                    throw ApiError(500, done.error, "", "", "api_error");
                }
                const std::string reason = stop_reason(done, c->tool_use);
                record(done, reason);
                return Json{{"id", id},
                            {"type", "message"},
                            {"role", "assistant"},
                            {"model", model},
                            {"content", c->content},
                            {"stop_reason", reason},
                            {"stop_sequence",
                             done.reason == FinishReason::kStopString ? Json(done.matched_stop) : Json(nullptr)},
                            {"usage", usage_json(done.stats)}};
            });
        return;
    }

    auto parser = std::make_shared<ReplyParser>(setup.parser);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        guard_stream(channel, [channel, parser, id, model, n_prompt](size_t, httplib::DataSink& sink) {
            auto send = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
            BlockWriter blocks(send);
            const Json start = {{"type", "message_start"},
                                {"message",
                                 {{"id", id},
                                  {"type", "message"},
                                  {"role", "assistant"},
                                  {"model", model},
                                  {"content", Json::array()},
                                  {"stop_reason", nullptr},
                                  {"stop_sequence", nullptr},
                                  {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}}}};
            bool ok = send(sse_event("message_start", start)) && send(sse_event("ping", {{"type", "ping"}}));
            if (!ok) channel->cancel();
            auto add = [&](const std::vector<ReplyPiece>& pieces) {
                for (const auto& p : pieces)
                    if (!blocks.add(p)) return false;
                return true;
            };
            const GenerationEvent done = drive(
                *channel, [&](const GenerationEvent& e) { return ok = add(parser->push(e.text)); },
                [&] { return sink.is_writable(); });
            if (done.reason == FinishReason::kCancelled || !ok) {
                record(done, "cancelled");
                return false;
            }
            if (done.reason == FinishReason::kError) {
                record(done, "error");
                send(sse_event("error", anthropic_error_body(ApiError(500, done.error, "", "", "api_error"))));
                sink.done();
                return true;
            }
            if (!add(parser->finish()) || !blocks.close()) return false;
            const std::string reason = stop_reason(done, blocks.tool_use());
            record(done, reason);
            const Json delta = {
                {"type", "message_delta"},
                {"delta",
                 {{"stop_reason", reason},
                  {"stop_sequence", done.reason == FinishReason::kStopString ? Json(done.matched_stop) : Json(nullptr)}}},
                {"usage", usage_json(done.stats)}};
            if (!send(sse_event("message_delta", delta))) return false;
            send(sse_event("message_stop", {{"type", "message_stop"}}));
            sink.done();
            return true;
        }),
        [channel](bool) { channel->cancel(); });
}

void count_tokens(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
    const Json body = parse_body(req.body, ctx.limits);
    MessagesSetup setup = parse_messages(ctx, body, true);
    const ChatPrompt prompt = render_chat(ctx, setup.chat);
    res.set_content(dump_json(Json{{"input_tokens", prompt.tokens.size()}}), "application/json");
}

}  // namespace

void register_anthropic_routes(httplib::Server& server, ServerContext& ctx) {
    post_route(server, ctx, "/v1/messages", true, [&ctx](const httplib::Request& req, httplib::Response& res) {
        guarded(res, true, [&] { messages(ctx, req, res); });
    });
    post_route(server, ctx, "/v1/messages/count_tokens", true, [&ctx](const httplib::Request& req, httplib::Response& res) {
        guarded(res, true, [&] { count_tokens(ctx, req, res); });
    });
}

}  // namespace strata::server
