#!/bin/sh
# The exported ABI is exactly what the version script lists, and it is exactly the set of functions
# the public header declares.
#   usage: check_symbols.sh LIBORBITE_SO VERSION_MAP PUBLIC_HEADER C_COMPILER
set -eu

if [ "$#" -ne 4 ]; then
    echo "usage: $0 LIBORBITE_SO VERSION_MAP PUBLIC_HEADER C_COMPILER" >&2
    exit 2
fi
lib=$1
map=$2
header=$3
cc=$4

for f in "$lib" "$map" "$header"; do
    if [ ! -r "$f" ]; then
        echo "FAIL: cannot read $f" >&2
        exit 1
    fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Names in the global: section of the map (comments removed; one "name;" per entry).
sed -e 's|/\*.*\*/||g' "$map" | awk '
    /global:/ { in_global = 1; next }
    /local:/  { in_global = 0 }
    in_global {
        gsub(/[ \t;]/, "")
        if ($0 != "") print
    }' | sort >"$work/map"
# Version node names ("ORBITE_0.1 {"): the linker defines them as absolute symbols.
sed -e 's|/\*.*\*/||g' "$map" | sed -n 's/^[[:space:]]*\([A-Za-z0-9_.]*\)[[:space:]]*{.*/\1/p' \
    | sort >"$work/nodes"

# Defined dynamic symbols, version suffix removed, version nodes left out.
nm -D --defined-only "$lib" | awk '{ name = $NF; sub(/@.*/, "", name); print $(NF-1), name }' \
    | while read -r type name; do
        if [ "$type" = "A" ] && grep -qx -- "$name" "$work/nodes"; then
            continue
        fi
        echo "$name"
    done | sort -u >"$work/exported"

# Functions declared by the header: preprocess (drops comments), then take every orb_ name
# directly followed by "(" -- function pointer typedefs read "(*orb_x)(" and do not match.
"$cc" -E -P -x c "$header" | tr '\n' ' ' \
    | grep -oE '\borb_[a-z0-9_]+[[:space:]]*\(' | sed 's/[[:space:]]*($//' | sort -u >"$work/declared"

status=0
if [ ! -s "$work/map" ]; then
    echo "FAIL: no global symbols found in $map" >&2
    status=1
fi
if [ ! -s "$work/declared" ]; then
    echo "FAIL: no orb_ functions found in $header" >&2
    status=1
fi

if ! cmp -s "$work/exported" "$work/map"; then
    echo "FAIL: exported symbols of $lib differ from the global list of $map" >&2
    comm -23 "$work/exported" "$work/map" | sed 's/^/  exported but not in the map: /' >&2
    comm -13 "$work/exported" "$work/map" | sed 's/^/  in the map but not exported: /' >&2
    status=1
fi
missing=$(comm -23 "$work/declared" "$work/map")
if [ -n "$missing" ]; then
    echo "FAIL: functions declared in $header but missing from $map:" >&2
    echo "$missing" | sed 's/^/  /' >&2
    status=1
fi
extra=$(comm -13 "$work/declared" "$work/map")
if [ -n "$extra" ]; then
    echo "FAIL: symbols in $map that $header does not declare:" >&2
    echo "$extra" | sed 's/^/  /' >&2
    status=1
fi

if [ "$status" -eq 0 ]; then
    echo "OK: $(wc -l <"$work/map") exported symbols match $map and $header"
fi
exit "$status"
