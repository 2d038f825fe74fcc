#!/usr/bin/env bash
# Run on the Debian dev machine, from anywhere: fills build-deps/ (ignored by git through /build*/) with what the CUDA
# test build needs and the GPU machine lacks: GoogleTest's headers, static libraries (gtest and gmock) and CMake
# package files (from libgtest-dev). Carry it to the GPU machine with the device tool's `carry: ["build-deps"]`; scripts/gpu.sh uses it.
# The CUDA test build (-DSTRATA_CUDA_ONLY_TESTS=ON) needs nothing else: core and backend_cpu use only the C++ library.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-deps
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

files=$(dpkg -L libgtest-dev)
need() {  # the one path of the package's file list that ends with $1
    local hit
    hit=$(grep -E "$1\$" <<<"$files" | head -n1)
    [[ -n "$hit" && -e "$hit" ]] || { echo "gpu_deps.sh: libgtest-dev has no file matching $1 (apt-get install libgtest-dev)" >&2; exit 2; }
    echo "$hit"
}
gtest_include=$(need "/include/gtest")
libgtest=$(need "/libgtest.a")
libgtest_main=$(need "/libgtest_main.a")
gtest_cmake=$(dirname "$(need "/cmake/GTest/GTestConfig.cmake")")

rm -rf "$out"
mkdir -p "$out/include" "$out/lib/$arch/cmake"
cp -r "$gtest_include" "$out/include/"
cp "$libgtest" "$libgtest_main" "$out/lib/$arch/"
# GTestConfig.cmake also loads GMock's targets, which insist that their libraries exist (libgmock-dev, beside gtest).
libdir=$(dirname "$libgtest")
for lib in libgmock.a libgmock_main.a; do
    [[ -e "$libdir/$lib" ]] || { echo "gpu_deps.sh: $libdir/$lib missing (apt-get install libgmock-dev)" >&2; exit 2; }
    cp "$libdir/$lib" "$out/lib/$arch/"
done
# GTest's package files locate the headers and libraries relative to themselves (four levels up), so the layout
# lib/<arch>/cmake/GTest must be kept.
cp -r "$gtest_cmake" "$out/lib/$arch/cmake/"
echo "gpu_deps.sh: $(du -sh "$out" | cut -f1) in $out (GoogleTest $(dpkg-query -W -f='${Version}' libgtest-dev))"
