"""READ/WRITE throughput through the Python binding, measured as orbite-bench measures it.

A forked source (this script with --mode source) registers a 256 MiB buffer; the requester
registers a mirror of the same size and moves blocks of it in batches (default 16 requests,
2 batches in flight), block i of the mirror to or from block i of the source, cycling through
the buffer. Throughput counts the batches submitted during the measured time over the time until
the last of them completed. Every cell is checked byte for byte afterwards (not timed): the
blocks it moved hold what they should, and the blocks a short cell never reached are unchanged.

    python3 python/benchmarks/bench.py [--op read|write|both] [-b 64K,1M] [--batch 16]
        [--depth 2] [-d SECONDS] [--warmup SECONDS] [--transport tcp|shm|unspec] [--buffer-size 256M]
        [--json]

Run with PYTHONPATH naming the built package (build/python) or with orbite installed.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import orbite
from orbite import Op, Perm, Request, Transport



def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def fill(view, seed):
    """Byte i of the view is (i % 256) * 131 + seed, modulo 256."""
    row = bytes((i * 131 + seed) & 0xFF for i in range(256))
    view[:] = (row * -(-len(view) // 256))[:len(view)]


def describe_mismatch(got, expected, block, before_seed):
    """Which blocks differ, and how: never written (still the pattern that was there before the
    cell) or other bytes."""
    untouched = bytearray(block)
    fill(memoryview(untouched), before_seed)
    bad, never = [], 0
    for b in range(len(got) // block):
        part = got[b * block:(b + 1) * block]
        if part != expected[b * block:(b + 1) * block]:
            bad.append(b)
            never += part == untouched
    first = bad[0] * block if bad else 0
    while bad and got[first] == expected[first]:
        first += 1
    return {"blocks": len(bad), "first_blocks": bad[:8], "never_written": never, "first_offset": first}


def source_main(config, BUFFER):
    engine = orbite.Engine(config)
    mem = orbite.HostMemory(BUFFER)
    fill(memoryview(mem), 1)
    reg = engine.register(mem, Perm.REMOTE_WRITE)
    print(json.dumps({"endpoint": engine.endpoint, "epoch": engine.epoch, "address": reg.address}), flush=True)
    sys.stdin.read()  # until the requester closes our input
    engine.close(10.0)


def run_cell(engine, seg, local, remote, op, block, batch, depth, transport, duration, warmup, BUFFER):
    slots = BUFFER // block
    # Whole batches of distinct blocks: the `depth` batches in flight never share a block.
    lists = [[Request(op, local.address + (first + i) * block, remote + (first + i) * block, block, transport)
              for i in range(batch)] for first in range(0, slots - batch + 1, batch)]
    assert len(lists) >= depth
    next_list = 0
    submitted = 0
    ring = []
    start = time.monotonic()
    measure_from = start + warmup
    measure_to = measure_from + duration
    measured = []  # batches submitted in the measured window
    while True:
        now = time.monotonic()
        while len(ring) < depth and now < measure_to:
            b = engine.submit(seg, lists[next_list])
            ring.append((b, now >= measure_from))
            next_list = (next_list + 1) % len(lists)
            submitted += 1
        if not ring:
            break
        b, counted = ring.pop(0)
        b.wait(60)
        b.free()
        if counted:
            measured.append(time.monotonic())
    if not measured:
        raise SystemExit("no batch was measured: raise --duration")
    seconds = measured[-1] - measure_from
    nbytes = len(measured) * batch * block
    # The lists go in order from block 0: a short cell covers a prefix of the buffer.
    covered = min(submitted, len(lists)) * batch * block
    return {"op": "read" if op == Op.READ else "write", "block_size": block, "batches": len(measured),
            "seconds": round(seconds, 6), "bytes": nbytes, "gbps": round(nbytes / seconds / 1e9, 6),
            "covered_bytes": covered}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["both", "source"], default="both")
    ap.add_argument("--op", choices=["read", "write", "both"], default="both")
    ap.add_argument("-b", "--block-size", default="64K,1M")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("-d", "--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--transport", choices=["tcp", "shm", "unspec"], default="tcp")
    ap.add_argument("--config", default="{}", help="engine configuration (JSON) of both engines")
    ap.add_argument("--buffer-size", default="256M",
                    help="the source's buffer and the mirror (default 256M, grown to depth x batch blocks)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    config = json.loads(args.config)
    # Room for every request in flight to have its own block, as orbite-bench makes it: two
    # in-flight READs into the same local bytes would race each other.
    largest = max(size_of(b) for b in args.block_size.split(","))
    BUFFER = max(size_of(args.buffer_size), args.depth * args.batch * largest)
    if args.mode == "source":
        source_main(config, BUFFER)
        return 0
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--mode", "source", "--config", args.config,
                             "--buffer-size", str(BUFFER)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    info = json.loads(proc.stdout.readline())
    transport = {"tcp": Transport.TCP, "shm": Transport.SHM, "unspec": Transport.UNSPEC}[args.transport]
    results = []
    with orbite.Engine(dict(config, enable_source=False)) as engine:
        local = orbite.HostMemory(BUFFER, shared=args.transport != "tcp")
        lview = memoryview(local)
        lreg = engine.register(local)
        with engine.open_segment(info["endpoint"], info["epoch"]) as seg:
            ops = [Op.READ, Op.WRITE] if args.op == "both" else [Op.READ if args.op == "read" else Op.WRITE]
            for op in ops:
                for block in [size_of(b) for b in args.block_size.split(",")]:
                    fill(lview, 2 if op == Op.WRITE else 0)
                    cell = run_cell(engine, seg, lreg, info["address"], op, block, args.batch, args.depth, transport,
                                    args.duration, args.warmup, BUFFER)
                    # Check the blocks the cell moved, and that it moved no other: READs brought
                    # the source's pattern (1) over ours (0); WRITEs left ours (2) over the
                    # source's (1), read back whole.
                    if op == Op.WRITE:
                        lview[:] = bytes(len(lview))
                        engine.submit_and_wait(seg, [Request.read(local.address, info["address"], BUFFER)])
                    moved, before = (2, 1) if op == Op.WRITE else (1, 0)
                    covered = cell["covered_bytes"]
                    expected = bytearray(BUFFER)
                    fill(memoryview(expected), before)
                    fill(memoryview(expected)[:covered], moved)
                    cell["verified"] = lview == expected
                    if not cell["verified"]:
                        cell["mismatch"] = describe_mismatch(lview, expected, block, before)
                        print("MISMATCH %s %d B: %s" % (cell["op"], block, cell["mismatch"]), file=sys.stderr)
                    if op == Op.WRITE:  # the source's pattern back for the next READ cells
                        fill(lview, 1)
                        engine.submit_and_wait(seg, [Request.write(local.address, info["address"], BUFFER)])
                    results.append(cell)
                    if not args.json:
                        print("%-5s %8d B  %8.3f GB/s  %s" % (cell["op"], block, cell["gbps"],
                                                              "verified" if cell["verified"] else "MISMATCH"))
        lreg.unregister()
    proc.stdin.close()
    proc.wait(30)
    ok = all(c["verified"] for c in results)
    if args.json:
        print(json.dumps({"tool": "orbite-bench.py", "batch": args.batch, "depth": args.depth,
                          "transport": args.transport, "results": results, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
