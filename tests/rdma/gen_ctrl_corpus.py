#!/usr/bin/env python3
"""Writes tests/rdma/ctrl_corpus/: valid and broken RDMA transport messages (lib/rdma/ctrl.h)."""
import os
import sys
import struct

V = 7
CONNECT, CONNECT_OK, GRANT_REQ, GRANT = 1, 2, 3, 4
GID = bytes([0] * 10 + [0xFF, 0xFF, 10, 77, 1, 1])
NONCE = bytes(range(32))


def prefix(kind, version=V, r=0):
    return struct.pack("<BBH", kind, version, r)


def rail(nic=0, mtu=3, lid=0, qpn=17, psn=0x123456, gid=GID):
    return struct.pack("<BBHII", nic, mtu, lid, qpn, psn) + gid


def connect(kind, rails, n=None, incarnation=0x1122334455667788, pad=b"\0\1\0"):
    return prefix(kind) + struct.pack("<QB", incarnation, len(rails) if n is None else n) + pad + b"".join(rails)


def ask(op=0, mask=1, addr=0x7F0000001000, length=4096, pad=b"\0\0\0", request=0x55):
    return struct.pack("<QB", request, op) + pad + struct.pack("<IQQ", mask, addr, length)


def grant_req(asks=None, n=None, pad=b"\0\0\0", **one):
    asks = [ask(**one)] if asks is None else asks
    return prefix(GRANT_REQ) + struct.pack("<QB", 9, len(asks) if n is None else n) + pad + b"".join(asks)


def granted(keys, n=None, target=0x7F0000001000):
    return struct.pack("<iB", 0, len(keys) if n is None else n) + b"\0\0\0" + struct.pack("<QQ", 3, 1) + \
        NONCE + struct.pack("<Q", target) + b"".join(struct.pack("<I", k) for k in keys)


def refused(status=-4, why=b"rdma: WRITE into a READ-only registration", n=None, lost=0):
    return struct.pack("<iBBH", status, len(why) if n is None else n, 0, lost) + why


def grants(entries, n=None):
    return prefix(GRANT) + struct.pack("<B", len(entries) if n is None else n) + b"\0\0\0" + b"".join(entries)


def grant(keys, n=None, target=0x7F0000001000):
    return grants([granted(keys, n, target)])


def binding(rail_i=0, op=0, rkey=0x1234, length=4096, rail_bytes=4096, magic=0x4242524F, zero=0):
    return struct.pack("<IBBH", magic, V, 1, rail_i) + bytes(range(16)) + bytes(range(16, 32)) + \
        struct.pack("<QQQQ", 7, 8, 9, 10) + NONCE + struct.pack("<QQIBIQI", 0x1000, length, rkey, op, 2,
                                                                rail_bytes, zero)


def ack(status=0, kind=2):
    return struct.pack("<IBBHQQiI", 0x4142524F, V, kind, 0, 8, 9, status, 0)


def corpus():
    return {
        "valid-connect-1": connect(CONNECT, [rail()]),
        "valid-connect-ok-2": connect(CONNECT_OK, [rail(0), rail(1, mtu=5, qpn=0xFFFFFF)]),
        "valid-connect-16": connect(CONNECT, [rail(i % 64, qpn=i + 1) for i in range(16)]),
        "valid-connect-read-depth": connect(CONNECT_OK, [rail(0), rail(1)], pad=b"\x10\1\0"),
        "valid-connect-2-lanes": connect(CONNECT, [rail(i % 2, qpn=i + 1) for i in range(4)], pad=b"\0\2\0"),
        "valid-connect-16-lanes": connect(CONNECT_OK, [rail(0, qpn=i + 1) for i in range(16)], pad=b"\x08\x10\0"),
        "valid-connect-ok-unconnected": connect(CONNECT_OK, [rail(0), rail(0x81, qpn=18)]),
        "valid-grant-req": grant_req(),
        "valid-grant-req-write-rails": grant_req(op=1, mask=0x8001, addr=2**64 - 4097, length=4096),
        "valid-grant-req-16": grant_req([ask(request=i, op=i % 2, mask=1 << (i % 16)) for i in range(16)]),
        "valid-grants-mixed": grants([granted([7, 8]), refused(), refused(-16, b""), granted([9])]),
        "valid-grants-lost-qps": grants([refused(-11, b"rdma: queue pair 1 is failed", lost=0x2), granted([9])]),
        "bad-grants-lost-qps-not-epeer": grants([refused(-16, b"", lost=0x2)]),
        "bad-grants-lost-qps-granted": grants([granted([7])[:6] + b"\1\0" + granted([7])[8:]]),
        "valid-grant-1": grant([0x1234]),
        "valid-grant-16": grant([i + 1 for i in range(16)]),
        "valid-binding": binding(),
        "valid-ack": ack(),
        "valid-disconnect": prefix(5) + struct.pack("<Q", 0x1122334455667788),
        "bad-disconnect-short": prefix(5) + struct.pack("<I", 1),
        "valid-ping": prefix(6) + struct.pack("<Q", 0x8877665544332211),
        "bad-ping-short": prefix(6) + struct.pack("<I", 1),
        "bad-ping-trailing": prefix(6) + struct.pack("<QB", 1, 0),
        "valid-ack-error": ack(-4),
        "bad-empty": b"",
        "bad-prefix-version": prefix(CONNECT, version=V - 1) + b"\0" * 40,
        "bad-prefix-reserved": prefix(GRANT_REQ, r=1) + b"\0" * 40,
        "bad-connect-0-rails": connect(CONNECT, [], n=0),
        "bad-connect-17-rails": connect(CONNECT, [rail(qpn=i + 1) for i in range(17)]),
        "bad-connect-count-high": connect(CONNECT, [rail()], n=2),
        "bad-connect-pad": connect(CONNECT, [rail()], pad=b"\0\1\1"),
        "bad-connect-lanes-0": connect(CONNECT, [rail()], pad=b"\0\0\0"),
        "bad-connect-lanes-above": connect(CONNECT, [rail(0), rail(1)], pad=b"\0\3\0"),
        "bad-connect-lanes-indivisible": connect(CONNECT, [rail(qpn=i + 1) for i in range(3)], pad=b"\0\2\0"),
        "bad-connect-qpn-0": connect(CONNECT, [rail(qpn=0)]),
        "bad-connect-qpn-25-bits": connect(CONNECT, [rail(qpn=1 << 24)]),
        "bad-connect-mtu": connect(CONNECT, [rail(mtu=6)]),
        "bad-connect-nic-64": connect(CONNECT, [rail(nic=64)]),
        "bad-connect-nic-unconnected-64": connect(CONNECT_OK, [rail(nic=0xC0)]),
        "bad-connect-trailing": connect(CONNECT, [rail()]) + b"\0",
        "bad-grant-req-op": grant_req(op=2),
        "bad-grant-req-mask-0": grant_req(mask=0),
        "bad-grant-req-mask-high": grant_req(mask=1 << 16),
        "bad-grant-req-length-0": grant_req(length=0),
        "bad-grant-req-overflow": grant_req(addr=2**64 - 10, length=11),
        "bad-grant-req-pad": grant_req(pad=b"\1\0\0"),
        "bad-grant-keys-0": grant([], n=0),
        "bad-grant-count": grant([1, 2], n=3),
        "bad-grant-key-0": grant([5, 0]),
        "bad-grant-req-count-0": grant_req([], n=0),
        "bad-grant-req-count-17": grant_req([ask(request=i) for i in range(17)]),
        "bad-grant-req-count-short": grant_req([ask(), ask()], n=3),
        "bad-grants-count-0": grants([], n=0),
        "bad-grants-short": grants([granted([1])], n=2),
        "bad-grants-status-unknown": grants([refused(-99)]),
        "bad-grants-status-positive": grants([refused(5)]),
        "bad-grants-why-long": grants([refused(why=b"x" * 121)]),
        "bad-grants-why-binary": grants([refused(why=b"bad\x01byte")]),
        "bad-grants-why-short": grants([refused(why=b"abc", n=9)]),
        "bad-binding-short": binding()[:-1],
        "bad-binding-magic": binding(magic=0x4242524E),
        "bad-binding-rail": binding(rail_i=16),
        "bad-binding-key-0": binding(rkey=0),
        "bad-binding-bytes": binding(length=10, rail_bytes=11),
        "bad-binding-zero": binding(zero=1),
        "bad-ack-kind": ack(kind=1),
        "bad-ack-status": ack(status=1),
        "bad-ack-status-low": ack(status=-17),
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "util"))
    from corpus_writer import write_corpus
    write_corpus(os.path.join(here, "ctrl_corpus"), corpus())


if __name__ == "__main__":
    main()
