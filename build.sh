#!/bin/bash
# Build, test and benchmark OrbiTE.
#
#   ./build.sh bench   install missing build packages, build build/ (Release), run orbite-bench
#                      with its default settings
#   ./build.sh test    install missing build packages, then build and run the test suite five
#                      times: default (build/), Release (build-release/), Clang (build-clang/),
#                      ASan+UBSan (build-asan/), TSan (build-tsan/); after the default one, the
#                      tests that need a verbs device run from build/ inside one soft-RoCE VM
#                      (tests/vm/vm-run.sh)
#
# Package installation uses apt-get and needs root (or sudo); a machine that already has every
# package runs no apt command at all.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$ROOT"

PACKAGES=(cmake gcc g++ clang make pkg-config libjansson-dev libinih-dev libcmocka-dev libibverbs-dev
          libcap-dev libseccomp-dev selinux-policy-dev
          python3-dev python3-setuptools python3-pip python3-pytest python3-numpy
          libmicrohttpd-dev pandoc libcurl4-openssl-dev etcd-server)
# The soft-RoCE VM of the test run (tests/vm/vm-run.sh): qemu, a static busybox for its
# initramfs, the module tools, the rxe provider and iproute2's rdma tool used inside it.
VM_PACKAGES=(qemu-system-x86 busybox-static cpio gzip kmod iproute2 ibverbs-providers)
JOBS=${ORBITE_JOBS:-$(nproc 2>/dev/null || echo 2)}
CTEST_JOBS=${ORBITE_CTEST_JOBS:-2}

log() { echo "[build.sh] $*"; }
die() { echo "[build.sh] error: $*" >&2; exit 1; }

usage() {
    cat <<EOF
usage: $0 <command>

commands:
  bench   build in Release (build/) and run orbite-bench with its defaults
  test    build and run ctest: default (build/), Release, Clang, ASan+UBSan, TSan, and the
          rdma-device tests of build/ inside one soft-RoCE VM (tests/vm/vm-run.sh)

Missing Debian packages are installed first:
  ${PACKAGES[*]}
EOF
}

# Install whichever of PACKAGES (and the arguments) dpkg does not report as installed.
install_packages() {
    if ! command -v dpkg-query >/dev/null 2>&1; then
        log "dpkg-query not found (not a Debian system): assuming the build packages are present"
        return 0
    fi
    local missing=() pkg
    for pkg in "${PACKAGES[@]}" "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "missing packages (${missing[*]}) and not root: run as root"
        sudo=(sudo)
    fi
    log "installing: ${missing[*]}"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}"
}

# configure_and_build DIR [cmake args...]
configure_and_build() {
    local dir=$1
    shift
    cmake -S "$ROOT" -B "$ROOT/$dir" "$@" && cmake --build "$ROOT/$dir" -j "$JOBS"
}

# run_variant NAME DIR [cmake args...]: build and ctest one variant, print its summary line.
run_variant() {
    local name=$1 dir=$2
    shift 2
    local start=$SECONDS
    log "=== $name: building in $dir/"
    if ! configure_and_build "$dir" "$@"; then
        log "SUMMARY $name: FAILED (build) after $((SECONDS - start)) s"
        return 1
    fi
    log "=== $name: testing"
    local out="$ROOT/$dir/ctest-summary.log"
    if ! (cd "$ROOT/$dir" && ctest --output-on-failure -j "$CTEST_JOBS") 2>&1 | tee "$out"; then
        log "SUMMARY $name: FAILED ($(grep -m1 'tests passed' "$out" || echo 'ctest failed')) after $((SECONDS - start)) s"
        return 1
    fi
    log "SUMMARY $name: PASSED ($(grep -m1 'tests passed' "$out" || echo 'no tests')) in $((SECONDS - start)) s"
}

cmd_bench() {
    install_packages
    configure_and_build build -DCMAKE_BUILD_TYPE=Release
    # tools/orbite-bench/tool.cmake is included into tools/, so the binary lands in build/tools/;
    # a per-tool output directory would put it one level deeper.
    local bench="" candidate
    for candidate in "$ROOT/build/tools/orbite-bench/orbite-bench" "$ROOT/build/tools/orbite-bench"; do
        if [ -f "$candidate" ] && [ -x "$candidate" ]; then
            bench=$candidate
            break
        fi
    done
    [ -n "$bench" ] || die "orbite-bench was not built (looked in build/tools/)"
    log "running $bench"
    "$bench"
}

# The tests labelled rdma-device, from build/, inside one soft-RoCE VM boot (two "hosts", two
# rails: four rxe devices). A machine where the VM cannot run at all (no qemu, no kernel to be
# had) skips them and says why. A failed test runs once more in the same boot and fails the step
# only if it fails again: soft-RoCE (Linux 6.1 at least; the VM boots 6.12 where it can) sometimes
# stops a queue pair under load (docs/operations.md, known limitations); both attempts stay in
# build/vm.log. Two tests run at a time, but never two that load the VM's CPUs (their ctest
# resource locks: tests/rdma/tests.cmake).
run_vm_tests() {
    local start=$SECONDS rc=0
    log "=== rdma-vm: the rdma-device tests of build/ on soft-RoCE (one VM boot)"
    set +e
    "$ROOT/tests/vm/vm-run.sh" --topology rails --timeout 1200 -- \
        ctest --test-dir build -L rdma-device -j2 --output-on-failure --no-tests=error --repeat until-pass:2 2>&1 |
        tee "$ROOT/build/vm.log"
    rc=${PIPESTATUS[0]}
    set -e
    case $rc in
        0) log "SUMMARY rdma-vm: PASSED ($(grep -m1 'tests passed' "$ROOT/build/vm.log" | sed 's/\x1b\[[0-9;]*m//g' || echo 'no tests'); $(sed 's/\x1b\[[0-9;]*m//g' "$ROOT/build/vm.log" | grep -cE 'Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception)') failed attempt(s) passed on the second) in $((SECONDS - start)) s" ;;
        77) log "SUMMARY rdma-vm: SKIPPED ($(grep -m1 'SKIP' "$ROOT/build/vm.log" || echo 'the VM cannot run here'))" ;;
        *) log "SUMMARY rdma-vm: FAILED (status $rc) after $((SECONDS - start)) s"; return 1 ;;
    esac
}

cmd_test() {
    install_packages "${VM_PACKAGES[@]}"
    # Sanitizer reports must fail the run rather than scroll by.
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
    run_variant default build
    run_vm_tests
    # The bench builds Release: -O3 inlining finds warnings -O2 does not, so it is tested too.
    run_variant release build-release -DCMAKE_BUILD_TYPE=Release
    # The second supported compiler.
    CC=clang run_variant clang build-clang
    run_variant asan build-asan -DORBITE_SANITIZE=address
    run_variant tsan build-tsan -DORBITE_SANITIZE=thread
    log "all variants passed"
}

case "${1:-}" in
    bench) cmd_bench ;;
    test) cmd_test ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
esac
