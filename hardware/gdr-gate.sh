#!/bin/bash
# The GPUDirect RDMA gate on a host with an NVIDIA GPU and real NICs, from a profile
# (hardware/profiles/*.conf):
#
#   hardware/gdr-gate.sh hardware/profiles/two-rails.conf
#
# Runs build/tests/test_rdma_gdr_gate on the machine's own driver (ORBITE_CUDA_DRIVER=real) in
# both progress modes: device memory of GPU 0 registered with the NICs (cuda_memory direct,
# route auto), READ and WRITE of 4096 bytes and of 8388768 bytes (the two-rail folded tail),
# both peers' whole buffers and guards checked, every payload work request inside the device
# range and the memory region's arguments those of the allocation; then the same with GPU 0 as
# the source (private grants: each request's region exactly its device range, torn down before
# its ACK), and once more with gpu_source_reuse (DevX keys on the connection's queue pairs,
# which needs the helper installed). MLX5_SCATTER_TO_CQE=0 is set for it. Exits 77 when the
# profile's NICs or a GPU are not here, 1 when a check fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -eq 1 && -r $1 ]] || { echo "usage: $0 PROFILE" >&2; exit 2; }
REQUESTER_NICS= SOURCE_NICS=
# shellcheck disable=SC1090
. "$1"
[[ -n $REQUESTER_NICS && -n $SOURCE_NICS ]] || { echo "$1: REQUESTER_NICS and SOURCE_NICS are required" >&2; exit 2; }
for nic in ${REQUESTER_NICS//,/ } ${SOURCE_NICS//,/ }; do
    if [[ ! -d /sys/class/infiniband/$nic ]]; then
        echo "gdr-gate: $nic is not on this host: skipped"
        exit 77
    fi
done
if [[ ! -e /dev/nvidiactl ]]; then
    echo "gdr-gate: no NVIDIA GPU on this host: skipped"
    exit 77
fi
GATE=$ROOT/build/tests/test_rdma_gdr_gate
[[ -x $GATE ]] || { echo "gdr-gate: build the tree first (./build.sh test or cmake -B build)" >&2; exit 2; }
export ORBITE_RDMA_REQUESTER_NICS=$REQUESTER_NICS ORBITE_RDMA_SOURCE_NICS=$SOURCE_NICS
export ORBITE_CUDA_DRIVER=real MLX5_SCATTER_TO_CQE=0
rc=0
for mode in polling event_driven; do
    echo "== gdr-gate: progress_mode $mode"
    set +e
    timeout 300 "$GATE" --progress "$mode"
    step=$?
    set -e
    if [[ $step -eq 77 ]]; then
        exit 77
    fi
    [[ $step -eq 0 ]] || rc=1
done
# The reuse gate: GPU-source grants by DevX keys (gpu_source_reuse), through the installed
# helper. Its result decides whether gpu_source_reuse may be turned on for this hardware; the
# default (private grants) does not depend on it.
reuse_rc=0
for mode in polling event_driven; do
    echo "== gdr-gate: gpu_source_reuse, progress_mode $mode"
    set +e
    timeout 300 "$GATE" --progress "$mode" --reuse
    step=$?
    set -e
    [[ $step -eq 0 ]] || reuse_rc=1
done
if [[ $reuse_rc -ne 0 ]]; then
    echo "gdr-gate: the gpu_source_reuse gate FAILED: keep gpu_source_reuse off on this hardware"
    rc=1
else
    echo "gdr-gate: the gpu_source_reuse gate passed"
fi
exit $rc
