#!/usr/bin/env python3
"""Regenerate tests/hproto/corpus/: seed inputs for the helper protocol fuzz target and the
fuzz_hproto_replay test.

Datagrams are built here from the byte layout in docs/helper-protocol.md, independently of the C
codec. Files named valid-* hold well-formed datagrams, bad-* malformed ones that every decoder must
reject, and edge-* boundary cases. Run from anywhere: python3 tests/hproto/gen_corpus.py
Files whose names start with crash- are inputs the fuzzer once found; this script leaves them alone.
"""
import os
import sys
import struct

MAGIC = 0x4F524248  # the bytes "HBRO"
VERSION = 1
(HELLO, HELLO_REPLY, INVENTORY, INVENTORY_REPLY, POLICY, POLICY_REPLY, OPEN_DEVICE, OPEN_DEVICE_REPLY,
 PEERMEM_PROBE, PEERMEM_REPLY, SLOT_ATTACH, SLOT_REPLY, DEVX_VERIFY, DEVX_REPLY) = range(2, 16)
NIC, GPU, NUMA = 0, 1, 2
EPERM, ENOENT, EUNAVAILABLE = -4, -5, -3


def datagram(msg_type, body, seq=1, magic=MAGIC, version=VERSION, length=None):
    total = 16 + len(body) if length is None else length
    return struct.pack("<IHHII", magic, version, msg_type, total, seq) + body


def s(text):
    return struct.pack("<H", len(text)) + text


def status(value):
    return struct.pack("<i", value)


def path(hops):
    return bytes([len(hops)]) + b"".join(s(h) for h in hops)


def gid(raw, index, gid_type, is_ipv4):
    return raw + struct.pack("<HBB", index, gid_type, is_ipv4)


def port(num, state, link_layer, rate, gids):
    return struct.pack("<BBBBI", num, state, link_layer, len(gids), rate) + b"".join(gids)


def nic(nic_id=1, usable=1, name=b"mlx5_1", guid=0x0C42A10300AABBCC, pci=b"0000:3b:00.0", numa=0,
        hops=(b"pci0000:3a", b"0000:3b:00.0"), ports=None):
    if ports is None:
        v4 = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
        ports = [port(1, 4, 2, 100000, [gid(v4, 3, 2, 1)])]
    return (struct.pack("<BB", nic_id, usable) + s(name) + struct.pack("<Q", guid) + s(pci) +
            struct.pack("<i", numa) + path(list(hops)) + bytes([len(ports)]) + b"".join(ports))


def gpu(ordinal=0, pci=b"0000:1a:00.0", numa=1, hops=()):
    return struct.pack("<I", ordinal) + s(pci) + struct.pack("<i", numa) + path(list(hops))


def numa_node(node_id=1, distances=(21, 10)):
    return struct.pack("<iB", node_id, len(distances)) + bytes(distances)


def inv_reply(item, total=2):
    return status(0) + struct.pack("<I", total) + item


def policy(slots=(b"kv", b"rank.0-a"), transports=3, routes=1, nslots=None):
    n = len(slots) if nslots is None else nslots
    return (status(0) + struct.pack("<QQIIQIII", 5, 3, transports, routes, 1 << 30, 16, 256, n) +
            b"".join(s(x) for x in slots))


def devx(name=b"mlx5_0", obj_handle=0x12345, key=0x1234ABCD, qpn=0x101, addr=0x7F0000001000, length=0x10000,
         access=1):
    return s(name) + struct.pack("<IIIQQI", obj_handle, key, qpn, addr, length, access)


def full_nic():
    ports = []
    for p in range(4):
        gids = [gid(bytes([p * 16 + g]) + b"\xfe" * 15, 65535 - g, g % 3, g % 2) for g in range(16)]
        ports.append(port(p + 1, 5, 1, 0xFFFFFFFF, gids))
    hops = [b"pci0000000:00:0"] + [b"%07x:00:1f.7" % i for i in range(1, 16)]
    return nic(63, 1, b"n" * 63, 2**64 - 1, b"fffffff:ff:1f.7", 65535, hops, ports)


def corpus():
    hello = datagram(HELLO, struct.pack("<I", 1))
    return {
        # well-formed datagrams of every type
        "valid-hello": hello,
        "valid-hello-reply": datagram(HELLO_REPLY, status(0) + struct.pack("<IIII", 1, 1000, 1001, 1 << 13)),
        "valid-hello-reply-eperm": datagram(HELLO_REPLY, status(EPERM)),
        "valid-inventory": datagram(INVENTORY, struct.pack("<BxxxI", GPU, 3), seq=2),
        "valid-inventory-reply-nic": datagram(INVENTORY_REPLY, inv_reply(nic()), seq=3),
        "valid-inventory-reply-gpu": datagram(INVENTORY_REPLY, inv_reply(gpu(), total=1), seq=4),
        "valid-inventory-reply-numa": datagram(INVENTORY_REPLY, inv_reply(numa_node()), seq=5),
        "valid-inventory-reply-enoent": datagram(INVENTORY_REPLY, status(ENOENT), seq=6),
        "valid-policy": datagram(POLICY, b"", seq=7),
        "valid-policy-reply": datagram(POLICY_REPLY, policy(), seq=7),
        "valid-open-device": datagram(OPEN_DEVICE, s(b"mlx5_0"), seq=8),
        "valid-open-device-reply": datagram(OPEN_DEVICE_REPLY, status(0) + struct.pack("<I", 1), seq=8),
        "valid-peermem-probe": datagram(PEERMEM_PROBE, b"", seq=9),
        "valid-peermem-reply": datagram(PEERMEM_REPLY, status(0) + struct.pack("<I", 5), seq=9),
        "valid-slot-attach": datagram(SLOT_ATTACH, s(b"kv") + struct.pack("<Q", 1000000), seq=10),
        "valid-slot-reply": datagram(SLOT_REPLY, status(0) + struct.pack("<I", 1), seq=10),
        "valid-devx-verify": datagram(DEVX_VERIFY, devx(), seq=0x01020304),
        "valid-devx-reply-unavailable": datagram(DEVX_REPLY, status(EUNAVAILABLE), seq=0x01020304),
        # boundaries that are still valid
        "edge-inventory-reply-full-nic": datagram(INVENTORY_REPLY, inv_reply(full_nic(), total=64)),
        "edge-policy-reply-16-slots": datagram(POLICY_REPLY, policy([bytes([97 + i]) * 64 for i in range(16)])),
        "edge-nic-unusable-unnamed": datagram(INVENTORY_REPLY, inv_reply(nic(usable=0, name=b"", pci=b"", numa=-1,
                                                                               hops=(), ports=[]))),
        # header faults
        "bad-short-header": hello[:10],
        "bad-magic": datagram(HELLO, struct.pack("<I", 1), magic=0x4F524249),
        "bad-version": datagram(HELLO, struct.pack("<I", 1), version=2),
        "bad-type-16": datagram(16, status(0)),
        "bad-length-field": datagram(HELLO, struct.pack("<I", 1), length=21),
        "bad-trailing": datagram(OPEN_DEVICE, s(b"mlx5_0") + b"\0"),
        # body faults
        "bad-name-dotdot": datagram(OPEN_DEVICE, s(b"..")),
        "bad-name-slash": datagram(SLOT_ATTACH, s(b"../kv") + struct.pack("<Q", 1)),
        "bad-name-65": datagram(DEVX_VERIFY, devx(name=b"d" * 65)),
        "bad-name-nul": datagram(INVENTORY_REPLY, inv_reply(nic(name=b"mlx\x005"))),
        "bad-nic-ports-5": datagram(INVENTORY_REPLY, inv_reply(nic(ports=[port(1, 4, 1, 0, [])] * 5))),
        "bad-policy-nslots": datagram(POLICY_REPLY, policy(nslots=3)),
        "bad-devx-access": datagram(DEVX_VERIFY, devx(access=3)),
        "bad-devx-no-handle": datagram(DEVX_VERIFY, s(b"mlx5_0") + struct.pack("<IIQQI", 0x1234ABCD, 0x101,
                                                                               0x7F0000001000, 0x10000, 1)),
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "util"))
    from corpus_writer import write_corpus
    write_corpus(os.path.join(here, "corpus"), corpus())


if __name__ == "__main__":
    main()
