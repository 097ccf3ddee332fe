#!/bin/sh
# The man pages built from docs/man: one per source page (orb_*.md in section 3, NAME.N.md in
# section N), a page for every installed program, each rendered by groff with no warning and
# naming itself in NAME; and once installed (into a temporary prefix), `man` finds them there.
#   usage: check_man.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1
build=$2
status=0
fail() { echo "FAIL: $*" >&2; status=1; }

command -v groff >/dev/null || { echo "SKIP: groff is not installed"; exit 77; }
count=0
for page in "$src"/docs/man/orb_*.md "$src"/docs/man/*.[18].md; do
    [ -f "$page" ] || continue
    base=$(basename "$page" .md)
    case $base in
        *.[18]) name=${base%.?}; section=${base##*.} ;;
        *) name=$base; section=3 ;;
    esac
    out=$build/man/man$section/$name.$section
    if [ ! -f "$out" ]; then
        fail "no man page $out for docs/man/$base.md"
        continue
    fi
    warnings=$(groff -man -Tutf8 -ww -z "$out" 2>&1)
    [ -z "$warnings" ] || fail "$out: groff: $warnings"
    if ! groff -man -Tutf8 "$out" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g; s/.\x08//g' \
        | awk '/^NAME/ { n = 1; next } /^[A-Z]/ { n = 0 } n' | grep -q "$name"; then
        fail "$out does not name $name in NAME"
    fi
    count=$((count + 1))
done
[ "$count" -gt 50 ] || fail "only $count pages were checked"

# Every program the install puts in bin/ or sbin/, and the helper, has its page.
for tool in orbite-bench.1 orbite-info.1 orbite-policy.8 orbite-helper.8; do
    [ -f "$build/man/man${tool##*.}/$tool" ] || fail "no man page for ${tool%.?}"
done

# Installed, man finds them by name.
if command -v man >/dev/null; then
    prefix=$(mktemp -d)
    trap 'rm -rf "$prefix"' EXIT
    cmake --install "$build" --prefix "$prefix" --component orbite_documentation >/dev/null
    for want in 3:orb_engine_create 3:orb_batch_wait 1:orbite-bench 8:orbite-helper; do
        found=$(man -w -M "$prefix/share/man" "${want%%:*}" "${want#*:}" 2>/dev/null || true)
        case $found in
            "$prefix"/share/man/man*) ;;
            *) fail "man does not find ${want#*:}(${want%%:*}) under $prefix/share/man (got '$found')" ;;
        esac
    done
fi
[ "$status" -eq 0 ] && echo "man pages: $count checked"
exit "$status"
