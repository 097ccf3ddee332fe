#!/usr/bin/env bash
# vm-run.sh: run a command inside a throw-away VM that has real verbs devices (the kernel's
# soft-RoCE driver, rdma_rxe), with this machine's root file system and the project tree as they
# are, and return the command's exit status.
#
#   tests/vm/vm-run.sh [--topology one|rails] [--timeout SECONDS] -- COMMAND [ARG]...
#
# COMMAND runs as root in the project root (the directory above tests/), chrooted into this
# machine's root file system shared read-only over 9p, with the project tree shared read-write at
# the same path (so a build tree and ctest work unchanged), and fresh /proc, /sys, /dev, /tmp,
# /run and /dev/shm. Topologies:
#   one    one rxe device (rxe0) on a dummy netdev, 10.77.0.1/24: both processes on one device
#   rails  two "hosts" over two veth pairs in the initial namespace, one rxe device per end
#          (rxe_a0 10.77.1.1 <-> rxe_b0 10.77.1.2, rxe_a1 10.77.2.1 <-> rxe_b1 10.77.2.2), with
#          policy routing so that each end's traffic leaves by its own veth (rxe does not work
#          across network namespaces)
# The VM environment has ORBITE_VM=1 and ORBITE_VM_TOPOLOGY set.
#
# Needs: qemu-system-x86_64, busybox (static), cpio, gzip, modprobe (kmod), and on a first run
# apt-get, apt-cache and dpkg-deb with a reachable mirror to fetch the distribution's kernel,
# which is cached in ORBITE_VM_CACHE (default ~/.cache/orbite-vm). KVM is used where it boots the
# kernel; elsewhere qemu emulates (TCG), which is slow: compare speeds only within one boot.
# Exit status: the command's; 77 when the VM cannot run here (the reason is printed); 124 when
# the VM ran past the timeout; 125 when the VM ended without reporting the command's status.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOPOLOGY=one
TIMEOUT=900
while [[ $# -gt 0 ]]; do
    case $1 in
        --topology) TOPOLOGY=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "vm-run: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $# -gt 0 ]] || { echo "usage: vm-run.sh [--topology one|rails] [--timeout S] -- COMMAND..." >&2; exit 2; }
[[ $TOPOLOGY == one || $TOPOLOGY == rails ]] || { echo "vm-run: unknown topology $TOPOLOGY" >&2; exit 2; }
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || { echo "vm-run: bad timeout $TIMEOUT" >&2; exit 2; }

skip() { echo "vm-run: SKIP: $*" >&2; exit 77; }
log() { echo "vm-run: $*" >&2; }
export PATH=$PATH:/usr/sbin:/sbin
for tool in qemu-system-x86_64 busybox cpio gzip modprobe; do
    command -v "$tool" >/dev/null || skip "$tool is not installed"
done
busybox --list >/dev/null 2>&1 || skip "busybox does not run"
ldd "$(command -v busybox)" >/dev/null 2>&1 && skip "busybox is not static (install busybox-static)"

# ---- the kernel, cached ------------------------------------------------------------------------
CACHE=${ORBITE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orbite-vm}
mkdir -p "$CACHE"
# The kernel's package: ORBITE_VM_KERNEL when set (that one or none); otherwise the first that can
# be had of the distribution's 6.12 kernel (Debian 12 ships it beside its default 6.1, whose
# soft-RoCE now and then stops a queue pair under load: docs/operations.md), its default kernel,
# and the ones cached earlier.
fetch_kernel() {
    local pkg=$1 tree=$CACHE/$1.tree dl kver
    [[ -d $tree/boot ]] && return 0
    if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
        log "apt-get and dpkg-deb are needed to fetch $pkg"
        return 1
    fi
    log "fetching $pkg (once; cached in $CACHE)"
    dl=$(mktemp -d "$CACHE/dl.XXXXXX")
    if ! (cd "$dl" && apt-get -q -o APT::Sandbox::User=root download "$pkg" >/dev/null 2>&1); then
        rm -rf "$dl"
        log "could not download $pkg"
        return 1
    fi
    rm -rf "$tree.part"
    dpkg-deb -x "$dl"/"$pkg"_*.deb "$tree.part"
    rm -rf "$dl"
    kver=$(ls "$tree.part/lib/modules" | head -n1)
    depmod -b "$tree.part" "$kver"
    mv "$tree.part" "$tree"
}
CANDIDATES=()
if [[ -n ${ORBITE_VM_KERNEL:-} ]]; then
    CANDIDATES=("$ORBITE_VM_KERNEL")
else
    for meta in linux-image-6.12-amd64 linux-image-amd64; do
        dep=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}') || true
        [[ -z $dep ]] || CANDIDATES+=("$dep")
    done
    for cached in "$CACHE"/linux-image-*.tree; do
        [[ -d $cached/boot ]] || continue
        cached=${cached##*/}
        CANDIDATES+=("${cached%.tree}")
    done
fi
PKG=
for candidate in "${CANDIDATES[@]}"; do
    if fetch_kernel "$candidate"; then
        PKG=$candidate
        break
    fi
done
[[ -n $PKG ]] || skip "no kernel package could be had (tried: ${CANDIDATES[*]:-none; apt-cache knows neither linux-image-6.12-amd64 nor linux-image-amd64})"
TREE=$CACHE/$PKG.tree
KVER=$(ls "$TREE/lib/modules" | head -n1)
VMLINUZ=$TREE/boot/vmlinuz-$KVER
[[ -f $VMLINUZ ]] || skip "no kernel image in $TREE"

# ---- the initramfs: busybox and the modules --------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/orbite-vm.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
R=$WORK/root
mkdir -p "$R"/{bin,proc,sys,dev,host,mods}
cp "$(command -v busybox)" "$R/bin/"
for applet in sh mount umount mkdir insmod sleep poweroff cat echo chroot; do ln -s busybox "$R/bin/$applet"; done
# Each module once, dependencies first, as modprobe resolves them for this kernel.
declare -A seen=()
ORDER=()
for m in virtio_pci 9pnet_virtio 9p crc32_generic rdma_rxe veth dummy; do
    deps=$(modprobe -d "$TREE" -S "$KVER" --show-depends "$m" 2>/dev/null) || skip "module $m is not in $PKG"
    while read -r kind path _; do
        [[ $kind == insmod ]] || continue
        name=$(basename "$path")
        [[ -n ${seen[$name]:-} ]] && continue
        seen[$name]=1
        case $path in
            *.ko) cp "$path" "$R/mods/$name" ;;
            *.ko.xz) command -v xz >/dev/null || skip "xz is not installed"; name=${name%.xz}; xz -dc "$path" >"$R/mods/$name" ;;
            *.ko.zst) command -v zstd >/dev/null || skip "zstd is not installed"; name=${name%.zst}; zstd -qdc "$path" >"$R/mods/$name" ;;
            *) skip "module $path: unknown compression" ;;
        esac
        ORDER+=("$name")
    done <<<"$deps"
done

STATUS=$ROOT/.vm-status.$$
STARTED=$ROOT/.vm-started.$$ # the guest reached the command (a boot that dies before is retried)
rm -f "$STATUS" "$STARTED"
# The command, quoted for the guest shell.
CMD=$(printf '%q ' "$@")
cat >"$R/init" <<INIT
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in ${ORDER[*]}; do insmod /mods/\$m || echo "vm: insmod \$m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /host || echo "vm: no host root"
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
for d in /tmp /run /var/tmp /dev/shm; do mount -t tmpfs tmpfs /host\$d; done
mkdir -p /host$ROOT
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=262144 tree /host$ROOT || echo "vm: no tree"
chroot /host /bin/sh -c 'cd $ROOT && export ORBITE_VM=1 ORBITE_VM_TOPOLOGY=$TOPOLOGY HOME=/tmp PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin && tests/vm/rxe-topology.sh $TOPOLOGY && : > $STARTED && $CMD; echo \$? > $STATUS'
sync
poweroff -f
INIT
chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1 >"$WORK/initrd.gz")

# ---- boot -------------------------------------------------------------------------------------
ACCEL="-accel tcg,thread=multi -cpu max"
if [[ ${ORBITE_VM_ACCEL:-} == kvm ]]; then
    ACCEL="-accel kvm -cpu host" # only where KVM really boots a stock kernel (not under PVM)
fi
# A guest kernel that dies while it boots (under TCG, rarely: an oops while the kernel patches
# its own text) never ran the command: booted once more. One that reached it is not retried.
for boot in 1 2; do
    log "booting $KVER ($TOPOLOGY) for: $*"
    set +e
    # shellcheck disable=SC2086
    timeout "$TIMEOUT" qemu-system-x86_64 $ACCEL -m 2048 -smp 2 -nographic -no-reboot \
        -kernel "$VMLINUZ" -initrd "$WORK/initrd.gz" -append "console=ttyS0 quiet panic=-1" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
        -virtfs local,path="$ROOT",mount_tag=tree,security_model=passthrough,multidevs=remap \
        2>&1 | tr -d '\r'
    qemu_rc=${PIPESTATUS[0]}
    set -e
    if [[ $qemu_rc -eq 124 ]]; then
        rm -f "$STATUS" "$STARTED"
        log "the VM ran past ${TIMEOUT} s"
        exit 124
    fi
    [[ -s $STATUS || -e $STARTED || $boot -eq 2 ]] && break
    log "the guest ended (qemu status $qemu_rc) before it reached the command: booting again"
done
if [[ ! -s $STATUS ]]; then
    rm -f "$STARTED"
    log "the VM ended (qemu status $qemu_rc) without the command's status"
    exit 125
fi
rm -f "$STARTED"
rc=$(cat "$STATUS")
rm -f "$STATUS"
exit "$rc"
