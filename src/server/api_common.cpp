#include "server/api_common.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

RequestLog& current_log() {
    thread_local RequestLog log;
    return log;
}

// ---- request JSON ------------------------------------------------------------------------------------------------

namespace {

// Nesting depth of a JSON text, counted outside strings: checked before parsing so a deep document never recurses.
int nesting_depth(const std::string& text) {
    int depth = 0, max_depth = 0;
    bool in_string = false, escaped = false;
    for (char c : text) {
        if (in_string) {
            if (escaped) {
                escaped = false;
            } else if (c == '\\') {
                escaped = true;
            } else if (c == '"') {
                in_string = false;
            }
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            max_depth = std::max(max_depth, ++depth);
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return max_depth;
}

const char* type_name(const Json& j) {
    switch (j.type()) {
        case Json::value_t::null:
            return "null";
        case Json::value_t::boolean:
            return "a boolean";
        case Json::value_t::string:
            return "a string";
        case Json::value_t::array:
            return "an array";
        case Json::value_t::object:
            return "an object";
        case Json::value_t::number_float:
            return "a number";
        default:
            return "an integer";
    }
}

const Json* field(const Json& j, const char* name) {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
}

}  // namespace

Json parse_body(const std::string& body, const ServerLimits& limits) {
    if (body.empty()) throw ApiError(400, "the request body is empty; send a JSON object");
    if (nesting_depth(body) > limits.max_json_depth)
        throw ApiError(400, "the JSON is nested deeper than " + std::to_string(limits.max_json_depth) + " levels");
    Json j;
    try {
        j = Json::parse(body);
    } catch (const Json::parse_error& e) {
        std::string what = e.what();
        // nlohmann's message: "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
        if (auto at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
        throw ApiError(400, "the body is not valid JSON: " + what);
    }
    if (!j.is_object()) throw ApiError(400, std::string("the body must be a JSON object, not ") + type_name(j));
    return j;
}

std::optional<std::string> get_string(const Json& j, const char* name) {
    const Json* f = field(j, name);
    if (!f) return std::nullopt;
    if (!f->is_string()) throw ApiError(400, std::string("'") + name + "' must be a string, not " + type_name(*f), name);
    return f->get<std::string>();
}

std::optional<bool> get_bool(const Json& j, const char* name) {
    const Json* f = field(j, name);
    if (!f) return std::nullopt;
    if (!f->is_boolean())
        throw ApiError(400, std::string("'") + name + "' must be a boolean, not " + type_name(*f), name);
    return f->get<bool>();
}

std::optional<double> get_number(const Json& j, const char* name, double min, double max) {
    const Json* f = field(j, name);
    if (!f) return std::nullopt;
    if (!f->is_number()) throw ApiError(400, std::string("'") + name + "' must be a number, not " + type_name(*f), name);
    const double v = f->get<double>();
    if (!std::isfinite(v) || v < min || v > max)
        throw ApiError(400, std::string("'") + name + "' must be between " + Json(min).dump() + " and " +
                                Json(max).dump() + ", got " + f->dump(),
                       name);
    return v;
}

std::optional<int64_t> get_int(const Json& j, const char* name, int64_t min, int64_t max) {
    const Json* f = field(j, name);
    if (!f) return std::nullopt;
    int64_t v = 0;
    if (f->is_number_integer()) {
        if (f->is_number_unsigned() && f->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            v = std::numeric_limits<int64_t>::max();
        else
            v = f->get<int64_t>();
    } else if (f->is_number_float() && std::isfinite(f->get<double>()) && std::floor(f->get<double>()) == f->get<double>() &&
               std::fabs(f->get<double>()) < 9e15) {
        v = static_cast<int64_t>(f->get<double>());  // 16.0 is 16
    } else {
        throw ApiError(400, std::string("'") + name + "' must be an integer, not " + type_name(*f) +
                                (f->is_number() ? " with a fraction" : ""),
                       name);
    }
    if (v < min || v > max)
        throw ApiError(400, std::string("'") + name + "' must be between " + std::to_string(min) + " and " +
                                std::to_string(max) + ", got " + f->dump(),
                       name);
    return v;
}

void check_json_schema(const Json& schema, const std::string& param, const std::string& path) {
    if (schema.is_boolean()) return;
    if (!schema.is_object()) throw ApiError(400, path + " must be a JSON Schema (an object)", param);
    static const char* const kTypes[] = {"string", "number", "integer", "boolean", "null", "object", "array"};
    auto known = [](const Json& t) {
        return t.is_string() && std::any_of(std::begin(kTypes), std::end(kTypes), [&](const char* k) { return t == k; });
    };
    if (auto t = schema.find("type"); t != schema.end()) {
        bool ok = known(*t);
        if (t->is_array()) ok = !t->empty() && std::all_of(t->begin(), t->end(), known);
        if (!ok)
            throw ApiError(400, path + ".type must be one of string, number, integer, boolean, null, object, array (or a list of them)",
                           param);
    }
    if (auto p = schema.find("properties"); p != schema.end()) {
        if (!p->is_object()) throw ApiError(400, path + ".properties must be an object", param);
        for (const auto& [name, sub] : p->items()) check_json_schema(sub, param, path + ".properties." + name);
    }
    for (const char* key : {"items", "additionalProperties", "not"})
        if (auto it = schema.find(key); it != schema.end()) check_json_schema(*it, param, path + "." + key);
    for (const char* key : {"anyOf", "oneOf", "allOf", "prefixItems"})
        if (auto it = schema.find(key); it != schema.end()) {
            if (!it->is_array()) throw ApiError(400, path + "." + key + " must be a list of schemas", param);
            for (size_t i = 0; i < it->size(); ++i)
                check_json_schema((*it)[i], param, path + "." + key + "[" + std::to_string(i) + "]");
        }
    for (const char* key : {"$defs", "definitions"})
        if (auto it = schema.find(key); it != schema.end()) {
            if (!it->is_object()) throw ApiError(400, path + "." + key + " must be an object of schemas", param);
            for (const auto& [name, sub] : it->items()) check_json_schema(sub, param, path + "." + key + "." + name);
        }
    if (auto r = schema.find("required"); r != schema.end())
        if (!r->is_array() || !std::all_of(r->begin(), r->end(), [](const Json& x) { return x.is_string(); }))
            throw ApiError(400, path + ".required must be a list of property names", param);
    if (auto e = schema.find("enum"); e != schema.end())
        if (!e->is_array()) throw ApiError(400, path + ".enum must be a list", param);
}

std::string text_of_content(const Json& content, const std::string& where) {
    if (content.is_null()) return "";
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array())
        throw ApiError(400, where + " must be a string or a list of content parts", "messages");
    std::string text;
    for (const auto& part : content) {
        if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            throw ApiError(400, where + " parts must be objects with a 'type'", "messages");
        const std::string type = part["type"].get<std::string>();
        if (type != "text" && type != "input_text")
            throw ApiError(400, where + ": parts of type '" + type.substr(0, 40) + "' are not supported (text only)",
                           "messages");
        if (!part.contains("text") || !part["text"].is_string())
            throw ApiError(400, where + ": a text part needs a string 'text'", "messages");
        text += part["text"].get<std::string>();
    }
    return text;
}

void check_model(const ServerContext& ctx, const Json& body) {
    auto name = get_string(body, "model");
    if (!name || name->empty() || *name == ctx.model_id) return;
    for (const auto& alias : ctx.model_aliases)
        if (*name == alias) return;
    throw ApiError(404, "the model '" + name->substr(0, 200) + "' does not exist; this server serves '" + ctx.model_id +
                            "' (GET /v1/models)",
                   "model", "model_not_found");
}

SamplingParams parse_sampling(const ServerContext& ctx, const Json& body) {
    SamplingParams p;
    // OpenAI's defaults: temperature 1, top_p 1, no top-k or min-p; a request may ask for llama.cpp's extras.
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.penalty_last_n = -1;
    if (auto v = get_number(body, "temperature", 0.0, 100.0)) p.temperature = static_cast<float>(*v);
    if (auto v = get_number(body, "top_p", 0.0, 1.0)) {
        if (*v <= 0.0) throw ApiError(400, "'top_p' must be greater than 0", "top_p");
        p.top_p = static_cast<float>(*v);
    }
    if (auto v = get_int(body, "top_k", -1, std::numeric_limits<int32_t>::max())) p.top_k = static_cast<int32_t>(*v);
    if (auto v = get_number(body, "min_p", 0.0, 1.0)) p.min_p = static_cast<float>(*v);
    if (auto v = get_number(body, "presence_penalty", -2.0, 2.0)) p.presence_penalty = static_cast<float>(*v);
    if (auto v = get_number(body, "frequency_penalty", -2.0, 2.0)) p.frequency_penalty = static_cast<float>(*v);
    if (auto v = get_number(body, "repetition_penalty", 0.01, 10.0)) p.repetition_penalty = static_cast<float>(*v);
    if (auto v = get_int(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
        p.seed = static_cast<uint64_t>(*v);
    else
        p.seed = std::random_device{}();
    if (const Json* bias = field(body, "logit_bias")) {
        if (!bias->is_object()) throw ApiError(400, "'logit_bias' must be an object of token id -> bias", "logit_bias");
        if (bias->size() > ctx.limits.max_logit_bias)
            throw ApiError(400, "'logit_bias' has more than " + std::to_string(ctx.limits.max_logit_bias) + " entries",
                           "logit_bias");
        const int64_t n_vocab = ctx.model->info().n_vocab;
        for (const auto& [key, value] : bias->items()) {
            char* end = nullptr;
            const long long id = std::strtoll(key.c_str(), &end, 10);
            if (key.empty() || end != key.c_str() + key.size() || id < 0 || id >= n_vocab)
                throw ApiError(400, "'logit_bias' key '" + key.substr(0, 40) + "' is not a token id in 0.." +
                                        std::to_string(n_vocab - 1),
                               "logit_bias");
            if (!value.is_number() || !std::isfinite(value.get<double>()) || std::fabs(value.get<double>()) > 100.0)
                throw ApiError(400, "'logit_bias' values must be numbers between -100 and 100", "logit_bias");
            // OpenAI: -100 bans the token.
            const double b = value.get<double>();
            p.logit_bias.emplace_back(static_cast<int32_t>(id),
                                      b <= -100.0 ? -std::numeric_limits<float>::infinity() : static_cast<float>(b));
        }
    }
    return p;
}

std::vector<std::string> parse_stops(const ServerContext& ctx, const Json& body, const char* name) {
    std::vector<std::string> stops;
    const Json* f = field(body, name);
    if (!f) return stops;
    auto add = [&](const Json& s) {
        if (!s.is_string()) throw ApiError(400, std::string("'") + name + "' must be a string or a list of strings", name);
        const std::string text = s.get<std::string>();
        if (text.size() > ctx.limits.max_stop_length)
            throw ApiError(400, std::string("a stop string in '") + name + "' is longer than " +
                                    std::to_string(ctx.limits.max_stop_length) + " bytes",
                           name);
        if (!text.empty()) stops.push_back(text);
    };
    if (f->is_array()) {
        if (f->size() > ctx.limits.max_stops)
            throw ApiError(400, std::string("'") + name + "' has more than " + std::to_string(ctx.limits.max_stops) +
                                    " stop strings",
                           name);
        for (const auto& s : *f) add(s);
    } else {
        add(*f);
    }
    return stops;
}

// ---- chat prompts ---------------------------------------------------------------------------------------------------

const std::string& builtin_chat_template() {
    // ChatML with Qwen's tool format (tools in the system message, <tool_call> blocks, tool results as
    // <tool_response> in a user turn) and Qwen3's switch for thinking.
    static const std::string kTemplate = R"TPL(
{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{- '<|im_start|>system\n' + message.content + '<|im_end|>\n' }}{%- endif %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + message.content }}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if message.content or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": "' + tool_call.function.name + '", "arguments": ' + tool_call.function.arguments + '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
)TPL";
    return kTemplate;
}

ChatPrompt render_chat(const ServerContext& ctx, const ChatRequest& chat) {
    ChatOptions options{.add_generation_prompt = true, .enable_thinking = chat.enable_thinking};
    if (!chat.tools.is_null() && !chat.tools.empty()) options.tools = chat.tools;
    options.extra = chat.extra_template_args;
    if (auto bos = ctx.tokenizer->bos_id()) options.bos_token = ctx.tokenizer->token_bytes(*bos);
    if (auto eos = ctx.tokenizer->eos_id()) options.eos_token = ctx.tokenizer->token_bytes(*eos);
    Json messages = chat.messages;
    if (ctx.builtin_template) {
        // The built-in template concatenates arguments as text.
        for (auto& m : messages)
            if (m.contains("tool_calls"))
                for (auto& call : m["tool_calls"]) {
                    auto& args = call["function"]["arguments"];
                    if (!args.is_string()) args = dump_json(args);
                }
    }
    std::string text;
    try {
        text = ctx.chat_template.render(messages, options);
    } catch (const Error& e) {
        throw ApiError(400, std::string("the chat template refused the messages: ") + e.what(), "messages");
    }
    ChatPrompt prompt;
    prompt.tokens = ctx.tokenizer->encode(text, /*parse_special=*/true);
    // A template that opens the reasoning block itself (Qwen3.5 style "<think>\n" at the end of the prompt).
    const size_t open = text.rfind("<think>");
    const size_t close = text.rfind("</think>");
    const size_t assistant = text.rfind("<|im_start|>assistant");
    prompt.starts_in_reasoning = open != std::string::npos && (close == std::string::npos || close < open) &&
                                 (assistant == std::string::npos || open > assistant);
    return prompt;
}

// ---- streaming ------------------------------------------------------------------------------------------------------

GenerationEvent drive(RequestChannel& channel, const std::function<bool(const GenerationEvent&)>& on_event,
                      const std::function<bool()>& client_alive) {
    GenerationEvent event;
    bool gone = false;
    constexpr auto kPoll = std::chrono::milliseconds(50);
    auto next_check = std::chrono::steady_clock::now() + kPoll;
    for (;;) {
        const bool got = channel.next(event, kPoll);
        // Whether the client is still there, every 50 ms whether or not tokens keep coming.
        if (client_alive && !gone && std::chrono::steady_clock::now() >= next_check) {
            next_check = std::chrono::steady_clock::now() + kPoll;
            if (!client_alive()) {
                gone = true;
                channel.cancel();
            }
        }
        if (!got) continue;
        if (event.kind == GenerationEvent::Kind::kDone) {
            if (gone && event.reason != FinishReason::kError) event.reason = FinishReason::kCancelled;
            return event;
        }
        if (!gone && !on_event(event)) {
            gone = true;
            channel.cancel();  // the scheduler frees the slot at its next step and sends the final event
        }
    }
}

void respond_when_done(httplib::Response& res, std::shared_ptr<RequestChannel> channel, bool anthropic,
                       std::function<void(const GenerationEvent&)> on_event,
                       std::function<Json(const GenerationEvent&)> body) {
    res.set_chunked_content_provider(
        "application/json",
        guard_stream(channel,
                     [channel, anthropic, on_event, body](size_t, httplib::DataSink& sink) {
                         const GenerationEvent done = drive(
                             *channel,
                             [&](const GenerationEvent& e) {
                                 on_event(e);
                                 return true;
                             },
                             [&] { return sink.is_writable(); });
                         if (done.reason == FinishReason::kCancelled) {
                             current_log().finish_reason = "cancelled";
                             return false;
                         }
                         std::string text;
                         try {
                             text = dump_json(body(done));
                         } catch (const ApiError& e) {
                             current_log().error = e.message;
                             text = dump_json(anthropic ? anthropic_error_body(e) : openai_error_body(e));
                         }
                         if (!sink.write(text.data(), text.size())) return false;
                         sink.done();
                         return true;
                     }),
        [channel](bool) { channel->cancel(); });
}

std::vector<size_t> message_boundaries(const ServerContext& ctx, const std::vector<int32_t>& tokens) {
    // Byte offset where each token ends, then the message ends that fall exactly on one.
    std::string text;
    std::vector<size_t> ends;
    ends.reserve(tokens.size());
    for (int32_t t : tokens) {
        text += token_text(*ctx.tokenizer, t);
        ends.push_back(text.size());
    }
    std::vector<std::string> markers = {"<|im_end|>"};
    for (int32_t id : ctx.model->info().eog_tokens) {
        const std::string m = token_text(*ctx.tokenizer, id);
        if (!m.empty() && std::find(markers.begin(), markers.end(), m) == markers.end()) markers.push_back(m);
    }
    std::vector<size_t> offsets;
    for (const auto& m : markers)
        for (size_t at = text.find(m); at != std::string::npos; at = text.find(m, at + 1)) {
            size_t end = at + m.size();
            if (end < text.size() && text[end] == '\n') ++end;
            offsets.push_back(end);
        }
    std::sort(offsets.begin(), offsets.end());
    std::vector<size_t> out;
    for (size_t off : offsets) {
        auto it = std::lower_bound(ends.begin(), ends.end(), off);
        if (it != ends.end() && *it == off) {
            const size_t pos = static_cast<size_t>(it - ends.begin()) + 1;  // tokens before the boundary
            if (pos < tokens.size() && (out.empty() || out.back() != pos)) out.push_back(pos);
        }
    }
    return out;
}

std::shared_ptr<RequestChannel> submit(const ServerContext& ctx, GenerationRequest request) {
    try {
        return ctx.engine->submit(std::move(request));
    } catch (const QueueFull& e) {
        throw ApiError(503, e.what(), "", "server_busy", "server_error");
    } catch (const ShuttingDown& e) {
        throw ApiError(503, e.what(), "", "shutting_down", "server_error");
    } catch (const Error& e) {
        throw ApiError(400, e.what(), "messages", "context_length_exceeded");
    }
}

httplib::ContentProviderWithoutLength guard_stream(std::shared_ptr<RequestChannel> channel,
                                                   httplib::ContentProviderWithoutLength provider) {
    return [channel, provider](size_t offset, httplib::DataSink& sink) {
        try {
            return provider(offset, sink);
        } catch (const std::exception& e) {
            current_log().error = std::string("stream failed: ") + e.what();
        } catch (...) {
            current_log().error = "stream failed";
        }
        channel->cancel();
        return false;
    };
}

std::string token_text(const Tokenizer& tokenizer, int32_t id) {
    if (id < 0 || id >= tokenizer.n_vocab()) return "";
    return tokenizer.token_bytes(id);
}

std::string dump_json(const Json& j) {
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string sse_data(const Json& j) {
    return "data: " + dump_json(j) + "\n\n";
}

std::string sse_event(const std::string& event, const Json& j) {
    return "event: " + event + "\ndata: " + dump_json(j) + "\n\n";
}

Json openai_token_logprob(const Tokenizer& tokenizer, const TokenLogprob& lp) {
    auto entry = [&](int32_t id, float logprob) {
        const std::string bytes = token_text(tokenizer, id);
        Json b = Json::array();
        for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
        return Json{{"token", bytes}, {"logprob", logprob}, {"bytes", b}};
    };
    Json j = entry(lp.token, lp.logprob);
    Json top = Json::array();
    for (const auto& [id, logprob] : lp.top) top.push_back(entry(id, logprob));
    j["top_logprobs"] = top;
    return j;
}

Json openai_error_body(const ApiError& e) {
    return Json{{"error",
                 {{"message", e.message},
                  {"type", e.type},
                  {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
                  {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}}}};
}

Json anthropic_error_body(const ApiError& e) {
    std::string type = "invalid_request_error";
    if (e.status == 401) type = "authentication_error";
    if (e.status == 403) type = "permission_error";
    if (e.status == 404) type = "not_found_error";
    if (e.status == 413) type = "request_too_large";
    if (e.status == 503) type = "overloaded_error";
    if (e.status >= 500 && e.status != 503) type = "api_error";
    return Json{{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

void post_route(httplib::Server& server, const ServerContext& ctx, const std::string& pattern, bool anthropic,
                std::function<void(const httplib::Request&, httplib::Response&)> handler) {
    const size_t max_body = ctx.limits.max_body;
    server.Post(pattern, [max_body, anthropic, handler](const httplib::Request& req, httplib::Response& res,
                                                        const httplib::ContentReader& reader) {
        constexpr size_t kMaxDrain = size_t{64} << 20;
        std::string body;
        bool too_big = false;
        size_t drained = 0;
        const bool read = reader([&](const char* data, size_t n) {
            if (too_big || body.size() + n > max_body) {
                too_big = true;
                drained += n;
                return drained < kMaxDrain;
            }
            body.append(data, n);
            return true;
        });
        if (!read && !too_big) {
            // httplib refused a Content-Length over the limit (status 413), or the body broke off.
            if (res.status == 413) {
                too_big = true;
            } else {
                guarded(res, anthropic, [&] { throw ApiError(400, "the request body could not be read"); });
                return;
            }
        }
        if (too_big) {
            guarded(res, anthropic, [&] {
                throw ApiError(413, "the request body is larger than " + std::to_string(max_body) + " bytes (--max-body)",
                               "", "request_too_large");
            });
            return;
        }
        httplib::Request with_body = req;
        with_body.body = std::move(body);
        handler(with_body, res);
    });
}

void guarded(httplib::Response& res, bool anthropic, const std::function<void()>& fn) {
    auto fail = [&](const ApiError& e) {
        res.status = e.status;
        res.set_content(dump_json(anthropic ? anthropic_error_body(e) : openai_error_body(e)), "application/json");
        current_log().error = e.message;
    };
    try {
        fn();
    } catch (const ApiError& e) {
        fail(e);
    } catch (const Error& e) {
        fail(ApiError(400, e.what()));
    } catch (const Json::exception& e) {
        fail(ApiError(400, std::string("bad request: ") + e.what()));
    } catch (const std::bad_alloc&) {
        fail(ApiError(500, "out of memory", "", "", "server_error"));
    } catch (const std::exception& e) {
        fail(ApiError(500, std::string("internal error: ") + e.what(), "", "", "server_error"));
    }
}

}  // namespace strata::server
