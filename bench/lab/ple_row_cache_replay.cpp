// PLE row cache policies replayed on a token stream (runtime/ple_row_reader.h; notes in bench/notes/ple-rows.md).
// A token reads one row per head (16 for Flash-Next); the rows are Flash-Next's hash of the token and its two
// predecessors, so which rows recur depends only on the text. Prints the hit rate of set-associative LRU caches with
// 1, 4, 8 and 16 ways and of a fully associative LRU at several sizes, and the ceiling (rows seen before).
//
// Build against a CPU build's libraries (B: the build folder) and run with a model that carries Flash-Next's PLE keys
// (a shapes-only synth is enough) and a token id file (strata tokenize):
//   g++ -std=c++20 -O2 -Isrc bench/lab/ple_row_cache_replay.cpp -o /tmp/ple_replay B/libstrata_model.a
//       B/libstrata_format.a B/libstrata_backend_cpu.a B/libstrata_core.a -pthread   (one line)
//   strata synth --preset flash-next --out /tmp/fn.gguf --shapes-only
//   strata tokenize --model assets/strata-code-19m.gguf --text-file TEXT > /tmp/ids.txt
//   /tmp/ple_replay /tmp/fn.gguf /tmp/ids.txt
#include <cstdio>
#include <fstream>
#include <list>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "format/gguf.h"
#include "model/ple.h"

using namespace strata;

namespace {

// The reader's cache: sets of `ways` rows, LRU within a set, the same set index.
struct SetLru {
    int64_t sets, ways;
    std::vector<int64_t> tag;
    std::vector<uint64_t> stamp;
    uint64_t clock = 0;
    int64_t hits = 0, n = 0;
    SetLru(int64_t rows, int64_t w) : sets(rows / w), ways(w), tag(size_t(rows), -1), stamp(size_t(rows), 0) {}
    void access(int64_t row) {
        ++n;
        const size_t base = size_t((uint64_t(row) * 0x9E3779B97F4A7C15ull >> 17) % uint64_t(sets) * uint64_t(ways));
        size_t victim = base;
        for (size_t i = base; i < base + size_t(ways); ++i)
            if (tag[i] == row) {
                stamp[i] = ++clock;
                ++hits;
                return;
            }
        for (size_t i = base; i < base + size_t(ways); ++i) {
            if (tag[i] < 0) {
                victim = i;
                break;
            }
            if (stamp[i] < stamp[victim]) victim = i;
        }
        tag[victim] = row;
        stamp[victim] = ++clock;
    }
};

struct FullLru {
    size_t capacity;
    std::list<int64_t> order;
    std::unordered_map<int64_t, std::list<int64_t>::iterator> where;
    int64_t hits = 0, n = 0;
    explicit FullLru(size_t c) : capacity(c) {}
    void access(int64_t row) {
        ++n;
        if (auto it = where.find(row); it != where.end()) {
            ++hits;
            order.splice(order.begin(), order, it->second);
            return;
        }
        order.push_front(row);
        where[row] = order.begin();
        if (order.size() > capacity) {
            where.erase(order.back());
            order.pop_back();
        }
    }
};

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s MODEL.gguf TOKEN_IDS.txt\n", argv[0]);
        return 2;
    }
    const auto file = gguf::File::open(argv[1]);
    const std::string arch = file->get_str("general.architecture");
    PleShape s;
    s.ngram = file->get_u32(arch + ".ple.ngram_size");
    s.heads_per_ngram = file->get_u32(arch + ".ple.heads_per_ngram");
    s.eos = static_cast<int32_t>(file->get_u32(arch + ".ple.eos_token_id"));
    s.multipliers = file->get_u64_array(arch + ".ple.layer_multipliers");
    s.offsets = file->get_u64_array(arch + ".ple.head_offsets");
    s.sizes = file->get_u64_array(arch + ".ple.head_vocab_sizes");
    std::ifstream in(argv[2]);
    std::vector<int32_t> tokens;
    for (int32_t t; in >> t;) tokens.push_back(t);
    std::vector<int64_t> trace, rows(static_cast<size_t>(s.n_heads()));
    std::vector<int32_t> history(static_cast<size_t>(s.ngram - 1), s.eos);
    for (const int32_t token : tokens) {
        ple_rows_into(s, history.data(), token, rows.data());
        trace.insert(trace.end(), rows.begin(), rows.end());
        if (!history.empty()) {
            history.erase(history.begin());
            history.push_back(token);
        }
    }
    const std::unordered_set<int64_t> distinct(trace.begin(), trace.end());
    std::printf("%zu tokens, %zu row reads, %zu distinct rows: at most %.1f%% hits\n", tokens.size(), trace.size(),
                distinct.size(), 100.0 * (1.0 - double(distinct.size()) / double(trace.size())));
    for (const int64_t capacity : {int64_t{1} << 14, int64_t{1} << 16, int64_t{1} << 18, int64_t{1} << 20}) {
        std::printf("%8lld rows:", static_cast<long long>(capacity));
        for (const int64_t ways : {1, 4, 8, 16}) {
            SetLru c(capacity, ways);
            for (const int64_t r : trace) c.access(r);
            std::printf("  %lld-way %.1f%%", static_cast<long long>(ways), 100.0 * double(c.hits) / double(c.n));
        }
        FullLru full(static_cast<size_t>(capacity));
        for (const int64_t r : trace) full.access(r);
        std::printf("  full LRU %.1f%%\n", 100.0 * double(full.hits) / double(full.n));
    }
    return 0;
}
