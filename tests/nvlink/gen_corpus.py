#!/usr/bin/env python3
"""Writes tests/nvlink/corpus/: valid and broken NVLink transport messages (lib/nvlink/nvlink_msg.h)."""
import os
import struct
import sys

V = 2
HELLO, HELLO_OK, BEGIN, BEGIN_OK, END, END_OK, QUERY, QUERY_OK, FETCH, FETCH_OK = range(1, 11)
LEGACY, BY_FD = 1, 2
HANDLE = bytes(range(64))


def prefix(kind, version=V, r=0):
    return struct.pack("<BBH", kind, version, r)


def hello(kind=HELLO, ns=0x1234):
    return prefix(kind) + bytes(range(16, 32)) + struct.pack("<Q", ns)


def rng(op=0, addr=0xd000000000001000, length=4096, pad=b"\0" * 7):
    return struct.pack("<B", op) + pad + struct.pack("<QQ", addr, length)


def begin(kind=BEGIN, ranges=None, n=None, group=7, pad=b"\0" * 6):
    ranges = [rng()] if ranges is None else ranges
    return prefix(kind) + struct.pack("<QH", group, len(ranges) if n is None else n) + pad + b"".join(ranges)


def alloc(base=0xd000000000000000, size=1 << 20, handle=HANDLE, share=LEGACY, pad=b"\0" * 7):
    return struct.pack("<QQB", base, size, share) + pad + handle


def fd_handle(serial=3, zero=0):
    return bytes(range(100, 116)) + struct.pack("<QQ", serial, zero) + bytes(range(200, 232))


def fetch(idx=0, zero=0, token=bytes(range(200, 232))):
    return prefix(FETCH) + struct.pack("<II", idx, zero) + token


def fetch_ok(status=0, size=2 << 20, zero=0):
    return prefix(FETCH_OK) + struct.pack("<iIQ", status, zero, size)


def grant(status=0, idx=0, why=b"", why_len=None, pad=0):
    return struct.pack("<iHBB", status, idx, len(why) if why_len is None else why_len, pad) + why


def begin_ok(kind=BEGIN_OK, allocs=None, grants=None, group=7, n=None, na=None, pad=0):
    allocs = [alloc()] if allocs is None else allocs
    grants = [grant()] if grants is None else grants
    return (prefix(kind) + struct.pack("<QHHI", group, len(grants) if n is None else n,
                                       len(allocs) if na is None else na, pad) + b"".join(allocs) + b"".join(grants))


def end(kind=END, group=7):
    return prefix(kind) + struct.pack("<Q", group)


CASES = {
    "hello.bin": hello(),
    "hello-ok.bin": hello(HELLO_OK),
    "begin-one.bin": begin(),
    "begin-full.bin": begin(ranges=[rng(op=i % 2, addr=0x1000 * (i + 1)) for i in range(16)]),
    "query.bin": begin(QUERY),
    "begin-ok.bin": begin_ok(),
    "begin-ok-mixed.bin": begin_ok(allocs=[alloc(), alloc(base=0xd000000000100000)],
                                   grants=[grant(), grant(-4, 0, b"nvlink: not whole"), grant(0, 1)]),
    "query-ok.bin": begin_ok(QUERY_OK, allocs=[alloc(handle=bytes(64))]),
    "begin-ok-fd.bin": begin_ok(allocs=[alloc(handle=fd_handle(), share=BY_FD), alloc(base=0xd000000000100000)],
                                grants=[grant(0, 0), grant(0, 1)]),
    "fetch.bin": fetch(idx=3),
    "fetch-ok.bin": fetch_ok(),
    "fetch-ok-refused.bin": fetch_ok(status=-2, size=0),
    "bad-begin-ok-share-0.bin": begin_ok(allocs=[alloc(share=0)]),
    "bad-begin-ok-share-3.bin": begin_ok(allocs=[alloc(share=3)]),
    "bad-begin-ok-share-pad.bin": begin_ok(allocs=[alloc(pad=b"\0\0\0\1\0\0\0")]),
    "bad-fetch-index.bin": fetch(idx=16),
    "bad-fetch-pad.bin": fetch(zero=1),
    "bad-fetch-short.bin": fetch()[:-1],
    "bad-fetch-ok-size-0.bin": fetch_ok(size=0),
    "bad-fetch-ok-refused-size.bin": fetch_ok(status=-2),
    "bad-fetch-ok-status.bin": fetch_ok(status=3),
    "bad-fetch-ok-long.bin": fetch_ok() + b"\0",
    "end.bin": end(),
    "end-ok.bin": end(END_OK),
    "bad-short.bin": prefix(HELLO)[:3],
    "bad-version.bin": prefix(HELLO, version=9) + hello()[4:],
    "bad-reserved.bin": prefix(END, r=1) + struct.pack("<Q", 7),
    "bad-kind.bin": prefix(11) + struct.pack("<Q", 7),
    "bad-hello-long.bin": hello() + b"\0",
    "bad-begin-0.bin": begin(ranges=[], n=0),
    "bad-begin-17.bin": begin(ranges=[rng()] * 17),
    "bad-begin-count.bin": begin(ranges=[rng()], n=2),
    "bad-begin-group-0.bin": begin(group=0),
    "bad-begin-op.bin": begin(ranges=[rng(op=2)]),
    "bad-begin-pad.bin": begin(ranges=[rng(pad=b"\0\0\1\0\0\0\0")]),
    "bad-begin-empty.bin": begin(ranges=[rng(length=0)]),
    "bad-begin-wrap.bin": begin(ranges=[rng(addr=(1 << 64) - 16, length=32)]),
    "bad-begin-header-pad.bin": begin(pad=b"\0\0\0\0\1\0"),
    "bad-begin-ok-index.bin": begin_ok(grants=[grant(0, 1)]),
    "bad-begin-ok-allocs.bin": begin_ok(allocs=[alloc(), alloc()], grants=[grant()]),
    "bad-begin-ok-status.bin": begin_ok(grants=[grant(5)]),
    "bad-begin-ok-status-low.bin": begin_ok(grants=[grant(-17)]),
    "bad-begin-ok-refused-index.bin": begin_ok(grants=[grant(-4, 1)]),
    "bad-begin-ok-why-long.bin": begin_ok(grants=[grant(-4, 0, b"x" * 97)]),
    "bad-begin-ok-why-cut.bin": begin_ok(grants=[grant(-4, 0, b"abc", why_len=10)]),
    "bad-begin-ok-size-0.bin": begin_ok(allocs=[alloc(size=0)]),
    "bad-begin-ok-alloc-wrap.bin": begin_ok(allocs=[alloc(base=(1 << 64) - 4096, size=8192)]),
    "bad-begin-ok-truncated.bin": begin_ok()[:-3],
    "bad-begin-ok-pad.bin": begin_ok(pad=1),
    "bad-end-0.bin": end(group=0),
    "bad-end-long.bin": end() + b"\0",
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(CASES.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
