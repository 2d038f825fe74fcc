#!/usr/bin/env bash
# Newcomer's first run: installs the build dependencies if missing, builds Strata (Release, into build/), shows the
# bundled model (assets/strata-code-19m.gguf, docs/bundled-model.md) continuing a prompt, then starts the server with
# its web app on http://127.0.0.1:8080 (Ctrl-C stops it). STRATA_PORT changes the port.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build strata

# A raw continuation (no chat template): the bundled model is a small base model of Python code.
prompt=$'import os\nimport sys\n\n\ndef main():'
echo "\$ build/strata run --raw -n 60 --seed 1 --repeat-penalty 1.1 \"import os ... def main():\""
build/strata run --raw -n 60 --seed 1 --repeat-penalty 1.1 "$prompt"
echo
port=${STRATA_PORT:-8080}
echo "\$ build/strata serve --port $port     # web app: http://127.0.0.1:$port/  (OpenAI API: /v1, Anthropic: /v1/messages)"
exec build/strata serve --port "$port"
