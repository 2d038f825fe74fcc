// The pieces of `strata synth` (convert.h's synth_model), exposed so that a preset's tensor and key plan can be
// checked without writing its (possibly huge) file.
#pragma once

#include <memory>
#include <string>

#include "convert/convert.h"
#include "convert/gguf_plan.h"
#include "convert/tensor_source.h"
#include "format/gguf.h"
#include "format/hf_config.h"

namespace strata {

struct SynthModel {
    HfConfig config;
    std::unique_ptr<TensorSource> source;  // the random-weight generator the plan reads from
    ConversionPlan plan;
    TensorTypes types;
    std::string name;
    double router_skew = 0.0;  // SynthOptions::router_skew: --fast keeps the tensors that carry it
};

// FNV-1a of a tensor name: each tensor's random streams start from it and the seed.
uint64_t hash_name(const std::string& s);

// The random-weight tensors save_pretrained would write for this config (HF names and shapes; the PLE hash buffers as
// transformers computes them), as synth draws them.
// router_skew: SynthOptions::router_skew.
std::unique_ptr<TensorSource> synth_hf_source(const HfConfig& config, uint64_t seed, double router_skew = 0.0);

// Throws Error on an unknown preset, an arch that does not match it, or an unsupported expert type.
SynthModel build_synth(const SynthOptions& options);
// general.*, {arch}.* and the placeholder vocabulary keys.
void add_synth_keys(gguf::Writer& writer, const SynthModel& model);

// --fast (synth_fast.cpp): adds every planned tensor to the writer. Tensors of a type synth_fast_fills accepts get
// random quant blocks whose values have the RMS the float generator gives that tensor; the others (F32/F16/BF16)
// get the float generator's values, the same bytes as add_planned_tensors. With a router skew, the token embedding
// (which carries the skew's planted direction) is quantized from the float generator too, whatever its type: random
// blocks would erase the direction and route evenly. Deterministic for a seed; each tensor is
// produced by n_threads threads (0: all cores) when the writer asks for it.
void add_fast_tensors(gguf::Writer& writer, const SynthModel& model, uint64_t seed, int n_threads = 0);
bool synth_fast_fills(DType type);
// Bytes of tensor data the plan writes (without alignment padding).
uint64_t synth_planned_bytes(const SynthModel& model);

}  // namespace strata
