#!/usr/bin/env bash
# Newcomer's first run: installs the build dependencies if missing, builds Strata (Release, into build/),
# synthesizes models/tiny.gguf (random weights) and runs `strata run` on it.
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

==> models/tiny.gguf holds RANDOM weights and a placeholder vocabulary (from `strata synth --preset tiny`): the text
    below is noise. The bundled trained model has not landed yet; give any converted model with --model.

NOTE
echo "\$ build/strata run -n 24 --seed 1 \"def fibonacci(n):\""
build/strata run -n 24 --seed 1 "def fibonacci(n):"
echo
