// The Jinja subset engine: a parsed template and the interpreter that renders it with jinja2's semantics as
// transformers configures them (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its own
// tojson, raise_exception and strftime_now). Rendering is bounded: output size, call depth and evaluation steps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace strata::jinja {

struct RenderLimits {
    size_t max_output_bytes = size_t{64} << 20;  // also bounds every string and list a template builds
    int max_call_depth = 64;                     // macro calls inside macro calls
    uint64_t max_steps = 50'000'000;             // statements, expressions and loop iterations
};

struct Scope {
    std::vector<std::pair<std::string, Value>> vars;
    std::shared_ptr<Scope> parent;

    const Value* find(const std::string& name) const;
    void set(const std::string& name, Value value);
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
public:
    Interpreter(const std::string& source, const RenderLimits& limits) : source_(source), limits_(limits) {}

    // Renders `body` with `context` as its variables (over the globals).
    std::string render(const StmtList& body, const Object& context);

    // Used by the builtins.
    Value call(const Value& callee, CallArgs& args);
    Value apply_filter(const std::string& name, const Value& target, CallArgs& args);
    bool apply_test(const std::string& name, const Value& target, CallArgs& args);
    Value get_attr(const Value& obj, const std::string& name);
    Value get_item(const Value& obj, const Value& key);
    void check_size(size_t bytes) const;
    void step();

private:
    enum class Flow { Normal, Break, Continue };

    const std::string& source_;
    RenderLimits limits_;
    std::string* out_ = nullptr;
    uint64_t steps_ = 0;
    int call_depth_ = 0;
    size_t offset_ = 0;  // of the statement or expression being evaluated, for messages

    Flow exec(const StmtList& body, const ScopePtr& scope);
    Flow exec_stmt(const Stmt& s, const ScopePtr& scope);
    Flow exec_for(const Stmt& s, const ScopePtr& scope);
    void exec_set(const Stmt& s, const ScopePtr& scope);
    std::string render_body(const StmtList& body, const ScopePtr& scope);
    Value make_macro(const Stmt& s, const ScopePtr& scope, const std::string& name, const StmtList& body);
    void emit(const std::string& text);

    Value eval(const Expr& e, const ScopePtr& scope);
    Value eval_binary(const Expr& e, const ScopePtr& scope);
    Value eval_compare(const Expr& e, const ScopePtr& scope);
    Value eval_filter_chain(const Expr& e, const ScopePtr& scope, const Value* block_input);
    CallArgs eval_args(const Expr& e, const ScopePtr& scope, size_t first_arg);
    Value lookup(const std::string& name, const ScopePtr& scope) const;
    void assign(const std::vector<std::string>& targets, const Value& v, const ScopePtr& scope);
};

// Python operators on values (jinja2 evaluates them in Python).
Value binary_op(const std::string& op, const Value& a, const Value& b, size_t max_bytes);
bool contains(const Value& container, const Value& item);
std::vector<Value> iterate(const Value& v);  // for loops and filters: list items, dict keys, string characters
std::string percent_format(const std::string& fmt, const Value& args);  // Python's `fmt % args`
Value slice_value(const Value& v, const Value& start, const Value& stop, const Value& step);

// The globals every template sees: range, namespace, dict, raise_exception, strftime_now.
Object make_globals();

class Template {
public:
    static Template parse(const std::string& source);  // throws Error with line:column on a syntax error
    std::string render(const Object& context, const RenderLimits& limits = {}) const;

private:
    std::string source_;
    std::shared_ptr<StmtList> body_;
};

}  // namespace strata::jinja
