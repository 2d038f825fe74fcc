// JSON Schema (subset) -> grammar nodes. See json_schema_grammar.h for the language decisions.
#include "runtime/json_schema_grammar.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"

namespace strata::constraint {

namespace {

using json = nlohmann::json;

constexpr int kMaxSchemaDepth = 64;

// Keywords that only describe (or that we may ignore without accepting invalid output).
const std::set<std::string>& annotation_keywords() {
    static const std::set<std::string> words = {
        "title",   "description", "default",       "examples",  "$comment", "$schema",         "$id",
        "$anchor", "deprecated",  "readOnly",      "writeOnly", "format",   "contentEncoding", "contentMediaType",
        "$defs",   "definitions", "discriminator", "strict"};
    return words;
}

const std::set<std::string>& assertion_keywords() {
    static const std::set<std::string> words = {"type",      "properties", "required", "additionalProperties",
                                                "items",     "minItems",   "maxItems", "enum",
                                                "const",     "anyOf",      "oneOf",    "$ref",
                                                "minLength", "maxLength",  "nullable"};
    return words;
}

std::string json_text(const std::string& s) {
    try {
        return json(s).dump();
    } catch (const json::exception&) {
        throw Error("schema text is not valid UTF-8: " + json(s).dump(-1, ' ', true, json::error_handler_t::replace));
    }
}

// The text of a JSON string without its quotes (how a key appears between the quotes).
std::string key_text(const std::string& name) {
    std::string text = json_text(name);
    return text.substr(1, text.size() - 2);
}

bool value_has_type(const json& v, const std::string& type) {
    if (type == "string") return v.is_string();
    if (type == "number") return v.is_number();
    if (type == "integer") return v.is_number_integer() || v.is_number_unsigned();
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    return false;
}

class Compiler {
  public:
    Compiler(Grammar& grammar, const json& root, std::string root_path)
        : g_(grammar), root_(root), root_path_(std::move(root_path)) {}

    uint32_t compile_root() { return compile(root_, ""); }

    // Parameters of the XML tool-call form from an object schema: a string parameter's value is raw text (or one of
    // its enum strings), any other value is JSON; each is followed by "\n</parameter>\n".
    uint32_t xml_params() {
        static const std::string kEnd = "\n</parameter>\n";
        Node n{.kind = NodeKind::XmlParams};
        std::vector<std::pair<std::string, uint32_t>> params;  // key text, value node
        std::set<std::string> required;
        if (root_.is_object() && root_.contains("required") && root_["required"].is_array())
            for (const json& r : root_["required"])
                if (r.is_string()) required.insert(r.get<std::string>());
        std::set<std::string> declared;
        if (root_.is_object() && root_.contains("properties") && root_["properties"].is_object()) {
            for (const auto& [name, sub] : root_["properties"].items()) {
                if (name.empty() || name.find_first_of(">\n") != std::string::npos)
                    fail("/properties", "parameter name '" + name + "' cannot be written in the XML call form");
                declared.insert(name);
                const std::string path = "/properties/" + name;
                uint32_t value;
                if (raw_string(sub)) {
                    std::vector<std::string> raw;
                    for (const char* kw : {"enum", "const"}) {
                        if (!sub.contains(kw)) continue;
                        const json values = std::string(kw) == "const" ? json::array({sub[kw]}) : sub[kw];
                        if (!values.is_array()) fail(path, "'enum' must be an array");
                        for (const json& v : values)
                            if (v.is_string()) raw.push_back(v.get<std::string>() + kEnd);
                        if (raw.empty()) fail(path, "no 'enum'/'const' value is a string: no value is valid");
                    }
                    value = raw.empty() ? raw_text(kEnd) : literal(std::move(raw));
                } else {
                    Node seq{.kind = NodeKind::Sequence};
                    seq.children = {compile(sub, path), literal({kEnd})};
                    value = add(std::move(seq));
                }
                params.emplace_back("<parameter=" + name + ">\n", value);
            }
        }
        for (const std::string& r : required)
            if (!declared.count(r)) fail("", "required parameter '" + r + "' is not in 'properties'");
        if (params.size() > static_cast<size_t>(kMaxProperties))
            fail("", "more than " + std::to_string(kMaxProperties) + " parameters are not supported");
        std::sort(params.begin(), params.end());
        for (size_t i = 0; i < params.size(); ++i) {
            n.keys.push_back(params[i].first);
            n.key_nodes.push_back(params[i].second);
            const std::string name = params[i].first.substr(11, params[i].first.size() - 13);
            if (required.count(name)) n.required_mask |= uint64_t{1} << i;
            n.allowed_mask |= uint64_t{1} << i;
        }
        return add(std::move(n));
    }

    // The template writes a string parameter's value as it is (`value | string`), not as JSON.
    static bool raw_string(const json& sub) {
        if (!sub.is_object() || sub.contains("$ref") || sub.contains("anyOf") || sub.contains("oneOf")) return false;
        if (sub.contains("type")) return sub["type"] == "string";
        bool any = false;
        for (const char* kw : {"enum", "const"}) {
            if (!sub.contains(kw)) continue;
            const json values = std::string(kw) == "const" ? json::array({sub[kw]}) : sub[kw];
            if (!values.is_array()) return false;
            for (const json& v : values)
                if (!v.is_string()) return false;
            any = true;
        }
        return any;
    }

    uint32_t raw_text(const std::string& terminator) {
        Node n{.kind = NodeKind::RawText};
        n.candidates = {terminator};
        const size_t len = terminator.size();
        STRATA_ASSERT(len > 0 && len < 255);
        n.dfa.assign(len * 256, 0);
        for (size_t k = 0; k < len; ++k) {
            for (int b = 0; b < 256; ++b) {
                // The longest prefix of the terminator that ends the text "terminator[0, k) + b".
                const std::string text = terminator.substr(0, k) + static_cast<char>(b);
                size_t best = 0;
                for (size_t m = std::min(len, text.size()); m > 0; --m) {
                    if (text.compare(text.size() - m, m, terminator, 0, m) == 0) {
                        best = m;
                        break;
                    }
                }
                n.dfa[k * 256 + static_cast<size_t>(b)] = static_cast<uint8_t>(best);
            }
        }
        return add(std::move(n));
    }

    uint32_t add(Node node) {
        g_.nodes.push_back(std::move(node));
        return static_cast<uint32_t>(g_.nodes.size() - 1);
    }

    uint32_t literal(std::vector<std::string> candidates) {
        std::sort(candidates.begin(), candidates.end());
        candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
        Node n;
        n.kind = NodeKind::Literal;
        n.candidates = std::move(candidates);
        return add(std::move(n));
    }

  private:
    [[noreturn]] void fail(const std::string& path, const std::string& what) const {
        throw Error("json schema at " + where(path) + ": " + what);
    }
    std::string where(const std::string& path) const { return root_path_ + (path.empty() ? "" : path); }

    uint32_t count(const json& s, const char* key, const std::string& path) const {
        const json& v = s.at(key);
        if (v.is_number_unsigned()) return static_cast<uint32_t>(std::min<uint64_t>(v.get<uint64_t>(), UINT32_MAX));
        if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint32_t>(v.get<int64_t>());
        if (v.is_number_float()) {  // 2.0 is an integer in JSON Schema
            const double d = v.get<double>();
            if (d >= 0 && d <= 4294967295.0 && d == static_cast<double>(static_cast<uint32_t>(d)))
                return static_cast<uint32_t>(d);
        }
        fail(path, std::string("'") + key + "' must be a non-negative integer");
    }

    uint32_t any_value() {
        if (any_ != kNoNode) return any_;
        any_ = add(Node{.kind = NodeKind::Union});
        Node object{.kind = NodeKind::Object};
        object.additional = any_;
        Node array{.kind = NodeKind::Array};
        array.items = any_;
        std::vector<uint32_t> children = {add(std::move(object)),
                                          add(std::move(array)),
                                          add(Node{.kind = NodeKind::String}),
                                          add(Node{.kind = NodeKind::Number}),
                                          literal({"false", "true"}),
                                          literal({"null"})};
        g_.nodes[any_].children = std::move(children);
        return any_;
    }

    uint32_t compile(const json& s, const std::string& path) {
        // Recursion follows the schema's nesting, which a client chooses: bound it.
        if (depth_ >= kMaxSchemaDepth)
            fail(path, "schemas nested deeper than " + std::to_string(kMaxSchemaDepth) + " levels are not supported");
        ++depth_;
        struct Leave {
            int& depth;
            ~Leave() { --depth; }
        } leave{depth_};
        if (s.is_boolean()) return s.get<bool>() ? any_value() : add(Node{.kind = NodeKind::Never});
        if (!s.is_object()) fail(path, "a schema must be an object or a boolean, got " + std::string(s.type_name()));
        std::vector<std::string> assertions;
        for (const auto& [key, value] : s.items()) {
            if (assertion_keywords().count(key)) {
                assertions.push_back(key);
            } else if (!annotation_keywords().count(key)) {
                fail(path, "unsupported keyword '" + key + "'");
            }
        }
        const bool nullable = s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>();
        if (s.contains("nullable") && !s["nullable"].is_boolean()) fail(path, "'nullable' must be a boolean");
        auto only = [&](const char* keyword) {
            for (const std::string& other : assertions)
                if (other != keyword && other != "nullable")
                    fail(path, std::string("'") + keyword + "' together with '" + other + "' is not supported");
        };

        if (s.contains("$ref")) {
            only("$ref");
            return with_null(resolve_ref(s["$ref"], path), nullable);
        }
        if (s.contains("anyOf") || s.contains("oneOf")) {
            const char* keyword = s.contains("anyOf") ? "anyOf" : "oneOf";
            only(keyword);
            const json& list = s[keyword];
            if (!list.is_array() || list.empty())
                fail(path, std::string("'") + keyword + "' must be a non-empty array");
            Node u{.kind = NodeKind::Union};
            for (size_t i = 0; i < list.size(); ++i)
                u.children.push_back(compile(list[i], path + "/" + keyword + "/" + std::to_string(i)));
            if (nullable) u.children.push_back(literal({"null"}));
            return add(std::move(u));
        }

        std::vector<std::string> types;
        if (s.contains("type")) {
            const json& t = s["type"];
            if (t.is_string()) {
                types.push_back(t.get<std::string>());
            } else if (t.is_array() && !t.empty()) {
                for (const json& e : t) {
                    if (!e.is_string()) fail(path, "'type' must be a string or an array of strings");
                    types.push_back(e.get<std::string>());
                }
            } else {
                fail(path, "'type' must be a string or a non-empty array of strings");
            }
            for (const std::string& type : types)
                if (type != "string" && type != "number" && type != "integer" && type != "boolean" && type != "null" &&
                    type != "object" && type != "array")
                    fail(path, "unknown type '" + type + "'");
        }
        if (nullable && !types.empty()) types.push_back("null");

        if (s.contains("enum") || s.contains("const")) return compile_enum(s, types, nullable, path);

        if (types.empty()) {
            if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
                types.push_back("object");
            } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
                types.push_back("array");
            } else if (s.contains("minLength") || s.contains("maxLength")) {
                types.push_back("string");
            } else {
                return with_null(any_value(), false);  // any value already includes null
            }
            if (nullable) types.push_back("null");
        }
        std::sort(types.begin(), types.end());
        types.erase(std::unique(types.begin(), types.end()), types.end());
        if (std::count(types.begin(), types.end(), "number") && std::count(types.begin(), types.end(), "integer"))
            types.erase(std::find(types.begin(), types.end(), "integer"));  // number already covers integers
        Node u{.kind = NodeKind::Union};
        for (const std::string& type : types) u.children.push_back(compile_type(s, type, path));
        if (u.children.size() == 1) return u.children[0];
        return add(std::move(u));
    }

    uint32_t with_null(uint32_t node, bool nullable) {
        if (!nullable) return node;
        Node u{.kind = NodeKind::Union};
        u.children = {node, literal({"null"})};
        return add(std::move(u));
    }

    uint32_t compile_enum(const json& s, const std::vector<std::string>& types, bool nullable,
                          const std::string& path) {
        std::vector<json> values;
        if (s.contains("const")) {
            values.push_back(s["const"]);
            if (s.contains("enum")) {
                if (!s["enum"].is_array() ||
                    std::find(s["enum"].begin(), s["enum"].end(), s["const"]) == s["enum"].end())
                    fail(path, "'const' is not one of 'enum': no value is valid");
            }
        } else {
            if (!s["enum"].is_array() || s["enum"].empty()) fail(path, "'enum' must be a non-empty array");
            for (const json& v : s["enum"]) values.push_back(v);
        }
        if (nullable) values.push_back(nullptr);
        std::vector<std::string> candidates;
        for (const json& v : values) {
            bool ok = types.empty();
            for (const std::string& type : types) ok = ok || value_has_type(v, type);
            if (!ok) continue;
            try {
                candidates.push_back(v.dump());
            } catch (const json::exception&) {
                fail(path, "an enum value is not valid UTF-8");
            }
        }
        if (candidates.empty()) fail(path, "no 'enum'/'const' value has the schema's type: no value is valid");
        if (candidates.size() > 65535) fail(path, "more than 65,535 'enum' values are not supported");
        return literal(std::move(candidates));
    }

    uint32_t compile_type(const json& s, const std::string& type, const std::string& path) {
        if (type == "string") {
            Node n{.kind = NodeKind::String};
            if (s.contains("minLength")) n.min_length = count(s, "minLength", path);
            if (s.contains("maxLength")) n.max_length = count(s, "maxLength", path);
            if (n.min_length > n.max_length) fail(path, "'minLength' is greater than 'maxLength'");
            return add(std::move(n));
        }
        if (type == "number") return add(Node{.kind = NodeKind::Number});
        if (type == "integer") return add(Node{.kind = NodeKind::Integer});
        if (type == "boolean") return literal({"false", "true"});
        if (type == "null") return literal({"null"});
        if (type == "array") return compile_array(s, path);
        return compile_object(s, path);
    }

    uint32_t compile_array(const json& s, const std::string& path) {
        Node n{.kind = NodeKind::Array};
        if (s.contains("minItems")) n.min_items = count(s, "minItems", path);
        if (s.contains("maxItems")) n.max_items = count(s, "maxItems", path);
        if (n.min_items > n.max_items) fail(path, "'minItems' is greater than 'maxItems'");
        if (s.contains("items")) {
            if (s["items"].is_array()) fail(path + "/items", "'items' as an array (tuple validation) is not supported");
            n.items = compile(s["items"], path + "/items");
        } else {
            n.items = any_value();
        }
        return add(std::move(n));
    }

    uint32_t compile_object(const json& s, const std::string& path) {
        Node n{.kind = NodeKind::Object};
        std::map<std::string, uint32_t> props;  // name -> node
        if (s.contains("properties")) {
            if (!s["properties"].is_object()) fail(path, "'properties' must be an object");
            for (const auto& [name, sub] : s["properties"].items())
                props[name] = compile(sub, path + "/properties/" + name);
        }
        if (s.contains("additionalProperties")) {
            const json& a = s["additionalProperties"];
            if (a.is_boolean()) {
                n.additional = a.get<bool>() ? any_value() : kNoNode;
            } else {
                n.additional = compile(a, path + "/additionalProperties");
            }
        } else {
            // Stricter than JSON Schema on purpose: with declared properties, no others (see the header).
            n.additional = s.contains("properties") ? kNoNode : any_value();
        }
        std::set<std::string> required;
        if (s.contains("required")) {
            if (!s["required"].is_array()) fail(path, "'required' must be an array of strings");
            for (const json& r : s["required"]) {
                if (!r.is_string()) fail(path, "'required' must be an array of strings");
                const std::string name = r.get<std::string>();
                required.insert(name);
                if (!props.count(name)) {
                    if (n.additional == kNoNode)
                        fail(path, "required property '" + name +
                                       "' is not in 'properties' and no other "
                                       "properties are allowed");
                    props[name] = n.additional;
                }
            }
        }
        if (props.size() > static_cast<size_t>(kMaxProperties))
            fail(path, "more than " + std::to_string(kMaxProperties) + " properties are not supported");
        std::vector<std::pair<std::string, std::string>> keyed;  // key text, name
        for (const auto& [name, node] : props) keyed.emplace_back(key_text(name), name);
        std::sort(keyed.begin(), keyed.end());
        for (size_t i = 0; i < keyed.size(); ++i) {
            n.keys.push_back(keyed[i].first);
            n.key_nodes.push_back(props[keyed[i].second]);
            if (required.count(keyed[i].second)) n.required_mask |= uint64_t{1} << i;
            n.allowed_mask |= uint64_t{1} << i;  // pruned later for schemas that admit nothing
        }
        return add(std::move(n));
    }

    uint32_t resolve_ref(const json& ref, const std::string& path) {
        if (!ref.is_string()) fail(path, "'$ref' must be a string");
        const std::string target = ref.get<std::string>();
        if (target.empty() || target[0] != '#')
            fail(path, "'$ref' " + target + " is not supported: only references inside the schema (#/$defs/...)");
        if (auto it = ref_nodes_.find(target); it != ref_nodes_.end()) return it->second;
        const json* resolved = nullptr;
        try {
            resolved = &root_.at(json::json_pointer(target.substr(1)));
        } catch (const json::exception&) {
            fail(path, "'$ref' " + target + " does not point into the schema");
        }
        const uint32_t placeholder = add(Node{.kind = NodeKind::Ref});
        ref_nodes_[target] = placeholder;
        const uint32_t compiled = compile(*resolved, target.substr(1));
        g_.nodes[placeholder].children = {compiled};
        return placeholder;
    }

    Grammar& g_;
    const json& root_;
    std::string root_path_;
    uint32_t any_ = kNoNode;
    int depth_ = 0;
    std::map<std::string, uint32_t> ref_nodes_;
};

// Steps a value can start with without consuming a byte: a cycle there would make the recognizer loop.
void check_no_empty_cycles(const Grammar& g) {
    std::vector<uint8_t> color(g.nodes.size(), 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> stack;
    for (uint32_t start = 0; start < g.nodes.size(); ++start) {
        if (color[start]) continue;
        stack.push_back({start, 0});
        color[start] = 1;
        while (!stack.empty()) {
            auto& [node, next] = stack.back();
            const Node& n = g.nodes[node];
            size_t edges = 0;
            if (n.kind == NodeKind::Union || n.kind == NodeKind::Ref) edges = n.children.size();
            if (n.kind == NodeKind::Sequence) edges = n.children.empty() ? 0 : 1;
            if (next < edges) {
                const uint32_t child = n.children[next++];
                if (color[child] == 1)
                    throw Error("json schema: a $ref/anyOf loop refers back to itself without any text in between");
                if (color[child] == 0) {
                    color[child] = 1;
                    stack.push_back({child, 0});
                }
            } else {
                color[node] = 2;
                stack.pop_back();
            }
        }
    }
}

// Least fixpoint of "some text matches this node"; then drops every choice that leads nowhere, so that the
// recognizer can never reach a state with no way to continue. Throws Error when the root matches nothing.
void prune_empty(Grammar& g) {
    std::vector<uint8_t> live(g.nodes.size(), 0);
    auto ok = [&](uint32_t i) { return i != kNoNode && live[i]; };
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t i = 0; i < g.nodes.size(); ++i) {
            if (live[i]) continue;
            const Node& n = g.nodes[i];
            bool l = false;
            switch (n.kind) {
                case NodeKind::Never:
                    break;
                case NodeKind::String:
                case NodeKind::Number:
                case NodeKind::Integer:
                    l = true;
                    break;
                case NodeKind::Literal:
                    l = !n.candidates.empty();
                    break;
                case NodeKind::Array:
                    l = n.min_items == 0 || ok(n.items);
                    break;
                case NodeKind::RawText:
                    l = true;
                    break;
                case NodeKind::Object:
                case NodeKind::XmlParams:
                    l = true;
                    for (size_t k = 0; k < n.keys.size(); ++k)
                        if ((n.required_mask >> k & 1) && !ok(n.key_nodes[k])) l = false;
                    break;
                case NodeKind::Union:
                case NodeKind::Ref:
                case NodeKind::Dispatch:
                    for (uint32_t c : n.children) l = l || ok(c);
                    break;
                case NodeKind::Sequence:
                    l = true;
                    for (uint32_t c : n.children) l = l && ok(c);
                    break;
            }
            if (l) {
                live[i] = 1;
                changed = true;
            }
        }
    }
    if (!ok(g.root)) throw Error("json schema admits no value (required properties or items that nothing satisfies)");
    for (uint32_t i = 0; i < g.nodes.size(); ++i) {
        Node& n = g.nodes[i];
        if (n.kind == NodeKind::Array && !ok(n.items)) n.max_items = 0;
        if (n.kind == NodeKind::Object || n.kind == NodeKind::XmlParams) {
            for (size_t k = 0; k < n.keys.size(); ++k)
                if (!ok(n.key_nodes[k])) n.allowed_mask &= ~(uint64_t{1} << k);
            if (!ok(n.additional)) n.additional = kNoNode;
        }
        if (n.kind == NodeKind::Union) std::erase_if(n.children, [&](uint32_t c) { return !ok(c); });
        if (n.kind == NodeKind::Dispatch) {
            for (size_t k = n.children.size(); k-- > 0;)
                if (!ok(n.children[k])) {
                    n.children.erase(n.children.begin() + static_cast<std::ptrdiff_t>(k));
                    n.candidates.erase(n.candidates.begin() + static_cast<std::ptrdiff_t>(k));
                }
        }
    }
}

void finish(Grammar& g) {
    check_no_empty_cycles(g);
    prune_empty(g);
}

// Messages quote names and paths from the request: keep them on one line.
std::string one_line(std::string message) {
    for (char& ch : message)
        if (static_cast<unsigned char>(ch) < 0x20) ch = ' ';
    return message;
}

Grammar compile_tools(const nlohmann::json& tools, const std::optional<std::string>& forced_name, bool allow_parallel,
                      bool xml) {
    if (!tools.is_array() || tools.empty()) throw Error("tools must be a non-empty array to force a tool call");
    Grammar g;
    std::vector<std::pair<std::string, uint32_t>> calls;  // candidate text, arguments node
    std::set<std::string> names;
    static const json no_parameters = {{"type", "object"}, {"properties", json::object()}};
    for (size_t i = 0; i < tools.size(); ++i) {
        const std::string at = "tools[" + std::to_string(i) + "]";
        const json& tool = tools[i];
        if (!tool.is_object()) throw Error(at + " must be an object");
        if (tool.contains("type") && tool["type"] != "function")
            throw Error(at + ": only tools of type \"function\" are supported");
        if (!tool.contains("function") || !tool["function"].is_object())
            throw Error(at + " needs a \"function\" object");
        const json& fn = tool["function"];
        if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
            throw Error(at + ".function needs a non-empty \"name\" string");
        const std::string name = fn["name"].get<std::string>();
        if (!names.insert(name).second) throw Error(at + ": two tools are named '" + name + "'");
        if (forced_name && *forced_name != name) continue;
        const json& parameters =
            fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : no_parameters;
        Compiler compiler(g, parameters, at + ".function.parameters#");
        const uint32_t arguments = compiler.compile_root();  // validates the whole schema in either form
        if (xml) {
            if (name.find_first_of(">\n") != std::string::npos)
                throw Error(at + ": the name '" + name + "' cannot be written in the XML call form");
            calls.emplace_back(name + ">\n", compiler.xml_params());
        } else {
            calls.emplace_back(json_text(name) + ", \"arguments\": ", arguments);
        }
    }
    if (calls.size() > 65535) throw Error("more than 65,535 tools are not supported");
    if (forced_name && calls.empty())
        throw Error("tool_choice names the function '" + *forced_name + "', which is not in tools");
    std::sort(calls.begin(), calls.end());
    static const json no_schema;
    Compiler text(g, no_schema, "tools");
    Node dispatch{.kind = NodeKind::Dispatch};
    for (const auto& [candidate, node] : calls) {
        dispatch.candidates.push_back(candidate);
        dispatch.children.push_back(node);
    }
    Node call{.kind = NodeKind::Sequence};
    if (xml) {
        call.children = {text.literal({"<tool_call>\n<function="}), text.add(std::move(dispatch)),
                         text.literal({"</function>\n</tool_call>"})};
    } else {
        call.children = {text.literal({"<tool_call>\n{\"name\": "}), text.add(std::move(dispatch)),
                         text.literal({"}\n</tool_call>"})};
    }
    g.root = text.add(std::move(call));
    if (!xml) g.root_depth = 1;  // the arguments sit inside the call's {"name": ..., "arguments": ...}
    if (allow_parallel) {
        Node again{.kind = NodeKind::Sequence};
        again.children = {text.literal({"\n"}), g.root};
        g.repeat = text.add(std::move(again));
    }
    finish(g);
    return g;
}

}  // namespace

Grammar compile_json_schema(const nlohmann::json& schema) {
    try {
        Grammar g;
        Compiler compiler(g, schema, "#");
        g.root = compiler.compile_root();
        finish(g);
        return g;
    } catch (const Error& e) {
        throw Error(one_line(e.what()));
    }
}

Grammar compile_tool_calls(const nlohmann::json& tools, const std::optional<std::string>& forced_name,
                           bool allow_parallel) {
    try {
        return compile_tools(tools, forced_name, allow_parallel, /*xml=*/false);
    } catch (const Error& e) {
        throw Error(one_line(e.what()));
    }
}

Grammar compile_xml_tool_calls(const nlohmann::json& tools, const std::optional<std::string>& forced_name,
                               bool allow_parallel) {
    try {
        return compile_tools(tools, forced_name, allow_parallel, /*xml=*/true);
    } catch (const Error& e) {
        throw Error(one_line(e.what()));
    }
}

}  // namespace strata::constraint
