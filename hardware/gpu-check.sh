#!/bin/bash
# OrbiTE on a real NVIDIA GPU, from a bare machine:
#
#   hardware/gpu-check.sh [OUTPUT_DIR]
#
# Builds the tree (Release, in build-gpu/) against the machine's own driver (libcuda.so.1 is
# loaded at run time: no CUDA toolkit is used), then runs, each under its own time limit:
#   1. the CUDA tests on the real driver, the cells that need the stand-in's controls skipped: the
#      loader, memory owners and producer readiness (tests/cuda/test_cuda_loader, test_cuda_memory,
#      test_cuda_ready), then the engine tests (tests/cuda/test_cuda_tcp, tests/nvlink/test_nvlink:
#      TCP with device memory, and CUDA IPC in one process and between two);
#   2. the cuda_copy example (eight callers, four rounds, three unaligned sizes), and what
#      GPUDirect registration would find (tests/cuda/gdr_probe: dma-buf support, two exports
#      checked against the registered geometry, the peer-memory probe of the real /sys);
#   3. the driver's own rates: cuMemcpyDtoH, cuMemcpyHtoD (pinned host memory) and cuMemcpyDtoD;
#   4. orbite-bench between two processes: over loopback TCP with host memory on both sides, then
#      device memory on both sides (GPU -> GPU), then by CUDA IPC (one GPU), every cell verified;
# and prints one table of GB/s, also written to OUTPUT_DIR/gpu-check.txt (and the raw outputs
# beside it) when OUTPUT_DIR is given. Exits 77 without an NVIDIA GPU and its driver, 1 when a
# step fails, 0 otherwise.
#
# The build needs cmake, a C compiler, pkg-config and the development files of jansson, inih,
# cmocka, libcap, libseccomp and libibverbs (headers only). Where the machine has none of them
# and no network, run hardware/gpu-deps.sh on a Debian 12 machine first: it puts the .deb files
# in hardware/gpu-deps/, which this script unpacks under /tmp and builds against.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-}
BUILD=$ROOT/build-gpu
DEPS=$ROOT/hardware/gpu-deps
START=$SECONDS

say() { echo "gpu-check: $*" >&2; }

# ---- a GPU and its driver, or skip --------------------------------------------------------------
if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
    echo "gpu-check: skipped: no NVIDIA GPU here (/dev/nvidia0 is absent)"
    exit 77
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    found=
    for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/lib/wsl/lib; do
        [[ -e $d/libcuda.so.1 ]] && found=$d
    done
    if [[ -z $found ]]; then
        echo "gpu-check: skipped: the NVIDIA driver's libcuda.so.1 is not installed"
        exit 77
    fi
    export LD_LIBRARY_PATH=$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[[ -n $OUT ]] && mkdir -p "$OUT"

# ---- build dependencies: the system's, else the carried .deb files --------------------------------
have_deps() {
    command -v pkg-config >/dev/null && pkg-config --exists jansson inih cmocka libcap libseccomp &&
        [[ -e /usr/include/infiniband/verbs.h ]]
}
if ! have_deps; then
    if ! compgen -G "$DEPS/*.deb" >/dev/null; then
        say "missing build dependencies and no $DEPS/*.deb (run hardware/gpu-deps.sh where apt works)"
        exit 1
    fi
    SYSROOT=/tmp/orbite-gpu-deps
    rm -rf "$SYSROOT" && mkdir -p "$SYSROOT"
    for deb in "$DEPS"/*.deb; do dpkg -x "$deb" "$SYSROOT" || { say "cannot unpack $deb"; exit 1; }; done
    export PATH=$SYSROOT/usr/bin:$PATH
    export PKG_CONFIG_SYSROOT_DIR=$SYSROOT
    export PKG_CONFIG_LIBDIR=$SYSROOT/usr/lib/x86_64-linux-gnu/pkgconfig:$SYSROOT/usr/share/pkgconfig
    export LD_LIBRARY_PATH=$SYSROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CPATH=$SYSROOT/usr/include${CPATH:+:$CPATH}
    export LIBRARY_PATH=$SYSROOT/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    have_deps || [[ -e $SYSROOT/usr/include/infiniband/verbs.h ]] || { say "the carried packages do not provide the build's dependencies"; exit 1; }
fi

command -v python3 >/dev/null 2>&1 ||
    say "no python3 here: every step runs, but the table cannot read orbite-bench's JSON and shows - for it"

# ---- build --------------------------------------------------------------------------------------
say "building in $BUILD"
jobs=$(nproc 2>/dev/null || echo 4)
targets=(test_cuda_loader test_cuda_memory test_cuda_ready test_cuda_tcp test_nvlink example_cuda_copy cuda_rates gdr_probe
         orbite-bench)
if ! timeout 300 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DORBITE_WERROR=OFF >"$BUILD.configure.log" 2>&1 ||
   ! timeout 300 cmake --build "$BUILD" -j "$jobs" --target "${targets[@]}" >"$BUILD.build.log" 2>&1; then
    say "the build failed:"
    tail -40 "$BUILD.configure.log" "$BUILD.build.log" >&2
    exit 1
fi
say "built in $((SECONDS - START)) s"

failed=0
step() { # NAME LIMIT_S COMMAND...: run, keep its output, report
    local name=$1 limit=$2
    shift 2
    local log=${OUT:-/tmp}/gpu-check-$name.log
    local t0=$SECONDS
    timeout "$limit" "$@" >"$log" 2>&1
    local rc=$?
    if [[ $rc -eq 0 ]]; then
        say "$name: passed in $((SECONDS - t0)) s"
    else
        say "$name: FAILED (status $rc) after $((SECONDS - t0)) s; the end of its output:"
        tail -30 "$log" >&2
        failed=1
    fi
    return $rc
}

step cuda-loader 60 env ORBITE_CUDA_DRIVER=real "$BUILD/tests/test_cuda_loader"
step cuda-memory 60 env ORBITE_CUDA_DRIVER=real "$BUILD/tests/test_cuda_memory"
step cuda-ready 60 env ORBITE_CUDA_DRIVER=real "$BUILD/tests/test_cuda_ready"
step cuda-tests 180 env ORBITE_CUDA_DRIVER=real "$BUILD/tests/test_cuda_tcp"
step ipc-tests 120 env ORBITE_CUDA_DRIVER=real "$BUILD/tests/test_nvlink"
step cuda-copy 120 "$BUILD/examples/example_cuda_copy" 0 0
gdr=
step gdr-probe 60 "$BUILD/tests/gdr_probe" 0 && gdr=$(tail -1 "${OUT:-/tmp}/gpu-check-gdr-probe.log")
rates=
step cuda-rates 60 "$BUILD/tests/cuda_rates" 0 64 && rates=$(cat "${OUT:-/tmp}/gpu-check-cuda-rates.log")
bench_args=(--duration 2 --warmup 0.5 --block-size 4M,64M --batch 4 --depth 2 --buffer-size 1G --json --quiet --no-progress)
step tcp-host 120 "$BUILD/tools/orbite-bench" "${bench_args[@]}"
step tcp-cuda 120 "$BUILD/tools/orbite-bench" "${bench_args[@]}" --memory cuda:0
step ipc-cuda 120 "$BUILD/tools/orbite-bench" "${bench_args[@]}" --memory cuda:0 --transport nvlink

# ---- the table ----------------------------------------------------------------------------------
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$rates"; }
# GB/s of one (op, block) cell of a bench run's JSON.
cell() { # LOG OP BLOCK_BYTES
    python3 - "$@" <<'PY' 2>/dev/null || echo "-"
import json, sys
log, op, block = sys.argv[1], sys.argv[2].lower(), int(sys.argv[3])
lines = [l for l in open(log).read().splitlines() if l.startswith("{")]
doc = json.loads(lines[-1])
for r in doc["results"]:
    if r["op"] == op and r["block_size"] == block and r["ran"] and r["verified"] is True:
        print("%.2f" % r["gbps"])
        break
else:
    print("-")
PY
}
L=${OUT:-/tmp}
ratio() { python3 -c "import sys; a, b = sys.argv[1], sys.argv[2]; print('%.2f' % (float(a) / float(b)) if a != '-' and b not in ('-', '0', '0.00') else '-')" "$1" "$2" 2>/dev/null || echo "-"; }
{
    echo "| what | GB/s | ratio |"
    echo "| --- | ---: | ---: |"
    echo "| cuMemcpyDtoH, 64 MiB, pinned host | $(field d2h_gbps) | |"
    echo "| cuMemcpyHtoD, 64 MiB, pinned host | $(field h2d_gbps) | |"
    echo "| cuMemcpyDtoD, 64 MiB | $(field d2d_gbps) | |"
    echo "| GPUDirect facts (gdr_probe) | ${gdr:-not run} | |"
    for op in READ WRITE; do
        for block in 4194304 67108864; do
            h=$(cell "$L/gpu-check-tcp-host.log" "$op" "$block")
            c=$(cell "$L/gpu-check-tcp-cuda.log" "$op" "$block")
            echo "| TCP $op $((block >> 20)) MiB, host -> host | $h | |"
            echo "| TCP $op $((block >> 20)) MiB, GPU -> GPU (two processes) | $c | $(ratio "$c" "$h") of host |"
        done
    done
    for op in READ WRITE; do
        for block in 4194304 67108864; do
            i=$(cell "$L/gpu-check-ipc-cuda.log" "$op" "$block")
            echo "| CUDA IPC $op $((block >> 20)) MiB, two processes, one GPU | $i | $(ratio "$i" "$(field d2d_gbps)") of cuMemcpyDtoD |"
        done
    done
} | tee ${OUT:+"$OUT/gpu-check.txt"}
say "done in $((SECONDS - START)) s"
exit $failed
