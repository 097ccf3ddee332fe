#!/bin/bash
# OrbiTE over RDMA against perftest on the same soft-RoCE devices in the same VM boot (the rails
# topology: requester side rxe_a0/rxe_a1, source side rxe_b0/rxe_b1). For each round, size and
# operation it runs ib_{read,write}_bw on one rail, then on both rails at once (two pairs; see
# perf_two for how they add up), then orbite-bench with the same rails, and prints the ratios,
# per round and then over all rounds (the ratio of the means). Under emulation (TCG) the
# figures measure the emulator: only the ratios mean something.
#
#   tests/vm/vm-run.sh --topology rails -- tests/vm/rdma-bench.sh [ROUNDS] [SECONDS] [PROGRESS] [PERFTEST]
#
# PROGRESS is both engines' progress_mode: event_driven by default here, because soft-RoCE does
# the device's work on the same (two, emulated) CPUs as the lanes, and a polling lane takes CPU
# time from it; "polling" (the library's default, right for a NIC that works on its own) measures
# that. PERFTEST is how perftest waits for its completions: "polling" (its default: each client
# spins on its completion queue) or "events" (its -e: it sleeps on a completion channel, as
# OrbiTE's event_driven lanes do). ib_write_bw has no event mode ("Events feature not available
# on WRITE verb"), so with "events" only the READ cells change; WRITE's pairs still poll.
#
# Needs perftest (ib_write_bw, ib_read_bw) on the host's root file system and build/ built.
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-3}
PROGRESS=${3:-event_driven}
PERFTEST=${4:-polling}
case $PROGRESS in polling|event_driven) ;; *) echo "rdma-bench: progress mode $PROGRESS: polling or event_driven"; exit 2 ;; esac
case $PERFTEST in polling) PERF_WAIT=() ;; events) PERF_WAIT=(-e) ;; *) echo "rdma-bench: perftest mode $PERFTEST: polling or events"; exit 2 ;; esac
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/build/tools/orbite-bench
for t in ib_write_bw ib_read_bw; do
    command -v "$t" >/dev/null || { echo "rdma-bench: $t is missing (apt-get install perftest)"; exit 77; }
done
[[ -x $BENCH ]] || { echo "rdma-bench: build $BENCH first"; exit 77; }

# The GID index of the IPv4-mapped RoCE v2 GID of port 1 of $1.
gid_index() {
    local d=/sys/class/infiniband/$1/ports/1
    for g in "$d"/gids/*; do
        local i=${g##*/}
        local v; v=$(cat "$g" 2>/dev/null) || continue
        [[ $v == 0000:0000:0000:0000:0000:ffff:* ]] || continue
        [[ $(cat "$d/gid_attrs/types/$i" 2>/dev/null) == "RoCE v2" ]] && { echo "$i"; return; }
    done
    echo 1
}

# MB/s (perftest's "BW average" column, MB = 2^20 bytes) of one pair, 0 when it reported none:
# $1 tool, $2 size, $3 client dev, $4 server dev, $5 server address, $6 port.
perf_pair() {
    local tool=$1 size=$2 cdev=$3 sdev=$4 addr=$5 port=$6
    local events=()
    [[ $tool == ib_read_bw ]] && events=("${PERF_WAIT[@]}")
    "$tool" -d "$sdev" -x "$(gid_index "$sdev")" -s "$size" -n "$(iters "$size")" -F "${events[@]}" -p "$port" >/dev/null 2>&1 &
    local spid=$!
    sleep 0.5
    local out
    out=$("$tool" -d "$cdev" -x "$(gid_index "$cdev")" -s "$size" -n "$(iters "$size")" -F "${events[@]}" -p "$port" "$addr" 2>/dev/null) || true
    wait "$spid" 2>/dev/null || true
    # The result line starts with the size: #bytes #iterations BW_peak BW_average MsgRate
    awk -v s="$size" '$1 == s && $4 > 0 { print $4; found = 1 } END { if (!found) print 0 }' <<<"$out"
}

# Iterations of a perftest pair for about $SECS seconds at the emulator's ~64 MB/s (perftest's
# duration mode reports 0 when few large messages fit its measuring window).
iters() {
    local n=$(( SECS * (64 << 20) / $1 )); (( n < 50 )) && n=50
    echo "$n"
}

# One rail: MB/s of one pair, twice (as perf_two prints its two figures), asked again (up to 3
# tries) when perftest reported nothing; "nan nan" when it never did (the cell then counts in no
# mean). $1 tool, $2 size.
perf_one() {
    local try bw
    for try in 0 1 2; do
        bw=$(perf_pair "$1" "$2" rxe_a0 rxe_b0 10.77.1.2 $((18515 + 10 * try)))
        [[ $bw != 0 ]] && { echo "$bw $bw"; return; }
    done
    echo nan nan
}

# Both rails at once: two pairs started together, each moving the same bytes. Prints two MB/s
# figures: the bytes of both over the longer pair's time (the ratio is taken against this one),
# and the sum of the two pairs' rates (earlier tables used it). The sum counts the pair that ended
# first as if it had run as long as the other, whose own rate includes its time alone. Asked
# again like perf_one; $1 tool, $2 size.
perf_two() {
    local try tmp bw0 bw1
    tmp=$(mktemp)
    for try in 0 1 2; do
        (perf_pair "$1" "$2" rxe_a0 rxe_b0 10.77.1.2 $((18516 + 10 * try)) >"$tmp.0") &
        (perf_pair "$1" "$2" rxe_a1 rxe_b1 10.77.2.2 $((18517 + 10 * try)) >"$tmp.1") &
        wait
        bw0=$(cat "$tmp.0") bw1=$(cat "$tmp.1")
        if [[ $bw0 != 0 && $bw1 != 0 ]]; then
            rm -f "$tmp" "$tmp.0" "$tmp.1"
            # Equal bytes per pair: 2 x bytes / max(bytes / bw0, bytes / bw1) = 2 x min(bw0, bw1).
            python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(2 * min(a, b), a + b)" "$bw0" "$bw1"
            return
        fi
    done
    rm -f "$tmp" "$tmp.0" "$tmp.1"
    echo nan nan
}

# GB/s of orbite-bench: $1 op, $2 size, $3 source NICs, $4 requester NICs (JSON strings).
orbite() {
    "$BENCH" --op "$1" -b "$2" -d "$SECS" --warmup 0.5 --buffer-size 64M --transport rdma --json -q \
        --rdma-source "{\"rdma_whitelist\":[$3],\"progress_mode\":\"$PROGRESS\"}" \
        --rdma-requester "{\"rdma_whitelist\":[$4],\"progress_mode\":\"$PROGRESS\"}" 2>/dev/null |
        python3 -c 'import json,sys; r=(json.load(sys.stdin).get("results") or [{}])[0]; print(r["gbps"] if r.get("ran") and r.get("verified") else 0)' || echo 0
}

echo "orbite-bench progress_mode: $PROGRESS; perftest: $PERFTEST$([[ $PERFTEST == events ]] && echo ' (ib_read_bw -e; ib_write_bw polls)')"
printf '%-5s %-5s %-6s %-6s %12s %12s %8s %9s\n' round op size rails perftest_GBs orbite_GBs ratio ratio_sum
ROWS=$(mktemp)
trap 'rm -f "$ROWS"' EXIT
for round in $(seq 1 "$ROUNDS"); do
    for op in write read; do
        tool=ib_${op}_bw
        for size in 65536 1048576; do
            one=$(perf_one "$tool" "$size")
            o1=$(orbite "$op" "$size" '"rxe_b0"' '"rxe_a0"')
            two=$(perf_two "$tool" "$size")
            o2=$(orbite "$op" "$size" '"rxe_b0","rxe_b1"' '"rxe_a0","rxe_a1"')
            for pair in "1 $one $o1" "2 $two $o2"; do
                set -- $pair
                python3 - "$round" "$op" "$size" "$1" "$2" "$3" "$4" <<'EOF'
import sys
rnd, op, size, rails, perf_mbs, sum_mbs, orb_gbs = sys.argv[1:]
perf = float(perf_mbs) * 1.048576e6 / 1e9  # perftest MB/s (2^20) -> GB/s (1e9); nan: no result
summed = float(sum_mbs) * 1.048576e6 / 1e9
orb = float(orb_gbs)
ratio = f"{orb / perf:8.2f} {orb / summed:9.2f}" if perf > 0 else f"{'n/a':>8} {'n/a':>9}"
print(f"{rnd:<5} {op:<5} {int(size)//1024:>4}K  {rails:<6} {perf:12.4f} {orb:12.4f} {ratio}")
EOF
                echo "$op $size $1 $2 $3 $4" >>"$ROWS"
            done
        done
    done
done

# Over all rounds: each cell's figures summed across the rounds, then divided (the ratio of the
# means, which a round where one side ran slowly moves less than it moves that round's ratio).
echo
echo "all rounds: ratio of the means"
printf '%-5s %-6s %-6s %12s %12s %8s %9s\n' op size rails perftest_GBs orbite_GBs ratio ratio_sum
python3 - "$ROWS" "$ROUNDS" <<'EOF'
import sys
rows, rounds = sys.argv[1], int(sys.argv[2])
cells = {}
for line in open(rows):
    op, size, rails, perf_mbs, sum_mbs, orb_gbs = line.split()
    c = cells.setdefault((op, int(size), rails), [0.0, 0.0, 0.0, 0])
    perf = float(perf_mbs) * 1.048576e6 / 1e9
    if not perf > 0:
        continue  # perftest gave no figure in this round: the round's cell counts on neither side
    c[0] += perf
    c[1] += float(sum_mbs) * 1.048576e6 / 1e9
    c[2] += float(orb_gbs)
    c[3] += 1
for (op, size, rails), (perf, summed, orb, n) in cells.items():
    if n == 0:
        print(f"{op:<5} {size // 1024:>4}K  {rails:<6} {'n/a':>12} {'n/a':>12} {'n/a':>8} {'n/a':>9}")
        continue
    note = "" if n == rounds else f"  ({n} of {rounds} rounds)"
    print(f"{op:<5} {size // 1024:>4}K  {rails:<6} {perf / n:12.4f} {orb / n:12.4f} {orb / perf:8.2f} {orb / summed:9.2f}{note}")
EOF
