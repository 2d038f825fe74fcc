#!/usr/bin/env bash
# Installs what building and testing Strata needs on Debian/Ubuntu, skipping whatever is already there:
#   build:   cmake ninja-build g++ pkg-config libgtest-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev
#   extras:  liburing-dev (the PLE row reader's io_uring reads; without it, pread), clang libclang-rt-14-dev (fuzz
#            smoke run), nodejs npm (llama.cpp interop and server end-to-end tests), chromium (the web app test)
# With --with-interop it also installs node-llama-cpp 3.21.1 (pinned in tests/interop/package-lock.json; only the
# prebuilt CPU binary, nothing is compiled) into tests/interop/node_modules, and the server tests' official clients
# (openai, @anthropic-ai/sdk, playwright-core, ajv; pinned in tests/e2e/package-lock.json) into tests/e2e/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."

with_interop=0
for arg in "$@"; do
  case "$arg" in
    --with-interop) with_interop=1 ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (usage: scripts/setup.sh [--with-interop])" >&2; exit 2 ;;
  esac
done

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
have_cmd() { command -v "$1" >/dev/null 2>&1; }

required=()
have_cmd cmake || required+=(cmake)
have_cmd ninja || required+=(ninja-build)
have_cmd g++ || required+=(g++)
[ -f /usr/include/gtest/gtest.h ] || required+=(libgtest-dev)
[ -f /usr/include/nlohmann/json.hpp ] || required+=(nlohmann-json3-dev)
have_cmd pkg-config || required+=(pkg-config)
[ -f /usr/include/pcre2.h ] || required+=(libpcre2-dev)
[ -f /usr/include/utf8proc.h ] || required+=(libutf8proc-dev)
[ -f /usr/include/httplib.h ] || required+=(libcpp-httplib-dev)
optional=()
[ -f /usr/include/liburing.h ] || optional+=(liburing-dev)
have_cmd clang || optional+=(clang)
have_pkg libclang-rt-14-dev || optional+=(libclang-rt-14-dev)
have_cmd node || optional+=(nodejs)
# NodeSource's nodejs bundles npm (and conflicts with Debian's npm package): ask for npm only when it is missing.
have_cmd npm || optional+=(npm)
[ -x /usr/bin/chromium ] || optional+=(chromium)

if (( ${#required[@]} + ${#optional[@]} )); then
  if ! have_cmd apt-get; then
    echo "setup.sh: missing ${required[*]} ${optional[*]}; install them with your package manager" >&2
    exit 1
  fi
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  echo "setup.sh: installing ${required[*]} ${optional[*]}"
  "${sudo[@]}" apt-get update -q
  if ! "${sudo[@]}" apt-get install -y -q --no-install-recommends "${required[@]}" "${optional[@]}"; then
    # The extras are not needed to build; a distribution without them still gets a working build.
    echo "setup.sh: could not install all of ${optional[*]}; trying the build requirements alone" >&2
    if (( ${#required[@]} )); then "${sudo[@]}" apt-get install -y -q --no-install-recommends "${required[@]}"; fi
  fi
fi

if (( with_interop )); then
  if ! have_cmd npm; then
    echo "setup.sh: npm is not available; the llama.cpp interop test needs it" >&2
    exit 1
  fi
  node_major=$(node -p 'process.versions.node.split(".")[0]')
  if (( node_major < 20 )); then
    echo "setup.sh: node $(node --version) is too old for node-llama-cpp 3.21.1 (needs >= 20)" >&2
    exit 1
  fi
  # --omit=optional: only the CPU build of llama.cpp (listed as a direct dependency), not the CUDA/Vulkan ones;
  # --ignore-scripts: its postinstall step would try to download or build llama.cpp.
  (cd tests/interop && npm ci --omit=optional --ignore-scripts --no-audit --no-fund)
  (cd tests/e2e && npm ci --no-audit --no-fund)
fi
echo "setup.sh: dependencies ready"
