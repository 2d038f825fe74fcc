// `strata tokenize`: text to token ids (or ids to text with --decode) with a model's tokenizer or a tokenizer.json.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "app/commands.h"
#include "core/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace strata::app {

namespace {

constexpr uint64_t kMaxTextFileBytes = 1ull << 30;

std::string read_input(const Args& args) {
    auto text = args.get("--text");
    auto file = args.get("--text-file");
    if (text && file) throw Error("give either --text or --text-file, not both");
    if (text) return *text;
    if (!file) throw Error("no input: give --text T or --text-file F");
    require_file(*file, "--text-file");
    std::ifstream in(*file, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    if (in.bad()) throw Error("--text-file '" + *file + "': read error");
    std::string s = buffer.str();
    if (s.size() > kMaxTextFileBytes) throw Error("--text-file '" + *file + "' is larger than 1 GiB");
    return s;
}

std::unique_ptr<Tokenizer> load_tokenizer(const Args& args) {
    auto model = args.get("--model");
    auto tokenizer = args.get("--tokenizer");
    if (model && tokenizer) throw Error("give either --model or --tokenizer, not both");
    if (tokenizer) return Tokenizer::from_hf_dir_or_file(*tokenizer);
    if (!model) throw Error("no tokenizer: give --model FILE.gguf or --tokenizer tokenizer.json");
    require_file(*model, "--model");
    auto file = gguf::File::open(*model);
    return Tokenizer::from_gguf(*file);
}

int run_tokenize(const Args& args) {
    const std::string input = read_input(args);
    const bool decode = args.has("--decode");
    if (decode && args.has("--no-special")) throw Error("--no-special applies to encoding, not to --decode");
    std::vector<int32_t> ids;
    if (decode) ids = parse_token_list(input, "--decode", /*allow_empty=*/true);  // before loading: fail fast
    auto tok = load_tokenizer(args);
    if (decode) {
        check_token_range(ids, tok->n_vocab());
        const std::string bytes = tok->decode(ids);
        std::fwrite(bytes.data(), 1, bytes.size(), stdout);
        return 0;
    }
    ids = tok->encode(input, !args.has("--no-special"));
    std::string line;
    line.reserve(ids.size() * 7 + 1);
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) line += ' ';
        line += std::to_string(ids[i]);
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
    return 0;
}

}  // namespace

Command tokenize_command() {
    return {
        .spec =
            {
                .name = "tokenize",
                .summary = "text to token ids (or ids to text) with a model's tokenizer or a tokenizer.json",
                .usage = "strata tokenize (--model FILE.gguf | --tokenizer tokenizer.json) (--text T | --text-file F) "
                         "[--no-special] [--decode]",
                .flags =
                    {
                        {"--model", "FILE.gguf", "take the tokenizer from a GGUF model (tokenizer.ggml.* keys)"},
                        {"--tokenizer", "FILE", "a HF tokenizer.json (or the folder that holds it)"},
                        {"--text", "T", "the text to tokenize (with --decode: the token ids)"},
                        {"--text-file", "F", "read the text (or with --decode the ids) from a file, bytes as they are"},
                        {"--no-special", "",
                         "treat special tokens such as <|im_end|> as plain text (other added tokens still match)"},
                        {"--decode", "", "the input is token ids; print exactly the bytes they decode to"},
                    },
                .notes = "Prints the ids separated by spaces and a newline. Invalid UTF-8 in the text is replaced "
                         "by U+FFFD first. With --decode nothing is added to the decoded bytes (no newline).",
            },
        .run = run_tokenize,
    };
}

}  // namespace strata::app
