#include "runtime/expert_profile.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace strata {

namespace {

constexpr const char* kMagic = "strata-expert-profile 1";
constexpr int64_t kMaxLayers = 4096, kMaxExperts = 65536;

// A whole decimal integer in [0, max] from text[begin, end); false on anything else.
bool parse_count(const std::string& text, size_t begin, size_t end, uint64_t max, uint64_t* out) {
    if (begin >= end || end - begin > 19) return false;
    uint64_t v = 0;
    for (size_t i = begin; i < end; ++i) {
        if (text[i] < '0' || text[i] > '9') return false;
        v = v * 10 + static_cast<uint64_t>(text[i] - '0');
    }
    if (end - begin > 1 && text[begin] == '0') return false;  // one spelling per number
    if (v > max) return false;
    *out = v;
    return true;
}

}  // namespace

ExpertProfile profile_from_trace(const RoutingTrace& trace) {
    ExpertProfile p{.n_layer = trace.n_layer, .n_expert = trace.n_expert};
    p.counts.assign(static_cast<size_t>(trace.n_layer), std::vector<uint64_t>(static_cast<size_t>(trace.n_expert), 0));
    for (int64_t l = 0; l < trace.n_layer; ++l)
        for (const uint16_t e : trace.ids[static_cast<size_t>(l)]) ++p.counts[static_cast<size_t>(l)][e];
    return p;
}

std::string encode_expert_profile(const ExpertProfile& p) {
    STRATA_ASSERT(p.n_layer >= 1 && p.n_expert >= 1 && static_cast<int64_t>(p.counts.size()) == p.n_layer);
    std::ostringstream out;
    out << kMagic << "\nlayers " << p.n_layer << " experts " << p.n_expert << "\n";
    for (int64_t l = 0; l < p.n_layer; ++l) {
        const std::vector<uint64_t>& c = p.counts[static_cast<size_t>(l)];
        STRATA_ASSERT(static_cast<int64_t>(c.size()) == p.n_expert);
        out << l << ':';
        for (const uint64_t v : c) out << ' ' << v;
        out << '\n';
    }
    return out.str();
}

ExpertProfile parse_expert_profile(const std::string& text, const std::string& name) {
    int64_t line_no = 0;
    size_t pos = 0;
    auto bad = [&](const std::string& what) {
        return Error("expert profile '" + name + "' line " + std::to_string(line_no) + ": " + what);
    };
    // The next line without its "\n"; Error at the end of the text or on a last line without one.
    auto next_line = [&](const char* expected) {
        ++line_no;
        if (pos >= text.size()) throw bad(std::string("the file ends; expected ") + expected);
        const size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) throw bad("the last line does not end in a newline");
        std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        return line;
    };
    if (next_line("the header") != kMagic)
        throw bad(std::string("not an expert profile (expected the header '") + kMagic + "')");

    const std::string dims = next_line("'layers N experts E'");
    uint64_t n_layer = 0, n_expert = 0;
    {
        const size_t a = dims.find(' ', 7), b = a == std::string::npos ? a : dims.find(' ', a + 1);
        const bool ok = dims.rfind("layers ", 0) == 0 && a != std::string::npos && b != std::string::npos &&
                        dims.compare(a, 9, " experts ") == 0 && parse_count(dims, 7, a, kMaxLayers, &n_layer) &&
                        parse_count(dims, a + 9, dims.size(), kMaxExperts, &n_expert) && n_layer >= 1 && n_expert >= 1;
        if (!ok)
            throw bad("expected 'layers N experts E' with 1 <= N <= " + std::to_string(kMaxLayers) +
                      " and 1 <= E <= " + std::to_string(kMaxExperts) + ", got '" + dims.substr(0, 80) + "'");
    }
    ExpertProfile p{.n_layer = static_cast<int64_t>(n_layer), .n_expert = static_cast<int64_t>(n_expert)};
    p.counts.resize(static_cast<size_t>(n_layer));
    constexpr uint64_t kMaxCount = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    for (int64_t l = 0; l < p.n_layer; ++l) {
        const std::string line = next_line(("layer " + std::to_string(l)).c_str());
        const std::string prefix = std::to_string(l) + ":";
        if (line.rfind(prefix, 0) != 0) throw bad("expected layer " + std::to_string(l) + " ('" + prefix + " ...')");
        std::vector<uint64_t>& c = p.counts[static_cast<size_t>(l)];
        c.reserve(static_cast<size_t>(n_expert));
        size_t at = prefix.size();
        while (at < line.size()) {
            if (line[at] != ' ') throw bad("counts are separated by single spaces");
            const size_t end = std::min(line.find(' ', at + 1), line.size());
            uint64_t v = 0;
            if (!parse_count(line, at + 1, end, kMaxCount, &v))
                throw bad("count " + std::to_string(c.size()) + " of layer " + std::to_string(l) +
                          " is not a whole number from 0 to 2^63-1: '" +
                          line.substr(at + 1, std::min<size_t>(end - at - 1, 40)) + "'");
            if (c.size() == n_expert)
                throw bad("layer " + std::to_string(l) + " has more than " + std::to_string(n_expert) + " counts");
            c.push_back(v);
            at = end;
        }
        if (c.size() != n_expert)
            throw bad("layer " + std::to_string(l) + " has " + std::to_string(c.size()) + " counts, expected " +
                      std::to_string(n_expert));
    }
    if (pos != text.size()) {
        ++line_no;
        throw bad("unexpected text after the last layer");
    }
    return p;
}

void write_expert_profile(const std::string& path, const ExpertProfile& profile) {
    const std::string text = encode_expert_profile(profile);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error("cannot write expert profile '" + path + "'");
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) throw Error("cannot write expert profile '" + path + "' (disk full?)");
}

ExpertProfile read_expert_profile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot read expert profile '" + path + "'");
    std::ostringstream buffer;
    buffer << in.rdbuf();
    if (in.bad()) throw Error("cannot read expert profile '" + path + "'");
    return parse_expert_profile(buffer.str(), path);
}

std::vector<std::vector<int32_t>> warm_experts(const ExpertProfile& profile, std::span<const int64_t> slots) {
    std::vector<std::vector<int32_t>> warm(slots.size());
    for (size_t l = 0; l < slots.size() && static_cast<int64_t>(l) < profile.n_layer; ++l) {
        const std::vector<uint64_t>& c = profile.counts[l];
        std::vector<int32_t> order;
        for (int32_t e = 0; e < static_cast<int32_t>(c.size()); ++e)
            if (c[static_cast<size_t>(e)] > 0) order.push_back(e);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return c[static_cast<size_t>(a)] > c[static_cast<size_t>(b)]; });
        order.resize(static_cast<size_t>(std::clamp<int64_t>(slots[l], 0, static_cast<int64_t>(order.size()))));
        warm[l] = std::move(order);
    }
    return warm;
}

}  // namespace strata
