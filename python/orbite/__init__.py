"""OrbiTE for Python: move bytes between registered memory of processes, on one host or many.

The C library's semantics, in Python's terms:

* an :class:`Engine` registers memory (anything with the buffer protocol, CUDA arrays through
  ``__cuda_array_interface__``, or :class:`HostMemory`) and serves it to peers as a source;
* :meth:`Engine.open_segment` connects to a peer's engine, proven by its epoch;
* requests (:class:`Request`) run in batches: :meth:`Engine.submit_and_wait`, or
  :meth:`Engine.submit` for a :class:`Batch` that can be polled, waited for, or awaited in
  ``asyncio`` without blocking the event loop;
* every failure is an :class:`Error` subclass, one per status, carrying the library's detail
  message and, for a batch, its :class:`BatchReport`.

Endpoints and epochs are plain strings. Nothing is pickled, and nothing a peer sends becomes a
Python object other than bytes and numbers. See docs/python.md.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from . import _orbite

__all__ = [
    "AlreadyExists", "Batch", "BatchReport", "Busy", "Closed", "ConfigError", "Engine", "Error",
    "Failure", "HostMemory", "InvalidArgument", "MemoryKind", "NotFound", "Notification",
    "NotifyState", "Op", "OutOfMemory", "PeerError", "Perm", "PermissionDenied", "Priority",
    "ProtocolError", "Region", "Registration", "RemoteEffect", "Request", "ResourceExhausted",
    "Segment", "StaleEpoch", "Status", "TimedOut", "Transport", "TryAgain", "Unavailable",
    "Unquiesced", "NOTIFY_MAX", "get_log_level", "set_log_level", "cuda_retained_resources",
]

__version__ = "%d.%d.%d" % (_orbite.VERSION_MAJOR, _orbite.VERSION_MINOR, _orbite.VERSION_PATCH)

#: The largest notification payload, in bytes.
NOTIFY_MAX: int = _orbite.NOTIFY_MAX


# ---- statuses and errors ------------------------------------------------------------------------


class Status(enum.IntEnum):
    """The library's status codes (``enum orb_status``)."""

    OK = 0
    EINVAL = -1
    ECONFIG = -2
    EUNAVAILABLE = -3
    EPERM = -4
    ENOENT = -5
    EEXIST = -6
    EBUSY = -7
    ERESOURCE = -8
    ETIMEDOUT = -9
    ESTALE = -10
    EPEER = -11
    EPROTO = -12
    EUNQUIESCED = -13
    ECLOSED = -14
    ENOMEM = -15
    EAGAIN = -16


class Error(Exception):
    """Base of every OrbiTE failure.

    Attributes: ``status`` (a :class:`Status`), ``message`` (the library's detail text, naming
    the cause) and ``report`` (the :class:`BatchReport` of a failed batch, else ``None``).
    """

    status_code: int = 0

    def __init__(self, message: str, status: Optional[int] = None, report: Optional["BatchReport"] = None):
        super().__init__(message)
        code = self.status_code if status is None else status
        try:
            self.status: Union[Status, int] = Status(code)
        except ValueError:
            self.status = code
        self.message = message
        self.report = report

    def __str__(self) -> str:
        name = self.status.name if isinstance(self.status, Status) else str(self.status)
        return "%s (%s)" % (self.message, name)


class InvalidArgument(Error, ValueError):
    """ORB_EINVAL: an argument is invalid."""

    status_code = Status.EINVAL


class ConfigError(Error, ValueError):
    """ORB_ECONFIG: the configuration is invalid (the message names the key)."""

    status_code = Status.ECONFIG


class Unavailable(Error):
    """ORB_EUNAVAILABLE: a transport, library or device is not available."""

    status_code = Status.EUNAVAILABLE


class PermissionDenied(Error, PermissionError):
    """ORB_EPERM: the registration's permission does not allow the access."""

    status_code = Status.EPERM


class NotFound(Error, LookupError):
    """ORB_ENOENT: no such registration, range or peer."""

    status_code = Status.ENOENT


class AlreadyExists(Error):
    """ORB_EEXIST: already exists."""

    status_code = Status.EEXIST


class Busy(Error):
    """ORB_EBUSY: conflicting access or live work (e.g. a batch used by two threads at once)."""

    status_code = Status.EBUSY


class ResourceExhausted(Error):
    """ORB_ERESOURCE: a configured budget is exhausted."""

    status_code = Status.ERESOURCE


class TimedOut(Error, TimeoutError):
    """ORB_ETIMEDOUT: the deadline passed."""

    status_code = Status.ETIMEDOUT


class StaleEpoch(Error):
    """ORB_ESTALE: the endpoint runs another (or an older) epoch."""

    status_code = Status.ESTALE


class PeerError(Error, ConnectionError):
    """ORB_EPEER: the peer failed or disconnected."""

    status_code = Status.EPEER


class ProtocolError(Error):
    """ORB_EPROTO: the peer broke the wire protocol."""

    status_code = Status.EPROTO


class Unquiesced(Error):
    """ORB_EUNQUIESCED: cleanup could not be proven complete (memory stays held)."""

    status_code = Status.EUNQUIESCED


class Closed(Error):
    """ORB_ECLOSED: the engine (or that direction, or the handle) is closed."""

    status_code = Status.ECLOSED


class OutOfMemory(Error):
    """ORB_ENOMEM: out of memory."""

    status_code = Status.ENOMEM


class TryAgain(Error):
    """ORB_EAGAIN: not ready yet."""

    status_code = Status.EAGAIN


_ERRORS = {
    int(cls.status_code): cls
    for cls in (InvalidArgument, ConfigError, Unavailable, PermissionDenied, NotFound, AlreadyExists, Busy,
                ResourceExhausted, TimedOut, StaleEpoch, PeerError, ProtocolError, Unquiesced, Closed,
                OutOfMemory, TryAgain)
}
_orbite._set_error_classes(_ERRORS, Error)


def _error(status: int, message: str, report: Optional["BatchReport"] = None) -> Error:
    return _ERRORS.get(status, Error)(message or _orbite.strerror(status), status, report)


# ---- enums and plain records --------------------------------------------------------------------


class Perm(enum.IntEnum):
    """What peers may do with a registered range."""

    LOCAL = 0  #: local requests only
    REMOTE_READ = 1  #: peers may READ
    REMOTE_WRITE = 3  #: peers may READ and WRITE


class Op(enum.IntEnum):
    READ = 0  #: remote -> local
    WRITE = 1  #: local -> remote


class Transport(enum.IntEnum):
    UNSPEC = 0  #: the best transport with a path to the peer
    TCP = 1
    RDMA = 2
    NVLINK = 3  #: CUDA IPC between device memory of processes on one host
    SHM = 4  #: host memory of processes on one host (local bytes from HostMemory(shared=True))


class Priority(enum.IntEnum):
    HIGH = 0
    MEDIUM = 1
    LOW = 2


class RemoteEffect(enum.IntEnum):
    NONE = 0  #: the failed span changed no peer byte
    UNKNOWN = 1  #: an attempted WRITE may have changed peer bytes


class NotifyState(enum.IntEnum):
    NONE = 0
    PENDING = 1
    DELIVERED = 2
    FAILED = 3
    SKIPPED = 4


class MemoryKind(enum.IntEnum):
    HOST = 0
    CUDA = 1


class Request(NamedTuple):
    """One transfer: ``length`` bytes between local address ``local`` (inside one of this engine's
    registrations) and ``remote`` (inside one of the peer's, which allows ``op``)."""

    op: Op
    local: int
    remote: int
    length: int
    transport: Transport = Transport.UNSPEC
    priority: Priority = Priority.HIGH

    @classmethod
    def read(cls, local: int, remote: int, length: int, transport: Transport = Transport.UNSPEC,
             priority: Priority = Priority.HIGH) -> "Request":
        """Copy ``length`` bytes of the peer at ``remote`` into local memory at ``local``."""
        return cls(Op.READ, local, remote, length, transport, priority)

    @classmethod
    def write(cls, local: int, remote: int, length: int, transport: Transport = Transport.UNSPEC,
              priority: Priority = Priority.HIGH) -> "Request":
        """Copy ``length`` bytes of local memory at ``local`` to the peer at ``remote``."""
        return cls(Op.WRITE, local, remote, length, transport, priority)


@dataclass(frozen=True)
class Failure:
    """The first failure of a batch and the span of requests it covers (``struct
    orb_transfer_failure``): the span runs from ``request_index`` through the last request that
    was attempted; requests after it were never attempted."""

    request_index: int
    affected_requests: int
    status: int
    remote_effect: RemoteEffect


@dataclass(frozen=True)
class BatchReport:
    """The state of a batch (every field of ``struct orb_batch_report``). ``completed_*`` count
    the prefix of requests that finished before the first failure."""

    done: bool
    status: int
    submitted_requests: int
    completed_requests: int
    completed_bytes: int
    has_failure: bool
    failure: Optional[Failure]
    notification: NotifyState
    notification_status: int
    local_drained: bool

    @classmethod
    def _of(cls, t: Tuple[int, ...]) -> "BatchReport":
        (done, status, submitted, completed, nbytes, has_failure, f_index, f_affected, f_status, f_effect,
         notification, notification_status, drained) = t
        failure = Failure(f_index, f_affected, f_status, RemoteEffect(f_effect)) if has_failure else None
        return cls(bool(done), status, submitted, completed, nbytes, bool(has_failure), failure,
                   NotifyState(notification), notification_status, bool(drained))


_KINDS = {int(k) for k in MemoryKind}


@dataclass(frozen=True)
class Region:
    """A region a source publishes (``struct orb_region_desc``)."""

    address: int
    length: int
    perm: Perm
    memory_kind: Union[MemoryKind, int]  #: an int for a kind this package does not name
    gpu_direct_routes: int


@dataclass(frozen=True)
class Notification:
    """A notification received by a source: the sender's epoch and the payload bytes."""

    sender: str
    data: bytes


HostMemory = _orbite.HostMemory
HostMemory.__doc__ = """HostMemory(size, align=0, shared=False)

Zeroed host memory owned by OrbiTE (``orb_host_memory_alloc``), usable through the buffer
protocol (``memoryview(m)``, ``numpy.frombuffer(m, ...)``) and registrable with
:meth:`Engine.register`. ``shared=True`` allocates a memory file a same-host peer's engine can be
handed (``orb_host_memory_alloc_shared``): the only local memory the same-host transport moves.
Attributes: ``address``, ``size``, ``shared``."""


# ---- helpers -----------------------------------------------------------------------------------


def _timeout_ns(timeout: Optional[float]) -> Optional[int]:
    """Seconds (int or float, >= 0) as nanoseconds; None (or infinity) waits without a deadline."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("a timeout is a number of seconds or None")
    if math.isnan(timeout) or timeout < 0:
        raise InvalidArgument("a timeout must be >= 0 seconds (got %r)" % (timeout,))
    if math.isinf(timeout):
        return None
    return int(timeout * 1_000_000_000)


def _json_of(what: str, value: Union[None, str, Mapping[str, Any]]) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    raise TypeError("%s must be a dict, a JSON string or None" % what)


def _payload(notify: Union[None, bytes, bytearray, memoryview, str]) -> Optional[Any]:
    if isinstance(notify, str):
        return notify.encode()
    return notify


def _cuda_interface(obj: Any) -> Optional[Mapping[str, Any]]:
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        return None
    if not isinstance(cai, Mapping):
        raise TypeError("__cuda_array_interface__ must be a dict")
    return cai


def _cuda_extent(cai: Mapping[str, Any]) -> Tuple[int, int]:
    """(pointer, length in bytes) of a C-contiguous CUDA array, refusing what cannot be registered."""
    data = cai.get("data")
    if not isinstance(data, tuple) or len(data) != 2 or not isinstance(data[0], int):
        raise InvalidArgument("__cuda_array_interface__: 'data' must be (pointer, read_only)")
    ptr, readonly = data
    if readonly:
        raise InvalidArgument("a read-only CUDA array cannot be registered: the engine writes registered memory")
    shape = cai.get("shape")
    typestr = cai.get("typestr")
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidArgument("__cuda_array_interface__: 'shape' must be a tuple of non-negative ints")
    if not isinstance(typestr, str) or len(typestr) < 3 or not typestr[2:].isdigit():
        raise InvalidArgument("__cuda_array_interface__: 'typestr' %r names no item size" % (typestr,))
    itemsize = int(typestr[2:])
    count = 1
    for d in shape:
        count *= d
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], itemsize
        for d in reversed(shape):
            expected.append(step)
            step *= d
        if tuple(reversed(expected)) != tuple(strides) and count > 1:
            raise InvalidArgument("the CUDA array is not C-contiguous: register a contiguous array")
    if cai.get("mask") is not None:
        raise InvalidArgument("a masked CUDA array cannot be registered")
    length = count * itemsize
    if length == 0 or ptr == 0:
        raise InvalidArgument("an empty CUDA array cannot be registered")
    return ptr, length


def _cuda_device(obj: Any, device: Optional[int]) -> int:
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise InvalidArgument("device must be a CUDA device ordinal >= 0")
        return device
    dl = getattr(obj, "__dlpack_device__", None)
    if dl is not None:
        kind, ordinal = dl()
        if int(kind) in (2, 13):  # kDLCUDA, kDLCUDAManaged
            return int(ordinal)
    return 0


# ---- engine ------------------------------------------------------------------------------------


class Registration:
    """A registered range. Its Python object (array, buffer) stays alive and its bytes valid
    until the engine lets go: after :meth:`unregister` once no admitted work uses it."""

    __slots__ = ("_engine", "_holder", "id", "address", "length", "perm", "kind", "_unregistered")

    def __init__(self, engine: "Engine", reg_id: int, address: int, length: int, perm: Perm, kind: MemoryKind,
                 holder: Any):
        self._engine = engine
        self._holder = holder
        self.id = reg_id
        self.address = address
        self.length = length
        self.perm = perm
        self.kind = kind
        self._unregistered = False

    def addr(self, offset: int = 0, length: int = 1) -> int:
        """The address of byte ``offset``, checked: ``[offset, offset + length)`` lies in the range."""
        if isinstance(offset, bool) or not isinstance(offset, int) or not isinstance(length, int):
            raise TypeError("offset and length are ints")
        if offset < 0 or length < 0 or offset + length > self.length:
            raise InvalidArgument("[%d, +%d) is outside the registration's %d bytes" % (offset, length, self.length))
        return self.address + offset

    def unregister(self) -> None:
        """Drop this registration (once: a second call is refused by the engine as NotFound)."""
        self._engine._c.unregister(self.id)
        self._unregistered = True

    @property
    def released(self) -> bool:
        """Whether the engine has let go of the bytes (and so of the Python object)."""
        if self._holder is None:
            return self._unregistered
        return _orbite.released(self._holder)

    def wait_released(self, timeout: Optional[float] = 5.0) -> bool:
        """Wait until the engine let go of the bytes (True), or the timeout passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while not self.released:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        _orbite.drain()
        return True

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._unregistered:
            try:
                self.unregister()
            except Closed:
                pass  # the engine's close let go of every registration

    def __repr__(self) -> str:
        return "Registration(id=%d, address=0x%x, length=%d, perm=%s, kind=%s)" % (
            self.id, self.address, self.length, self.perm.name, self.kind.name)


class Segment:
    """A proven connection to a peer engine (its source)."""

    __slots__ = ("_c", "engine", "endpoint", "epoch")

    def __init__(self, engine: "Engine", c: Any, endpoint: str, epoch: str):
        self._c = c
        self.engine = engine
        self.endpoint = endpoint
        self.epoch = epoch

    def describe(self, timeout: Optional[float] = 5.0) -> List[Region]:
        """The peer's remotely accessible registrations: a snapshot for information, not a
        permission (the source checks every request again)."""
        return [Region(a, n, Perm(p), MemoryKind(k) if k in _KINDS else k, g)
                for (a, n, p, k, g) in self._c.describe(_timeout_ns(timeout))]

    def close(self) -> None:
        """Drop this handle; batches still using the segment keep working."""
        self._c.close()

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Segment(endpoint=%r, epoch=%r)" % (self.endpoint, self.epoch)


def _outcome(result: Tuple[int, Tuple[int, ...], str], allow_running: bool = False) -> BatchReport:
    status, rep, message = result
    report = BatchReport._of(rep)
    if status == 0 or (allow_running and status == Status.EAGAIN):
        return report
    raise _error(status, message, report)


class Batch:
    """An asynchronous batch against one segment. Submit groups of requests, seal it (with an
    optional notification), then :meth:`poll`, :meth:`wait`, or ``await`` it. One thread at a
    time may use a batch (a second gets :class:`Busy`)."""

    __slots__ = ("_c", "segment")

    def __init__(self, c: Any, segment: Segment):
        self._c = c
        self.segment = segment

    def submit(self, requests: Sequence[Request]) -> None:
        """Submit a group of requests; they start at once. A group whose check fails is rejected
        whole (the exception says which request and why) and adds nothing."""
        self._c.submit(requests)

    def seal(self, notify: Union[None, bytes, bytearray, memoryview, str] = None) -> None:
        """No more groups. ``notify`` (at most NOTIFY_MAX bytes) reaches the source once every
        request completed, after the data."""
        self._c.seal(_payload(notify))

    def poll(self) -> BatchReport:
        """A snapshot, without waiting: ``report.done`` is False while the batch runs. A finished
        batch's failure is in ``report.status`` and ``report.failure`` (not raised)."""
        status, rep, message = self._c.poll()
        return BatchReport._of(rep)

    def wait(self, timeout: Optional[float] = None) -> BatchReport:
        """Wait for the sealed batch (GIL released). Returns its report on success; raises the
        failure's :class:`Error` (with ``.report``), or :class:`TimedOut` if it still runs."""
        return _outcome(self._c.wait(_timeout_ns(timeout)))

    async def wait_async(self, timeout: Optional[float] = None) -> BatchReport:
        """:meth:`wait` for ``asyncio``: the wait runs on the loop's executor in short slices, so
        the event loop never blocks and a cancelled await stops waiting within 0.1 s."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        if timeout is not None:
            _timeout_ns(timeout)  # checks it
        cancelled = threading.Event()

        def blocking() -> Tuple[int, Tuple[int, ...], str]:
            while True:
                left = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
                result = self._c.wait(int(left * 1_000_000_000))
                status, rep, _ = result
                still_running = status == Status.ETIMEDOUT and not rep[0]
                if not still_running or cancelled.is_set():
                    return result
                if deadline is not None and time.monotonic() >= deadline:
                    return result

        try:
            result = await loop.run_in_executor(None, blocking)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return _outcome(result)

    def __await__(self) -> Any:
        return self.wait_async().__await__()

    def free(self) -> None:
        """Free the batch (refused with Busy while it has live work)."""
        self._c.free()

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


class Engine:
    """An OrbiTE engine: a source serving its registrations to peers, and a requester of
    theirs.

    ``config`` is a dict (or JSON text) of engine settings, e.g. ``{"endpoint":
    "10.0.0.5:0", "tcp_stripes": 4}`` (docs/api-guide.md lists them); ``rdma`` a dict (or JSON)
    of RDMA settings, which turns the RDMA transport on where the host has it; ``metrics`` an
    address ("127.0.0.1:9464"; True for loopback on a free port) where the engine serves its
    metrics to Prometheus over HTTP (GET /metrics; :attr:`metrics_address` says where). Use it
    as a context manager, or call :meth:`close`.
    """

    def __init__(self, config: Union[None, str, Mapping[str, Any]] = None, *,
                 rdma: Union[None, str, Mapping[str, Any]] = None, metrics: Union[None, bool, str] = None):
        if metrics is True:
            metrics = ""
        elif metrics is False:
            metrics = None
        elif metrics is not None and not isinstance(metrics, str):
            raise TypeError("metrics is an address string, True or None")
        self._c = _orbite.Engine(_json_of("config", config), _json_of("rdma", rdma), metrics)

    @property
    def metrics_address(self) -> str:
        """Where the engine serves its metrics over HTTP, "host:port" (Unavailable without)."""
        return self._c.metrics_address()

    @property
    def endpoint(self) -> str:
        """The source's bound endpoint, "host:port" (Unavailable when enable_source is off)."""
        return self._c.endpoint()

    @property
    def epoch(self) -> str:
        """This engine's source epoch: 32 hex digits, handed to peers with the endpoint."""
        return self._c.epoch()

    def register(self, obj: Any, perm: Perm = Perm.LOCAL, *, device: Optional[int] = None) -> Registration:
        """Register the memory of ``obj``.

        * :class:`HostMemory`: registered as it is (shared memory stays shareable);
        * an object with ``__cuda_array_interface__`` (torch, cupy): device memory, on ``device``
          or the one ``__dlpack_device__()`` names (else 0);
        * anything with the buffer protocol (bytearray, memoryview, numpy arrays, mmap):
          writable and C-contiguous, since the engine writes registered memory (READs land in
          local ranges, peers' WRITEs in ranges that allow them); read-only buffers are refused.

        The object stays referenced, and its bytes valid, until the engine lets go of them (see
        :attr:`Registration.released`).
        """
        perm = Perm(perm)
        if isinstance(obj, HostMemory):
            reg_id, address, length = self._c.register_memory(obj, 0, obj.size, int(perm))
            return self._registration(reg_id, address, length, MemoryKind.HOST, None)
        cai = _cuda_interface(obj)
        if cai is not None:
            ptr, length = _cuda_extent(cai)
            reg_id, address, length, holder = self._c.register_cuda(ptr, length, _cuda_device(obj, device),
                                                                     int(perm), obj)
            return self._registration(reg_id, address, length, MemoryKind.CUDA, holder)
        reg_id, address, length, holder = self._c.register_buffer(obj, int(perm))
        return self._registration(reg_id, address, length, MemoryKind.HOST, holder)

    def _registration(self, reg_id: int, address: int, length: int, kind: MemoryKind, holder: Any) -> Registration:
        # The range's permission as the engine keeps it: registering a range again keeps the first.
        _, _, _, perm = self._c.resolve(address, length)
        return Registration(self, reg_id, address, length, Perm(perm), kind, holder)

    def unregister(self, registration: Registration) -> None:
        """Same as ``registration.unregister()``."""
        registration.unregister()

    def open_segment(self, endpoint: str, epoch: str, timeout: Optional[float] = 5.0) -> Segment:
        """Connect to the source at ``endpoint`` and prove it runs ``epoch`` (both strings, from
        that engine's owner). Raises StaleEpoch when it runs another."""
        if not isinstance(endpoint, str) or not isinstance(epoch, str):
            raise TypeError("endpoint and epoch are strings")
        c = self._c.open_segment(endpoint, epoch, _timeout_ns(timeout))
        return Segment(self, c, endpoint, epoch)

    def submit_and_wait(self, segment: Segment, requests: Sequence[Request], *, timeout: Optional[float] = None,
                        notify: Union[None, bytes, bytearray, memoryview, str] = None) -> BatchReport:
        """Run ``requests`` and deliver ``notify`` (GIL released). Returns the report; raises the
        failure's :class:`Error` with ``.report`` otherwise. Without a timeout a dead peer still
        ends the wait (io_timeout_s)."""
        return _outcome(self._c.submit_and_wait(segment._c, requests, _payload(notify), _timeout_ns(timeout)))

    def batch(self, segment: Segment) -> Batch:
        """An empty asynchronous batch against ``segment``."""
        return Batch(self._c.open_batch(segment._c), segment)

    def submit(self, segment: Segment, requests: Sequence[Request], *,
               notify: Union[None, bytes, bytearray, memoryview, str] = None) -> Batch:
        """Open a batch, submit ``requests`` as one group and seal it: a running :class:`Batch`."""
        b = self.batch(segment)
        b.submit(requests)  # a rejected group adds nothing: the batch is dropped with no work
        b.seal(notify)
        return b

    def poll_notifications(self, max: int = 64) -> List[Notification]:
        """Up to ``max`` queued notifications, oldest first; never blocks."""
        if isinstance(max, bool) or not isinstance(max, int):
            raise TypeError("max is an int")
        return [Notification(sender, data) for (sender, data) in self._c.poll_notifications(max)]

    def rdma_stats(self) -> dict:
        """The RDMA transport's counters (Unavailable when the engine runs none)."""
        return self._c.rdma_stats()

    def rdma_nic_load(self) -> List[dict]:
        """Each rail's NIC as the selector sees it (Unavailable without RDMA)."""
        return self._c.rdma_nic_load()

    def metrics(self) -> dict:
        """The engine's counters and gauges (orb_engine_metrics_json): transfers by transport
        and op on both sides, failures by status, the batch latency histogram, RDMA counters and
        NIC load, CUDA's retained resources. Cheap enough to read many times a second."""
        return json.loads(self._c.metrics_json())

    def close_source(self) -> None:
        """Stop serving peers; work already admitted finishes."""
        self._c.close_direction(True)

    def close_requester(self) -> None:
        """Refuse new batches and segments; work already submitted continues."""
        self._c.close_direction(False)

    def close(self, timeout: Optional[float] = 10.0) -> None:
        """Fence both directions, wait up to ``timeout`` for work to drain, then stop. Raises
        Unquiesced if work still touched memory at the deadline (call again to keep waiting)."""
        self._c.close(_timeout_ns(timeout))

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        try:
            return "Engine(endpoint=%r, epoch=%r)" % (self.endpoint, self.epoch)
        except Error:
            return "Engine(requester only)"


# ---- process-wide ------------------------------------------------------------------------------

_LEVELS = {"error": 0, "warn": 1, "info": 2, "debug": 3, "trace": 4}


def set_log_level(level: Union[int, str]) -> None:
    """The most verbose log level emitted: "error", "warn", "info", "debug", "trace" (or 0..4)."""
    if isinstance(level, str):
        if level not in _LEVELS:
            raise InvalidArgument("log level %r is not one of %s" % (level, ", ".join(_LEVELS)))
        level = _LEVELS[level]
    _orbite.set_log_level(level)


def get_log_level() -> str:
    """The current log level's name."""
    value = _orbite.get_log_level()
    return next(name for name, v in _LEVELS.items() if v == value)


def cuda_retained_resources() -> dict:
    """What failed CUDA cleanup kept in this process (all zero when none)."""
    return _orbite.cuda_retained()
