#!/bin/sh
# The install a user makes: liborbite into a prefix (cmake --install), then pip builds the
# package against it with the system's setuptools (no index, no build isolation), into a folder
# of its own; the installed package must import and move bytes with no build tree around.
# Usage: pip_install.sh BUILD_DIR PYTHON_SOURCE_DIR PYTHON. Exit 77 when pip or setuptools is
# missing (Debian: python3-pip, python3-setuptools).
set -eu
build=$1 src=$2 python=$3
"$python" -m pip --version >/dev/null 2>&1 || { echo "SKIP: no pip for $python"; exit 77; }
"$python" -c 'import setuptools' 2>/dev/null || { echo "SKIP: no setuptools for $python"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" --component orbite_runtime >/dev/null
cmake --install "$build" --prefix "$work/prefix" --component orbite_development >/dev/null
cp -r "$src" "$work/src"  # pip builds in the source folder: keep the checkout clean
rm -rf "$work/src/build" "$work/src/"*.egg-info
ORBITE_PREFIX="$work/prefix" "$python" -m pip install --quiet --no-build-isolation --no-deps --no-index \
    --disable-pip-version-check --root-user-action=ignore --target "$work/site" "$work/src"
ls "$work/site/orbite/" | grep -q '^_orbite\.abi3\.so$' || { echo "FAIL: no abi3 extension installed"; ls -R "$work/site"; exit 1; }
cd "$work"
env -u PYTHONPATH -u LD_LIBRARY_PATH PYTHONPATH="$work/site" "$python" - <<'PY'
import orbite, os
assert os.path.dirname(orbite.__file__).startswith(os.environ["PYTHONPATH"]), orbite.__file__
with orbite.Engine() as source, orbite.Engine({"enable_source": False}) as requester:
    remote = bytearray(b"installed" * 1000)
    r = source.register(remote, orbite.Perm.REMOTE_READ)
    local = bytearray(len(remote))
    l = requester.register(local)
    with requester.open_segment(source.endpoint, source.epoch) as seg:
        requester.submit_and_wait(seg, [orbite.Request.read(l.address, r.address, len(remote))])
    assert local == remote
print("installed package works:", orbite.__version__)
PY
# It links liborbite and the C library only: CUDA and verbs stay run-time loaded.
libs=$(ldd "$work/site/orbite/_orbite.abi3.so" | awk '{print $1}' | grep -v -e '^linux-vdso' -e '^/lib64/ld-linux' || true)
for lib in $libs; do
    case $lib in
        liborbite.so.*|libc.so.*|libjansson.so.*|libpthread.so.*) ;;
        *) echo "FAIL: the extension loads $lib"; exit 1 ;;
    esac
done
echo "pip install: OK"
