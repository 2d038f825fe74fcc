// Experts in host RAM for the CUDA trunk (issue 25, DESIGN.md section 9): every routed expert stays in the mapped
// file's pages, registered so the device reads them over PCIe; each MoE layer has VRAM slots that hold some of its
// experts, and one device table per expert tensor that says where each expert's slice is now (its slot, or its host
// pages). The gathered products read through the tables (cuda::MoeLayerWeights::*_at), so a window's graph never
// changes: only the tables do, between windows.
//
// Swaps never stall a window and never let one read a half-copied slot. After a window (its stream has finished):
// the advisor sees the window's routing and answers swaps; an evicted expert points back to its host pages at once
// (the table upload is queued before the next window on the same stream), and the admitted expert's copy goes on
// the copy stream. Its table entry flips to the slot only at the start of a window after the copy has landed. A slot
// whose copy is still in flight and is chosen again drops the first admission.
//
// Long prompt windows (ExpertPlacement::stream_ranges) do not read their misses over PCIe in place: every expert no
// slot holds is copied into VRAM through a ring of buffers (cuda::CopyRing) while the window computes, a layer's
// experts in ranges, gate and up first, then down; the streamed tables point each such expert into the ring buffer
// its range and pass use (the same in every layer), and the grouped products of a range wait for its copy.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/doorbell_wait.h"
#include "backend/cuda/host_memory.h"
#include "backend/cuda/model_ops.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/moe.h"

namespace strata::cuda_model {

// Counted over the decode and prompt windows since loading.
struct ExpertCacheStats {
    int64_t tokens = 0;
    int64_t lookups = 0;    // (token, slot) pairs routed
    int64_t hits = 0;       // of them, to an expert whose slot served it
    int64_t cpu_pairs = 0;  // of the misses, pairs the CPU workers computed
    int64_t swaps = 0;      // copies into slots queued
    int64_t swap_bytes = 0;
    int64_t miss_bytes = 0;  // expert bytes the GPU's misses read over PCIe (each missed expert once per window)
    int64_t cpu_bytes = 0;   // expert bytes the CPU workers read from host RAM
    int64_t windows = 0;
    int64_t streamed_windows = 0;  // prompt windows whose misses went through the ring
};

class ExpertCache {
  public:
    // Registers the routed experts' pages of trunk blocks [first_block, n_block) (a stage of a split: its own).
    // Throws Error when they cannot be pinned.
    ExpertCache(cuda::Context& ctx, const gguf::File& file, int64_t n_block, int64_t max_window_tokens,
                const ExpertPlacement& placement, int64_t first_block = 0);
    ~ExpertCache();

    // Block `block`'s experts: allocates its slots (placement.cache_slots), fills them with the warm set, and points
    // the device weights' expert tensors and address tables at the cache. `host` holds the bound host tensors.
    void add_layer(int64_t block, const MoeWeights& host, const MoeShape& shape, cuda::MoeLayerWeights& device);
    // Before set_routing_sources: whether block `block`'s prompt windows take the grouped path, so that its misses
    // can stream through the ring (layers that cannot are left out of it: in place over PCIe, or, with the experts
    // in the file, only in decode windows).
    void set_streams(int64_t block, bool streams);
    // After the last add_layer: the device array of the layers' routing outputs (MoeWorkspace::expert_ids), for
    // the copy that hands a decode window's routing to the host.
    void set_routing_sources(const std::vector<const int32_t*>& ids_by_block);

    // Before a window is queued: landed copies flip their experts to their slots; changed tables are uploaded (queued
    // on the context's stream ahead of the window). A decode window (`decode`) gets the tables in which the CPU
    // workers' experts are null; a prompt window, those in which every miss is read over PCIe, or with `streamed`
    // those that point the misses into the ring, whose first buffers start filling now.
    void begin_window(bool decode, bool streamed = false);
    // The address tables of a prompt window (streamed or not) for a block's device weights (which hold the decode
    // ones).
    cuda::MoeLayerWeights prompt_weights(const cuda::MoeLayerWeights& decode, bool streamed = false) const;
    // Whether long prompt windows may stream (the placement asked for it and every layer's experts split evenly).
    bool streams() const { return ring_ != nullptr; }
    // Whether the GPU can read a miss over PCIe in place (the experts are pinned); else a prompt window that does not
    // stream runs as decode windows, whose misses the CPU workers compute.
    bool reads_in_place() const { return registration_ != nullptr; }
    // Whether every layer with experts streams (what a prompt window with the experts in the file needs).
    bool streams_every_layer() const;
    // In a streamed window: block `block`'s side of the ring for moe_layer_prompt (layers in block order, each once).
    cuda::MoeExpertStream* expert_stream(int64_t block);

    // ---- the CPU workers' share (ExpertPlacement::cpu_workers; decode windows only) ----
    bool cpu_share() const { return doorbell_ != nullptr && !stalled_; }
    const cuda::MoeHostShare* host_share(int64_t block) const;
    // In a decode window's capture, first: the doorbell's window start.
    void enqueue_window_start();
    // Runs one decode window's host side while its graph runs: opens the doorbell window (call before queuing the
    // graph), then `serve` answers every layer (each wait bounded), then `finish` checks the window. A wait that gave
    // up fails the request with the stall report (the window's rows are never combined, and the sequence must be
    // reset).
    uint32_t open_window();
    void serve(uint32_t window, int64_t n_tokens);
    void finish(double window_seconds, int64_t n_tokens);
    // Inside the window (capturable): the routing of `n_tokens` tokens of every layer to the host, written at
    // token offset `first` of the window (a prompt window's slices call it per layer; block -1: every layer).
    // ids: where the block's routing is now (default: its decode workspace; a prompt window's grouped MoE keeps it
    // in the prompt workspace).
    void copy_routing(int64_t block, int64_t first, int64_t n_tokens, const int32_t* ids = nullptr);
    // After the window's work has finished: statistics, the advisor, and the swaps it asks for.
    void end_window(int64_t n_tokens);

    // A consistent copy, from any thread.
    ExpertOffloadStats snapshot() const;
    std::string report() const;  // one paragraph for stderr
    size_t slot_bytes_total() const { return slot_bytes_total_; }

  private:
    struct Part {             // one expert tensor of a layer (gate_up, or gate and up; down)
        const uint8_t* cpu;   // expert 0's host address (for the copies into slots)
        const uint8_t* host;  // expert 0's device-mapped host address (for the tables)
        size_t stride;        // bytes from one expert to the next (nb[2])
        size_t bytes;         // one expert's slice
        size_t slot_offset;   // where it lies within a slot
        int pass;             // streamed windows: 0 (gate and up) or 1 (down)
        size_t ring_offset;   // where its range lies within a ring buffer, experts ring_stride apart
        size_t ring_stride;
    };
    struct Layer {
        int64_t block = -1;
        int64_t n_expert = 0, k = 0, n_slots = 0;
        std::vector<Part> parts;
        size_t slot_bytes = 0;
        cuda::DeviceBuffer slots;
        const uint8_t** mirror = nullptr;        // parts x n_expert: the tables' contents (in mirror_)
        const uint8_t* const* tables = nullptr;  // the same on the device (in tables_)
        std::vector<int32_t> serving;            // slot -> the expert it serves (-1)
        std::vector<int32_t> pending;            // slot -> the expert being copied in (-1)
        std::vector<uint64_t> ticket;            // slot -> the copy's ticket
        std::vector<int32_t> intended;           // slot -> serving or pending (what the advisor is told)
        std::vector<int32_t> slot_of;            // expert -> slot serving it (-1)
        std::deque<Tensor> views;
        std::vector<uint8_t> cpu_owned;  // expert -> computed by the CPU workers when not in a slot
        MoeWeights host;                 // the bound host tensors, their expert views pointing into the copy
        MoeShape shape;
        std::unique_ptr<cuda::MappedHostBuffer> share;  // ids, x, rows of a decode window (CPU share)
        cuda::MoeHostShare device_share;
        std::vector<uint8_t> mine;
        bool streams = false;  // set_streams: in the ring
    };
    // One layer's ranges of the ring: the chunk of (pass, range) is window_base_ + ordinal x 2 x ranges + pass x
    // ranges + range.
    class LayerStream final : public cuda::MoeExpertStream {
      public:
        LayerStream(ExpertCache& cache, int64_t ordinal) : cache_(cache), ordinal_(ordinal) {}
        int ranges() const override { return cache_.placement_.stream_ranges; }
        void ready(int pass, int range) override;
        void done(int pass, int range) override;

      private:
        int64_t chunk(int pass, int range) const;
        ExpertCache& cache_;
        int64_t ordinal_;
    };
    void make_ring();
    const uint8_t* ring_address(const Layer& l, size_t part, int32_t expert) const;
    void fill_next_chunk();  // the ring's next chunk of this window, if it has one
    void set_cpu_share(double share);
    const void* host_bytes(const void* original) const {  // where the host reads expert bytes: the copy or the file
        return registration_ ? registration_->host(original) : original;
    }
    void point(Layer& l, int32_t expert, int64_t slot);  // slot -1: its host pages
    void admit(Layer& l, int64_t slot, int32_t expert);

    cuda::Context& ctx_;
    const gguf::File& file_;
    ExpertPlacement placement_;
    std::unique_ptr<cuda::HostRegistration> registration_;
    std::unique_ptr<cuda::CopyStream> copies_;
    std::vector<Layer> layers_;  // by block (those without experts stay empty)
    // Every layer's address tables: [block][3 parts][n_expert], on the device and as pinned host memory the tables
    // are uploaded from in one copy (queued ahead of a window whenever any entry changed).
    int64_t table_experts_ = 0;
    cuda::DeviceBuffer tables_;
    std::unique_ptr<cuda::MappedHostBuffer> mirror_;
    bool dirty_[3] = {false, false, false};  // decode tables, prompt tables, streamed prompt tables
    // The ring of streamed prompt windows (placement_.stream_ranges ranges a layer; Part::ring_offset and ring_stride
    // say where a range's expert lies in its buffer), the layers in block order, where this window's chunks start,
    // and the copies of the chunk being queued (kept to reuse their memory).
    std::unique_ptr<cuda::CopyRing> ring_;
    std::vector<cuda::CopyRing::Piece> ring_pieces_;
    std::vector<int64_t> stream_blocks_;
    std::vector<LayerStream> layer_streams_;
    int64_t window_base_ = 0;
    bool streaming_ = false;  // the window being queued is streamed
    uint64_t window_ring_bytes_ = 0;
    // The CPU share: its doorbell (one slot per block), the share of misses, and its adaptation.
    std::unique_ptr<cuda::Doorbell> doorbell_;
    double share_ = 0;
    bool adapt_share_ = false;
    bool stalled_ = false;  // a worker did not answer: the share is off for good
    double epoch_seconds_ = 0;
    int64_t epoch_tokens_ = 0, epoch_windows_ = 0;
    double last_rate_ = 0, share_step_ = 0.1;
    std::unique_ptr<cuda::MappedHostBuffer> routing_;  // [block][kPromptWindow x K] ids, written by the device
    int64_t max_window_tokens_ = 0;
    int64_t max_k_ = 0;
    cuda::DeviceBuffer routing_sources_;  // device array of the layers' ids pointers
    std::vector<const int32_t*> source_ids_;
    int64_t routing_layers_ = 0;
    std::vector<ExpertSwap> swaps_;
    std::vector<int32_t> window_ids_, window_seen_;
    size_t slot_bytes_total_ = 0;
    mutable std::mutex stats_mutex_;  // stats_ and routing_counts_ (read by snapshot() from other threads)
    ExpertCacheStats stats_;
    std::vector<std::vector<uint64_t>> routing_counts_;  // [block][expert]
};

}  // namespace strata::cuda_model
