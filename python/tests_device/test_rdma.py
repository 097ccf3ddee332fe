"""RDMA through the binding on real verbs devices: READ and WRITE on the rails, and the
transport's statistics as dicts."""

import os

import numpy as np
import pytest

import orbite
from orbite import Perm, Request, Transport

REQUESTER = (os.environ.get("ORBITE_RDMA_REQUESTER_NICS") or "rxe_a0,rxe_a1").split(",")
SOURCE = (os.environ.get("ORBITE_RDMA_SOURCE_NICS") or "rxe_b0,rxe_b1").split(",")


@pytest.fixture
def engines():
    with orbite.Engine(rdma={"rdma_whitelist": SOURCE}) as source, \
            orbite.Engine({"enable_source": False}, rdma={"rdma_whitelist": REQUESTER}) as requester:
        yield source, requester


def test_read_write_over_rdma_and_stats(engines):
    source, requester = engines
    remote = np.arange(4 << 18, dtype=np.uint32)  # 4 MiB
    rr = source.register(remote, Perm.REMOTE_WRITE)
    local = np.zeros_like(remote)
    lr = requester.register(local)
    with requester.open_segment(source.endpoint, source.epoch, timeout=30) as seg:
        rep = requester.submit_and_wait(seg, [Request.read(lr.addr(i << 20, 1 << 20), rr.addr(i << 20, 1 << 20),
                                                           1 << 20, Transport.RDMA) for i in range(4)], timeout=60)
        assert rep.completed_requests == 4
        assert np.array_equal(local, remote)
        local[:] = 7
        requester.submit_and_wait(seg, [Request.write(lr.address, rr.address, local.nbytes, Transport.RDMA)],
                                  timeout=60)
        assert np.array_equal(remote, local)
        with pytest.raises(orbite.NotFound):
            requester.submit_and_wait(seg, [Request.read(lr.address, rr.address, local.nbytes + 1, Transport.RDMA)],
                                      timeout=60)
    stats = requester.rdma_stats()
    assert stats["nics_open"] == len(REQUESTER) and stats["rails"] == len(REQUESTER)
    assert stats["completed_reads"] > 0 and stats["completed_writes"] > 0
    assert all(isinstance(v, int) for v in stats.values())
    served = source.rdma_stats()
    assert served["grants_served"] > 0
    # One ACK ends one or more grants (no queue pair died here, so none was sent twice).
    assert 0 < served["ack_messages"] <= served["grants_served"]
    loads = requester.rdma_nic_load()
    assert [n["name"] for n in loads] == REQUESTER
    assert all(n["port_active"] == 1 and n["completed_bytes"] > 0 for n in loads)
    assert all(isinstance(n["selection_bps"], float) for n in loads)


def test_rdma_settings_errors():
    with pytest.raises(orbite.ConfigError):
        orbite.Engine(rdma={"rdma_whitelist": ["no_such_nic0"]})
