#include "tokenizer/jinja_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "core/error.h"

namespace strata::jinja {

namespace {

constexpr int kMaxNesting = 200;  // bounds the recursion of the parser and, through the tree, of the evaluator

class Parser {
public:
    explicit Parser(const LexedTemplate& lexed) : src_(lexed.source), toks_(lexed.tokens) {}

    StmtList parse() {
        std::string end;
        StmtList body = subparse({}, end);
        return body;
    }

private:
    const std::string& src_;
    const std::vector<Token>& toks_;
    size_t i_ = 0;
    int depth_ = 0;
    int loop_depth_ = 0;

    struct DepthGuard {
        Parser& p;
        explicit DepthGuard(Parser& parser) : p(parser) {
            if (++p.depth_ > kMaxNesting) p.fail("the template nests deeper than " + std::to_string(kMaxNesting) + " levels");
        }
        ~DepthGuard() { --p.depth_; }
    };

    const Token& cur() const { return toks_[i_]; }
    const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
    void advance() {
        if (i_ + 1 < toks_.size()) ++i_;
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw Error("chat template syntax error at " + describe_position(src_, cur().offset) + ": " + what);
    }

    static std::string describe(const Token& t) {
        switch (t.type) {
            case TokenType::Data: return "template text";
            case TokenType::VariableBegin: return "'{{'";
            case TokenType::VariableEnd: return "end of print statement";
            case TokenType::BlockBegin: return "'{%'";
            case TokenType::BlockEnd: return "end of statement block";
            case TokenType::End: return "end of template";
            case TokenType::String: return "string";
            default: return "'" + t.value + "'";
        }
    }

    bool is_op(const char* op) const { return cur().type == TokenType::Operator && cur().value == op; }
    bool is_name(const char* name) const { return cur().type == TokenType::Name && cur().value == name; }
    bool skip_op(const char* op) {
        if (!is_op(op)) return false;
        advance();
        return true;
    }
    bool skip_name(const char* name) {
        if (!is_name(name)) return false;
        advance();
        return true;
    }
    void expect_op(const char* op) {
        if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
    }
    std::string expect_identifier() {
        if (cur().type != TokenType::Name) fail("expected a name, got " + describe(cur()));
        std::string n = cur().value;
        advance();
        return n;
    }
    void expect_block_end() {
        if (cur().type != TokenType::BlockEnd) fail("expected end of statement block, got " + describe(cur()));
        advance();
    }

    ExprPtr node(ExprKind kind, size_t offset) {
        auto e = std::make_unique<Expr>();
        e->kind = kind;
        e->offset = offset;
        return e;
    }

    // ---- statements ------------------------------------------------------------------------------------------

    // Statements until one of `end_tags` opens a block; that tag's name is consumed and stored in `found`.
    StmtList subparse(std::initializer_list<const char*> end_tags, std::string& found) {
        DepthGuard guard(*this);
        StmtList body;
        while (true) {
            const Token& t = cur();
            if (t.type == TokenType::Data) {
                auto s = std::make_unique<Stmt>();
                s->kind = StmtKind::Text;
                s->offset = t.offset;
                s->text = t.value;
                body.push_back(std::move(s));
                advance();
            } else if (t.type == TokenType::VariableBegin) {
                auto s = std::make_unique<Stmt>();
                s->kind = StmtKind::Print;
                s->offset = t.offset;
                advance();
                s->expr = parse_tuple(true, false);
                if (cur().type != TokenType::VariableEnd) fail("unexpected " + describe(cur()) + " in a print statement");
                advance();
                body.push_back(std::move(s));
            } else if (t.type == TokenType::BlockBegin) {
                advance();
                if (cur().type != TokenType::Name) fail("expected a statement name, got " + describe(cur()));
                const std::string name = cur().value;
                for (const char* e : end_tags)
                    if (name == e) {
                        advance();
                        found = name;
                        return body;
                    }
                body.push_back(parse_statement());
            } else if (t.type == TokenType::End) {
                if (end_tags.size() != 0) {
                    std::string expected;
                    for (const char* e : end_tags) expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
                    fail("unexpected end of template, expected " + expected);
                }
                return body;
            } else {
                fail("unexpected " + describe(t));
            }
        }
    }

    StmtPtr parse_statement() {
        const Token& t = cur();
        const std::string name = t.value;
        auto s = std::make_unique<Stmt>();
        s->offset = t.offset;
        advance();
        std::string found;
        if (name == "if") {
            parse_if_rest(*s);
        } else if (name == "for") {
            s->kind = StmtKind::For;
            s->targets = parse_assign_names();
            if (!skip_name("in")) fail("expected 'in' in a for loop, got " + describe(cur()));
            s->expr = parse_tuple(false, false);
            if (skip_name("if")) s->condition = parse_expression(true);
            if (is_name("recursive")) fail("recursive for loops are not supported");
            expect_block_end();
            ++loop_depth_;
            s->body = subparse({"endfor", "else"}, found);
            --loop_depth_;
            if (found == "else") {
                expect_block_end();
                s->else_body = subparse({"endfor"}, found);
            }
            expect_block_end();
        } else if (name == "set") {
            parse_set_rest(*s);
        } else if (name == "macro") {
            s->kind = StmtKind::Macro;
            s->name = expect_identifier();
            parse_params(*s);
            expect_block_end();
            const int saved = loop_depth_;
            loop_depth_ = 0;
            s->body = subparse({"endmacro"}, found);
            loop_depth_ = saved;
            if (cur().type == TokenType::Name && cur().value == s->name) advance();
            expect_block_end();
        } else if (name == "call") {
            s->kind = StmtKind::CallBlock;
            if (is_op("(")) parse_params(*s);
            s->expr = parse_expression(true);
            if (s->expr->kind != ExprKind::Call) fail("expected a call in a call block");
            expect_block_end();
            s->body = subparse({"endcall"}, found);
            expect_block_end();
        } else if (name == "filter") {
            s->kind = StmtKind::FilterBlock;
            s->filter = parse_filter_chain(nullptr);
            expect_block_end();
            s->body = subparse({"endfilter"}, found);
            expect_block_end();
        } else if (name == "break" || name == "continue") {
            if (loop_depth_ == 0) fail("'" + name + "' outside of a loop");
            s->kind = name == "break" ? StmtKind::Break : StmtKind::Continue;
            expect_block_end();
        } else if (name == "with") {
            s->kind = StmtKind::Scope;
            while (cur().type != TokenType::BlockEnd) {
                if (!s->params.empty()) expect_op(",");
                std::string var = expect_identifier();
                expect_op("=");
                s->params.emplace_back(var, parse_expression(true));
            }
            expect_block_end();
            s->body = subparse({"endwith"}, found);
            expect_block_end();
        } else if (name == "generation") {  // transformers' AssistantTracker tag: renders its body unchanged
            s->kind = StmtKind::Scope;
            expect_block_end();
            s->body = subparse({"endgeneration"}, found);
            expect_block_end();
        } else {
            i_ -= 1;
            fail("unknown or unsupported tag '" + name + "'");
        }
        return s;
    }

    void parse_if_rest(Stmt& s) {
        s.kind = StmtKind::If;
        s.expr = parse_tuple(false, false);
        expect_block_end();
        std::string found;
        s.body = subparse({"elif", "else", "endif"}, found);
        if (found == "elif") {
            auto elif = std::make_unique<Stmt>();
            elif->offset = cur().offset;
            parse_if_rest(*elif);
            s.else_body.push_back(std::move(elif));
            return;  // the elif consumed the shared endif
        }
        if (found == "else") {
            expect_block_end();
            s.else_body = subparse({"endif"}, found);
        }
        expect_block_end();
    }

    void parse_set_rest(Stmt& s) {
        s.kind = StmtKind::Set;
        s.targets.push_back(expect_identifier());
        if (skip_op(".")) {
            s.attr_target = expect_identifier();
        } else {
            while (skip_op(",")) s.targets.push_back(expect_identifier());
        }
        if (skip_op("=")) {
            s.expr = parse_tuple(true, false);
            expect_block_end();
            return;
        }
        if (!s.attr_target.empty() || s.targets.size() != 1) fail("expected '=' in a set statement");
        s.kind = StmtKind::SetBlock;
        if (is_op("|")) s.filter = parse_filter_chain(nullptr);
        expect_block_end();
        std::string found;
        s.body = subparse({"endset"}, found);
        expect_block_end();
    }

    std::vector<std::string> parse_assign_names() {
        std::vector<std::string> names;
        const bool paren = skip_op("(");
        names.push_back(expect_identifier());
        while (skip_op(",")) {
            if (paren && is_op(")")) break;
            if (is_name("in")) break;
            names.push_back(expect_identifier());
        }
        if (paren) expect_op(")");
        return names;
    }

    void parse_params(Stmt& s) {
        expect_op("(");
        while (!is_op(")")) {
            if (!s.params.empty()) expect_op(",");
            if (is_op(")")) break;
            std::string p = expect_identifier();
            ExprPtr def;
            if (skip_op("=")) def = parse_expression(true);
            s.params.emplace_back(p, std::move(def));
        }
        expect_op(")");
    }

    // ---- expressions -----------------------------------------------------------------------------------------

    bool at_tuple_end() const {
        const TokenType t = cur().type;
        return t == TokenType::VariableEnd || t == TokenType::BlockEnd || is_op(")") ||
               (t == TokenType::Name && cur().value == "recursive");
    }

    ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens) {
        const size_t offset = cur().offset;
        std::vector<ExprPtr> items;
        bool is_tuple = false;
        while (true) {
            if (!items.empty()) {
                if (!skip_op(",")) break;
                is_tuple = true;
            }
            if (at_tuple_end() && !(items.empty() && !explicit_parens)) break;
            if (with_condexpr) items.push_back(parse_expression(true));
            else items.push_back(parse_or());
        }
        if (!is_tuple && items.size() == 1) return std::move(items[0]);
        if (items.empty() && !explicit_parens) fail("expected an expression, got " + describe(cur()));
        auto t = node(ExprKind::Tuple, offset);
        t->children = std::move(items);
        return t;
    }

    ExprPtr parse_expression(bool with_condexpr) {
        DepthGuard guard(*this);
        ExprPtr e = parse_or();
        if (!with_condexpr) return e;
        while (is_name("if")) {
            const size_t offset = cur().offset;
            advance();
            auto c = node(ExprKind::Condition, offset);
            ExprPtr cond = parse_or();
            ExprPtr otherwise;
            if (skip_name("else")) otherwise = parse_expression(true);
            c->children.push_back(std::move(e));
            c->children.push_back(std::move(cond));
            c->children.push_back(std::move(otherwise));
            e = std::move(c);
        }
        return e;
    }

    ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, size_t offset) {
        auto b = node(ExprKind::Binary, offset);
        b->name = op;
        b->children.push_back(std::move(l));
        b->children.push_back(std::move(r));
        return b;
    }

    ExprPtr parse_or() {
        ExprPtr l = parse_and();
        while (is_name("or")) {
            const size_t o = cur().offset;
            advance();
            l = binary("or", std::move(l), parse_and(), o);
        }
        return l;
    }

    ExprPtr parse_and() {
        ExprPtr l = parse_not();
        while (is_name("and")) {
            const size_t o = cur().offset;
            advance();
            l = binary("and", std::move(l), parse_not(), o);
        }
        return l;
    }

    ExprPtr parse_not() {
        DepthGuard guard(*this);
        if (is_name("not")) {
            auto u = node(ExprKind::Unary, cur().offset);
            advance();
            u->name = "not";
            u->children.push_back(parse_not());
            return u;
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        const size_t offset = cur().offset;
        ExprPtr first = parse_math1();
        auto c = node(ExprKind::Compare, offset);
        c->children.push_back(std::move(first));
        while (true) {
            std::string op;
            if (cur().type == TokenType::Operator &&
                (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == "<=" ||
                 cur().value == ">" || cur().value == ">=")) {
                op = cur().value;
                advance();
            } else if (is_name("in")) {
                op = "in";
                advance();
            } else if (is_name("not") && peek().type == TokenType::Name && peek().value == "in") {
                op = "not in";
                advance();
                advance();
            } else {
                break;
            }
            c->ops.push_back(op);
            c->children.push_back(parse_math1());
        }
        if (c->ops.empty()) return std::move(c->children[0]);
        return c;
    }

    ExprPtr parse_math1() {
        ExprPtr l = parse_concat();
        while (is_op("+") || is_op("-")) {
            const std::string op = cur().value;
            const size_t o = cur().offset;
            advance();
            l = binary(op, std::move(l), parse_concat(), o);
        }
        return l;
    }

    ExprPtr parse_concat() {
        ExprPtr l = parse_math2();
        while (is_op("~")) {
            const size_t o = cur().offset;
            advance();
            l = binary("~", std::move(l), parse_math2(), o);
        }
        return l;
    }

    ExprPtr parse_math2() {
        ExprPtr l = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            const std::string op = cur().value;
            const size_t o = cur().offset;
            advance();
            l = binary(op, std::move(l), parse_pow(), o);
        }
        return l;
    }

    ExprPtr parse_pow() {
        ExprPtr l = parse_unary(true);
        while (is_op("**")) {
            const size_t o = cur().offset;
            advance();
            l = binary("**", std::move(l), parse_unary(true), o);
        }
        return l;
    }

    ExprPtr parse_unary(bool with_filter) {
        DepthGuard guard(*this);
        ExprPtr e;
        if (is_op("-") || is_op("+")) {
            e = node(ExprKind::Unary, cur().offset);
            e->name = cur().value;
            advance();
            e->children.push_back(parse_unary(false));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }

    ExprPtr literal(Value v, size_t offset) {
        auto e = node(ExprKind::Literal, offset);
        e->literal = std::move(v);
        return e;
    }

    ExprPtr parse_primary() {
        const Token& t = cur();
        const size_t offset = t.offset;
        switch (t.type) {
            case TokenType::Name: {
                const std::string n = t.value;
                advance();
                if (n == "true" || n == "True") return literal(Value(true), offset);
                if (n == "false" || n == "False") return literal(Value(false), offset);
                if (n == "none" || n == "None") return literal(Value::none(), offset);
                auto e = node(ExprKind::Name, offset);
                e->name = n;
                return e;
            }
            case TokenType::String: {
                std::string s;
                while (cur().type == TokenType::String) {
                    s += cur().value;
                    advance();
                }
                return literal(Value(std::move(s)), offset);
            }
            case TokenType::Integer: {
                errno = 0;
                const long long v = std::strtoll(t.value.c_str(), nullptr, 10);
                Value lit = errno == ERANGE ? Value(std::strtod(t.value.c_str(), nullptr)) : Value(static_cast<int64_t>(v));
                advance();
                return literal(std::move(lit), offset);
            }
            case TokenType::Float: {
                const double v = std::strtod(t.value.c_str(), nullptr);
                advance();
                return literal(Value(v), offset);
            }
            case TokenType::Operator: {
                if (t.value == "(") {
                    advance();
                    ExprPtr e = parse_tuple(true, true);
                    expect_op(")");
                    return e;
                }
                if (t.value == "[") {
                    advance();
                    auto e = node(ExprKind::List, offset);
                    while (!is_op("]")) {
                        if (!e->children.empty()) expect_op(",");
                        if (is_op("]")) break;
                        e->children.push_back(parse_expression(true));
                    }
                    expect_op("]");
                    return e;
                }
                if (t.value == "{") {
                    advance();
                    auto e = node(ExprKind::Dict, offset);
                    while (!is_op("}")) {
                        if (!e->children.empty()) expect_op(",");
                        if (is_op("}")) break;
                        e->children.push_back(parse_expression(true));
                        expect_op(":");
                        e->children.push_back(parse_expression(true));
                    }
                    expect_op("}");
                    return e;
                }
                break;
            }
            default: break;
        }
        fail("unexpected " + describe(t));
    }

    ExprPtr parse_postfix(ExprPtr e) {
        while (true) {
            if (is_op(".")) {
                const size_t offset = cur().offset;
                advance();
                if (cur().type == TokenType::Name) {
                    auto g = node(ExprKind::GetAttr, offset);
                    g->name = cur().value;
                    advance();
                    g->children.push_back(std::move(e));
                    e = std::move(g);
                } else if (cur().type == TokenType::Integer) {
                    auto g = node(ExprKind::GetItem, offset);
                    g->children.push_back(std::move(e));
                    g->children.push_back(literal(Value(static_cast<int64_t>(std::strtoll(cur().value.c_str(), nullptr, 10))), offset));
                    advance();
                    e = std::move(g);
                } else {
                    fail("expected an attribute name after '.', got " + describe(cur()));
                }
            } else if (is_op("[")) {
                e = parse_subscript(std::move(e));
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }

    ExprPtr parse_subscript(ExprPtr target) {
        const size_t offset = cur().offset;
        advance();  // [
        std::vector<ExprPtr> keys;
        while (!is_op("]")) {
            if (!keys.empty()) {
                expect_op(",");
                if (is_op("]")) break;
            }
            keys.push_back(parse_subscribed());
        }
        expect_op("]");
        if (keys.empty()) fail("expected a subscript");
        if (keys.size() == 1 && keys[0]->kind == ExprKind::Slice) {
            keys[0]->children[0] = std::move(target);
            return std::move(keys[0]);
        }
        auto g = node(ExprKind::GetItem, offset);
        g->children.push_back(std::move(target));
        if (keys.size() == 1) {
            g->children.push_back(std::move(keys[0]));
        } else {
            auto t = node(ExprKind::Tuple, offset);
            t->children = std::move(keys);
            g->children.push_back(std::move(t));
        }
        return g;
    }

    ExprPtr parse_subscribed() {
        const size_t offset = cur().offset;
        ExprPtr start;
        if (!is_op(":")) {
            start = parse_expression(true);
            if (!is_op(":")) return start;
        }
        advance();  // :
        auto s = node(ExprKind::Slice, offset);
        s->children.resize(4);
        s->children[1] = std::move(start);
        if (!is_op("]") && !is_op(",") && !is_op(":")) s->children[2] = parse_expression(true);
        if (skip_op(":")) {
            if (!is_op("]") && !is_op(",")) s->children[3] = parse_expression(true);
        }
        return s;
    }

    void parse_call_args(Expr& call) {
        expect_op("(");
        bool first = true;
        while (!is_op(")")) {
            if (!first) {
                expect_op(",");
                if (is_op(")")) break;
            }
            first = false;
            if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
            if (cur().type == TokenType::Name && peek().type == TokenType::Operator && peek().value == "=") {
                std::string key = cur().value;
                advance();
                advance();
                call.kwargs.emplace_back(std::move(key), parse_expression(true));
            } else {
                if (!call.kwargs.empty()) fail("a positional argument follows a keyword argument");
                call.children.push_back(parse_expression(true));
            }
        }
        expect_op(")");
    }

    ExprPtr parse_call(ExprPtr callee) {
        auto c = node(ExprKind::Call, cur().offset);
        c->children.push_back(std::move(callee));
        parse_call_args(*c);
        return c;
    }

    std::string parse_dotted_name() {
        std::string n = expect_identifier();
        while (is_op(".")) {
            advance();
            n += "." + expect_identifier();
        }
        return n;
    }

    ExprPtr parse_filter_expr(ExprPtr e) {
        while (true) {
            if (is_op("|")) {
                e = parse_filter_chain(std::move(e), true);
            } else if (is_name("is")) {
                e = parse_test(std::move(e));
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }

    // `| name(args)`, repeated unless `single`. With a null target this is the filter of a filter or set block.
    ExprPtr parse_filter_chain(ExprPtr target, bool single = false) {
        do {
            const size_t offset = cur().offset;
            if (!skip_op("|") && target) fail("expected '|'");
            auto f = node(ExprKind::Filter, offset);
            f->name = parse_dotted_name();
            f->children.push_back(std::move(target));
            if (is_op("(")) parse_call_args(*f);
            target = std::move(f);
        } while (!single && is_op("|"));
        return target;
    }

    ExprPtr parse_test(ExprPtr target) {
        auto t = node(ExprKind::Test, cur().offset);
        advance();  // is
        t->negated = skip_name("not");
        t->name = parse_dotted_name();
        t->children.push_back(std::move(target));
        if (is_op("(")) {
            parse_call_args(*t);
        } else {
            const Token& c = cur();
            const bool arg_start = c.type == TokenType::Name || c.type == TokenType::String ||
                                   c.type == TokenType::Integer || c.type == TokenType::Float ||
                                   (c.type == TokenType::Operator && (c.value == "(" || c.value == "[" || c.value == "{"));
            if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
                if (is_name("is")) fail("tests cannot be chained with 'is'");
                t->children.push_back(parse_postfix(parse_primary()));
            }
        }
        return t;
    }
};

}  // namespace

StmtList parse_template(const LexedTemplate& lexed) { return Parser(lexed).parse(); }

}  // namespace strata::jinja
