// Per-layer embeddings (qwen4exp): hashed n-gram rows of the current token and its predecessors, projected to a value
// and one key per residual stream; the normalised streams gate the value, and a dilated causal conv adds local
// context. Math: Qwen4ExpTextNGramEmbedding + Qwen4ExpTextPLELayer; GGUF: ple_*, per_layer_token_embd, ple.* keys.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/batch_rows.h"
#include "model/binding.h"
#include "model/scratch.h"

namespace strata {

struct PleShape {
    int64_t n_embd = 0;                 // H
    int64_t n_streams = 0;              // hc
    int64_t ngram = 0;                  // N: orders 2..N
    int64_t heads_per_ngram = 0;        // heads per order; n_heads = (N - 1) * this
    int64_t row_width = 0;              // P
    int64_t conv_kernel = 0;            // Kp, dilation N
    int32_t eos = 0;                    // cuts n-gram windows
    std::vector<uint64_t> multipliers;  // >= N
    std::vector<uint64_t> offsets;      // >= n_heads
    std::vector<uint64_t> sizes;        // >= n_heads
    float eps = 1e-6f;

    int64_t n_heads() const { return (ngram - 1) * heads_per_ngram; }
    int64_t history_rows() const { return (conv_kernel - 1) * ngram; }
};

struct PleWeights {
    Tensor table;                                        // {P, R}
    Tensor key;                                          // {n_heads P, HC}
    Tensor value;                                        // {n_heads P, H}
    std::vector<float> norm_key, norm_query, norm_conv;  // {HC}
    std::vector<float> conv;                             // {Kp, HC}
};

// table: the block's PLE table (format/gguf_names.h: ple_table_name).
PleWeights bind_ple(const TensorBinder& binder, int64_t block, const PleShape& shape, const std::string& table);

struct PleState {
    std::vector<int32_t> tokens;      // the last N - 1 tokens, oldest first (EOS before the sequence starts)
    std::vector<float> conv_history;  // (Kp - 1) N rows of HC
    void init(const PleShape& shape);
    size_t bytes() const { return tokens.size() * sizeof(int32_t) + conv_history.size() * sizeof(float); }
};

// Table rows (one per head) of a token given its predecessors. history: the N - 1 previous tokens, oldest first.
std::vector<int64_t> ple_rows(const PleShape& shape, const int32_t* history, int32_t token);
// The same into rows[n_heads].
void ple_rows_into(const PleShape& shape, const int32_t* history, int32_t token, int64_t* rows);

// A PLE table that stays in its file (28.8 GB at Flash-Next's size): where its rows lie, for a PleRowSource.
struct PleTableInFile {
    std::string path;
    uint64_t offset = 0;  // of row 0, from the start of the file
    size_t row_bytes = 0;
    int64_t n_rows = 0;
};

// Reads PLE table rows from the file for a CUDA trunk whose table is not pinned (LoadOptions::ple_from_file); the
// runtime's PleRowReader (runtime/ple_row_reader.h) is the one the commands use. Kept an interface here because the
// model layer may not use the runtime layer (DESIGN.md section 3).
class PleRowSource {
  public:
    virtual ~PleRowSource() = default;
    // Row rows[i]'s bytes into out + i * row_bytes, for rows.size() <= the max_rows the source was made for. A row
    // outside the table reads as zeros (the device gather's rule for a bad row). Throws Error when the file cannot be
    // read or a read does not complete within the source's bound.
    virtual void fetch(std::span<const int64_t> rows, uint8_t* out) = 0;
};

// A speculative verification window's per-token inputs to one PLE block's state, for one sequence (ple_commit).
struct PleWindow {
    int64_t count = 0;            // tokens recorded (0: none)
    std::vector<int32_t> tokens;  // count
    std::vector<float> conv;      // count x HC: the conv's input rows
};
// Brings `state` (as it was before the window) to after the window's first n_keep tokens: the n-gram history takes
// their tokens and the conv history their input rows, as the forward pass did.
void ple_commit(PleState& state, const PleWindow& window, int64_t n_keep);

// One pass over the rows of one or more sequences (batch_rows.h): table rows and the n-gram history and conv per
// sequence, the projections over all rows at once.
struct PleForwardArgs {
    const PleShape& shape;
    const PleWeights& weights;
    std::span<PleState* const> states;        // one per sequence
    std::span<const SequenceRows> sequences;  // their rows, same order
    const int32_t* tokens;                    // [n_tokens], all rows
    float* residual;                          // [n_tokens x HC], gets the PLE output added
    int64_t n_tokens = 1;
    Scratch& scratch;
    ThreadPool* pool = nullptr;
    std::span<PleWindow* const> windows = {};  // empty, or one per sequence: where to record its rows (null: not)
};
void ple_forward(const PleForwardArgs& args);

}  // namespace strata
