#!/usr/bin/env bash
# Run tests/vm/rxe_check.c against a real Debian kernel with a soft-RoCE (rxe) device, inside a
# throw-away VM (qemu, software emulation, about a minute). It checks the uverbs ioctl layout of
# OPEN_DEVICE's device context creation, which no unit test can: the hosts that run CI have no
# RDMA device. Not part of ctest: it downloads the distribution's kernel package.
#
# Needs: qemu-system-x86_64, busybox (static), cpio, gzip, gcc, ip and rdma (iproute2), apt-get,
# apt-cache and dpkg-deb with a reachable mirror, and xz or zstd when the kernel's modules are
# compressed. Exits 77 when one is missing, 0 when every check passed, 1 when a check failed.
# Usage: tests/vm/run-rxe-check.sh [KERNEL_PACKAGE]   (default: what linux-image-amd64 depends on)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }
for tool in qemu-system-x86_64 busybox cpio gzip gcc ip rdma apt-get apt-cache dpkg-deb ldd; do
    command -v "$tool" >/dev/null || skip "$tool is not installed"
done
busybox --list >/dev/null 2>&1 || skip "busybox does not run"
ldd "$(command -v busybox)" >/dev/null 2>&1 && skip "busybox is not static (install busybox-static)"

WORK=$(mktemp -d /tmp/orbite-rxe-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

PKG=${1:-$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')}
[ -n "$PKG" ] || skip "no kernel package found (apt-cache depends linux-image-amd64)"
(cd "$WORK" && apt-get -q -o APT::Sandbox::User=root download "$PKG" >/dev/null 2>&1) ||
    skip "could not download $PKG"
dpkg-deb -x "$WORK"/"$PKG"_*.deb "$WORK/kernel"
VMLINUZ=$(ls "$WORK"/kernel/boot/vmlinuz-* | head -n1)
MODDIR=$(ls -d "$WORK"/kernel/lib/modules/* | head -n1)

# The initramfs: busybox, ip and rdma, the check and the libraries they use, the modules.
R=$WORK/root
mkdir -p "$R"/{bin,proc,sys,dev,mods}
cp "$(command -v busybox)" "$R/bin/"
for applet in sh mount insmod sleep poweroff; do ln -s busybox "$R/bin/$applet"; done
gcc -std=c11 -D_GNU_SOURCE -O1 -Wall -Wextra -Werror -DORB_UCTX_DRIVER_ID=RDMA_DRIVER_RXE \
    -I"$ROOT" -I"$ROOT/lib" -I"$ROOT/include" -o "$R/bin/rxe_check" \
    "$ROOT/tests/vm/rxe_check.c" "$ROOT/helper/uctx.c" "$ROOT/helper/uverbs.c" \
    "$ROOT/lib/core/error.c"
cp "$(command -v ip)" "$(command -v rdma)" "$R/bin/"
binaries=("$R/bin/rxe_check" "$R/bin/ip" "$R/bin/rdma")
for lib in $(ldd "${binaries[@]}" 2>/dev/null | awk '/=> \// {print $3} /^\s*\/.*ld-linux/ {print $1}' | sort -u); do
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
done
MODULES=(crc32_generic ib_core ib_uverbs ip6_udp_tunnel udp_tunnel rdma_rxe dummy)
for m in "${MODULES[@]}"; do
    ko=$(find "$MODDIR" -name "$m.ko*" | head -n1)
    [ -n "$ko" ] || skip "module $m is not in $PKG"
    case $ko in
        *.ko) cp "$ko" "$R/mods/$m.ko" ;;
        *.ko.xz) command -v xz >/dev/null || skip "xz is not installed"; xz -dc "$ko" >"$R/mods/$m.ko" ;;
        *.ko.zst) command -v zstd >/dev/null || skip "zstd is not installed"; zstd -qdc "$ko" >"$R/mods/$m.ko" ;;
        *) skip "module $ko: unknown compression" ;;
    esac
done
cat >"$R/init" <<INIT
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in ${MODULES[*]}; do insmod /mods/\$m.ko || echo "insmod \$m failed"; done
ip link add d0 type dummy && ip link set d0 up
rdma link add rxe0 type rxe netdev d0 || echo "rdma link add failed"
/bin/rxe_check
poweroff -f
INIT
chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1 >"$WORK/initrd.gz")

echo "booting $(basename "$VMLINUZ") with soft-RoCE"
timeout 600 qemu-system-x86_64 -accel tcg -cpu max -m 1024 -smp 1 -nographic -no-reboot \
    -kernel "$VMLINUZ" -initrd "$WORK/initrd.gz" -append "console=ttyS0 quiet panic=-1" \
    2>&1 | tr -d '\r' | tee "$WORK/console.log" | grep -E '^(ok  |FAIL|skip|RXE-CHECK|insmod|rdma link)' || true
grep -q '^RXE-CHECK-PASSED' "$WORK/console.log"
