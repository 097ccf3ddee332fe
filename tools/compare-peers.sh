#!/usr/bin/env bash
# compare-peers.sh: measure OrbiTE next to its peers on this host, in one run, and check the
# performance targets.
#
#   tools/compare-peers.sh [BUILD_DIR]        (default: build)
#
# Figures (all traffic on 127.0.0.1):
#   iperf3        one TCP stream, 1 MiB writes, 5 s                      -> GB/s
#   ucx_perftest  ucp_put_bw, 1 MiB messages, UCX_TLS=tcp on lo          -> GB/s
#   pingpong      64-byte TCP round trip, TCP_NODELAY, 20000 iterations -> p50 us
#                 (blocking receives for the target; polling receives shown for information)
#   orbite-bench  READ and WRITE at 1 MiB; READ at 4 KiB with --batch 1 --depth 1 -> GB/s, p50 us
# Targets:
#   orbite READ/WRITE 1 MiB GB/s  >= 0.9 x iperf3 GB/s
#   orbite READ/WRITE 1 MiB GB/s  >= 3 x ucp_put_bw GB/s
#   orbite READ 4 KiB p50 latency <= 2 x ping-pong p50 round trip
#
# Environment: ORBITE_DURATION (s per orbite cell, default 5), IPERF_TIME (s, default 5),
# UCX_ITERS (default 2000), COMPARE_KEEP_DIR (keep raw outputs there instead of a temp dir).
# iperf3 and ucx-utils are installed with apt-get only when missing.
# Exit status: 0 all targets pass, 1 a target failed, 2 a measurement could not be made.
set -euo pipefail

BUILD_DIR=${1:-build}
ORBITE_DURATION=${ORBITE_DURATION:-5}
IPERF_TIME=${IPERF_TIME:-5}
UCX_ITERS=${UCX_ITERS:-2000}
HOST=127.0.0.1

die() { echo "compare-peers: $*" >&2; exit 2; }

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
    for candidate in "$BUILD_DIR/tools/$name" "$BUILD_DIR/bin/$name" "$BUILD_DIR/$name"; do
        [[ -x "$candidate" ]] && { echo "$candidate"; return 0; }
    done
    return 1
}
if ! find_tool orbite-bench >/dev/null || ! find_tool orbite-pingpong >/dev/null; then
    [[ -f "$BUILD_DIR/CMakeCache.txt" ]] ||
        die "$BUILD_DIR is not a configured build directory (cmake -S . -B $BUILD_DIR)"
    cmake --build "$BUILD_DIR" --target orbite-bench orbite-pingpong -j2 >&2 ||
        die "building orbite-bench and orbite-pingpong failed"
fi
BENCH=$(find_tool orbite-bench) || die "orbite-bench not found in $BUILD_DIR"
PINGPONG=$(find_tool orbite-pingpong) || die "orbite-pingpong not found in $BUILD_DIR"

# A free loopback port (the kernel picks it; a short race with other programs is possible).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# json_get FILE EXPRESSION: evaluate a Python expression over the parsed document `d`.
json_get() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
with open(sys.argv[1]) as f:
    d = json.load(f)
print(eval(sys.argv[2], {"d": d}))
EOF
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

# ---- iperf3 -----------------------------------------------------------------------------
echo "compare-peers: iperf3, one stream, 1 MiB writes, ${IPERF_TIME} s" >&2
IPERF_PORT=$(free_port)
iperf3 -s -B "$HOST" -p "$IPERF_PORT" -1 >"$WORK_DIR/iperf3-server.log" 2>&1 &
SERVER_PIDS+=($!)
iperf_ok=0
for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.3
    if timeout $((IPERF_TIME + 30)) iperf3 -c "$HOST" -p "$IPERF_PORT" -l 1M -t "$IPERF_TIME" -J \
        >"$WORK_DIR/iperf3.json" 2>"$WORK_DIR/iperf3-client.log"; then
        iperf_ok=1
        break
    fi
    grep -q "Connection refused\|unable to connect" "$WORK_DIR/iperf3.json" \
        "$WORK_DIR/iperf3-client.log" 2>/dev/null || break
done
[[ $iperf_ok -eq 1 ]] || die "iperf3 failed (see $WORK_DIR/iperf3.json)"
IPERF_GBPS=$(json_get "$WORK_DIR/iperf3.json" 'round(d["end"]["sum_received"]["bits_per_second"] / 8e9, 3)')

# ---- UCX one-sided put ------------------------------------------------------------------
echo "compare-peers: ucx_perftest ucp_put_bw, 1 MiB, $UCX_ITERS iterations, tcp on lo" >&2
UCX_PORT=$(free_port)
UCX_TLS=tcp UCX_NET_DEVICES=lo ucx_perftest -p "$UCX_PORT" >"$WORK_DIR/ucx-server.log" 2>&1 &
SERVER_PIDS+=($!)
ucx_ok=0
for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.3
    if UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 ucx_perftest "$HOST" -p "$UCX_PORT" \
        -t ucp_put_bw -s 1048576 -n "$UCX_ITERS" -w 100 -v >"$WORK_DIR/ucx.csv" 2>&1; then
        ucx_ok=1
        break
    fi
    grep -q "Connection refused\|connect() failed" "$WORK_DIR/ucx.csv" || break
done
[[ $ucx_ok -eq 1 ]] || die "ucx_perftest failed (see $WORK_DIR/ucx.csv)"
# CSV columns: iterations,p50_lat,avg_lat,overall_lat,avg_bw,overall_bw,... ; bandwidth in MiB/s.
UCX_MIBPS=$(awk -F, '$1 ~ /^ *[0-9]+$/ { bw = $6 } END { print bw }' "$WORK_DIR/ucx.csv")
[[ -n "$UCX_MIBPS" ]] || die "no result line in ucx_perftest output ($WORK_DIR/ucx.csv)"
UCX_GBPS=$(python3 -c "print(round(float('$UCX_MIBPS') * 1048576 / 1e9, 3))")

# ---- ping-pong --------------------------------------------------------------------------
echo "compare-peers: 64-byte TCP ping-pong, 20000 round trips, blocking and polling" >&2
timeout 120 "$PINGPONG" --size 64 --iters 20000 --json >"$WORK_DIR/pingpong.json" ||
    die "orbite-pingpong failed"
RTT_P50=$(json_get "$WORK_DIR/pingpong.json" 'd["rtt_p50_us"]')
timeout 120 "$PINGPONG" --size 64 --iters 20000 --spin --json >"$WORK_DIR/pingpong-spin.json" ||
    die "orbite-pingpong --spin failed"
RTT_SPIN_P50=$(json_get "$WORK_DIR/pingpong-spin.json" 'd["rtt_p50_us"]')

# ---- orbite-bench -----------------------------------------------------------------------
bench_limit=$(python3 -c "print(int(4 * ($ORBITE_DURATION + 1) + 120))")
echo "compare-peers: orbite-bench READ and WRITE at 1 MiB, ${ORBITE_DURATION} s each" >&2
timeout "$bench_limit" "$BENCH" --op both --block-size 1M --duration "$ORBITE_DURATION" --json \
    --quiet >"$WORK_DIR/orbite-1m.json" || die "orbite-bench 1 MiB failed (see $WORK_DIR/orbite-1m.json)"
ORB_READ_GBPS=$(json_get "$WORK_DIR/orbite-1m.json" \
    '[r["gbps"] for r in d["results"] if r["op"] == "read"][0]')
ORB_WRITE_GBPS=$(json_get "$WORK_DIR/orbite-1m.json" \
    '[r["gbps"] for r in d["results"] if r["op"] == "write"][0]')

echo "compare-peers: orbite-bench READ at 4 KiB, --batch 1 --depth 1, ${ORBITE_DURATION} s" >&2
timeout "$bench_limit" "$BENCH" --op read --block-size 4K --batch 1 --depth 1 \
    --duration "$ORBITE_DURATION" --json --quiet >"$WORK_DIR/orbite-4k.json" ||
    die "orbite-bench 4 KiB failed (see $WORK_DIR/orbite-4k.json)"
ORB_4K_P50=$(json_get "$WORK_DIR/orbite-4k.json" 'd["results"][0]["latency_p50_us"]')

IDLE_AFTER=$(cpu_idle_percent)
echo "host: $(nproc) CPUs, ${IDLE_BEFORE}% idle before the run, ${IDLE_AFTER}% after" \
     "(below ~90%: other work competed and the figures are unreliable)"

# ---- table ------------------------------------------------------------------------------
python3 - "$IPERF_GBPS" "$UCX_GBPS" "$RTT_P50" "$RTT_SPIN_P50" "$ORB_READ_GBPS" \
    "$ORB_WRITE_GBPS" "$ORB_4K_P50" <<'EOF'
import sys
iperf, ucx, rtt, rtt_spin, rd, wr, lat = map(float, sys.argv[1:])
print("peers: iperf3 1 MiB %.3f GB/s | ucp_put_bw 1 MiB %.3f GB/s | 64 B ping-pong p50 RTT "
      "%.2f us blocking, %.2f us polling" % (iperf, ucx, rtt, rtt_spin))
print("%-46s %10s %12s %7s  %s" % ("target", "orbite", "bound", "ratio", "result"))
# (name, orbite figure, bound, orbite must be at least the bound, counts toward the exit status)
rows = [
    ("READ 1 MiB GB/s >= 0.9 x iperf3", rd, 0.9 * iperf, True, True),
    ("WRITE 1 MiB GB/s >= 0.9 x iperf3", wr, 0.9 * iperf, True, True),
    ("READ 1 MiB GB/s >= 3 x ucp_put_bw", rd, 3 * ucx, True, True),
    ("WRITE 1 MiB GB/s >= 3 x ucp_put_bw", wr, 3 * ucx, True, True),
    ("READ 4 KiB p50 us <= 2 x ping-pong RTT", lat, 2 * rtt, False, True),
    ("(info) READ 4 KiB p50 us <= 2 x polling RTT", lat, 2 * rtt_spin, False, False),
]
failed = 0
for name, value, bound, at_least, counts in rows:
    ok = value >= bound if at_least else value <= bound
    failed += counts and not ok
    ratio = value / bound if bound > 0 else float("inf")
    print("%-46s %10.3f %12.3f %7.2f  %s" % (name, value, bound, ratio, "PASS" if ok else "FAIL"))
sys.exit(1 if failed else 0)
EOF
