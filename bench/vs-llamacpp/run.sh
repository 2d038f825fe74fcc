#!/usr/bin/env bash
# strata against llama.cpp (node-llama-cpp 3.21.1, prebuilt CPU build) on the same GGUF, side by side (bench/NOTES.md).
#
#   bench/vs-llamacpp/run.sh [--preset NAME] [--type T] [-p P] [-n N] [-d DEPTH] [-r ROUNDS] [--threads "1 2"]
#                            [--isa "avx2 avx512"] [MODEL.gguf]
#
# Without MODEL.gguf it synthesizes one: `strata synth --preset NAME --type T` (default qwen4exp-mid q8_0: ~100 s and
# 1.5 GB, kept in $WORK for the next run; --preset tiny for a quick check). Each of ROUNDS rounds (default 5) runs,
# interleaved, one strata process (`strata bench --json -r 1`) and one llama.cpp process (llama_bench.mjs -r 1) per
# thread count; each process warms up once before its timed run. The table gives each engine at its best thread
# count per test, the ratio strata / llama.cpp, and each engine's peak RSS (/usr/bin/time -v; llama.cpp's includes the
# node runtime, ~50 MB). Needs a build (BUILD, default build/) and tests/interop/node_modules
# (cd tests/interop && npm ci --omit=optional --ignore-scripts). --isa runs strata once per listed STRATA_ISA value in
# each round (engine strata-ISA; e.g. "avx2-novnni avx2 avx512" on an AVX-512 machine), each against the same llama.cpp
# runs. -d DEPTH runs both tests after DEPTH tokens of untimed context in both engines (tests named ppP@dDEPTH).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
WORK=${WORK:-/tmp/strata-bench-vs-llamacpp}
STRATA="$BUILD/strata"
preset=qwen4exp-mid type=q8_0 n_prompt=512 n_gen=128 depth=0 rounds=5 threads="1 2" isas="" model=""
while [ $# -gt 0 ]; do
    case "$1" in
        --preset) preset=$2; shift 2 ;;
        --type) type=$2; shift 2 ;;
        -p) n_prompt=$2; shift 2 ;;
        -n) n_gen=$2; shift 2 ;;
        -d) depth=$2; shift 2 ;;
        -r) rounds=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --isa) isas=$2; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        -*) echo "run.sh: unknown flag '$1' (see --help)" >&2; exit 2 ;;
        *) model=$1; shift ;;
    esac
done
[ -x "$STRATA" ] || { echo "run.sh: no $STRATA: build first (or set BUILD)" >&2; exit 2; }
mkdir -p "$WORK"
if [ -z "$model" ]; then
    model="$WORK/$preset-$type.gguf"
    if [ ! -f "$model" ]; then
        echo "synthesizing $model (strata synth --preset $preset --type $type) ..." >&2
        "$STRATA" synth --preset "$preset" --type "$type" --out "$model" >&2
    fi
fi
[ -f "$model" ] || { echo "run.sh: no such model '$model'" >&2; exit 2; }

results="$WORK/results.jsonl"
: >"$results"
# One process: its JSON lines tagged with engine and round, then its peak RSS from /usr/bin/time -v.
measure() {
    local engine=$1 round=$2 t=$3; shift 3
    local out="$WORK/out.txt" timing="$WORK/time.txt"
    /usr/bin/time -v -o "$timing" "$@" >"$out"
    grep '^{"test"' "$out" | sed "s/^{/{\"engine\":\"$engine\",\"round\":$round,/" >>"$results"
    local kb
    kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$timing")
    echo "{\"engine\":\"$engine\",\"round\":$round,\"threads\":$t,\"peak_rss_bytes\":$((kb * 1024))}" >>"$results"
}
for round in $(seq 1 "$rounds"); do
    for t in $threads; do
        strata_cmd=("$STRATA" bench --model "$model" -p "$n_prompt" -n "$n_gen" -d "$depth" -r 1 --threads "$t" --json)
        llama_cmd=(node bench/vs-llamacpp/llama_bench.mjs "$model" --threads "$t" -p "$n_prompt" -n "$n_gen" -d "$depth" -r 1)
        run_strata() {
            if [ -z "$isas" ]; then
                measure strata "$round" "$t" "${strata_cmd[@]}"
            else
                for isa in $isas; do measure "strata-$isa" "$round" "$t" env STRATA_ISA="$isa" "${strata_cmd[@]}"; done
            fi
        }
        # Alternate which engine goes first, so neither always runs on a cooler (or warmer) machine.
        if [ $((round % 2)) -eq 1 ]; then
            run_strata
            measure llama.cpp "$round" "$t" "${llama_cmd[@]}"
        else
            measure llama.cpp "$round" "$t" "${llama_cmd[@]}"
            run_strata
        fi
        echo "round $round/$rounds, $t thread(s) done" >&2
    done
done

python3 - "$results" "$model" "$isas" <<'EOF'
import json, statistics, sys, os
rows = [json.loads(l) for l in open(sys.argv[1])]
model = sys.argv[2]
stratas = [f"strata-{i}" for i in sys.argv[3].split()] or ["strata"]
engines = stratas + ["llama.cpp"]
tests = sorted({r["test"] for r in rows if "test" in r}, key=lambda t: (t[:2] != "pp", t))
def stats(engine, test):
    by_threads = {}
    for r in rows:
        if r.get("engine") == engine and r.get("test") == test:
            by_threads.setdefault(r["threads"], []).extend(r["samples"])
    best = None
    for t, s in sorted(by_threads.items()):
        mean = statistics.mean(s); sd = statistics.stdev(s) if len(s) > 1 else 0.0
        if best is None or mean > best[1]: best = (t, mean, sd, len(s))
    return best, by_threads
print(f"model: {model} ({os.path.getsize(model) / 2**20:.1f} MiB)")
print()
print("| test | engine | strata t/s | threads | llama.cpp t/s | threads | strata / llama.cpp |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for test in tests:
    (lt, lm, ls, _), _ = stats("llama.cpp", test)
    for engine in stratas:
        (st, sm, ss, _), _ = stats(engine, test)
        print(f"| {test} | {engine} | {sm:.2f} ± {ss:.2f} | {st} | {lm:.2f} ± {ls:.2f} | {lt} | {sm / lm:.3f} |")
print()
print("every thread count (mean ± sd over the rounds):")
for test in tests:
    for engine in engines:
        _, by = stats(engine, test)
        cells = ", ".join(f"{t} thr {statistics.mean(s):.2f} ± {statistics.stdev(s) if len(s) > 1 else 0:.2f}"
                          for t, s in sorted(by.items()))
        print(f"  {test} {engine}: {cells}")
print()
for engine in engines:
    rss = {}
    for r in rows:
        if r.get("engine") == engine and "peak_rss_bytes" in r:
            rss[r["threads"]] = max(rss.get(r["threads"], 0), r["peak_rss_bytes"])
    print(f"peak RSS {engine}: " + ", ".join(f"{t} thr {b / 2**20:.0f} MiB" for t, b in sorted(rss.items())))
EOF
