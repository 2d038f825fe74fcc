#include "server/reply_parser.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <random>

namespace strata::server {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view text, std::string_view marker) {
    for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
        if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
    return 0;
}

bool is_blank(std::string_view s) {
    return s.find_first_not_of(" \t\r\n") == std::string_view::npos;
}

}  // namespace

std::string random_id(const std::string& prefix) {
    static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string id = prefix;
    for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof(kChars) - 1)];
    return id;
}

ReplyParser::ReplyParser(ReplyParserOptions options)
    : options_(options), mode_(options.start_in_reasoning ? Mode::kReasoning : Mode::kContent) {
    trim_leading_ = options.start_in_reasoning;
}

std::vector<ReplyPiece> ReplyParser::push(std::string_view text) {
    std::vector<ReplyPiece> out;
    buffer_.append(text);
    drain(false, out);
    return out;
}

std::vector<ReplyPiece> ReplyParser::finish() {
    std::vector<ReplyPiece> out;
    drain(true, out);
    return out;
}

void ReplyParser::emit(ReplyPiece::Kind kind, std::string text, std::vector<ReplyPiece>& out) {
    if (trim_leading_) {
        const size_t start = text.find_first_not_of(" \t\r\n");
        if (start == std::string::npos) return;
        text.erase(0, start);
        trim_leading_ = false;
    }
    if (text.empty()) return;
    if (kind == ReplyPiece::Kind::kContent) content_started_ = true;
    if (!out.empty() && out.back().kind == kind && kind != ReplyPiece::Kind::kToolCall) {
        out.back().text += text;
        return;
    }
    out.push_back({.kind = kind, .text = std::move(text)});
}

namespace {

// Qwen3.5 / Qwen3-Coder's XML form: <function=NAME>\n<parameter=P>\nVALUE\n</parameter>...</function>. A value that
// parses as JSON (number, boolean, object, ...) is taken as that, anything else as a string. nullopt when it is not
// that form.
std::optional<nlohmann::json> parse_xml_call(std::string_view body, std::string& name) {
    const size_t start = body.find_first_not_of(" \t\r\n");
    constexpr std::string_view kFunction = "<function=";
    if (start == std::string_view::npos || body.substr(start, kFunction.size()) != kFunction) return std::nullopt;
    size_t at = start + kFunction.size();
    const size_t name_end = body.find('>', at);
    if (name_end == std::string_view::npos) return std::nullopt;
    name = std::string(body.substr(at, name_end - at));
    if (name.empty()) return std::nullopt;
    at = name_end + 1;
    nlohmann::json args = nlohmann::json::object();
    constexpr std::string_view kParam = "<parameter=", kParamEnd = "</parameter>";
    for (;;) {
        const size_t p = body.find(kParam, at);
        if (p == std::string_view::npos) break;
        const size_t pname_end = body.find('>', p + kParam.size());
        if (pname_end == std::string_view::npos) return std::nullopt;
        const std::string pname(body.substr(p + kParam.size(), pname_end - p - kParam.size()));
        const size_t close = body.find(kParamEnd, pname_end + 1);
        if (close == std::string_view::npos) return std::nullopt;
        std::string value(body.substr(pname_end + 1, close - pname_end - 1));
        if (!value.empty() && value.front() == '\n') value.erase(0, 1);
        if (!value.empty() && value.back() == '\n') value.pop_back();
        auto parsed = nlohmann::json::parse(value, nullptr, false);
        args[pname] = parsed.is_discarded() || parsed.is_string() ? nlohmann::json(value) : parsed;
        at = close + kParamEnd.size();
    }
    return args;
}

}  // namespace

// A tool call's body: {"name": "...", "arguments": {...}} (or the XML form above). False when it is neither (the
// caller shows it as text).
bool ReplyParser::close_tool_call(std::string_view body, std::vector<ReplyPiece>& out) {
    std::string xml_name;
    if (auto xml = parse_xml_call(body, xml_name)) {
        ++n_tool_calls_;
        trim_leading_ = false;
        out.push_back({.kind = ReplyPiece::Kind::kToolCall,
                       .call = {.id = random_id("call_"),
                                .name = xml_name,
                                .arguments = xml->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)}});
        return true;
    }
    const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    ParsedToolCall call{.id = random_id("call_"), .name = j["name"].get<std::string>(), .arguments = "{}"};
    if (auto it = j.find("arguments"); it != j.end()) {
        if (it->is_string()) {
            call.arguments = it->get<std::string>();
        } else {
            call.arguments = it->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        }
    }
    ++n_tool_calls_;
    trim_leading_ = false;
    out.push_back({.kind = ReplyPiece::Kind::kToolCall, .call = std::move(call)});
    return true;
}

void ReplyParser::drain(bool final, std::vector<ReplyPiece>& out) {
    for (;;) {
        if (mode_ == Mode::kReasoning) {
            const size_t close = buffer_.find(kThinkClose);
            if (close != std::string::npos) {
                emit(ReplyPiece::Kind::kReasoning, buffer_.substr(0, close), out);
                buffer_.erase(0, close + kThinkClose.size());
                mode_ = Mode::kContent;
                trim_leading_ = true;
                continue;
            }
            const size_t hold = final ? 0 : partial_suffix(buffer_, kThinkClose);
            emit(ReplyPiece::Kind::kReasoning, buffer_.substr(0, buffer_.size() - hold), out);
            buffer_.erase(0, buffer_.size() - hold);
            return;
        }
        if (mode_ == Mode::kToolCall) {
            const size_t close = buffer_.find(kToolClose);
            if (close == std::string::npos && !final) return;
            const std::string body = buffer_.substr(0, close);
            if (!close_tool_call(body, out)) {
                // Not a tool call after all: the text as it was.
                emit(ReplyPiece::Kind::kContent,
                     std::string(kToolOpen) + body + (close == std::string::npos ? "" : std::string(kToolClose)), out);
            }
            buffer_.erase(0, close == std::string::npos ? buffer_.size() : close + kToolClose.size());
            mode_ = Mode::kContent;
            trim_leading_ = true;
            if (final && buffer_.empty()) return;
            continue;
        }
        // Content: the next marker that may open a block.
        size_t at = std::string::npos;
        Mode next = Mode::kContent;
        size_t marker_size = 0;
        if (options_.parse_tool_calls) {
            const size_t t = buffer_.find(kToolOpen);
            if (t != std::string::npos) {
                at = t;
                next = Mode::kToolCall;
                marker_size = kToolOpen.size();
            }
        }
        if (options_.parse_reasoning && !content_started_ && n_tool_calls_ == 0) {
            const size_t t = buffer_.find(kThinkOpen);
            if (t != std::string::npos && t < at && is_blank(std::string_view(buffer_).substr(0, t))) {
                at = t;
                next = Mode::kReasoning;
                marker_size = kThinkOpen.size();
            }
        }
        if (at != std::string::npos) {
            emit(ReplyPiece::Kind::kContent, buffer_.substr(0, at), out);
            buffer_.erase(0, at + marker_size);
            mode_ = next;
            if (next == Mode::kReasoning) trim_leading_ = true;
            continue;
        }
        size_t hold = 0;
        if (!final) {
            if (options_.parse_tool_calls) hold = std::max(hold, partial_suffix(buffer_, kToolOpen));
            if (options_.parse_reasoning && !content_started_) hold = std::max(hold, partial_suffix(buffer_, kThinkOpen));
            // Before any content, blank text may still be followed by <think>: keep it.
            if (options_.parse_reasoning && !content_started_ && n_tool_calls_ == 0 && is_blank(buffer_))
                hold = buffer_.size();
        }
        emit(ReplyPiece::Kind::kContent, buffer_.substr(0, buffer_.size() - hold), out);
        buffer_.erase(0, buffer_.size() - hold);
        return;
    }
}

}  // namespace strata::server
