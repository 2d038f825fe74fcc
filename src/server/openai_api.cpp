// OpenAI-compatible endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.
#include <chrono>
#include <ctime>

#include "core/error.h"
#include "model/model.h"
#include "server/api_common.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

namespace {

int64_t unix_now() {
    return static_cast<int64_t>(std::time(nullptr));
}

Json usage_json(const GenerationStats& s) {
    return Json{{"prompt_tokens", s.prompt_tokens},
                {"completion_tokens", s.completion_tokens},
                {"total_tokens", s.prompt_tokens + s.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", s.cached_tokens}}}};
}

void record(const GenerationEvent& done) {
    RequestLog& log = current_log();
    log.prompt_tokens = done.stats.prompt_tokens;
    log.cached_tokens = done.stats.cached_tokens;
    log.completion_tokens = done.stats.completion_tokens;
    log.ttft = done.stats.time_to_first_token;
    log.decode_seconds = done.stats.decode_seconds;
    if (!done.error.empty()) log.error = done.error;
}

// max_tokens / max_completion_tokens: at most the context.
int64_t parse_max_tokens(const ServerContext& ctx, const Json& body, int64_t fallback) {
    const int64_t limit = ctx.engine->options().ctx_per_slot;
    auto a = get_int(body, "max_completion_tokens", 1, limit);
    auto b = get_int(body, "max_tokens", 1, limit);
    return a ? *a : b ? *b : fallback;
}

// ---- chat request -----------------------------------------------------------------------------------------------

Json normalize_tools(const ServerContext& ctx, const Json& tools) {
    if (!tools.is_array()) throw ApiError(400, "'tools' must be a list", "tools");
    if (tools.size() > ctx.limits.max_tools)
        throw ApiError(400, "'tools' has more than " + std::to_string(ctx.limits.max_tools) + " entries", "tools");
    Json out = Json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const Json& t = tools[i];
        const std::string where = "tools[" + std::to_string(i) + "]";
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
            throw ApiError(400, where + " must be {\"type\": \"function\", \"function\": {...}}", "tools");
        if (t.contains("type") && t["type"] != "function")
            throw ApiError(400, where + ".type must be \"function\"", "tools");
        const Json& f = t["function"];
        if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
            throw ApiError(400, where + ".function.name must be a non-empty string", "tools");
        if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null())
            throw ApiError(400, where + ".function.parameters must be a JSON Schema object", "tools");
        if (f.contains("parameters") && f["parameters"].is_object())
            check_json_schema(f["parameters"], "tools", where + ".function.parameters");
        if (f.contains("description") && !f["description"].is_string() && !f["description"].is_null())
            throw ApiError(400, where + ".function.description must be a string", "tools");
        out.push_back({{"type", "function"}, {"function", f}});
    }
    return out;
}

Json normalize_messages(const ServerContext& ctx, const Json& body) {
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array()) throw ApiError(400, "'messages' must be a list of messages", "messages");
    if (it->empty()) throw ApiError(400, "'messages' is empty", "messages");
    if (it->size() > ctx.limits.max_messages)
        throw ApiError(400, "'messages' has more than " + std::to_string(ctx.limits.max_messages) + " entries",
                       "messages");
    Json out = Json::array();
    for (size_t i = 0; i < it->size(); ++i) {
        const Json& m = (*it)[i];
        const std::string where = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) throw ApiError(400, where + " must be an object", "messages");
        if (!m.contains("role") || !m["role"].is_string())
            throw ApiError(400, where + ".role must be a string", "messages");
        std::string role = m["role"].get<std::string>();
        if (role == "developer") role = "system";
        if (role != "system" && role != "user" && role != "assistant" && role != "tool")
            throw ApiError(400, where + ".role '" + role.substr(0, 40) + "' is not one of system, developer, user, assistant, tool",
                           "messages");
        const Json content = m.contains("content") ? m["content"] : Json();
        // Only an assistant message (one that calls tools) may go without content.
        if (content.is_null() && role != "assistant") throw ApiError(400, where + ".content is required", "messages");
        Json n = {{"role", role}, {"content", text_of_content(content, where + ".content")}};
        if (role == "assistant") {
            if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
                n["reasoning_content"] = m["reasoning_content"];
            if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
                if (!m["tool_calls"].is_array()) throw ApiError(400, where + ".tool_calls must be a list", "messages");
                Json calls = Json::array();
                for (const auto& c : m["tool_calls"]) {
                    if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
                        !c["function"].contains("name") || !c["function"]["name"].is_string())
                        throw ApiError(400, where + ".tool_calls entries need function.name", "messages");
                    const Json& f = c["function"];
                    Json args = f.contains("arguments") ? f["arguments"] : Json("{}");
                    if (!args.is_string() && !args.is_object())
                        throw ApiError(400, where + ".tool_calls: function.arguments must be a JSON string", "messages");
                    if (args.is_string()) {
                        // The model's template may print it with tojson: give it the object when it parses.
                        Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
                        if (parsed.is_object()) args = parsed;
                    }
                    calls.push_back({{"id", c.contains("id") && c["id"].is_string() ? c["id"] : Json("")},
                                     {"type", "function"},
                                     {"function", {{"name", f["name"]}, {"arguments", args}}}});
                }
                if (!calls.empty()) n["tool_calls"] = calls;
            }
        }
        if (role == "tool" && m.contains("tool_call_id") && m["tool_call_id"].is_string())
            n["tool_call_id"] = m["tool_call_id"];
        if (m.contains("name") && m["name"].is_string()) n["name"] = m["name"];
        out.push_back(std::move(n));
    }
    return out;
}

// What a chat request asks for beyond the prompt.
struct ChatSetup {
    ChatRequest chat;
    GenerationRequest gen;
    ReplyParserOptions parser;
    bool stream = false;
    bool include_usage = false;
    bool logprobs = false;
};

// Thinking on or off: chat_template_kwargs.enable_thinking, else reasoning_effort (none/minimal: off).
std::optional<bool> parse_thinking(const Json& body, Json& extra) {
    std::optional<bool> thinking;
    if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
        for (const auto& [k, v] : it->items()) {
            if (k == "enable_thinking") {
                if (!v.is_boolean())
                    throw ApiError(400, "'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs");
                thinking = v.get<bool>();
            } else if (k != "tools" && k != "messages" && k != "add_generation_prompt") {
                extra[k] = v;
            }
        }
    }
    if (auto effort = get_string(body, "reasoning_effort"); effort && !thinking) {
        if (*effort == "none" || *effort == "minimal") {
            thinking = false;
        } else if (*effort == "low" || *effort == "medium" || *effort == "high") {
            thinking = true;
        } else {
            throw ApiError(400, "'reasoning_effort' must be one of none, minimal, low, medium, high", "reasoning_effort");
        }
    }
    return thinking;
}

ChatSetup parse_chat(const ServerContext& ctx, const Json& body) {
    ChatSetup s;
    check_model(ctx, body);
    if (auto n = get_int(body, "n", 1, 1 << 20); n && *n != 1)
        throw ApiError(400, "only n=1 is supported", "n");
    s.chat.messages = normalize_messages(ctx, body);
    s.stream = get_bool(body, "stream").value_or(false);
    if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
        s.include_usage = get_bool(*it, "include_usage").value_or(false);
    }
    s.gen.sampling = parse_sampling(ctx, body);
    s.gen.stops = parse_stops(ctx, body, "stop");
    s.gen.max_tokens = parse_max_tokens(ctx, body, 0);
    s.gen.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    s.logprobs = get_bool(body, "logprobs").value_or(false);
    auto top = get_int(body, "top_logprobs", 0, ctx.limits.max_top_logprobs);
    if (top && !s.logprobs) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
    if (s.logprobs) s.gen.top_logprobs = static_cast<int>(top.value_or(0));
    s.chat.enable_thinking = parse_thinking(body, s.chat.extra_template_args);

    // Tools and tool_choice.
    Json tools = nullptr;
    if (auto it = body.find("tools"); it != body.end() && !it->is_null()) tools = normalize_tools(ctx, *it);
    std::string choice = "auto";
    std::optional<std::string> forced;
    if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
        if (it->is_string()) {
            choice = it->get<std::string>();
            if (choice != "none" && choice != "auto" && choice != "required")
                throw ApiError(400, "'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}",
                               "tool_choice");
        } else if (it->is_object() && it->contains("function") && (*it)["function"].is_object() &&
                   (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
            choice = "named";
            forced = (*it)["function"]["name"].get<std::string>();
        } else {
            throw ApiError(400, "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                           "tool_choice");
        }
    }
    const bool have_tools = tools.is_array() && !tools.empty();
    if ((choice == "required" || choice == "named") && !have_tools)
        throw ApiError(400, "'tool_choice' " + choice + " needs 'tools'", "tool_choice");
    if (forced) {
        bool known = false;
        for (const auto& t : tools) known = known || t["function"]["name"] == *forced;
        if (!known) throw ApiError(400, "'tool_choice' names '" + forced->substr(0, 80) + "', which is not in 'tools'", "tool_choice");
    }
    if (have_tools && choice != "none") {
        s.chat.tools = tools;
        s.parser.parse_tool_calls = true;
    }
    const bool parallel = get_bool(body, "parallel_tool_calls").value_or(true);
    if (choice == "required" || choice == "named")
        s.gen.constraint = ctx.constraints->tool_call(nlohmann::json(tools), forced, parallel && choice == "required");

    // response_format.
    if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
        if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
            throw ApiError(400, "'response_format' must be an object with a 'type'", "response_format");
        const std::string type = (*it)["type"].get<std::string>();
        nlohmann::json schema;
        if (type == "json_object") {
            schema = {{"type", "object"}};
        } else if (type == "json_schema") {
            const Json* js = it->contains("json_schema") ? &(*it)["json_schema"] : nullptr;
            if (!js || !js->is_object() || !js->contains("schema") ||
                (!(*js)["schema"].is_object() && !(*js)["schema"].is_boolean()))
                throw ApiError(400, "'response_format.json_schema.schema' must be a JSON Schema object", "response_format");
            check_json_schema((*js)["schema"], "response_format", "response_format.json_schema.schema");
            schema = nlohmann::json((*js)["schema"]);
        } else if (type != "text") {
            throw ApiError(400, "'response_format.type' must be text, json_object or json_schema", "response_format");
        }
        if (!schema.is_null()) {
            if (s.gen.constraint) throw ApiError(400, "use either response_format or a forced tool_choice, not both", "response_format");
            s.gen.constraint = ctx.constraints->json_schema(schema);
        }
    }
    // A grammar decides the first token: a reasoning block the template opened would never close.
    if (s.gen.constraint) s.chat.enable_thinking = false;
    return s;
}

// ---- chat response ----------------------------------------------------------------------------------------------

// Turns the parser's pieces into a chat message (non-streaming) as the pieces arrive.
struct MessageBuilder {
    std::string content, reasoning;
    Json tool_calls = Json::array();
    void add(const std::vector<ReplyPiece>& pieces) {
        for (const auto& p : pieces) {
            if (p.kind == ReplyPiece::Kind::kContent) content += p.text;
            if (p.kind == ReplyPiece::Kind::kReasoning) reasoning += p.text;
            if (p.kind == ReplyPiece::Kind::kToolCall)
                tool_calls.push_back({{"id", p.call.id},
                                      {"type", "function"},
                                      {"function", {{"name", p.call.name}, {"arguments", p.call.arguments}}}});
        }
    }
};

std::string chat_finish_reason(const GenerationEvent& done, bool tool_calls) {
    std::string r = openai_finish_reason(done.reason);
    if (tool_calls && r == "stop") r = "tool_calls";
    return r;
}

// A chunk of a chat stream.
Json chat_chunk(const std::string& id, int64_t created, const std::string& model, Json delta, Json finish_reason,
                Json logprobs, bool include_usage) {
    Json chunk = {{"id", id},
                  {"object", "chat.completion.chunk"},
                  {"created", created},
                  {"model", model},
                  {"system_fingerprint", "strata"},
                  {"choices", Json::array({{{"index", 0},
                                            {"delta", std::move(delta)},
                                            {"logprobs", std::move(logprobs)},
                                            {"finish_reason", std::move(finish_reason)}}})}};
    if (include_usage) chunk["usage"] = nullptr;
    return chunk;
}

Json delta_of(const ReplyPiece& p, int tool_index) {
    if (p.kind == ReplyPiece::Kind::kContent) return {{"content", p.text}};
    if (p.kind == ReplyPiece::Kind::kReasoning) return {{"reasoning_content", p.text}};
    return {{"tool_calls", Json::array({{{"index", tool_index},
                                         {"id", p.call.id},
                                         {"type", "function"},
                                         {"function", {{"name", p.call.name}, {"arguments", p.call.arguments}}}}})}};
}

void chat_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
    const Json body = parse_body(req.body, ctx.limits);
    ChatSetup setup = parse_chat(ctx, body);
    const ChatPrompt prompt = render_chat(ctx, setup.chat);
    setup.parser.start_in_reasoning = prompt.starts_in_reasoning;
    setup.gen.prompt = prompt.tokens;
    setup.gen.boundaries = message_boundaries(ctx, prompt.tokens);
    const std::string id = current_log().id = random_id("chatcmpl-");
    setup.gen.id = id;
    const int64_t created = unix_now();
    const bool logprobs = setup.logprobs;
    auto channel = submit(ctx, std::move(setup.gen));
    const Tokenizer& tokenizer = *ctx.tokenizer;
    res.set_header("X-Request-Id", id);

    if (!setup.stream) {
        struct Collected {
            ReplyParser parser;
            MessageBuilder message;
            Json lps = Json::array();
        };
        auto c = std::make_shared<Collected>(Collected{.parser = ReplyParser(setup.parser), .message = {}});
        const std::string model = ctx.model_id;
        respond_when_done(
            res, channel, false,
            [c, logprobs, &tokenizer](const GenerationEvent& e) {
                c->message.add(c->parser.push(e.text));
                if (logprobs && e.logprob) c->lps.push_back(openai_token_logprob(tokenizer, *e.logprob));
            },
            [c, logprobs, id, created, model](const GenerationEvent& done) {
                c->message.add(c->parser.finish());
                record(done);
                if (done.reason == FinishReason::kError) throw ApiError(500, done.error, "", "", "server_error");
                const bool has_calls = !c->message.tool_calls.empty();
                const std::string finish = chat_finish_reason(done, has_calls);
                current_log().finish_reason = finish;
                Json msg = {{"role", "assistant"},
                            {"content", has_calls && c->message.content.empty() ? Json(nullptr) : Json(c->message.content)}};
                if (!c->message.reasoning.empty()) msg["reasoning_content"] = c->message.reasoning;
                if (has_calls) msg["tool_calls"] = c->message.tool_calls;
                return Json{{"id", id},
                            {"object", "chat.completion"},
                            {"created", created},
                            {"model", model},
                            {"system_fingerprint", "strata"},
                            {"choices", Json::array({{{"index", 0},
                                                      {"message", msg},
                                                      {"logprobs", logprobs ? Json{{"content", c->lps}} : Json(nullptr)},
                                                      {"finish_reason", finish}}})},
                            {"usage", usage_json(done.stats)}};
            });
        return;
    }

    struct StreamState {
        std::shared_ptr<RequestChannel> channel;
        ReplyParser parser;
        int n_tool_calls = 0;
    };
    auto state = std::make_shared<StreamState>(StreamState{.channel = channel, .parser = ReplyParser(setup.parser)});
    const bool include_usage = setup.include_usage;
    const std::string model = ctx.model_id;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        guard_stream(channel, [state, id, created, model, include_usage, logprobs, &tokenizer](size_t, httplib::DataSink& sink) {
            auto send = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
            auto chunk = [&](Json delta, Json finish, Json lp) {
                return send(sse_data(chat_chunk(id, created, model, std::move(delta), std::move(finish), std::move(lp),
                                                include_usage)));
            };
            Json pending_lps = Json::array();
            auto take_lps = [&]() -> Json {
                if (!logprobs) return nullptr;
                Json j = {{"content", pending_lps}};
                pending_lps = Json::array();
                return j;
            };
            auto send_pieces = [&](const std::vector<ReplyPiece>& pieces) {
                for (const auto& p : pieces) {
                    const int index = p.kind == ReplyPiece::Kind::kToolCall ? state->n_tool_calls++ : 0;
                    if (!chunk(delta_of(p, index), nullptr, take_lps())) return false;
                }
                return true;
            };
            bool ok = chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
            if (!ok) state->channel->cancel();
            const GenerationEvent done = drive(
                *state->channel,
                [&](const GenerationEvent& e) {
                    if (logprobs && e.logprob) pending_lps.push_back(openai_token_logprob(tokenizer, *e.logprob));
                    return ok = send_pieces(state->parser.push(e.text));
                },
                [&] { return sink.is_writable(); });
            record(done);
            if (done.reason == FinishReason::kCancelled || !ok) {
                current_log().finish_reason = "cancelled";
                return false;
            }
            if (done.reason == FinishReason::kError) {
                current_log().finish_reason = "error";
                send(sse_data(openai_error_body(ApiError(500, done.error, "", "", "server_error"))));
                send("data: [DONE]\n\n");
                sink.done();
                return true;
            }
            if (!send_pieces(state->parser.finish())) return false;
            if (logprobs && !pending_lps.empty() && !chunk(Json::object(), nullptr, take_lps())) return false;
            const std::string finish = chat_finish_reason(done, state->parser.saw_tool_call());
            current_log().finish_reason = finish;
            if (!chunk(Json::object(), finish, nullptr)) return false;
            if (include_usage) {
                Json last = {{"id", id},           {"object", "chat.completion.chunk"}, {"created", created},
                             {"model", model},     {"system_fingerprint", "strata"},    {"choices", Json::array()},
                             {"usage", usage_json(done.stats)}};
                if (!send(sse_data(last))) return false;
            }
            send("data: [DONE]\n\n");
            sink.done();
            return true;
        }),
        [channel](bool) { channel->cancel(); });
}

// ---- completions ------------------------------------------------------------------------------------------------

Json completion_logprobs(const Tokenizer& tokenizer, const std::vector<TokenLogprob>& lps, const std::string& text_before,
                         size_t& offset) {
    Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(), offsets = Json::array();
    (void)text_before;
    for (const auto& lp : lps) {
        const std::string t = token_text(tokenizer, lp.token);
        tokens.push_back(t);
        token_lps.push_back(lp.logprob);
        Json top = Json::object();
        for (const auto& [id, l] : lp.top) top[token_text(tokenizer, id)] = l;
        tops.push_back(top);
        offsets.push_back(offset);
        offset += t.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

void completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
    const Json body = parse_body(req.body, ctx.limits);
    check_model(ctx, body);
    if (auto n = get_int(body, "n", 1, 1 << 20); n && *n != 1) throw ApiError(400, "only n=1 is supported", "n");
    if (auto n = get_int(body, "best_of", 1, 1 << 20); n && *n != 1)
        throw ApiError(400, "only best_of=1 is supported", "best_of");
    if (get_bool(body, "echo").value_or(false)) throw ApiError(400, "'echo' is not supported", "echo");
    if (get_string(body, "suffix")) throw ApiError(400, "'suffix' is not supported", "suffix");
    GenerationRequest gen;
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
    const int64_t n_vocab = ctx.model->info().n_vocab;
    if (it->is_string()) {
        gen.prompt = ctx.tokenizer->encode(it->get<std::string>(), true);
    } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
        gen.prompt = ctx.tokenizer->encode((*it)[0].get<std::string>(), true);
    } else if (it->is_array() && !it->empty() && (*it)[0].is_number()) {
        if (it->size() > ctx.limits.max_tokens_per_request_list) throw ApiError(400, "'prompt' has too many tokens", "prompt");
        for (const auto& t : *it) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
                throw ApiError(400, "'prompt' token ids must be integers in 0.." + std::to_string(n_vocab - 1), "prompt");
            gen.prompt.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
    } else {
        throw ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)", "prompt");
    }
    if (gen.prompt.empty()) throw ApiError(400, "'prompt' is empty", "prompt");
    gen.sampling = parse_sampling(ctx, body);
    gen.stops = parse_stops(ctx, body, "stop");
    gen.max_tokens = parse_max_tokens(ctx, body, 16);  // OpenAI's default for completions
    gen.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    const auto lp = get_int(body, "logprobs", 0, ctx.limits.max_top_logprobs);
    if (lp) gen.top_logprobs = static_cast<int>(*lp);
    const bool stream = get_bool(body, "stream").value_or(false);
    bool include_usage = false;
    if (auto so = body.find("stream_options"); so != body.end() && so->is_object())
        include_usage = get_bool(*so, "include_usage").value_or(false);
    const std::string id = current_log().id = random_id("cmpl-");
    gen.id = id;
    const int64_t created = unix_now();
    auto channel = submit(ctx, std::move(gen));
    const Tokenizer& tokenizer = *ctx.tokenizer;
    const std::string model = ctx.model_id;
    res.set_header("X-Request-Id", id);

    auto choice = [](std::string text, Json logprobs, Json finish) {
        return Json{{"text", std::move(text)}, {"index", 0}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}};
    };
    if (!stream) {
        struct Collected {
            std::string text;
            std::vector<TokenLogprob> lps;
        };
        auto c = std::make_shared<Collected>();
        const bool with_lp = lp.has_value();
        respond_when_done(
            res, channel, false,
            [c](const GenerationEvent& e) {
                c->text += e.text;
                if (e.logprob) c->lps.push_back(*e.logprob);
            },
            [c, with_lp, id, created, model, choice, &tokenizer](const GenerationEvent& done) {
                record(done);
                if (done.reason == FinishReason::kError) throw ApiError(500, done.error, "", "", "server_error");
                size_t offset = 0;
                const std::string finish = openai_finish_reason(done.reason);
                current_log().finish_reason = finish;
                return Json{{"id", id},
                            {"object", "text_completion"},
                            {"created", created},
                            {"model", model},
                            {"system_fingerprint", "strata"},
                            {"choices", Json::array({choice(c->text,
                                                            with_lp ? completion_logprobs(tokenizer, c->lps, "", offset)
                                                                    : Json(nullptr),
                                                            finish)})},
                            {"usage", usage_json(done.stats)}};
            });
        return;
    }
    const bool with_lp = lp.has_value();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        guard_stream(channel, [channel, id, created, model, include_usage, with_lp, choice, &tokenizer](size_t, httplib::DataSink& sink) {
            auto send = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
            auto chunk = [&](Json c) {
                Json j = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                          {"system_fingerprint", "strata"}, {"choices", Json::array({std::move(c)})}};
                if (include_usage) j["usage"] = nullptr;
                return send(sse_data(j));
            };
            size_t offset = 0;
            bool ok = true;
            const GenerationEvent done = drive(
                *channel,
                [&](const GenerationEvent& e) {
                    std::vector<TokenLogprob> lps;
                    if (e.logprob) lps.push_back(*e.logprob);
                    if (e.text.empty() && lps.empty()) return true;
                    return ok = chunk(choice(e.text, with_lp ? completion_logprobs(tokenizer, lps, "", offset) : Json(nullptr), nullptr));
                },
                [&] { return sink.is_writable(); });
            record(done);
            if (done.reason == FinishReason::kCancelled || !ok) {
                current_log().finish_reason = "cancelled";
                return false;
            }
            if (done.reason == FinishReason::kError) {
                current_log().finish_reason = "error";
                send(sse_data(openai_error_body(ApiError(500, done.error, "", "", "server_error"))));
            } else {
                const std::string finish = openai_finish_reason(done.reason);
                current_log().finish_reason = finish;
                if (!chunk(choice("", nullptr, finish))) return false;
                if (include_usage) {
                    Json last = {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
                                 {"choices", Json::array()}, {"usage", usage_json(done.stats)}};
                    if (!send(sse_data(last))) return false;
                }
            }
            send("data: [DONE]\n\n");
            sink.done();
            return true;
        }),
        [channel](bool) { channel->cancel(); });
}

}  // namespace

void register_openai_routes(httplib::Server& server, ServerContext& ctx) {
    post_route(server, ctx, "/v1/chat/completions", false, [&ctx](const httplib::Request& req, httplib::Response& res) {
        guarded(res, false, [&] { chat_completions(ctx, req, res); });
    });
    post_route(server, ctx, "/v1/completions", false, [&ctx](const httplib::Request& req, httplib::Response& res) {
        guarded(res, false, [&] { completions(ctx, req, res); });
    });
    auto model_entry = [&ctx] {
        return Json{{"id", ctx.model_id},
                    {"object", "model"},
                    {"created", ctx.created_unix},
                    {"owned_by", "strata"},
                    {"meta",
                     {{"arch", ctx.model->info().arch},
                      {"n_vocab", ctx.model->info().n_vocab},
                      {"n_ctx", ctx.engine->options().ctx_per_slot},
                      {"n_ctx_train", ctx.model->info().n_ctx_train}}}};
    };
    server.Get("/v1/models", [model_entry](const httplib::Request&, httplib::Response& res) {
        res.set_content(dump_json(Json{{"object", "list"}, {"data", Json::array({model_entry()})}}), "application/json");
    });
    server.Get("/v1/models/(.+)", [&ctx, model_entry](const httplib::Request& req, httplib::Response& res) {
        guarded(res, false, [&] {
            check_model(ctx, Json{{"model", req.matches[1].str()}});
            res.set_content(dump_json(model_entry()), "application/json");
        });
    });
}

}  // namespace strata::server
