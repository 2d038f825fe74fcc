// The CUDA memory plan (src/runtime/memory_plan.h) without a GPU: on GGUFs written by `strata synth --shapes-only`
// (gguf::Writer::set_data_holes: the tensor directory of a real shape, its data a hole), and variants of them with an
// MTP block or one layer's experts in another type. Oracles: the tensor bytes summed here from each tensor's shape
// and type (core/dtype.h row sizes), classified by name as the GGUF layout says (shared/reference/gguf-qwen4exp.md:
// `*_exps` routed experts, `per_layer_token_embd.weight` the PLE table, blocks from block_count -
// nextn_predict_layers on MTP); KV and GDN state from the hyperparameters (K and V of fp16 or int8 with an fp16 scale
// per 64 values, the conv history of kernel - 1 rows and the dk x dv recurrent state per head); the cache slots as
// the steps of one expert per layer. Device buffers are booked in 256-byte units (backend/cuda/context.cpp).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "core/dtype.h"
#include "core/error.h"
#include "format/gguf.h"
#include "runtime/memory_plan.h"
#include "runtime/stage_plan.h"
#include "test_util.h"

namespace strata {
namespace {

using testing::expect_error;
using testing::process_temp_dir;
using testing::run_strata;
using testing::shell_quote;

constexpr uint64_t kGiB = uint64_t{1} << 30, kMiB = uint64_t{1} << 20;

uint64_t booked(uint64_t n) {
    return std::max<uint64_t>(256, (n + 255) / 256 * 256);
}

uint64_t shape_bytes(const gguf::TensorInfo& t) {
    return row_bytes(t.type, t.ne[0]) * static_cast<uint64_t>(t.ne[1] * t.ne[2] * t.ne[3]);
}

// qwen4exp-mid (16 layers, hidden 1024, 64 experts, PLE) with Q4_K experts: 1.07 GiB of shapes, 1 MB on disk.
const std::string& mid_path() {
    static const std::string path = [] {
        const std::string p = process_temp_dir() / "mid.gguf";
        synth_model({.preset = "qwen4exp-mid", .expert_type = DType::Q4_K, .out_path = p, .shapes_only = true});
        return p;
    }();
    return path;
}

// mid with changes: one more block as an MTP block (nextn_predict_layers 1), or block 0's experts as Q8_0.
std::string mid_variant(const std::string& name, bool mtp, bool q8_0_block0) {
    const std::string path = process_temp_dir() / name;
    const auto src = gguf::File::open(mid_path());
    gguf::Writer w;
    for (const gguf::KeyValue& kv : src->kvs()) {
        gguf::Value v = kv.value;
        if (mtp && kv.key == "qwen4exp.block_count") v = gguf::Value::of_u32(17);
        if (mtp && kv.key == "qwen4exp.attention.compress_ratios") v.arr.push_back(v.arr.front());
        w.set(kv.key, v);
    }
    if (mtp) w.set("qwen4exp.nextn_predict_layers", gguf::Value::of_u32(1));
    for (const gguf::TensorInfo& t : src->tensors()) {
        const bool expert0 = q8_0_block0 && t.name.rfind("blk.0.", 0) == 0 && t.name.find("_exps") != std::string::npos;
        w.add_tensor(t.name, expert0 ? DType::Q8_0 : t.type, {t.ne, t.ne + t.n_dims}, nullptr);
    }
    if (mtp) {
        w.add_tensor("blk.16.nextn.eh_proj.weight", DType::F16, {2048, 1024}, nullptr);
        w.add_tensor("blk.16.ffn_down_exps.weight", DType::Q8_0, {256, 1024, 64}, nullptr);
    }
    w.set_data_holes(true);
    w.write(path);
    return path;
}

struct Roles {
    uint64_t dense = 0, experts = 0, ple = 0, mtp = 0;
    uint64_t experts_uploaded = 0;    // every expert tensor one upload
    std::vector<uint64_t> per_layer;  // one cache slot per trunk block: each expert tensor's slice at 256 bytes
    uint64_t row() const {            // one slot in every layer
        uint64_t r = 0;
        for (uint64_t b : per_layer) r += b;
        return r;
    }
    uint64_t all_experts() const { return experts_uploaded; }
};

Roles roles(const gguf::File& f) {
    const int64_t n_all = f.get_u32("qwen4exp.block_count");
    const int64_t n_trunk = n_all - f.get_u32_opt("qwen4exp.nextn_predict_layers").value_or(0);
    const int64_t n_expert = f.get_u32("qwen4exp.expert_count");
    Roles r;
    r.per_layer.assign(static_cast<size_t>(n_trunk), 0);
    for (const gguf::TensorInfo& t : f.tensors()) {
        const uint64_t bytes = shape_bytes(t);
        int64_t block = -1;
        if (t.name.rfind("blk.", 0) == 0) block = std::stoll(t.name.substr(4));
        if (t.name == "per_layer_token_embd.weight")
            r.ple += bytes;
        else if (block >= n_trunk)
            r.mtp += bytes;
        else if (t.name.find("_exps") != std::string::npos) {
            r.experts += bytes;
            r.experts_uploaded += booked(bytes);
            r.per_layer[static_cast<size_t>(block)] += booked(bytes / static_cast<uint64_t>(n_expert));
        } else {
            r.dense += booked(bytes);
        }
    }
    return r;
}

uint64_t line(const MemoryPlan& plan, const std::string& prefix, PlanPlace* place = nullptr) {
    for (const PlanLine& l : plan.lines)
        if (l.what.rfind(prefix, 0) == 0) {
            if (place) *place = l.place;
            return l.bytes;
        }
    ADD_FAILURE() << "no plan line starting with '" << prefix << "'";
    return 0;
}

bool has_line(const MemoryPlan& plan, const std::string& prefix) {
    return std::any_of(plan.lines.begin(), plan.lines.end(),
                       [&](const PlanLine& l) { return l.what.rfind(prefix, 0) == 0; });
}

// With the default prompt window fixed (the plan would otherwise lengthen it where every expert fits: see
// PromptWindowGrowsOnlyIntoMemoryTheExpertsDoNotNeed), so that plans at different budgets share their workspaces.
// Without the ring that streams prompt windows' misses unless asked (PromptWindowsStreamThroughARing checks it), so
// that the slot arithmetic below stays the slots' alone.
MemoryPlan plan_for(const std::string& path, uint64_t vram, uint64_t ram = 1024 * kGiB, int64_t ctx = 4096,
                    KvCacheType kv = KvCacheType::F16, bool stream = false) {
    const auto f = gguf::File::open(path);
    return plan_device_memory(*f, {.vram_budget = vram,
                                   .ram_budget = ram,
                                   .n_ctx = ctx,
                                   .kv_cache = kv,
                                   .prompt_chunk = strata::kDefaultPromptChunk,
                                   .stream_experts = stream});
}

// VRAM the plan takes besides the experts, at a budget where they all fit (measured once; the tests below check
// steps from it of sizes worked out here).
uint64_t non_expert_vram(const std::string& path) {
    const MemoryPlan p = plan_for(path, 64 * kGiB);
    EXPECT_TRUE(p.experts_in_vram);
    return p.vram_total() - line(p, "routed experts (all");
}

TEST(MemoryPlan, HoleFileHasItsFullSizeAndReadsAsZeros) {
    const auto f = gguf::File::open(mid_path());
    uint64_t data = 0;
    for (const gguf::TensorInfo& t : f->tensors()) {
        EXPECT_EQ(t.n_bytes, shape_bytes(t)) << t.name;
        data += t.n_bytes;
    }
    EXPECT_GT(data, kGiB);
    struct stat st {};
    ASSERT_EQ(::stat(mid_path().c_str(), &st), 0);
    EXPECT_GE(static_cast<uint64_t>(st.st_size), data);
    EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 64 * kMiB);  // sparse: the header's blocks only
    const gguf::TensorInfo* t = f->find_tensor("blk.3.ffn_down_exps.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(std::all_of(t->data, t->data + 4096, [](uint8_t b) { return b == 0; }));
}

TEST(MemoryPlan, TensorsArePlacedByRole) {
    const std::string path = mid_variant("mid_mtp.gguf", /*mtp=*/true, false);
    const auto f = gguf::File::open(path);
    const Roles r = roles(*f);
    ASSERT_GT(r.mtp, 0u);
    ASSERT_GT(r.ple, 0u);
    const MemoryPlan p = plan_for(path, 64 * kGiB);
    PlanPlace place{};
    EXPECT_EQ(line(p, "dense weights", &place), r.dense);
    EXPECT_EQ(place, PlanPlace::Vram);
    EXPECT_EQ(line(p, "routed experts (all 64 per layer)", &place), r.all_experts());
    EXPECT_EQ(place, PlanPlace::Vram);
    EXPECT_EQ(line(p, "PLE table", &place), r.ple);
    EXPECT_EQ(place, PlanPlace::PinnedHost);
    EXPECT_EQ(line(p, "MTP blocks", &place), r.mtp);
    EXPECT_EQ(place, PlanPlace::NotLoaded);
    EXPECT_EQ(line(p, "CUDA context", &place), kCudaContextReserve + kAllocatorSlack);
    EXPECT_EQ(p.expert_bytes, r.per_layer);
    // Every tensor is in exactly one of the four.
    uint64_t file_bytes = 0, dense_raw = 0;
    for (const gguf::TensorInfo& t : f->tensors()) file_bytes += shape_bytes(t);
    dense_raw = file_bytes - r.experts - r.ple - r.mtp;
    EXPECT_LE(dense_raw, r.dense);
    EXPECT_LT(r.dense - dense_raw, 256 * f->tensors().size());
    const ExpertPlacement e = p.placement();
    EXPECT_FALSE(e.in_host);
    EXPECT_TRUE(e.cache_slots.empty());
}

TEST(MemoryPlan, KvCacheAndGdnStateFollowTheHyperparameters) {
    // mid: 16 blocks, every 4th attention (4 of them), 2 KV heads of 128; GDN: 8 key heads of dk 64, 16 value heads of
    // dv 1024 / 16 = 64, conv kernel 4 over 2 * 8 * 64 + 16 * 64 = 2048 channels.
    const int64_t n_attention = 4, n_recurrent = 12, nkv = 2, hd = 128;
    for (int64_t ctx : {int64_t{256}, int64_t{4096}, int64_t{65536}}) {
        const uint64_t cells = static_cast<uint64_t>(ctx * nkv * hd);
        // K and V, the identity page table (one int32 a 4-cell page) and the cache length.
        const uint64_t f16 = n_attention * (2 * cells * 2 + static_cast<uint64_t>(ctx) + 256);
        const uint64_t int8 = n_attention * (2 * cells + 2 * (cells / 64) * 2 + static_cast<uint64_t>(ctx) + 256);
        EXPECT_EQ(line(plan_for(mid_path(), 64 * kGiB, kGiB, ctx), "KV cache (f16"), f16) << ctx;
        EXPECT_EQ(line(plan_for(mid_path(), 64 * kGiB, kGiB, ctx, KvCacheType::Int8), "KV cache (int8"), int8) << ctx;
    }
    // --qsa-union adds its workspace and nothing else.
    const auto f = gguf::File::open(mid_path());
    const MemoryPlan plain = plan_device_memory(*f, {.vram_budget = 64 * kGiB, .ram_budget = kGiB});
    const MemoryPlan with_union =
        plan_device_memory(*f, {.vram_budget = 64 * kGiB, .ram_budget = kGiB, .qsa_union = true});
    EXPECT_FALSE(has_line(plain, "QSA union workspace"));
    EXPECT_EQ(with_union.vram_total() - plain.vram_total(), line(with_union, "QSA union workspace"));
    const uint64_t gdn = n_recurrent * (booked(3 * 2048 * 4) + booked(16 * 64 * 64 * 4));
    EXPECT_EQ(line(plan_for(mid_path(), 64 * kGiB), "GDN conv + recurrent state"), gdn);
    // Two sequences (server slots) hold twice the state.
    const MemoryPlan two =
        plan_device_memory(*f, {.vram_budget = 64 * kGiB, .ram_budget = kGiB, .n_ctx = 4096, .n_sequences = 2});
    EXPECT_EQ(line(two, "GDN conv + recurrent state"), 2 * gdn);
    EXPECT_EQ(line(two, "KV cache (f16"), 2 * n_attention * (2 * uint64_t{4096 * nkv * hd} * 2 + 4096 + 256));
    // A checkpoint a sequence (speculation rounds, the server's prefix cache): a copy of the GDN state, the PLE
    // history and each attention block's cache length, in one allocation.
    const MemoryPlan one = plan_for(mid_path(), 64 * kGiB);
    const uint64_t checkpoint = gdn + line(one, "PLE token + conv history") + n_attention * 256;
    EXPECT_EQ(line(one, "sequence checkpoint"), checkpoint);
    EXPECT_EQ(line(two, "sequence checkpoint"), 2 * checkpoint);
    // The server's slots hold their prefix-cache checkpoints too (app/cmd_serve.cpp asks for 5 a slot by default).
    const MemoryPlan served = plan_device_memory(
        *f, {.vram_budget = 64 * kGiB, .ram_budget = kGiB, .n_sequences = 2, .checkpoints_per_sequence = 5});
    EXPECT_EQ(line(served, "sequence checkpoints (5 a sequence"), 2 * 5 * checkpoint);
    EXPECT_EQ(served.vram_total() - two.vram_total(), 2 * 4 * checkpoint);
    EXPECT_THROW(plan_device_memory(*f, {.vram_budget = 64 * kGiB, .checkpoints_per_sequence = 0}), Error);
    // A sequence that verifies drafts keeps a decode window's (8 tokens') inputs to each GDN block (conv input and
    // q/k/v rows of 2048 channels, decay and strength of 16 heads) and to the PLE block (4 streams of 1024).
    const uint64_t records = n_recurrent * (2 * booked(8 * 2048 * 4) + 2 * booked(8 * 16 * 4)) + booked(8 * 4096 * 4);
    EXPECT_EQ(line(one, "speculation window records"), records);
    EXPECT_EQ(line(two, "speculation window records"), 2 * records);
}

// Without --prompt-chunk: the longest window (4096, 2048, 1024) with which every routed expert still fits in VRAM,
// else the default; the plan's totals are those of a plan asked for that window.
TEST(MemoryPlan, PromptWindowGrowsOnlyIntoMemoryTheExpertsDoNotNeed) {
    const auto f = gguf::File::open(mid_path());
    auto chosen = [&](uint64_t vram) { return plan_device_memory(*f, {.vram_budget = vram, .ram_budget = kGiB}); };
    auto asked = [&](uint64_t vram, int64_t chunk) {
        return plan_device_memory(*f, {.vram_budget = vram, .ram_budget = kGiB, .prompt_chunk = chunk});
    };
    const MemoryPlan roomy = chosen(64 * kGiB);
    EXPECT_EQ(roomy.prompt_window, 4096);
    EXPECT_TRUE(roomy.experts_in_vram);
    EXPECT_EQ(roomy.vram_total(), asked(64 * kGiB, 4096).vram_total());
    // The smallest budget that holds every expert beside the 4096-token window, and one byte less.
    const MemoryPlan long_window = asked(64 * kGiB, 4096);
    const uint64_t just = long_window.vram_total();
    EXPECT_EQ(chosen(just).prompt_window, 4096);
    const MemoryPlan shorter = chosen(just - 1);
    EXPECT_LT(shorter.prompt_window, 4096);
    EXPECT_TRUE(shorter.experts_in_vram);
    EXPECT_EQ(shorter.vram_total(), asked(just - 1, shorter.prompt_window).vram_total());
    // Where the experts do not all fit even beside the default window, it stays the default when prompt windows read
    // their misses in place; streamed, it is the longest window that keeps kStreamWindowSlotShare of the slots.
    const uint64_t tight_budget = asked(64 * kGiB, strata::kDefaultPromptChunk).vram_total() - 1;
    const MemoryPlan in_place =
        plan_device_memory(*f, {.vram_budget = tight_budget, .ram_budget = kGiB, .stream_experts = false});
    EXPECT_FALSE(in_place.experts_in_vram);
    EXPECT_EQ(in_place.prompt_window, strata::kDefaultPromptChunk);
    const auto fewest = [](const MemoryPlan& p) {
        return *std::min_element(p.cache_slots.begin(), p.cache_slots.end());
    };
    const double keep = kStreamWindowSlotShare * static_cast<double>(fewest(asked(tight_budget, kDefaultPromptChunk)));
    const MemoryPlan streamed = chosen(tight_budget);
    EXPECT_GT(streamed.stream_ring_bytes, 0u);
    EXPECT_GT(streamed.prompt_window, strata::kDefaultPromptChunk);
    EXPECT_GE(static_cast<double>(fewest(streamed)), keep);
    if (streamed.prompt_window < 4096) {
        EXPECT_LT(static_cast<double>(fewest(asked(tight_budget, 2 * streamed.prompt_window))), keep);
    }
    // An explicit window is kept, and one outside 16..8192 is a one-line error.
    EXPECT_EQ(asked(2 * kGiB, 64).prompt_window, 64);
    expect_error([&] { asked(64 * kGiB, 8193); }, "outside 16..8192");
}

TEST(MemoryPlan, LeftoverBecomesTheSameSlotCountInEveryLayer) {
    const auto f = gguf::File::open(mid_path());
    const Roles r = roles(*f);
    const uint64_t base = non_expert_vram(mid_path());
    const uint64_t hold_back = 256 * r.per_layer.size();  // each layer's cache: one allocation rounded to 256
    const uint64_t tables = 16 * 3 * 64 * 8;              // per layer, where each expert's 3 tensors are now
    for (int64_t k : {0, 1, 17, 63}) {
        const MemoryPlan p =
            plan_for(mid_path(), base + tables + hold_back + static_cast<uint64_t>(k) * r.row() + r.row() / 2);
        EXPECT_FALSE(p.experts_in_vram) << k;
        EXPECT_EQ(line(p, "expert address tables"), tables);
        ASSERT_EQ(p.cache_slots.size(), r.per_layer.size());
        for (int64_t slots : p.cache_slots) EXPECT_EQ(slots, k);
        uint64_t cache = 0;
        for (uint64_t b : r.per_layer) cache += (b * static_cast<uint64_t>(k) + 255) / 256 * 256;
        if (k > 0) {
            EXPECT_EQ(line(p, "expert cache (" + std::to_string(k) + " of 64 per layer)"), cache);
        }
        EXPECT_LE(p.vram_total(), p.vram_budget);
        const ExpertPlacement e = p.placement();
        EXPECT_TRUE(e.in_host);
        EXPECT_EQ(e.cache_slots, p.cache_slots);
    }
    // Every expert fits: no cache, nothing in host memory for them.
    const MemoryPlan all = plan_for(mid_path(), base + r.all_experts());
    EXPECT_TRUE(all.experts_in_vram);
    EXPECT_TRUE(
        std::none_of(all.lines.begin(), all.lines.end(), [](const PlanLine& l) { return l.what == "routed experts"; }));
    EXPECT_FALSE(has_line(all, "expert cache"));
    const MemoryPlan short_by_one = plan_for(mid_path(), base + r.all_experts() - 1);
    EXPECT_FALSE(short_by_one.experts_in_vram);
    for (int64_t slots : short_by_one.cache_slots) EXPECT_EQ(slots, 63);
}

// With experts pinned, prompt windows stream their misses through kStreamBuffers buffers, each one of a layer's
// kStreamRanges ranges of gate and up (or down): the ring is booked before the slots, which get what is left.
TEST(MemoryPlan, PromptWindowsStreamThroughARing) {
    const auto f = gguf::File::open(mid_path());
    const Roles r = roles(*f);
    uint64_t pass[2] = {0, 0};  // one expert's gate and up, and its down, in the layer that has the most
    for (int64_t b = 0; b < 16; ++b) {
        uint64_t here[2] = {0, 0};
        for (const char* name : {"gate", "up", "down"}) {
            const gguf::TensorInfo* t = f->find_tensor("blk." + std::to_string(b) + ".ffn_" + name + "_exps.weight");
            ASSERT_NE(t, nullptr) << name;
            here[std::string(name) == "down"] += booked(shape_bytes(*t) / 64);
        }
        for (int i = 0; i < 2; ++i) pass[i] = std::max(pass[i], here[i]);
    }
    const uint64_t ring =
        booked(static_cast<uint64_t>(kStreamBuffers) * (64 / kStreamRanges) * std::max(pass[0], pass[1]));
    const uint64_t budget = non_expert_vram(mid_path()) + 16 * 3 * 64 * 8 + 256 * 16 + 9 * r.row() + r.row() / 2;
    const MemoryPlan streamed = plan_for(mid_path(), budget + ring, 1024 * kGiB, 4096, KvCacheType::F16, true);
    EXPECT_EQ(line(streamed, "expert stream ring (prompt windows)"), ring);
    EXPECT_EQ(streamed.stream_ring_bytes, ring);
    for (int64_t slots : streamed.cache_slots) EXPECT_EQ(slots, 9);
    EXPECT_EQ(streamed.placement().stream_ranges, kStreamRanges);
    EXPECT_EQ(streamed.placement().stream_buffers, kStreamBuffers);
    EXPECT_LE(streamed.vram_total(), streamed.vram_budget);
    // Without it (--no-expert-stream) the same budget buys the slots the ring took.
    const MemoryPlan in_place = plan_for(mid_path(), budget + ring, 1024 * kGiB, 4096, KvCacheType::F16, false);
    EXPECT_FALSE(has_line(in_place, "expert stream ring"));
    EXPECT_EQ(in_place.placement().stream_ranges, 0);
    EXPECT_GE(in_place.cache_slots[0], 9 + static_cast<int64_t>(ring / r.row()));
    // Experts read from the mapped file stream too (the driver stages each copy from the file's pages).
    const MemoryPlan unpinned = plan_for(mid_path(), budget + ring, r.experts - 1, 4096, KvCacheType::F16, true);
    EXPECT_TRUE(unpinned.placement().from_file);
    EXPECT_TRUE(has_line(unpinned, "expert stream ring"));
    EXPECT_EQ(unpinned.placement().stream_ranges, kStreamRanges);
    // Experts all in VRAM: no ring.
    EXPECT_FALSE(has_line(plan_for(mid_path(), 64 * kGiB, 1024 * kGiB, 4096, KvCacheType::F16, true), "expert stream"));
}

TEST(MemoryPlan, CheaperLayersGetTheSlotsTheRemainderAllows) {
    // Block 0's experts in Q8_0 cost more than the Q4_K of the other 15: after the common count, what is left buys
    // one more slot in as many of the cheap layers as it pays for.
    const std::string path = mid_variant("mid_q8_0_block0.gguf", false, /*q8_0_block0=*/true);
    const Roles r = roles(*gguf::File::open(path));
    ASSERT_GT(r.per_layer[0], r.per_layer[1]);
    const uint64_t base = non_expert_vram(path);
    const uint64_t hold_back = 256 * r.per_layer.size();
    const int64_t k = 20;
    const uint64_t tables = 16 * 3 * 64 * 8;
    const MemoryPlan p =
        plan_for(path, base + tables + hold_back + k * r.row() + 3 * r.per_layer[1] + r.per_layer[1] / 2);
    ASSERT_FALSE(p.experts_in_vram);
    EXPECT_EQ(p.cache_slots[0], k);
    EXPECT_EQ(std::count(p.cache_slots.begin(), p.cache_slots.end(), k + 1), 3);
    EXPECT_EQ(std::count(p.cache_slots.begin(), p.cache_slots.end(), k), 13);
}

TEST(MemoryPlan, HostSidePinsWhatTheRamBudgetHolds) {
    const Roles r = roles(*gguf::File::open(mid_path()));
    const uint64_t host_plan_vram = non_expert_vram(mid_path()) + 16 * 3 * 64 * 8 + 4 * r.row() + 256 * 16;
    PlanPlace place{};
    MemoryPlan p = plan_for(mid_path(), host_plan_vram, r.experts + r.ple);
    EXPECT_TRUE(p.experts_pinned);
    EXPECT_FALSE(p.placement().from_file);
    const uint64_t pinned_ring = p.stream_ring_bytes;
    EXPECT_TRUE(p.ple_pinned);
    EXPECT_EQ(line(p, "routed experts", &place), r.experts);
    EXPECT_EQ(place, PlanPlace::PinnedHost);
    EXPECT_EQ(p.pinned_total(), r.experts + r.ple);
    p = plan_for(mid_path(), host_plan_vram, r.experts + r.ple - 1);  // the PLE table no longer fits beside them
    EXPECT_TRUE(p.experts_pinned);
    EXPECT_FALSE(p.ple_pinned);
    EXPECT_EQ(line(p, "PLE table (rows read with a row cache)", &place), r.ple);
    EXPECT_EQ(place, PlanPlace::MappedFile);
    p = plan_for(mid_path(), host_plan_vram, r.experts - 1);
    EXPECT_FALSE(p.experts_pinned);
    // Read from the mapped file: the CPU workers compute the misses, and prompt windows still stream (staged copies).
    EXPECT_TRUE(p.placement().from_file);
    EXPECT_EQ(p.stream_ring_bytes, pinned_ring);
    EXPECT_EQ(line(p, "routed experts", &place), r.experts);
    EXPECT_EQ(place, PlanPlace::MappedFile);
    EXPECT_NE(p.summary().find("read from the mapped file"), std::string::npos);
    // Experts all in VRAM: the PLE table has the whole RAM budget.
    p = plan_for(mid_path(), 64 * kGiB, r.ple);
    EXPECT_TRUE(p.ple_pinned);
}

TEST(MemoryPlan, PleRowsFromTheFileHaveAPlannedCacheAndStaging) {
    const Roles r = roles(*gguf::File::open(mid_path()));
    const MemoryPlan pinned = plan_for(mid_path(), 64 * kGiB, r.ple);
    ASSERT_TRUE(pinned.ple_pinned);
    EXPECT_EQ(pinned.ple_row_cache_bytes, 0u);
    for (const PlanLine& l : pinned.lines) EXPECT_EQ(l.what.rfind("PLE row", 0), std::string::npos) << l.what;
    const MemoryPlan p = plan_for(mid_path(), 64 * kGiB, r.ple - 1);
    ASSERT_FALSE(p.ple_pinned);
    // One PLE block: its reader's cache is the table's size at most, kPleRowCacheBytes at most.
    EXPECT_GT(p.ple_row_cache_bytes, 0u);
    EXPECT_EQ(p.ple_row_cache_bytes, std::min(r.ple, kPleRowCacheBytes));
    PlanPlace place{};
    EXPECT_GE(line(p, "PLE row cache and read buffers", &place), p.ple_row_cache_bytes);
    EXPECT_EQ(place, PlanPlace::HostRam);
    EXPECT_GT(line(p, "PLE row staging", &place), 0u);  // one prompt window's rows
    EXPECT_EQ(place, PlanPlace::PinnedHost);
    EXPECT_NE(p.table().find("host RAM"), std::string::npos);
}

TEST(MemoryPlan, ImpossiblePlansAreOneLineErrors) {
    const auto f = gguf::File::open(mid_path());
    const Roles r = roles(*f);
    const uint64_t reserve = kCudaContextReserve + kAllocatorSlack;
    auto plan = [&](uint64_t vram, int64_t ctx = 4096) {
        return plan_device_memory(*f, {.vram_budget = vram, .ram_budget = kGiB, .n_ctx = ctx});
    };
    expect_error([&] { plan_device_memory(*f, {.n_ctx = 4096}); }, "needs a VRAM budget: give --vram-budget");
    expect_error([&] { plan_device_memory(*f, {.n_ctx = 4096, .device = DeviceMemory{.name = "X"}}); },
                 "VRAM budget is 0 bytes");
    expect_error([&] { plan(reserve); }, "not more than the 640.0 MiB the CUDA context and allocator slack take");
    expect_error([&] { plan(256 * kMiB); }, "raise --vram-budget");
    expect_error([&] { plan(reserve + r.dense - 1); }, "the dense weights");
    char dense_text[32];
    std::snprintf(dense_text, sizeof dense_text, "need %.1f MiB", static_cast<double>(r.dense) / kMiB);
    expect_error([&] { plan(reserve + r.dense - 1); }, dense_text);
    // The dense part fits, the state of 65536 tokens does not: the message names the largest context that does.
    const uint64_t budget = reserve + r.dense + 400 * kMiB;  // the workspaces of a 512-token prompt window take ~140
    std::string message;
    try {
        plan(budget, 65536);
    } catch (const Error& e) {
        message = e.what();
    }
    ASSERT_NE(message.find("the KV cache, states and workspaces for 65536 tokens"), std::string::npos) << message;
    const std::string marker = "the largest context that fits is ";
    const size_t at = message.find(marker);
    ASSERT_NE(at, std::string::npos) << message;
    const int64_t largest = std::stoll(message.substr(at + marker.size()));
    EXPECT_GT(largest, 0);
    EXPECT_LT(largest, 65536);
    EXPECT_NO_THROW(plan(budget, largest));
    expect_error([&] { plan(budget, largest + 1); }, marker + std::to_string(largest) + " tokens");
    // One more token costs, in each of the 4 attention layers (all QSA, ratio 4, indexer keys of 64): K and V rows of
    // 2 heads x 128 fp16, a quarter of a page-table entry, a raw indexer key of 64 floats and a quarter of a pooled
    // one; and a quarter of a block of QSA selection workspace (12 bytes for each of the 64 queries a launch takes).
    // 1024 more tokens fit in that much more budget, give or take what the largest context left unused (less than a
    // token) and the 256-byte rounding of the 20 buffers that grow with the context.
    const uint64_t per_token = 4 * (2 * 2 * 128 * 2 + 1 + 64 * 4 + 64) + 64 * 12 / 4, rounding = 20 * 256;
    EXPECT_NO_THROW(plan(budget + 1024 * per_token + rounding, largest + 1024));
    expect_error([&] { plan(budget + 1024 * per_token - per_token - rounding, largest + 1024); },
                 "the largest context that fits");
}

TEST(MemoryPlan, DeviceFreeMemoryCapsOrSetsTheBudget) {
    const auto f = gguf::File::open(mid_path());
    const DeviceMemory card{.name = "Test GPU", .free_bytes = 10 * kGiB, .multiprocessors = 40};
    const MemoryPlan capped = plan_device_memory(*f, {.vram_budget = 24 * kGiB, .ram_budget = kGiB, .device = card});
    EXPECT_EQ(capped.vram_budget, 10 * kGiB);
    EXPECT_NE(capped.vram_budget_source.find("capped at what is free on Test GPU"), std::string::npos);
    const MemoryPlan by_free = plan_device_memory(*f, {.ram_budget = kGiB, .device = card});
    EXPECT_EQ(by_free.vram_budget, 10 * kGiB / 20 * 19);
    // Free memory is read after the CUDA context started: only the allocator slack is held back then.
    EXPECT_EQ(line(by_free, "allocator slack (context started)"), kAllocatorSlack);
    EXPECT_EQ(line(capped, "allocator slack (context started)"), kAllocatorSlack);
    const MemoryPlan given = plan_device_memory(*f, {.vram_budget = 8 * kGiB, .ram_budget = kGiB, .device = card});
    EXPECT_EQ(line(given, "CUDA context + allocator slack"), kCudaContextReserve + kAllocatorSlack);
}

TEST(MemoryPlan, InfoPrintsThePlanWithoutAGpu) {
    const Roles r = roles(*gguf::File::open(mid_path()));
    const testing::ShellRun ok = run_strata("info " + shell_quote(mid_path()) + " --vram-budget 4G --ram-budget 64G");
    ASSERT_EQ(ok.status, 0) << ok.err;
    EXPECT_NE(ok.out.find("memory plan (--backend cuda) for 4096 tokens"), std::string::npos) << ok.out;
    char dense[32];
    std::snprintf(dense, sizeof dense, "%.2f", static_cast<double>(r.dense) / kGiB);
    const size_t at = ok.out.find("\n  dense weights ");
    ASSERT_NE(at, std::string::npos) << ok.out;
    std::istringstream row(ok.out.substr(at + 1, ok.out.find('\n', at + 1) - at - 1));
    std::vector<std::string> words;
    for (std::string w; row >> w;) words.push_back(w);
    EXPECT_EQ(words, (std::vector<std::string>{"dense", "weights", "VRAM", dense})) << ok.out;
    EXPECT_NE(ok.out.find("experts all in VRAM"), std::string::npos) << ok.out;
    EXPECT_NE(ok.out.find("VRAM budget 4.00 GiB (--vram-budget)"), std::string::npos) << ok.out;

    testing::expect_user_error(run_strata("info " + shell_quote(mid_path()) + " --vram-budget 700M"), "dense weights");
    testing::expect_user_error(run_strata("info " + shell_quote(mid_path()) + " --vram-budget 12X"),
                               "--vram-budget expects a size");
    // Every loading command plans before it loads, in any build: an impossible plan is exit 2 before the backend.
    testing::expect_user_error(run_strata("generate --model " + shell_quote(mid_path()) +
                                          " --tokens '1 2' -n 2 --backend cuda --vram-budget 100M"),
                               "CUDA context and allocator slack");
    testing::expect_user_error(
        run_strata("generate --model " + shell_quote(mid_path()) + " --tokens '1 2' -n 2 --ram-budget 1G"),
        "apply to --backend cuda only");
}

// A split over cards (runtime/stage_plan.h, issue 29): each stage's dense weights are its blocks' tensors, the token
// table on the first and output* on the last, summed here by name; the stages' expert slots and states are the
// whole model's, layer for layer; the blocks cover the trunk once, in order.
TEST(StagePlan, StagesHoldTheirOwnBlocksAndAddUpToTheWholeModel) {
    const std::string path = mid_variant("mid_split.gguf", /*mtp=*/true, false);
    const auto f = gguf::File::open(path);
    const MemoryPlanInputs card{
        .vram_budget = 64 * kGiB, .ram_budget = 1024 * kGiB, .prompt_chunk = strata::kDefaultPromptChunk};
    const MemoryPlan whole = plan_device_memory(*f, card);
    const std::vector<StagePlan> stages = plan_stages(*f, parse_stage_split("6,10"), {card, card});
    ASSERT_EQ(stages.size(), 2u);
    EXPECT_EQ(stages[0].first_block, 0);
    EXPECT_EQ(stages[0].end_block, 6);
    EXPECT_EQ(stages[1].first_block, 6);
    EXPECT_EQ(stages[1].end_block, 16);
    uint64_t dense[2] = {0, 0};
    for (const gguf::TensorInfo& t : f->tensors()) {
        const int64_t block = t.name.rfind("blk.", 0) == 0 ? std::stoll(t.name.substr(4)) : -1;
        if (t.name == "per_layer_token_embd.weight" || block >= 16 || t.name.find("_exps") != std::string::npos)
            continue;
        const int stage = block >= 0 ? (block < 6 ? 0 : 1) : t.name == "token_embd.weight" ? 0 : 1;
        dense[stage] += booked(shape_bytes(t));
    }
    EXPECT_EQ(line(stages[0].plan, "dense weights"), dense[0]);
    EXPECT_EQ(line(stages[1].plan, "dense weights"), dense[1]);
    EXPECT_EQ(dense[0] + dense[1], line(whole, "dense weights"));
    const Roles r = roles(*f);
    EXPECT_EQ(stages[0].plan.expert_bytes, std::vector<uint64_t>(r.per_layer.begin(), r.per_layer.begin() + 6));
    EXPECT_EQ(stages[1].plan.expert_bytes, std::vector<uint64_t>(r.per_layer.begin() + 6, r.per_layer.end()));
    // mid's attention blocks are 3, 7, 11 and 15 (every 4th): one KV cache on the first stage, three on the second.
    EXPECT_EQ(line(stages[0].plan, "KV cache") * 3, line(stages[1].plan, "KV cache"));
    EXPECT_EQ(line(stages[0].plan, "KV cache") + line(stages[1].plan, "KV cache"), line(whole, "KV cache"));
    EXPECT_EQ(line(stages[0].plan, "GDN conv") + line(stages[1].plan, "GDN conv"), line(whole, "GDN conv"));
    // The PLE block (block 2 of mid) and its table go with the first stage; the MTP block with the last.
    EXPECT_TRUE(has_line(stages[0].plan, "PLE table"));
    EXPECT_FALSE(has_line(stages[1].plan, "PLE table"));
    EXPECT_FALSE(has_line(stages[0].plan, "MTP blocks"));
    EXPECT_EQ(line(stages[1].plan, "MTP blocks"), r.mtp);
    const std::string table = stages_table(stages);
    EXPECT_NE(table.find("stage 0: blocks 0-5 and the token table\n"), std::string::npos) << table;
    EXPECT_NE(table.find("stage 1: blocks 6-15 and the head\n"), std::string::npos) << table;
}

// "auto" cuts where each card's share of the weights comes closest to its share of the budgets: equal cards take
// halves, a card with three times the budget about three quarters; a card too small for its stage is an error
// naming the stage.
TEST(StagePlan, AutomaticSplitFollowsTheBudgets) {
    const auto f = gguf::File::open(mid_path());
    const MemoryPlanInputs small{.vram_budget = 4 * kGiB, .ram_budget = 1024 * kGiB};
    MemoryPlanInputs large = small;
    large.vram_budget = 12 * kGiB;
    const auto blocks = [](const std::vector<StagePlan>& s) {
        std::vector<int64_t> n;
        for (const StagePlan& p : s) n.push_back(p.end_block - p.first_block);
        return n;
    };
    const std::vector<int64_t> even = blocks(plan_stages(*f, parse_stage_split("auto"), {small, small}));
    ASSERT_EQ(even.size(), 2u);
    EXPECT_NEAR(static_cast<double>(even[0]), 8.0, 1.0);
    EXPECT_EQ(even[0] + even[1], 16);
    const std::vector<int64_t> uneven = blocks(plan_stages(*f, parse_stage_split("auto"), {small, large}));
    EXPECT_NEAR(static_cast<double>(uneven[1]), 12.0, 1.0);
    const std::vector<int64_t> three = blocks(plan_stages(*f, parse_stage_split("auto"), {small, small, small}));
    EXPECT_EQ(three.size(), 3u);
    for (const int64_t n : three) EXPECT_NEAR(static_cast<double>(n), 16.0 / 3, 1.0);

    // Where the experts do not all fit, no cut holds a larger share of any layer's experts in the worst-served layer
    // than auto's (each card keeps its own reserve and workspaces, which a cut by the weights alone does not see).
    const auto worst_share = [](const std::vector<StagePlan>& stages) {
        double worst = 1.0;
        for (const StagePlan& st : stages)
            for (const int64_t slots : st.plan.cache_slots) worst = std::min(worst, slots / 64.0);
        return worst;
    };
    MemoryPlanInputs card_a = small, card_b = small;
    card_a.vram_budget = 900 * kMiB;
    card_b.vram_budget = 1 * kGiB;
    const std::vector<StagePlan> tight = plan_stages(*f, parse_stage_split("auto"), {card_a, card_b});
    ASSERT_FALSE(tight[0].plan.experts_in_vram || tight[1].plan.experts_in_vram);
    const double auto_share = worst_share(tight);
    for (int64_t k = 1; k < 16; ++k) {
        std::vector<StagePlan> other;
        try {
            other =
                plan_stages(*f, parse_stage_split(std::to_string(k) + "," + std::to_string(16 - k)), {card_a, card_b});
        } catch (const Error&) {
            continue;  // a stage that does not fit its card
        }
        EXPECT_GE(auto_share, worst_share(other)) << "split " << k << "," << 16 - k;
    }

    MemoryPlanInputs tiny = small;
    tiny.vram_budget = 300 * kMiB;
    expect_error([&] { (void)plan_stages(*f, parse_stage_split("8,8"), {small, tiny}); }, "stage 1 (blocks 8-15)");
    expect_error([&] { (void)plan_stages(*f, parse_stage_split("8,7"), {small, small}); }, "places 15 blocks");
    expect_error([&] { (void)plan_stages(*f, parse_stage_split("8,4,4"), {small, small}); }, "3 stages for 2 cards");
    expect_error([&] { (void)plan_stages(*f, parse_stage_split("auto"), {small}); }, "two cards");
    for (const char* bad : {"", "8", "8,", ",8", "8,0", "8,x", "-1,17", "auto,8"})
        expect_error([&] { (void)parse_stage_split(bad); }, "--split expects");
    // One host for both cards: what the first stage pins (the PLE table, its experts) is not the second's to pin.
    MemoryPlanInputs short_ram = small;
    short_ram.vram_budget = 1 * kGiB;
    const std::vector<StagePlan> pinned = plan_stages(*f, parse_stage_split("8,8"), {short_ram, short_ram});
    EXPECT_EQ(pinned[1].plan.ram_budget, pinned[0].plan.ram_budget - pinned[0].plan.pinned_total());
    EXPECT_GT(pinned[0].plan.pinned_total(), 0u);
    const testing::ShellRun ok =
        run_strata("info " + shell_quote(mid_path()) + " --split auto --vram-budget 4G,4G --ram-budget 64G");
    ASSERT_EQ(ok.status, 0) << ok.err;
    EXPECT_NE(ok.out.find("stage 1: blocks "), std::string::npos) << ok.out;
    testing::expect_user_error(run_strata("info " + shell_quote(mid_path()) + " --split 8,8 --vram-budget 4G"),
                               "two cards");
}

// With a routing profile, "auto" weighs each layer by its measured routing. Layers 0-3 route evenly and 4-15 send
// almost everything to 4 experts: the skewed layers are served by a few slots, so the evenly routed ones, the worst
// served, get more of a card (fewer blocks beside them) than uniform weighting gives them (half the blocks).
TEST(StagePlan, AutomaticSplitWeighsARoutingProfile) {
    const auto f = gguf::File::open(mid_path());
    const int64_t n_expert = f->get_u32("qwen4exp.expert_count");
    ExpertProfile profile{.n_layer = 16, .n_expert = n_expert, .counts = {}};
    for (int64_t l = 0; l < 16; ++l) {
        std::vector<uint64_t> counts(static_cast<size_t>(n_expert), 1);
        if (l >= 4)
            for (size_t e = 0; e < 4; ++e) counts[e] = 1000;
        profile.counts.push_back(counts);
    }
    MemoryPlanInputs card{.vram_budget = 1 * kGiB, .ram_budget = 1024 * kGiB};
    const std::vector<StagePlan> uniform = plan_stages(*f, parse_stage_split("auto"), {card, card});
    const std::vector<StagePlan> weighted = plan_stages(*f, parse_stage_split("auto"), {card, card}, &profile);
    ASSERT_FALSE(uniform[1].plan.experts_in_vram);
    EXPECT_NEAR(static_cast<double>(uniform[0].end_block), 8.0, 1.0);
    EXPECT_LT(weighted[0].end_block, uniform[0].end_block);
    EXPECT_GE(weighted[0].end_block, 4);
    // Judged by the profile, the weighted cut serves its worst layer better; judged evenly, the uniform one does.
    EXPECT_GT(worst_held_routing(weighted, &profile), worst_held_routing(uniform, &profile));
    EXPECT_GE(worst_held_routing(uniform), worst_held_routing(weighted));
    // A skewed layer's share comes from its most-routed experts: 4 slots hold 4000 of its 4000 + (E - 4) routings.
    EXPECT_GT(worst_held_routing({weighted[1]}, &profile),
              4000.0 / (4000.0 + static_cast<double>(n_expert - 4)) - 1e-9);
    // strata info prints the share, by the profile when it is given.
    const std::string profile_path = process_temp_dir() / "split.profile";
    write_expert_profile(profile_path, profile);
    const testing::ShellRun r =
        run_strata("info " + shell_quote(mid_path()) +
                   " --split auto --vram-budget 1G,1G --ram-budget 64G --expert-profile " + shell_quote(profile_path));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("stage 1: blocks " + std::to_string(weighted[0].end_block) + "-15"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("of its routing in VRAM (by the routing profile)"), std::string::npos) << r.out;
}

// --split and --devices on the commands that load a model (app/split_load.cpp): the stages are planned before
// anything loads, so every mistake in them is a one-line error without a GPU.
TEST(StagePlan, SplitFlagsOfTheLoadingCommands) {
    EXPECT_EQ(parse_device_list("0,1"), (std::vector<int>{0, 1}));
    EXPECT_EQ(parse_device_list("0,0"), (std::vector<int>{0, 0}));
    EXPECT_EQ(parse_device_list("3"), (std::vector<int>{3}));
    for (const char* bad : {"", "0,", ",1", "a", "-1", "0,,1", "0;1", "1.5"})
        expect_error([&] { (void)parse_device_list(bad); }, "--devices expects");
    const std::string logits = "logits --model " + shell_quote(mid_path()) + " --tokens 1 --out /dev/null ";
    testing::expect_user_error(run_strata(logits + "--split 8,8"), "--backend cuda only");
    testing::expect_user_error(run_strata(logits + "--backend cuda --split 8"), "--split expects");
    testing::expect_user_error(run_strata(logits + "--backend cuda --split 8,8 --devices 0,x"), "--devices expects");
    testing::expect_user_error(run_strata(logits + "--backend cuda --devices 0,1"), "give --split");
    testing::expect_user_error(run_strata(logits + "--backend cuda --split 8,8 --vram-budget 4G,lots"),
                               "--vram-budget expects");
    testing::expect_user_error(run_strata(logits + "--backend cuda --split 8,4 --vram-budget 4G,4G"),
                               "places 12 blocks");
    testing::expect_user_error(run_strata(logits + "--backend cuda --split 8,8 --devices 0,0,0 --vram-budget 4G"),
                               "3 devices for a split of 2 stages");
    testing::expect_user_error(run_strata(logits + "--backend cuda --split 8,8 --vram-budget 4G,4G,4G"),
                               "3 sizes for a split of 2 stages");
    testing::expect_user_error(run_strata(logits + "--backend cuda --split 8,8 --vram-budget 4G,100M"),
                               "stage 1 (blocks 8-15)");
#if !STRATA_HAS_CUDA
    // A plan that fits: printed per stage, then the load says there is no CUDA backend.
    const testing::ShellRun run = run_strata(logits + "--backend cuda --split auto --vram-budget 4G --devices 0,0");
    EXPECT_EQ(run.status, 2);
    EXPECT_NE(run.err.find("stage 1: blocks "), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("no CUDA backend"), std::string::npos) << run.err;
#endif
}

}  // namespace
}  // namespace strata
