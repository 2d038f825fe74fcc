#!/usr/bin/env bash
# End-to-end tests of `strata serve`: makes a random-weight model (strata synth --preset tiny), starts the server on a
# free loopback port, waits for /health, runs the node:test files (official openai and @anthropic-ai/sdk clients, the
# hostile-request corpus, the web app in headless Chromium), then stops the server.
#
#   tests/e2e/run.sh [STRATA_BINARY] [TEST_FILE...]     (default binary: build/strata; default files: *.test.mjs)
#
# Needs node >= 20 and the pinned npm packages (installed here with `npm ci` when node_modules is missing); the web
# app test needs Debian's chromium (/usr/bin/chromium, or set STRATA_E2E_CHROMIUM) and is skipped without it.
# Screenshots go to $STRATA_E2E_OUT (default: build/e2e). Exit status 0 only when every test passed and the server
# was still up at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

bin=${STRATA_BINARY:-$repo/build/strata}
if [ $# -gt 0 ] && [ -f "$1" ] && [ -x "$1" ] && [[ "$1" != *.mjs ]]; then bin=$1; shift; fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
if [ ! -x "$bin" ]; then
  echo "e2e: no strata executable at $bin (build it, or pass its path)" >&2
  exit 2
fi
# 77: ctest's SKIP_RETURN_CODE, for machines without node at all (anything else missing is a failure).
if ! command -v node >/dev/null; then
  if [ -n "${CI:-}" ]; then echo "e2e: node is not installed, and CI must run these tests" >&2; exit 1; fi
  echo "e2e: SKIPPED: node is not installed (apt-get install nodejs npm)" >&2
  exit 77
fi

cd "$here"
if [ ! -d node_modules/openai ] || [ ! -d node_modules/@anthropic-ai/sdk ] || [ ! -d node_modules/playwright-core ] \
   || [ ! -d node_modules/ajv ]; then
  echo "e2e: installing the pinned npm packages (npm ci)"
  npm ci --no-audit --no-fund || { echo "e2e: npm ci failed" >&2; exit 2; }
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/strata-e2e.XXXXXX")
server_pid=
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT

model=$work/tiny.gguf
"$bin" synth --preset tiny --out "$model" >/dev/null || { echo "e2e: strata synth failed" >&2; exit 1; }

port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
url=http://127.0.0.1:$port
log=$work/server.log
env -u STRATA_API_KEY "$bin" serve --model "$model" --port "$port" >"$log" 2>&1 &
server_pid=$!

up=0
for _ in $(seq 600); do
  if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
  if node -e 'fetch(process.argv[1]+"/health").then(r=>process.exit(r.status===200?0:1),()=>process.exit(1))' "$url"
  then up=1; break; fi
  sleep 0.1
done
if (( !up )); then
  echo "e2e: strata serve did not come up on $url; its log:" >&2
  cat "$log" >&2
  exit 1
fi
echo "e2e: strata serve is up on $url (pid $server_pid, model $model)"

files=("$@")
if [ ${#files[@]} -eq 0 ]; then files=(*.test.mjs); fi

export STRATA_E2E_URL=$url STRATA_E2E_BIN=$bin STRATA_E2E_MODEL=$model
export STRATA_E2E_OUT=${STRATA_E2E_OUT:-$repo/build/e2e}
mkdir -p "$STRATA_E2E_OUT"
# One file at a time: the machine is small and several tests read server-wide counters.
node --test --test-concurrency=1 --test-reporter=spec "${files[@]}"
rc=$?

if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "e2e: FAIL: the server is no longer running at the end of the tests; its log:" >&2
  tail -n 100 "$log" >&2
  rc=1
fi
cp "$log" "$STRATA_E2E_OUT/server.log" 2>/dev/null
echo "e2e: server log saved to $STRATA_E2E_OUT/server.log"
exit $rc
