"""A source process for the binding's two-process tests, driven over its standard streams.

Started as ``python3 peer.py '<engine config JSON>'``. It registers two buffers filled with a
known pattern, a REMOTE_WRITE one (``rw``) and a REMOTE_READ one (``ro``), 8 MiB each, and prints one JSON line:
``{"endpoint", "epoch", "pid", "rw": [address, length], "ro": [address, length]}``. Then it
answers one line per command on standard input:

* ``get ADDRESS LENGTH``: the hex of those bytes of its memory;
* ``notifications``: a JSON list of [sender, hex payload] received so far;
* ``quit`` (or end of input): closes the engine and exits 0.
"""

import contextlib
import ctypes
import json
import sys

import orbite

RW_LEN = 8 << 20
RO_LEN = 8 << 20


def pattern(n: int, seed: int) -> bytearray:
    return bytearray((i * 131 + seed) & 0xFF for i in range(256)) * (n // 256)


def harness_access():
    """This process looks at its memory on command, after the requester (another process) saw
    its transfer acknowledged. That ordering runs through the other process and a pipe, which
    ThreadSanitizer cannot see: under it (its runtime preloaded), the look is excluded from race
    detection (only it: the library's threads are still checked). Elsewhere a no-op."""
    lib = ctypes.CDLL(None)
    try:
        names = ("AnnotateIgnoreReadsBegin", "AnnotateIgnoreReadsEnd")
        begin, end = (getattr(lib, n) for n in names)
    except AttributeError:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def ignored():
        begin(b"peer.py", 0)
        try:
            yield
        finally:
            end(b"peer.py", 0)

    return ignored()


def main() -> int:
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    engine = orbite.Engine(config)
    rw = pattern(RW_LEN, 1)
    ro = pattern(RO_LEN, 2)
    rw_reg = engine.register(rw, orbite.Perm.REMOTE_WRITE)
    ro_reg = engine.register(ro, orbite.Perm.REMOTE_READ)
    views = [(rw_reg.address, memoryview(rw)), (ro_reg.address, memoryview(ro))]
    import os

    print(json.dumps({"endpoint": engine.endpoint, "epoch": engine.epoch, "pid": os.getpid(),
                      "rw": [rw_reg.address, rw_reg.length], "ro": [ro_reg.address, ro_reg.length]}), flush=True)
    received = []
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "get":
            address, length = int(words[1]), int(words[2])
            for base, view in views:
                if base <= address and address + length <= base + len(view):
                    with harness_access():
                        data = bytes(view[address - base:address - base + length])
                    print(data.hex(), flush=True)
                    break
            else:
                print("outside", flush=True)
        elif words[0] == "notifications":
            received.extend([n.sender, n.data.hex()] for n in engine.poll_notifications(256))
            print(json.dumps(received), flush=True)
        elif words[0] == "quit":
            break
    engine.close(10.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
