#!/bin/sh
# rxe-topology.sh one|rails: the soft-RoCE devices of a test VM (see vm-run.sh), set up inside it
# with this machine's ip and rdma tools. Facts behind it: docs of rdma_rxe and tests/vm notes in
# vm-run.sh (rxe's UDP socket lives in the initial network namespace only, hence no namespaces:
# both "hosts" share it, and policy routing sends each end's traffic out of its own veth).
set -eu

die() { echo "rxe-topology: $*" >&2; exit 1; }
command -v ip >/dev/null || die "ip (iproute2) is not installed"
command -v rdma >/dev/null || die "rdma (iproute2) is not installed"

sysctl_set() { echo "$2" >"/proc/sys/$1"; }

ip link set lo up
# With the default backlog, softnet drops under load make rxe flood "Failed sending ACK".
sysctl_set net/core/netdev_max_backlog 10000

case ${1:-one} in
one)
    ip link add d0 type dummy
    ip addr add 10.77.0.1/24 dev d0
    ip link set d0 mtu 4096 up
    rdma link add rxe0 type rxe netdev d0
    ;;
rails)
    # Local routes are looked up after the per-veth tables, so that traffic between two local
    # addresses still leaves by the wire.
    ip rule add pref 1000 lookup local
    ip rule del pref 0
    sysctl_set net/ipv4/conf/all/rp_filter 0
    sysctl_set net/ipv4/conf/default/rp_filter 0
    for i in 0 1; do
        a=va$i b=vb$i
        ip link add "$a" type veth peer name "$b"
        ip link set "$a" mtu 4096 up
        ip link set "$b" mtu 4096 up
        ip addr add "10.77.$((i + 1)).1/32" dev "$a"
        ip addr add "10.77.$((i + 1)).2/32" dev "$b"
        for dev in "$a" "$b"; do
            sysctl_set "net/ipv4/conf/$dev/accept_local" 1
            sysctl_set "net/ipv4/conf/$dev/rp_filter" 0
        done
        mac_a=$(cat "/sys/class/net/$a/address")
        mac_b=$(cat "/sys/class/net/$b/address")
        ip neigh replace "10.77.$((i + 1)).2" lladdr "$mac_b" dev "$a" nud permanent
        ip neigh replace "10.77.$((i + 1)).1" lladdr "$mac_a" dev "$b" nud permanent
        ta=$((100 + 2 * i)) tb=$((101 + 2 * i))
        ip route add "10.77.$((i + 1)).2/32" dev "$a" table "$ta"
        ip route add "10.77.$((i + 1)).1/32" dev "$b" table "$tb"
        ip rule add pref 10 oif "$a" lookup "$ta"
        ip rule add pref 10 oif "$b" lookup "$tb"
        ip rule add pref 20 iif lo from "10.77.$((i + 1)).1" to "10.77.$((i + 1)).2" lookup "$ta"
        ip rule add pref 20 iif lo from "10.77.$((i + 1)).2" to "10.77.$((i + 1)).1" lookup "$tb"
        rdma link add "rxe_a$i" type rxe netdev "$a"
        rdma link add "rxe_b$i" type rxe netdev "$b"
    done
    ;;
*)
    die "unknown topology $1"
    ;;
esac

# The devices exist once their IPv4-mapped GID (index 1 of port 1) is there.
for dev in /sys/class/infiniband/*; do
    [ -e "$dev" ] || die "no rxe device appeared"
    n=0
    until [ -s "$dev/ports/1/gids/1" ] && [ "$(cat "$dev/ports/1/gids/1")" != "0000:0000:0000:0000:0000:0000:0000:0000" ]; do
        n=$((n + 1))
        [ $n -lt 100 ] || die "$(basename "$dev"): no IPv4 GID after 10 s"
        sleep 0.1
    done
done
echo "rxe-topology: $(ls /sys/class/infiniband | tr '\n' ' ')ready"
