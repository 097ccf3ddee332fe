"""The Python binding against orbite-bench on the same cells, in alternating rounds.

    PYTHONPATH=build-release/python python3 python/benchmarks/compare.py \
        --orbite-bench build-release/tools/orbite-bench [--rounds 3] [-d 3] [-b 64K,1M]

Both measure READ and WRITE of each block size in batches of 16, two batches in flight, against
a forked source holding 256 MiB, over loopback TCP. Prints each round, the medians, and the
ratio Python / C for every cell against the target of 0.9 (the binding adds no copy). Exit 0
when every cell meets it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    if not doc.get("ok"):
        raise SystemExit("not ok: %s" % " ".join(cmd))
    return {(c["op"], c["block_size"]): c["gbps"] for c in doc["results"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orbite-bench", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-d", "--duration", default="3")
    ap.add_argument("-b", "--block-size", default="64K,1M")
    args = ap.parse_args()
    common = ["--op", "both", "-b", args.block_size, "-d", args.duration, "--json"]
    c_rounds, py_rounds = [], []
    for r in range(args.rounds):
        c_rounds.append(run([args.orbite_bench, "-q", "--batch", "16", "--depth", "2", "--no-verify"] + common))
        py_rounds.append(run([sys.executable, os.path.join(HERE, "bench.py"), "--batch", "16", "--depth", "2"]
                             + common))
        print("round %d: C %s | Python %s" % (r + 1, c_rounds[-1], py_rounds[-1]), file=sys.stderr)
    ok = True
    print("%-22s %10s %10s %7s  rounds (C / Python)" % ("cell", "C GB/s", "Py GB/s", "ratio"))
    for key in sorted(c_rounds[0]):
        c = statistics.median(x[key] for x in c_rounds)
        p = statistics.median(x[key] for x in py_rounds)
        ratio = p / c
        ok = ok and ratio >= 0.9
        print("%-22s %10.3f %10.3f %7.2f  %s / %s  %s" % (
            "%s %d" % key, c, p, ratio, " ".join("%.3f" % x[key] for x in c_rounds),
            " ".join("%.3f" % x[key] for x in py_rounds), "PASS" if ratio >= 0.9 else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
