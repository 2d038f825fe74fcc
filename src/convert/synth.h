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
};

// Throws Error on an unknown preset, an arch that does not match it, or an unsupported expert type.
SynthModel build_synth(const SynthOptions& options);
// general.*, {arch}.* and the placeholder vocabulary keys.
void add_synth_keys(gguf::Writer& writer, const SynthModel& model);

}  // namespace strata
