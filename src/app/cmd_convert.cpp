// `strata convert` (HF save_pretrained folder to GGUF) and `strata synth` (random-weight GGUF of a named shape).
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "app/commands.h"
#include "convert/convert.h"
#include "convert/synth.h"
#include "core/dtype.h"
#include "core/error.h"

namespace strata::app {

namespace {

DType parse_type(const Args& args, const std::string& flag, const std::vector<std::string>& allowed) {
    auto name = args.get_choice(flag, allowed);
    STRATA_ASSERT(name.has_value());
    auto type = dtype_from_name(*name);
    STRATA_ASSERT(type.has_value());  // every allowed name is a known type
    return *type;
}

// The file the writer produced: out_path itself, or for a split conversion its first part and the part count
// (NAME.gguf -> NAME-00001-of-0000N.gguf).
std::string written_files(const std::string& out_path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(out_path, ec)) return out_path;
    fs::path out(out_path);
    const std::string stem = out.extension() == ".gguf" ? out.stem().string() : out.filename().string();
    const std::string first = stem + "-00001-of-";
    fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(first, 0) == 0 && name.size() == first.size() + 10 && name.ends_with(".gguf"))
            return (out.parent_path() / name).string() + " and " +
                   std::to_string(std::stoi(name.substr(first.size(), 5)) - 1) + " more parts";
    }
    return out_path;
}

int run_convert(const Args& args) {
    if (auto in = args.get("--gguf")) {
        if (args.has("--hf")) throw Error("give either --hf DIR or --gguf FILE, not both");
        if (!args.has("--no-mtp"))
            throw Error("--gguf copies a GGUF without its MTP block: add --no-mtp (the only conversion it does)");
        for (const char* flag : {"--outtype", "--vocab-placeholder", "--split-max-size"})
            if (args.has(flag)) throw Error(std::string(flag) + " applies to --hf conversions, not to --gguf");
        const std::string out = args.require("--out");
        strip_mtp_gguf(*in, out);
        std::printf("wrote %s (%s without its MTP block)\n", out.c_str(), in->c_str());
        return 0;
    }
    if (!args.has("--hf")) throw Error("convert needs --hf DIR (or --gguf FILE --no-mtp)");
    ConvertOptions options{
        .hf_dir = args.require("--hf"),
        .out_path = args.require("--out"),
    };
    struct stat st {};
    if (::stat(options.hf_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        throw Error("--hf '" + options.hf_dir +
                    "' is not a folder (expected a save_pretrained folder with config.json)");
    if (args.has("--outtype")) options.out_type = parse_type(args, "--outtype", {"f32", "f16", "bf16", "q8_0"});
    options.vocab_placeholder = args.has("--vocab-placeholder");
    options.include_mtp = !args.has("--no-mtp");
    if (auto size = args.get("--split-max-size")) {
        auto bytes = parse_size(*size);
        if (!bytes) throw Error("--split-max-size expects a size like 512M or 2G, got '" + *size + "'");
        options.split_max_bytes = *bytes;
    }
    convert_hf_to_gguf(options);
    std::printf("wrote %s (%s)\n", written_files(options.out_path).c_str(), dtype_name(options.out_type));
    return 0;
}

// --dry-run: what the file would hold, by type, without writing it.
void print_synth_plan(const SynthOptions& options) {
    const SynthModel m = build_synth(options);
    std::map<std::string, std::pair<int64_t, uint64_t>> by_type;  // tensors, bytes
    for (const PlannedTensor& t : m.plan.tensors) {
        auto& [n, bytes] = by_type[dtype_name(planned_type(t, m.types))];
        ++n;
        bytes += row_bytes(planned_type(t, m.types), t.ne[0]) * static_cast<uint64_t>(t.n_rows());
    }
    const auto gib = [](uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); };
    std::printf("preset %s: %zu tensors, %.2f GiB of tensor data\n", options.preset.c_str(), m.plan.tensors.size(),
                gib(synth_planned_bytes(m)));
    for (const auto& [type, total] : by_type)
        std::printf("  %-8s %5lld tensors %10.3f GiB\n", type.c_str(), static_cast<long long>(total.first),
                    gib(total.second));
    for (const auto& ple : m.plan.ple_layers)
        std::printf("  PLE table of block %lld: %lld rows of %lld\n", static_cast<long long>(ple.block),
                    static_cast<long long>(ple.rows), static_cast<long long>(m.plan.ple_row_width));
}

int run_synth(const Args& args) {
    const bool dry_run = args.has("--dry-run");
    SynthOptions options{
        .preset = args.require("--preset"),
        .arch = args.get("--arch").value_or(""),
        .out_path = dry_run ? args.get("--out").value_or("") : args.require("--out"),
    };
    if (args.has("--type"))
        options.expert_type = parse_type(args, "--type",
                                         {"f32", "f16", "bf16", "q8_0", "q4_0", "q2_k", "q3_k", "q4_k", "q5_k",
                                          "q6_k", "iq4_nl", "iq4_xs", "iq2_xs", "iq3_xxs", "iq3_s", "iq1_m"});
    if (auto seed = args.get_u64("--seed")) options.seed = *seed;
    options.fast = args.has("--fast");
    options.shapes_only = args.has("--shapes-only");
    if (options.fast && options.shapes_only) throw Error("synth: give --fast or --shapes-only, not both");
    if (auto base = args.get_int("--ple-vocab-base", 1, 0x7FFFFFFF)) options.ple_vocab_base = *base;
    if (auto skew = args.get("--router-skew")) {
        size_t used = 0;
        double v = -1.0;
        try {
            v = std::stod(*skew, &used);
        } catch (const std::logic_error&) {
            used = 0;
        }
        if (used != skew->size() || !(v >= 0.0 && v <= 8.0))
            throw Error("--router-skew expects a number from 0 to 8 (1: the calibrated skew), got '" + *skew + "'");
        options.router_skew = v;
    }
    if (auto threads = args.get_int("--threads", 1, 4096)) {
        if (!options.fast) throw Error("--threads applies to --fast (the default path writes on one thread)");
        options.threads = static_cast<int>(*threads);
    }
    if (dry_run) {
        print_synth_plan(options);
        return 0;
    }
    synth_model(options);
    std::printf("wrote %s (preset %s, %s)\n", options.out_path.c_str(), options.preset.c_str(),
                options.shapes_only ? "tensor shapes only: the data are a hole that reads as zeros"
                : options.fast      ? "random weights, random quant blocks"
                                    : "random weights");
    return 0;
}

}  // namespace

Command convert_command() {
    return {
        .spec =
            {
                .name = "convert",
                .summary = "convert a Hugging Face save_pretrained folder to GGUF (llama.cpp names and keys)",
                .usage = "strata convert --hf DIR --out FILE.gguf [--outtype f32|f16|bf16|q8_0] "
                         "[--vocab-placeholder] [--no-mtp] [--split-max-size N[K|M|G]]\n"
                         "       strata convert --gguf IN.gguf --no-mtp --out FILE.gguf",
                .flags =
                    {
                        {"--hf", "DIR", "folder with config.json, *.safetensors and (if present) tokenizer.json"},
                        {"--gguf", "IN.gguf", "with --no-mtp: copy a GGUF without its MTP (nextn) block"},
                        {"--out", "FILE.gguf", "output file (written under a temporary name, then renamed)"},
                        {"--outtype", "TYPE",
                         "f32, f16 (default), bf16 or q8_0 for the matrices; norms, conv "
                         "and routers stay f32"},
                        {"--vocab-placeholder", "",
                         "write a byte-level placeholder vocabulary when the folder has "
                         "no tokenizer.json"},
                        {"--no-mtp", "",
                         "leave out the MTP (nextn) block; llama.cpp v0.4.0 refuses qwen4exp "
                         "files that carry one"},
                        {"--split-max-size", "N",
                         "split the output into NAME-0000i-of-0000n.gguf files of at most "
                         "N bytes of data (suffix K, M or G)"},
                    },
            },
        .run = run_convert,
    };
}

Command synth_command() {
    std::string presets = "presets:";
    for (const auto& line : synth_preset_names()) presets += "\n  " + line;
    return {
        .spec =
            {
                .name = "synth",
                .summary = "write a random-weight GGUF of a named shape (for tests and benchmarks)",
                .usage = "strata synth --preset NAME [--arch ARCH] [--type T] --out FILE.gguf [--seed S] [--fast "
                         "[--threads N]] [--ple-vocab-base N] [--router-skew S] [--dry-run] [--shapes-only]",
                .flags =
                    {
                        {"--preset", "NAME", "the shape (see the presets below)"},
                        {"--arch", "ARCH", "qwen4exp, qwen35moe or qwen3next (default: the preset's own)"},
                        {"--type", "T",
                         "type of the routed expert matrices: f32, f16, bf16, q8_0, q4_0, q2_k, "
                         "q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, iq2_xs, iq3_xxs, iq3_s or iq1_m"},
                        {"--out", "FILE.gguf", "output file"},
                        {"--seed", "S", "random seed (default 1): the same seed writes the same file"},
                        {"--fast", "",
                         "fill quantized tensors with random quant blocks (scaled to the float weights' RMS) "
                         "instead of quantizing random floats: writes at disk speed; float tensors are unchanged"},
                        {"--threads", "N", "with --fast: threads (default: all cores)"},
                        {"--ple-vocab-base", "N",
                         "PLE table size: its heads get the primes at or above N as row counts, about heads x N "
                         "rows (the preset's ngram_vocab_size_base; flash-next: 16 heads, 20000000); every other "
                         "tensor keeps its shape"},
                        {"--router-skew", "S",
                         "routers with a popularity skew: 0 (default) keeps near-uniform routing; 1 is calibrated "
                         "so that LRU with 64 / 128 of 512 expert slots a layer hits about 67% / 80% on moe512-deep "
                         "fed pseudo-random ids (as bench feeds them), near the 67% / 81% of a real Flash-Next; "
                         "larger is more skewed (up to 8)"},
                        {"--dry-run", "", "print the planned tensor bytes by type and write nothing (--out optional)"},
                        {"--shapes-only", "",
                         "write the keys and tensor directory with the tensor data left a hole (a sparse file "
                         "that reads as zeros and takes only the header's disk space): for `strata info "
                         "--vram-budget` plans of presets too large to write"},
                    },
                .notes = presets +
                         "\n\nRandom weights give near-uniform expert routing: the pessimistic case for expert "
                         "caches (--router-skew 1 gives realistic routing). Routed experts whose rows hold no whole "
                         "block of --type take llama-quantize's fallback (iq4_nl for the 2- and 3-bit types and iq4_xs, q8_0 for q4_k, q5_k, q6_k).\n"
                         "The full flash-next shape in about 52 GB (PLE table cut to ~1 GB):\n"
                         "  strata synth --preset flash-next --type iq2_xs --fast --ple-vocab-base 200000 --out F.gguf",
            },
        .run = run_synth,
    };
}

}  // namespace strata::app
