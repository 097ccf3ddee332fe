#!/usr/bin/env python3
"""Writes tests/rdma/ctrl_corpus/: valid and broken RDMA transport messages (lib/rdma/ctrl.h)."""
import os
import sys
import struct

V = 11
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


def pin(op=0, addr=0x7F0000001000, length=1 << 30, pad=b"\0" * 7):
    return prefix(7) + struct.pack("<QQB", 9, 0x55, op) + pad + struct.pack("<QQ", addr, length)


def pinned(status=0, pin_i=3, slot=24, gen=7, why=b"", n=None, pad=b"\0\0\0"):
    return prefix(8) + struct.pack("<iBBHB", status, pin_i, slot, gen, len(why) if n is None else n) + pad + why


def unpin(pin_i=3, gen=7, pad1=b"\0", pad4=b"\0\0\0\0"):
    return prefix(9) + struct.pack("<QB", 9, pin_i) + pad1 + struct.pack("<H", gen) + pad4


def grant_req(asks=None, n=None, pad=b"\0\0\0", **one):
    asks = [ask(**one)] if asks is None else asks
    return prefix(GRANT_REQ) + struct.pack("<QB", 9, len(asks) if n is None else n) + pad + b"".join(asks)


def granted(keys, n=None, target=0x7F0000001000):
    return struct.pack("<iB", 0, len(keys) if n is None else n) + b"\0\0\0" + struct.pack("<QQ", 3, 1) + \
        NONCE + struct.pack("<Q", target) + b"".join(struct.pack("<I", k) for k in keys)


def refused(status=-4, why=b"rdma: WRITE into a READ-only registration", n=None, lost=0, slot=0):
    return struct.pack("<iBBH", status, len(why) if n is None else n, slot, lost) + why


def grants(entries, n=None):
    return prefix(GRANT) + struct.pack("<B", len(entries) if n is None else n) + b"\0\0\0" + b"".join(entries)


def grant(keys, n=None, target=0x7F0000001000):
    return grants([granted(keys, n, target)])


def pgrant_req(qps=None, n=None, op=0, mask=1, addr=0x7F0000001000, length=4096, pin=0, gen=0, pad=b"\0\0\0"):
    qps = [rail()] if qps is None else qps
    return prefix(11) + struct.pack("<QQBBB", 9, 0x55, op, len(qps) if n is None else n, pin) + pad[:1] + \
        struct.pack("<H", gen) + pad[1:] + struct.pack("<IQQ", mask, addr, length) + b"".join(qps)


def pgranted(keys, n=None, target=0x7F0000001000, qp=None, kind=0):
    qp = rail() if qp is None else qp
    return prefix(12) + struct.pack("<iBB", 0, len(keys) if n is None else n, kind) + b"\0\0" + \
        struct.pack("<QQ", 3, 1) + NONCE + struct.pack("<Q", target) + \
        b"".join(struct.pack("<I", k) + qp for k in keys)


def prefused(status=-3, why=b"rdma: no protection domain", n=None, pad=b"\0\0\0"):
    return prefix(12) + struct.pack("<iB", status, len(why) if n is None else n) + pad + why


def binding(rail_i=0, op=0, rkey=0x1234, length=4096, rail_bytes=4096, magic=0x4242524F, zero=0):
    return struct.pack("<IBBH", magic, V, 1, rail_i) + bytes(range(16)) + bytes(range(16, 32)) + \
        struct.pack("<QQQQ", 7, 8, 9, 10) + NONCE + struct.pack("<QQIBIQI", 0x1000, length, rkey, op, 2,
                                                                rail_bytes, zero)


def ack(status=0, kind=2, statuses=None, count=None, zero=0):
    statuses = [status] if statuses is None else statuses
    entries = b"".join(struct.pack("<QQiI", 8 + i, 9 + i, st, zero) for i, st in enumerate(statuses))
    return struct.pack("<IBBH", 0x4142524F, V, kind, len(statuses) if count is None else count) + entries


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
        "valid-grant-req-pinned": grant_req([ask(pad=b"\3\7\0")]),
        "bad-grant-req-pin-17": grant_req([ask(pad=b"\x11\1\0")]),
        "bad-grant-req-pin-no-generation": grant_req([ask(pad=b"\3\0\0")]),
        "bad-grant-req-generation-no-pin": grant_req([ask(pad=b"\0\1\0")]),
        "valid-pin": pin(),
        "valid-pin-write": pin(op=1, addr=2**64 - 4097, length=4096),
        "bad-pin-op": pin(op=2),
        "bad-pin-pad": pin(pad=b"\0" * 6 + b"\1"),
        "bad-pin-length-0": pin(length=0),
        "bad-pin-overflow": pin(addr=2**64 - 10, length=11),
        "bad-pin-short": pin()[:-1],
        "valid-pinned": pinned(),
        "valid-pinned-direct": pinned(slot=0),
        "valid-pinned-refused": pinned(status=-5, pin_i=0, slot=0, gen=0, why=b"rdma: no such range"),
        "bad-pinned-pin-0": pinned(pin_i=0),
        "bad-pinned-pin-17": pinned(pin_i=17),
        "bad-pinned-generation-0": pinned(gen=0),
        "bad-pinned-slot-small": pinned(slot=11),
        "bad-pinned-cause-held": pinned(why=b"x"),
        "bad-pinned-refused-pin": pinned(status=-5, pin_i=1, slot=0, gen=0),
        "bad-pinned-why-short": pinned(status=-5, pin_i=0, slot=0, gen=0, why=b"ab", n=3),
        "bad-pinned-pad": pinned(pad=b"\0\1\0"),
        "valid-unpin": unpin(),
        "bad-unpin-pin-0": unpin(pin_i=0),
        "bad-unpin-generation-0": unpin(gen=0),
        "bad-unpin-pad": unpin(pad4=b"\0\0\0\1"),
        "valid-unpinned": prefix(10) + struct.pack("<iI", 0, 0),
        "valid-unpinned-error": prefix(10) + struct.pack("<iI", -5, 0),
        "bad-unpinned-status": prefix(10) + struct.pack("<iI", 1, 0),
        "bad-unpinned-pad": prefix(10) + struct.pack("<iI", 0, 1),
        "valid-grants-slot": grants([refused(-8, b"rdma: staged in slots of 16 MiB", slot=24), granted([9])]),
        "valid-grants-slot-bounds": grants([refused(-8, b"", slot=12), refused(-8, b"", slot=40)]),
        "bad-grants-slot-not-eresource": grants([refused(-16, b"", slot=24)]),
        "bad-grants-slot-small": grants([refused(-8, b"", slot=11)]),
        "bad-grants-slot-large": grants([refused(-8, b"", slot=41)]),
        "bad-grants-slot-granted": grants([granted([7])[:5] + b"\x18" + granted([7])[6:]]),
        "bad-grants-lost-qps-not-epeer": grants([refused(-16, b"", lost=0x2)]),
        "bad-grants-lost-qps-granted": grants([granted([7])[:6] + b"\1\0" + granted([7])[8:]]),
        "valid-grants-private": grants([refused(-3, b"rdma: device memory", slot=255), granted([9])]),
        "bad-grants-private-not-eunavailable": grants([refused(-8, b"", slot=255)]),
        "bad-grants-hint-254": grants([refused(-3, b"", slot=254)]),
        "valid-pgrant-req": pgrant_req(),
        "valid-pgrant-req-write-2": pgrant_req([rail(), rail(qpn=18)], op=1, mask=0x5),
        "valid-pgrant-req-16": pgrant_req([rail(qpn=i + 1) for i in range(16)], mask=0xFFFF),
        "bad-pgrant-req-count": pgrant_req([rail(), rail(qpn=18)], mask=0x1),
        "bad-pgrant-req-count-short": pgrant_req([rail()], n=2, mask=0x3),
        "bad-pgrant-req-op": pgrant_req(op=2),
        "bad-pgrant-req-pad": pgrant_req(pad=b"\0\0\1"),
        "bad-pgrant-req-pad-pin": pgrant_req(pad=b"\1\0\0"),
        "valid-pgrant-req-pinned": pgrant_req(pin=16, gen=0xFFFF),
        "bad-pgrant-req-pin-17": pgrant_req(pin=17, gen=1),
        "bad-pgrant-req-pin-no-generation": pgrant_req(pin=3),
        "bad-pgrant-req-generation-no-pin": pgrant_req(gen=3),
        "bad-pgrant-req-length-0": pgrant_req(length=0),
        "bad-pgrant-req-overflow": pgrant_req(addr=2**64 - 10, length=11),
        "bad-pgrant-req-qpn-0": pgrant_req([rail(qpn=0)]),
        "bad-pgrant-req-nic": pgrant_req([rail(nic=1)]),
        "bad-pgrant-req-trailing": pgrant_req() + b"\0",
        "valid-pgrant": pgranted([0x1234]),
        "valid-pgrant-16": pgranted([i + 1 for i in range(16)]),
        "valid-pgrant-windows": pgranted([0x1234, 0x5678], kind=1),
        "bad-pgrant-kind-2": pgranted([0x1234], kind=2),
        "valid-pgrant-refused-slot": prefused(-8, b"rdma: staged in slots", pad=b"\x14\0\0"),
        "bad-pgrant-refused-slot-status": prefused(-3, b"rdma: staged", pad=b"\x14\0\0"),
        "bad-pgrant-refused-slot-small": prefused(-8, b"rdma: staged", pad=b"\x0b\0\0"),
        "valid-pgrant-refused": prefused(),
        "valid-pgrant-refused-no-cause": prefused(-16, b""),
        "bad-pgrant-keys-0": pgranted([], n=0),
        "bad-pgrant-keys-17": pgranted([i + 1 for i in range(17)]),
        "bad-pgrant-key-0": pgranted([5, 0]),
        "bad-pgrant-count-short": pgranted([5], n=2),
        "bad-pgrant-mtu": pgranted([5], qp=rail(mtu=6)),
        "bad-pgrant-trailing": pgranted([5]) + b"\0",
        "bad-pgrant-refused-pad": prefused(pad=b"\0\0\1"),
        "bad-pgrant-refused-pad-2": prefused(pad=b"\0\1\0"),
        "bad-pgrant-refused-status": prefused(-99),
        "bad-pgrant-refused-why-binary": prefused(why=b"a\x02b"),
        "bad-pgrant-refused-why-short": prefused(why=b"abc", n=4),
        "bad-pgrant-refused-trailing": prefused(why=b"abc", n=2),
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
        "valid-ack-8": ack(statuses=[0, -4, 0, -3, 0, 0, -11, 0]),
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
        "bad-grant-req-pad": grant_req(pad=b"\1\0\0"),
        "bad-grant-req-mask-0": grant_req(mask=0),
        "bad-grant-req-mask-high": grant_req(mask=1 << 16),
        "bad-grant-req-length-0": grant_req(length=0),
        "bad-grant-req-overflow": grant_req(addr=2**64 - 10, length=11),
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
        "bad-ack-count-0": ack(count=0),
        "bad-ack-count-high": ack(statuses=[0, 0], count=3),
        "bad-ack-count-9": ack(statuses=[0] * 9),
        "bad-ack-pad": ack(statuses=[0, 0], zero=1),
        "bad-ack-status-second": ack(statuses=[0, 1]),
        "bad-ack-version-10": struct.pack("<IBBHQQiI", 0x4142524F, 10, 2, 0, 8, 9, 0, 0),
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "util"))
    from corpus_writer import write_corpus
    write_corpus(os.path.join(here, "ctrl_corpus"), corpus())


if __name__ == "__main__":
    main()
