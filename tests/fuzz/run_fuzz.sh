#!/usr/bin/env bash
# Builds the libFuzzer targets in a separate clang build dir and fuzzes for SECONDS in total (split evenly between
# the targets). Usage: tests/fuzz/run_fuzz.sh SECONDS [fuzz_gguf] [fuzz_safetensors] [fuzz_jinja] [fuzz_token_constraint]
# The seed corpus (tests/fuzz/corpus/TARGET) is copied into the build dir, so new inputs never land in the repo.
# A crash leaves its input in BUILD/artifacts/TARGET/ and makes the script exit non-zero.
# Env: STRATA_FUZZ_BUILD (build dir, default build-fuzz), STRATA_FUZZ_JOBS (parallel jobs per target, default 1).
set -euo pipefail

seconds=${1:?usage: run_fuzz.sh SECONDS [fuzz_gguf] [fuzz_safetensors] [fuzz_jinja]}
shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(fuzz_gguf fuzz_safetensors fuzz_jinja fuzz_token_constraint); fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${STRATA_FUZZ_BUILD:-$src/build-fuzz}
jobs=${STRATA_FUZZ_JOBS:-1}

mkdir -p "$build"
CC=clang CXX=clang++ cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTRATA_FUZZ=ON -DSTRATA_TESTS=OFF > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
ninja -C "$build" "${targets[@]}"

per_target=$(( seconds / ${#targets[@]} ))
if [ "$per_target" -lt 1 ]; then per_target=1; fi
status=0
failed=()
for t in "${targets[@]}"; do
    corpus="$build/corpus/$t"
    artifacts="$build/artifacts/$t"
    mkdir -p "$corpus" "$artifacts"
    cp -n "$here/corpus/$t/"* "$corpus/" 2>/dev/null || true
    dict="$here/${t#fuzz_}.dict"
    echo "== $t: ${per_target}s"
    parallel=()
    if [ "$jobs" -gt 1 ]; then parallel=(-fork="$jobs"); fi
    log="$build/logs/$t.log"
    mkdir -p "$build/logs"
    if ! "$build/tests/fuzz/$t" "$corpus" -dict="$dict" -max_total_time="$per_target" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/" "${parallel[@]}" 2>&1 | tee "$log"; then
        failed+=("$t")
        status=1
    fi
done
# The end of the output is what a CI log keeps: say there which target failed, why, and with what input.
for t in "${failed[@]}"; do
    echo "== $t FAILED; its report without the progress lines:"
    grep -v -E '^#[0-9]+|^\s*"|Uses: [0-9]+|NEW_FUNC' "$build/logs/$t.log" | tail -n 60
    for f in "$build/artifacts/$t"/*; do
        [ -f "$f" ] || continue
        echo "== input $f ($(stat -c %s "$f") bytes), base64 of the first 2 KB:"
        head -c 2048 "$f" | base64
    done
done
exit $status
