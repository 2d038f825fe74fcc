// Byte-level pushdown recognizer over a constraint::Grammar. A state is a small set of stacks (more than one only
// while anyOf alternatives that start alike are still undecided); a stack is its top Frame held by value plus an index
// of its parent in an arena of Links, so that copying a state, and stepping it by one byte, costs a few dozen bytes
// whatever the nesting depth. Links are never modified once written: a push appends, a pop reads.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "runtime/json_schema_grammar.h"

namespace strata::constraint {

// Inside a JSON string: progress through a UTF-8 sequence or an escape.
struct TextState {
    uint8_t utf8_left = 0;   // continuation bytes still to come
    uint8_t utf8_lo = 0x80;  // range of the next continuation byte
    uint8_t utf8_hi = 0xbf;
    uint8_t escape = 0;     // 0: none; 1: after '\'; 2..5: reading hex digit escape-2 of \uXXXX
    uint8_t surrogate = 0;  // 1: high surrogate read, '\' must follow; 2: 'u' must follow; 3: reading the low one
    uint16_t hex = 0;
    bool clean() const { return utf8_left == 0 && escape == 0 && surrogate == 0; }
    bool operator==(const TextState&) const = default;
};

enum class TextStep : uint8_t { Reject, Close, Partial, Char };
// One byte of string content; Char when it completes a code point, Close for the closing quote.
TextStep text_step(TextState& t, uint8_t b, bool allow_escapes);

enum class FrameKind : uint8_t { Root, Object, Array, String, Number, Literal, Sequence, Dispatch, XmlParams, RawText };

struct Frame {
    uint32_t node = 0;
    FrameKind kind = FrameKind::Root;
    uint8_t phase = 0;
    uint8_t ws = 0;          // whitespace bytes in the current run
    uint8_t ws_newline = 0;  // 1: the run began with LF (an indent may follow)
    uint32_t count = 0;      // array items, string code points, digits, or position in a literal/key
    uint16_t lo = 0;         // candidates (literal, dispatch, object keys) still matching: [lo, hi)
    uint16_t hi = 0;
    uint32_t value_node = 0;  // object: schema of the value after the current key; dispatch: the chosen child
    TextState text;           // string content, or an object key that is not a declared name
    uint8_t free_key = 0;     // object key: may still be an undeclared (additional) key
    uint8_t depth = 0;        // objects and arrays open around and including this frame (at most 255)
    uint64_t seen = 0;        // object: declared keys already written
    bool operator==(const Frame&) const = default;
};

struct Link {
    Frame frame;
    int32_t parent;
};

struct Stack {
    Frame top;
    int32_t parent = -1;  // index into the arena, -1: none
    bool operator==(const Stack&) const = default;
};

// Stacks kept per state. More arise only from anyOf alternatives that nest and start alike; the ones past the limit
// are dropped (the language shrinks, every kept stack can still finish), which bounds the cost of one step.
inline constexpr size_t kMaxAlternatives = 32;

class Stepper {
  public:
    Stepper(const Grammar& grammar, std::vector<Link>& arena) : g_(grammar), arena_(arena) {}

    static Stack initial(const Grammar& grammar);
    // Appends to `out` every stack that `s` becomes after byte b (none: b cannot come next).
    void step(Stack s, uint8_t b, std::vector<Stack>& out);
    // The text may end here.
    bool accepts_end(Stack s) const;
    // True when s's top is a string body (or raw XML text) in which any plain text may come next (no length limit,
    // not inside a character, escape or terminator).
    bool in_open_string(const Stack& s) const;

  private:
    void start_value(uint32_t node, const Stack& parent, uint8_t b, std::vector<Stack>& out);
    void object_key(Stack& s, uint8_t b, std::vector<Stack>& out);
    Stack push(const Stack& s, const Frame& child);
    Stack pop(const Stack& s) const;
    void emit(Stack s, std::vector<Stack>& out) const;

    const Grammar& g_;
    std::vector<Link>& arena_;
};

// Sorts out duplicates and keeps at most kMaxAlternatives.
void dedupe(std::vector<Stack>& stacks);

}  // namespace strata::constraint
