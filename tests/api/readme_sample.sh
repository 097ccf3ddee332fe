#!/bin/sh
# The code sample of README.md compiles against the public header and runs successfully.
#   usage: readme_sample.sh README C_COMPILER INCLUDE_DIR LIBORBITE_SO WORK_DIR [SANITIZE]
set -eu

if [ "$#" -lt 5 ]; then
    echo "usage: $0 README C_COMPILER INCLUDE_DIR LIBORBITE_SO WORK_DIR [SANITIZE]" >&2
    exit 2
fi
readme=$1
cc=$2
include=$3
lib=$4
work=$5
case "${6:-}" in
    "") san_flags="" ;;
    address) san_flags="-fsanitize=address,undefined" ;;
    thread) san_flags="-fsanitize=thread" ;;
    *) echo "FAIL: unknown sanitizer '$6'" >&2; exit 2 ;;
esac

mkdir -p "$work"
# The first C block of the README.
awk '/^```c$/ && !done { in_block = 1; next } /^```$/ && in_block { in_block = 0; done = 1 } in_block' \
    "$readme" >"$work/readme_sample.c"
if ! grep -q 'int main' "$work/readme_sample.c"; then
    echo "FAIL: no C sample with a main() found in $readme" >&2
    exit 1
fi
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $san_flags -I"$include" "$work/readme_sample.c" \
    -o "$work/readme_sample" "$lib" -Wl,-rpath,"$(dirname "$lib")"
"$work/readme_sample"
echo "OK: the README sample builds and runs"
