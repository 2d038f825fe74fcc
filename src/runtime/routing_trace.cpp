#include "runtime/routing_trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/dtype.h"
#include "core/error.h"

namespace strata {

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'T', 'R', 'A', 'C', 'E'};
constexpr size_t kHeaderBytes = 32;
constexpr uint64_t kMaxTraceBytes = uint64_t{4} << 30;  // a bigger "trace" is a mistake

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> header_bytes(uint32_t n_layer, uint32_t n_expert, uint32_t k) {
    std::vector<uint8_t> h(kMagic, kMagic + 8);
    put_u32(h, kRoutingTraceVersion);
    put_u32(h, n_layer);
    put_u32(h, n_expert);
    put_u32(h, k);
    h.resize(kHeaderBytes, 0);
    return h;
}

uint32_t get_u32(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
           static_cast<uint32_t>(p[3]) << 24;
}

uint16_t get_u16(const uint8_t* p) {
    return static_cast<uint16_t>(p[0] | p[1] << 8);
}

}  // namespace

RoutingTraceWriter::RoutingTraceWriter(std::string path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "wb");
    if (!file_) throw Error("--routing-trace '" + path_ + "': " + std::strerror(errno));
    const std::vector<uint8_t> h = header_bytes(0, 0, 0);
    if (std::fwrite(h.data(), 1, h.size(), file_) != h.size()) failed_ = true;
}

RoutingTraceWriter::~RoutingTraceWriter() {
    try {
        close();
    } catch (const Error& e) {
        std::fprintf(stderr, "strata: %s\n", e.what());
    }
}

void RoutingTraceWriter::record(int64_t layer, int64_t n_expert, int64_t k, int64_t n_rows, const int32_t* ids,
                                const float* weights) {
    std::lock_guard lock(mutex_);
    if (!file_ || failed_ || n_rows <= 0) return;
    if (n_expert_ == 0) {
        n_expert_ = static_cast<uint32_t>(n_expert);
        k_ = static_cast<uint32_t>(k);
    }
    // One model writes a trace: every layer has the same router width and top-k in the architectures we run.
    STRATA_ASSERT(n_expert == n_expert_ && k == k_ && n_expert <= 65536 && layer >= 0 && layer < (int64_t{1} << 31));
    const size_t n = static_cast<size_t>(n_rows * k);
    buffer_.resize(4 + 2 * n);
    buffer_[0] = static_cast<uint16_t>(layer & 0xFFFF);
    buffer_[1] = static_cast<uint16_t>(layer >> 16);
    buffer_[2] = static_cast<uint16_t>(n_rows & 0xFFFF);
    buffer_[3] = static_cast<uint16_t>(n_rows >> 16);
    for (size_t i = 0; i < n; ++i) {
        buffer_[4 + i] = static_cast<uint16_t>(ids[i]);
        buffer_[4 + n + i] = f32_to_f16(weights[i]);
    }
    // The host is little-endian (x86-64, aarch64); the u16 words land in file order.
    if (std::fwrite(buffer_.data(), 2, buffer_.size(), file_) != buffer_.size()) failed_ = true;
    n_layer_ = std::max(n_layer_, static_cast<uint32_t>(layer + 1));
    if (layer == 0) layer0_rows_ += n_rows;
}

void RoutingTraceWriter::close() {
    std::lock_guard lock(mutex_);
    if (!file_) return;
    const std::vector<uint8_t> h = header_bytes(n_layer_, n_expert_, k_);
    if (std::fseek(file_, 0, SEEK_SET) != 0 || std::fwrite(h.data(), 1, h.size(), file_) != h.size()) failed_ = true;
    if (std::fclose(file_) != 0) failed_ = true;
    file_ = nullptr;
    if (failed_) throw Error("--routing-trace '" + path_ + "': write failed (disk full?)");
}

int64_t RoutingTraceWriter::tokens() const {
    std::lock_guard lock(mutex_);
    return layer0_rows_;
}

std::vector<uint8_t> encode_routing_trace(const RoutingTrace& t) {
    std::vector<uint8_t> out =
        header_bytes(static_cast<uint32_t>(t.n_layer), static_cast<uint32_t>(t.n_expert), static_cast<uint32_t>(t.k));
    for (int64_t l = 0; l < t.n_layer; ++l) {
        const auto& ids = t.ids[static_cast<size_t>(l)];
        if (ids.empty()) continue;
        put_u32(out, static_cast<uint32_t>(l));
        put_u32(out, static_cast<uint32_t>(ids.size() / static_cast<size_t>(t.k)));
        for (uint16_t id : ids) out.push_back(static_cast<uint8_t>(id)), out.push_back(static_cast<uint8_t>(id >> 8));
        for (size_t i = 0; i < ids.size(); ++i) {
            const float w = t.weights.size() > static_cast<size_t>(l) && t.weights[static_cast<size_t>(l)].size() > i
                                ? t.weights[static_cast<size_t>(l)][i]
                                : 0.0f;
            const uint16_t h = f32_to_f16(w);
            out.push_back(static_cast<uint8_t>(h));
            out.push_back(static_cast<uint8_t>(h >> 8));
        }
    }
    return out;
}

RoutingTrace read_routing_trace(const std::string& path) {
    const std::string what = "routing trace '" + path + "'";
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(what + ": " + std::strerror(errno));
    in.seekg(0, std::ios::end);
    const auto size = static_cast<uint64_t>(in.tellg());
    if (size > kMaxTraceBytes) throw Error(what + ": larger than 4 GiB; not a trace this build reads");
    in.seekg(0);
    std::vector<uint8_t> bytes(static_cast<size_t>(size));
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
    if (!in) throw Error(what + ": read error");

    if (size < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0)
        throw Error(what + ": not a Strata routing trace (no STRTRACE header)");
    const uint8_t* p = bytes.data();
    const uint32_t version = get_u32(p + 8);
    if (version != kRoutingTraceVersion)
        throw Error(what + ": version " + std::to_string(version) + " is not supported (this build reads version " +
                    std::to_string(kRoutingTraceVersion) + ")");
    RoutingTrace t;
    t.n_layer = get_u32(p + 12);
    t.n_expert = get_u32(p + 16);
    t.k = get_u32(p + 20);
    if (t.n_layer == 0)
        throw Error(what + ": no layers in the header (empty, or the run that wrote it did not finish)");
    if (t.n_expert < 1 || t.n_expert > 65536 || t.k < 1 || t.k > t.n_expert)
        throw Error(what + ": header says " + std::to_string(t.n_expert) + " experts, " + std::to_string(t.k) +
                    " per token (need 1 <= k <= experts <= 65536)");
    if (t.n_layer > 100000) throw Error(what + ": header says " + std::to_string(t.n_layer) + " layers");
    t.ids.resize(static_cast<size_t>(t.n_layer));
    t.weights.resize(static_cast<size_t>(t.n_layer));
    std::vector<int64_t> stamp(static_cast<size_t>(t.n_expert), -1);  // row that last named an expert
    int64_t row_serial = 0;
    for (uint64_t at = kHeaderBytes; at < size;) {
        const std::string where = " at byte " + std::to_string(at);
        if (size - at < 8) throw Error(what + ": truncated record" + where);
        const uint32_t layer = get_u32(p + at), n_rows = get_u32(p + at + 4);
        if (layer >= t.n_layer)
            throw Error(what + ": record" + where + " names layer " + std::to_string(layer) + " of " +
                        std::to_string(t.n_layer));
        if (n_rows == 0) throw Error(what + ": record" + where + " has no rows");
        const uint64_t n = static_cast<uint64_t>(n_rows) * static_cast<uint64_t>(t.k);
        if ((size - at - 8) / 4 < n) throw Error(what + ": truncated record" + where);
        const uint8_t* ids = p + at + 8;
        const uint8_t* weights = ids + 2 * n;
        auto& out_ids = t.ids[layer];
        auto& out_w = t.weights[layer];
        for (uint64_t r = 0; r < n_rows; ++r, ++row_serial) {
            for (int64_t j = 0; j < t.k; ++j) {
                const uint64_t i = r * static_cast<uint64_t>(t.k) + static_cast<uint64_t>(j);
                const uint16_t e = get_u16(ids + 2 * i);
                if (e >= t.n_expert)
                    throw Error(what + ": record" + where + " names expert " + std::to_string(e) + " of " +
                                std::to_string(t.n_expert));
                if (stamp[e] == row_serial)
                    throw Error(what + ": record" + where + " routes one token to expert " + std::to_string(e) +
                                " twice");
                stamp[e] = row_serial;
                const float w = f16_to_f32(get_u16(weights + 2 * i));
                if (!std::isfinite(w)) throw Error(what + ": record" + where + " has a weight that is not finite");
                out_ids.push_back(e);
                out_w.push_back(w);
            }
        }
        at += 8 + 4 * n;
    }
    return t;
}

}  // namespace strata
