#!/usr/bin/env python3
"""Regenerate tests/wire/corpus/: seed inputs for the wire fuzz target and the fuzz_wire_replay test.

Frames are built here from the byte layout in docs/wire-protocol.md, independently of the C codec.
Files named valid-* hold well-formed frames, bad-* malformed ones that a decoder must reject, and
edge-* boundary cases. Run from anywhere: python3 tests/wire/gen_corpus.py
Files whose names start with crash- are inputs the fuzzer once found; this script leaves them alone.
"""
import os
import sys
import struct

MAGIC = b"ORBT"
VERSION = 5
HELLO, HELLO_OK, ERROR, DESCRIBE_REQ, DESCRIBE_RESP = 1, 2, 3, 4, 5
READ_REQ, READ_RESP, WRITE_REQ, WRITE_RESP, NOTIFY, NOTIFY_RESP = 6, 7, 8, 9, 10, 11
CONTROL_REQ, CONTROL_RESP = 12, 13
PERM_READ, PERM_WRITE = 1, 3
MAX_PAYLOAD = 64 << 20

EPOCH_A = bytes(range(16))
EPOCH_B = bytes(range(0xF0, 0x100))


def header(msg_type, body_len, tag, magic=MAGIC, version=VERSION, flags=0, reserved=0):
    return magic + struct.pack("<BBHIIQ", version, msg_type, flags, body_len, reserved, tag)


def frame(msg_type, body, tag, **kw):
    return header(msg_type, len(body), tag, **kw) + body


def hello(role=1, stripe=0):
    return EPOCH_A + EPOCH_B + struct.pack("<II", role, stripe)


def hello_ok(max_payload=1 << 20):
    return EPOCH_B + struct.pack("<I", max_payload)


def error(status, text, text_len=None, flags=0):
    return struct.pack("<iHH", status, flags, len(text) if text_len is None else text_len) + text


def regions(items, count=None, reserved=0):
    body = struct.pack("<II", len(items) if count is None else count, reserved)
    for item in items:
        addr, length, perm = item[:3]
        kind = item[3] if len(item) > 3 else 0
        routes = item[4] if len(item) > 4 else 0
        zero = item[5] if len(item) > 5 else 0
        body += struct.pack("<QQIBBH", addr, length, perm, kind, routes, zero)
    return body


def xfer(addr, length):
    """A READ_RESP body."""
    return struct.pack("<QQ", addr, length)


def xreq(addr, length, req_addr=None, req_length=None):
    """A READ_REQ / WRITE_REQ body: the piece, then the whole request (by default the piece)."""
    return struct.pack("<QQQQ", addr, length, addr if req_addr is None else req_addr,
                       length if req_length is None else req_length)


def control(data, transport=2, r8=0, r16=0):
    return struct.pack("<BBH", transport, r8, r16) + data


def notify(data, length=None):
    return struct.pack("<I", len(data) if length is None else length) + data


def corpus():
    read = frame(READ_REQ, xreq(0x1000, 4096), 7)
    two_regions = [(0x7F0000001000, 0x2000, PERM_READ), (0x7F0000100000, 0x10000, PERM_WRITE)]
    return {
        # well-formed frames of every type
        "valid-hello": frame(HELLO, hello(role=1, stripe=3), 0),
        "valid-hello-control": frame(HELLO, hello(role=0, stripe=0), 0),
        "valid-hello-ok": frame(HELLO_OK, hello_ok(), 0),
        "valid-error": frame(ERROR, error(-10, b"stale epoch"), 3),
        "valid-error-connection": frame(ERROR, error(-12, b"bad frame"), 0),
        "valid-describe-req": frame(DESCRIBE_REQ, b"", 1),
        "valid-describe-resp": frame(DESCRIBE_RESP, regions(two_regions), 1),
        "valid-describe-resp-empty": frame(DESCRIBE_RESP, regions([]), 2),
        "valid-read-req": read,
        "valid-read-resp": frame(READ_RESP, xfer(0x1000, 4096), 7),
        "valid-write-req": frame(WRITE_REQ, xreq(0x2000, MAX_PAYLOAD), 8),
        "valid-write-req-slice": frame(WRITE_REQ, xreq(0x12000, 0x10000, 0x2000, 0x40001), 8),
        "valid-read-req-slice": frame(READ_REQ, xreq(0x2000, 0x10000, 0x2000, 2**64 - 0x2000), 8),
        "valid-write-resp": frame(WRITE_RESP, b"", 8),
        "valid-notify": frame(NOTIFY, notify(b"layer 12 ready"), 9),
        "valid-notify-resp": frame(NOTIFY_RESP, b"", 9),
        "valid-control-req": frame(CONTROL_REQ, control(b"\x01grant"), 10),
        "valid-control-resp": frame(CONTROL_RESP, control(b"\x02ok"), 10),
        "edge-control-4096": frame(CONTROL_REQ, control(b"c" * 4096), 11),
        # boundaries that are still valid
        "edge-error-text-256": frame(ERROR, error(-1, b"e" * 256), 4),
        "edge-xfer-ends-at-max": frame(READ_REQ, xreq(2**64 - 1 - 4096, 4096), 5),
        "edge-notify-4096": frame(NOTIFY, notify(b"n" * 4096), 6),
        # header faults
        "bad-empty": b"",
        "bad-short-header": read[:10],
        "bad-magic": frame(READ_REQ, xreq(0x1000, 1), 7, magic=b"TBRO"),
        "bad-version": frame(READ_REQ, xreq(0x1000, 1), 7, version=1),
        "bad-version-1-layout": frame(READ_REQ, xfer(0x1000, 1), 7, version=1),
        "bad-version-2": frame(READ_REQ, xreq(0x1000, 1), 7, version=2),
        "bad-version-3": frame(READ_REQ, xreq(0x1000, 1), 7, version=3),
        "bad-type-0": header(0, 0, 1),
        "bad-type-14": header(14, 0, 1),
        "bad-type-255": header(255, 16, 1) + bytes(16),
        "bad-flags": frame(READ_REQ, xreq(0x1000, 1), 7, flags=0x8000),
        "bad-reserved": frame(READ_REQ, xreq(0x1000, 1), 7, reserved=1),
        "bad-hello-tag": frame(HELLO, hello(), 1),
        "bad-request-tag-0": frame(READ_REQ, xreq(0x1000, 1), 0),
        "bad-hello-body-len": header(HELLO, 39, 0) + hello()[:39],
        "bad-describe-len-step": header(DESCRIBE_RESP, 9, 1) + regions([]) + b"\0",
        "bad-describe-len-huge": header(DESCRIBE_RESP, 0xFFFFFFFF, 1) + regions([]),
        "bad-body-missing": read[:24] + read[24:30],
        "bad-trailing": read + b"\xaa\xbb",
        # body faults
        "bad-hello-role": frame(HELLO, hello(role=2), 0),
        "bad-hello-control-stripe": frame(HELLO, hello(role=0, stripe=1), 0),
        "bad-hello-stripe-64": frame(HELLO, hello(role=1, stripe=64), 0),
        "bad-hello-ok-payload": frame(HELLO_OK, hello_ok(4095), 0),
        "bad-error-status-0": frame(ERROR, error(0, b"ok?"), 3),
        "bad-error-flags": frame(ERROR, error(-1, b"flags", flags=2), 3),
        "valid-error-effect-unknown": frame(ERROR, error(-11, b"copy failed", flags=1), 3),
        "bad-error-text-len": frame(ERROR, error(-1, b"abc", text_len=4), 3),
        "bad-error-text-257": frame(ERROR, error(-1, b"x" * 257), 3),
        "bad-error-control-byte": frame(ERROR, error(-1, b"line\nbreak"), 3),
        "bad-describe-count-high": frame(DESCRIBE_RESP, regions(two_regions, count=3), 1),
        "bad-describe-count-low": frame(DESCRIBE_RESP, regions(two_regions, count=1), 1),
        "bad-describe-reserved": frame(DESCRIBE_RESP, regions(two_regions, reserved=1), 1),
        "bad-describe-perm": frame(DESCRIBE_RESP, regions([(0x1000, 1, 0)]), 1),
        "bad-describe-kind": frame(DESCRIBE_RESP, regions([(0x1000, 1, PERM_READ, 2)]), 1),
        "valid-describe-gpu-routes": frame(DESCRIBE_RESP, regions([(0x1000, 4096, PERM_READ, 1, 1),
                                                                   (0x3000, 4096, PERM_READ, 1, 2)]), 1),
        "bad-describe-routes-host": frame(DESCRIBE_RESP, regions([(0x1000, 1, PERM_READ, 0, 1)]), 1),
        "bad-describe-routes-unknown": frame(DESCRIBE_RESP, regions([(0x1000, 1, PERM_READ, 1, 4)]), 1),
        "bad-describe-region-reserved": frame(DESCRIBE_RESP, regions([(0x1000, 1, PERM_READ, 1, 0, 1)]), 1),
        "valid-describe-resp-cuda": frame(DESCRIBE_RESP, regions([(0xd000000000000000, 4096, PERM_READ, 1)]), 3),
        "bad-describe-overflow": frame(DESCRIBE_RESP, regions([(2**64 - 1, 1, PERM_READ)]), 1),
        "bad-xfer-length-0": frame(WRITE_REQ, xreq(0x1000, 0, 0x1000, 1), 7),
        "bad-xfer-length-max": frame(WRITE_REQ, xreq(0x1000, MAX_PAYLOAD + 1), 7),
        "bad-xfer-16-byte-request": frame(READ_REQ, xfer(0x1000, 4096), 7),
        "bad-xfer-before-request": frame(READ_REQ, xreq(0x1000, 16, 0x1001, 4096), 7),
        "bad-xfer-past-request": frame(WRITE_REQ, xreq(0x1ff1, 16, 0x1000, 4096), 7),
        "bad-xfer-request-empty": frame(WRITE_REQ, xreq(0x1000, 16, 0x1000, 0), 7),
        "bad-xfer-request-overflow": frame(READ_REQ, xreq(2**64 - 17, 16, 2**64 - 17, 17), 7),
        "bad-xfer-overflow": frame(READ_REQ, xreq(2**64 - 4096, 4097, 0, 2**64 - 1), 7),
        "bad-read-resp-32": frame(READ_RESP, xreq(0x1000, 4096), 7),
        "bad-notify-length-0": frame(NOTIFY, notify(b"", length=0), 9),
        "bad-notify-length": frame(NOTIFY, notify(b"abc", length=4), 9),
        "bad-control-empty": frame(CONTROL_REQ, control(b""), 10),
        "bad-control-tcp": frame(CONTROL_REQ, control(b"x", transport=1), 10),
        "bad-control-reserved": frame(CONTROL_RESP, control(b"x", r16=1), 10),
        "bad-control-4097": frame(CONTROL_REQ, control(b"c" * 4097), 11),
        "bad-control-tag-0": frame(CONTROL_REQ, control(b"x"), 0),
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "util"))
    from corpus_writer import write_corpus
    write_corpus(os.path.join(here, "corpus"), corpus())


if __name__ == "__main__":
    main()
