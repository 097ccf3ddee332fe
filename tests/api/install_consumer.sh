#!/bin/sh
# Install OrbiTE from a build tree into a scratch prefix, check the installed files, then build
# and run a small consumer both through pkg-config and through find_package(orbite).
#   usage: install_consumer.sh CMAKE BUILD_DIR WORK_DIR CONSUMER_SRC C_COMPILER GENERATOR [SANITIZE]
set -eu

if [ "$#" -lt 6 ]; then
    echo "usage: $0 CMAKE BUILD_DIR WORK_DIR CONSUMER_SRC C_COMPILER GENERATOR [SANITIZE]" >&2
    exit 2
fi
cmake=$1
build=$2
work=$3
consumer=$4
cc=$5
generator=$6
sanitize=${7:-}

case "$sanitize" in
    "") san_flags="" ;;
    address) san_flags="-fsanitize=address,undefined" ;;
    thread) san_flags="-fsanitize=thread" ;;
    *) echo "FAIL: unknown sanitizer '$sanitize'" >&2; exit 2 ;;
esac

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

for component in orbite_runtime orbite_development; do
    "$cmake" --install "$build" --prefix "$prefix" --component "$component" >"$work/install.log" \
        || { cat "$work/install.log" >&2; fail "cmake --install ($component)"; }
done

# The library directory is whatever GNUInstallDirs chose (lib, lib64 or lib/<multiarch>).
pc=$(find "$prefix" -name orbite.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "orbite.pc was not installed"
libdir=$(dirname "$(dirname "$pc")")

[ -f "$prefix/include/orbite/orbite.h" ] || fail "include/orbite/orbite.h was not installed"
[ -f "$libdir/liborbite.a" ] || fail "liborbite.a was not installed"
[ -L "$libdir/liborbite.so" ] || fail "liborbite.so (development link) is not a symlink"
soname=$(readlink "$libdir/liborbite.so")
[ -L "$libdir/$soname" ] || fail "SONAME link $soname is missing"
real=$(readlink "$libdir/$soname")
[ -f "$libdir/$real" ] && [ ! -L "$libdir/$real" ] || fail "library file $real is missing"
readelf -d "$libdir/$real" | grep -q "SONAME.*\[$soname\]" || fail "$real does not carry SONAME $soname"
for f in orbiteConfig.cmake orbiteConfigVersion.cmake orbiteTargets.cmake; do
    [ -f "$libdir/cmake/orbite/$f" ] || fail "cmake/orbite/$f was not installed"
done

# --- pkg-config -----------------------------------------------------------------------------
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists orbite || fail "pkg-config does not find orbite"
version=$(pkg-config --modversion orbite)
[ "$(pkg-config --variable=libdir orbite)" -ef "$libdir" ] || fail "pkg-config libdir is not $libdir"

# shellcheck disable=SC2046,SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $san_flags $(pkg-config --cflags orbite) \
    "$consumer/main.c" -o "$work/pc_shared" $(pkg-config --libs orbite) \
    || fail "pkg-config shared consumer does not build"
readelf -d "$work/pc_shared" | grep -q "NEEDED.*\[$soname\]" || fail "pc_shared does not need $soname"
LD_LIBRARY_PATH="$libdir" "$work/pc_shared" || fail "pkg-config shared consumer failed"

# Static: the archive by path, then the private dependencies pkg-config lists.
static_libs=$(pkg-config --static --libs orbite | sed "s|-lorbite\\b|$libdir/liborbite.a|")
# shellcheck disable=SC2046,SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $san_flags $(pkg-config --cflags orbite) \
    "$consumer/main.c" -o "$work/pc_static" $static_libs \
    || fail "pkg-config static consumer does not build"
if readelf -d "$work/pc_static" | grep -q "NEEDED.*liborbite"; then
    fail "pc_static depends on the shared library"
fi
"$work/pc_static" || fail "pkg-config static consumer failed"

# --- find_package(orbite) -------------------------------------------------------------------
"$cmake" -S "$consumer" -B "$work/cmake-consumer" -G "$generator" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS="$san_flags" -DCMAKE_EXE_LINKER_FLAGS="$san_flags" \
    >"$work/consumer-configure.log" 2>&1 \
    || { cat "$work/consumer-configure.log" >&2; fail "find_package(orbite) consumer does not configure"; }
"$cmake" --build "$work/cmake-consumer" >"$work/consumer-build.log" 2>&1 \
    || { cat "$work/consumer-build.log" >&2; fail "find_package(orbite) consumer does not build"; }
"$work/cmake-consumer/consumer_shared" || fail "find_package shared consumer failed"
"$work/cmake-consumer/consumer_static" || fail "find_package static consumer failed"
if readelf -d "$work/cmake-consumer/consumer_static" | grep -q "NEEDED.*liborbite"; then
    fail "consumer_static depends on the shared library"
fi

# The version file refuses an incompatible request.
mkdir -p "$work/version-probe"
cat >"$work/version-probe/CMakeLists.txt" <<'PROBE'
cmake_minimum_required(VERSION 3.16)
project(probe NONE)
find_package(orbite 99.0 CONFIG QUIET)
if(orbite_FOUND)
  message(FATAL_ERROR "orbite 99.0 was accepted")
endif()
PROBE
"$cmake" -S "$work/version-probe" -B "$work/version-probe/build" -DCMAKE_PREFIX_PATH="$prefix" \
    >"$work/version-probe.log" 2>&1 \
    || { cat "$work/version-probe.log" >&2; fail "version file accepted an incompatible version"; }

echo "OK: orbite $version installed to $prefix; pkg-config and find_package consumers build and run"
