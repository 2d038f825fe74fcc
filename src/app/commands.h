// The subcommands of `strata`: each command group's file defines its specs and entry points; main.cpp dispatches.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/flags.h"
#include "format/gguf.h"
#include "model/model.h"
#include "runtime/expert_profile.h"
#include "runtime/memory_plan.h"
#include "runtime/speculative_decode.h"
#include "runtime/stage_plan.h"

namespace strata::app {

struct Command {
    CommandSpec spec;
    int (*run)(const Args& args);  // returns the exit status; throws Error for user errors
};

// cmd_convert.cpp
Command convert_command();
Command synth_command();
// cmd_run.cpp
Command logits_command();
Command generate_command();
// cmd_perplexity.cpp
Command perplexity_command();
Command profile_command();
// cmd_info.cpp
Command info_command();
// cmd_bench.cpp
Command bench_command();
// bench_qsa_union.cpp: `strata bench qsa-union` (--positions, --context, -r, --kv-cache)
int run_qsa_union_bench(const Args& args);
int run_expert_cache_bench(const Args& args);  // bench_expert_cache.cpp
int run_cpu_experts_bench(const Args& args);   // bench_cpu_experts.cpp
// cmd_tokenize.cpp
Command tokenize_command();
// cmd_chat.cpp
Command run_command();
Command chat_command();
// cmd_serve.cpp
Command serve_command();
// cmd_quantize.cpp
Command quantize_command();

// Shared helpers (common.cpp).

// Integers separated by spaces, commas or newlines (a JSON array passes too); `source` names the input in errors.
std::vector<int32_t> parse_token_list(const std::string& text, const std::string& source, bool allow_empty = false);
// Token ids from --tokens TEXT or --tokens-file F (exactly one of them): integers separated by spaces, commas or
// newlines. Throws Error naming the first bad entry. Range checks happen once the vocabulary is known.
std::vector<int32_t> read_tokens(const Args& args);
// Throws Error when an id is outside [0, n_vocab).
void check_token_range(const std::vector<int32_t>& tokens, int64_t n_vocab);
// --threads N (positive) or 0 (all cores).
int thread_count(const Args& args);
// How to load the model: --threads, --backend cpu|cuda, --vram-budget SIZE, --no-cuda-graphs, --gdn-recurrence K.
// Throws Error on a bad value; a CUDA backend that this build or machine lacks is reported when the model loads.
LoadOptions load_options(const Args& args, bool read_threads = true);
// --expert-ring N: the buffers of the ring that streams prompt windows' misses (0 without the flag); Error unless N
// divides a layer's 2 x kStreamRanges copies.
int expert_ring_flag(const Args& args);
// With --backend cuda, before the model loads: the memory plan (runtime/memory_plan.h) for `path` with n_ctx tokens
// in each of n_sequences sequences, from --vram-budget, --ram-budget and the device's free memory; printed to stderr
// and its expert placement put in options.experts. Throws Error (exit 2) when no plan fits. nullopt with --backend
// cpu, or without --vram-budget on a machine or build without a CUDA device (loading then says why).
std::optional<MemoryPlan> plan_memory_for_load(const Args& args, const std::string& path, LoadOptions& options,
                                               int64_t n_ctx, int64_t n_sequences = 1,
                                               int64_t checkpoints_per_sequence = 1);
// --expert-profile: the profile read and checked against the file (nullopt without the flag, or when the file does
// not exist yet: said on stderr).
std::optional<ExpertProfile> expert_profile_flag(const Args& args, const gguf::File& file);
// Experts in host RAM for one card or split stage: its plan's placement with `slots` (by trunk block), the warm set
// from `profile`, the --expert-policy advisor and the CPU workers (`workers`, shared by the stages: made on first use
// unless --cpu-experts 0), over `flags` (--cpu-share). `where` begins its errors ("split stage 1: ").
ExpertPlacement host_expert_placement(const Args& args, const gguf::File& file, const ExpertPlacement& planned,
                                      const std::vector<int64_t>& slots, const std::optional<ExpertProfile>& profile,
                                      const ExpertPlacement& flags, std::shared_ptr<HostExpertCompute>& workers,
                                      const std::string& where);
// What CUDA device `device` reports before loading; nullopt in a build without CUDA or where the device is missing.
std::optional<DeviceMemory> cuda_device_memory(int device);
// The plan's inputs every card or stage shares: --ram-budget, the context, sequences and checkpoints, and the load
// options' KV cache, prompt window and stream ring (the caller sets the VRAM budget and the device).
MemoryPlanInputs plan_inputs(const Args& args, const LoadOptions& options, int64_t n_ctx, int64_t n_sequences,
                             int64_t checkpoints_per_sequence);
// The flags load_options reads, for the commands' flag lists.
extern const std::vector<FlagSpec> kLoadFlags;
// split_load.cpp (issue 29): --split auto|K1,K2,... and --devices LIST. check_split_flags (from load_options): Error
// on a malformed value, or the flags without --backend cuda. plan_split_for_load (from plan_memory_for_load, before
// anything else): nullopt without --split; else each stage's plan (--vram-budget: one size, or one a stage; a device
// that several stages share is divided among them), printed to stderr and put in options.split (and the prompt
// window, the PLE rows' source). Error (exit 2) when no plan fits.
void check_split_flags(const Args& args, Backend backend);
std::optional<std::vector<StagePlan>> plan_split_for_load(const Args& args, const std::string& path,
                                                          LoadOptions& options, int64_t n_ctx, int64_t n_sequences,
                                                          int64_t checkpoints_per_sequence = 1);
// "12G" or "12G,24G": one size of at least 1M a stage (Error otherwise).
std::vector<uint64_t> parse_budget_list(const std::string& text);
// Throws Error when path is not a readable regular file ("what" names it in the message).
void require_file(const std::string& path, const std::string& what);
// The whole file as bytes (require_file's checks first; "what" names it in the messages).
std::string read_text_file(const std::string& path, const std::string& what);
// A file written through a temporary name in the same folder and renamed by commit(), so readers never see half a
// file; without commit() (an error on the way) the temporary file is removed.
class AtomicFile {
  public:
    explicit AtomicFile(std::string path);  // Throws Error when the folder is not writable
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    void write(const void* data, size_t n_bytes);  // Throws Error on a short write (disk full ...)
    void commit();

  private:
    std::string path_;
    std::string temp_path_;
    std::FILE* file_ = nullptr;
};
// Speculation (issue 28): --spec N, --no-spec, --spec-min-p P, for run, chat, generate and bench.
extern const std::vector<FlagSpec> kSpecFlags;
inline constexpr int kDefaultSpec = 4;  // the window when the model has an MTP layer and no flag says otherwise
struct SpecSettings {
    int max_draft = 0;  // 0: off
    float min_p = 0.3f;
    bool mtp = false;  // the model's MTP layer drafts (besides prompt lookup)
    bool lookup = true;     // prompt lookup drafts
    bool adaptive = true;   // false (--spec-fixed): every round drafts N tokens, no policy (A/B runs)
};
// --no-spec: off; --spec N: N; neither: kDefaultSpec when the model has an MTP layer this backend runs, else off.
// Error on a malformed value, or --spec with --no-spec.
SpecSettings spec_settings(const Args& args, const Model& model);
// A flag's value as a probability from 0 to 1 (--spec-min-p, bench --acceptance); nullopt when absent, Error when
// malformed.
std::optional<double> get_probability(const Args& args, const std::string& flag);
// One stderr line: tokens, verification rounds, acceptance and tokens per round, per drafter.
void print_speculation_stats(const SpeculativeStats& stats);
// The bundled model, the default of run, chat, generate, serve and bench (docs/bundled-model.md).
inline constexpr const char* kBundledModelPath = "assets/strata-code-19m.gguf";
inline constexpr const char* kDefaultModelHelp = "the model (default: the bundled assets/strata-code-19m.gguf)";
// cmd_run.cpp: kBundledModelPath in the working folder or beside the build folder; Error otherwise.
std::string default_model_path();
// --model FILE (a readable file, else Error) or, without the flag, default_model_path().
std::string model_path_or_default(const Args& args);
// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(uint64_t n);
// s as the inside of a JSON string: quotes, backslashes and control characters escaped (other bytes as they are).
std::string json_escape(const std::string& s);

}  // namespace strata::app
