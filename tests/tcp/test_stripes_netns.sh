#!/bin/sh
# How many DATA stripes a requester opens, seen from the source's side of the network: to a
# source in another network namespace (another host, as far as the requester can tell) it opens
# tcp_stripes; to one on its own loopback it opens tcp_local_stripes (automatic: tcp_stripes
# capped at one per two CPUs). Two network namespaces joined by a veth pair, orbite-bench as
# source and requester, and `ss` counting the source's established connections while the
# requester runs. Needs root and iproute2; exits 77 without them.
#
# usage: test_stripes_netns.sh ORBITE_BENCH
set -u
bench=$1
[ "$(id -u)" = 0 ] || { echo "skip: needs root (network namespaces)"; exit 77; }
command -v ip >/dev/null 2>&1 && command -v ss >/dev/null 2>&1 || {
    echo "skip: needs ip and ss (iproute2)"; exit 77; }

tag=orbst$$
nsa=${tag}a
nsb=${tag}b
work=$(mktemp -d /tmp/orbite-stripes-XXXXXX) || exit 1
src_pid=

cleanup() {
    exec 9>&- # the source's stdin ends: it stops by itself, else it is killed after 10 s
    if [ -n "$src_pid" ]; then
        n=0
        while kill -0 "$src_pid" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
        kill -9 "$src_pid" 2>/dev/null
        wait "$src_pid" 2>/dev/null
    fi
    ip netns del "$nsa" 2>/dev/null
    ip netns del "$nsb" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ip netns add "$nsa" && ip netns add "$nsb" || { echo "skip: cannot create network namespaces"; exit 77; }
ip link add "${tag}x" type veth peer name "${tag}y" || { echo "skip: no veth"; exit 77; }
ip link set "${tag}x" netns "$nsa" && ip link set "${tag}y" netns "$nsb" || exit 1
ip -n "$nsa" addr add 10.231.7.1/30 dev "${tag}x" && ip -n "$nsb" addr add 10.231.7.2/30 dev "${tag}y" || exit 1
for ns in "$nsa" "$nsb"; do
    ip -n "$ns" link set lo up && ip -n "$ns" link set dev "$([ "$ns" = "$nsa" ] && echo "${tag}x" || echo "${tag}y")" up || exit 1
done

# The source, in A, listening on every address; it runs until its stdin, a FIFO this shell
# holds open for writing, ends.
mkfifo "$work/hold" || exit 1
ip netns exec "$nsa" "$bench" --mode source --endpoint 0.0.0.0:0 --buffer-size 8M \
    <"$work/hold" >"$work/source.out" 2>"$work/source.err" &
src_pid=$!
exec 9>"$work/hold"
i=0
while ! grep -q '^epoch ' "$work/source.out" 2>/dev/null; do
    i=$((i + 1))
    [ $i -le 300 ] || { echo "FAIL: the source did not report its endpoint"; cat "$work/source.err"; exit 1; }
    sleep 0.1
done
port=$(sed -n 's/^endpoint .*:\([0-9]*\)$/\1/p' "$work/source.out")
epoch=$(sed -n 's/^epoch //p' "$work/source.out")
[ -n "$port" ] && [ -n "$epoch" ] || { echo "FAIL: cannot read the source's endpoint"; exit 1; }

# Run a requester in namespace $1 against $2, with engine config $3, and print the most
# established connections the source had on its port while it ran.
most_connections() {
    ip netns exec "$1" "$bench" --mode requester --endpoint "$2:$port" --epoch "$epoch" \
        --op read --block-size 64K --duration 1 --config "$3" >"$work/req.out" 2>&1 &
    req=$!
    most=0
    while kill -0 "$req" 2>/dev/null; do
        n=$(ip netns exec "$nsa" ss -Htn state established "( sport = :$port )" | wc -l)
        [ "$n" -gt "$most" ] && most=$n
        sleep 0.05
    done
    wait "$req" || { echo "FAIL: requester in $1 against $2 ($3) failed:" >&2; cat "$work/req.out" >&2; return 1; }
    echo "$most"
}

cpus=$(nproc)
half=$((cpus / 2))
[ $half -ge 1 ] || half=1
status=0
check() { # namespace address config expected-DATA-stripes what
    got=$(most_connections "$1" "$2" "$3") || { status=1; return; }
    want=$((1 + $4))
    if [ "$got" = "$want" ]; then
        echo "ok: $5: $got connections (CONTROL + $4 DATA)"
    else
        echo "FAIL: $5: the source saw $got connections, expected $want (CONTROL + $4 DATA)"
        status=1
    fi
}

check "$nsb" 10.231.7.1 '{"tcp_stripes":3}' 3 "another namespace, tcp_stripes 3"
check "$nsb" 10.231.7.1 '{"tcp_stripes":3,"tcp_local_stripes":1}' 3 "another namespace, tcp_local_stripes does not apply"
auto=$half
[ $auto -le 3 ] || auto=3
check "$nsa" 127.0.0.1 '{"tcp_stripes":3}' $auto "loopback, automatic on $cpus CPUs"
check "$nsa" 10.231.7.1 '{"tcp_stripes":3}' $auto "this namespace's own address, automatic on $cpus CPUs"
check "$nsa" 127.0.0.1 '{"tcp_stripes":3,"tcp_local_stripes":2}' 2 "loopback, tcp_local_stripes 2"
exit $status
