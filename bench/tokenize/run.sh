#!/usr/bin/env bash
# Tokenization throughput, strata vs HF tokenizers (bench/NOTES.md). Needs a build (BUILD, default build/) with
# libstrata_*.a and tests/interop/node_modules (cd tests/interop && npm ci --omit=optional --ignore-scripts).
#   bench/tokenize/run.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
WORK=${WORK:-/tmp/strata-bench-tokenize}
mkdir -p "$WORK"
ninja -C "$BUILD" strata_tokenizer >/dev/null
libs=()
for l in tokenizer runtime convert model format backend_cpu core; do libs+=("$BUILD/libstrata_$l.a"); done
g++ -std=c++20 -O2 -DNDEBUG -I src bench/tokenize/tokenize_bench.cpp -o "$WORK/tokenize_bench" "${libs[@]}" \
    $(pkg-config --libs libpcre2-8 libutf8proc) -lpthread
node bench/tokenize/bench.mjs "$WORK/tokenize_bench" "$WORK" "${1:-3}"
