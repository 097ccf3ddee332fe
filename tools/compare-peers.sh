#!/usr/bin/env bash
# compare-peers.sh: measure OrbiTE next to its peers on this host, in one run, and check the
# performance targets.
#
#   tools/compare-peers.sh [BUILD_DIR]        (default: build)
#
# Each round measures every figure once, peers and OrbiTE alternating, so that a change in the
# host's load touches both sides; the table shows the median over the rounds (ROUNDS, default 5)
# and the targets are checked on the medians. All traffic is on 127.0.0.1, or in memory shared
# by two processes of this host (the same-host transport).
#
# Figures of one round:
#   iperf3 4K     one TCP stream, 4 KiB writes                                  -> GB/s
#   iperf3 1M     one TCP stream, 1 MiB writes                                  -> GB/s, CPU s/GB
#   ucp_put_bw    UCX one-sided put, 1 MiB messages, UCX_TLS=tcp on lo          -> GB/s
#   pingpong      64-byte TCP round trip, blocking, TCP_NODELAY                 -> p50 us
#                 (and the polling variant, for information)
#   orbite 4K     READ and WRITE of 4 KiB blocks, batch 16, depth 2             -> GB/s
#   orbite 1M     READ and WRITE of 1 MiB blocks, batch 16, depth 2             -> GB/s, CPU s/GB
#   orbite lat    READ of 4 KiB, batch 1, depth 1                               -> p50 us
#   memcpy 1M     samehost_bench: memcpy of a 256 MiB buffer in 1 MiB blocks, one thread and
#                 two threads (best of 3 passes)                              -> GB/s
#   orbite shm 4K READ and WRITE of 4 KiB blocks, batch 16, depth 2, --transport shm -> GB/s
#   orbite shm 1M READ and WRITE of 1 MiB blocks, batch 16, depth 2, --transport shm -> GB/s
#   orbite shm lat READ of 4 KiB, batch 1, depth 1, --transport shm             -> p50 us
# The orbite rows without "shm" use loopback TCP (orbite-bench's default); the shm rows use the
# same-host transport, the requester's buffers allocated with orb_host_memory_alloc_shared.
# CPU s/GB is the CPU time (user + system) of both processes of the pair (iperf3 client and
# server; orbite-bench's requester and forked source) over the measured time, per 1e9 bytes.
#
# Targets (on the medians):
#   orbite READ/WRITE 4 KiB GB/s  >= 0.8 x iperf3 4K GB/s
#   orbite READ/WRITE 1 MiB GB/s  >= 0.9 x iperf3 1M GB/s
#   orbite READ/WRITE 1 MiB CPU s/GB <= 1.1 x iperf3 1M CPU s/GB
#   orbite READ/WRITE 1 MiB GB/s  >= 3 x ucp_put_bw GB/s
#   orbite READ 4 KiB p50 latency <= 2 x ping-pong p50 round trip (blocking)
#   orbite shm READ/WRITE 1 MiB GB/s  >= 0.8 x memcpy 1M GB/s (one thread)
#   orbite shm READ/WRITE 4 KiB GB/s  >= 5 x orbite (TCP) READ/WRITE 4 KiB GB/s of the same run
#   orbite shm READ 4 KiB batch-1 p50 latency <= 5 us
#
# Environment: ROUNDS (default 5), ORBITE_DURATION (s per orbite cell, default 5), IPERF_TIME
# (s per iperf3 run, default 5), UCX_ITERS (default 2000), COMPARE_KEEP_DIR (keep raw outputs
# there instead of a temporary directory). iperf3 and ucx-utils are installed with apt-get only
# when missing.
# Exit status: 0 all targets pass, 1 a target failed, 2 a measurement could not be made.
set -euo pipefail

BUILD_DIR=${1:-build}
ROUNDS=${ROUNDS:-5}
ORBITE_DURATION=${ORBITE_DURATION:-5}
IPERF_TIME=${IPERF_TIME:-5}
UCX_ITERS=${UCX_ITERS:-2000}
HOST=127.0.0.1

die() { echo "compare-peers: $*" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"

# ---- servers we start are killed on every exit path -------------------------------------
SERVER_PIDS=()
WORK_DIR=
cleanup() {
    local pid
    for pid in "${SERVER_PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${SERVER_PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n "$WORK_DIR" && -z "${COMPARE_KEEP_DIR:-}" ]]; then
        rm -rf "$WORK_DIR"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ -n "${COMPARE_KEEP_DIR:-}" ]]; then
    mkdir -p "$COMPARE_KEEP_DIR"
    WORK_DIR=$COMPARE_KEEP_DIR
else
    WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/compare-peers.XXXXXX")
fi

# ---- tools --------------------------------------------------------------------------------
command -v python3 >/dev/null || die "python3 is needed to read the JSON outputs"

install_missing() {
    local missing=()
    command -v iperf3 >/dev/null || missing+=(iperf3)
    command -v ucx_perftest >/dev/null || missing+=(ucx-utils)
    [[ ${#missing[@]} -eq 0 ]] && return 0
    local sudo=
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || die "missing ${missing[*]} and not root: install them first"
        sudo=sudo
    fi
    echo "compare-peers: installing ${missing[*]}" >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}" >&2 ||
        { $sudo apt-get update >&2 && $sudo env DEBIAN_FRONTEND=noninteractive \
              apt-get install -y --no-install-recommends "${missing[@]}" >&2; } ||
        die "cannot install ${missing[*]}"
}
install_missing

find_tool() {
    local name=$1 candidate
    for candidate in "$BUILD_DIR/tools/$name" "$BUILD_DIR/bin/$name" "$BUILD_DIR/$name" \
        "$BUILD_DIR/tests/$name"; do
        [[ -x "$candidate" ]] && { echo "$candidate"; return 0; }
    done
    return 1
}
if ! find_tool orbite-bench >/dev/null || ! find_tool orbite-pingpong >/dev/null ||
    ! find_tool samehost_bench >/dev/null; then
    [[ -f "$BUILD_DIR/CMakeCache.txt" ]] ||
        die "$BUILD_DIR is not a configured build directory (cmake -S . -B $BUILD_DIR)"
    cmake --build "$BUILD_DIR" --target orbite-bench orbite-pingpong samehost_bench -j2 >&2 ||
        die "building orbite-bench, orbite-pingpong and samehost_bench failed"
fi
BENCH=$(find_tool orbite-bench) || die "orbite-bench not found in $BUILD_DIR"
PINGPONG=$(find_tool orbite-pingpong) || die "orbite-pingpong not found in $BUILD_DIR"
SAMEHOST=$(find_tool samehost_bench) || die "samehost_bench not found in $BUILD_DIR (tests disabled?)"

# A free loopback port (the kernel picks it; a short race with other programs is possible).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Percent of CPU time idle over one second: other work on the host skews every figure, and the
# peers differently from OrbiTE, so the table says how quiet the host was around the run.
cpu_idle_percent() {
    local _cpu user nice sys idle iowait irq softirq steal total1 idle1 total2 idle2
    read -r _cpu user nice sys idle iowait irq softirq steal _ </proc/stat
    total1=$((user + nice + sys + idle + iowait + irq + softirq + steal)) idle1=$idle
    sleep 1
    read -r _cpu user nice sys idle iowait irq softirq steal _ </proc/stat
    total2=$((user + nice + sys + idle + iowait + irq + softirq + steal)) idle2=$idle
    echo $((100 * (idle2 - idle1) / (total2 - total1 > 0 ? total2 - total1 : 1)))
}
IDLE_BEFORE=$(cpu_idle_percent)

# ---- one measurement of each kind; every output lands in $WORK_DIR/<name>-<round>.* --------

# iperf3 ROUND LEN: one stream of LEN-byte writes, a fresh one-shot server each time.
run_iperf() {
    local round=$1 len=$2 port out="$WORK_DIR/iperf3-$2-$1.json"
    port=$(free_port)
    iperf3 -s -B "$HOST" -p "$port" -1 >"$WORK_DIR/iperf3-server-$len-$round.log" 2>&1 &
    local server=$!
    SERVER_PIDS+=("$server")
    local ok=0
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        sleep 0.3
        if timeout $((IPERF_TIME + 30)) iperf3 -c "$HOST" -p "$port" -l "$len" -t "$IPERF_TIME" -J \
            >"$out" 2>"$WORK_DIR/iperf3-client-$len-$round.log"; then
            ok=1
            break
        fi
        grep -q "Connection refused\|unable to connect" "$out" \
            "$WORK_DIR/iperf3-client-$len-$round.log" 2>/dev/null || break
    done
    wait "$server" 2>/dev/null || true
    [[ $ok -eq 1 ]] || die "iperf3 -l $len failed (see $out)"
}

run_ucx() {
    local round=$1 port out="$WORK_DIR/ucx-$1.csv"
    port=$(free_port)
    UCX_TLS=tcp UCX_NET_DEVICES=lo ucx_perftest -p "$port" >"$WORK_DIR/ucx-server-$round.log" 2>&1 &
    local server=$!
    SERVER_PIDS+=("$server")
    local ok=0
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        sleep 0.3
        if UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 ucx_perftest "$HOST" -p "$port" \
            -t ucp_put_bw -s 1048576 -n "$UCX_ITERS" -w 100 -v >"$out" 2>&1; then
            ok=1
            break
        fi
        grep -q "Connection refused\|connect() failed" "$out" || break
    done
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    [[ $ok -eq 1 ]] || die "ucx_perftest failed (see $out)"
}

run_pingpong() {
    local round=$1
    timeout 120 "$PINGPONG" --size 64 --iters 20000 --json >"$WORK_DIR/pingpong-$round.json" ||
        die "orbite-pingpong failed"
    timeout 120 "$PINGPONG" --size 64 --iters 20000 --spin --json \
        >"$WORK_DIR/pingpong-spin-$round.json" || die "orbite-pingpong --spin failed"
}

# samehost_bench ROUND: memcpy of a 256 MiB buffer (orbite-bench's working set) in 1 MiB blocks,
# one thread and two; the run also measures the other same-host mechanisms (not used here).
run_memcpy() {
    local round=$1
    timeout 300 "$SAMEHOST" --size 268435456 --rounds 3 --json >"$WORK_DIR/samehost-$round.json" ||
        die "samehost_bench failed (see $WORK_DIR/samehost-$round.json)"
}

bench_limit=$(python3 -c "print(int(4 * ($ORBITE_DURATION + 1) + 120))")
run_orbite() {
    local round=$1 name=$2
    shift 2
    timeout "$bench_limit" "$BENCH" "$@" --duration "$ORBITE_DURATION" --json --quiet \
        >"$WORK_DIR/orbite-$name-$round.json" ||
        die "orbite-bench $* failed (see $WORK_DIR/orbite-$name-$round.json)"
}

for round in $(seq 1 "$ROUNDS"); do
    echo "compare-peers: round $round of $ROUNDS" >&2
    run_iperf "$round" 4K
    run_orbite "$round" 4k --op both --block-size 4K
    run_orbite "$round" shm-4k --transport shm --op both --block-size 4K
    run_iperf "$round" 1M
    run_orbite "$round" 1m --op both --block-size 1M
    run_memcpy "$round"
    run_orbite "$round" shm-1m --transport shm --op both --block-size 1M
    run_pingpong "$round"
    run_orbite "$round" lat --op read --block-size 4K --batch 1 --depth 1
    run_orbite "$round" shm-lat --transport shm --op read --block-size 4K --batch 1 --depth 1
    run_ucx "$round"
done

IDLE_AFTER=$(cpu_idle_percent)
echo "host: $(nproc) CPUs, ${IDLE_BEFORE}% idle before the run, ${IDLE_AFTER}% after" \
     "(below ~90%: other work competed and the figures are unreliable)"

# ---- medians and targets ------------------------------------------------------------------
python3 - "$WORK_DIR" "$ROUNDS" <<'EOF'
import json, os, statistics, sys

work, rounds = sys.argv[1], int(sys.argv[2])

def load(name, r):
    with open(os.path.join(work, "%s-%d.json" % (name, r))) as f:
        return json.load(f)

def iperf(len_, r):
    e = load("iperf3-" + len_, r)["end"]
    s = e["sum_received"]
    cpu = e["cpu_utilization_percent"]
    gbps = s["bits_per_second"] / 8e9
    cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100.0 * s["seconds"]
    return gbps, cpu_s / (s["bytes"] / 1e9)

def orbite(name, r, op):
    d = load("orbite-" + name, r)
    for c in d["results"]:
        if c["op"] == op:
            if not c["ran"] or c["verified"] is False:
                sys.exit("compare-peers: orbite %s %s did not run cleanly in round %d" % (name, op, r))
            return c
    sys.exit("compare-peers: no %s cell in orbite-%s-%d.json" % (op, name, r))

def memcpy(r, mechanism):
    d = load("samehost", r)
    if not d.get("ok"):
        sys.exit("compare-peers: samehost_bench reported a failure in round %d" % r)
    for m in d["results"]:
        if m["mechanism"] == mechanism:
            return m["gbps_1m"]
    sys.exit("compare-peers: no %s result in samehost-%d.json" % (mechanism, r))

def ucx(r):
    bw = None
    with open(os.path.join(work, "ucx-%d.csv" % r)) as f:
        for line in f:
            cols = line.strip().split(",")
            if cols and cols[0].strip().isdigit() and len(cols) > 5:
                bw = float(cols[5])  # overall bandwidth, MiB/s
    if bw is None:
        sys.exit("compare-peers: no result line in ucx-%d.csv" % r)
    return bw * 1048576 / 1e9

series = {}
def add(key, value):
    series.setdefault(key, []).append(value)

for r in range(1, rounds + 1):
    g, _ = iperf("4K", r)
    add("iperf3 4K GB/s", g)
    g, c = iperf("1M", r)
    add("iperf3 1M GB/s", g)
    add("iperf3 1M CPU s/GB", c)
    add("ucp_put_bw 1M GB/s", ucx(r))
    add("ping-pong p50 us", load("pingpong", r)["rtt_p50_us"])
    add("ping-pong polling p50 us", load("pingpong-spin", r)["rtt_p50_us"])
    for op in ("read", "write"):
        add("orbite %s 4K GB/s" % op, orbite("4k", r, op)["gbps"])
        c1 = orbite("1m", r, op)
        add("orbite %s 1M GB/s" % op, c1["gbps"])
        add("orbite %s 1M CPU s/GB" % op, c1["cpu_s_per_gb"])
    add("orbite read 4K batch-1 p50 us", orbite("lat", r, "read")["latency_p50_us"])
    add("memcpy 1M GB/s", memcpy(r, "memcpy"))
    add("memcpy 1M 2 threads GB/s", memcpy(r, "memcpy x2"))
    for op in ("read", "write"):
        add("orbite shm %s 4K GB/s" % op, orbite("shm-4k", r, op)["gbps"])
        add("orbite shm %s 1M GB/s" % op, orbite("shm-1m", r, op)["gbps"])
    add("orbite shm read 4K batch-1 p50 us", orbite("shm-lat", r, "read")["latency_p50_us"])

med = {k: statistics.median(v) for k, v in series.items()}
print("%-32s %10s   %s" % ("figure", "median", "rounds"))
for k, v in series.items():
    print("%-32s %10.3f   %s" % (k, med[k], " ".join("%.3f" % x for x in v)))
print()

rows = [
    ("READ 4 KiB GB/s >= 0.8 x iperf3 4K", med["orbite read 4K GB/s"], 0.8 * med["iperf3 4K GB/s"], True),
    ("WRITE 4 KiB GB/s >= 0.8 x iperf3 4K", med["orbite write 4K GB/s"], 0.8 * med["iperf3 4K GB/s"], True),
    ("READ 1 MiB GB/s >= 0.9 x iperf3 1M", med["orbite read 1M GB/s"], 0.9 * med["iperf3 1M GB/s"], True),
    ("WRITE 1 MiB GB/s >= 0.9 x iperf3 1M", med["orbite write 1M GB/s"], 0.9 * med["iperf3 1M GB/s"], True),
    ("READ 1 MiB CPU s/GB <= 1.1 x iperf3 1M", med["orbite read 1M CPU s/GB"], 1.1 * med["iperf3 1M CPU s/GB"], False),
    ("WRITE 1 MiB CPU s/GB <= 1.1 x iperf3 1M", med["orbite write 1M CPU s/GB"], 1.1 * med["iperf3 1M CPU s/GB"], False),
    ("READ 1 MiB GB/s >= 3 x ucp_put_bw", med["orbite read 1M GB/s"], 3 * med["ucp_put_bw 1M GB/s"], True),
    ("WRITE 1 MiB GB/s >= 3 x ucp_put_bw", med["orbite write 1M GB/s"], 3 * med["ucp_put_bw 1M GB/s"], True),
    ("READ 4 KiB batch-1 p50 us <= 2 x ping-pong", med["orbite read 4K batch-1 p50 us"], 2 * med["ping-pong p50 us"], False),
    ("shm READ 1 MiB GB/s >= 0.8 x memcpy 1M", med["orbite shm read 1M GB/s"], 0.8 * med["memcpy 1M GB/s"], True),
    ("shm WRITE 1 MiB GB/s >= 0.8 x memcpy 1M", med["orbite shm write 1M GB/s"], 0.8 * med["memcpy 1M GB/s"], True),
    ("shm READ 4 KiB GB/s >= 5 x orbite 4K", med["orbite shm read 4K GB/s"], 5 * med["orbite read 4K GB/s"], True),
    ("shm WRITE 4 KiB GB/s >= 5 x orbite 4K", med["orbite shm write 4K GB/s"], 5 * med["orbite write 4K GB/s"], True),
    ("shm READ 4 KiB batch-1 p50 us <= 5 us", med["orbite shm read 4K batch-1 p50 us"], 5.0, False),
]
print("%-42s %10s %10s %7s  %s" % ("target (medians)", "orbite", "bound", "ratio", "result"))
failed = 0
for name, value, bound, at_least in rows:
    ok = value >= bound if at_least else value <= bound
    failed += not ok
    ratio = value / bound if bound > 0 else float("inf")
    print("%-42s %10.3f %10.3f %7.2f  %s" % (name, value, bound, ratio, "PASS" if ok else "FAIL"))
sys.exit(1 if failed else 0)
EOF
