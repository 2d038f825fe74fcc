// strata's side of bench/tokenize: encode one text file with a tokenizer.json, timing only encode.
//   tokenize_bench TOKENIZER.json TEXT_FILE REPEATS [CHUNK]
//     -> {"bytes": N, "tokens": T, "checksum": C, "seconds": [...]}
// CHUNK > 0 encodes the text in pieces of about CHUNK bytes (cut after the next newline), one encode call each; the
// time is that of all calls. The first repeat runs with an empty word cache (cold), the later ones warm, as HF's
// side does. The checksum (FNV-1a over the ids) lets the two sides show they produced the same ids.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
    if (argc != 4 && argc != 5) {
        std::fprintf(stderr, "usage: tokenize_bench TOKENIZER.json TEXT_FILE REPEATS [CHUNK]\n");
        return 2;
    }
    auto tok = strata::Tokenizer::from_hf_dir_or_file(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const int repeats = std::stoi(argv[3]);
    const size_t chunk = argc == 5 ? std::stoul(argv[4]) : 0;
    std::vector<std::string_view> pieces;
    for (size_t i = 0; i < text.size();) {
        size_t j = chunk == 0 ? text.size() : std::min(text.size(), i + chunk);
        if (j < text.size()) {
            const size_t nl = text.find('\n', j);
            j = nl == std::string::npos ? text.size() : nl + 1;
        }
        pieces.push_back(std::string_view(text).substr(i, j - i));
        i = j;
    }
    std::string seconds;
    std::vector<std::vector<int32_t>> ids(pieces.size());
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t p = 0; p < pieces.size(); ++p) ids[p] = tok->encode(pieces[p]);
        const auto t1 = std::chrono::steady_clock::now();
        seconds += (r ? "," : "") + std::to_string(std::chrono::duration<double>(t1 - t0).count());
    }
    size_t n_tokens = 0;
    uint32_t checksum = 2166136261u;
    for (const auto& row : ids) {
        n_tokens += row.size();
        for (int32_t id : row) checksum = (checksum ^ static_cast<uint32_t>(id)) * 16777619u;
    }
    std::printf("{\"bytes\": %zu, \"tokens\": %zu, \"checksum\": %u, \"seconds\": [%s]}\n", text.size(), n_tokens,
                checksum, seconds.c_str());
    return 0;
}
