"""The binding's calls in one process: engines, registrations, segments, batches, reports,
notifications, errors (one class per status), and inputs a careless or hostile caller passes."""

import array
import gc
import json
import mmap
import sys
import threading

import numpy as np
import pytest

import orbite
from orbite import Op, Perm, Request, Status, Transport


# ---- module, enums, errors ----------------------------------------------------------------------


def test_version_and_constants():
    assert orbite.__version__.count(".") == 2
    assert orbite.NOTIFY_MAX == 4096
    assert int(Perm.REMOTE_WRITE) == 3 and int(Perm.REMOTE_READ) == 1 and int(Perm.LOCAL) == 0
    assert [int(t) for t in Transport] == [0, 1, 2, 3, 4]
    assert int(Op.READ) == 0 and int(Op.WRITE) == 1


def test_one_exception_class_per_status():
    classes = {}
    for status in Status:
        if status == Status.OK:
            continue
        err = orbite._error(int(status), "detail")
        assert isinstance(err, orbite.Error)
        assert type(err) is not orbite.Error, status
        assert err.status == status and err.message == "detail" and err.report is None
        assert status.name in str(err) and "detail" in str(err)
        classes[status] = type(err)
    assert len(set(classes.values())) == len(classes)  # one class each
    # The built-in families a Python caller already catches.
    assert issubclass(orbite.InvalidArgument, ValueError)
    assert issubclass(orbite.ConfigError, ValueError)
    assert issubclass(orbite.TimedOut, TimeoutError)
    assert issubclass(orbite.PermissionDenied, PermissionError)
    assert issubclass(orbite.NotFound, LookupError)
    assert issubclass(orbite.PeerError, ConnectionError)
    # A status this package does not know still raises the base class.
    unknown = orbite._error(-99, "")
    assert type(unknown) is orbite.Error and unknown.status == -99
    assert orbite._orbite.strerror(-5) != ""


def test_log_level():
    before = orbite.get_log_level()
    try:
        orbite.set_log_level("debug")
        assert orbite.get_log_level() == "debug"
        orbite.set_log_level(0)
        assert orbite.get_log_level() == "error"
        with pytest.raises(orbite.InvalidArgument):
            orbite.set_log_level("loud")
        with pytest.raises(orbite.InvalidArgument):
            orbite.set_log_level(9)
    finally:
        orbite.set_log_level(before)


def test_cuda_retained_resources_without_cuda():
    assert orbite.cuda_retained_resources() == {"device_allocations": 0, "device_bytes": 0, "host_allocations": 0,
                                                "host_bytes": 0, "contexts": 0, "imports": 0}


# ---- engines -----------------------------------------------------------------------------------


def test_engine_endpoint_epoch_and_close():
    e = orbite.Engine({"endpoint": "127.0.0.1:0", "tcp_stripes": 2})
    host, port = e.endpoint.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert len(e.epoch) == 32 and int(e.epoch, 16) >= 0
    assert orbite.Engine().epoch != e.epoch
    e.close()
    e.close()  # idempotent
    with pytest.raises(orbite.Closed):
        e.open_segment("127.0.0.1:1", "0" * 32)
    with pytest.raises(orbite.Closed):
        e.register(bytearray(16))


def test_engine_config_as_json_and_errors():
    with orbite.Engine(json.dumps({"busy_poll_us": 0})) as e:
        assert e.epoch
    with pytest.raises(orbite.ConfigError) as info:
        orbite.Engine({"no_such_key": 1})
    assert "no_such_key" in info.value.message
    with pytest.raises(orbite.ConfigError):
        orbite.Engine({"tcp_stripes": 0})
    with pytest.raises(orbite.ConfigError):
        orbite.Engine("{not json")
    with pytest.raises(TypeError):
        orbite.Engine(42)
    with pytest.raises(TypeError):
        orbite.Engine(rdma=3.5)
    with pytest.raises(orbite.ConfigError):
        orbite.Engine(rdma={"no_such_rdma_key": True})


def test_requester_only_engine_has_no_endpoint(requester):
    with pytest.raises(orbite.Unavailable):
        requester.endpoint


def test_rdma_stats_without_rdma(requester):
    with pytest.raises(orbite.Unavailable):
        requester.rdma_stats()
    with pytest.raises(orbite.Unavailable):
        requester.rdma_nic_load()


# ---- registration ------------------------------------------------------------------------------


def test_register_buffer_kinds(requester):
    objects = [bytearray(4096), memoryview(bytearray(100)), np.zeros(512, dtype=np.float32),
               array.array("q", range(64))]
    m = mmap.mmap(-1, 8192)
    objects.append(m)
    regs = [requester.register(o) for o in objects]
    for o, r in zip(objects, regs):
        assert r.length == memoryview(o).nbytes
        assert r.kind == orbite.MemoryKind.HOST and r.perm == Perm.LOCAL
        assert r.addr(0) == r.address and r.addr(r.length - 1) == r.address + r.length - 1
    assert len({r.id for r in regs}) == len(regs)
    for r in regs:
        r.unregister()
    for r in regs:
        assert r.wait_released(5.0)
    m.close()  # possible only once the engine let go of its export


def test_register_refuses_what_it_cannot_keep_safe(requester):
    with pytest.raises(orbite.InvalidArgument, match="read-only"):
        requester.register(b"immutable bytes")
    with pytest.raises(orbite.InvalidArgument, match="read-only"):
        requester.register(memoryview(bytearray(64)).toreadonly(), Perm.REMOTE_READ)
    ro = np.zeros(64, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(orbite.InvalidArgument, match="read-only"):
        requester.register(ro, Perm.REMOTE_WRITE)
    with pytest.raises(orbite.InvalidArgument, match="contiguous"):
        requester.register(np.zeros((8, 8), dtype=np.uint8)[:, ::2])
    with pytest.raises(orbite.InvalidArgument, match="empty"):
        requester.register(bytearray())
    with pytest.raises(TypeError):
        requester.register(12345)
    with pytest.raises(TypeError):
        requester.register("text")
    with pytest.raises(ValueError):
        requester.register(bytearray(8), 7)  # not a permission


def test_registration_helpers(requester):
    r = requester.register(bytearray(100), Perm.REMOTE_READ)
    assert r.perm == Perm.REMOTE_READ
    assert "REMOTE_READ" in repr(r)
    with pytest.raises(orbite.InvalidArgument):
        r.addr(-1)
    with pytest.raises(orbite.InvalidArgument):
        r.addr(99, 2)
    with pytest.raises(TypeError):
        r.addr("1")
    assert r.addr(99, 1) == r.address + 99
    with r:
        pass
    assert r.wait_released(5.0)
    with pytest.raises(orbite.NotFound):
        r.unregister()  # once only


def test_register_same_range_twice_keeps_the_first_permission(requester):
    buf = bytearray(4096)
    view = memoryview(buf)
    a = requester.register(buf, Perm.REMOTE_WRITE)
    b = requester.register(view, Perm.LOCAL)
    assert a.id == b.id and b.perm == Perm.REMOTE_WRITE  # what the engine keeps, not what was asked
    b.unregister()
    a.unregister()
    assert a.wait_released(5.0)
    view.release()


def test_host_memory():
    m = orbite.HostMemory(10000)
    assert m.size >= 10000 and len(m) == m.size and m.address != 0 and not m.shared
    v = memoryview(m)
    assert v.nbytes == m.size and not v.readonly
    v[:3] = b"abc"
    assert bytes(memoryview(m)[:3]) == b"abc"
    s = orbite.HostMemory(4096, shared=True)
    assert s.shared
    arr = np.frombuffer(s, dtype=np.uint8)
    assert arr.shape == (4096,) and not arr.any()
    with pytest.raises(orbite.InvalidArgument):
        orbite.HostMemory(0)
    with pytest.raises(orbite.InvalidArgument):
        orbite.HostMemory(-1)
    with pytest.raises(orbite.InvalidArgument):
        orbite.HostMemory(4096, align=3)
    with pytest.raises(TypeError):
        orbite.HostMemory("4096")


def test_register_host_memory(requester):
    m = orbite.HostMemory(1 << 16, shared=True)
    r = requester.register(m, Perm.REMOTE_WRITE)
    assert r.address == m.address and r.length == m.size and r.kind == orbite.MemoryKind.HOST
    r.unregister()


def test_register_budget():
    with orbite.Engine({"max_registrations": 1, "enable_source": False}) as e:
        e.register(bytearray(64))
        with pytest.raises(orbite.ResourceExhausted):
            e.register(bytearray(64))


# ---- requests between two engines of this process -----------------------------------------------


def test_read_write_and_reports(pair):
    source, req, seg = pair
    remote = bytearray(range(256)) * 256
    rr = source.register(remote, Perm.REMOTE_WRITE)
    local = bytearray(len(remote))
    lr = req.register(local)
    regions = seg.describe()
    assert [(g.address, g.length, g.perm) for g in regions] == [(rr.address, rr.length, Perm.REMOTE_WRITE)]
    rep = req.submit_and_wait(seg, [Request.read(lr.address, rr.address, len(remote))], timeout=30)
    assert rep.done and rep.status == 0 and rep.completed_requests == 1 and rep.completed_bytes == len(remote)
    assert rep.failure is None and not rep.has_failure and rep.local_drained
    assert local == remote
    local[:] = bytes(reversed(local))
    rep = req.submit_and_wait(seg, [Request.write(lr.address, rr.address, 1000, Transport.TCP),
                                    Request(Op.WRITE, lr.addr(1000), rr.addr(1000), len(remote) - 1000)])
    assert rep.completed_requests == 2
    assert remote == local
    # Plain tuples are requests too.
    rep = req.submit_and_wait(seg, [(0, lr.address, rr.address, 16), (1, lr.address, rr.address, 16, 1, 2)])
    assert rep.completed_requests == 2


def test_failures_carry_their_report(pair):
    source, req, seg = pair
    remote = bytearray(4096)
    rr = source.register(remote, Perm.REMOTE_READ)
    local = bytearray(8192)
    lr = req.register(local)
    # One byte past the registration: refused whole, nothing attempted.
    with pytest.raises(orbite.NotFound) as info:
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 4097)])
    rep = info.value.report
    assert rep.done and rep.status == Status.ENOENT and rep.has_failure
    assert rep.failure.request_index == 0 and rep.failure.remote_effect == orbite.RemoteEffect.NONE
    # A WRITE into a READ-only registration.
    with pytest.raises(orbite.PermissionDenied) as info:
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 16),
                                  Request.write(lr.address, rr.address, 16)])
    assert info.value.report.completed_requests == 1
    assert info.value.report.failure.request_index == 1
    assert remote == bytearray(4096)
    # A local range outside every local registration: refused at submission.
    with pytest.raises(orbite.NotFound) as info:
        req.submit_and_wait(seg, [Request.read(lr.address + 8000, rr.address, 1000)])
    assert info.value.report.submitted_requests == 0


def test_hostile_requests_are_refused_before_anything_moves(pair):
    source, req, seg = pair
    rr = source.register(bytearray(4096), Perm.REMOTE_WRITE)
    lr = req.register(bytearray(4096))
    bad = [
        ([Request.read(lr.address, rr.address, -1)], orbite.InvalidArgument),
        ([Request.read(-5, rr.address, 16)], orbite.InvalidArgument),
        ([Request.read(lr.address, rr.address, 1 << 70)], orbite.InvalidArgument),
        ([Request.read(lr.address, rr.address, 0)], orbite.InvalidArgument),
        ([(7, lr.address, rr.address, 16)], orbite.InvalidArgument),
        ([(0, lr.address, rr.address, 16, 99)], orbite.InvalidArgument),
        ([(0, lr.address, rr.address)], orbite.InvalidArgument),
        ([(0, lr.address, rr.address, 16, 0, 0, 0)], orbite.InvalidArgument),
        ([(0, "a", rr.address, 16)], TypeError),
        ([(0, lr.address, rr.address, 16.0)], TypeError),
        ([[0, lr.address, rr.address, 16]], TypeError),
        ([None], TypeError),
        ("requests", TypeError),
        (42, TypeError),
        ([], orbite.InvalidArgument),
    ]
    for requests, exc in bad:
        with pytest.raises(exc):
            req.submit_and_wait(seg, requests)
    with pytest.raises(orbite.InvalidArgument):
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 16)], timeout=-1)
    with pytest.raises(TypeError):
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 16)], timeout="1")
    with pytest.raises(TypeError):
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 16)], notify=12)
    with pytest.raises(orbite.InvalidArgument):
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 16)], notify=b"x" * (orbite.NOTIFY_MAX + 1))


def test_segments_prove_the_epoch(requester):
    with orbite.Engine() as source:
        wrong = ("0" if source.epoch[0] != "0" else "1") + source.epoch[1:]
        with pytest.raises(orbite.StaleEpoch):
            requester.open_segment(source.endpoint, wrong)
        with pytest.raises(orbite.InvalidArgument):
            requester.open_segment(source.endpoint, "not an epoch")
        with pytest.raises(TypeError):
            requester.open_segment(source.endpoint, None)
        with pytest.raises(orbite.InvalidArgument):
            requester.open_segment(source.endpoint, source.epoch, timeout=-2)
        seg = requester.open_segment(source.endpoint, source.epoch, timeout=None)
        assert source.endpoint in repr(seg)
        seg.close()
        seg.close()
        with pytest.raises(orbite.Closed):
            seg.describe()
    with pytest.raises(orbite.PeerError):
        requester.open_segment("127.0.0.1:1", "0" * 32, timeout=5)


def test_async_batches_poll_wait_and_notifications(pair):
    source, req, seg = pair
    rr = source.register(bytearray(1 << 20), Perm.REMOTE_WRITE)
    local = bytearray(b"\x5a" * (1 << 20))
    lr = req.register(local)
    b = req.batch(seg)
    assert not b.poll().done  # unsealed
    with pytest.raises(orbite.InvalidArgument):
        b.wait(1.0)  # not sealed
    b.submit([Request.write(lr.addr(i * 65536), rr.addr(i * 65536), 65536) for i in range(8)])
    b.submit([Request.write(lr.addr(8 * 65536), rr.addr(8 * 65536), 65536)])
    b.seal(b"kv blocks 0-8 ready")
    with pytest.raises(orbite.Busy):
        b.seal(None)  # sealed once
    rep = b.wait(30)
    assert rep.done and rep.submitted_requests == 9 and rep.completed_requests == 9
    assert rep.notification == orbite.NotifyState.DELIVERED
    assert b.poll() == rep
    b.free()
    b.free()  # a freed batch: nothing to do
    notes = source.poll_notifications()
    assert [(n.sender, n.data) for n in notes] == [(req.epoch, b"kv blocks 0-8 ready")]
    assert source.poll_notifications() == []
    with pytest.raises(orbite.InvalidArgument):
        source.poll_notifications(0)
    # submit(): one group, sealed; str payloads are UTF-8.
    with req.submit(seg, [Request.read(lr.address, rr.address, 4096)], notify="done") as b2:
        assert b2.wait(30).completed_bytes == 4096
    assert [n.data for n in source.poll_notifications()] == [b"done"]


def test_a_batch_used_by_two_threads_at_once_is_refused(pair):
    source, req, seg = pair
    rr = source.register(bytearray(64 << 20), Perm.REMOTE_WRITE)
    lr = req.register(bytearray(64 << 20))
    b = req.submit(seg, [Request.read(lr.address, rr.address, 64 << 20)] * 4)
    errors = []
    started = threading.Event()

    def waiter():
        started.set()
        try:
            b.wait(60)
        except orbite.Error as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    started.wait()
    refused = 0
    while t.is_alive():
        try:
            b.poll()
        except orbite.Busy:
            refused += 1
    t.join()
    assert not errors
    assert refused > 0  # 256 MiB take far longer than a poll
    assert b.poll().done
    b.free()
    # A batch with live work cannot be freed.
    b = req.submit(seg, [Request.read(lr.address, rr.address, 64 << 20)] * 4)
    try:
        b.free()
    except orbite.Busy:
        pass
    b.wait(60)
    b.free()


def test_timed_out_wait(pair):
    source, req, seg = pair
    rr = source.register(bytearray(64 << 20), Perm.REMOTE_WRITE)
    lr = req.register(bytearray(64 << 20))
    b = req.submit(seg, [Request.read(lr.address, rr.address, 64 << 20)] * 8)
    try:
        b.wait(0)
    except orbite.TimedOut as e:
        assert not e.report.done
    assert b.wait(None).done
    b.free()


def test_a_dropped_running_batch_is_finished_first(pair):
    source, req, seg = pair
    remote = bytearray(16 << 20)
    rr = source.register(remote, Perm.REMOTE_WRITE)
    local = bytearray(b"\x11" * (16 << 20))
    lr = req.register(local)
    b = req.submit(seg, [Request.write(lr.address, rr.address, 16 << 20)])
    del b
    gc.collect()
    assert remote == local  # the batch ran to its end before it was freed


def test_metrics(pair):
    source, req, seg = pair
    rr = source.register(bytearray(1 << 20), Perm.REMOTE_WRITE)
    lr = req.register(bytearray(1 << 20))
    before = req.metrics()
    req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 65536, Transport.TCP)] * 4)
    with pytest.raises(orbite.NotFound):
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address + 1, 1 << 20, Transport.TCP)])
    after = req.metrics()
    read = after["requested"]["tcp"]["read"]
    assert read["requests"] - before["requested"]["tcp"]["read"]["requests"] == 4
    assert read["bytes"] - before["requested"]["tcp"]["read"]["bytes"] == 4 * 65536
    assert read["failed"] == 1 and after["failures"] == {_orbite_text(Status.ENOENT): 1}
    assert after["batch_latency"]["batches"] == before["batch_latency"]["batches"] + 2
    assert after["gauges"]["registrations"] == 1 and after["rdma"] is None and after["nics"] == []
    assert source.metrics()["served"]["tcp"]["read"]["requests"] >= 4


def test_metrics_over_http(requester):
    import urllib.error
    import urllib.request

    with orbite.Engine(metrics=True) as e:
        host, port = e.metrics_address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        with urllib.request.urlopen("http://%s/metrics" % e.metrics_address, timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read().decode()
        assert "orbite_requests_total{transport=\"tcp\",op=\"read\"} 0" in text
        assert "# TYPE orbite_batch_duration_seconds histogram" in text
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen("http://%s/other" % e.metrics_address, timeout=10)
        assert info.value.code == 404
    with pytest.raises(orbite.Unavailable):
        requester.metrics_address
    with pytest.raises(orbite.InvalidArgument):
        orbite.Engine(metrics="localhost:80")
    with pytest.raises(TypeError):
        orbite.Engine(metrics=9464)


def _orbite_text(status):
    return orbite._orbite.strerror(int(status))


def test_resolve_and_describe_kinds(pair):
    source, req, seg = pair
    rr = source.register(bytearray(4096), Perm.REMOTE_READ)
    source.register(bytearray(4096))  # local-only: never published
    assert [g.perm for g in seg.describe()] == [Perm.REMOTE_READ]
    assert seg.describe()[0].memory_kind == orbite.MemoryKind.HOST
    rid, base, length, perm = source._c.resolve(rr.address + 1, 10)
    assert (rid, base, length, perm) == (rr.id, rr.address, 4096, Perm.REMOTE_READ)
    with pytest.raises(orbite.NotFound):
        source._c.resolve(rr.address + 4090, 10)


def test_closing_one_direction(pair):
    source, req, seg = pair
    rr = source.register(bytearray(4096), Perm.REMOTE_READ)
    lr = req.register(bytearray(4096))
    req.close_requester()
    with pytest.raises(orbite.Closed):
        req.submit_and_wait(seg, [Request.read(lr.address, rr.address, 16)])
    with pytest.raises(orbite.Closed):
        req.batch(seg)
    source.close_source()
    with orbite.Engine({"enable_source": False}) as other:
        with pytest.raises(orbite.Error):
            other.open_segment(source.endpoint, source.epoch, timeout=2)


def test_stub_covers_the_extension():
    import ast
    import os

    stub = os.path.join(os.path.dirname(orbite.__file__), "_orbite.pyi")
    tree = ast.parse(open(stub).read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                members = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
                members |= {t.target.id for t in node.body if isinstance(t, ast.AnnAssign)}
                cls = getattr(orbite._orbite, node.name)
                public = {n for n in dir(cls) if not n.startswith("_")}
                assert public <= members, (node.name, public - members)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    public = {n for n in dir(orbite._orbite) if not n.startswith("__")}
    assert public <= names, public - names
