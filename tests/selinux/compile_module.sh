#!/bin/sh
# Compile selinux/orbite_helper.{te,fc,if} with the reference policy's development Makefile,
# together with a small client module that calls every interface of orbite_helper.if (so that
# the interfaces are expanded and checked too). Exit 77 (skipped) without the toolchain
# (Debian package selinux-policy-dev).
#   usage: compile_module.sh SOURCE_DIR [MAKEFILE]
set -eu

if [ "$#" -lt 1 ] || [ "$#" -gt 2 ]; then
    echo "usage: $0 SOURCE_DIR [MAKEFILE]" >&2
    exit 2
fi
src=$1
makefile=${2:-/usr/share/selinux/devel/Makefile}
if [ ! -f "$makefile" ]; then
    echo "SKIP: $makefile not found (install selinux-policy-dev)"
    exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in te fc if; do
    cp "$src/selinux/orbite_helper.$f" "$work/"
done
cat > "$work/orbite_helper_client.te" <<'POLICY'
policy_module(orbite_helper_client, 0.1.0)

gen_require(`
	type user_t;
	role user_r;
')

orbite_helper_run(user_t, user_r)
orbite_read_policy(user_t)
orbite_manage_policy(user_t)
POLICY

cd "$work"
if ! make -f "$makefile" orbite_helper.pp orbite_helper_client.pp > build.log 2>&1; then
    cat build.log >&2
    echo "FAIL: the SELinux module does not compile" >&2
    exit 1
fi
for pp in orbite_helper.pp orbite_helper_client.pp; do
    if [ ! -s "$pp" ]; then
        cat build.log >&2
        echo "FAIL: $pp was not produced" >&2
        exit 1
    fi
done

# The file contexts name the installed helper and the policy directory.
for pattern in 'orbite/orbite-helper.*orbite_helper_exec_t' '/etc/orbite.*orbite_policy_t'; do
    if ! grep -q "$pattern" orbite_helper.fc; then
        echo "FAIL: orbite_helper.fc has no line matching '$pattern'" >&2
        exit 1
    fi
done
echo "OK: orbite_helper.pp and a client of every interface compile"
