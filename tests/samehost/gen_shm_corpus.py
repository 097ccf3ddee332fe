#!/usr/bin/env python3
"""Writes tests/samehost/shm_corpus for fuzz_shm_msg: a valid input for every decoder of
lib/samehost/shm_msg.h and near misses of them. Each file is one selector byte (which decoder,
as tests/samehost/fuzz_shm_msg.c numbers them) and then that decoder's input."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "shm_corpus")
BOOT = b"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
VERSION = 1

# The harness's selectors.
(PICK_INFO, PICK_INFO_OK, PICK_QUERY, PICK_QUERY_OK, PICK_SETUP, PICK_SETUP_OK, PICK_MAP, PICK_MAP_OK,
 PICK_UNMAP, PICK_REQUEST, PICK_COMPLETION, PICK_PEEK) = range(12)

# Message kinds.
INFO, INFO_OK, QUERY, QUERY_OK = 1, 2, 3, 4
SETUP, SETUP_OK, MAP, MAP_OK, UNMAP = 16, 17, 18, 19, 20

RING_LINE, RING_ENTRY, PAGE = 64, 64, 4096


def ring_bytes(capacity):
    return 3 * RING_LINE + capacity * RING_ENTRY


def setup_bytes(rc, cc):
    off = (ring_bytes(rc) + RING_LINE - 1) // RING_LINE * RING_LINE
    return (off + ring_bytes(cc) + PAGE - 1) // PAGE * PAGE


def header(kind, version=VERSION, reserved=0):
    return struct.pack("<BBH", kind, version, reserved)


def info():
    return header(INFO) + struct.pack("<I", 0)


def info_ok(boot=BOOT, r1=0, ident=bytes(range(0xA0, 0xB0))):
    return header(INFO_OK) + struct.pack("<I", 0) + boot + struct.pack("<I", r1) + ident


def query(op=1, pad=b"\0\0\0", addr=0x1122334455667788, length=0x1000):
    return header(QUERY) + struct.pack("<B", op) + pad + struct.pack("<QQ", addr, length)


def query_ok(status=0, base=0x1122334455667000, length=0x10000):
    return header(QUERY_OK) + struct.pack("<iQQ", status, base, length)


def setup(rc=256, cc=64, r=0, nbytes=None):
    if nbytes is None:
        nbytes = setup_bytes(rc, cc)
    return header(SETUP) + struct.pack("<IIIQ", rc, cc, r, nbytes)


def setup_ok(status=0):
    return header(SETUP_OK) + struct.pack("<i", status)


def map_(map_id=7, writable=1, pad=bytes(7), file_offset=0x3000, length=2 << 20):
    return header(MAP) + struct.pack("<IB", map_id, writable) + pad + struct.pack("<QQ", file_offset, length)


def map_ok(map_id=7, status=0, r=0):
    return header(MAP_OK) + struct.pack("<IiI", map_id, status, r)


def unmap(map_id=0x01020304):
    return header(UNMAP) + struct.pack("<I", map_id)


def request(tag=0x0102030405060708, op=0, pad=b"\0\0\0", map_id=3, map_offset=0x1000, remote=0x7F0000001000,
            length=0x800, req_addr=0x7F0000000000, req_length=0x4000, tail=0):
    return (struct.pack("<QB", tag, op) + pad +
            struct.pack("<IQQQQQQ", map_id, map_offset, remote, length, req_addr, req_length, tail))


def completion(tag=0x1112131415161718, status=-4, effect=1, pad=b"\0\0\0", why=b"denied"):
    return struct.pack("<QiB", tag, status, effect) + pad + why.ljust(48, b"\0")


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = {
        # One valid input per decoder.
        "info": (PICK_INFO, info()),
        "info_ok": (PICK_INFO_OK, info_ok()),
        "query": (PICK_QUERY, query()),
        "query_ok": (PICK_QUERY_OK, query_ok()),
        "query_ok_refused": (PICK_QUERY_OK, query_ok(status=-5, base=0, length=0)),
        "setup": (PICK_SETUP, setup()),
        "setup_max": (PICK_SETUP, setup(rc=4096, cc=4096)),
        "setup_ok": (PICK_SETUP_OK, setup_ok(status=-7)),
        "map": (PICK_MAP, map_()),
        "map_ok": (PICK_MAP_OK, map_ok()),
        "unmap": (PICK_UNMAP, unmap()),
        "request": (PICK_REQUEST, request()),
        "completion": (PICK_COMPLETION, completion()),
        "completion_full_why": (PICK_COMPLETION, completion(status=0, effect=0, why=b"~" * 48)),
        "peek": (PICK_PEEK, setup()),
        # Near misses.
        "info_long": (PICK_INFO, info() + b"\0"),
        "info_ok_boot_upper": (PICK_INFO_OK, info_ok(boot=BOOT.upper())),
        "info_ok_reserved": (PICK_INFO_OK, info_ok(r1=1)),
        "query_op_7": (PICK_QUERY, query(op=7)),
        "query_wraps": (PICK_QUERY, query(addr=0xFFFFFFFFFFFFF001)),
        "query_ok_status_1": (PICK_QUERY_OK, query_ok(status=1)),
        "query_ok_refused_base": (PICK_QUERY_OK, query_ok(status=-5, length=0)),
        "setup_capacity_3": (PICK_SETUP, setup(rc=3, nbytes=0)),
        "setup_capacity_8192": (PICK_SETUP, setup(cc=8192, nbytes=0)),
        "setup_bytes_wrong": (PICK_SETUP, setup(nbytes=setup_bytes(256, 64) + 4096)),
        "setup_ok_status_17": (PICK_SETUP_OK, setup_ok(status=-17)),
        "map_writable_2": (PICK_MAP, map_(writable=2)),
        "map_length_odd": (PICK_MAP, map_(length=4097)),
        "map_too_big": (PICK_MAP, map_(length=(1 << 46) + 4096)),
        "map_offset_odd": (PICK_MAP, map_(file_offset=0x3800)),
        "map_id_4097": (PICK_MAP, map_(map_id=4097)),
        "map_ok_id_0": (PICK_MAP_OK, map_ok(map_id=0)),
        "unmap_id_0": (PICK_UNMAP, unmap(map_id=0)),
        "request_outside": (PICK_REQUEST, request(remote=0x7F0000003900)),
        "request_reserved": (PICK_REQUEST, request(tail=1)),
        "request_short": (PICK_REQUEST, request()[:63]),
        "completion_effect_2": (PICK_COMPLETION, completion(effect=2)),
        "completion_why_del": (PICK_COMPLETION, completion(why=b"den\x7fied")),
        "completion_why_after_nul": (PICK_COMPLETION, completion(why=b"denied\0x")),
        "peek_short": (PICK_PEEK, header(SETUP)[:3]),
    }
    for name, (pick, data) in cases.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(bytes([pick]) + data)


if __name__ == "__main__":
    main()
