#!/bin/sh
# Every function of the public header has a reference page docs/man/<name>.md that names it, is
# listed in docs/man/README.md, and every relative link in docs/ and README.md leads to a file.
#   usage: check_docs.sh SOURCE_DIR C_COMPILER
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: $0 SOURCE_DIR C_COMPILER" >&2
    exit 2
fi
src=$1
cc=$2
man=$src/docs/man
status=0

functions=$("$cc" -E -P -x c "$src/include/orbite/orbite.h" | tr '\n' ' ' \
    | grep -oE '\borb_[a-z0-9_]+[[:space:]]*\(' | sed 's/[[:space:]]*($//' | sort -u)
[ -n "$functions" ] || { echo "FAIL: no functions found in the header" >&2; exit 1; }

for f in $functions; do
    page=$man/$f.md
    if [ ! -f "$page" ]; then
        echo "FAIL: no reference page docs/man/$f.md" >&2
        status=1
        continue
    fi
    if ! awk '/^## NAME/ { in_name = 1; next } /^## / { in_name = 0 } in_name' "$page" \
        | grep -qF "\`$f\`"; then
        echo "FAIL: docs/man/$f.md does not name $f in its NAME section" >&2
        status=1
    fi
    if ! grep -q "\[$f\](" "$man/README.md"; then
        echo "FAIL: docs/man/README.md does not list $f" >&2
        status=1
    fi
done

# Relative Markdown links: [text](target) where target is not a URL or an anchor.
for doc in "$src/README.md" "$src"/docs/*.md "$man"/*.md; do
    [ -f "$doc" ] || continue
    dir=$(dirname "$doc")
    for target in $(grep -oE '\]\([^)#[:space:]]+' "$doc" | sed 's/^](//' | grep -vE '^[a-z]+:' || true); do
        if [ ! -e "$dir/$target" ]; then
            echo "FAIL: ${doc#"$src"/} links to missing $target" >&2
            status=1
        fi
    done
done

if [ "$status" -eq 0 ]; then
    echo "OK: $(echo "$functions" | wc -l) functions documented; links resolve"
fi
exit "$status"
