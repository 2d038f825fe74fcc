#!/usr/bin/env bash
# Run on the Debian dev machine, from anywhere: fills build-deps/ (ignored by git through /build*/) with what the GPU
# machine lacks for the CUDA build (it has CMake, ninja, nvcc, g++ and Python, but no package registry, no pkg-config
# and none of these packages), and packs it into build-deps.txz (0.7 MB against 4.2: what travels to the GPU machine
# counts against a size limit). Carry either there (`carry: ["build-deps.txz"]`); scripts/gpu.sh unpacks the archive
# when build-deps/ is missing.
#   include/, lib/<arch>/ (libgtest*.a, libgmock*.a), lib/<arch>/cmake/GTest   GoogleTest (libgtest-dev, libgmock-dev):
#                                               the CUDA op tests (-DSTRATA_CUDA_ONLY_TESTS=ON) need only this
#   include/pcre2.h, lib/libpcre2-8.a           PCRE2 (libpcre2-dev), static
#   include/utf8proc.h, lib/libutf8proc.a       utf8proc (libutf8proc-dev), static
#   include/nlohmann/, share/cmake/nlohmann_json  nlohmann_json (nlohmann-json3-dev), header-only, CMake package
#   include/httplib.h                           cpp-httplib, header-only: see below
#   include/liburing.h, include/liburing/, lib/liburing.a
#                                               liburing (liburing-dev), static: the PLE row reader's io_uring reads
#                                               (optional in the build: without it the reader uses pread)
#   lib/pkgconfig/*.pc                          for pkg-config users; prefixes relative to ${pcfiledir}
# The full build takes them with -DSTRATA_DEPS_PREFIX=<absolute path of build-deps> (CMakeLists.txt), pkg-config not
# needed. Debian's libcpp-httplib-dev is the split build (a declarations-only httplib.h and a shared library that needs
# OpenSSL, zlib and brotli), so the GPU machine gets the original single header-only httplib.h of the same Debian
# source package (Debian's patches applied; fetched once from deb.debian.org into build-deps-src/, checked against a
# pinned hash, and checked to split into exactly the installed httplib.h), compiled without TLS or compression.
# STRATA_HTTPLIB_H=<path of a header-only httplib.h> skips the download.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-deps
cache=build-deps-src
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
mirror=${STRATA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# sha256 of the Debian source package's .dsc (which holds its tarballs' hashes), by source version.
declare -A httplib_dsc_sha256=(
    [0.11.4+ds-1+deb12u1]=a4dde747bbde7cc9fa62cdf50d61140a0eaefb7f1383497ef2d48daf3bf5f9ec
)

die() { echo "gpu_deps.sh: $*" >&2; exit 2; }
file_of() {  # the one path of package $1's file list that ends with $2
    local hit
    hit=$(dpkg -L "$1" 2>/dev/null | grep -E "$2\$" | head -n1 || true)
    [[ -n "$hit" && -e "$hit" ]] || die "$1 has no file matching $2 (apt-get install $1)"
    echo "$hit"
}
version_of() { dpkg-query -W -f='${Version}' "$1"; }

# The whole folder is made aside and swapped in at the end, so a half-made one is never carried.
stage=$(mktemp -d "$out.new.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/include" "$stage/lib/$arch/cmake" "$stage/lib/pkgconfig" "$stage/share/cmake"

# ---- GoogleTest ----
gtest_include=$(file_of libgtest-dev "/include/gtest")
libgtest=$(file_of libgtest-dev "/libgtest.a")
libgtest_main=$(file_of libgtest-dev "/libgtest_main.a")
gtest_cmake=$(dirname "$(file_of libgtest-dev "/cmake/GTest/GTestConfig.cmake")")
cp -r "$gtest_include" "$stage/include/"
cp "$libgtest" "$libgtest_main" "$stage/lib/$arch/"
# GTestConfig.cmake also loads GMock's targets, which insist that their libraries exist (libgmock-dev, beside gtest).
libdir=$(dirname "$libgtest")
for lib in libgmock.a libgmock_main.a; do
    [[ -e "$libdir/$lib" ]] || die "$libdir/$lib missing (apt-get install libgmock-dev)"
    cp "$libdir/$lib" "$stage/lib/$arch/"
done
# GTest's package files locate the headers and libraries relative to themselves (four levels up), so the layout
# lib/<arch>/cmake/GTest must be kept.
cp -r "$gtest_cmake" "$stage/lib/$arch/cmake/"

# ---- PCRE2 and utf8proc: static libraries, headers, and their .pc files moved to build-deps ----
relocate_pc() {  # copy .pc file $1 into the stage with its prefix and libdir pointing into the folder
    sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^exec_prefix=.*|exec_prefix=${prefix}|' \
        -e 's|^libdir=.*|libdir=${prefix}/lib|' -e 's|^includedir=.*|includedir=${prefix}/include|' \
        -e 's|-I/usr/include$|-I${pcfiledir}/../../include|' "$1" >"$stage/lib/pkgconfig/$(basename "$1")"
}
for wanted in libpcre2-dev:/include/pcre2.h:include libpcre2-dev:/libpcre2-8.a:lib \
    libutf8proc-dev:/include/utf8proc.h:include libutf8proc-dev:/libutf8proc.a:lib; do
    IFS=: read -r package suffix into <<<"$wanted"
    path=$(file_of "$package" "$suffix")
    cp "$path" "$stage/$into/"
done
pc=$(file_of libpcre2-dev /pkgconfig/libpcre2-8.pc) && relocate_pc "$pc"
pc=$(file_of libutf8proc-dev /pkgconfig/libutf8proc.pc) && relocate_pc "$pc"

# ---- liburing: static library and headers (liburing.h includes liburing/*.h) ----
cp "$(file_of liburing-dev /include/liburing.h)" "$stage/include/"
cp -r "$(file_of liburing-dev /include/liburing)" "$stage/include/"
cp "$(file_of liburing-dev /liburing.a)" "$stage/lib/"
pc=$(file_of liburing-dev /pkgconfig/liburing.pc) && relocate_pc "$pc"

# ---- nlohmann_json: headers and CMake package files (which find the headers three levels up from themselves) ----
json_include=$(file_of nlohmann-json3-dev /include/nlohmann)
json_cmake=$(file_of nlohmann-json3-dev /cmake/nlohmann_json)
cp -r "$json_include" "$stage/include/"
cp -r "$json_cmake" "$stage/share/cmake/"
pc=$(file_of nlohmann-json3-dev /pkgconfig/nlohmann_json.pc) && relocate_pc "$pc"

# ---- cpp-httplib, header-only ----
httplib_source=$(dpkg-query -W -f='${source:Package}' libcpp-httplib-dev)
httplib_version=$(dpkg-query -W -f='${source:Version}' libcpp-httplib-dev)
httplib_h=${STRATA_HTTPLIB_H:-$cache/$httplib_source-$httplib_version/httplib.h}
if [[ ! -e "$httplib_h" ]]; then
    [[ -z "${STRATA_HTTPLIB_H:-}" ]] || die "STRATA_HTTPLIB_H=$STRATA_HTTPLIB_H does not exist"
    pinned=${httplib_dsc_sha256[$httplib_version]:-}
    [[ -n "$pinned" ]] || die "no pinned hash for $httplib_source $httplib_version: check its .dsc and add its sha256" \
        "to httplib_dsc_sha256 in this script, or set STRATA_HTTPLIB_H"
    work=$(mktemp -d)
    trap 'rm -rf "$stage" "$work"' EXIT
    dsc=${httplib_source}_$httplib_version.dsc
    pool=$mirror/pool/main/${httplib_source:0:1}/$httplib_source
    echo "gpu_deps.sh: fetching $httplib_source $httplib_version's source from $pool"
    curl -fsS -o "$work/$dsc" "$pool/$dsc" ||
        die "cannot fetch $pool/$dsc (set STRATA_DEBIAN_MIRROR or STRATA_HTTPLIB_H)"
    echo "$pinned  $work/$dsc" | sha256sum --quiet -c - || die "$dsc does not have the pinned sha256"
    for tarball in $(awk '/^Files:/ {f = 1; next} /^[^ ]/ {f = 0} f {print $3}' "$work/$dsc"); do
        curl -fsS -o "$work/$tarball" "$pool/$tarball" || die "cannot fetch $pool/$tarball"
    done
    # dpkg-source checks the tarballs against the .dsc's hashes and applies Debian's patches. (It also warns that it
    # cannot check the .dsc's signature without Debian's keyring: the pinned hash above stands in for it.)
    (cd "$work" && dpkg-source --no-copy -x "$dsc" src >dpkg-source.log 2>&1) ||
        { cat "$work/dpkg-source.log" >&2; die "dpkg-source could not unpack $dsc"; }
    # The same library as the installed package: its split header is exactly /usr/include/httplib.h.
    (cd "$work" && python3 src/split.py -o split >/dev/null) || die "split.py failed on $httplib_source's httplib.h"
    installed_h=$(file_of libcpp-httplib-dev /include/httplib.h)
    cmp -s "$work/split/httplib.h" "$installed_h" ||
        die "$httplib_source $httplib_version's httplib.h does not split into the installed one"
    mkdir -p "$(dirname "$httplib_h")"
    cp "$work/src/httplib.h" "$work/src/LICENSE" "$(dirname "$httplib_h")/"
fi
grep -q 'inline void Server::stop()' "$httplib_h" || die "$httplib_h is not the header-only httplib.h"
cp "$httplib_h" "$stage/include/httplib.h"
cat >"$stage/lib/pkgconfig/cpp-httplib.pc" <<EOF
prefix=\${pcfiledir}/../..
includedir=\${prefix}/include

Name: cpp-httplib
Description: A C++ HTTP server and client library (header-only; no TLS, no compression)
Version: ${httplib_version%%+*}
Libs: -pthread
Cflags: -I\${includedir}
EOF

rm -rf "$out"
mv "$stage" "$out"
trap - EXIT
[[ -z "${work:-}" ]] || rm -rf "$work"
tar cJf build-deps.txz "$out"
echo "gpu_deps.sh: $(du -sh "$out" | cut -f1) in $out: GoogleTest $(version_of libgtest-dev), PCRE2" \
    "$(version_of libpcre2-dev), utf8proc $(version_of libutf8proc-dev), nlohmann_json" \
    "$(version_of nlohmann-json3-dev), cpp-httplib $httplib_version (header-only), liburing $(version_of liburing-dev)"
