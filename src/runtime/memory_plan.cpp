// The CUDA memory plan (memory_plan.h). Every device cost below mirrors an allocation of the CUDA trunk; the comment
// on each names the code it follows, so a change there has one place to change here (tests/test_memory_plan.cpp
// checks the arithmetic on synthesized files).
#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/memory_info.h"
#include "format/gguf.h"
#include "format/gguf_names.h"
#include "model/binding.h"
#include "model/hybrid.h"
#include "model/qwen4exp.h"
#include "model/single_stream.h"
#include "runtime/ple_row_reader.h"

namespace strata {

namespace {

// The CUDA trunk's window sizes (the prompt window: LoadOptions::prompt_chunk; backend/cuda kMaxMatvecTokens), the
// logits rows a window's head writes at a time (model/cuda/hybrid_cuda.h kHeadRows), and the
// backend constants the workspaces are cut by (backend/cuda/attention.h, decode_attention.cu, matmul.cu,
// gemm_tensor_core.cuh).
constexpr int64_t kDecodeWindow = 8;
constexpr int64_t kHeadRows = 64;
constexpr int64_t kBlasMinTokens = 256;                      // backend/cuda/cuda_backend.h
constexpr uint64_t kBlasWorkspaceBytes = uint64_t{32} << 20;  // backend/cuda/blas.h
constexpr int64_t kQsaSelectGroup = 64;
// The prompt windows the plan tries, longest first, when --prompt-chunk is not given (bench/notes/prompts.md).
constexpr int64_t kLongPromptChunks[] = {4096, 2048, 1024};                        // model/cuda/hybrid_cuda.h
constexpr int64_t kKvPageCells = 4;
constexpr int64_t kKvInt8Group = 64;
constexpr int64_t kMinCellsPerSplit = 32;
constexpr int64_t kMaxAttentionSplits = 4096;
constexpr int64_t kGemmRows = 128, kGemmTileK = 64, kGemmTargetBlocks = 264, kGemmMaxSplits = 8,
                  kGemmMinTilesPerSplit = 4, kGemmFloatTile = 64;
constexpr uint64_t kGemmPanelBytes = uint64_t{64} << 20;
// Without a device: the decode attention's split count grows with the multiprocessors (2 blocks each); 192 is more
// than any current GPU has (H200 132, RTX 5090 170), so the plan does not come out short.
constexpr int kAssumedMultiprocessors = 192;

constexpr const char* kPleTable = "per_layer_token_embd.weight";

uint64_t round256(uint64_t n) {
    return (n + 255) / 256 * 256;
}
// What a DeviceBuffer books: its size rounded up to 256 bytes, at least 256 (backend/cuda/context.cpp).
uint64_t booked(uint64_t n) {
    return std::max<uint64_t>(256, round256(n));
}
uint64_t u(int64_t n) {
    return static_cast<uint64_t>(std::max<int64_t>(n, 0));
}
int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

std::string gib(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / (1 << 30));
    return buf;
}

// In messages: GiB with two decimals from 1 GiB, MiB with one below (a tiny model's 0.00 GiB says nothing).
std::string size_text(uint64_t bytes) {
    char buf[32];
    if (bytes >= (uint64_t{1} << 30)) return gib(bytes) + " GiB";
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    return buf;
}

bool float_type(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

// backend/cuda/matmul.cu quantized_activation_bytes: int8 values, a scale per 32 and a sum per 16, each rounded up.
uint64_t activation_bytes(DType w_type, int64_t n_values) {
    if (float_type(w_type)) return 0;
    const uint64_t n = u(n_values);
    return round256(n) + round256(n / 32 * 4) + round256(n / 16 * 4);
}

// backend/cuda/matmul.cu gemm_plan: the split-K count of a prompt window's tensor-core GEMM.
int64_t gemm_splits(int64_t rows, int64_t in, int64_t tokens) {
    const int64_t tile_tokens = tokens >= 256 ? 128 : 64;
    const int64_t tiles = ceil_div(rows, kGemmRows) * ceil_div(tokens, tile_tokens);
    const int64_t k_tiles = ceil_div(in, kGemmTileK);
    int64_t splits = 1;
    while (splits < kGemmMaxSplits && tiles * splits * 2 * 4 <= kGemmTargetBlocks * 5 &&
           k_tiles >= kGemmMinTilesPerSplit * splits * 2)
        splits *= 2;
    const int64_t per_split = ceil_div(k_tiles, splits);
    return ceil_div(k_tiles, per_split);
}

// backend/cuda/matmul.cu scratch_layout(...).total(): the context scratch of one product over `tokens` tokens.
uint64_t matmul_scratch(const gguf::TensorInfo& w, int64_t tokens) {
    const int64_t in = w.ne[0], rows = w.ne[1];
    const uint64_t n_act = u(tokens * in);
    const bool quant = !float_type(w.type);
    uint64_t total = 256;
    if (quant) total += round256(n_act) + round256(n_act / 32 * 4) + round256(n_act / 16 * 4);
    if (tokens <= kDecodeWindow) return total;
    if (quant) {
        const int64_t splits = gemm_splits(rows, in, tokens);
        const uint64_t own = round256(n_act * 2) + round256(u(tokens) * 4) +
                             (splits > 1 ? round256(u(splits * rows * tokens) * 4) : 0);
        // From kBlasMinTokens cuBLAS may take it: the window's fp16 activations, its scale (alpha, beta, up and the
        // 1,024 blocks' maxima of matmul.cu's kWindowMaxBlocks), the fp16 weights.
        const uint64_t blas =
            tokens >= kBlasMinTokens ? round256(n_act * 2) + round256((4 + 1024) * 4) + round256(u(rows * in) * 2) : 0;
        return total + std::max(own, blas);
    }
    const int64_t panel_rows =
        std::clamp<int64_t>(static_cast<int64_t>(kGemmPanelBytes / (u(in) * 4)) / kGemmFloatTile * kGemmFloatTile,
                            kGemmFloatTile, ceil_div(rows, kGemmFloatTile) * kGemmFloatTile);
    return total + round256(u(panel_rows * in) * 4);
}

// backend/cuda matmul's supported weight types (supports_matmul).
bool cuda_matmul_type(DType t) {
    switch (t) {
        case DType::F32:
        case DType::F16:
        case DType::BF16:
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ4_NL:
        case DType::IQ4_XS:
        case DType::IQ2_XS:
        case DType::IQ3_XXS:
        case DType::IQ3_S:
        case DType::IQ1_M:
            return true;
        default:
            return false;
    }
}

bool is_routed_expert(const std::string& name) {
    return name.find("_exps") != std::string::npos;
}

// The shapes the device costs depend on, for both trunks (qwen4exp; qwen35moe and qwen3next).
struct Shapes {
    int64_t H = 0, V = 0, hc = 1, low_rank = 0, n_layer = 0;
    std::vector<bool> recurrent;
    std::vector<int64_t> ratio;  // per trunk block; 0: dense attention
    AttentionShape attention;
    IndexerShape indexer;
    GdnShape gdn;
    MoeShape moe;
    std::vector<int64_t> ple_blocks;  // blocks with a PLE layer (each keeps its own history)
    PleShape ple;
    uint64_t ple_row_bytes = 0;
    const gguf::TensorInfo* token_embd = nullptr;
    const gguf::TensorInfo* output = nullptr;  // the head: output.weight, or token_embd when they are tied
    int64_t prompt_window = kDefaultPromptChunk;  // tokens of a prompt window
    // A stage of a split (MemoryPlanInputs::first_block): its blocks are the file's first_block ..
    // first_block + n_layer - 1 (the per-block vectors above cover these alone); n_trunk counts the file's.
    int64_t first_block = 0, n_trunk = 0;
    bool holds_embedding = true, holds_head = true;
};

Shapes read_shapes(const gguf::File& file) {
    Shapes s;
    int64_t n_all = 0;
    const ModelInfo info = read_hybrid_info(file, &n_all);
    s.H = info.n_embd;
    s.n_layer = info.n_layer;
    s.token_embd = file.find_tensor("token_embd.weight");
    s.output = file.find_tensor("output.weight");
    if (!s.output) s.output = s.token_embd;
    if (!s.token_embd) throw Error(file.path() + ": tensor token_embd.weight is missing");
    s.V = s.token_embd->ne[1];
    if (info.arch == "qwen4exp") {
        const Qwen4ExpHparams h = read_qwen4exp_hparams(file, info, n_all);
        s.hc = h.hc.n_streams;
        s.low_rank = h.hc.low_rank;
        s.recurrent = h.recurrent;
        s.ratio = h.compress_ratio;
        s.attention = h.attention;
        s.indexer = h.indexer;
        s.gdn = h.gdn;
        s.moe = h.moe;
        s.ple_blocks = h.ple_blocks;
        s.ple = h.ple;
        if (const gguf::TensorInfo* t = file.find_tensor(kPleTable)) s.ple_row_bytes = row_bytes(t->type, t->ne[0]);
    } else if (info.arch == "qwen35moe" || info.arch == "qwen3next") {
        const SingleStreamHparams h = read_single_stream_hparams(file, {info.arch.c_str(), true}, info, n_all);
        s.recurrent = h.recurrent;
        s.ratio.assign(s.recurrent.size(), 0);
        s.attention = h.attention;
        s.gdn = h.gdn;
        s.moe = h.moe;
    } else {
        throw Error(file.path() + ": architecture '" + info.arch +
                    "' has no CUDA memory plan (supported: qwen4exp, "
                    "qwen35moe, qwen3next)");
    }
    s.ratio.resize(s.recurrent.size(), 0);
    s.n_trunk = s.n_layer;
    return s;
}

// The stage of blocks [first, end) alone: its blocks' shapes, its PLE blocks renumbered from its first; the token
// table on the stage of block 0, the head on the stage of the last block.
Shapes stage_shapes(Shapes s, int64_t first, int64_t end) {
    if (first < 0 || end > s.n_layer || first >= end)
        throw Error("blocks " + std::to_string(first) + ".." + std::to_string(end - 1) + " are not a stage of this " +
                    std::to_string(s.n_layer) + "-block model");
    const auto from = s.recurrent.begin() + first, to = s.recurrent.begin() + end;
    s.recurrent = std::vector<bool>(from, to);
    s.ratio = std::vector<int64_t>(s.ratio.begin() + first, s.ratio.begin() + end);
    std::vector<int64_t> ple;
    for (const int64_t b : s.ple_blocks)
        if (b >= first && b < end) ple.push_back(b - first);
    s.ple_blocks = ple;
    s.first_block = first;
    s.n_layer = end - first;
    s.holds_embedding = first == 0;
    s.holds_head = end == s.n_trunk;
    return s;
}

bool sparse(const Shapes& s, size_t il) {
    return !s.recurrent[il] && s.ratio[il] > 0;
}
int64_t qsa_max_cells(const IndexerShape& ix, int64_t ratio) {
    return ix.budget / ratio * ratio + ratio;
}

// One sequence's device state for `cap` tokens (hybrid_cuda.cpp allocate_sequence), by part.
struct SequenceCost {
    uint64_t kv = 0, gdn = 0, indexer = 0, ple = 0, attention_workspace = 0, union_workspace = 0, checkpoint = 0;
    uint64_t window_records = 0;
    uint64_t total() const {
        return kv + gdn + indexer + ple + attention_workspace + union_workspace + checkpoint + window_records;
    }
};

// backend/cuda/qsa_union.cu qsa_union_splits (for a decode window) and workspace_layout (for a prompt window).
uint64_t qsa_union_bytes(int64_t prompt_window, int64_t max_cells, int64_t n_head, int64_t n_head_kv,
                         int64_t head_dim, int sms) {
    constexpr int64_t kGroup = 8, kChunk = 64;  // qsa_union.h kQsaUnionGroup, kQsaUnionChunk
    const int64_t max_chunks = std::max<int64_t>(1, ceil_div(kGroup * max_cells, kChunk));
    const int64_t blocks = std::max<int64_t>(1, n_head_kv) * std::max<int64_t>(1, ceil_div(kDecodeWindow, kGroup));
    const int64_t splits = std::clamp<int64_t>(ceil_div(sms, blocks), 1, max_chunks);
    const uint64_t groups = u(ceil_div(prompt_window, kGroup)), stride = u(kGroup * max_cells);
    const uint64_t rows = u(splits * prompt_window * n_head);
    return booked(round256(groups * stride * 4) + round256(groups * stride) + round256(groups * 4) +
                  round256(rows * u(head_dim) * 4) + 2 * round256(rows * 4));
}

SequenceCost sequence_cost(const Shapes& s, int64_t cap, KvCacheType kv, int multiprocessors, bool qsa_union,
                           int64_t checkpoints) {
    SequenceCost c;
    const GdnShape& g = s.gdn;
    const AttentionShape& a = s.attention;
    const bool int8 = kv == KvCacheType::Int8;
    int64_t max_blocks = 1, max_cells = 1;
    bool any_dense = false, any_sparse = false;
    // model/cuda/checkpoint_cuda.cpp: one checkpoint slot copies every buffer a later token overwrites (GDN state,
    // cache lengths, PLE history), each at a 256-byte boundary, in one allocation. Speculation takes one a round and
    // the server's prefix cache keeps some: the caller says how many a sequence holds at once.
    uint64_t checkpoint = 0;
    for (size_t il = 0; il < s.recurrent.size(); ++il) {
        if (s.recurrent[il]) {
            c.gdn += booked(u((g.conv_kernel - 1) * g.conv_dim()) * 4);
            c.gdn += booked(u(g.n_v_heads * g.k_head_dim * g.v_head_dim) * 4);
            checkpoint += round256(u((g.conv_kernel - 1) * g.conv_dim()) * 4) +
                          round256(u(g.n_v_heads * g.k_head_dim * g.v_head_dim) * 4);
            // model/cuda/checkpoint_cuda.cpp allocate_records: a decode window's conv input, q/k/v, decay, strength.
            c.window_records +=
                2 * booked(u(kDecodeWindow * g.conv_dim()) * 4) + 2 * booked(u(kDecodeWindow * g.n_v_heads) * 4);
        } else {
            checkpoint += round256(4);  // the cache length
            // backend/cuda/kv_cache.cu: K and V values per page of kKvPageCells cells, int8 with fp16 scales per 64.
            const int64_t pages = ceil_div(cap, kKvPageCells);
            const uint64_t values = u(a.n_head_kv * kKvPageCells * a.head_dim) * (int8 ? 1 : 2) * u(pages);
            c.kv += 2 * booked(values);
            if (int8) c.kv += 2 * booked(u(a.n_head_kv * kKvPageCells * (a.head_dim / kKvInt8Group)) * 2 * u(pages));
            c.kv += booked(u(pages) * 4) + booked(4);  // identity page table, cache length
            if (s.ratio[il] > 0) {
                const int64_t di = s.indexer.head_dim, ratio = s.ratio[il];
                c.indexer += booked(u(cap * di) * 4) + booked(u(std::max<int64_t>(cap / ratio, 1) * di) * 4);
                max_blocks = std::max(max_blocks, cap / ratio + 1);
                max_cells = std::max(max_cells, qsa_max_cells(s.indexer, ratio));
                any_sparse = true;
            } else {
                any_dense = true;
            }
        }
        if (std::find(s.ple_blocks.begin(), s.ple_blocks.end(), static_cast<int64_t>(il)) != s.ple_blocks.end()) {
            const PleShape& p = s.ple;
            c.ple += booked(u(std::max<int64_t>(p.ngram - 1, 1)) * 4);
            c.ple += booked(u(p.history_rows() * p.n_streams * p.n_embd) * 4);
            checkpoint += round256(u(std::max<int64_t>(p.ngram - 1, 1)) * 4) +
                          round256(u(p.history_rows() * p.n_streams * p.n_embd) * 4);
            c.window_records += booked(u(kDecodeWindow * p.n_streams * p.n_embd) * 4);
        }
    }
    c.checkpoint = booked(checkpoint) * u(checkpoints);
    // QSA scores and keys of the queries one qsa_select launch takes (model/cuda/hybrid_cuda.h kQsaSelectGroup).
    const int64_t group = any_sparse ? std::min(kQsaSelectGroup, s.prompt_window) : 1;
    c.attention_workspace = booked(u(group * max_blocks) * 4) + booked(u(group * max_blocks) * 8);
    // decode_attention.cu decode_attention_splits and decode_attention_workspace_bytes.
    const int sms = multiprocessors > 0 ? multiprocessors : kAssumedMultiprocessors;
    auto splits = [&](int64_t cells) {
        const int64_t by_cells = std::max<int64_t>(1, ceil_div(cells, kMinCellsPerSplit));
        const int64_t by_device = std::max<int64_t>(1, ceil_div(2 * int64_t{sms}, std::max<int64_t>(a.n_head_kv, 1)));
        return std::min({by_cells, by_device, kMaxAttentionSplits});
    };
    const int64_t dense_splits = any_dense ? splits(cap) : 1;
    const int64_t sparse_splits = any_sparse ? splits(std::min(cap, max_cells)) : 1;
    if (qsa_union && any_sparse) c.union_workspace = qsa_union_bytes(s.prompt_window, max_cells, a.n_head, a.n_head_kv, a.head_dim, sms);
    if (any_dense || any_sparse)
        c.attention_workspace += booked(u(std::max(dense_splits, sparse_splits)) * u(a.n_head) * u(a.head_dim + 2) * 4);
    return c;
}

// hybrid_cuda.cpp finish_loading: the window buffers of a prompt window, carved from one allocation: the parts every
// stage of a block uses, then one region that the embedding's staging, the GDN, attention and PLE buffers and the MoE
// prompt workspace (moe_prompt bytes) each start at (they are never live at once).
uint64_t window_bytes(const Shapes& s, uint64_t moe_prompt) {
    const int64_t T = s.prompt_window, H = s.H, hc = s.hc, HC = hc * H, V = s.V;
    const GdnShape& g = s.gdn;
    const AttentionShape& a = s.attention;
    int64_t max_cells = 1, index_heads = 0, index_dim = 0;
    for (size_t il = 0; il < s.recurrent.size(); ++il)
        if (sparse(s, il)) {
            max_cells = std::max(max_cells, qsa_max_cells(s.indexer, s.ratio[il]));
            index_heads = std::max(index_heads, s.indexer.n_head);
            index_dim = std::max(index_dim, s.indexer.head_dim);
        }
    const bool ple = !s.ple_blocks.empty();
    const int64_t ple_heads = ple ? s.ple.n_heads() : 0;
    const int64_t ple_width = ple ? ple_heads * s.ple.row_width : 0;
    const int64_t ple_rows = ple ? HC : 0;
    uint64_t always = 0, stage = 0, region = moe_prompt;
    uint64_t* total = &always;
    auto part = [&](uint64_t bytes) { *total += round256(bytes); };
    auto f32 = [&](int64_t n) { part(u(n) * 4); };
    auto next_stage = [&] {
        region = std::max(region, stage);
        stage = 0;
        total = &stage;
    };
    f32(3 * T);  // tokens, positions, lengths (int32)
    f32(T * HC);
    f32(T * H);
    f32(T * H);
    f32(T * hc);
    part(activation_bytes(DType::Q8_0, H));
    if (hc > 1) {
        // backend/cuda/hyper_connection.cu read_workspace(nullptr, dims, T).floats
        const int64_t R = s.low_rank;
        const uint64_t low = u(T * HC) * 4, gate = low + u((T * R + 63) / 64 * 64) * 4, gate_end = gate + u(T * HC) * 4;
        const uint64_t xn_q = round256(gate_end);
        const uint64_t partials = xn_q + activation_bytes(DType::Q8_0, T * HC) + activation_bytes(DType::Q8_0, T * R);
        f32(static_cast<int64_t>((gate_end + 256 + (partials - xn_q)) / 4) + T * hc * hc);
    }
    f32(T * H);
    f32(std::min(T, std::max(kDecodeWindow, kHeadRows)) * V);  // the logits of kHeadRows tokens at a time
    next_stage();
    // backend/cuda/block_ops.cu embed_staging_bytes
    part(round256(u(T) * row_bytes(s.token_embd->type, s.token_embd->ne[0])) + u(T * s.token_embd->ne[0]) * 4);
    next_stage();
    for (int64_t n : {T * g.conv_dim(), T * g.value_dim(), T * g.n_v_heads, T * g.n_v_heads, T * 2 * g.n_v_heads,
                      T * g.conv_dim(), T * g.value_dim()})
        f32(n);
    next_stage();
    for (int64_t n : {T * 2 * a.head_dim * a.n_head, T * a.n_head_kv * a.head_dim, T * a.n_head_kv * a.head_dim,
                      T * a.n_head * a.head_dim, T * index_dim, T * index_heads * index_dim, T * max_cells, T})
        f32(n);
    next_stage();
    part(u(T * ple_heads) * 8);
    part(u(T * ple_heads) * s.ple_row_bytes);
    f32(T * ple_width);
    for (int i = 0; i < 3; ++i) f32(T * ple_rows);  // key, query, gated (the conv's input and output reuse the first two)
    f32(ple ? T * H : 0);
    next_stage();
    return booked(always + region);
}

// backend/cuda/moe.cu MoeWorkspace: one per MoE layer, cut for a decode window.
uint64_t moe_workspace_bytes(const Shapes& s, DType gate_type, DType down_type, DType shared_in, DType shared_down) {
    const int64_t T = kDecodeWindow, H = s.H, E = s.moe.n_expert, K = s.moe.n_expert_used, F = s.moe.n_ff,
                  FS = s.moe.n_ff_shared, pairs = T * K;
    const uint64_t sizes[] = {u(T * E) * 4,
                              u(pairs) * 4,
                              u(pairs) * 4,
                              activation_bytes(gate_type, T * H),
                              u(pairs * 2 * F) * 4,
                              u(pairs * F) * 4,
                              activation_bytes(down_type, pairs * F),
                              u(pairs * H) * 4,
                              activation_bytes(FS > 0 ? shared_in : DType::F32, T * H),
                              u(T * FS) * 4,
                              u(T * FS) * 4,
                              u(T * FS) * 4,
                              u(T * H) * 4,
                              activation_bytes(FS > 0 ? shared_down : DType::F32, T * FS)};
    uint64_t total = 0;
    for (uint64_t b : sizes) total += round256(b);
    return booked(total);
}

// backend/cuda/moe_prompt.cu MoePromptWorkspace: one for the model, for a prompt window, where the first MoE layer's
// experts take the grouped GEMM (moe_prompt_supported: quant types whose rows hold whole blocks).
bool grouped_gemm_type(DType t, int64_t in) {
    switch (t) {
        case DType::Q8_0: case DType::Q4_0: case DType::IQ4_NL: case DType::IQ4_XS: case DType::Q2_K:
        case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ2_XS:
        case DType::IQ3_XXS: case DType::IQ3_S: case DType::IQ1_M:
            return in % 32 == 0 && in % traits(t).block_size == 0;
        default: return false;
    }
}

uint64_t moe_prompt_workspace_bytes(const Shapes& s) {
    const int64_t P = s.prompt_window, H = s.H, E = s.moe.n_expert, K = s.moe.n_expert_used, F = s.moe.n_ff,
                  FS = s.moe.n_ff_shared, pairs = P * K;
    const int64_t tiles = (pairs + 63) / 64 + std::min(E, pairs);
    // The gate and up sums and the expert outputs share their bytes (never live at once).
    const uint64_t sizes[] = {u(P * E) * 4,  u(pairs) * 4, u(pairs) * 4, u(pairs) * 4,
                              u(E + 1 + 3 * tiles) * 4, activation_bytes(DType::Q8_0, P * H), u(P * H) * 2, u(P) * 4,
                              u(pairs * std::max(2 * F, H)) * 4, activation_bytes(DType::Q8_0, pairs * F),
                              u(pairs * F) * 2, u(pairs) * 4, u(P * FS) * 4 * 3, u(P * H) * 4};
    uint64_t total = 0;
    for (uint64_t b : sizes) total += round256(b);
    return booked(total);
}

// The file's tensors by role.
struct TensorTotals {
    uint64_t dense = 0, ple = 0, mtp = 0, experts = 0;
    uint64_t experts_uploaded = 0;       // every expert tensor uploaded whole (all in VRAM)
    std::vector<uint64_t> expert_bytes;  // per trunk block: one cache slot (one expert's gate, up and down)
    std::vector<uint64_t>
        pass_bytes[2];  // per trunk block: one expert's gate and up, and its down, as the ring holds them
    uint64_t matmul_scratch = 0;
    uint64_t moe_workspaces = 0;
    uint64_t moe_prompt = 0;  // the grouped MoE's prompt workspace (inside the window buffers)
    int64_t n_moe_layers = 0;
};

TensorTotals classify(const gguf::File& file, const Shapes& s) {
    TensorTotals t;
    t.expert_bytes.assign(u(s.n_layer), 0);
    for (std::vector<uint64_t>& pass : t.pass_bytes) pass.assign(u(s.n_layer), 0);
    const int64_t E = std::max<int64_t>(s.moe.n_expert, 1);
    for (const gguf::TensorInfo& info : file.tensors()) {
        if (is_ple_table(info.name)) {
            if (!s.ple_blocks.empty()) t.ple += info.n_bytes;  // a stage without PLE blocks reads no table
            continue;
        }
        if (is_mtp_block_tensor(info.name, s.n_trunk)) {
            if (s.holds_head) t.mtp += info.n_bytes;
            continue;
        }
        const int64_t file_block = block_of(info.name);
        const int64_t block = file_block < 0 ? -1 : file_block - s.first_block;
        if (file_block >= 0 && (block < 0 || block >= s.n_layer)) continue;  // another stage's block
        if (file_block < 0) {
            // The token table goes with block 0 (and with the head where they are tied), output* with the head.
            const bool embedding = &info == s.token_embd, head = &info == s.output || info.name.rfind("output", 0) == 0;
            if (!((embedding && s.holds_embedding) || (head && s.holds_head) ||
                  (!embedding && !head && s.holds_embedding)))
                continue;
        }
        if (is_routed_expert(info.name) && block >= 0 && block < s.n_layer) {
            t.experts += info.n_bytes;
            t.experts_uploaded += booked(info.n_bytes);
            // model/cuda/expert_cache.cpp add_layer: a slot holds each expert tensor's slice at a 256-byte boundary.
            t.expert_bytes[static_cast<size_t>(block)] += round256(info.n_bytes / u(E));
            const bool down = info.name.find("ffn_down_exps") != std::string::npos;
            t.pass_bytes[down ? 1 : 0][static_cast<size_t>(block)] += round256(info.n_bytes / u(E));
            continue;
        }
        // model/cuda/device_weights.cpp: each bound file tensor is one upload (a DeviceBuffer).
        t.dense += booked(info.n_bytes);
        // The head's products take kHeadRows tokens at most, and the embedding table is only read by rows unless it is
        // the head (hybrid_cuda.cpp finish_loading).
        const bool head = &info == s.output || &info == s.token_embd;
        const int64_t prompt_tokens = head ? std::min(s.prompt_window, kHeadRows) : s.prompt_window;
        if (info.ne[2] == 1 && info.ne[3] == 1 && cuda_matmul_type(info.type))
            t.matmul_scratch =
                std::max({t.matmul_scratch, matmul_scratch(info, kDecodeWindow), matmul_scratch(info, prompt_tokens)});
    }
    t.matmul_scratch = t.matmul_scratch ? booked(t.matmul_scratch) : 0;
    // cuBLAS's workspace, booked when the prompt window reaches it (backend/cuda/blas.h).
    if (s.prompt_window >= kBlasMinTokens) t.matmul_scratch += booked(kBlasWorkspaceBytes);
    for (int64_t il = 0; il < s.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(s.first_block + il) + ".";
        auto type_of = [&](const char* name, DType fallback) {
            const gguf::TensorInfo* ti = file.find_tensor(p + name);
            return ti ? ti->type : fallback;
        };
        const gguf::TensorInfo* down = file.find_tensor(p + "ffn_down_exps.weight");
        if (!down) continue;
        const DType gate = type_of("ffn_gate_up_exps.weight", type_of("ffn_gate_exps.weight", down->type));
        t.moe_workspaces += moe_workspace_bytes(s, gate, down->type, type_of("ffn_gate_shexp.weight", DType::F32),
                                                type_of("ffn_down_shexp.weight", DType::F32));
        if (t.n_moe_layers == 0 && grouped_gemm_type(gate, s.H) && grouped_gemm_type(down->type, s.moe.n_ff) &&
            s.moe.n_expert <= 4096)
            t.moe_prompt = moe_prompt_workspace_bytes(s);
        ++t.n_moe_layers;
    }
    return t;
}

std::string tokens_text(int64_t n_ctx, int64_t n_sequences) {
    std::string out = std::to_string(n_ctx) + " tokens";
    if (n_sequences > 1) out += " x " + std::to_string(n_sequences) + " sequences";
    return out;
}

}  // namespace

const char* plan_place_name(PlanPlace place) {
    switch (place) {
        case PlanPlace::Vram:
            return "VRAM";
        case PlanPlace::PinnedHost:
            return "pinned RAM";
        case PlanPlace::HostRam:
            return "host RAM";
        case PlanPlace::MappedFile:
            return "mapped file";
        case PlanPlace::NotLoaded:
            return "not loaded";
    }
    return "?";
}

uint64_t MemoryPlan::vram_total() const {
    uint64_t total = 0;
    for (const PlanLine& l : lines)
        if (l.place == PlanPlace::Vram) total += l.bytes;
    return total;
}

uint64_t MemoryPlan::pinned_total() const {
    uint64_t total = 0;
    for (const PlanLine& l : lines)
        if (l.place == PlanPlace::PinnedHost) total += l.bytes;
    return total;
}

ExpertPlacement MemoryPlan::placement() const {
    ExpertPlacement p;
    p.in_host = !experts_in_vram;
    p.from_file = p.in_host && !experts_pinned;
    if (p.in_host) p.cache_slots = cache_slots;
    if (p.in_host && stream_ring_bytes > 0) {
        p.stream_ranges = kStreamRanges;
        p.stream_buffers = stream_buffers;
    }
    return p;
}

std::string MemoryPlan::summary() const {
    std::string out;
    if (n_expert == 0 || experts_in_vram) {
        out = "experts all in VRAM";
    } else {
        const int64_t lo = cache_slots.empty() ? 0 : *std::min_element(cache_slots.begin(), cache_slots.end());
        const int64_t hi = cache_slots.empty() ? 0 : *std::max_element(cache_slots.begin(), cache_slots.end());
        out = "expert cache " + (lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi)) +
              " of " + std::to_string(n_expert) + " per layer, experts " +
              (experts_pinned ? "in pinned RAM" : "read from the mapped file");
    }
    if (has_ple) out += std::string(", PLE table ") + (ple_pinned ? "in pinned RAM" : "rows from the file");
    return out + "; VRAM " + gib(vram_total()) + " of " + gib(vram_budget) + " GiB, pinned RAM " + gib(pinned_total()) +
           " of " + gib(ram_budget) + " GiB";
}

std::string MemoryPlan::table() const {
    std::string out = "memory plan (--backend cuda) for " + tokens_text(n_ctx, n_sequences) + ", KV cache " +
                      (kv_cache == KvCacheType::Int8 ? "int8" : "f16") + ":\n";
    size_t width = 26;
    for (const PlanLine& l : lines) width = std::max(width, l.what.size());
    auto row = [&](const std::string& what, const std::string& where, const std::string& amount) {
        char buf[512];
        std::snprintf(buf, sizeof buf, "  %-*s  %-11s %9s\n", static_cast<int>(width), what.c_str(), where.c_str(),
                      amount.c_str());
        out += buf;
    };
    row("part", "where", "GiB");
    for (const PlanLine& l : lines) row(l.what, plan_place_name(l.place), gib(l.bytes));
    row("VRAM total", "", gib(vram_total()));
    out += "  VRAM budget " + gib(vram_budget) + " GiB (" + vram_budget_source + "), " +
           gib(vram_budget - std::min(vram_budget, vram_total())) + " GiB left; pinned RAM " + gib(pinned_total()) +
           " of " + gib(ram_budget) + " GiB (" + ram_budget_source + ")\n";
    out += "  " + summary() + "\n";
    return out;
}

namespace {

MemoryPlan plan_for_window(const gguf::File& file, const MemoryPlanInputs& in);

}  // namespace

// Without --prompt-chunk, where the experts stream (so a prompt window's misses cost the same bytes however long it
// is, and a longer window spreads them over more tokens): the longest of kLongPromptChunks whose buffers leave the
// expert cache at least kStreamWindowSlotShare of the slots it has with the default window.
MemoryPlan plan_device_memory(const gguf::File& file, const MemoryPlanInputs& in) {
    MemoryPlan plan = plan_for_window(file, in);
    if (in.prompt_chunk != 0 || plan.stream_ring_bytes == 0 || plan.cache_slots.empty()) return plan;
    const auto fewest = [](const MemoryPlan& p) {
        return *std::min_element(p.cache_slots.begin(), p.cache_slots.end());
    };
    const int64_t slots = fewest(plan);
    for (const int64_t chunk : kLongPromptChunks) {
        MemoryPlanInputs longer = in;
        longer.prompt_chunk = chunk;
        try {
            MemoryPlan p = plan_for_window(file, longer);
            if (p.stream_ring_bytes > 0 && !p.cache_slots.empty() &&
                static_cast<double>(fewest(p)) >= kStreamWindowSlotShare * static_cast<double>(slots))
                return p;
        } catch (const Error&) {
            // A window this long does not fit: try a shorter one.
        }
    }
    return plan;
}

namespace {

MemoryPlan plan_for_window(const gguf::File& file, const MemoryPlanInputs& in) {
    if (in.n_ctx < 1) throw Error("the memory plan needs a context of at least one token");
    if (in.n_sequences < 1) throw Error("the memory plan needs at least one sequence");
    if (in.checkpoints_per_sequence < 1) throw Error("the memory plan needs at least one checkpoint a sequence");
    if (in.prompt_chunk != 0 && (in.prompt_chunk < kMinPromptChunk || in.prompt_chunk > kMaxPromptChunk))
        throw Error("a prompt window of " + std::to_string(in.prompt_chunk) + " tokens is outside " +
                    std::to_string(kMinPromptChunk) + ".." + std::to_string(kMaxPromptChunk));
    Shapes s = read_shapes(file);
    if (in.first_block != 0 || in.end_block != 0)
        s = stage_shapes(s, in.first_block, in.end_block == 0 ? s.n_layer : in.end_block);
    if (in.prompt_chunk) s.prompt_window = in.prompt_chunk;
    TensorTotals t = classify(file, s);
    const int sms = in.device ? in.device->multiprocessors : 0;

    MemoryPlan plan;
    plan.n_ctx = in.n_ctx;
    plan.n_sequences = in.n_sequences;
    plan.kv_cache = in.kv_cache;
    plan.n_expert = t.experts > 0 ? s.moe.n_expert : 0;
    plan.expert_bytes = t.expert_bytes;
    plan.has_ple = t.ple > 0;
    if (in.vram_budget > 0) {
        plan.vram_budget = in.vram_budget;
        plan.vram_budget_source = "--vram-budget";
        if (in.device && in.device->free_bytes < in.vram_budget) {
            plan.vram_budget = in.device->free_bytes;
            plan.vram_budget_source = "--vram-budget capped at what is free on " + in.device->name;
        }
    } else if (in.device) {
        plan.vram_budget = in.device->free_bytes / 20 * 19;  // backend/cuda/context.cpp's default budget
        plan.vram_budget_source = "free on " + in.device->name + " less 5%";
    } else {
        throw Error("the memory plan needs a VRAM budget: give --vram-budget SIZE (e.g. 12G)");
    }
    if (in.ram_budget) {
        plan.ram_budget = *in.ram_budget;
        plan.ram_budget_source = "--ram-budget";
    } else {
        plan.ram_budget = available_ram_bytes().value_or(physical_ram_bytes());
        plan.ram_budget_source = "available now";
    }

    // The reserve. kCudaContextReserve: what a CUDA 12-13 primary context takes on a recent GPU with lazy module
    // loading (the driver's own allocations and the kernel images as they load: a few hundred MiB, rounded up here;
    // on the H200, total minus free memory right after the context starts measures it). kAllocatorSlack: what
    // cudaMalloc's page rounding adds over the hundreds of weight uploads. A --vram-budget stands for the whole card,
    // context included; a budget read from the device's free memory comes after its context started, which is then
    // not counted again.
    const bool context_in_budget = in.vram_budget > 0 && plan.vram_budget == in.vram_budget;
    const uint64_t reserve = (context_in_budget ? kCudaContextReserve : 0) + kAllocatorSlack;
    auto states = [&](int64_t ctx) {
        return sequence_cost(s, ctx, in.kv_cache, sms, in.qsa_union, in.checkpoints_per_sequence).total() *
               u(in.n_sequences);
    };
    // Without --prompt-chunk the prompt window grows only into memory the experts would not use: the longest of
    // kLongPromptChunks with which every routed expert still fits in VRAM beside everything else, else the default
    // (a longer window's buffers would cost expert-cache slots, which decoding needs more).
    if (in.prompt_chunk == 0) {
        const Shapes short_window = s;
        const TensorTotals short_totals = t;
        for (const int64_t chunk : kLongPromptChunks) {
            s.prompt_window = chunk;
            t = classify(file, s);
            const uint64_t need = reserve + t.dense + window_bytes(s, t.moe_prompt) + t.moe_workspaces +
                                  t.matmul_scratch + states(in.n_ctx) + t.experts_uploaded;
            if (need <= plan.vram_budget) break;
            s = short_window;
            t = short_totals;
        }
    }
    plan.prompt_window = s.prompt_window;
    // With experts in host RAM, every layer has an address table of 3 tensors x n_expert pointers (expert_cache.cpp):
    // part of the fixed cost whenever the experts do not all fit beside the rest.
    const uint64_t tables = booked(u(s.n_layer) * 3 * u(s.moe.n_expert) * 8);
    uint64_t fixed = t.dense + window_bytes(s, t.moe_prompt) + t.moe_workspaces + t.matmul_scratch;
    const bool all_fit = t.experts == 0 || reserve + fixed + states(in.n_ctx) + t.experts_uploaded <= plan.vram_budget;
    if (!all_fit) fixed += tables;
    const uint64_t minimum = reserve + fixed + states(in.n_ctx);
    const std::string at_least = "; this model needs at least " + size_text(minimum) + " for " +
                                 tokens_text(in.n_ctx, in.n_sequences) + " with every routed expert in host RAM";
    if (plan.vram_budget == 0)
        throw Error("the VRAM budget is 0 bytes (" + plan.vram_budget_source + "): nothing can be placed" + at_least);
    if (plan.vram_budget <= reserve)
        throw Error("the VRAM budget of " + size_text(plan.vram_budget) + " (" + plan.vram_budget_source +
                    ") is not more than the " + size_text(reserve) +
                    " the CUDA context and allocator slack take: nothing else fits; raise --vram-budget" + at_least);
    if (reserve + t.dense > plan.vram_budget)
        throw Error("the dense weights (attention, GDN, routers, shared experts, embeddings, head) need " +
                    size_text(t.dense) + ", but the VRAM budget of " + size_text(plan.vram_budget) + " leaves " +
                    size_text(plan.vram_budget - reserve) + " after the " + size_text(reserve) +
                    " reserve; raise --vram-budget or use a smaller model" + at_least);
    if (minimum > plan.vram_budget) {
        const uint64_t need = fixed - t.dense + states(in.n_ctx);
        const uint64_t left = plan.vram_budget - std::min(plan.vram_budget, reserve + fixed);
        std::string largest =
            "the workspaces alone need " + size_text(fixed - t.dense) + ", so not even one token fits";
        if (reserve + fixed < plan.vram_budget && states(1) <= left) {
            int64_t lo = 1, hi = in.n_ctx - 1;  // states(lo) fits, states(hi + 1) does not
            while (lo < hi) {
                const int64_t mid = lo + (hi - lo + 1) / 2;
                if (states(mid) <= left)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            largest = "the largest context that fits is " + std::to_string(lo) + " tokens" +
                      (in.n_sequences > 1 ? " per sequence" : "");
        }
        throw Error("the KV cache, states and workspaces for " + tokens_text(in.n_ctx, in.n_sequences) + " need " +
                    size_text(need) + ", but " +
                    size_text(plan.vram_budget - std::min(plan.vram_budget, reserve + t.dense)) +
                    " are left after the dense weights and the reserve; " + largest +
                    ": ask for a smaller context or raise --vram-budget to at least " + size_text(minimum));
    }

    const SequenceCost seq = sequence_cost(s, in.n_ctx, in.kv_cache, sms, in.qsa_union, in.checkpoints_per_sequence);
    auto vram = [&](const std::string& what, uint64_t bytes) {
        if (bytes > 0) plan.lines.push_back({what, PlanPlace::Vram, bytes});
    };
    const uint64_t n = u(in.n_sequences);
    vram(context_in_budget ? "CUDA context + allocator slack" : "allocator slack (context started)", reserve);
    vram("dense weights", t.dense);
    vram(std::string("KV cache (") + (in.kv_cache == KvCacheType::Int8 ? "int8" : "f16") + ", " +
             tokens_text(in.n_ctx, in.n_sequences) + ")",
         seq.kv * n);
    vram("GDN conv + recurrent state", seq.gdn * n);
    vram("QSA indexer keys (raw + pooled)", seq.indexer * n);
    vram("PLE token + conv history", seq.ple * n);
    vram(in.checkpoints_per_sequence == 1 ? "sequence checkpoint (speculation, prefix cache)"
                                          : "sequence checkpoints (" + std::to_string(in.checkpoints_per_sequence) +
                                                " a sequence: speculation, prefix cache)",
         seq.checkpoint * n);
    vram("speculation window records (a commit keeps accepted drafts)", seq.window_records * n);
    vram("attention workspaces", seq.attention_workspace * n);
    vram("QSA union workspace (--qsa-union)", seq.union_workspace * n);
    vram("window buffers (" + std::to_string(s.prompt_window) + "-token window)", window_bytes(s, t.moe_prompt));
    vram("MoE workspaces (" + std::to_string(t.n_moe_layers) + " layers)", t.moe_workspaces);
    vram("matmul scratch", t.matmul_scratch);

    // What is left goes to the experts: all of them, or the same number of slots in every layer (one expert: its
    // gate, up and down), the layers that cost less given one more slot each while the rest allows.
    uint64_t left = plan.vram_budget - minimum;
    if (all_fit) {
        plan.experts_in_vram = true;
        vram("routed experts (all " + std::to_string(s.moe.n_expert) + " per layer)", t.experts_uploaded);
    } else {
        plan.experts_in_vram = false;
        plan.experts_pinned = t.experts <= plan.ram_budget;
        uint64_t per_slot_row = 0;  // one slot in every layer
        for (uint64_t b : t.expert_bytes) per_slot_row += b;
        vram("expert address tables", tables);
        // The ring that streams a prompt window's misses from host RAM (model/cuda/expert_cache.cpp make_ring; from the
        // mapped file too, staged by the driver): its buffers hold a range of one pass of the layer that needs the
        // most; it comes out of what the slots get.
        uint64_t ring_buffer = 0;
        for (const std::vector<uint64_t>& pass : t.pass_bytes)
            for (uint64_t b : pass) ring_buffer = std::max(ring_buffer, b * u(s.moe.n_expert / kStreamRanges));
        const int buffers = in.stream_buffers > 0 ? in.stream_buffers : kStreamBuffers;
        if (in.stream_experts && s.moe.n_expert % kStreamRanges == 0 && booked(ring_buffer * u(buffers)) < left) {
            plan.stream_ring_bytes = booked(ring_buffer * u(buffers));
            plan.stream_buffers = buffers;
            left -= plan.stream_ring_bytes;
            vram("expert stream ring (prompt windows)", plan.stream_ring_bytes);
        }
        // Each layer's cache is one allocation: its 256-byte rounding is held back first.
        const uint64_t rounding = 256 * u(t.n_moe_layers);
        const uint64_t usable = left > rounding ? left - rounding : 0;
        const int64_t uniform = std::min<int64_t>(s.moe.n_expert, static_cast<int64_t>(usable / per_slot_row));
        plan.cache_slots.assign(t.expert_bytes.size(), 0);
        uint64_t spent = 0;
        for (size_t il = 0; il < t.expert_bytes.size(); ++il)
            if (t.expert_bytes[il] > 0) {
                plan.cache_slots[il] = uniform;
                spent += u(uniform) * t.expert_bytes[il];
            }
        uint64_t cheapest_cost = 0, dearest_cost = 0;
        for (uint64_t b : t.expert_bytes)
            if (b > 0) {
                cheapest_cost = cheapest_cost ? std::min(cheapest_cost, b) : b;
                dearest_cost = std::max(dearest_cost, b);
            }
        const bool uneven = cheapest_cost != dearest_cost;
        if (uneven) {
            std::vector<size_t> cheapest;
            for (size_t il = 0; il < t.expert_bytes.size(); ++il)
                if (t.expert_bytes[il] > 0) cheapest.push_back(il);
            std::stable_sort(cheapest.begin(), cheapest.end(),
                             [&](size_t a, size_t b) { return t.expert_bytes[a] < t.expert_bytes[b]; });
            for (size_t il : cheapest)
                if (plan.cache_slots[il] < s.moe.n_expert && spent + t.expert_bytes[il] <= usable) {
                    ++plan.cache_slots[il];
                    spent += t.expert_bytes[il];
                }
        }
        uint64_t cache = 0;
        for (size_t il = 0; il < t.expert_bytes.size(); ++il)
            if (plan.cache_slots[il] > 0) cache += booked(u(plan.cache_slots[il]) * t.expert_bytes[il]);
        vram("expert cache (" + std::to_string(uniform) + (uneven ? "+" : "") + " of " +
                 std::to_string(s.moe.n_expert) + " per layer)",
             cache);
        plan.lines.push_back(
            {"routed experts", plan.experts_pinned ? PlanPlace::PinnedHost : PlanPlace::MappedFile, t.experts});
    }
    if (t.ple > 0) {
        const uint64_t ram_left = plan.ram_budget - std::min(plan.ram_budget, plan.pinned_total());
        plan.ple_pinned = t.ple <= ram_left;
        plan.lines.push_back({plan.ple_pinned ? "PLE table" : "PLE table (rows read with a row cache)",
                              plan.ple_pinned ? PlanPlace::PinnedHost : PlanPlace::MappedFile, t.ple});
        if (!plan.ple_pinned) {
            // Each PLE block reads its own table (model/cuda/qwen4exp_cuda.cpp): a reader with its share of the row
            // cache, one prompt window's rows as read, and the same in pinned staging the window copies to the device.
            const uint64_t blocks = std::max<uint64_t>(u(s.ple_blocks.size()), 1);
            const int64_t window_rows = s.prompt_window * s.ple.n_heads();
            const uint64_t window_bytes = u(window_rows) * s.ple_row_bytes;
            plan.ple_row_cache_bytes = std::min(t.ple, kPleRowCacheBytes) / blocks;
            const uint64_t reader = PleRowReader::memory_bytes(
                s.ple_row_bytes, {.max_rows = window_rows, .cache_bytes = plan.ple_row_cache_bytes});
            plan.lines.push_back(
                {"PLE row cache and read buffers", PlanPlace::HostRam, (reader + window_bytes) * blocks});
            plan.lines.push_back({"PLE row staging", PlanPlace::PinnedHost, window_bytes * blocks});
        }
    }
    if (t.mtp > 0) plan.lines.push_back({"MTP blocks", PlanPlace::NotLoaded, t.mtp});
    return plan;
}

}  // namespace

}  // namespace strata
