#!/usr/bin/env bash
# Newcomer's first run: installs the build dependencies if missing, builds Strata (Release, into build/),
# synthesizes models/tiny.gguf and generates a few tokens with it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build strata

if [ ! -f models/tiny.gguf ]; then
  mkdir -p models
  build/strata synth --preset tiny --out models/tiny.gguf
fi

cat <<'NOTE'

==> models/tiny.gguf holds RANDOM weights (from `strata synth --preset tiny`): the tokens below are noise.
    The bundled trained model has not landed yet, and neither has the tokenizer, so input and output are token ids.

NOTE
echo "\$ build/strata generate --tokens \"1 2 3 4\" -n 16 --greedy --ids"
build/strata generate --tokens "1 2 3 4" -n 16 --greedy --ids
