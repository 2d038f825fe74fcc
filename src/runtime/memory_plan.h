// The memory plan of a model on the CUDA backend (issue 25; DESIGN.md section 9): from a GGUF, the VRAM and RAM
// budgets and the context to reserve, where every part goes. Dense weights (attention, GDN, routers, shared experts,
// norms, embeddings, head), KV pages, GDN and indexer state, window buffers, MoE workspaces and matmul scratch go to
// VRAM; what is left of the budget becomes a per-layer VRAM expert cache when the routed experts do not all fit; the
// routed experts then live in a pinned host arena (registered pages of the mapped file) when the RAM budget holds
// them, else they are read from the mapped file (page cache / SSD). The PLE table stays in host memory, pinned when
// it fits what RAM is left, else read row by row from the file with a row cache. MTP blocks are not loaded.
//
// Plain arithmetic over the file's tensor directory and keys: it never touches CUDA (the device's free memory is an
// input), so `strata info FILE --vram-budget 12G` prints the same plan on a machine without a GPU. The non-weight
// device costs are worked out the way the CUDA trunk allocates them (model/cuda/hybrid_cuda.cpp finish_loading and
// allocate_sequence, backend/cuda's KvCache, MoeWorkspace, matmul scratch); memory_plan.cpp names the source of each.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"

namespace strata::gguf {
class File;
}

namespace strata {

// The fixed part of the VRAM plan that no allocation of strata's accounts for: the CUDA context (the runtime's own
// memory, module images loaded lazily, the driver's reserve) and the allocator's slack (cudaMalloc rounds large
// allocations to its page size). memory_plan.cpp says where the numbers come from. The context's part is held back
// only from a --vram-budget (the card's size): a budget from the device's free memory was read after it started.
inline constexpr uint64_t kCudaContextReserve = uint64_t{512} << 20;
inline constexpr uint64_t kAllocatorSlack = uint64_t{128} << 20;

// What the device reports before loading (the caller asks the CUDA backend; the planner never does).
struct DeviceMemory {
    std::string name;
    uint64_t free_bytes = 0;
    int multiprocessors = 0;  // sizes the decode attention's split results; 0: kAssumedMultiprocessors
};

struct MemoryPlanInputs {
    // Bytes strata may take on the device (--vram-budget); 0: the device's free memory less 5% (the CUDA context's
    // default budget), which needs `device`.
    uint64_t vram_budget = 0;
    // Host bytes strata may pin (--ram-budget); nullopt: what is available now (core/memory_info.h).
    std::optional<uint64_t> ram_budget;
    int64_t n_ctx = 4096;     // tokens each sequence holds
    int64_t n_sequences = 1;  // sequences alive at once (server slots)
    // Sequence checkpoints each sequence may hold at once: speculation takes one a round, the server's prefix cache
    // keeps more (server/engine.h EngineOptions::max_checkpoints_per_slot).
    int64_t checkpoints_per_sequence = 1;
    KvCacheType kv_cache = KvCacheType::F16;
    bool qsa_union = false;  // --qsa-union: each sequence also holds the union kernel's workspace
    int64_t prompt_chunk = 0;  // --prompt-chunk: tokens of a prompt window (0: the plan chooses)
    bool stream_experts = true;  // false (--no-expert-stream): prompt windows read misses over PCIe in place
    int stream_buffers = 0;      // --expert-ring: the ring's buffers (0: kStreamBuffers)
    std::optional<DeviceMemory> device;
    // One stage of a split over several GPUs (issue 29; runtime/stage_plan.h): the trunk blocks [first_block,
    // end_block) alone (end_block 0: to the last), the token table where block 0 is, the head and the MTP block
    // where the last block is. Each stage has its own window buffers, workspaces and expert cache.
    int64_t first_block = 0;
    int64_t end_block = 0;
};

// The row cache of PLE tables read from the file (all PLE blocks together, at most the tables' size): ~3M of
// Flash-Next's ~320M rows, enough for the n-grams that recur in a conversation (each token needs 16 rows).
inline constexpr uint64_t kPleRowCacheBytes = uint64_t{512} << 20;

// With experts in pinned host RAM, prompt windows on the grouped MoE path stream every expert no slot holds into VRAM
// (ExpertPlacement::stream_ranges): a layer's experts in kStreamRanges ranges, through kStreamBuffers buffers of
// one range's gate and up, or down, each (Flash-Next IQ2_XS: 64 experts, 58 MB a buffer). With four, the copies run
// up to four ranges ahead of the products that read them: the next layer's first ranges land during its attention.
inline constexpr int kStreamRanges = 8;
inline constexpr int kStreamBuffers = 4;
// Streamed, a 4,096-token window took Flash-Next's pp4096 at 12G from ~450 t/s (512-token windows) to 1,514 for 53
// slots a layer instead of 67, and tg64 lost ~5% (H100 machine, 2026-12-07): without --prompt-chunk the plan takes
// the longest window that keeps at least this share of the slots the default window would leave.
inline constexpr double kStreamWindowSlotShare = 0.75;

enum class PlanPlace { Vram, PinnedHost, HostRam, MappedFile, NotLoaded };
const char* plan_place_name(PlanPlace place);

struct PlanLine {
    std::string what;
    PlanPlace place = PlanPlace::Vram;
    uint64_t bytes = 0;
};

struct MemoryPlan {
    std::vector<PlanLine> lines;  // in print order
    uint64_t vram_budget = 0;
    std::string vram_budget_source;  // "--vram-budget", "free on <device> less 5%"
    uint64_t ram_budget = 0;
    std::string ram_budget_source;  // "--ram-budget", "available now"
    int64_t n_ctx = 0;
    int64_t n_sequences = 1;
    KvCacheType kv_cache = KvCacheType::F16;

    int64_t n_expert = 0;                // routed experts per MoE layer (0: the file has none)
    std::vector<uint64_t> expert_bytes;  // per trunk block: one expert's gate + up + down bytes (0: no experts)
    bool experts_in_vram = true;         // every routed expert fits: no cache, nothing in host memory
    std::vector<int64_t> cache_slots;    // per trunk block, when !experts_in_vram
    bool experts_pinned = false;         // host side: pinned arena (else read from the mapped file)
    uint64_t stream_ring_bytes = 0;      // the ring that streams prompt windows' misses (0: none)
    int stream_buffers = 0;              // its buffers
    bool has_ple = false;
    bool ple_pinned = false;  // else rows read from the file with a row cache
    uint64_t ple_row_cache_bytes = 0;  // when !ple_pinned: each PLE block's row cache (LoadOptions::ple_reader)
    // The CUDA prompt window in tokens: --prompt-chunk, or without it the longest of 4096, 2048 and 1024 that leaves
    // every routed expert in VRAM, else, with the experts streamed, the longest that leaves kStreamWindowSlotShare of
    // the slots, else the default (model.h kDefaultPromptChunk).
    int64_t prompt_window = 0;

    uint64_t vram_total() const;  // every VRAM line, the reserve included
    uint64_t pinned_total() const;
    // The placement the CUDA trunk follows (in_host and cache_slots; no warm set, advisor or CPU workers).
    ExpertPlacement placement() const;
    // The aligned table (GiB with two decimals), one line a part, then the totals against the budgets.
    std::string table() const;
    // One line: "experts all in VRAM" or "expert cache 64/512 per layer, experts in pinned RAM", and the totals.
    std::string summary() const;
};

// Throws Error (one line, naming the number and what to do) when no plan fits: a budget of 0 or below the fixed
// reserve, a budget too small for the dense part, or for the KV cache and states of the asked context (naming the
// largest context that fits). Also throws for files that are not one of the hybrid MoE architectures.
MemoryPlan plan_device_memory(const gguf::File& file, const MemoryPlanInputs& inputs);

}  // namespace strata
