"""Two processes: this one requests, peer.py serves. Over TCP and over the same-host transport,
with async batches under asyncio and notifications."""

import asyncio
import os
import random
import time

import numpy as np
import pytest

import orbite
from orbite import Perm, Request, Transport
from conftest import Peer, pattern


def local_memory(transport):
    """Local bytes the transport can move: shared host memory for the same-host transport."""
    if transport == Transport.SHM:
        return orbite.HostMemory(16 << 20, shared=True)
    return bytearray(16 << 20)


@pytest.mark.parametrize("transport", [Transport.TCP, Transport.SHM, Transport.UNSPEC])
def test_read_write_every_size(peer, requester, transport):
    local = local_memory(transport)
    view = memoryview(local)
    lr = requester.register(local)
    with requester.open_segment(peer.endpoint, peer.epoch) as seg:
        sizes = [1, 7, 4096, 65535, 65536 + 3, 1 << 20, (4 << 20) + 1]
        offset = 0
        for size in sizes:
            # READ the source's pattern at an odd offset of its READ-only buffer.
            src_off = (offset * 7 + 13) % (peer.ro_len - size + 1)
            rep = requester.submit_and_wait(seg, [Request.read(lr.address, peer.ro + src_off, size, transport)])
            assert rep.completed_bytes == size
            assert bytes(view[:size]) == pattern(peer.ro_len, 2)[src_off:src_off + size]
            # WRITE our own bytes into its writable buffer and look at them there.
            data = random.randbytes(size)
            view[:size] = data
            dst_off = (offset * 3 + 5) % (peer.rw_len - size + 1)
            requester.submit_and_wait(seg, [Request.write(lr.address, peer.rw + dst_off, size, transport)])
            assert peer.get(peer.rw + dst_off, size) == data
            offset += size
    lr.unregister()
    view.release()


def test_shm_needs_shared_local_memory(peer, requester):
    lr = requester.register(bytearray(4096))
    with requester.open_segment(peer.endpoint, peer.epoch) as seg:
        with pytest.raises(orbite.Unavailable):
            requester.submit_and_wait(seg, [Request.read(lr.address, peer.ro, 4096, Transport.SHM)])
        # UNSPEC takes TCP for it.
        requester.submit_and_wait(seg, [Request.read(lr.address, peer.ro, 4096)])


def test_numpy_arrays_as_kv_blocks(peer, requester):
    blocks = np.zeros((16, 64, 128), dtype=np.float16)  # 16 blocks of 16 KiB
    lr = requester.register(blocks)
    block = blocks[0].nbytes
    with requester.open_segment(peer.endpoint, peer.epoch) as seg:
        reqs = [Request.read(lr.addr(i * block, block), peer.ro + i * block, block) for i in range(16)]
        rep = requester.submit_and_wait(seg, reqs)
        assert rep.completed_requests == 16
        assert blocks.tobytes() == pattern(peer.ro_len, 2)[:blocks.nbytes]


def test_notifications_reach_the_source_after_the_data(peer, requester):
    local = bytearray(b"\x7e" * 65536)
    lr = requester.register(local)
    with requester.open_segment(peer.endpoint, peer.epoch) as seg:
        for i in range(5):
            requester.submit_and_wait(seg, [Request.write(lr.address, peer.rw + i * 65536, 65536)],
                                      notify=b"batch %d" % i)
        b = requester.submit(seg, [Request.write(lr.address, peer.rw, 16)], notify=bytes(orbite.NOTIFY_MAX))
        b.wait(30)
        b.free()
    got = peer.notifications()
    assert [bytes.fromhex(d) for _, d in got[:5]] == [b"batch %d" % i for i in range(5)]
    assert bytes.fromhex(got[5][1]) == bytes(orbite.NOTIFY_MAX)
    assert all(sender == requester.epoch for sender, _ in got)
    assert peer.get(peer.rw + 4 * 65536, 65536) == bytes(local)


def test_asyncio_batches_never_block_the_loop(peer, requester):
    local = bytearray(32 << 20)
    lr = requester.register(local)
    seg = requester.open_segment(peer.endpoint, peer.epoch)

    async def main():
        ticks = []
        stop = asyncio.Event()

        async def ticker():
            while not stop.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        batches = [requester.submit(seg, [Request.read(lr.addr(i << 20, 1 << 20), peer.ro, 1 << 20)])
                   for i in range(8)]
        reports = await asyncio.gather(*batches)  # Batch is awaitable
        for b in batches:
            b.free()
        expected = pattern(peer.ro_len, 2)[:1 << 20]
        for i in range(8):
            assert local[i << 20:(i + 1) << 20] == expected
        # A long one awaited with wait_async and a deadline.
        big = requester.submit(seg, [Request.read(lr.address, peer.rw, 8 << 20)] * 32)
        t0 = time.monotonic()
        rep = await big.wait_async(timeout=60)
        t1 = time.monotonic()
        big.free()
        # The ticker ran all along: no gap near the batch's whole duration.
        during = [t for t in ticks if t0 <= t <= t1]
        gaps = [b - a for a, b in zip([t0] + during, during + [t1])]
        assert max(gaps) < max(0.05, (t1 - t0) / 2), (max(gaps), t1 - t0)
        stop.set()
        await t
        return reports, rep, ticks

    reports, rep, ticks = asyncio.run(main())
    assert all(r.completed_bytes == 1 << 20 for r in reports)
    assert rep.completed_requests == 32
    assert local[:8 << 20] == pattern(peer.rw_len, 1)
    assert ticks  # the loop ran while the batches did
    seg.close()


def test_asyncio_cancel_and_timeout(peer, requester):
    local = bytearray(8 << 20)
    lr = requester.register(local)
    seg = requester.open_segment(peer.endpoint, peer.epoch)

    async def main():
        b = requester.submit(seg, [Request.read(lr.address, peer.rw, 8 << 20)] * 64)
        task = asyncio.ensure_future(b.wait_async())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)  # the executor's slice ends: the batch is free to use again
        try:
            rep = await b.wait_async(timeout=0)
            assert rep.done
        except orbite.TimedOut as e:
            assert not e.report.done
        rep = await b
        b.free()
        return rep

    rep = asyncio.run(main())
    assert rep.completed_requests == 64
    seg.close()


def test_a_peer_killed_mid_transfer(requester):
    p = Peer({"io_timeout_s": 5})
    try:
        local = bytearray(8 << 20)
        lr = requester.register(local)
        seg = requester.open_segment(p.endpoint, p.epoch)
        b = requester.submit(seg, [Request.read(lr.address, p.rw, 8 << 20)] * 256)
        time.sleep(0.05)
        p.kill()
        with pytest.raises(orbite.Error) as info:
            b.wait(60)
        assert isinstance(info.value, (orbite.PeerError, orbite.StaleEpoch, orbite.Closed))
        assert info.value.report.done and info.value.report.has_failure
        b.free()
        # The peer is gone: new work fails at once, naming why, and nothing hangs.
        t0 = time.monotonic()
        with pytest.raises(orbite.Error):
            requester.submit_and_wait(seg, [Request.read(lr.address, p.rw, 16)], timeout=30)
        assert time.monotonic() - t0 < 20
        seg.close()
    finally:
        p.stop()


def test_a_restarted_peer_is_stale(requester):
    p = Peer({})
    endpoint, epoch = p.endpoint, p.epoch
    p.stop()
    host, port = endpoint.rsplit(":", 1)
    q = Peer({"endpoint": endpoint})
    try:
        assert q.epoch != epoch
        with pytest.raises(orbite.StaleEpoch):
            requester.open_segment(endpoint, epoch)
        with requester.open_segment(q.endpoint, q.epoch) as seg:
            assert seg.describe()
    finally:
        q.stop()
