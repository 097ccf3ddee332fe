#!/usr/bin/env bash
# Run tests/vm/rxe_check.c against a real Debian kernel with a soft-RoCE (rxe) device, in the
# throw-away VM of tests/vm/vm-run.sh (topology "one": rxe0). It checks the uverbs ioctl layout
# of OPEN_DEVICE's device context creation, which no unit test can: the hosts that run CI have no
# RDMA device. Not part of ctest (the suite's RDMA tests boot their own VM).
#
# Needs: gcc, and what tests/vm/vm-run.sh needs. Exits 77 when the VM cannot run here, 0 when
# every check passed, 1 when a check failed.
# Usage: tests/vm/run-rxe-check.sh    (ORBITE_VM_KERNEL picks the kernel package, as for vm-run.sh)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
command -v gcc >/dev/null || { echo "SKIP: gcc is not installed"; exit 77; }

# Inside the project tree: the VM sees it at the same path.
mkdir -p "$ROOT/build"
WORK=$(mktemp -d "$ROOT/build/rxe-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
gcc -std=c11 -D_GNU_SOURCE -O1 -Wall -Wextra -Werror -DORB_UCTX_DRIVER_ID=RDMA_DRIVER_RXE \
    -I"$ROOT" -I"$ROOT/lib" -I"$ROOT/include" -o "$WORK/rxe_check" \
    "$ROOT/tests/vm/rxe_check.c" "$ROOT/helper/uctx.c" "$ROOT/common/uverbs.c" \
    "$ROOT/lib/core/error.c"
status=0
"$ROOT/tests/vm/vm-run.sh" --topology one --timeout 600 -- "$WORK/rxe_check" || status=$?
case $status in
    0 | 77) exit "$status" ;;
    *) exit 1 ;;
esac
