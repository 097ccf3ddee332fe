#!/bin/bash
# Fetch the Debian packages hardware/gpu-check.sh builds against, for a GPU machine that has a
# compiler and cmake but neither these development files nor a network:
#
#   hardware/gpu-deps.sh        (on a Debian 12 machine where apt-get works)
#
# The .deb files land in hardware/gpu-deps/ (ignored by git): copy or carry that folder with the
# tree. gpu-check.sh unpacks them under /tmp when the machine lacks the packages itself. They are
# Debian 12 builds: a machine whose C library is older than Debian 12's (2.36) may not load them.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$ROOT/hardware/gpu-deps
PACKAGES=(pkgconf pkgconf-bin libpkgconf3 libjansson-dev libjansson4 libinih-dev libinih1 libcmocka-dev libcmocka0
          libcap-dev libcap2 libseccomp-dev libseccomp2 libibverbs-dev libibverbs1 libnl-3-200 libnl-route-3-200)
mkdir -p "$DEST"
cd "$DEST"
rm -f ./*.deb
apt-get download "${PACKAGES[@]}"
ls -l "$DEST"
