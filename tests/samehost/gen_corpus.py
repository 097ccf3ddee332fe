#!/usr/bin/env python3
"""Writes tests/samehost/corpus: a valid same-host HELLO and near misses of it."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")
BOOT = b"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def hello(magic=b"ORBSHM\x00\x01", version=1, flags=0, r0=0, boot=BOOT, r1=0, epoch=bytes(range(16)), pid=4242, r2=0):
    return magic + struct.pack("<HHI", version, flags, r0) + boot + struct.pack("<I", r1) + epoch + struct.pack("<II", pid, r2)


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = {
        "valid": hello(),
        "valid_big_pid": hello(pid=0xFFFFFFFF),
        "short": hello()[:79],
        "long": hello() + b"\x00",
        "empty": b"",
        "bad_magic": hello(magic=b"ORBSHM\x00\x02"),
        "version_2": hello(version=2),
        "flags": hello(flags=1),
        "reserved0": hello(r0=1),
        "reserved1": hello(r1=1),
        "reserved2": hello(r2=1),
        "pid_zero": hello(pid=0),
        "boot_upper": hello(boot=BOOT.upper()),
        "boot_no_dash": hello(boot=BOOT.replace(b"-", b"0")),
        "boot_nul": hello(boot=BOOT[:35] + b"\x00"),
    }
    for name, data in cases.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
