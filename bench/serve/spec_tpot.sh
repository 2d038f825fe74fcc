#!/usr/bin/env bash
# Decode time per output token of `strata serve` by speculation mode (bench/NOTES.md, 2026-12-07, MTP drafts in
# serve): one slot, 1 thread, the code prompt (the first 1,500 bytes of tools/goldens/make_goldens.py), N greedy
# tokens REPEAT times per server (the prompt cached after the first), ms per token from /metrics; every mode once per
# round, ROUNDS rounds. One line per server: round, mode, ms per token, md5 of the texts, speculation counters.
# Usage: STRATA=build/strata [ROUNDS=3 N=400 REPEAT=3 PORT=18500] bench/serve/spec_tpot.sh [MODE...]
set -euo pipefail
cd "$(dirname "$0")/../.."
STRATA=${STRATA:-build/strata}
ROUNDS=${ROUNDS:-3}
N=${N:-400}
REPEAT=${REPEAT:-3}
PORT=${PORT:-18500}
declare -A flags=([nospec]="--no-spec" [lookup]="--spec-drafter lookup" [default]="" [mtp]="--spec-drafter mtp"
                  [mtp-forced]="--spec 1 --spec-drafter mtp --spec-fixed")
modes=("$@")
[[ ${#modes[@]} -gt 0 ]] || modes=(nospec lookup default mtp mtp-forced)
body=$(python3 -c 'import json, sys
print(json.dumps({"prompt": open("tools/goldens/make_goldens.py", "rb").read()[:1500].decode(),
                  "max_tokens": int(sys.argv[1]), "temperature": 0, "ignore_eos": True}))' "$N")
log=$(mktemp)
pid=""
trap 'rm -f "$log"; if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; fi' EXIT
for ((round = 1; round <= ROUNDS; ++round)); do
  for mode in "${modes[@]}"; do
    : >"$log"  # emptied here, not by the redirection below, which may come after the first look at it
    # shellcheck disable=SC2086
    "$STRATA" serve --port "$PORT" --threads 1 --parallel 1 ${flags[$mode]} 2>"$log" >/dev/null &
    pid=$!
    for _ in $(seq 300); do grep -q "listening on" "$log" && break; sleep 0.1; done
    grep -q "listening on" "$log" || { cat "$log" >&2; exit 1; }
    texts=""
    for ((r = 0; r < REPEAT; ++r)); do
      texts+=$(curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d "$body" |
               python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])')
    done
    metrics=$(curl -s "http://127.0.0.1:$PORT/metrics")
    kill "$pid"
    wait "$pid" || true
    pid=""
    python3 - "$round" "$mode" "$(printf %s "$texts" | md5sum | cut -c1-8)" "$metrics" <<'PY'
import re, sys
round_, mode, md5, text = sys.argv[1:5]
def value(name):
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0
tpot = value("strata:time_per_output_token_seconds_sum") / max(value("strata:time_per_output_token_seconds_count"), 1)
# per drafter: rounds, accepted drafts, drafted
by = {d: tuple(value('strata:spec_drafter_%s_total{drafter="%s"}' % (what, d))
               for what in ("rounds", "accepted_tokens", "draft_tokens")) for d in ("mtp", "lookup")}
print("round %s %-10s %.3f ms/token  text %s  mtp %d rounds %d/%d  lookup %d rounds %d/%d" % (
    round_, mode, tpot * 1e3, md5, *by["mtp"], *by["lookup"]), flush=True)
PY
  done
done
