// The byte-level recognizer: one step per byte over a stack of frames (see json_schema_recognizer.h).
#include "runtime/json_schema_recognizer.h"

#include <algorithm>

#include "core/error.h"

namespace strata::constraint {

namespace {

// Object phases
constexpr uint8_t kObjOpen = 0, kObjKey = 1, kObjAfterKey = 2, kObjBeforeValue = 3, kObjAfterValue = 4,
                  kObjBeforeKey = 5;
// Array phases
constexpr uint8_t kArrOpen = 0, kArrAfterItem = 1, kArrBeforeItem = 2;
// Number phases (complete: zero, int, frac, exp)
constexpr uint8_t kNumMinus = 0, kNumZero = 1, kNumInt = 2, kNumDot = 3, kNumFrac = 4, kNumExpMark = 5, kNumExpSign = 6,
                  kNumExp = 7;
// Dispatch phases
constexpr uint8_t kDispMatch = 0, kDispMatched = 1, kDispRunning = 2;
// XmlParams phases
constexpr uint8_t kXmlBetween = 0, kXmlKey = 1, kXmlMatched = 2;

bool is_digit(uint8_t b) {
    return b >= '0' && b <= '9';
}

int hex_value(uint8_t b) {
    if (b >= '0' && b <= '9') return b - '0';
    if (b >= 'a' && b <= 'f') return b - 'a' + 10;
    if (b >= 'A' && b <= 'F') return b - 'A' + 10;
    return -1;
}

enum class Ws { No, Taken, Reject };

// Whitespace between tokens (f is an object or array): nothing, one space, or one LF followed by an indent of spaces
// and tabs, at most kIndentPerLevel bytes per open container and kMaxIndent in all. This is llama.cpp's
// json-schema-to-grammar rule (`space ::= | " " | "\n" [ \t]{0,20}`) with the indent also bounded by the depth:
// pretty-printed JSON fits (an indent of 2 to a depth of 10, 4 to a depth of 5, tabs to 20), while a small model that
// indents 20 spaces at every line of a one-key object (10 tokens a line for the bundled model) cannot. No CR, no lone
// tab, no second LF.
Ws take_whitespace(Frame& f, uint8_t b) {
    if (b != ' ' && b != '\t' && b != '\n' && b != '\r') return Ws::No;
    if (f.ws == 0) {
        if (b != ' ' && b != '\n') return Ws::Reject;
        f.ws_newline = b == '\n';
    } else {
        const int indent = f.ws - 1;  // the run began with LF, counted in f.ws
        const int max_indent = std::min(kMaxIndent, kIndentPerLevel * f.depth);
        if (!f.ws_newline || (b != ' ' && b != '\t') || indent >= max_indent) return Ws::Reject;
    }
    ++f.ws;
    return Ws::Taken;
}

void set_phase(Frame& f, uint8_t phase) {
    f.phase = phase;
    f.ws = 0;
    f.ws_newline = 0;
}

// Candidates in [lo, hi) share their first `pos` bytes and are sorted, so those whose byte `pos` is b form a range.
void narrow(const std::vector<std::string>& c, uint16_t& lo, uint16_t& hi, uint32_t pos, uint8_t b) {
    uint16_t i = lo;
    while (i < hi && (c[i].size() <= pos || static_cast<uint8_t>(c[i][pos]) < b)) ++i;
    uint16_t j = i;
    while (j < hi && c[j].size() > pos && static_cast<uint8_t>(c[j][pos]) == b) ++j;
    lo = i;
    hi = i == j ? i : j;
}

uint64_t range_bits(uint32_t lo, uint32_t hi) {
    const uint64_t upto_hi = hi >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
    const uint64_t below_lo = lo >= 64 ? ~uint64_t{0} : (uint64_t{1} << lo) - 1;
    return upto_hi & ~below_lo;
}

}  // namespace

TextStep text_step(TextState& t, uint8_t b, bool allow_escapes) {
    if (t.utf8_left > 0) {
        if (b < t.utf8_lo || b > t.utf8_hi) return TextStep::Reject;
        --t.utf8_left;
        t.utf8_lo = 0x80;
        t.utf8_hi = 0xbf;
        return t.utf8_left == 0 ? TextStep::Char : TextStep::Partial;
    }
    if (t.surrogate == 1) {
        if (b != '\\') return TextStep::Reject;
        t.surrogate = 2;
        return TextStep::Partial;
    }
    if (t.surrogate == 2) {
        if (b != 'u') return TextStep::Reject;
        t.surrogate = 3;
        t.escape = 2;
        t.hex = 0;
        return TextStep::Partial;
    }
    if (t.escape == 1) {
        switch (b) {
            case '"':
            case '\\':
            case '/':
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't':
                t.escape = 0;
                return TextStep::Char;
            case 'u':
                t.escape = 2;
                t.hex = 0;
                return TextStep::Partial;
            default:
                return TextStep::Reject;
        }
    }
    if (t.escape >= 2) {
        const int h = hex_value(b);
        if (h < 0) return TextStep::Reject;
        const int digit = t.escape - 2;
        if (t.surrogate == 3) {  // DC00-DFFF
            if ((digit == 0 && h != 0xd) || (digit == 1 && h < 0xc)) return TextStep::Reject;
        } else if (digit == 1 && t.hex == 0xd && h >= 0xc) {
            return TextStep::Reject;  // a low surrogate without a high one before it
        }
        t.hex = static_cast<uint16_t>(t.hex * 16 + h);
        if (++t.escape < 6) return TextStep::Partial;
        t.escape = 0;
        if (t.surrogate == 3) {
            t.surrogate = 0;
            return TextStep::Char;
        }
        if (t.hex >= 0xd800 && t.hex <= 0xdbff) {
            t.surrogate = 1;
            return TextStep::Partial;
        }
        return TextStep::Char;
    }
    if (b == '"') return TextStep::Close;
    if (b == '\\') {
        if (!allow_escapes) return TextStep::Reject;
        t.escape = 1;
        return TextStep::Partial;
    }
    if (b < 0x20) return TextStep::Reject;
    if (b < 0x80) return TextStep::Char;
    // UTF-8 lead bytes (RFC 3629 table 3-7): no overlong forms, no surrogates, nothing past U+10FFFF.
    if (b >= 0xc2 && b <= 0xdf) {
        t.utf8_left = 1;
    } else if (b == 0xe0) {
        t.utf8_left = 2;
        t.utf8_lo = 0xa0;
    } else if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) {
        t.utf8_left = 2;
    } else if (b == 0xed) {
        t.utf8_left = 2;
        t.utf8_hi = 0x9f;
    } else if (b == 0xf0) {
        t.utf8_left = 3;
        t.utf8_lo = 0x90;
    } else if (b >= 0xf1 && b <= 0xf3) {
        t.utf8_left = 3;
    } else if (b == 0xf4) {
        t.utf8_left = 3;
        t.utf8_hi = 0x8f;
    } else {
        return TextStep::Reject;
    }
    return TextStep::Partial;
}

Stack Stepper::initial(const Grammar& grammar) {
    Stack s;
    s.top.kind = FrameKind::Root;
    s.top.node = grammar.root;
    s.top.depth = grammar.root_depth;
    return s;
}

Stack Stepper::push(const Stack& s, const Frame& child) {
    arena_.push_back(Link{s.top, s.parent});
    Stack out{child, static_cast<int32_t>(arena_.size() - 1)};
    const bool container = child.kind == FrameKind::Object || child.kind == FrameKind::Array;
    out.top.depth = static_cast<uint8_t>(std::min<int>(s.top.depth + (container ? 1 : 0), 255));
    return out;
}

Stack Stepper::pop(const Stack& s) const {
    STRATA_ASSERT(s.parent >= 0 && static_cast<size_t>(s.parent) < arena_.size());
    const Link& l = arena_[static_cast<size_t>(s.parent)];
    return Stack{l.frame, l.parent};
}

// Frames with nothing left to read leave as soon as their last part ends.
void Stepper::emit(Stack s, std::vector<Stack>& out) const {
    for (;;) {
        const Frame& f = s.top;
        if (f.kind == FrameKind::Sequence && f.count >= g_.nodes[f.node].children.size()) {
            s = pop(s);
        } else if (f.kind == FrameKind::Dispatch && f.phase == kDispRunning) {
            s = pop(s);
        } else {
            break;
        }
    }
    out.push_back(s);
}

void Stepper::start_value(uint32_t node, const Stack& parent, uint8_t b, std::vector<Stack>& out) {
    const Node& n = g_.nodes[node];
    Frame f;
    f.node = node;
    switch (n.kind) {
        case NodeKind::Never:
            return;
        case NodeKind::Ref:
        case NodeKind::Union:
            for (uint32_t child : n.children) start_value(child, parent, b, out);
            return;
        case NodeKind::Object:
            if (b != '{') return;
            f.kind = FrameKind::Object;
            f.phase = kObjOpen;
            out.push_back(push(parent, f));
            return;
        case NodeKind::Array:
            if (b != '[') return;
            f.kind = FrameKind::Array;
            f.phase = kArrOpen;
            out.push_back(push(parent, f));
            return;
        case NodeKind::String:
            if (b != '"') return;
            f.kind = FrameKind::String;
            out.push_back(push(parent, f));
            return;
        case NodeKind::Number:
        case NodeKind::Integer:
            f.kind = FrameKind::Number;
            if (b == '-') {
                f.phase = kNumMinus;
            } else if (b == '0') {
                f.phase = kNumZero;
            } else if (b >= '1' && b <= '9') {
                f.phase = kNumInt;
                f.count = 1;
            } else {
                return;
            }
            out.push_back(push(parent, f));
            return;
        case NodeKind::Literal:
        case NodeKind::Dispatch: {
            uint16_t lo = 0, hi = static_cast<uint16_t>(n.candidates.size());
            narrow(n.candidates, lo, hi, 0, b);
            if (lo == hi) return;
            f.kind = n.kind == NodeKind::Literal ? FrameKind::Literal : FrameKind::Dispatch;
            f.lo = lo;
            f.hi = hi;
            f.count = 1;
            const bool done = hi - lo == 1 && n.candidates[lo].size() == 1;
            if (f.kind == FrameKind::Literal && done) {
                emit(parent, out);
                return;
            }
            if (done) {
                f.phase = kDispMatched;
                f.value_node = n.children[lo];
            }
            out.push_back(push(parent, f));
            return;
        }
        case NodeKind::Sequence: {
            f.kind = FrameKind::Sequence;
            f.count = 1;
            const Stack seq = push(parent, f);
            start_value(n.children[0], seq, b, out);
            return;
        }
        case NodeKind::XmlParams:
        case NodeKind::RawText:
            f.kind = n.kind == NodeKind::XmlParams ? FrameKind::XmlParams : FrameKind::RawText;
            step(push(parent, f), b, out);  // these read their first byte like any other
            return;
    }
}

void Stepper::object_key(Stack& s, uint8_t b, std::vector<Stack>& out) {
    Frame& f = s.top;
    const Node& n = g_.nodes[f.node];
    uint16_t lo = f.lo, hi = f.hi;
    narrow(n.keys, lo, hi, f.count, b);
    const bool declared_ok = lo < hi && (range_bits(lo, hi) & n.allowed_mask & ~f.seen) != 0;
    if (b == '"' && !declared_ok) {  // the closing quote (a '"' inside a declared key follows a backslash)
        const bool exact = f.lo < f.hi && n.keys[f.lo].size() == f.count;
        if (exact) {
            const uint64_t bit = uint64_t{1} << f.lo;
            if (!(n.allowed_mask & bit) || (f.seen & bit)) return;  // a duplicate, or a property that is false
            f.seen |= bit;
            f.value_node = n.key_nodes[f.lo];
        } else {
            if (!f.free_key || !f.text.clean() || n.additional == kNoNode) return;
            f.value_node = n.additional;
        }
        set_phase(f, kObjAfterKey);
        out.push_back(s);
        return;
    }
    bool free_ok = false;
    if (f.free_key) {
        TextState t = f.text;
        const TextStep r = text_step(t, b, /*allow_escapes=*/n.keys.empty());
        free_ok = r == TextStep::Partial || r == TextStep::Char;
        if (free_ok) f.text = t;
    }
    if (!declared_ok && !free_ok) return;
    f.lo = lo;
    f.hi = hi;
    ++f.count;
    f.free_key = free_ok;
    out.push_back(s);
}

void Stepper::step(Stack s, uint8_t b, std::vector<Stack>& out) {
    for (;;) {
        Frame& f = s.top;
        const Node& n = g_.nodes[f.node];
        switch (f.kind) {
            case FrameKind::Root: {  // nothing before the value or after it: the reply is the value alone
                if (f.phase == 0) {
                    f.phase = 1;
                    start_value(g_.root, s, b, out);
                } else if (g_.repeat != kNoNode) {
                    start_value(g_.repeat, s, b, out);
                }
                return;
            }
            case FrameKind::Object: {
                if (f.phase == kObjKey) {
                    object_key(s, b, out);
                    return;
                }
                const Ws ws = take_whitespace(f, b);
                if (ws == Ws::Taken) out.push_back(s);
                if (ws != Ws::No) return;
                const bool key_possible = n.additional != kNoNode || (n.allowed_mask & ~f.seen) != 0;
                const bool may_close = (n.required_mask & ~f.seen) == 0;
                switch (f.phase) {
                    case kObjOpen:
                    case kObjBeforeKey:
                        if (b == '}' && f.phase == kObjOpen && may_close) {
                            emit(pop(s), out);
                        } else if (b == '"' && key_possible) {
                            set_phase(f, kObjKey);
                            f.lo = 0;
                            f.hi = static_cast<uint16_t>(n.keys.size());
                            f.count = 0;
                            f.text = TextState{};
                            f.free_key = n.additional != kNoNode;
                            out.push_back(s);
                        }
                        return;
                    case kObjAfterKey:
                        if (b == ':') {
                            set_phase(f, kObjBeforeValue);
                            out.push_back(s);
                        }
                        return;
                    case kObjBeforeValue:
                        set_phase(f, kObjAfterValue);
                        start_value(f.value_node, s, b, out);
                        return;
                    case kObjAfterValue:
                        if (b == ',' && key_possible) {
                            set_phase(f, kObjBeforeKey);
                            out.push_back(s);
                        } else if (b == '}' && may_close) {
                            emit(pop(s), out);
                        }
                        return;
                    default:
                        STRATA_ASSERT(false);
                }
                return;
            }
            case FrameKind::Array: {
                const Ws ws = take_whitespace(f, b);
                if (ws == Ws::Taken) out.push_back(s);
                if (ws != Ws::No) return;
                if (f.phase == kArrAfterItem) {
                    if (b == ',' && f.count < n.max_items) {
                        set_phase(f, kArrBeforeItem);
                        out.push_back(s);
                    } else if (b == ']' && f.count >= n.min_items) {
                        emit(pop(s), out);
                    }
                    return;
                }
                if (f.phase == kArrOpen && b == ']') {
                    if (n.min_items == 0) emit(pop(s), out);
                    return;
                }
                if (f.count >= n.max_items) return;
                set_phase(f, kArrAfterItem);
                ++f.count;
                start_value(n.items, s, b, out);
                return;
            }
            case FrameKind::String: {
                if (f.text.clean()) {
                    if (b == '"') {
                        if (f.count >= n.min_length) emit(pop(s), out);
                        return;
                    }
                    if (f.count >= n.max_length) return;
                }
                const TextStep r = text_step(f.text, b, /*allow_escapes=*/true);
                if (r == TextStep::Reject || r == TextStep::Close) return;
                if (r == TextStep::Char) ++f.count;
                out.push_back(s);
                return;
            }
            case FrameKind::Number: {
                const bool integer = n.kind == NodeKind::Integer;
                const bool digit = is_digit(b);
                const bool dot = b == '.' && !integer;
                const bool exp = (b == 'e' || b == 'E') && !integer;
                bool done = false;  // the number has ended before b
                switch (f.phase) {
                    case kNumMinus:
                        if (!digit) return;
                        f.phase = b == '0' ? kNumZero : kNumInt;
                        f.count = 1;
                        break;
                    case kNumZero:
                    case kNumInt:
                        if (digit && f.phase == kNumInt && f.count < kMaxIntegerDigits) {
                            ++f.count;
                        } else if (dot) {
                            f.phase = kNumDot;
                        } else if (exp) {
                            f.phase = kNumExpMark;
                        } else {
                            done = true;
                        }
                        break;
                    case kNumDot:
                        if (!digit) return;
                        f.phase = kNumFrac;
                        f.count = 1;
                        break;
                    case kNumFrac:
                        if (digit && f.count < kMaxFractionDigits) {
                            ++f.count;
                        } else if (exp) {
                            f.phase = kNumExpMark;
                        } else {
                            done = true;
                        }
                        break;
                    case kNumExpMark:
                        if (b == '+' || b == '-') {
                            f.phase = kNumExpSign;
                        } else if (digit) {
                            f.phase = kNumExp;
                            f.count = 1;
                        } else {
                            return;
                        }
                        break;
                    case kNumExpSign:
                        if (!digit) return;
                        f.phase = kNumExp;
                        f.count = 1;
                        break;
                    case kNumExp:
                        if (digit && f.count < kMaxExponentDigits) {
                            ++f.count;
                        } else {
                            done = true;
                        }
                        break;
                    default:
                        STRATA_ASSERT(false);
                }
                if (!done) {
                    out.push_back(s);
                    return;
                }
                s = pop(s);  // the number ended: its parent reads b
                continue;
            }
            case FrameKind::Literal: {
                uint16_t lo = f.lo, hi = f.hi;
                narrow(n.candidates, lo, hi, f.count, b);
                if (lo < hi) {
                    f.lo = lo;
                    f.hi = hi;
                    ++f.count;
                    if (hi - lo == 1 && n.candidates[lo].size() == f.count) {
                        emit(pop(s), out);
                    } else {
                        out.push_back(s);
                    }
                    return;
                }
                if (n.candidates[f.lo].size() != f.count) return;
                s = pop(s);  // a whole candidate (a number that a longer one extends): its parent reads b
                continue;
            }
            case FrameKind::Sequence: {
                if (f.count < n.children.size()) {
                    const uint32_t child = n.children[f.count++];
                    start_value(child, s, b, out);
                    return;
                }
                s = pop(s);
                continue;
            }
            case FrameKind::Dispatch: {
                if (f.phase == kDispMatch) {
                    uint16_t lo = f.lo, hi = f.hi;
                    narrow(n.candidates, lo, hi, f.count, b);
                    if (lo == hi) return;
                    f.lo = lo;
                    f.hi = hi;
                    ++f.count;
                    if (hi - lo == 1 && n.candidates[lo].size() == f.count) {  // candidates are prefix-free
                        f.phase = kDispMatched;
                        f.value_node = n.children[lo];
                    }
                    out.push_back(s);
                    return;
                }
                if (f.phase == kDispMatched) {
                    f.phase = kDispRunning;
                    start_value(f.value_node, s, b, out);
                    return;
                }
                s = pop(s);
                continue;
            }
            case FrameKind::XmlParams: {
                if (f.phase == kXmlMatched) {
                    set_phase(f, kXmlBetween);
                    start_value(f.value_node, s, b, out);
                    return;
                }
                uint16_t lo = f.lo, hi = f.hi;
                if (f.phase == kXmlBetween) {
                    if ((n.required_mask & ~f.seen) == 0) step(pop(s), b, out);  // or the parameters end here
                    lo = 0;
                    hi = static_cast<uint16_t>(n.keys.size());
                    f.count = 0;
                }
                narrow(n.keys, lo, hi, f.count, b);
                if (lo == hi || (range_bits(lo, hi) & n.allowed_mask & ~f.seen) == 0) return;
                f.phase = kXmlKey;
                f.lo = lo;
                f.hi = hi;
                ++f.count;
                if (hi - lo == 1 && n.keys[lo].size() == f.count) {  // keys end in ">\n": prefix-free
                    f.seen |= uint64_t{1} << lo;
                    f.value_node = n.key_nodes[lo];
                    f.phase = kXmlMatched;
                }
                out.push_back(s);
                return;
            }
            case FrameKind::RawText: {
                if (f.text.utf8_left > 0 || b >= 0x80) {
                    if (text_step(f.text, b, false) == TextStep::Reject) return;
                } else if (b < 0x20 && b != '\n' && b != '\r' && b != '\t') {
                    return;
                }
                f.count = n.dfa[f.count * 256 + b];
                if (f.count == n.candidates[0].size()) {
                    emit(pop(s), out);
                } else {
                    out.push_back(s);
                }
                return;
            }
        }
        STRATA_ASSERT(false);
    }
}

bool Stepper::accepts_end(Stack s) const {
    for (;;) {
        const Frame& f = s.top;
        const Node& n = g_.nodes[f.node];
        switch (f.kind) {
            case FrameKind::Root:
                return f.phase == 1;
            case FrameKind::Number:
                if (f.phase != kNumZero && f.phase != kNumInt && f.phase != kNumFrac && f.phase != kNumExp)
                    return false;
                break;
            case FrameKind::Literal:
                if (n.candidates[f.lo].size() != f.count) return false;
                break;
            case FrameKind::Sequence:
                if (f.count < n.children.size()) return false;
                break;
            case FrameKind::Dispatch:
                if (f.phase != kDispRunning) return false;
                break;
            case FrameKind::XmlParams:
                if (f.phase != kXmlBetween || (n.required_mask & ~f.seen) != 0) return false;
                break;
            default:
                return false;
        }
        s = pop(s);
    }
}

bool Stepper::in_open_string(const Stack& s) const {
    if (s.top.kind == FrameKind::RawText) return s.top.count == 0 && s.top.text.clean();  // plain text has no LF
    return s.top.kind == FrameKind::String && s.top.text.clean() && g_.nodes[s.top.node].max_length == UINT32_MAX;
}

void dedupe(std::vector<Stack>& stacks) {
    if (stacks.size() < 2) return;
    size_t kept = 0;
    for (size_t i = 0; i < stacks.size() && kept < kMaxAlternatives; ++i) {
        bool dup = false;
        for (size_t j = 0; j < kept && !dup; ++j) dup = stacks[j] == stacks[i];
        if (!dup) stacks[kept++] = stacks[i];
    }
    stacks.resize(kept);
}

}  // namespace strata::constraint
