#include "tokenizer/jinja_value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace strata::jinja {

// ---- UTF-8 ------------------------------------------------------------------------------------------------------

// Bytes that are not valid UTF-8 decode to U+DC80..U+DCFF (Python's surrogateescape), so they survive a round trip.
std::vector<char32_t> utf8_decode(const std::string& s) {
    std::vector<char32_t> out;
    out.reserve(s.size());
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        const unsigned char c = p[i];
        int len = 0;
        char32_t cp = 0;
        if (c < 0x80) {
            len = 1, cp = c;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07;
        }
        bool ok = len > 0 && i + len <= n;
        for (int k = 1; ok && k < len; ++k) {
            if ((p[i + k] & 0xC0) != 0x80) ok = false;
            else cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (ok) {
            static const char32_t min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
            if (cp < min_for_len[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) ok = false;
        }
        if (!ok) {
            out.push_back(0xDC00 + c);
            i += 1;
        } else {
            out.push_back(cp);
            i += len;
        }
    }
    return out;
}

void utf8_append(std::string& out, char32_t cp) {
    if (cp >= 0xDC80 && cp <= 0xDCFF) {
        out.push_back(static_cast<char>(cp - 0xDC00));
    } else if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

std::string utf8_encode(const std::vector<char32_t>& cps, size_t begin, size_t end) {
    std::string out;
    end = std::min(end, cps.size());
    for (size_t i = begin; i < end; ++i) utf8_append(out, cps[i]);
    return out;
}

// str.isspace() of Python: the Unicode White_Space characters plus the ASCII separators 0x1C..0x1F.
bool python_isspace(char32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return true;
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {

// str.isprintable() of Python, which decides what repr() escapes.
bool python_isprintable(char32_t cp) {
    if (cp == ' ') return true;
    if (cp >= 0xDC80 && cp <= 0xDCFF) return false;
    if (cp < 0x20 || cp == 0x7F) return false;
    if (cp < 0x7F) return true;
    switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
        case UTF8PROC_CATEGORY_CC:
        case UTF8PROC_CATEGORY_CF:
        case UTF8PROC_CATEGORY_CS:
        case UTF8PROC_CATEGORY_CO:
        case UTF8PROC_CATEGORY_CN:
        case UTF8PROC_CATEGORY_ZL:
        case UTF8PROC_CATEGORY_ZP:
        case UTF8PROC_CATEGORY_ZS:
            return false;
        default:
            return true;
    }
}

std::string python_string_repr(const std::string& s) {
    const bool has_single = s.find('\'') != std::string::npos;
    const bool has_double = s.find('"') != std::string::npos;
    const char quote = (has_single && !has_double) ? '"' : '\'';
    std::string out(1, quote);
    for (char32_t cp : utf8_decode(s)) {
        if (cp == static_cast<char32_t>(quote) || cp == '\\') {
            out.push_back('\\');
            out.push_back(static_cast<char>(cp));
        } else if (cp == '\n') {
            out += "\\n";
        } else if (cp == '\r') {
            out += "\\r";
        } else if (cp == '\t') {
            out += "\\t";
        } else if (python_isprintable(cp)) {
            utf8_append(out, cp);
        } else {
            char buf[16];
            if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
            else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
            else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
            out += buf;
        }
    }
    out.push_back(quote);
    return out;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out.push_back('"');
    char buf[16];
    for (char32_t cp : utf8_decode(s)) {
        switch (cp) {
            case '"': out += "\\\""; continue;
            case '\\': out += "\\\\"; continue;
            case '\n': out += "\\n"; continue;
            case '\r': out += "\\r"; continue;
            case '\t': out += "\\t"; continue;
            case '\b': out += "\\b"; continue;
            case '\f': out += "\\f"; continue;
            default: break;
        }
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
            if (cp >= 0x10000 && !(cp >= 0xDC80 && cp <= 0xDCFF)) {
                const char32_t v = cp - 0x10000;
                std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                              static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
            } else {
                std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
            }
            out += buf;
        } else {
            utf8_append(out, cp);
        }
    }
    out.push_back('"');
}

void json_dump(std::string& out, const Value& v, const JsonDumpOptions& o, int depth) {
    if (depth > 256) throw Error("tojson: value nested too deeply");
    auto newline = [&](int level) {
        if (!o.has_indent) return;
        out.push_back('\n');
        for (int i = 0; i < level; ++i) out += o.indent;
    };
    switch (v.kind()) {
        case Value::Kind::None: out += "null"; return;
        case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
        case Value::Kind::Int: out += std::to_string(v.as_int()); return;
        case Value::Kind::Float: {
            const double d = v.as_double();
            if (std::isnan(d)) out += "NaN";
            else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
            else out += python_float_repr(d);
            return;
        }
        case Value::Kind::String: json_string(out, v.as_string(), o.ensure_ascii); return;
        case Value::Kind::List: {
            const Array& a = v.as_array();
            if (a.empty()) {
                out += "[]";
                return;
            }
            out.push_back('[');
            for (size_t i = 0; i < a.size(); ++i) {
                if (i) out += o.item_separator;
                newline(depth + 1);
                json_dump(out, a[i], o, depth + 1);
            }
            newline(depth);
            out.push_back(']');
            return;
        }
        case Value::Kind::Dict: {
            if (v.is_namespace()) break;
            std::vector<const std::pair<std::string, Value>*> items;
            for (const auto& kv : v.as_object().items) items.push_back(&kv);
            if (items.empty()) {
                out += "{}";
                return;
            }
            if (o.sort_keys)
                std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
            out.push_back('{');
            for (size_t i = 0; i < items.size(); ++i) {
                if (i) out += o.item_separator;
                newline(depth + 1);
                json_string(out, items[i]->first, o.ensure_ascii);
                out += o.key_separator;
                json_dump(out, items[i]->second, o, depth + 1);
            }
            newline(depth);
            out.push_back('}');
            return;
        }
        default: break;
    }
    throw Error("tojson: Object of type " + v.type_name() + " is not JSON serializable");
}

}  // namespace

std::string python_float_repr(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    std::string s(buf, res.ptr);
    std::string out;
    if (s[0] == '-') {
        out.push_back('-');
        s.erase(0, 1);
    }
    const size_t e = s.find('e');
    const int exp = std::atoi(s.c_str() + e + 1);
    std::string digits;
    for (size_t i = 0; i < e; ++i)
        if (s[i] != '.') digits.push_back(s[i]);
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    const int decpt = exp + 1;  // digits d1 d2 ... with the point after position decpt
    const int nd = static_cast<int>(digits.size());
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) out += "0." + std::string(-decpt, '0') + digits;
        else if (decpt >= nd) out += digits + std::string(decpt - nd, '0') + ".0";
        else out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    } else {
        out.push_back(digits[0]);
        if (nd > 1) out += "." + digits.substr(1);
        out.push_back('e');
        out.push_back(exp < 0 ? '-' : '+');
        const int a = exp < 0 ? -exp : exp;
        if (a < 10) out.push_back('0');
        out += std::to_string(a);
    }
    return out;
}

std::string python_json_dumps(const Value& v, const JsonDumpOptions& options) {
    std::string out;
    json_dump(out, v, options, 0);
    return out;
}

// ---- Object -----------------------------------------------------------------------------------------------------

const Value* Object::find(const std::string& key) const {
    for (const auto& kv : items)
        if (kv.first == key) return &kv.second;
    return nullptr;
}

void Object::set(const std::string& key, Value value) {
    for (auto& kv : items)
        if (kv.first == key) {
            kv.second = std::move(value);
            return;
        }
    items.emplace_back(key, std::move(value));
}

// ---- Value ------------------------------------------------------------------------------------------------------

Value Value::undefined(std::string hint) {
    Value v;
    v.str_ = std::move(hint);
    return v;
}

Value Value::none() {
    Value v;
    v.kind_ = Kind::None;
    return v;
}

Value Value::array(Array items, bool tuple) {
    Value v;
    v.kind_ = Kind::List;
    v.flag_ = tuple;
    v.array_ = std::make_shared<Array>(std::move(items));
    return v;
}

Value Value::object(Object obj) {
    Value v;
    v.kind_ = Kind::Dict;
    v.object_ = std::make_shared<Object>(std::move(obj));
    return v;
}

Value Value::namespace_object(Object obj) {
    Value v = object(std::move(obj));
    v.flag_ = true;
    return v;
}

Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
    Value v;
    v.kind_ = Kind::Function;
    v.callable_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
    return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null: return none();
        case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
            return Value(static_cast<double>(u));
        }
        case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
        case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
        case nlohmann::ordered_json::value_t::array: {
            Array a;
            a.reserve(j.size());
            for (const auto& e : j) a.push_back(from_json(e));
            return array(std::move(a));
        }
        case nlohmann::ordered_json::value_t::object: {
            Object o;
            o.items.reserve(j.size());
            for (auto it = j.begin(); it != j.end(); ++it) o.items.emplace_back(it.key(), from_json(it.value()));
            return object(std::move(o));
        }
        default: return none();  // binary and discarded values do not come from JSON text
    }
}

const void* Value::identity() const {
    if (array_) return array_.get();
    if (object_) return object_.get();
    if (callable_) return callable_.get();
    return nullptr;
}

bool Value::truthy() const {
    switch (kind_) {
        case Kind::Undefined:
        case Kind::None: return false;
        case Kind::Bool:
        case Kind::Int: return int_ != 0;
        case Kind::Float: return float_ != 0;
        case Kind::String: return !str_.empty();
        case Kind::List: return !array_->empty();
        case Kind::Dict: return flag_ || !object_->items.empty();
        case Kind::Function: return true;
    }
    return false;
}

std::string Value::type_name() const {
    switch (kind_) {
        case Kind::Undefined: return "Undefined";
        case Kind::None: return "NoneType";
        case Kind::Bool: return "bool";
        case Kind::Int: return "int";
        case Kind::Float: return "float";
        case Kind::String: return "str";
        case Kind::List: return flag_ ? "tuple" : "list";
        case Kind::Dict: return flag_ ? "Namespace" : "dict";
        case Kind::Function: return "function";
    }
    return "object";
}

std::string Value::str() const {
    switch (kind_) {
        case Kind::Undefined: return "";
        case Kind::String: return str_;
        default: return repr();
    }
}

std::string Value::repr() const {
    switch (kind_) {
        case Kind::Undefined: return "";
        case Kind::None: return "None";
        case Kind::Bool: return int_ ? "True" : "False";
        case Kind::Int: return std::to_string(int_);
        case Kind::Float: return python_float_repr(float_);
        case Kind::String: return python_string_repr(str_);
        case Kind::List: {
            std::string out = flag_ ? "(" : "[";
            for (size_t i = 0; i < array_->size(); ++i) {
                if (i) out += ", ";
                out += (*array_)[i].repr();
            }
            if (flag_ && array_->size() == 1) out += ",";
            out += flag_ ? ")" : "]";
            return out;
        }
        case Kind::Dict: {
            std::string out = flag_ ? "<Namespace {" : "{";
            bool first = true;
            for (const auto& kv : object_->items) {
                if (!first) out += ", ";
                first = false;
                out += python_string_repr(kv.first) + ": " + kv.second.repr();
            }
            out += flag_ ? "}>" : "}";
            return out;
        }
        case Kind::Function: return "<function " + callable_->name + ">";
    }
    return "";
}

nlohmann::ordered_json Value::to_json() const {
    switch (kind_) {
        case Kind::None: return nullptr;
        case Kind::Bool: return as_bool();
        case Kind::Int: return int_;
        case Kind::Float: return float_;
        case Kind::String: return str_;
        case Kind::List: {
            auto j = nlohmann::ordered_json::array();
            for (const auto& e : *array_) j.push_back(e.to_json());
            return j;
        }
        case Kind::Dict: {
            auto j = nlohmann::ordered_json::object();
            for (const auto& kv : object_->items) j[kv.first] = kv.second.to_json();
            return j;
        }
        default: throw Error("value of type " + type_name() + " cannot be converted to JSON");
    }
}

bool equals(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case Value::Kind::Undefined:
        case Value::Kind::None: return true;
        case Value::Kind::String: return a.as_string() == b.as_string();
        case Value::Kind::List: {
            if (a.is_tuple() != b.is_tuple()) return false;
            const Array& x = a.as_array();
            const Array& y = b.as_array();
            if (x.size() != y.size()) return false;
            for (size_t i = 0; i < x.size(); ++i)
                if (!equals(x[i], y[i])) return false;
            return true;
        }
        case Value::Kind::Dict: {
            if (a.is_namespace() || b.is_namespace()) return a.identity() == b.identity();
            const Object& x = a.as_object();
            const Object& y = b.as_object();
            if (x.items.size() != y.items.size()) return false;
            for (const auto& kv : x.items) {
                const Value* other = y.find(kv.first);
                if (!other || !equals(kv.second, *other)) return false;
            }
            return true;
        }
        case Value::Kind::Function: return a.identity() == b.identity();
        default: return false;
    }
}

bool less_than(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
        return a.as_int() < b.as_int();
    }
    if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order is code point order
    if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
        const Array& x = a.as_array();
        const Array& y = b.as_array();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (!equals(x[i], y[i])) return less_than(x[i], y[i]);
        }
        return x.size() < y.size();
    }
    throw Error("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

}  // namespace strata::jinja
