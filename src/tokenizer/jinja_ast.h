// Syntax tree of the Jinja subset engine: expressions and statements as the parser builds them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace strata::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

enum class ExprKind {
    Literal,   // literal
    Name,      // name
    List,      // children
    Tuple,     // children
    Dict,      // children: key0, value0, key1, value1, ...
    GetAttr,   // children[0] . name
    GetItem,   // children[0] [ children[1] ]
    Slice,     // children[0] [ children[1] : children[2] : children[3] ]  (null parts allowed)
    Call,      // children[0] ( children[1..], kwargs )
    Filter,    // children[0] | name ( children[1..], kwargs ); children[0] null inside {% filter %}
    Test,      // children[0] is [not] name ( children[1..], kwargs )
    Unary,     // name: "-", "+", "not"
    Binary,    // name: "+", "-", "*", "/", "//", "%", "**", "~", "and", "or", "in", "not in"
    Compare,   // children: operands; ops: operators between them ("==", "!=", "<", "<=", ">", ">=")
    Condition, // children: then, condition, else (null when absent)
};

struct Expr {
    ExprKind kind;
    size_t offset = 0;
    Value literal;
    std::string name;
    std::vector<ExprPtr> children;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    std::vector<std::string> ops;
    bool negated = false;
};

enum class StmtKind {
    Text,         // text
    Print,        // expr
    If,           // expr, body, else_body (an elif is an If alone in else_body)
    For,          // targets in expr [if condition], body, else_body
    Set,          // targets (or attr_target.attr) = expr
    SetBlock,     // targets[0] = rendered body, through filter when present
    Macro,        // name(params) body
    CallBlock,    // expr (a call) with `caller` = body(params)
    FilterBlock,  // body rendered, then filter
    Break,
    Continue,
    Scope,        // body in its own scope ({% with %}, {% generation %})
};

struct Stmt {
    StmtKind kind;
    size_t offset = 0;
    std::string text;
    std::string name;
    ExprPtr expr;
    ExprPtr condition;
    ExprPtr filter;                       // a Filter chain whose innermost target is null
    std::vector<std::string> targets;     // loop / set variables (more than one: tuple unpacking)
    std::string attr_target;              // set ns.attr: targets[0] is the namespace, attr_target the attribute
    std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters with optional defaults; with targets
    StmtList body;
    StmtList else_body;
};

}  // namespace strata::jinja
