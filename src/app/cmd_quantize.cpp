// `strata quantize IN.gguf OUT.gguf --type TYPE [--mix NAME]` (or --out OUT.gguf): a GGUF rewritten in a smaller element type
// (convert/quantize.h), with a summary of what changed.
#include <cstdio>

#include "app/commands.h"
#include "convert/quantize.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace strata::app {

namespace {

int run_quantize(const Args& args) {
    const auto& files = args.positional();
    if (files.empty())
        throw Error("quantize: no input file given (usage: strata quantize IN.gguf OUT.gguf --type TYPE)");
    if (files.size() > 1 && args.has("--out"))
        throw Error("quantize: the output file is given twice (as OUT.gguf and as --out); give one");
    if (files.size() < 2 && !args.has("--out"))
        throw Error("quantize: no output file given (usage: strata quantize IN.gguf OUT.gguf --type TYPE)");
    const QuantizeOptions options{
        .in_path = files.front(),
        .out_path = files.size() > 1 ? files[1] : args.require("--out"),
        .type = args.require("--type"),
        .mix = args.get("--mix").value_or("default"),
        .threads = thread_count(args) > 0 ? thread_count(args) : default_thread_count(),
    };
    const QuantizeReport r = quantize_gguf(options);
    std::printf("wrote %s (--type %s, --mix %s, general.file_type %u)\n", options.out_path.c_str(),
                options.type.c_str(), options.mix.c_str(), r.file_type);
    std::printf("before: %s\n", format_bytes(r.bytes_in).c_str());
    for (const auto& [type, total] : r.input_types)
        std::printf("  %-8s %6lld tensors  %s\n", type.c_str(), static_cast<long long>(total.tensors),
                    format_bytes(total.bytes).c_str());
    std::printf("after:  %s (%.1f%%), %lld tensors copied unchanged\n", format_bytes(r.bytes_out).c_str(),
                r.bytes_in ? 100.0 * static_cast<double>(r.bytes_out) / static_cast<double>(r.bytes_in) : 100.0,
                static_cast<long long>(r.copied));
    for (const auto& [type, total] : r.output_types)
        std::printf("  %-8s %6lld tensors  %s\n", type.c_str(), static_cast<long long>(total.tensors),
                    format_bytes(total.bytes).c_str());
    if (!r.fallbacks.empty()) {
        std::printf("fallbacks (row length not a multiple of the type's block): %zu\n", r.fallbacks.size());
        for (const std::string& f : r.fallbacks) std::printf("  %s\n", f.c_str());
    }
    return 0;
}

}  // namespace

Command quantize_command() {
    return {
        .spec =
            {
                .name = "quantize",
                .summary = "rewrite a GGUF with smaller weights (q8_0, q4_k, iq4_xs, ...) by a per-tensor mix",
                .usage = "strata quantize IN.gguf OUT.gguf --type TYPE [--mix default|experts-only]",
                .flags =
                    {
                        {"--out", "OUT.gguf", "the output file instead of the second argument"},
                        {"--type", "TYPE", "type of the routed experts: " + quantize_type_names()},
                        {"--mix", "NAME", "which tensors change and to what (default: default; see below)"},
                        {"--threads", "N", "worker threads (default: all cores)"},
                    },
                .positional_name = "IN.gguf OUT.gguf",
                .max_positional = 2,
                .notes = quantize_mix_help() +
                         "\ngeneral.file_type is set to llama.cpp's code for TYPE (q4_k: 15 = Q4_K_M, q8_0: 7, ...).",
            },
        .run = run_quantize,
    };
}

}  // namespace strata::app
