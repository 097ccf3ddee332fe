"""Registered Python objects live exactly as long as the engine needs their bytes."""

import gc
import sys
import weakref

import numpy as np
import pytest

import orbite
from orbite import Perm, Request


def test_a_deleted_array_stays_valid_until_the_engine_lets_go(pair):
    source, req, seg = pair
    remote = np.arange(1 << 18, dtype=np.uint32)  # 1 MiB
    expected = remote.copy()
    rr = source.register(remote, Perm.REMOTE_READ)
    watch = weakref.ref(remote)
    del remote
    gc.collect()
    assert watch() is not None  # the registration holds it
    local = np.zeros(1 << 18, dtype=np.uint32)
    lr = req.register(local)
    for _ in range(3):
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, rr.length)])
        assert np.array_equal(local, expected)
        local[:] = 0
    rr.unregister()
    assert rr.wait_released(5.0)
    gc.collect()
    assert watch() is None  # gone once the engine let go


def test_refcounts_back_to_baseline_after_unregister(requester):
    buf = bytearray(1 << 16)
    base = sys.getrefcount(buf)
    regs = [requester.register(buf if i % 2 else memoryview(buf)) for i in range(1)]
    assert sys.getrefcount(buf) > base
    for r in regs:
        r.unregister()
        assert r.wait_released(5.0)
    del regs
    gc.collect()
    assert sys.getrefcount(buf) == base
    buf.extend(b"x")  # resizable again: no export is left


def test_a_buffer_in_use_cannot_be_resized_or_closed(requester):
    buf = bytearray(4096)
    r = requester.register(buf)
    with pytest.raises(BufferError):
        buf.extend(b"more")  # the engine's view pins its size
    r.unregister()
    assert r.wait_released(5.0)
    buf.extend(b"more")


def test_memory_in_flight_outlives_unregister(pair):
    """Unregistering while a transfer runs hides the range from new requests; the bytes stay
    until that transfer is done, then the object goes."""
    source, req, seg = pair
    remote = bytearray(b"\x42" * (64 << 20))
    rr = source.register(remote, Perm.REMOTE_READ)
    watch_view = memoryview(remote)
    local = bytearray(64 << 20)
    lr = req.register(local)
    b = req.submit(seg, [Request.read(lr.address, rr.address, 64 << 20)])
    rr.unregister()
    del remote
    rep = None
    try:
        rep = b.wait(60)
    except orbite.NotFound:
        pass  # refused before it started: a valid outcome, nothing moved
    if rep is not None:
        assert local == bytes(watch_view)
    with pytest.raises(orbite.NotFound):
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 16)])
    assert rr.wait_released(10.0)
    watch_view.release()
    b.free()


def test_engine_close_releases_every_registration():
    objects = [bytearray(4096) for _ in range(16)]
    bases = [sys.getrefcount(o) for o in objects]
    e = orbite.Engine()
    regs = [e.register(o, Perm.REMOTE_WRITE) for o in objects]
    e.close()
    for r in regs:
        assert r.wait_released(10.0)
    del e, regs
    gc.collect()
    assert [sys.getrefcount(o) for o in objects] == bases


def test_many_registrations_come_and_go(requester):
    arrays = [np.zeros(1024, dtype=np.uint8) for _ in range(200)]
    watches = [weakref.ref(a) for a in arrays]
    regs = [requester.register(a) for a in arrays]
    del arrays
    gc.collect()
    assert all(w() is not None for w in watches)
    for r in regs:
        r.unregister()
    assert all(r.wait_released(10.0) for r in regs)
    del regs
    gc.collect()
    assert all(w() is None for w in watches)
