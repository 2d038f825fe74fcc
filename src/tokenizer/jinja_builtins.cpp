// Filters, tests, globals, attribute access and the Python str/dict/list methods of the Jinja subset engine, with
// the behaviour of jinja2 3.1 in transformers' sandbox (mutating methods are refused, tojson is transformers' own).
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <initializer_list>

#include "core/error.h"
#include "tokenizer/jinja_interp.h"

namespace strata::jinja {

namespace {

// Binds call arguments to parameter names like a Python signature (positional first, then by keyword).
class Params {
public:
    Params(const std::string& fn, CallArgs& args, std::initializer_list<const char*> names, bool extra_positional = false)
        : names_(names.begin(), names.end()), values_(names.size()), given_(names.size(), false) {
        for (size_t i = 0; i < args.positional.size(); ++i) {
            if (i < names_.size()) {
                values_[i] = args.positional[i];
                given_[i] = true;
            } else if (extra_positional) {
                extra_.push_back(args.positional[i]);
            } else {
                throw Error(fn + "() takes at most " + std::to_string(names_.size()) + " argument(s), " +
                            std::to_string(args.positional.size()) + " given");
            }
        }
        for (auto& kv : args.named) {
            size_t k = 0;
            while (k < names_.size() && kv.first != names_[k]) ++k;
            if (k == names_.size()) throw Error(fn + "() got an unexpected keyword argument '" + kv.first + "'");
            if (given_[k]) throw Error(fn + "() got multiple values for argument '" + kv.first + "'");
            values_[k] = kv.second;
            given_[k] = true;
        }
    }
    bool has(size_t i) const { return given_[i]; }
    const Value& operator[](size_t i) const { return values_[i]; }
    Value get(size_t i, Value dflt) const { return given_[i] ? values_[i] : dflt; }
    bool flag(size_t i, bool dflt) const { return given_[i] ? values_[i].truthy() : dflt; }
    const std::vector<Value>& extra() const { return extra_; }

private:
    std::vector<const char*> names_;
    std::vector<Value> values_;
    std::vector<bool> given_;
    std::vector<Value> extra_;
};

const std::string& need_string(const Value& v, const std::string& what) {
    if (!v.is_string()) throw Error(what + " must be a string, not " + v.type_name());
    return v.as_string();
}

int64_t need_int(const Value& v, const std::string& what) {
    if (!v.is_int() && !v.is_bool()) throw Error(what + " must be an integer, not " + v.type_name());
    return v.as_int();
}

// ---- string helpers (Python str semantics over UTF-8) -----------------------------------------------------------

std::string map_case(const std::string& s, bool upper) {
    std::string out;
    for (char32_t cp : utf8_decode(s)) {
        if (upper && cp == 0xDF) {  // ß has no single-code-point capital in Python's full mapping
            out += "SS";
            continue;
        }
        if (cp >= 0xDC80 && cp <= 0xDCFF) {
            utf8_append(out, cp);
            continue;
        }
        const auto c = static_cast<utf8proc_int32_t>(cp);
        utf8_append(out, static_cast<char32_t>(upper ? utf8proc_toupper(c) : utf8proc_tolower(c)));
    }
    return out;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
    const auto cps = utf8_decode(s);
    std::vector<char32_t> set;
    const bool whitespace = chars.is_none() || chars.is_undefined();
    if (!whitespace) set = utf8_decode(need_string(chars, "strip characters"));
    auto strip_it = [&](char32_t c) {
        return whitespace ? python_isspace(c) : std::find(set.begin(), set.end(), c) != set.end();
    };
    size_t b = 0, e = cps.size();
    if (left)
        while (b < e && strip_it(cps[b])) ++b;
    if (right)
        while (e > b && strip_it(cps[e - 1])) --e;
    return utf8_encode(cps, b, e);
}

Value py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
    Array parts;
    if (sep.is_none() || sep.is_undefined()) {
        const auto cps = utf8_decode(s);
        std::vector<std::pair<size_t, size_t>> words;
        size_t i = 0;
        while (i < cps.size()) {
            while (i < cps.size() && python_isspace(cps[i])) ++i;
            if (i >= cps.size()) break;
            size_t j = i;
            while (j < cps.size() && !python_isspace(cps[j])) ++j;
            words.emplace_back(i, j);
            i = j;
        }
        if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
            for (auto& w : words) parts.emplace_back(utf8_encode(cps, w.first, w.second));
        } else if (!from_right) {
            for (size_t k = 0; k < static_cast<size_t>(maxsplit); ++k)
                parts.emplace_back(utf8_encode(cps, words[k].first, words[k].second));
            size_t rest_end = cps.size();
            while (rest_end > 0 && python_isspace(cps[rest_end - 1])) --rest_end;
            parts.emplace_back(utf8_encode(cps, words[static_cast<size_t>(maxsplit)].first, rest_end));
        } else {
            const size_t keep = words.size() - static_cast<size_t>(maxsplit);
            size_t rest_begin = 0;
            while (rest_begin < cps.size() && python_isspace(cps[rest_begin])) ++rest_begin;
            parts.emplace_back(utf8_encode(cps, rest_begin, words[keep - 1].second));
            for (size_t k = keep; k < words.size(); ++k)
                parts.emplace_back(utf8_encode(cps, words[k].first, words[k].second));
        }
        return Value::array(std::move(parts));
    }
    const std::string& d = need_string(sep, "separator");
    if (d.empty()) throw Error("empty separator");
    std::vector<std::string> pieces;
    size_t start = 0;
    while (true) {
        const size_t at = s.find(d, start);
        if (at == std::string::npos) break;
        pieces.push_back(s.substr(start, at - start));
        start = at + d.size();
    }
    pieces.push_back(s.substr(start));
    if (maxsplit >= 0 && pieces.size() > static_cast<size_t>(maxsplit) + 1) {
        std::vector<std::string> merged;
        const size_t m = static_cast<size_t>(maxsplit);
        if (!from_right) {
            merged.assign(pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(m));
            std::string rest = pieces[m];
            for (size_t k = m + 1; k < pieces.size(); ++k) rest += d + pieces[k];
            merged.push_back(rest);
        } else {
            const size_t head = pieces.size() - m;
            std::string rest = pieces[0];
            for (size_t k = 1; k < head; ++k) rest += d + pieces[k];
            merged.push_back(rest);
            merged.insert(merged.end(), pieces.begin() + static_cast<std::ptrdiff_t>(head), pieces.end());
        }
        pieces = std::move(merged);
    }
    for (auto& p : pieces) parts.emplace_back(std::move(p));
    return Value::array(std::move(parts));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count,
                       size_t max_bytes) {
    std::string out;
    int64_t done = 0;
    if (old.empty()) {
        const auto cps = utf8_decode(s);
        for (size_t i = 0; i <= cps.size(); ++i) {
            if (count < 0 || done < count) {
                out += repl;
                ++done;
            }
            if (i < cps.size()) utf8_append(out, cps[i]);
            if (out.size() > max_bytes) throw Error("string too large");
        }
        return out;
    }
    size_t start = 0;
    while (count < 0 || done < count) {
        const size_t at = s.find(old, start);
        if (at == std::string::npos) break;
        out.append(s, start, at - start);
        out += repl;
        if (out.size() > max_bytes) throw Error("string too large");
        start = at + old.size();
        ++done;
    }
    out.append(s, start, std::string::npos);
    return out;
}

std::string py_capitalize(const std::string& s) {
    const auto cps = utf8_decode(s);
    std::string out;
    for (size_t i = 0; i < cps.size(); ++i) {
        const auto c = static_cast<utf8proc_int32_t>(cps[i]);
        if (cps[i] >= 0xDC80 && cps[i] <= 0xDCFF) utf8_append(out, cps[i]);
        else utf8_append(out, static_cast<char32_t>(i == 0 ? utf8proc_totitle(c) : utf8proc_tolower(c)));
    }
    return out;
}

// jinja2's title filter: words start after '-', whitespace, or an opening bracket.
std::string jinja_title(const std::string& s) {
    const auto cps = utf8_decode(s);
    std::string out;
    bool word_start = true;
    for (char32_t cp : cps) {
        const bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || python_isspace(cp);
        const auto c = static_cast<utf8proc_int32_t>(cp);
        if (sep || (cp >= 0xDC80 && cp <= 0xDCFF)) utf8_append(out, cp);
        else utf8_append(out, static_cast<char32_t>(word_start ? utf8proc_toupper(c) : utf8proc_tolower(c)));
        word_start = sep;
    }
    return out;
}

std::string html_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&#34;"; break;
            case '\'': out += "&#39;"; break;
            default: out.push_back(c);
        }
    }
    return out;
}

// {} / {0} / {name} of str.format, without format specs.
std::string py_format(const std::string& fmt, CallArgs& args) {
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < fmt.size(); ++i) {
        const char c = fmt[i];
        if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out.push_back('{');
            ++i;
        } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
            out.push_back('}');
            ++i;
        } else if (c == '{') {
            const size_t close = fmt.find('}', i);
            if (close == std::string::npos) throw Error("format: single '{' encountered in format string");
            const std::string field = fmt.substr(i + 1, close - i - 1);
            if (field.find_first_of(":!.[") != std::string::npos) throw Error("format: format specs are not supported");
            const Value* v = nullptr;
            if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
                const size_t idx = field.empty() ? auto_index++ : static_cast<size_t>(std::stoul(field));
                if (idx >= args.positional.size()) throw Error("format: replacement index out of range");
                v = &args.positional[idx];
            } else {
                for (auto& kv : args.named)
                    if (kv.first == field) v = &kv.second;
                if (!v) throw Error("format: no argument named '" + field + "'");
            }
            out += v->str();
            i = close;
        } else if (c == '}') {
            throw Error("format: single '}' encountered in format string");
        } else {
            out.push_back(c);
        }
    }
    return out;
}

Value string_method(Interpreter& in, const std::string& s, const std::string& name, CallArgs& args) {
    const std::string fn = "str." + name;
    if (name == "startswith" || name == "endswith") {
        Params p(fn, args, {"prefix", "start", "end"});
        std::vector<Value> options = p[0].is_tuple() ? p[0].as_array() : std::vector<Value>{p[0]};
        std::string subject = s;
        if (p.has(1) || p.has(2)) {
            subject = slice_value(Value(s), p.get(1, Value::none()), p.get(2, Value::none()), Value::none()).as_string();
        }
        for (const auto& o : options) {
            const std::string& x = need_string(o, fn + " argument");
            if (x.size() > subject.size()) continue;
            if (name == "startswith" ? subject.compare(0, x.size(), x) == 0
                                     : subject.compare(subject.size() - x.size(), x.size(), x) == 0)
                return Value(true);
        }
        return Value(false);
    }
    if (name == "split" || name == "rsplit") {
        Params p(fn, args, {"sep", "maxsplit"});
        return py_split(s, p.get(0, Value::none()), p.has(1) ? need_int(p[1], "maxsplit") : -1, name == "rsplit");
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        Params p(fn, args, {"chars"});
        return Value(py_strip(s, p.get(0, Value::none()), name != "rstrip", name != "lstrip"));
    }
    if (name == "replace") {
        Params p(fn, args, {"old", "new", "count"});
        return Value(py_replace(s, need_string(p[0], "old"), need_string(p[1], "new"),
                                p.has(2) ? need_int(p[2], "count") : -1, size_t{64} << 20));
    }
    if (name == "lower" || name == "upper") {
        Params p(fn, args, {});
        return Value(map_case(s, name == "upper"));
    }
    if (name == "capitalize") {
        Params p(fn, args, {});
        return Value(py_capitalize(map_case(s, false)));
    }
    if (name == "title") {
        Params p(fn, args, {});
        const auto cps = utf8_decode(s);
        std::string out;
        bool prev_cased = false;
        for (char32_t cp : cps) {
            const auto c = static_cast<utf8proc_int32_t>(cp);
            const bool cased = utf8proc_toupper(c) != c || utf8proc_tolower(c) != c;
            utf8_append(out, static_cast<char32_t>(cased ? (prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c)) : c));
            prev_cased = cased;
        }
        return Value(out);
    }
    if (name == "find" || name == "rfind" || name == "count" || name == "index") {
        Params p(fn, args, {"sub"});
        const std::string& sub = need_string(p[0], "substring");
        if (name == "count") {
            if (sub.empty()) return Value(static_cast<int64_t>(utf8_decode(s).size() + 1));
            int64_t n = 0;
            for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
            return Value(n);
        }
        const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
        if (at == std::string::npos) {
            if (name == "index") throw Error("substring not found");
            return Value(int64_t{-1});
        }
        return Value(static_cast<int64_t>(utf8_decode(s.substr(0, at)).size()));
    }
    if (name == "join") {
        Params p(fn, args, {"iterable"});
        std::string out;
        bool first = true;
        for (const auto& v : iterate(p[0])) {
            if (!first) out += s;
            first = false;
            out += need_string(v, "sequence item");
            in.check_size(out.size());
        }
        return Value(out);
    }
    if (name == "format") return Value(py_format(s, args));
    if (name == "splitlines") {
        Params p(fn, args, {"keepends"});
        const bool keep = p.flag(0, false);
        Array lines;
        size_t start = 0;
        for (size_t i = 0; i < s.size(); ++i) {
            if (s[i] == '\n' || s[i] == '\r') {
                size_t end = i + 1;
                if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++end;
                lines.emplace_back(s.substr(start, (keep ? end : i) - start));
                start = end;
                i = end - 1;
            }
        }
        if (start < s.size()) lines.emplace_back(s.substr(start));
        return Value::array(std::move(lines));
    }
    if (name == "removeprefix" || name == "removesuffix") {
        Params p(fn, args, {"affix"});
        const std::string& a = need_string(p[0], "affix");
        if (name == "removeprefix" && s.compare(0, a.size(), a) == 0 && a.size() <= s.size()) return Value(s.substr(a.size()));
        if (name == "removesuffix" && a.size() <= s.size() && s.compare(s.size() - a.size(), a.size(), a) == 0)
            return Value(s.substr(0, s.size() - a.size()));
        return Value(s);
    }
    auto all_of_cps = [&](auto pred) {
        const auto cps = utf8_decode(s);
        return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
    };
    if (name == "isspace") return Value(all_of_cps([](char32_t c) { return python_isspace(c); }));
    if (name == "isdigit") return Value(all_of_cps([](char32_t c) { return c >= '0' && c <= '9'; }));
    if (name == "isalpha")
        return Value(all_of_cps([](char32_t c) {
            const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
            return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        }));
    if (name == "islower") return Value(map_case(s, false) == s && map_case(s, true) != s);
    if (name == "isupper") return Value(map_case(s, true) == s && map_case(s, false) != s);
    throw Error("'str' object has no method '" + name + "'");
}

const char* const kStringMethods[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip",
                                      "replace", "lower", "upper", "capitalize", "title", "find", "rfind", "count",
                                      "index", "join", "format", "splitlines", "removeprefix", "removesuffix",
                                      "isspace", "isdigit", "isalpha", "islower", "isupper"};
const char* const kDictMethods[] = {"get", "items", "keys", "values", "copy"};
const char* const kDictUnsafe[] = {"pop", "popitem", "setdefault", "update", "clear"};
const char* const kListMethods[] = {"index", "count", "copy"};
const char* const kListUnsafe[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};

template <size_t N>
bool one_of(const std::string& name, const char* const (&list)[N]) {
    for (const char* m : list)
        if (name == m) return true;
    return false;
}

Value dict_method(const Value& obj, const std::string& name, CallArgs& args) {
    const Object& o = obj.as_object();
    if (name == "get") {
        Params p("dict.get", args, {"key", "default"});
        const Value* v = p[0].is_string() ? o.find(p[0].as_string()) : nullptr;
        return v ? *v : p.get(1, Value::none());
    }
    Params p("dict." + name, args, {});
    if (name == "copy") return Value::object(o);
    Array out;
    for (const auto& kv : o.items) {
        if (name == "keys") out.emplace_back(kv.first);
        else if (name == "values") out.push_back(kv.second);
        else out.push_back(Value::array({Value(kv.first), kv.second}, true));
    }
    return Value::array(std::move(out));
}

Value list_method(const Value& obj, const std::string& name, CallArgs& args) {
    const Array& a = obj.as_array();
    if (name == "copy") return Value::array(a, obj.is_tuple());
    Params p("list." + name, args, {"value"});
    int64_t count = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!equals(a[i], p[0])) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++count;
    }
    if (name == "index") throw Error(p[0].repr() + " is not in list");
    return Value(count);
}

Value bound(const Value& obj, const std::string& name, Value (*fn)(const Value&, const std::string&, CallArgs&)) {
    return Value::callable(name, [obj, name, fn](Interpreter&, CallArgs& args) { return fn(obj, name, args); });
}

std::string object_label(const Value& v) {
    if (v.is_none()) return "None";
    return "'" + v.type_name() + " object'";
}

// The value of a dotted attribute path ("a.b.0"), each part looked up as jinja2's environment.getitem does.
Value attribute_path(Interpreter& in, const Value& item, const std::string& path) {
    Value v = item;
    size_t start = 0;
    while (true) {
        const size_t dot = path.find('.', start);
        const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
        v = in.get_item(v, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
        if (dot == std::string::npos) return v;
        start = dot + 1;
    }
}

Value int_of(const Value& v, const Value& dflt) {
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    if (v.is_float()) {
        const double d = v.as_double();
        if (std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(d));
        return dflt;
    }
    if (v.is_string()) {
        std::string s = py_strip(v.as_string(), Value::none(), true, true);
        s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
        if (s.empty()) return dflt;
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(s.c_str(), &end, 10);
        if (end && *end == '\0' && errno == 0) return Value(static_cast<int64_t>(x));
        const double d = std::strtod(s.c_str(), &end);
        if (end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(d));
    }
    return dflt;
}

Value float_of(const Value& v, const Value& dflt) {
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
        const std::string s = py_strip(v.as_string(), Value::none(), true, true);
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end && *end == '\0') return Value(d);
    }
    return dflt;
}

// The key that sort/unique/min/max compare: lowercased strings unless case_sensitive.
Value sort_key(Interpreter& in, const Value& item, const Value& attribute, bool case_sensitive) {
    Value k = attribute.is_string() ? attribute_path(in, item, attribute.as_string()) : item;
    if (!case_sensitive && k.is_string()) return Value(map_case(k.as_string(), false));
    return k;
}

std::vector<Value> sorted_items(Interpreter& in, std::vector<Value> items, const Value& attribute, bool case_sensitive,
                                bool reverse) {
    std::vector<std::pair<Value, Value>> keyed;
    for (auto& v : items) keyed.emplace_back(sort_key(in, v, attribute, case_sensitive), v);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        return reverse ? less_than(b.first, a.first) : less_than(a.first, b.first);
    });
    std::vector<Value> out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return out;
}

Value tojson_filter(const Value& v, CallArgs& args) {
    Params p("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
    JsonDumpOptions o;
    o.ensure_ascii = p.flag(0, false);
    const Value indent = p.get(1, Value::none());
    if (indent.is_int() || indent.is_bool()) {
        o.has_indent = true;
        o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent.as_int(), 1024))), ' ');
    } else if (indent.is_string()) {
        o.has_indent = true;
        o.indent = indent.as_string();
    } else if (!indent.is_none()) {
        throw Error("tojson: indent must be an integer or a string");
    }
    if (o.has_indent) o.item_separator = ",";
    const Value seps = p.get(2, Value::none());
    if (!seps.is_none()) {
        if (!seps.is_array() || seps.as_array().size() != 2) throw Error("tojson: separators must be a pair of strings");
        o.item_separator = need_string(seps.as_array()[0], "tojson separator");
        o.key_separator = need_string(seps.as_array()[1], "tojson separator");
    }
    o.sort_keys = p.flag(3, false);
    return Value(python_json_dumps(v, o));
}

Value indent_filter(const std::string& s, CallArgs& args) {
    Params p("indent", args, {"width", "first", "blank"});
    const Value w = p.get(0, Value(4));
    const std::string pad = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(std::clamp<int64_t>(need_int(w, "indent width"), 0, 1024)), ' ');
    std::vector<std::string> lines;
    const std::string text = s + "\n";
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\n' || text[i] == '\r') {
            lines.push_back(text.substr(start, i - start));
            if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
            start = i + 1;
        }
    }
    std::string out;
    if (p.flag(2, false)) {
        for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + pad : "") + lines[i];
    } else {
        out = lines.empty() ? "" : lines[0];
        for (size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : pad + lines[i]);
    }
    if (p.flag(1, false)) out = pad + out;
    return Value(out);
}

}  // namespace

// ---- attribute and item access ----------------------------------------------------------------------------------

Value Interpreter::get_attr(const Value& obj, const std::string& name) {
    switch (obj.kind()) {
        case Value::Kind::Undefined: throw Error(obj.undefined_hint());
        case Value::Kind::Dict: {
            if (obj.is_namespace()) {
                const Value* v = obj.as_object().find(name);
                return v ? *v : Value::undefined("'Namespace' object has no attribute '" + name + "'");
            }
            if (one_of(name, kDictMethods)) return bound(obj, name, dict_method);
            if (one_of(name, kDictUnsafe))
                return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe");
            const Value* v = obj.as_object().find(name);
            return v ? *v : Value::undefined("'dict object' has no attribute '" + name + "'");
        }
        case Value::Kind::String:
            if (one_of(name, kStringMethods)) {
                const std::string s = obj.as_string();
                return Value::callable(name, [s, name](Interpreter& in, CallArgs& args) {
                    return string_method(in, s, name, args);
                });
            }
            break;
        case Value::Kind::List:
            if (one_of(name, kListMethods)) return bound(obj, name, list_method);
            if (one_of(name, kListUnsafe))
                return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe");
            break;
        default: break;
    }
    return Value::undefined(object_label(obj) + " has no attribute '" + name + "'");
}

Value Interpreter::get_item(const Value& obj, const Value& key) {
    if (obj.is_undefined()) throw Error(obj.undefined_hint());
    if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
        int64_t i = key.as_int();
        if (obj.is_array()) {
            const int64_t n = static_cast<int64_t>(obj.as_array().size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) return obj.as_array()[static_cast<size_t>(i)];
        } else {
            const auto cps = utf8_decode(obj.as_string());
            const int64_t n = static_cast<int64_t>(cps.size());
            if (i < 0) i += n;
            if (i >= 0 && i < n) return Value(utf8_encode(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
        }
        return Value::undefined(object_label(obj) + " has no element " + std::to_string(key.as_int()));
    }
    if (obj.is_object() && key.is_string()) {
        const Value* v = obj.as_object().find(key.as_string());
        if (v) return *v;
    }
    if (key.is_string()) return get_attr(obj, key.as_string());
    return Value::undefined(object_label(obj) + " has no element " + key.repr());
}

// ---- filters ----------------------------------------------------------------------------------------------------

Value Interpreter::apply_filter(const std::string& name, const Value& v, CallArgs& args) {
    const std::string& f = name;
    auto text = [&]() { return v.str(); };
    if (f == "tojson") return tojson_filter(v, args);
    if (f == "safe" || f == "string") {
        Params p(f, args, {});
        return f == "safe" ? v : Value(text());
    }
    if (f == "length" || f == "count") {
        Params p(f, args, {});
        switch (v.kind()) {
            case Value::Kind::Undefined: return Value(int64_t{0});
            case Value::Kind::String: return Value(static_cast<int64_t>(utf8_decode(v.as_string()).size()));
            case Value::Kind::List: return Value(static_cast<int64_t>(v.as_array().size()));
            case Value::Kind::Dict:
                if (!v.is_namespace()) return Value(static_cast<int64_t>(v.as_object().items.size()));
                break;
            default: break;
        }
        throw Error("object of type '" + v.type_name() + "' has no len()");
    }
    if (f == "trim") {
        Params p(f, args, {"chars"});
        return Value(py_strip(text(), p.get(0, Value::none()), true, true));
    }
    if (f == "upper" || f == "lower") {
        Params p(f, args, {});
        return Value(map_case(text(), f == "upper"));
    }
    if (f == "capitalize") {
        Params p(f, args, {});
        return Value(py_capitalize(text()));
    }
    if (f == "title") {
        Params p(f, args, {});
        return Value(jinja_title(text()));
    }
    if (f == "default" || f == "d") {
        Params p(f, args, {"default_value", "boolean"});
        const bool use_default = p.flag(1, false) ? !v.truthy() : v.is_undefined();
        return use_default ? p.get(0, Value("")) : v;
    }
    if (f == "replace") {
        Params p(f, args, {"old", "new", "count"});
        return Value(py_replace(text(), p[0].str(), p[1].str(),
                                p.has(2) && !p[2].is_none() ? need_int(p[2], "count") : -1, limits_.max_output_bytes));
    }
    if (f == "join") {
        Params p(f, args, {"d", "attribute"});
        const std::string sep = p.has(0) ? p[0].str() : "";
        std::string out;
        bool first = true;
        for (const auto& item : iterate(v)) {
            if (!first) out += sep;
            first = false;
            out += (p.has(1) && !p[1].is_none() ? attribute_path(*this, item, p[1].str()) : item).str();
            check_size(out.size());
        }
        return Value(out);
    }
    if (f == "int") {
        Params p(f, args, {"default", "base"});
        return int_of(v, p.get(0, Value(int64_t{0})));
    }
    if (f == "float") {
        Params p(f, args, {"default"});
        return float_of(v, p.get(0, Value(0.0)));
    }
    if (f == "abs") {
        Params p(f, args, {});
        if (v.is_float()) return Value(std::fabs(v.as_double()));
        if (v.is_int() || v.is_bool()) return v.as_int() == INT64_MIN ? Value(-static_cast<double>(INT64_MIN)) : Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
        throw Error("bad operand type for abs(): '" + v.type_name() + "'");
    }
    if (f == "round") {
        Params p(f, args, {"precision", "method"});
        const int64_t precision = p.has(0) ? need_int(p[0], "precision") : 0;
        const std::string method = p.has(1) ? p[1].str() : "common";
        if (!v.is_number()) throw Error("round: a number is required, not " + v.type_name());
        if (method == "common" && !v.is_float() && precision >= 0) return Value(v.as_int());
        const double scale = std::pow(10.0, static_cast<double>(precision));
        const double x = v.as_double() * scale;
        double r;
        if (method == "common") r = std::nearbyint(x);
        else if (method == "floor") r = std::floor(x);
        else if (method == "ceil") r = std::ceil(x);
        else throw Error("round: method must be common, ceil or floor");
        return Value(r / scale);
    }
    if (f == "items") {
        Params p(f, args, {});
        if (v.is_undefined()) return Value::array();
        if (!v.is_mapping()) throw Error("Can only get item pairs from a mapping.");
        Array out;
        for (const auto& kv : v.as_object().items) out.push_back(Value::array({Value(kv.first), kv.second}, true));
        return Value::array(std::move(out));
    }
    if (f == "dictsort") {
        Params p(f, args, {"case_sensitive", "by", "reverse"});
        if (!v.is_mapping()) throw Error("dictsort: a mapping is required");
        const bool by_value = p.has(1) && p[1].str() == "value";
        Array pairs;
        for (const auto& kv : v.as_object().items) pairs.push_back(Value::array({Value(kv.first), kv.second}, true));
        Value attr = Value(std::string(by_value ? "1" : "0"));
        return Value::array(sorted_items(*this, std::move(pairs), attr, p.flag(0, false), p.flag(2, false)));
    }
    if (f == "list") {
        Params p(f, args, {});
        return Value::array(iterate(v));
    }
    if (f == "first" || f == "last") {
        Params p(f, args, {});
        const std::vector<Value> items = iterate(v);
        if (items.empty()) return Value::undefined("No " + f + " item, sequence was empty.");
        return f == "first" ? items.front() : items.back();
    }
    if (f == "reverse") {
        Params p(f, args, {});
        if (v.is_string()) {
            auto cps = utf8_decode(v.as_string());
            std::reverse(cps.begin(), cps.end());
            return Value(utf8_encode(cps));
        }
        std::vector<Value> items = iterate(v);
        std::reverse(items.begin(), items.end());
        return Value::array(std::move(items));
    }
    if (f == "sort") {
        Params p(f, args, {"reverse", "case_sensitive", "attribute"});
        return Value::array(sorted_items(*this, iterate(v), p.get(2, Value::none()), p.flag(1, false), p.flag(0, false)));
    }
    if (f == "unique") {
        Params p(f, args, {"case_sensitive", "attribute"});
        Array out, seen;
        for (const auto& item : iterate(v)) {
            Value k = sort_key(*this, item, p.get(1, Value::none()), p.flag(0, false));
            if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) continue;
            seen.push_back(k);
            out.push_back(item);
        }
        return Value::array(std::move(out));
    }
    if (f == "min" || f == "max") {
        Params p(f, args, {"case_sensitive", "attribute"});
        const std::vector<Value> items = iterate(v);
        if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
        const auto sorted = sorted_items(*this, items, p.get(1, Value::none()), p.flag(0, false), false);
        if (f == "min") return sorted.front();
        // the first of the largest, as Python's max()
        const Value best = sort_key(*this, sorted.back(), p.get(1, Value::none()), p.flag(0, false));
        for (const auto& item : items)
            if (equals(sort_key(*this, item, p.get(1, Value::none()), p.flag(0, false)), best)) return item;
        return sorted.back();
    }
    if (f == "sum") {
        Params p(f, args, {"attribute", "start"});
        Value total = p.get(1, Value(int64_t{0}));
        for (const auto& item : iterate(v))
            total = binary_op("+", total, p.has(0) ? attribute_path(*this, item, p[0].str()) : item, limits_.max_output_bytes);
        return total;
    }
    if (f == "map") {
        Array out;
        const bool by_attribute = std::any_of(args.named.begin(), args.named.end(), [](auto& kv) { return kv.first == "attribute"; });
        if (by_attribute) {
            Params p(f, args, {"attribute", "default"});
            for (const auto& item : iterate(v)) {
                Value x = attribute_path(*this, item, p[0].str());
                out.push_back(x.is_undefined() && p.has(1) ? p[1] : x);
            }
        } else {
            if (args.positional.empty()) throw Error("map: a filter name or attribute= is required");
            const std::string filter = need_string(args.positional[0], "map filter name");
            CallArgs rest;
            rest.positional.assign(args.positional.begin() + 1, args.positional.end());
            rest.named = args.named;
            for (const auto& item : iterate(v)) {
                CallArgs copy = rest;
                out.push_back(apply_filter(filter, item, copy));
            }
        }
        return Value::array(std::move(out));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
        const bool by_attr = f == "selectattr" || f == "rejectattr";
        const bool keep_when = f == "select" || f == "selectattr";
        size_t k = 0;
        std::string attr;
        if (by_attr) {
            if (args.positional.empty()) throw Error(f + ": an attribute name is required");
            attr = args.positional[k++].str();
        }
        std::string test;
        if (k < args.positional.size()) test = need_string(args.positional[k++], f + " test name");
        CallArgs test_args;
        test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(std::min(k, args.positional.size())), args.positional.end());
        test_args.named = args.named;
        Array out;
        for (const auto& item : iterate(v)) {
            step();
            const Value subject = by_attr ? attribute_path(*this, item, attr) : item;
            bool r;
            if (test.empty()) {
                r = subject.truthy();
            } else {
                CallArgs copy = test_args;
                r = apply_test(test, subject, copy);
            }
            if (r == keep_when) out.push_back(item);
        }
        return Value::array(std::move(out));
    }
    if (f == "attr") {
        Params p(f, args, {"name"});
        return get_attr(v, need_string(p[0], "attribute name"));
    }
    if (f == "escape" || f == "e" || f == "forceescape") {
        Params p(f, args, {});
        return Value(html_escape(text()));
    }
    if (f == "indent") return indent_filter(text(), args);
    if (f == "format") return Value(percent_format(text(), Value::array(args.positional, true)));
    if (f == "wordcount") {
        Params p(f, args, {});
        int64_t n = 0;
        bool in_word = false;
        for (char32_t cp : utf8_decode(text())) {
            const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
            const bool word = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                              (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
            if (word && !in_word) ++n;
            in_word = word;
        }
        return Value(n);
    }
    if (f == "center") {
        Params p(f, args, {"width"});
        const std::string s = text();
        const int64_t width = p.has(0) ? need_int(p[0], "width") : 80;
        const int64_t len = static_cast<int64_t>(utf8_decode(s).size());
        if (width <= len) return Value(s);
        const int64_t total = std::min<int64_t>(width - len, 1 << 20);
        const int64_t left = total / 2 + (total & width & 1);
        return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(total - left), ' '));
    }
    throw Error("no filter named '" + f + "'");
}

// ---- tests ------------------------------------------------------------------------------------------------------

bool Interpreter::apply_test(const std::string& t, const Value& v, CallArgs& args) {
    auto arg = [&](const char* n) {
        Params p(t, args, {n});
        return p[0];
    };
    auto none_args = [&]() { Params p(t, args, {}); };
    if (t == "defined") return none_args(), !v.is_undefined();
    if (t == "undefined") return none_args(), v.is_undefined();
    if (t == "none") return none_args(), v.is_none();
    if (t == "boolean") return none_args(), v.is_bool();
    if (t == "true") return none_args(), v.is_bool() && v.as_bool();
    if (t == "false") return none_args(), v.is_bool() && !v.as_bool();
    if (t == "integer") return none_args(), v.is_int();
    if (t == "float") return none_args(), v.is_float();
    if (t == "number") return none_args(), v.is_number();
    if (t == "string") return none_args(), v.is_string();
    if (t == "mapping") return none_args(), v.is_mapping();
    if (t == "iterable") return none_args(), v.is_array() || v.is_string() || v.is_mapping() || v.is_undefined();
    if (t == "sequence") return none_args(), v.is_array() || v.is_string() || v.is_mapping() || v.is_undefined();
    if (t == "callable") return none_args(), v.is_callable();
    if (t == "escaped") return none_args(), false;
    if (t == "odd" || t == "even") {
        none_args();
        if (!v.is_int() && !v.is_bool()) throw Error("the " + t + " test needs an integer");
        const bool odd = (v.as_int() % 2) != 0;
        return t == "odd" ? odd : !odd;
    }
    if (t == "divisibleby") {
        const Value d = arg("num");
        if (!v.is_number() || !d.is_number()) throw Error("divisibleby needs numbers");
        if (d.as_double() == 0) throw Error("integer division or modulo by zero");
        return binary_op("%", v, d, limits_.max_output_bytes).as_double() == 0;
    }
    if (t == "lower" || t == "upper") {
        none_args();
        if (!v.is_string()) return false;
        return map_case(v.as_string(), t == "upper") == v.as_string() && map_case(v.as_string(), t != "upper") != v.as_string();
    }
    if (t == "eq" || t == "equalto" || t == "==") return equals(v, arg("other"));
    if (t == "ne" || t == "!=") return !equals(v, arg("other"));
    if (t == "lt" || t == "lessthan" || t == "<") return less_than(v, arg("other"));
    if (t == "gt" || t == "greaterthan" || t == ">") return less_than(arg("other"), v);
    if (t == "le" || t == "<=") {
        const Value o = arg("other");
        return less_than(v, o) || equals(v, o);
    }
    if (t == "ge" || t == ">=") {
        const Value o = arg("other");
        return less_than(o, v) || equals(v, o);
    }
    if (t == "in") return contains(arg("seq"), v);
    if (t == "sameas") {
        const Value o = arg("other");
        if (v.identity() || o.identity()) return v.identity() == o.identity();
        return v.kind() == o.kind() && (v.is_none() || v.is_undefined() || (v.is_bool() && v.as_bool() == o.as_bool()));
    }
    throw Error("no test named '" + t + "'");
}

// ---- globals ----------------------------------------------------------------------------------------------------

Object make_globals() {
    Object g;
    g.set("range", Value::callable("range", [](Interpreter& in, CallArgs& args) {
        Params p("range", args, {"start", "stop", "step"});
        int64_t start = 0, stop, step = 1;
        if (!p.has(1)) {
            stop = need_int(p[0], "range() argument");
        } else {
            start = need_int(p[0], "range() argument");
            stop = need_int(p[1], "range() argument");
            if (p.has(2)) step = need_int(p[2], "range() argument");
        }
        if (step == 0) throw Error("range() arg 3 must not be zero");
        Array out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= 100000) throw Error("range too big: the sandbox allows at most 100000 items");
            in.step();
            out.emplace_back(i);
        }
        return Value::array(std::move(out));
    }));
    g.set("namespace", Value::callable("namespace", [](Interpreter&, CallArgs& args) {
        Object o;
        for (const auto& a : args.positional) {
            if (!a.is_mapping()) throw Error("namespace() positional arguments must be mappings");
            for (const auto& kv : a.as_object().items) o.set(kv.first, kv.second);
        }
        for (const auto& kv : args.named) o.set(kv.first, kv.second);
        return Value::namespace_object(std::move(o));
    }));
    g.set("dict", Value::callable("dict", [](Interpreter&, CallArgs& args) {
        Object o;
        for (const auto& a : args.positional) {
            if (!a.is_mapping()) throw Error("dict() positional arguments must be mappings");
            for (const auto& kv : a.as_object().items) o.set(kv.first, kv.second);
        }
        for (const auto& kv : args.named) o.set(kv.first, kv.second);
        return Value::object(std::move(o));
    }));
    g.set("raise_exception", Value::callable("raise_exception", [](Interpreter&, CallArgs& args) -> Value {
        Params p("raise_exception", args, {"message"});
        throw Error("raise_exception: " + p[0].str());
    }));
    g.set("strftime_now", Value::callable("strftime_now", [](Interpreter&, CallArgs& args) {
        Params p("strftime_now", args, {"format"});
        const std::string fmt = need_string(p[0], "strftime_now format");
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[512];
        const size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
        return Value(std::string(buf, n));
    }));
    return g;
}

}  // namespace strata::jinja
