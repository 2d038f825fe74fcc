#!/usr/bin/env bash
# Builds `strata` with CUDA on this machine (nvcc compiles without a GPU) and packs it, stripped, with the shared
# libraries it links that a bare GPU machine may lack, so a device call can run benchmarks at once instead of
# building for ~4 minutes first (carry the archive; it is ~14 MB). On the GPU machine:
#   mkdir -p /tmp/sb && tar -C /tmp/sb -xJf strata-bin.txz
#   LD_LIBRARY_PATH=/tmp/sb/lib /tmp/sb/strata bench --backend cuda ...
# The C library and the CUDA libraries come from the GPU machine (the driver's CUDA must be this nvcc's major
# version or newer); the build is for CMAKE_CUDA_ARCHITECTURES (default 90: the H100 and H200).
#   scripts/pack_cuda_binary.sh OUT.txz [BUILD_DIR]   (BUILD_DIR default build-cuda-pack)
set -euo pipefail
out=$(realpath -m "${1:?usage: scripts/pack_cuda_binary.sh OUT.txz [BUILD_DIR]}")
cd "$(dirname "$0")/.."
build=${2:-build-cuda-pack}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${STRATA_CUDA_ARCH:-90}" >/dev/null
ninja -C "$build" strata
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
cp "$build/strata" "$stage/strata"
strip "$stage/strata"
# Every shared library but the C runtime's own and CUDA's.
ldd "$build/strata" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
        libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcu*) ;;
        *) cp -L "$lib" "$stage/lib/" ;;
    esac
done
tar -C "$stage" -cf - . | xz -T0 -6 >"$out"
echo "$out: $(du -h "$out" | cut -f1) (strata and $(find "$stage/lib" -type f | wc -l) libraries)"
