// Statements, expressions and Python's operators for the Jinja subset engine.
#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/jinja_parser.h"

namespace strata::jinja {

// ---- scopes -----------------------------------------------------------------------------------------------------

const Value* Scope::find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
        for (const auto& kv : s->vars)
            if (kv.first == name) return &kv.second;
    return nullptr;
}

void Scope::set(const std::string& name, Value value) {
    for (auto& kv : vars)
        if (kv.first == name) {
            kv.second = std::move(value);
            return;
        }
    vars.emplace_back(name, std::move(value));
}

// ---- Python operators -------------------------------------------------------------------------------------------

namespace {

[[noreturn]] void fail_undefined(const Value& v) { throw Error(v.undefined_hint()); }

// An error message on one line: names and keys from the template or its input may hold control characters (a
// subscript's key becomes an attribute name), which are written as escapes.
std::string one_line(const std::string& msg) {
    std::string out;
    for (const char c : msg) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '\n')
            out += "\\n";
        else if (c == '\r')
            out += "\\r";
        else if (c == '\t')
            out += "\\t";
        else if (u < 0x20 || u == 0x7f) {
            static const char kHex[] = "0123456789abcdef";
            out += "\\x";
            out += kHex[u >> 4];
            out += kHex[u & 15];
        } else {
            out += c;
        }
    }
    return out;
}

[[noreturn]] void fail_operands(const std::string& op, const Value& a, const Value& b) {
    throw Error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value repeat(const Value& seq, int64_t times, size_t max_bytes) {
    if (times < 0) times = 0;
    if (seq.is_string()) {
        const std::string& s = seq.as_string();
        if (!s.empty() && static_cast<uint64_t>(times) > max_bytes / s.size()) throw Error("string repetition too large");
        std::string out;
        out.reserve(s.size() * static_cast<size_t>(times));
        for (int64_t i = 0; i < times; ++i) out += s;
        return Value(std::move(out));
    }
    const Array& a = seq.as_array();
    if (!a.empty() && static_cast<uint64_t>(times) > max_bytes / 8 / a.size()) throw Error("list repetition too large");
    Array out;
    for (int64_t i = 0; i < times; ++i) out.insert(out.end(), a.begin(), a.end());
    return Value::array(std::move(out), seq.is_tuple());
}

double python_fmod(double a, double b) {
    double m = std::fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

}  // namespace

// printf-style formatting of `fmt % args` (and the format filter): %s %r %d %i %f %% with an optional precision.
std::string percent_format(const std::string& fmt, const Value& args) {
    std::vector<Value> items = args.is_tuple() ? args.as_array() : std::vector<Value>{args};
    size_t next = 0;
    std::string out;
    for (size_t i = 0; i < fmt.size(); ++i) {
        if (fmt[i] != '%') {
            out.push_back(fmt[i]);
            continue;
        }
        if (++i >= fmt.size()) throw Error("incomplete format");
        if (fmt[i] == '%') {
            out.push_back('%');
            continue;
        }
        int precision = -1;
        if (fmt[i] == '.') {
            precision = 0;
            while (++i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') precision = precision * 10 + (fmt[i] - '0');
            if (i >= fmt.size()) throw Error("incomplete format");
        }
        if (next >= items.size()) throw Error("not enough arguments for format string");
        const Value& v = items[next++];
        switch (fmt[i]) {
            case 's': out += v.str(); break;
            case 'r': out += v.repr(); break;
            case 'd':
            case 'i':
                if (!v.is_number()) throw Error("%d format: a real number is required, not " + v.type_name());
                out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_double()) : v.as_int());
                break;
            case 'f': {
                if (!v.is_number()) throw Error("%f format: a real number is required, not " + v.type_name());
                char buf[64];
                std::snprintf(buf, sizeof buf, "%.*f", precision < 0 ? 6 : std::min(precision, 30), v.as_double());
                out += buf;
                break;
            }
            default: throw Error(std::string("unsupported format character '") + fmt[i] + "'");
        }
    }
    if (next < items.size()) throw Error("not all arguments converted during string formatting");
    return out;
}

Value binary_op(const std::string& op, const Value& a, const Value& b, size_t max_bytes) {
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    const bool nums = a.is_number() && b.is_number();
    const bool ints = nums && !a.is_float() && !b.is_float();
    if (op == "+") {
        if (ints) {
            int64_t r;
            if (!__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Value(r);
            return Value(a.as_double() + b.as_double());
        }
        if (nums) return Value(a.as_double() + b.as_double());
        if (a.is_string() && b.is_string()) {
            if (a.as_string().size() + b.as_string().size() > max_bytes) throw Error("string too large");
            return Value(a.as_string() + b.as_string());
        }
        if (a.is_array() && b.is_array() && a.is_tuple() == b.is_tuple()) {
            Array out = a.as_array();
            out.insert(out.end(), b.as_array().begin(), b.as_array().end());
            return Value::array(std::move(out), a.is_tuple());
        }
        if (a.is_string()) throw Error("can only concatenate str (not \"" + b.type_name() + "\") to str");
        fail_operands("+", a, b);
    }
    if (op == "-") {
        if (ints) {
            int64_t r;
            if (!__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return Value(r);
        }
        if (nums) return Value(a.as_double() - b.as_double());
        fail_operands("-", a, b);
    }
    if (op == "*") {
        if (ints) {
            int64_t r;
            if (!__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return Value(r);
        }
        if (nums) return Value(a.as_double() * b.as_double());
        if ((a.is_string() || a.is_array()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int(), max_bytes);
        if ((b.is_string() || b.is_array()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int(), max_bytes);
        fail_operands("*", a, b);
    }
    if (op == "/") {
        if (!nums) fail_operands("/", a, b);
        if (b.as_double() == 0) throw Error("division by zero");
        return Value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
        if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
        if (!nums) fail_operands(op, a, b);
        if (b.as_double() == 0) throw Error(ints ? "integer division or modulo by zero" : "float division by zero");
        if (ints) {
            const int64_t x = a.as_int(), y = b.as_int();
            if (x == INT64_MIN && y == -1) return Value(op == "//" ? -static_cast<double>(x) : 0.0);
            int64_t q = x / y, r = x % y;
            if (r != 0 && ((r < 0) != (y < 0))) {
                q -= 1;
                r += y;
            }
            return Value(op == "//" ? q : r);
        }
        const double x = a.as_double(), y = b.as_double();
        const double m = python_fmod(x, y);
        if (op == "%") return Value(m);
        return Value(std::round((x - m) / y));
    }
    if (op == "**") {
        if (!nums) fail_operands("**", a, b);
        if (ints && b.as_int() >= 0) {
            int64_t result = 1, base = a.as_int(), e = b.as_int();
            bool overflow = false;
            while (e > 0 && !overflow) {
                if (e & 1) overflow |= __builtin_mul_overflow(result, base, &result);
                e >>= 1;
                if (e > 0) overflow |= __builtin_mul_overflow(base, base, &base);
            }
            if (!overflow) return Value(result);
        }
        if (a.as_double() == 0 && b.as_double() < 0) throw Error("0.0 cannot be raised to a negative power");
        return Value(std::pow(a.as_double(), b.as_double()));
    }
    throw Error("unknown operator " + op);
}

bool contains(const Value& container, const Value& item) {
    switch (container.kind()) {
        case Value::Kind::String:
            if (!item.is_string())
                throw Error("'in <string>' requires string as left operand, not " + item.type_name());
            return container.as_string().find(item.as_string()) != std::string::npos;
        case Value::Kind::List:
            for (const auto& e : container.as_array())
                if (equals(e, item)) return true;
            return false;
        case Value::Kind::Dict:
            if (container.is_namespace()) break;
            return item.is_string() && container.as_object().find(item.as_string()) != nullptr;
        case Value::Kind::Undefined: return false;
        default: break;
    }
    throw Error("argument of type '" + container.type_name() + "' is not iterable");
}

std::vector<Value> iterate(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::List: return v.as_array();
        case Value::Kind::Dict: {
            if (v.is_namespace()) break;
            std::vector<Value> keys;
            for (const auto& kv : v.as_object().items) keys.emplace_back(kv.first);
            return keys;
        }
        case Value::Kind::String: {
            std::vector<Value> chars;
            for (char32_t cp : utf8_decode(v.as_string())) {
                std::string c;
                utf8_append(c, cp);
                chars.emplace_back(std::move(c));
            }
            return chars;
        }
        case Value::Kind::Undefined: return {};
        default: break;
    }
    throw Error("'" + v.type_name() + "' object is not iterable");
}

Value slice_value(const Value& v, const Value& start_v, const Value& stop_v, const Value& step_v) {
    auto index_of = [](const Value& x, bool& present) -> int64_t {
        present = !(x.is_none() || x.is_undefined());
        if (!present) return 0;
        if (!x.is_int() && !x.is_bool()) throw Error("slice indices must be integers or None");
        return x.as_int();
    };
    bool has_start, has_stop, has_step;
    int64_t start = index_of(start_v, has_start), stop = index_of(stop_v, has_stop), step = index_of(step_v, has_step);
    if (!has_step) step = 1;
    if (step == 0) throw Error("slice step cannot be zero");
    std::vector<char32_t> cps;
    int64_t len;
    if (v.is_string()) {
        cps = utf8_decode(v.as_string());
        len = static_cast<int64_t>(cps.size());
    } else if (v.is_array()) {
        len = static_cast<int64_t>(v.as_array().size());
    } else if (v.is_undefined()) {
        fail_undefined(v);
    } else {
        throw Error("'" + v.type_name() + "' object is not subscriptable");
    }
    const int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
    auto adjust = [&](int64_t x, bool present, int64_t dflt) {
        if (!present) return dflt;
        if (x < 0) {
            x += len;
            if (x < lower) x = lower;
        } else if (x > upper) {
            x = upper;
        }
        return x;
    };
    start = adjust(start, has_start, step < 0 ? upper : lower);
    stop = adjust(stop, has_stop, step < 0 ? lower : upper);
    std::vector<int64_t> picks;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
    if (v.is_string()) {
        std::string out;
        for (int64_t i : picks) utf8_append(out, cps[static_cast<size_t>(i)]);
        return Value(std::move(out));
    }
    Array out;
    for (int64_t i : picks) out.push_back(v.as_array()[static_cast<size_t>(i)]);
    return Value::array(std::move(out), v.is_tuple());
}

// ---- interpreter: statements ------------------------------------------------------------------------------------

void Interpreter::step() {
    if (++steps_ > limits_.max_steps)
        throw Error("the template takes too long to render (more than " + std::to_string(limits_.max_steps) + " steps)");
}

void Interpreter::check_size(size_t bytes) const {
    if (bytes > limits_.max_output_bytes)
        throw Error("the template output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
}

void Interpreter::emit(const std::string& text) {
    check_size(out_->size() + text.size());
    out_->append(text);
}

std::string Interpreter::render(const StmtList& body, const Object& context) {
    auto globals = std::make_shared<Scope>();
    for (auto& kv : make_globals().items) globals->set(kv.first, kv.second);
    auto root = std::make_shared<Scope>();
    root->parent = globals;
    for (const auto& kv : context.items) root->set(kv.first, kv.second);
    std::string out;
    out_ = &out;
    try {
        exec(body, root);
    } catch (const Error& e) {
        const std::string msg = one_line(e.what());
        if (msg.rfind("chat template", 0) == 0) throw Error(msg);
        throw Error("chat template error at " + describe_position(source_, offset_) + ": " + msg);
    }
    return out;
}

Interpreter::Flow Interpreter::exec(const StmtList& body, const ScopePtr& scope) {
    for (const auto& s : body) {
        const Flow f = exec_stmt(*s, scope);
        if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
}

std::string Interpreter::render_body(const StmtList& body, const ScopePtr& scope) {
    std::string buffer;
    std::string* saved = out_;
    out_ = &buffer;
    try {
        exec(body, scope);
    } catch (...) {
        out_ = saved;
        throw;
    }
    out_ = saved;
    return buffer;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const ScopePtr& scope) {
    step();
    offset_ = s.offset;
    switch (s.kind) {
        case StmtKind::Text: emit(s.text); return Flow::Normal;
        case StmtKind::Print: emit(eval(*s.expr, scope).str()); return Flow::Normal;
        case StmtKind::If:
            if (eval(*s.expr, scope).truthy()) return exec(s.body, scope);
            return exec(s.else_body, scope);
        case StmtKind::For: return exec_for(s, scope);
        case StmtKind::Set: exec_set(s, scope); return Flow::Normal;
        case StmtKind::SetBlock: {
            Value v(render_body(s.body, scope));
            if (s.filter) v = eval_filter_chain(*s.filter, scope, &v);
            scope->set(s.targets[0], std::move(v));
            return Flow::Normal;
        }
        case StmtKind::Macro: scope->set(s.name, make_macro(s, scope, s.name, s.body)); return Flow::Normal;
        case StmtKind::CallBlock: {
            Value callee = eval(*s.expr->children[0], scope);
            CallArgs args = eval_args(*s.expr, scope, 1);
            args.named.emplace_back("caller", make_macro(s, scope, "caller", s.body));
            offset_ = s.offset;
            emit(call(callee, args).str());
            return Flow::Normal;
        }
        case StmtKind::FilterBlock: {
            Value v(render_body(s.body, scope));
            emit(eval_filter_chain(*s.filter, scope, &v).str());
            return Flow::Normal;
        }
        case StmtKind::Break: return Flow::Break;
        case StmtKind::Continue: return Flow::Continue;
        case StmtKind::Scope: {
            auto inner = std::make_shared<Scope>();
            inner->parent = scope;
            for (const auto& p : s.params) inner->set(p.first, eval(*p.second, scope));
            const Flow f = exec(s.body, inner);
            return f;
        }
    }
    return Flow::Normal;
}

void Interpreter::assign(const std::vector<std::string>& targets, const Value& v, const ScopePtr& scope) {
    if (targets.size() == 1) {
        scope->set(targets[0], v);
        return;
    }
    const std::vector<Value> items = iterate(v);
    if (items.size() != targets.size())
        throw Error(items.size() < targets.size()
                        ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")"
                        : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
    for (size_t i = 0; i < targets.size(); ++i) scope->set(targets[i], items[i]);
}

void Interpreter::exec_set(const Stmt& s, const ScopePtr& scope) {
    Value v = eval(*s.expr, scope);
    if (s.attr_target.empty()) {
        assign(s.targets, v, scope);
        return;
    }
    const Value target = lookup(s.targets[0], scope);
    if (!target.is_namespace()) throw Error("cannot assign attribute on non-namespace object");
    target.mutable_object().set(s.attr_target, std::move(v));
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, const ScopePtr& scope) {
    std::vector<Value> items = iterate(eval(*s.expr, scope));
    if (s.condition) {  // the loop filter sees the loop variables but not `loop`
        std::vector<Value> kept;
        for (auto& item : items) {
            step();
            auto probe = std::make_shared<Scope>();
            probe->parent = scope;
            assign(s.targets, item, probe);
            if (eval(*s.condition, probe).truthy()) kept.push_back(std::move(item));
        }
        items = std::move(kept);
    }
    if (items.empty()) return exec(s.else_body, scope);
    const int64_t n = static_cast<int64_t>(items.size());
    int64_t cycle_index = 0;
    for (int64_t i = 0; i < n; ++i) {
        step();
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        assign(s.targets, items[static_cast<size_t>(i)], inner);
        Object loop;
        loop.items.reserve(12);
        loop.items.emplace_back("index", Value(i + 1));
        loop.items.emplace_back("index0", Value(i));
        loop.items.emplace_back("revindex", Value(n - i));
        loop.items.emplace_back("revindex0", Value(n - i - 1));
        loop.items.emplace_back("first", Value(i == 0));
        loop.items.emplace_back("last", Value(i == n - 1));
        loop.items.emplace_back("length", Value(n));
        loop.items.emplace_back("depth", Value(1));
        loop.items.emplace_back("depth0", Value(0));
        if (i > 0) loop.items.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
        if (i + 1 < n) loop.items.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
        cycle_index = i;
        loop.items.emplace_back("cycle", Value::callable("loop.cycle", [cycle_index](Interpreter&, CallArgs& a) {
            if (a.positional.empty()) throw Error("no items for cycling given");
            return a.positional[static_cast<size_t>(cycle_index) % a.positional.size()];
        }));
        inner->set("loop", Value::object(std::move(loop)));
        const Flow f = exec(s.body, inner);
        if (f == Flow::Break) break;
    }
    return Flow::Normal;
}

Value Interpreter::make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name, const StmtList& body) {
    const Stmt* def = &s;
    const StmtList* code = &body;
    std::weak_ptr<Scope> weak = scope;  // the scope holds the macro: a strong reference would be a cycle
    return Value::callable(name, [this, def, code, weak, name](Interpreter&, CallArgs& args) {
        ScopePtr defining = weak.lock();
        if (!defining) throw Error("macro '" + name + "' called after its scope ended");
        if (++call_depth_ > limits_.max_call_depth) {
            --call_depth_;
            throw Error("macro calls nest deeper than " + std::to_string(limits_.max_call_depth));
        }
        struct Depth {
            int& d;
            ~Depth() { --d; }
        } depth{call_depth_};
        auto local = std::make_shared<Scope>();
        local->parent = defining;
        const auto& params = def->params;
        Array varargs;
        Object kwargs;
        size_t pos = 0;
        for (; pos < args.positional.size(); ++pos) {
            if (pos < params.size()) local->set(params[pos].first, args.positional[pos]);
            else varargs.push_back(args.positional[pos]);
        }
        std::vector<bool> bound(params.size(), false);
        for (size_t k = 0; k < params.size() && k < args.positional.size(); ++k) bound[k] = true;
        for (auto& kv : args.named) {
            bool matched = false;
            for (size_t k = 0; k < params.size(); ++k)
                if (params[k].first == kv.first) {
                    if (bound[k]) throw Error("macro '" + name + "' got multiple values for argument '" + kv.first + "'");
                    local->set(kv.first, kv.second);
                    bound[k] = matched = true;
                }
            if (!matched) {
                if (kv.first == "caller") local->set("caller", kv.second);
                else kwargs.set(kv.first, kv.second);
            }
        }
        for (size_t k = 0; k < params.size(); ++k) {
            if (bound[k]) continue;
            if (params[k].second) local->set(params[k].first, eval(*params[k].second, local));
            else local->set(params[k].first, Value::undefined("parameter '" + params[k].first + "' was not provided"));
        }
        local->set("varargs", Value::array(std::move(varargs), true));
        local->set("kwargs", Value::object(std::move(kwargs)));
        return Value(render_body(*code, local));
    });
}

// ---- interpreter: expressions -----------------------------------------------------------------------------------

Value Interpreter::lookup(const std::string& name, const ScopePtr& scope) const {
    const Value* v = scope->find(name);
    if (v) return *v;
    return Value::undefined("'" + name + "' is undefined");
}

CallArgs Interpreter::eval_args(const Expr& e, const ScopePtr& scope, size_t first_arg) {
    CallArgs args;
    for (size_t i = first_arg; i < e.children.size(); ++i) args.positional.push_back(eval(*e.children[i], scope));
    for (const auto& kv : e.kwargs) args.named.emplace_back(kv.first, eval(*kv.second, scope));
    return args;
}

Value Interpreter::eval_filter_chain(const Expr& e, const ScopePtr& scope, const Value* block_input) {
    Value target = e.children[0] ? (e.children[0]->kind == ExprKind::Filter && block_input
                                        ? eval_filter_chain(*e.children[0], scope, block_input)
                                        : eval(*e.children[0], scope))
                                 : *block_input;
    CallArgs args = eval_args(e, scope, 1);
    offset_ = e.offset;
    return apply_filter(e.name, target, args);
}

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
    step();
    offset_ = e.offset;
    switch (e.kind) {
        case ExprKind::Literal: return e.literal;
        case ExprKind::Name: return lookup(e.name, scope);
        case ExprKind::List:
        case ExprKind::Tuple: {
            Array items;
            items.reserve(e.children.size());
            for (const auto& c : e.children) items.push_back(eval(*c, scope));
            return Value::array(std::move(items), e.kind == ExprKind::Tuple);
        }
        case ExprKind::Dict: {
            Object obj;
            for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
                Value k = eval(*e.children[i], scope);
                if (!k.is_string()) throw Error("dict literal keys must be strings in this engine, got " + k.type_name());
                obj.set(k.as_string(), eval(*e.children[i + 1], scope));
            }
            return Value::object(std::move(obj));
        }
        case ExprKind::GetAttr: {
            Value obj = eval(*e.children[0], scope);
            offset_ = e.offset;
            return get_attr(obj, e.name);
        }
        case ExprKind::GetItem: {
            Value obj = eval(*e.children[0], scope);
            Value key = eval(*e.children[1], scope);
            offset_ = e.offset;
            return get_item(obj, key);
        }
        case ExprKind::Slice: {
            Value obj = eval(*e.children[0], scope);
            Value parts[3];
            for (int k = 0; k < 3; ++k)
                if (e.children[k + 1]) parts[k] = eval(*e.children[k + 1], scope);
            offset_ = e.offset;
            return slice_value(obj, parts[0], parts[1], parts[2]);
        }
        case ExprKind::Call: {
            Value callee = eval(*e.children[0], scope);
            CallArgs args = eval_args(e, scope, 1);
            offset_ = e.offset;
            return call(callee, args);
        }
        case ExprKind::Filter: return eval_filter_chain(e, scope, nullptr);
        case ExprKind::Test: {
            Value target = eval(*e.children[0], scope);
            CallArgs args = eval_args(e, scope, 1);
            offset_ = e.offset;
            const bool r = apply_test(e.name, target, args);
            return Value(e.negated ? !r : r);
        }
        case ExprKind::Unary: {
            Value v = eval(*e.children[0], scope);
            if (e.name == "not") return Value(!v.truthy());
            if (v.is_undefined()) throw Error(v.undefined_hint());
            if (!v.is_number()) throw Error("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
            if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
            if (v.is_float()) return Value(-v.as_double());
            if (v.as_int() == INT64_MIN) return Value(-static_cast<double>(v.as_int()));
            return Value(-v.as_int());
        }
        case ExprKind::Binary: return eval_binary(e, scope);
        case ExprKind::Compare: return eval_compare(e, scope);
        case ExprKind::Condition: {
            if (eval(*e.children[1], scope).truthy()) return eval(*e.children[0], scope);
            if (e.children[2]) return eval(*e.children[2], scope);
            return Value::undefined("the inline if expression evaluated to false and no else section was defined");
        }
    }
    return Value();
}

Value Interpreter::eval_binary(const Expr& e, const ScopePtr& scope) {
    if (e.name == "and") {
        Value l = eval(*e.children[0], scope);
        return l.truthy() ? eval(*e.children[1], scope) : l;
    }
    if (e.name == "or") {
        Value l = eval(*e.children[0], scope);
        return l.truthy() ? l : eval(*e.children[1], scope);
    }
    Value l = eval(*e.children[0], scope);
    Value r = eval(*e.children[1], scope);
    offset_ = e.offset;
    if (e.name == "~") {
        std::string s = l.str();
        s += r.str();
        check_size(s.size());
        return Value(std::move(s));
    }
    return binary_op(e.name, l, r, limits_.max_output_bytes);
}

Value Interpreter::eval_compare(const Expr& e, const ScopePtr& scope) {
    Value left = eval(*e.children[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.children[i + 1], scope);
        offset_ = e.offset;
        const std::string& op = e.ops[i];
        bool r;
        if (op == "==") r = equals(left, right);
        else if (op == "!=") r = !equals(left, right);
        else if (op == "in") r = contains(right, left);
        else if (op == "not in") r = !contains(right, left);
        else {
            if (left.is_undefined()) throw Error(left.undefined_hint());
            if (right.is_undefined()) throw Error(right.undefined_hint());
            if (op == "<") r = less_than(left, right);
            else if (op == ">") r = less_than(right, left);
            else if (op == "<=") r = less_than(left, right) || equals(left, right);
            else r = less_than(right, left) || equals(left, right);
        }
        if (!r) return Value(false);
        left = std::move(right);
    }
    return Value(true);
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
    if (callee.is_callable()) return callee.as_callable().fn(*this, args);
    if (callee.is_undefined()) throw Error(callee.undefined_hint());
    throw Error("'" + callee.type_name() + "' object is not callable");
}

// ---- Template ---------------------------------------------------------------------------------------------------

Template Template::parse(const std::string& source) {
    Template t;
    LexedTemplate lexed = lex_template(source);
    t.body_ = std::make_shared<StmtList>(parse_template(lexed));
    t.source_ = std::move(lexed.source);
    return t;
}

std::string Template::render(const Object& context, const RenderLimits& limits) const {
    Interpreter interp(source_, limits);
    return interp.render(*body_, context);
}

}  // namespace strata::jinja
