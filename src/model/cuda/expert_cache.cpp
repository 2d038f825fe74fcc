#include "model/cuda/expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "format/gguf_names.h"
#include "model/binding.h"

namespace strata::cuda_model {

namespace {

// "blk.N.ffn_*_exps.weight" of a trunk block: a routed expert tensor.
bool is_routed_expert_tensor(const std::string& name, int64_t n_block) {
    if (name.rfind("blk.", 0) != 0 || name.find("_exps.") == std::string::npos) return false;
    if (name.find("shexp") != std::string::npos) return false;
    return !is_mtp_block_tensor(name, n_block);
}

}  // namespace

ExpertCache::ExpertCache(cuda::Context& ctx, const gguf::File& file, int64_t n_block, int64_t max_window_tokens,
                         const ExpertPlacement& placement, int64_t first_block)
    : ctx_(ctx), file_(file), placement_(placement), max_window_tokens_(max_window_tokens) {
    std::vector<std::pair<const void*, size_t>> ranges;
    size_t bytes = 0;
    const auto mine = [&](const gguf::TensorInfo& t) {
        return is_routed_expert_tensor(t.name, n_block) && block_of(t.name) >= first_block && t.data;
    };
    for (const gguf::TensorInfo& t : file.tensors())
        if (mine(t)) {
            ranges.push_back({t.data, t.n_bytes});
            bytes += t.n_bytes;
        }
    if (ranges.empty())
        throw Error(file.path() + ": experts in host RAM asked for, but the model has no routed experts");
    if (placement.from_file) {
        // Nothing pinned: the GPU cannot read these pages, so the CPU workers compute every miss.
        if (!placement.cpu_workers)
            throw Error(
                file.path() +
                ": the routed experts are read from the mapped file (the RAM budget cannot pin "
                "them), and only CPU expert workers can compute a miss from there: --cpu-experts must not be 0");
        std::fprintf(stderr,
                     "strata: experts in host RAM: %.2f GiB of routed experts read from the mapped file (not pinned): "
                     "the CPU workers compute every miss\n",
                     static_cast<double>(bytes) / (1 << 30));
    } else {
        std::fprintf(stderr, "strata: experts in host RAM: pinning %.2f GiB of routed experts...\n",
                     static_cast<double>(bytes) / (1 << 30));
        registration_ = std::make_unique<cuda::HostRegistration>(ctx, std::move(ranges));
        std::fprintf(stderr, "strata: experts in host RAM: %.2f GiB pinned and copied in %.1f s (%.1f GB/s)\n",
                     static_cast<double>(bytes) / (1 << 30), registration_->seconds(),
                     static_cast<double>(bytes) / 1e9 / std::max(registration_->seconds(), 1e-9));
        // The copy serves every read from now on: the file's pages go back to the system.
        for (const gguf::TensorInfo& t : file.tensors())
            if (mine(t)) file.drop_pages(t.data, t.n_bytes);
    }
    copies_ = std::make_unique<cuda::CopyStream>(ctx);
    layers_.resize(static_cast<size_t>(n_block));
    if (placement.cpu_workers) {
        doorbell_ = std::make_unique<cuda::Doorbell>(ctx, cuda::DoorbellOptions{.slots = static_cast<int>(n_block)});
        adapt_share_ = placement.cpu_share < 0 && !placement.from_file;
        share_ = placement.from_file ? 1.0 : adapt_share_ ? 0.5 : std::min(placement.cpu_share, 1.0);
    }
}

ExpertCache::~ExpertCache() {
    try {
        if (copies_) copies_->synchronize();
    } catch (const Error&) {
    }
    if (stats_.windows > 0) std::fprintf(stderr, "%s", report().c_str());
}

void ExpertCache::add_layer(int64_t block, const MoeWeights& host, const MoeShape& shape,
                            cuda::MoeLayerWeights& device) {
    STRATA_ASSERT(block >= 0 && block < static_cast<int64_t>(layers_.size()));
    Layer& l = layers_[static_cast<size_t>(block)];
    l.block = block;
    l.n_expert = shape.n_expert;
    l.k = shape.n_expert_used;
    max_k_ = std::max(max_k_, l.k);
    const Tensor* tensors[3] = {host.gate_up ? &*host.gate_up : &*host.gate, host.gate_up ? nullptr : &*host.up,
                                &host.down};
    for (const Tensor* t : tensors) {
        if (!t) continue;
        if (t->ne[2] != shape.n_expert || t->nb[2] < t->nb[1] * static_cast<size_t>(t->ne[1]))
            throw Error(file_.path() + ": expert tensor " + t->name + " is not laid out one expert after another");
        const size_t slice = t->nb[1] * static_cast<size_t>(t->ne[1]);
        l.parts.push_back(
            {.cpu = static_cast<const uint8_t*>(host_bytes(t->data)),
             .host = registration_ ? static_cast<const uint8_t*>(registration_->device(t->data)) : nullptr,
             .stride = t->nb[2],
             .bytes = slice,
             .slot_offset = l.slot_bytes,
             .pass = t == &host.down ? 1 : 0,
             .ring_offset = 0,
             .ring_stride = (slice + 255) / 256 * 256});
        l.slot_bytes += (slice + 255) / 256 * 256;
        Tensor view = *t;  // types and strides for the products; the data is read through the tables
        view.device = Device::Host;
        view.packed = nullptr;
        l.views.push_back(view);
    }
    const int64_t E = l.n_expert;
    // A ring buffer holds one range of one pass: each part's experts of the range one after another.
    if (placement_.stream_ranges > 0 && E % placement_.stream_ranges == 0) {
        size_t at[2] = {0, 0};
        for (Part& part : l.parts) {
            part.ring_offset = at[part.pass];
            at[part.pass] += part.ring_stride * static_cast<size_t>(E / placement_.stream_ranges);
        }
    }
    l.shape = shape;
    l.cpu_owned.assign(static_cast<size_t>(E), 0);
    // The CPU workers read the experts from the pinned copy (the file's pages were handed back), or the file.
    l.host = host;
    for (std::vector<Tensor>* views : {&l.host.expert_gate, &l.host.expert_up, &l.host.expert_down})
        for (Tensor& v : *views) v.data = host_bytes(v.data);
    if (doorbell_) {
        const int64_t T = cuda::kMaxMatvecTokens, K = l.k, H = shape.n_embd;
        const size_t ids_bytes = (static_cast<size_t>(T * K) * 4 + 255) / 256 * 256;
        const size_t x_bytes = (static_cast<size_t>(T * H) * 4 + 255) / 256 * 256;
        l.share = std::make_unique<cuda::MappedHostBuffer>(ids_bytes + x_bytes + static_cast<size_t>(T * K * H) * 4);
        auto* dev = static_cast<uint8_t*>(const_cast<void*>(l.share->device()));
        l.device_share = {.doorbell = doorbell_.get(),
                          .slot = static_cast<int>(block),
                          .layer = static_cast<int>(block),
                          .ids = reinterpret_cast<int32_t*>(dev),
                          .x = reinterpret_cast<float*>(dev + ids_bytes),
                          .rows = reinterpret_cast<const float*>(dev + ids_bytes + x_bytes)};
        l.mine.assign(static_cast<size_t>(T * K), 0);
    }
    const auto& slots = placement_.cache_slots;
    l.n_slots =
        std::clamp<int64_t>(static_cast<size_t>(block) < slots.size() ? slots[static_cast<size_t>(block)] : 0, 0, E);
    if (l.n_slots > 0) {
        l.slots = ctx_.allocate(static_cast<size_t>(l.n_slots) * l.slot_bytes, "expert cache");
        slot_bytes_total_ += l.slots.size();
    }
    if (!tables_.size()) {  // the first layer sizes the tables of all (every layer has as many experts in practice)
        table_experts_ = E;
        // Decode tables, then prompt ones, then streamed prompt ones.
        const size_t entries = 3 * layers_.size() * 3 * static_cast<size_t>(E);
        tables_ = ctx_.allocate(entries * sizeof(void*), "expert tables");
        mirror_ = std::make_unique<cuda::MappedHostBuffer>(entries * sizeof(void*));
    }
    if (E > table_experts_)
        throw Error(file_.path() + ": block " + std::to_string(block) + " has " + std::to_string(E) +
                    " experts where an earlier one has " + std::to_string(table_experts_) +
                    "; experts in host RAM need the same count in every layer");
    const size_t table_at = static_cast<size_t>(block) * 3 * static_cast<size_t>(table_experts_);
    l.mirror = static_cast<const uint8_t**>(mirror_->host()) + table_at;
    l.tables = tables_.as<const uint8_t* const>() + table_at;
    l.serving.assign(static_cast<size_t>(l.n_slots), -1);
    l.pending.assign(static_cast<size_t>(l.n_slots), -1);
    l.ticket.assign(static_cast<size_t>(l.n_slots), 0);
    l.intended.assign(static_cast<size_t>(l.n_slots), -1);
    l.slot_of.assign(static_cast<size_t>(E), -1);
    for (int32_t e = 0; e < E; ++e) point(l, e, -1);
    // The warm set: copied now and waited for, so the first window already hits.
    if (static_cast<size_t>(block) < placement_.warm.size()) {
        int64_t slot = 0;
        for (int32_t e : placement_.warm[static_cast<size_t>(block)]) {
            if (slot >= l.n_slots) break;
            if (e < 0 || e >= E || l.slot_of[static_cast<size_t>(e)] >= 0) continue;
            admit(l, slot++, e);
        }
        copies_->synchronize();
        for (int64_t s = 0; s < l.n_slots; ++s)
            if (l.pending[static_cast<size_t>(s)] >= 0) {
                point(l, l.pending[static_cast<size_t>(s)], s);
                l.pending[static_cast<size_t>(s)] = -1;
            }
    }
    auto table = [&](size_t part) { return l.tables + part * static_cast<size_t>(E); };
    if (host.gate_up) {
        device.gate_up = &l.views[0];
        device.gate_up_at = table(0);
        device.down = &l.views[1];
        device.down_at = table(1);
    } else {
        device.gate = &l.views[0];
        device.gate_at = table(0);
        device.up = &l.views[1];
        device.up_at = table(1);
        device.down = &l.views[2];
        device.down_at = table(2);
    }
}

// Both table sets: the decode tables hold null for an expert the CPU workers compute; the prompt tables read every
// miss over PCIe.
void ExpertCache::point(Layer& l, int32_t expert, int64_t slot) {
    const size_t E = static_cast<size_t>(l.n_expert), set = layers_.size() * 3 * static_cast<size_t>(table_experts_);
    const bool cpu = slot < 0 && l.cpu_owned[static_cast<size_t>(expert)];
    for (size_t p = 0; p < l.parts.size(); ++p) {
        const Part& part = l.parts[p];
        const uint8_t* at =
            slot >= 0   ? l.slots.as<const uint8_t>() + static_cast<size_t>(slot) * l.slot_bytes + part.slot_offset
            : part.host ? part.host + static_cast<size_t>(expert) * part.stride
                        : nullptr;  // in the file: a window that would read it streams it or runs as decode windows
        l.mirror[p * E + static_cast<size_t>(expert)] = cpu ? nullptr : at;
        l.mirror[set + p * E + static_cast<size_t>(expert)] = at;
        if (ring_)
            l.mirror[2 * set + p * E + static_cast<size_t>(expert)] =
                slot < 0 && l.streams ? ring_address(l, p, expert) : at;
    }
    const int32_t before = l.slot_of[static_cast<size_t>(expert)];
    if (before >= 0) l.serving[static_cast<size_t>(before)] = -1;
    l.slot_of[static_cast<size_t>(expert)] = static_cast<int32_t>(slot);
    if (slot >= 0) l.serving[static_cast<size_t>(slot)] = expert;
    dirty_[0] = dirty_[1] = dirty_[2] = true;
}

// Which experts the CPU workers compute when they miss: a fixed pseudo-random `share` of each layer's ids (a hash, so
// that a share step moves few experts and every layer's split is alike).
void ExpertCache::set_cpu_share(double share) {
    share_ = std::clamp(share, 0.0, 1.0);
    const uint32_t cut = static_cast<uint32_t>(share_ * 65536.0);
    for (Layer& l : layers_) {
        if (l.block < 0) continue;
        for (int32_t e = 0; e < l.n_expert; ++e) {
            uint64_t h = (static_cast<uint64_t>(l.block) << 32 | static_cast<uint32_t>(e)) * 0x9E3779B97F4A7C15ull;
            h ^= h >> 29;
            const uint8_t owned = doorbell_ && !stalled_ && static_cast<uint32_t>(h & 0xFFFF) < cut;
            if (owned == l.cpu_owned[static_cast<size_t>(e)]) continue;
            l.cpu_owned[static_cast<size_t>(e)] = owned;
            if (l.slot_of[static_cast<size_t>(e)] < 0) point(l, e, -1);
        }
    }
}

// Queues expert `expert`'s copy into `slot`; whatever the slot served goes back to its host pages now.
void ExpertCache::admit(Layer& l, int64_t slot, int32_t expert) {
    const size_t s = static_cast<size_t>(slot);
    if (l.serving[s] >= 0) point(l, l.serving[s], -1);
    uint8_t* dst = l.slots.as<uint8_t>() + s * l.slot_bytes;
    for (const Part& part : l.parts)
        copies_->copy(dst + part.slot_offset, part.cpu + static_cast<size_t>(expert) * part.stride, part.bytes);
    l.pending[s] = expert;  // replaces an admission still in flight: that one never flips
    l.ticket[s] = copies_->ticket();
    l.intended[s] = expert;
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.swaps;
    for (const Part& part : l.parts) stats_.swap_bytes += static_cast<int64_t>(part.bytes);
}

void ExpertCache::set_streams(int64_t block, bool streams) {
    STRATA_ASSERT(block >= 0 && block < static_cast<int64_t>(layers_.size()) && !ring_);
    layers_[static_cast<size_t>(block)].streams = streams;
}

bool ExpertCache::streams_every_layer() const {
    if (!ring_) return false;
    for (const Layer& l : layers_)
        if (l.block >= 0 && !l.streams) return false;
    return true;
}

void ExpertCache::set_routing_sources(const std::vector<const int32_t*>& ids_by_block) {
    STRATA_ASSERT(ids_by_block.size() == layers_.size());
    routing_layers_ = static_cast<int64_t>(ids_by_block.size());
    routing_ = std::make_unique<cuda::MappedHostBuffer>(
        static_cast<size_t>(routing_layers_ * max_window_tokens_ * std::max<int64_t>(max_k_, 1)) * sizeof(int32_t));
    source_ids_ = ids_by_block;
    const int32_t* any = nullptr;
    for (const int32_t* p : source_ids_) any = p ? p : any;
    std::vector<const int32_t*> sources(source_ids_);
    for (const int32_t*& p : sources) p = p ? p : any;  // blocks without experts copy something harmless
    routing_sources_ = ctx_.upload(sources.data(), sources.size() * sizeof(void*), "expert tables");
    make_ring();
    if (doorbell_) set_cpu_share(share_);
    // Every table as the warm-up left it, then counting starts (the warm copies are not swaps).
    ctx_.copy_to_device(tables_.data(), mirror_->host(), tables_.size());
    ctx_.synchronize();
    dirty_[0] = dirty_[1] = dirty_[2] = false;
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_ = {};
}

// The ring, once every layer is known: a buffer holds the largest range of one pass of any layer. Every layer's
// (pass, range) uses the same buffer in every window (2 x ranges chunks a layer, a multiple of the buffers), so the
// streamed tables never change with the window, only with the slots.
void ExpertCache::make_ring() {
    const int ranges = placement_.stream_ranges, buffers = placement_.stream_buffers;
    if (ranges <= 0) return;
    if (buffers < 1 || (2 * ranges) % buffers != 0)
        throw Error("CUDA expert cache: a ring of " + std::to_string(buffers) + " buffers does not divide the " +
                    std::to_string(2 * ranges) + " chunks of a layer");
    for (const Layer& l : layers_)
        if (l.block >= 0 && l.n_expert % ranges != 0) {
            std::fprintf(stderr,
                         "strata: block %lld's %lld experts do not split into %d ranges: prompt windows do not "
                         "stream their misses\n",
                         static_cast<long long>(l.block), static_cast<long long>(l.n_expert), ranges);
            return;
        }
    size_t buffer_bytes = 0;
    for (const Layer& l : layers_) {
        if (l.block < 0 || !l.streams) continue;
        for (const Part& part : l.parts)
            buffer_bytes =
                std::max(buffer_bytes, part.ring_offset + part.ring_stride * static_cast<size_t>(l.n_expert / ranges));
        stream_blocks_.push_back(l.block);
    }
    if (stream_blocks_.empty()) return;
    ring_ = std::make_unique<cuda::CopyRing>(ctx_, buffers, buffer_bytes);
    for (size_t i = 0; i < stream_blocks_.size(); ++i) layer_streams_.emplace_back(*this, static_cast<int64_t>(i));
    for (Layer& l : layers_)
        for (int32_t e = 0; e < l.n_expert; ++e) point(l, e, l.slot_of[static_cast<size_t>(e)]);
}

const uint8_t* ExpertCache::ring_address(const Layer& l, size_t part, int32_t expert) const {
    const Part& p = l.parts[part];
    const int64_t per = l.n_expert / placement_.stream_ranges, range = expert / per;
    const int64_t chunk =
        p.pass * placement_.stream_ranges + range;  // within the layer; every layer starts at a buffer 0
    return ring_->buffer(static_cast<int>(chunk % ring_->buffers())) + p.ring_offset +
           static_cast<size_t>(expert - range * per) * p.ring_stride;
}

// The copies of the ring's next chunk: each part of the pass, its runs of experts no slot holds.
void ExpertCache::fill_next_chunk() {
    const int64_t chunk = ring_->next_chunk(), local = chunk - window_base_, per_layer = 2 * placement_.stream_ranges;
    const int64_t ordinal = local / per_layer;
    if (ordinal >= static_cast<int64_t>(stream_blocks_.size())) return;
    const Layer& l = layers_[static_cast<size_t>(stream_blocks_[static_cast<size_t>(ordinal)])];
    const int pass = static_cast<int>(local % per_layer / placement_.stream_ranges);
    const int64_t range = local % placement_.stream_ranges, per = l.n_expert / placement_.stream_ranges;
    std::vector<cuda::CopyRing::Piece>& pieces = ring_pieces_;
    pieces.clear();
    for (const Part& part : l.parts) {
        if (part.pass != pass) continue;
        for (int64_t e = range * per, end = (range + 1) * per; e < end;) {
            if (l.slot_of[static_cast<size_t>(e)] >= 0) {
                ++e;
                continue;
            }
            int64_t run = 1;
            while (e + run < end && l.slot_of[static_cast<size_t>(e + run)] < 0) ++run;
            pieces.push_back({.offset = part.ring_offset + static_cast<size_t>(e - range * per) * part.ring_stride,
                              .source = part.cpu + static_cast<size_t>(e) * part.stride,
                              .bytes = part.bytes,
                              .rows = static_cast<size_t>(run),
                              .source_pitch = part.stride,
                              .pitch = part.ring_stride});
            e += run;
        }
    }
    const uint64_t before = ring_->bytes_copied();
    ring_->fill(chunk, pieces);
    window_ring_bytes_ += ring_->bytes_copied() - before;
}

int64_t ExpertCache::LayerStream::chunk(int pass, int range) const {
    return cache_.window_base_ + ordinal_ * 2 * cache_.placement_.stream_ranges +
           pass * cache_.placement_.stream_ranges + range;
}

void ExpertCache::LayerStream::ready(int pass, int range) {
    if (!cache_.streaming_) throw Error("CUDA expert cache: a streamed range asked for outside a streamed window");
    cache_.ring_->acquire(chunk(pass, range));
}

void ExpertCache::LayerStream::done(int pass, int range) {
    cache_.ring_->release(chunk(pass, range));
    cache_.fill_next_chunk();
}

cuda::MoeExpertStream* ExpertCache::expert_stream(int64_t block) {
    const auto it = std::find(stream_blocks_.begin(), stream_blocks_.end(), block);
    if (!streaming_ || it == stream_blocks_.end()) return nullptr;
    return &layer_streams_[static_cast<size_t>(it - stream_blocks_.begin())];
}

void ExpertCache::begin_window(bool decode, bool streamed) {
    if (stalled_ && !reads_in_place())
        throw Error(
            "the CPU expert workers stopped answering, and nothing else can compute the experts read from the "
            "mapped file: load the model again");
    for (Layer& l : layers_)
        for (int64_t s = 0; s < l.n_slots; ++s) {
            const int32_t e = l.pending[static_cast<size_t>(s)];
            if (e >= 0 && copies_->landed(l.ticket[static_cast<size_t>(s)])) {
                point(l, e, s);
                l.pending[static_cast<size_t>(s)] = -1;
            }
        }
    // Pinned source: the copy reads it when it runs, before the window, and the host changes it only after the window
    // has finished (end_window) or right here.
    streamed = streamed && ring_ && !decode;
    const size_t set = decode ? 0 : streamed ? 2 : 1, third = tables_.size() / 3;
    if (dirty_[set])
        ctx_.copy_to_device(static_cast<uint8_t*>(tables_.data()) + set * third,
                            static_cast<const uint8_t*>(mirror_->host()) + set * third, third);
    dirty_[set] = false;
    streaming_ = streamed;
    window_ring_bytes_ = 0;
    if (!streamed) return;
    // A window that stopped half way left chunks unread: start the numbering again once both streams are idle.
    if (!ring_->drained() || ring_->next_chunk() % ring_->buffers() != 0) ring_->reset();
    window_base_ = ring_->next_chunk();
    for (int i = 0; i < ring_->buffers(); ++i) fill_next_chunk();
}

cuda::MoeLayerWeights ExpertCache::prompt_weights(const cuda::MoeLayerWeights& decode, bool streamed) const {
    cuda::MoeLayerWeights w = decode;
    const size_t set = layers_.size() * 3 * static_cast<size_t>(table_experts_) * (streamed && ring_ ? 2 : 1);
    for (const uint8_t* const** at : {&w.gate_up_at, &w.gate_at, &w.up_at, &w.down_at})
        if (*at) *at += set;
    return w;
}

const cuda::MoeHostShare* ExpertCache::host_share(int64_t block) const {
    const Layer& l = layers_[static_cast<size_t>(block)];
    return doorbell_ && l.block >= 0 ? &l.device_share : nullptr;
}

void ExpertCache::enqueue_window_start() {
    doorbell_->enqueue_window_start();
}

uint32_t ExpertCache::open_window() {
    return doorbell_->open_window();
}

// The host side of a decode window, layer by layer as the GPU publishes them: the pairs whose expert the CPU owns
// (and no slot holds) go to the workers, whose last one rings the layer's slot; a layer with none is rung at once.
void ExpertCache::serve(uint32_t window, int64_t n_tokens) {
    HostExpertCompute& pool = *placement_.cpu_workers;
    const int64_t bound = doorbell_->bound_us();
    cuda::Doorbell* doorbell = doorbell_.get();
    bool running = false;
    for (Layer& l : layers_) {
        if (l.block < 0) continue;
        const int slot = static_cast<int>(l.block);
        // A GPU that never gets here has a wait that gives up before it; finish() reports it.
        if (!doorbell->wait_published(slot, window, bound)) break;
        const auto* base = static_cast<const uint8_t*>(l.share->host());
        const auto* ids = reinterpret_cast<const int32_t*>(base);
        const int64_t pairs = n_tokens * l.k;
        int64_t n_mine = 0;
        window_seen_.clear();
        for (int64_t p = 0; p < pairs; ++p) {
            const int32_t e = ids[p];
            const bool mine = e >= 0 && e < l.n_expert && l.cpu_owned[static_cast<size_t>(e)] &&
                              l.slot_of[static_cast<size_t>(e)] < 0;
            l.mine[static_cast<size_t>(p)] = mine;
            if (!mine) continue;
            ++n_mine;
            if (std::find(window_seen_.begin(), window_seen_.end(), e) == window_seen_.end()) window_seen_.push_back(e);
        }
        if (running) {
            if (!pool.wait(bound)) break;  // a worker that does not answer: the GPU's wait gives up
            running = false;
        }
        if (n_mine == 0) {
            doorbell->ring(slot, window);
            continue;
        }
        int64_t slice = 0;
        for (const Part& part : l.parts) slice += static_cast<int64_t>(part.bytes);
        {
            std::lock_guard<std::mutex> lock(stats_mutex_);
            stats_.cpu_pairs += n_mine;
            stats_.cpu_bytes += slice * static_cast<int64_t>(window_seen_.size());
        }
        const size_t ids_bytes = (static_cast<size_t>(cuda::kMaxMatvecTokens * l.k) * 4 + 255) / 256 * 256;
        const size_t x_bytes = (static_cast<size_t>(cuda::kMaxMatvecTokens * l.shape.n_embd) * 4 + 255) / 256 * 256;
        auto* host = static_cast<uint8_t*>(l.share->host());
        pool.start({.layer = l.block,
                    .shape = &l.shape,
                    .weights = &l.host,
                    .n_tokens = n_tokens,
                    .x = reinterpret_cast<const float*>(host + ids_bytes),
                    .ids = ids,
                    .mine = l.mine.data(),
                    .y = reinterpret_cast<float*>(host + ids_bytes + x_bytes)},
                   [doorbell, slot, window] { doorbell->ring(slot, window); });
        running = true;
    }
    if (running) (void)pool.wait(bound);
}

void ExpertCache::finish(double window_seconds, int64_t n_tokens) {
    const cuda::DoorbellCheck check = doorbell_->check_window();
    if (check.gave_up) {
        // The workers are not to be trusted again (a job may still be running): every later miss is read over PCIe.
        stalled_ = true;
        adapt_share_ = false;
        set_cpu_share(0);
        std::fprintf(stderr, "strata: %s; the CPU expert workers are off from now on\n", check.report.c_str());
        throw Error(check.report + "; the request fails (reset the sequence before using it again)");
    }
    if (!adapt_share_) return;
    // Hill climbing on the decode rate: every 32 windows the share moves a step; a step that made decoding slower
    // turns back at half the size.
    epoch_seconds_ += window_seconds;
    epoch_tokens_ += n_tokens;
    if (++epoch_windows_ < 32) return;
    const double rate = static_cast<double>(epoch_tokens_) / std::max(epoch_seconds_, 1e-9);
    if (last_rate_ > 0 && rate < last_rate_) share_step_ = -share_step_ / 2;
    if (std::abs(share_step_) < 0.02) share_step_ = share_step_ < 0 ? -0.02 : 0.02;
    last_rate_ = rate;
    set_cpu_share(share_ + share_step_);
    epoch_seconds_ = 0;
    epoch_tokens_ = epoch_windows_ = 0;
}

void ExpertCache::copy_routing(int64_t block, int64_t first, int64_t n_tokens, const int32_t* ids) {
    const int64_t stride = max_window_tokens_ * max_k_;
    if (block < 0) {
        STRATA_ASSERT(first == 0);
        cuda::gather_ints_to_mapped(ctx_, routing_sources_.as<const int32_t* const>(), routing_layers_,
                                    n_tokens * max_k_, stride,
                                    static_cast<int32_t*>(const_cast<void*>(routing_->device())));
        return;
    }
    const Layer& l = layers_[static_cast<size_t>(block)];
    auto* host = static_cast<int32_t*>(routing_->host());
    cuda::copy_to_host_async(ctx_, host + block * stride + first * l.k, ids ? ids : source_ids_[static_cast<size_t>(block)],
                             static_cast<size_t>(n_tokens * l.k) * sizeof(int32_t));
}

void ExpertCache::end_window(int64_t n_tokens) {
    const bool decode_share = doorbell_ && n_tokens <= cuda::kMaxMatvecTokens;
    const bool streamed = streaming_;
    streaming_ = false;
    if (streamed && !ring_->drained())
        throw Error("CUDA expert cache: a streamed window ended with ring chunks unread (a layer skipped its ranges)");
    {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        if (routing_counts_.empty()) routing_counts_.resize(layers_.size());
        ++stats_.windows;
        stats_.tokens += n_tokens;
        // A streamed window's misses crossed the bus as the ring's copies: every expert no slot held, once.
        if (streamed) {
            ++stats_.streamed_windows;
            stats_.miss_bytes += static_cast<int64_t>(window_ring_bytes_);
        }
    }
    const int64_t stride = max_window_tokens_ * max_k_;
    const auto* host = static_cast<const int32_t*>(routing_->host());
    for (Layer& l : layers_) {
        if (l.block < 0) continue;
        const int32_t* ids = host + l.block * stride;
        const int64_t pairs = n_tokens * l.k;
        window_ids_.assign(ids, ids + pairs);
        int64_t slice_bytes = 0;
        for (const Part& part : l.parts) slice_bytes += static_cast<int64_t>(part.bytes);
        std::vector<int32_t>& seen = window_seen_;
        seen.clear();
        std::unique_lock<std::mutex> lock(stats_mutex_);  // released before the swaps (admit() takes it)
        std::vector<uint64_t>& counts = routing_counts_[static_cast<size_t>(l.block)];
        if (counts.empty()) counts.assign(static_cast<size_t>(l.n_expert), 0);
        for (int32_t e : window_ids_) {
            if (e < 0 || e >= l.n_expert)
                throw Error("CUDA expert cache: the routing copy holds expert id " + std::to_string(e) + " (of " +
                            std::to_string(l.n_expert) + ")");
            ++counts[static_cast<size_t>(e)];
            ++stats_.lookups;
            if (l.slot_of[static_cast<size_t>(e)] >= 0) {
                ++stats_.hits;
            } else if (decode_share && l.cpu_owned[static_cast<size_t>(e)]) {
                // the CPU workers' (counted by serve)
            } else if (!streamed && std::find(seen.begin(), seen.end(), e) == seen.end()) {
                seen.push_back(e);
                stats_.miss_bytes += slice_bytes;
            }
        }
        lock.unlock();
        if (!placement_.advisor || l.n_slots == 0) continue;
        swaps_.clear();
        placement_.advisor->observe(l.block, l.n_expert, l.k, window_ids_, l.intended, swaps_);
        for (const ExpertSwap& sw : swaps_) {
            if (sw.slot < 0 || sw.slot >= l.n_slots || sw.admit < 0 || sw.admit >= l.n_expert)
                throw Error("CUDA expert cache: the policy asked for slot " + std::to_string(sw.slot) + " <- expert " +
                            std::to_string(sw.admit) + " (" + std::to_string(l.n_slots) + " slots, " +
                            std::to_string(l.n_expert) + " experts)");
            // Already there or on its way (into this slot or another): nothing to copy.
            if (std::find(l.intended.begin(), l.intended.end(), sw.admit) != l.intended.end()) continue;
            admit(l, sw.slot, sw.admit);
        }
    }
}

ExpertOffloadStats ExpertCache::snapshot() const {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    const ExpertCacheStats& s = stats_;
    int64_t slots = 0;
    for (const Layer& l : layers_) slots += l.n_slots;
    return {.tokens = s.tokens,
            .lookups = s.lookups,
            .hits = s.hits,
            .cpu_pairs = s.cpu_pairs,
            .swaps = s.swaps,
            .swap_bytes = s.swap_bytes,
            .pcie_bytes = s.miss_bytes,
            .cpu_bytes = s.cpu_bytes,
            .cpu_share = doorbell_ ? share_ : 0.0,
            .doorbell_timeouts = doorbell_ ? doorbell_->timeouts_total() : 0,
            .cache_slots = slots,
            .streamed_windows = s.streamed_windows,
            .routing_counts = routing_counts_};
}

std::string ExpertCache::report() const {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    const ExpertCacheStats& s = stats_;
    const double tokens = static_cast<double>(std::max<int64_t>(s.tokens, 1));
    char line[768];
    std::snprintf(line, sizeof line,
                  "strata: experts in host RAM over %lld tokens: %.1f%% hits, %.2f misses a token (%.2f on the CPU "
                  "workers), %.1f MB a token read over PCIe by misses, %.1f MB by the CPU workers (share %.2f), %.2f "
                  "swaps a token (%.1f MB), %.2f GiB of VRAM slots; %lld of %lld windows streamed their misses\n",
                  static_cast<long long>(s.tokens),
                  100.0 * static_cast<double>(s.hits) / static_cast<double>(std::max<int64_t>(s.lookups, 1)),
                  static_cast<double>(s.lookups - s.hits) / tokens, static_cast<double>(s.cpu_pairs) / tokens,
                  static_cast<double>(s.miss_bytes) / tokens / 1e6, static_cast<double>(s.cpu_bytes) / tokens / 1e6,
                  share_, static_cast<double>(s.swaps) / tokens, static_cast<double>(s.swap_bytes) / tokens / 1e6,
                  static_cast<double>(slot_bytes_total_) / (1 << 30), static_cast<long long>(s.streamed_windows),
                  static_cast<long long>(s.windows));
    return line;
}

}  // namespace strata::cuda_model
