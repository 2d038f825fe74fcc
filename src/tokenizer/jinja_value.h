// Values of the Jinja subset engine (chat templates). They follow Python's semantics, because the oracle is jinja2
// running in Python: str() and repr() of every type, == across int/float/bool, truthiness, ordered dicts, and
// jinja2's Undefined (prints as nothing, is falsy, iterates as empty, fails on attribute access or arithmetic).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace strata::jinja {

class Value;
class Interpreter;
using Array = std::vector<Value>;

// An insertion-ordered dict with string keys (JSON objects, dict literals, namespaces, the loop object).
struct Object {
    std::vector<std::pair<std::string, Value>> items;
    const Value* find(const std::string& key) const;
    void set(const std::string& key, Value value);
};

struct CallArgs {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> named;
};

// Globals, macros, bound methods and loop.cycle: everything a template can call.
struct Callable {
    std::string name;
    std::function<Value(Interpreter&, CallArgs&)> fn;
};

class Value {
public:
    enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Function };

    Value() = default;  // Undefined
    Value(bool b) : kind_(Kind::Bool), int_(b) {}
    Value(int v) : kind_(Kind::Int), int_(v) {}
    Value(int64_t v) : kind_(Kind::Int), int_(v) {}
    Value(double v) : kind_(Kind::Float), float_(v) {}
    Value(std::string s) : kind_(Kind::String), str_(std::move(s)) {}
    Value(const char* s) : kind_(Kind::String), str_(s) {}

    // `hint` is the message jinja2 would give when the undefined value is used (`'x' is undefined`).
    static Value undefined(std::string hint = "value is undefined");
    static Value none();
    static Value array(Array items = {}, bool tuple = false);
    static Value object(Object obj = {});
    static Value namespace_object(Object obj);
    static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);
    static Value from_json(const nlohmann::ordered_json& j);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::Undefined; }
    bool is_none() const { return kind_ == Kind::None; }
    bool is_bool() const { return kind_ == Kind::Bool; }
    bool is_int() const { return kind_ == Kind::Int; }
    bool is_float() const { return kind_ == Kind::Float; }
    bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
    bool is_string() const { return kind_ == Kind::String; }
    bool is_array() const { return kind_ == Kind::List; }
    bool is_tuple() const { return kind_ == Kind::List && flag_; }
    bool is_object() const { return kind_ == Kind::Dict; }
    bool is_mapping() const { return kind_ == Kind::Dict && !flag_; }  // namespaces are not mappings
    bool is_namespace() const { return kind_ == Kind::Dict && flag_; }
    bool is_callable() const { return kind_ == Kind::Function; }

    bool as_bool() const { return int_ != 0; }
    int64_t as_int() const { return int_; }  // Int and Bool
    double as_double() const { return kind_ == Kind::Float ? float_ : static_cast<double>(int_); }
    const std::string& as_string() const { return str_; }
    const std::string& undefined_hint() const { return str_; }
    const Array& as_array() const { return *array_; }
    const Object& as_object() const { return *object_; }
    Object& mutable_object() const { return *object_; }  // namespace attribute assignment only
    const Callable& as_callable() const { return *callable_; }
    const void* identity() const;

    bool truthy() const;
    std::string type_name() const;          // Python's type name, for error messages
    std::string str() const;                // Python str()
    std::string repr() const;               // Python repr()
    nlohmann::ordered_json to_json() const;  // throws Error for values JSON cannot hold

private:
    Kind kind_ = Kind::Undefined;
    bool flag_ = false;  // Array: tuple; Object: namespace
    int64_t int_ = 0;
    double float_ = 0;
    std::string str_;
    std::shared_ptr<Array> array_;
    std::shared_ptr<Object> object_;
    std::shared_ptr<Callable> callable_;
};

// Python's == (1 == 1.0 == True; a list never equals a tuple; dicts compare without order).
bool equals(const Value& a, const Value& b);
// Python's <, for numbers, strings and sequences; throws Error for other pairs.
bool less_than(const Value& a, const Value& b);

// Python's repr() of a float ("0.1", "1e-05", "1e+16", "2.0", "inf", "nan").
std::string python_float_repr(double v);

struct JsonDumpOptions {
    bool ensure_ascii = false;
    std::string indent;  // used when has_indent
    bool has_indent = false;
    std::string item_separator = ", ";
    std::string key_separator = ": ";
    bool sort_keys = false;
};
// Python's json.dumps with the given options.
std::string python_json_dumps(const Value& v, const JsonDumpOptions& options);

// UTF-8 helpers: Python strings index and measure by code point.
std::vector<char32_t> utf8_decode(const std::string& s);
std::string utf8_encode(const std::vector<char32_t>& cps, size_t begin = 0, size_t end = SIZE_MAX);
void utf8_append(std::string& out, char32_t cp);
bool python_isspace(char32_t cp);

}  // namespace strata::jinja
