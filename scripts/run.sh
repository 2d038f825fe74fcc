#!/usr/bin/env bash
# Newcomer's first run: installs the build dependencies if missing, builds Strata (Release, into build/),
# runs `strata run` on the bundled model (assets/strata-code-19m.gguf, docs/bundled-model.md).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build strata

echo "\$ build/strata run -n 80 --seed 1 \"def fibonacci(n):\""   # the bundled model: assets/strata-code-19m.gguf
build/strata run -n 80 --seed 1 "def fibonacci(n):"
echo
