// TokenConstraint over a grammar: mask() walks a byte trie of the vocabulary depth first, stepping the recognizer one
// byte per trie edge, so bytes that tokens share are stepped once and a dead prefix cuts off its whole subtree.
#include "runtime/token_constraint.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <string_view>

#include "core/error.h"
#include "runtime/json_schema_recognizer.h"

namespace strata {

namespace {

using namespace constraint;

// The vocabulary as a trie laid out in pre-order: a subtree is a contiguous range of nodes, and the tokens of a
// subtree a contiguous range of token_order.
struct TrieNode {
    uint32_t subtree_end = 0;  // first node after this subtree
    uint32_t tok_begin = 0;    // tokens ending here: token_order[tok_begin, tok_end)
    uint32_t tok_end = 0;
    uint32_t subtree_tok_end = 0;  // tokens of the subtree: token_order[tok_begin, subtree_tok_end)
    uint16_t depth = 0;
    uint8_t byte = 0;
    // Every token of the subtree is, from this node's byte to its end, plain string text (see plain_suffixes): inside
    // an open string all of them are allowed without stepping.
    uint8_t plain = 1;
};

struct VocabularyTrie {
    std::vector<TrieNode> nodes;  // nodes[0]: the root (no byte)
    std::vector<int32_t> token_order;
    std::vector<uint8_t> is_end;     // per token id
    std::vector<int32_t> untracked;  // ids not in the trie: end tokens, tokens without bytes (never allowed)
    size_t max_depth = 0;
};

// plain[i]: bytes[i..] can follow inside an open string: plain characters (no quote, backslash or control byte), the
// last one possibly cut short (a token may end inside a UTF-8 sequence; the next token must finish it).
std::vector<uint8_t> plain_suffixes(std::string_view bytes) {
    std::vector<uint8_t> plain(bytes.size() + 1, 0);
    plain[bytes.size()] = 1;
    for (size_t i = bytes.size(); i-- > 0;) {
        TextState t;
        size_t j = i;
        TextStep r = TextStep::Partial;
        while (j < bytes.size() && r == TextStep::Partial) r = text_step(t, static_cast<uint8_t>(bytes[j++]), false);
        plain[i] = r == TextStep::Partial || (r == TextStep::Char && plain[j]);
    }
    return plain;
}

std::shared_ptr<const VocabularyTrie> build_trie(const ConstraintVocabulary& vocab) {
    auto trie = std::make_shared<VocabularyTrie>();
    const size_t n_vocab = vocab.token_bytes.size();
    trie->is_end.assign(n_vocab, 0);
    for (int32_t id : vocab.end_tokens)
        if (id >= 0 && static_cast<size_t>(id) < n_vocab) trie->is_end[static_cast<size_t>(id)] = 1;
    std::vector<int32_t> ids;
    for (size_t id = 0; id < n_vocab; ++id) {
        const size_t len = vocab.token_bytes[id].size();
        if (len > 0 && len <= UINT16_MAX && !trie->is_end[id]) {
            ids.push_back(static_cast<int32_t>(id));
        } else {
            trie->untracked.push_back(static_cast<int32_t>(id));
        }
    }
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
        const std::string& x = vocab.token_bytes[static_cast<size_t>(a)];
        const std::string& y = vocab.token_bytes[static_cast<size_t>(b)];
        const int c = x.compare(y);
        return c != 0 ? c < 0 : a < b;
    });
    std::vector<TrieNode>& nodes = trie->nodes;
    std::vector<uint32_t> path = {0};  // path[d]: the node at depth d of the previous token
    nodes.push_back(TrieNode{});
    auto close = [&](uint32_t node) {
        nodes[node].subtree_end = static_cast<uint32_t>(nodes.size());
        nodes[node].subtree_tok_end = static_cast<uint32_t>(trie->token_order.size());
    };
    std::string_view prev;
    for (int32_t id : ids) {
        const std::string_view t = vocab.token_bytes[static_cast<size_t>(id)];
        size_t lcp = 0;
        while (lcp < prev.size() && lcp < t.size() && prev[lcp] == t[lcp]) ++lcp;
        while (path.size() > lcp + 1) {
            close(path.back());
            path.pop_back();
        }
        for (size_t d = lcp + 1; d <= t.size(); ++d) {
            TrieNode node;
            node.depth = static_cast<uint16_t>(d);
            node.byte = static_cast<uint8_t>(t[d - 1]);
            node.tok_begin = node.tok_end = static_cast<uint32_t>(trie->token_order.size());
            path.push_back(static_cast<uint32_t>(nodes.size()));
            nodes.push_back(node);
        }
        trie->token_order.push_back(id);
        nodes[path.back()].tok_end = static_cast<uint32_t>(trie->token_order.size());
        const std::vector<uint8_t> plain = plain_suffixes(t);
        for (size_t d = 1; d <= t.size(); ++d) nodes[path[d]].plain &= plain[d - 1];
        trie->max_depth = std::max(trie->max_depth, t.size());
        prev = t;
    }
    while (!path.empty()) {
        close(path.back());
        path.pop_back();
    }
    return trie;
}

// One trie per vocabulary object, shared by every constraint built on it (150k tokens take ~0.1 s to index).
std::shared_ptr<const VocabularyTrie> trie_for(const std::shared_ptr<const ConstraintVocabulary>& vocab) {
    static std::mutex mutex;
    static std::vector<std::pair<std::weak_ptr<const ConstraintVocabulary>, std::shared_ptr<const VocabularyTrie>>>
        cache;
    std::lock_guard<std::mutex> lock(mutex);
    std::erase_if(cache, [](const auto& entry) { return entry.first.expired(); });
    for (const auto& [owner, trie] : cache)
        if (!owner.owner_before(vocab) && !vocab.owner_before(owner)) return trie;
    auto trie = build_trie(*vocab);
    cache.emplace_back(vocab, trie);
    return trie;
}

class GrammarConstraint final : public TokenConstraint {
  public:
    GrammarConstraint(std::shared_ptr<const ConstraintVocabulary> vocab, std::shared_ptr<const Grammar> grammar)
        : vocab_(std::move(vocab)), trie_(trie_for(vocab_)), grammar_(std::move(grammar)) {
        stacks_.push_back(Stepper::initial(*grammar_));
    }

    GrammarConstraint(const GrammarConstraint& other)
        : vocab_(other.vocab_),
          trie_(other.trie_),
          grammar_(other.grammar_),
          stacks_(other.stacks_),
          arena_(other.arena_),
          live_links_(other.live_links_),
          ended_(other.ended_) {}

    void mask(std::span<float> logits) const override;
    void accept(int32_t token) override;
    bool complete() const override;
    bool must_end() const override;
    std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<GrammarConstraint>(*this); }

  private:
    // Steps `stacks` by the bytes (new links appended to arena_); false when some byte cannot come next.
    bool advance(std::vector<Stack>& stacks, std::string_view bytes) const;
    void compact();

    std::shared_ptr<const ConstraintVocabulary> vocab_;
    std::shared_ptr<const VocabularyTrie> trie_;
    std::shared_ptr<const Grammar> grammar_;
    std::vector<Stack> stacks_;  // the state after the accepted text
    // Their parents. Const members append scratch links past the accepted state's and cut them off before returning
    // (ArenaMark), so the accepted state's links are never copied per mask().
    mutable std::vector<Link> arena_;
    size_t live_links_ = 0;  // arena size after the last compaction
    bool ended_ = false;     // an end token was accepted

    // Scratch for mask() (not copied by clone()).
    mutable std::vector<std::vector<Stack>> levels_;  // levels_[d]: the state after the first d bytes of the path
    mutable std::vector<size_t> arena_marks_;         // arena size once levels_[d] was computed
    mutable std::vector<uint8_t> open_string_;        // every stack of levels_[d] is inside an open string
    mutable std::vector<std::pair<uint32_t, uint32_t>> allowed_;  // ranges of trie.token_order, in order
    mutable std::vector<std::pair<int32_t, float>> kept_;         // logits of allowed tokens, while banning all
};

// Plain text keeps every one of these stacks alive.
bool all_in_open_string(const Stepper& stepper, const std::vector<Stack>& stacks) {
    for (const Stack& s : stacks)
        if (!stepper.in_open_string(s)) return false;
    return !stacks.empty();
}

// Restores the arena's length on scope exit.
class ArenaMark {
  public:
    explicit ArenaMark(std::vector<Link>& arena) : arena_(arena), size_(arena.size()) {}
    ~ArenaMark() { arena_.resize(size_); }
    ArenaMark(const ArenaMark&) = delete;
    ArenaMark& operator=(const ArenaMark&) = delete;

  private:
    std::vector<Link>& arena_;
    size_t size_;
};

bool GrammarConstraint::advance(std::vector<Stack>& stacks, std::string_view bytes) const {
    Stepper stepper(*grammar_, arena_);
    std::vector<Stack> next;
    for (char c : bytes) {
        next.clear();
        for (const Stack& s : stacks) stepper.step(s, static_cast<uint8_t>(c), next);
        dedupe(next);
        stacks.swap(next);
        if (stacks.empty()) return false;
    }
    return true;
}

void GrammarConstraint::mask(std::span<float> logits) const {
    constexpr float kBanned = -std::numeric_limits<float>::infinity();
    const VocabularyTrie& trie = *trie_;
    const bool is_complete = complete();
    allowed_.clear();
    size_t n_allowed = 0;
    auto allow = [&](uint32_t begin, uint32_t end) {
        if (begin == end) return;
        if (!allowed_.empty() && allowed_.back().second == begin) {
            allowed_.back().second = end;
        } else {
            allowed_.emplace_back(begin, end);
        }
        n_allowed += end - begin;
    };
    if (!ended_) {
        levels_.resize(trie.max_depth + 1);
        arena_marks_.resize(trie.max_depth + 1);
        open_string_.resize(trie.max_depth + 1);
        const ArenaMark mark(arena_);
        Stepper stepper(*grammar_, arena_);
        levels_[0] = stacks_;
        arena_marks_[0] = arena_.size();
        open_string_[0] = all_in_open_string(stepper, stacks_);
        const std::vector<TrieNode>& nodes = trie.nodes;
        size_t i = 1;
        while (i < nodes.size()) {
            const TrieNode& node = nodes[i];
            const size_t d = node.depth;
            if (open_string_[d - 1] && node.plain) {  // plain text inside a string: the whole subtree is allowed
                allow(node.tok_begin, node.subtree_tok_end);
                i = node.subtree_end;
                continue;
            }
            arena_.resize(arena_marks_[d - 1]);
            std::vector<Stack>& level = levels_[d];
            level.clear();
            for (const Stack& s : levels_[d - 1]) stepper.step(s, node.byte, level);
            if (level.empty()) {
                i = node.subtree_end;
                continue;
            }
            dedupe(level);
            arena_marks_[d] = arena_.size();
            open_string_[d] = all_in_open_string(stepper, level);
            allow(node.tok_begin, node.tok_end);
            ++i;
        }
    }
    // Write -infinity over whichever side is smaller: the allowed tokens are saved, the row filled and they are put
    // back; or the banned ones (the gaps between allowed ranges, plus the tokens outside the trie) are written.
    const size_t n = logits.size();
    const std::vector<int32_t>& order = trie.token_order;
    if (n_allowed * 2 < order.size()) {
        kept_.clear();
        for (const auto& [begin, end] : allowed_)
            for (uint32_t k = begin; k < end; ++k)
                if (static_cast<size_t>(order[k]) < n)
                    kept_.emplace_back(order[k], logits[static_cast<size_t>(order[k])]);
        if (is_complete)
            for (int32_t id : vocab_->end_tokens)
                if (id >= 0 && static_cast<size_t>(id) < std::min(n, trie.is_end.size()))
                    kept_.emplace_back(id, logits[static_cast<size_t>(id)]);
        std::fill(logits.begin(), logits.end(), kBanned);
        for (const auto& [id, value] : kept_) logits[static_cast<size_t>(id)] = value;
        return;
    }
    auto ban = [&](uint32_t begin, uint32_t end) {
        for (uint32_t k = begin; k < end; ++k)
            if (static_cast<size_t>(order[k]) < n) logits[static_cast<size_t>(order[k])] = kBanned;
    };
    uint32_t from = 0;
    for (const auto& [begin, end] : allowed_) {
        ban(from, begin);
        from = end;
    }
    ban(from, static_cast<uint32_t>(order.size()));
    for (int32_t id : trie.untracked)
        if (static_cast<size_t>(id) < n && !(is_complete && trie.is_end[static_cast<size_t>(id)]))
            logits[static_cast<size_t>(id)] = kBanned;
    for (size_t id = trie.is_end.size(); id < n; ++id) logits[id] = kBanned;
}

void GrammarConstraint::accept(int32_t token) {
    const size_t n_vocab = vocab_->token_bytes.size();
    if (token < 0 || static_cast<size_t>(token) >= n_vocab)
        throw Error("constrained decoding: token " + std::to_string(token) + " is outside the vocabulary");
    if (trie_->is_end[static_cast<size_t>(token)]) {
        if (!complete())
            throw Error("constrained decoding: end token " + std::to_string(token) + " before the output is complete");
        ended_ = true;
        return;
    }
    const std::string& bytes = vocab_->token_bytes[static_cast<size_t>(token)];
    if (ended_ || bytes.empty())
        throw Error("constrained decoding: token " + std::to_string(token) + " is not allowed here");
    std::vector<Stack> stacks = stacks_;
    const size_t mark = arena_.size();
    if (!advance(stacks, bytes)) {
        arena_.resize(mark);
        throw Error("constrained decoding: token " + std::to_string(token) + " is not allowed here");
    }
    stacks_ = std::move(stacks);
    // Pops leave unreferenced links behind; collect them once they outnumber the live ones (amortized O(1)).
    if (arena_.size() > 4 * live_links_ + 256) compact();
}

// Copies each stack's chain of parents into a fresh arena, dropping links nothing refers to any more.
void GrammarConstraint::compact() {
    std::vector<Link> fresh;
    std::vector<int32_t> chain;
    for (Stack& s : stacks_) {
        chain.clear();
        for (int32_t p = s.parent; p >= 0; p = arena_[static_cast<size_t>(p)].parent) chain.push_back(p);
        int32_t parent = -1;
        for (size_t k = chain.size(); k-- > 0;) {
            fresh.push_back(Link{arena_[static_cast<size_t>(chain[k])].frame, parent});
            parent = static_cast<int32_t>(fresh.size() - 1);
        }
        s.parent = parent;
    }
    arena_ = std::move(fresh);
    live_links_ = arena_.size();
}

bool GrammarConstraint::complete() const {
    if (ended_) return true;
    const Stepper stepper(*grammar_, arena_);
    for (const Stack& s : stacks_)
        if (stepper.accepts_end(s)) return true;
    return false;
}

bool GrammarConstraint::must_end() const {
    if (ended_) return true;
    if (!complete()) return false;
    const ArenaMark mark(arena_);
    Stepper stepper(*grammar_, arena_);
    std::vector<Stack> next;
    for (int b = 0; b < 256; ++b) {
        for (const Stack& s : stacks_) stepper.step(s, static_cast<uint8_t>(b), next);
        if (!next.empty()) return false;
    }
    return true;
}

void check_vocabulary(const std::shared_ptr<const ConstraintVocabulary>& vocab) {
    if (!vocab) throw Error("constrained decoding needs a vocabulary");
}

}  // namespace

std::unique_ptr<TokenConstraint> make_json_schema_constraint(std::shared_ptr<const ConstraintVocabulary> vocab,
                                                             const nlohmann::json& schema) {
    check_vocabulary(vocab);
    auto grammar = std::make_shared<const Grammar>(compile_json_schema(schema));
    return std::make_unique<GrammarConstraint>(std::move(vocab), std::move(grammar));
}

std::unique_ptr<TokenConstraint> make_tool_call_constraint(std::shared_ptr<const ConstraintVocabulary> vocab,
                                                           const nlohmann::json& tools,
                                                           std::optional<std::string> forced_name,
                                                           bool allow_parallel) {
    check_vocabulary(vocab);
    auto grammar = std::make_shared<const Grammar>(compile_tool_calls(tools, forced_name, allow_parallel));
    return std::make_unique<GrammarConstraint>(std::move(vocab), std::move(grammar));
}

std::unique_ptr<TokenConstraint> make_xml_tool_call_constraint(std::shared_ptr<const ConstraintVocabulary> vocab,
                                                               const nlohmann::json& tools,
                                                               std::optional<std::string> forced_name,
                                                               bool allow_parallel) {
    check_vocabulary(vocab);
    auto grammar = std::make_shared<const Grammar>(compile_xml_tool_calls(tools, forced_name, allow_parallel));
    return std::make_unique<GrammarConstraint>(std::move(vocab), std::move(grammar));
}

}  // namespace strata
