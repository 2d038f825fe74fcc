// `strata convert`: HF save_pretrained folder -> GGUF with llama.cpp's names, keys and transforms.
#include "convert/convert.h"

#include <cstdio>
#include <filesystem>

#include "convert/gguf_plan.h"
#include "convert/tensor_source.h"
#include "core/error.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/hf_tokenizer.h"

namespace strata {

ConvertReport convert_hf_to_gguf(const ConvertOptions& o) {
    namespace fs = std::filesystem;
    check_output_type(o.out_type);
    if (o.hf_dir.empty()) throw Error("convert: no HF folder given (--hf DIR)");
    if (o.out_path.empty()) throw Error("convert: no output file given (--out FILE.gguf)");
    if (!fs::is_directory(o.hf_dir)) throw Error(o.hf_dir + ": not a directory");

    const HfConfig config = load_hf_config(o.hf_dir);
    if (config.arch == HfArch::Qwen4Exp) {
        const std::string gate = config.output_gate_type.empty() ? config.hidden_act : config.output_gate_type;
        if (gate != "sigmoid")
            std::fprintf(stderr,
                         "strata convert: warning: the GDN output gate is '%s', llama.cpp's qwen4exp uses sigmoid\n",
                         gate.c_str());
    }

    std::optional<int64_t> eos;
    if (!config.eos_token_ids.empty()) eos = config.eos_token_ids.front();
    std::optional<HfVocab> vocab =
        load_hf_tokenizer({.dir = o.hf_dir, .vocab_size = config.vocab_size, .fallback_eos = eos});
    if (!vocab) {
        if (!o.vocab_placeholder)
            throw Error(o.hf_dir +
                        " has no tokenizer.json; pass --vocab-placeholder to write a byte-level placeholder "
                        "vocabulary instead");
        vocab = placeholder_vocab(config.vocab_size, eos);
    }

    const std::unique_ptr<TensorSource> source = open_safetensors_source(o.hf_dir);
    const ConversionPlan plan = plan_conversion(config, *source, {.include_mtp = o.include_mtp});

    if (const std::string warning = llama_cpp_warning(plan, "strata convert"); !warning.empty())
        std::fprintf(stderr, "%s\n", warning.c_str());

    gguf::Writer writer;
    // general.name: the folder's name, or its parent's when the folder is a generic "hf"/"model" directory
    fs::path dir = fs::absolute(o.hf_dir).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();
    std::string name = dir.filename().string();
    if ((name == "hf" || name == "model") && !dir.parent_path().filename().empty())
        name = dir.parent_path().filename().string();
    add_model_keys(writer, plan, name, o.out_type);
    add_vocab_keys(writer, *vocab);
    add_planned_tensors(writer, plan, {.out_type = o.out_type});
    writer.write(o.out_path, o.split_max_bytes);
    return {.llama_cpp_unsupported = plan.llama_cpp_unsupported};
}

}  // namespace strata
