#!/bin/bash
# The RDMA device tests against real NICs, from a profile (hardware/profiles/*.conf):
#
#   hardware/run.sh hardware/profiles/two-rails.conf
#
# A profile names the requester's and the source's NICs on this host (rail k of one side must
# reach rail k of the other: two ports on one fabric, or two NICs cabled back to back). The
# tests are those of the soft-RoCE VM (ctest label rdma-device, from build/), with the checks that
# soft-RoCE cannot pass made hard (ORBITE_HW_STRICT=1: a NIC must refuse an access one byte past
# a window). Exits 77 when the profile's devices are not here.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -eq 1 && -r $1 ]] || { echo "usage: $0 PROFILE" >&2; exit 2; }
REQUESTER_NICS= SOURCE_NICS=
# shellcheck disable=SC1090
. "$1"
[[ -n $REQUESTER_NICS && -n $SOURCE_NICS ]] || { echo "$1: REQUESTER_NICS and SOURCE_NICS are required" >&2; exit 2; }
for nic in ${REQUESTER_NICS//,/ } ${SOURCE_NICS//,/ }; do
    if [[ ! -d /sys/class/infiniband/$nic ]]; then
        echo "hardware: $nic is not on this host: skipped"
        exit 77
    fi
done
[[ -d $ROOT/build ]] || { echo "hardware: build the tree first (./build.sh test or cmake -B build)" >&2; exit 2; }
export ORBITE_RDMA_REQUESTER_NICS=$REQUESTER_NICS ORBITE_RDMA_SOURCE_NICS=$SOURCE_NICS ORBITE_HW_STRICT=1
exec ctest --test-dir "$ROOT/build" -L rdma-device --output-on-failure --no-tests=error
