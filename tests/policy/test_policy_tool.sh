#!/bin/sh
# orbite-policy check / explain on the fixture directories of tests/policy/tool, output compared
# with tests/policy/tool/expected (placeholders @DIR@ @USER@ @UID@ @GROUP@ @SYSFS@ filled in
# here), plus the example policies of policy/ and the exit statuses.
#
# usage: test_policy_tool.sh ORBITE_POLICY FIXTURES SYSFS_DIR EXAMPLES_DIR
# The fixtures are copied to a private directory with fixed modes (the checkout's modes depend
# on the umask) and owned by the caller, hence --owner. Exits 77 (skip) when the caller has no
# account name or primary group name usable in a section header.
set -u

tool=$1
fixtures=$2
sysfs=$3
examples=$4

user=$(id -un 2>/dev/null) || exit 77
group=$(id -gn 2>/dev/null) || exit 77
uid=$(id -u)
for name in "$user" "$group"; do
    case $name in
        ''|-*|*[!A-Za-z0-9_.-]*) echo "skip: account name '$name' cannot be written in a section"; exit 77 ;;
    esac
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/orb-policy-tool-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
chmod 0755 "$tmp"
failures=0

fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

# render FILE: the file with the placeholders filled in
render() {
    sed -e "s|@DIR@|$dir|g" -e "s|@USER@|$user|g" -e "s|@UID@|$uid|g" -e "s|@GROUP@|$group|g" \
        -e "s|@SYSFS@|$sysfs|g" "$1"
}

# install NAME: copy fixtures/NAME to tmp/NAME (rendering *.in files), files 0644, directory 0755
install_fixture() {
    mkdir -m 0755 "$tmp/$1"
    for f in "$fixtures/$1"/*; do
        out="$tmp/$1/$(basename "$f" .in)"
        dir="$tmp/$1"
        render "$f" > "$out"
        chmod 0644 "$out"
    done
}

# expect NAME STATUS EXPECTED_FILE COMMAND...: run, compare status and output ("groups:" line
# dropped: it lists every group of the caller)
expect() {
    name=$1; want_status=$2; expected=$3; shift 3
    "$@" > "$tmp/out.raw" 2>&1
    status=$?
    grep -v '^groups:' "$tmp/out.raw" > "$tmp/out"
    if [ "$status" -ne "$want_status" ]; then
        fail "$name: exit status $status, expected $want_status"
        cat "$tmp/out.raw"
    fi
    render "$fixtures/expected/$expected" > "$tmp/want"
    if ! diff -u "$tmp/want" "$tmp/out"; then
        fail "$name: output differs from $expected"
    fi
}

# expect_status NAME STATUS PATTERN COMMAND...: status and one line matching PATTERN
expect_status() {
    name=$1; want_status=$2; pattern=$3; shift 3
    "$@" > "$tmp/out" 2>&1
    status=$?
    [ "$status" -eq "$want_status" ] || fail "$name: exit status $status, expected $want_status"
    grep -q -- "$pattern" "$tmp/out" || { fail "$name: no line matching '$pattern'"; cat "$tmp/out"; }
}

install_fixture site
install_fixture bad

dir="$tmp/site"
expect "check site" 0 check-site.txt "$tool" check --dir "$tmp/site" --owner "$uid"
expect "explain site" 0 explain-site.txt "$tool" explain --user "$user" --dir "$tmp/site" --sysfs "$sysfs" --owner "$uid"
# by uid too
expect "explain site by uid" 0 explain-site.txt "$tool" explain --user "$uid" --dir "$tmp/site" --sysfs "$sysfs" --owner "$uid"
dir="$tmp/bad"
expect "check bad" 1 check-bad.txt "$tool" check --dir "$tmp/bad" --owner "$uid"
expect "explain bad" 1 explain-bad.txt "$tool" explain --user "$user" --dir "$tmp/bad" --sysfs "$sysfs" --owner "$uid"
dir="$tmp/missing"
expect "explain missing" 0 explain-missing.txt "$tool" explain --user "$user" --dir "$tmp/missing" --sysfs "$sysfs" --owner "$uid"
# No directory is no policy file, to the helper and so to the tool.
expect_status "check missing" 0 "does not exist: no policy files: the built-in defaults apply" "$tool" check --dir "$tmp/missing"

# The file checks reach the command: a group-writable file, another owner.
chmod 0664 "$tmp/site/10-site.ini"
expect_status "check group-writable" 1 "10-site.ini: group-writable (mode 0664)" \
    "$tool" check --dir "$tmp/site" --owner "$uid"
expect_status "explain group-writable" 1 "DENIES EVERYTHING: .*group-writable" \
    "$tool" explain --user "$user" --dir "$tmp/site" --sysfs "$sysfs" --owner "$uid"
chmod 0644 "$tmp/site/10-site.ini"
expect_status "check other owner" 1 "directory owned by uid $uid, expected uid $((uid + 1))" \
    "$tool" check --dir "$tmp/site" --owner $((uid + 1))

# A symbolic link to the directory: the helper refuses it (O_NOFOLLOW), so the tool does too.
ln -s "$tmp/site" "$tmp/site-link"
expect_status "check symlinked directory" 1 "cannot open: " "$tool" check --dir "$tmp/site-link" --owner "$uid"
expect_status "explain symlinked directory" 1 "DENIES EVERYTHING: .*policy_directory_unreadable" \
    "$tool" explain --user "$user" --dir "$tmp/site-link" --sysfs "$sysfs" --owner "$uid"

# NICs granted without the rdma transport are listed but never opened: explain says so.
mkdir -m 0755 "$tmp/nics-only"
printf '[defaults]\nnics = *\n' > "$tmp/nics-only/10-nics.ini"
chmod 0644 "$tmp/nics-only/10-nics.ini"
expect_status "explain NICs without rdma" 0 "never opened (needs transport rdma)" \
    "$tool" explain --user "$user" --dir "$tmp/nics-only" --sysfs "$sysfs" --owner "$uid"

# Every example policy is valid on its own.
[ -f "$examples/single-tenant.ini" ] || fail "no example policies in $examples"
for f in "$examples"/*.ini; do
    d="$tmp/example-$(basename "$f" .ini)"
    mkdir -m 0755 "$d"
    cp "$f" "$d/" && chmod 0644 "$d/$(basename "$f")"
    expect_status "example $(basename "$f")" 0 "$(basename "$f"): OK" "$tool" check --dir "$d" --owner "$uid"
done
mkdir -m 0755 "$tmp/empty"
expect_status "check empty" 0 "no policy files: the built-in defaults apply" "$tool" check --dir "$tmp/empty" --owner "$uid"

# Usage errors.
expect_status "no command" 2 "missing command" "$tool"
expect_status "unknown command" 2 "unknown command" "$tool" verify
expect_status "explain without user" 2 "explain needs --user" "$tool" explain --dir "$tmp/site"
expect_status "bad owner" 2 "--owner takes a numeric uid" "$tool" check --owner root
expect_status "stray argument" 2 "'extra' is an unexpected argument" "$tool" check extra
expect_status "unknown option" 2 "'--bogus' is not an option" "$tool" check --bogus
expect_status "option without its value" 2 "'--dir' is missing its value" "$tool" check --dir
expect_status "unknown user" 2 "no such user" "$tool" explain --user no-such-user-orbite --dir "$tmp/site" --sysfs "$sysfs"
expect_status "help" 0 "usage: orbite-policy check" "$tool" --help

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
fi
echo "orbite-policy: all checks passed"
