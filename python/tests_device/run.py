"""The binding on real verbs devices (the soft-RoCE VM's rails topology, or the NICs named by
ORBITE_RDMA_REQUESTER_NICS / ORBITE_RDMA_SOURCE_NICS): exit 77 (skipped) where they are missing,
except inside the test VM (ORBITE_VM), where that is a failure."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REQUESTER = os.environ.get("ORBITE_RDMA_REQUESTER_NICS") or "rxe_a0,rxe_a1"
SOURCE = os.environ.get("ORBITE_RDMA_SOURCE_NICS") or "rxe_b0,rxe_b1"

present = set(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else set()
missing = [n for n in (REQUESTER + "," + SOURCE).split(",") if n not in present]
if missing:
    if os.environ.get("ORBITE_VM"):
        print("FAIL: verbs devices %s are missing inside the test VM" % ",".join(missing))
        sys.exit(1)
    print("SKIP: no verbs devices %s" % ",".join(missing))
    sys.exit(77)
try:
    import pytest
except ImportError:
    print("SKIP: pytest is not installed (Debian: python3-pytest)")
    sys.exit(77)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs", HERE]))
