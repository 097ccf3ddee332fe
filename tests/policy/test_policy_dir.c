/* Policy directories with real files: which files are read and in what order, and every file
 * that fails its checks (symlink, group- or world-writable, wrong owner, hard links, not a
 * regular file, oversize, NUL byte, bad name, bad text) turning the whole policy into deny-all
 * with a reason that names the file. `check` reports every file. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/policy.h"
#include "core/error.h"

struct dir {
    char path[256];
    int fd;
};

static void dir_init(struct dir *d)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(d->path, sizeof d->path, "%s/orb-policy-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    assert_non_null(mkdtemp(d->path));
    assert_int_equal(chmod(d->path, 0755), 0);
    d->fd = open(d->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(d->fd >= 0);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void dir_free(struct dir *d)
{
    close(d->fd);
    assert_int_equal(nftw(d->path, remove_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

static void put_mode(struct dir *d, const char *name, const char *text, size_t len, mode_t mode)
{
    int fd = openat(d->fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    assert_int_equal(fchmod(fd, mode), 0); /* explicit: independent of the umask */
    close(fd);
}

static void put(struct dir *d, const char *name, const char *text)
{
    put_mode(d, name, text, strlen(text), 0644);
}

static uint32_t me(void)
{
    return (uint32_t)getuid();
}

/* Load d as owned by `owner`; returns the policy and checks the status. */
static struct orb_policy *load(struct dir *d, uint32_t owner, int expect_rc)
{
    struct orb_policy *p = NULL;
    int rc = orb_policy_load_dir(d->fd, d->path, owner, &p);
    if (rc != expect_rc)
        fail_msg("load_dir returned %d, expected %d: %s", rc, expect_rc, p ? orb_policy_error(p) : orb_last_error());
    assert_non_null(p);
    return p;
}

/* Everything denied, the reasons pointing at `where` (a file name or the directory). */
static void assert_denies_all(const struct orb_policy *p, const char *where)
{
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_non_null(inv);
    inv->nnics = 1;
    snprintf(inv->nics[0].name, sizeof inv->nics[0].name, "mlx5_0");
    inv->ngpus = 1;
    const uint32_t gid = 0;
    struct orb_policy_subject who = {.uid = 0, .user = "root", .ngroups = 1, .gids = &gid};
    struct orb_hp_policy out;
    struct orb_policy_reason r[ORB_POLICY_MAX_REASONS];
    size_t n = 0;
    assert_int_equal(orb_policy_decide(p, &who, inv, &out, r, ORB_POLICY_MAX_REASONS, &n), 0);
    char want[300];
    snprintf(want, sizeof want, "policy error at %s", where);
    assert_int_equal(n, 3 + 2 + 1 + 1 + 1 + 3);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(r[i].source, want);
    assert_int_equal(out.transports, 0);
    assert_int_equal(out.nic_mask, 0);
    assert_int_equal(out.gpu_mask, 0);
    assert_int_equal(out.max_registered_bytes, 0);
    free(inv);
}

/* The policy of d denies everything with an error "<dir>/<file><rest>"; `rest` starting with
 * ":<line>:" is a text error at that line. */
static void assert_bad_dir(struct dir *d, uint32_t owner, const char *file, const char *rest)
{
    struct orb_policy *p = load(d, owner, ORB_ECONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s/%s%s", d->path, file, rest);
    const char *err = orb_policy_error(p);
    assert_non_null(err);
    if (strcmp(err, want) != 0)
        fail_msg("expected %s\ngot      %s", want, err);
    char where[300];
    snprintf(where, sizeof where, "%s", file);
    if (rest[0] == ':' && rest[1] >= '0' && rest[1] <= '9') {
        size_t digits = strspn(rest + 1, "0123456789");
        snprintf(where, sizeof where, "%s:%.*s", file, (int)digits, rest + 1);
    }
    assert_denies_all(p, where);
    orb_policy_free(p);
}

static const char good_text[] = "[defaults]\ntransports = tcp, rdma\nnics = *\n";

/* ---- what is read ----------------------------------------------------------------------- */

static void test_empty_directory_is_builtin(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    /* Only "*.ini" files that are not hidden are policy files. */
    put(&d, "README", "not = ini\n");
    put(&d, "10-a.ini~", "garbage\n");
    put(&d, "10-a.ini.dpkg-old", "garbage\n");
    put(&d, ".10-a.ini.swp", "garbage\n");
    put(&d, ".hidden.ini", "garbage\n");
    put(&d, ".ini", "garbage\n");
    assert_int_equal(mkdirat(d.fd, "sub", 0755), 0);
    struct orb_policy *p = load(&d, me(), 0);
    assert_null(orb_policy_error(p));
    assert_int_equal(orb_policy_file_count(p), 0);
    orb_policy_free(p);
    dir_free(&d);
}

static void test_files_merge_in_name_order(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "20-users.ini", "[user:#4242]\nmax_grants = 9\n");
    put(&d, "10-site.ini", "[defaults]\nmax_grants = 1\nmax_endpoints = 2\n");
    put(&d, "9-late.ini", "[group:#7]\nmax_grants = 5\n"); /* bytewise order: after 20- */
    struct orb_policy *p = load(&d, me(), 0);
    assert_int_equal(orb_policy_file_count(p), 3);
    struct orb_topo_inventory *inv = calloc(1, sizeof *inv);
    assert_non_null(inv);
    const uint32_t gid = 7;
    struct orb_policy_subject who = {.uid = 4242, .user = NULL, .ngroups = 1, .gids = &gid};
    struct orb_hp_policy out;
    struct orb_policy_reason r[ORB_POLICY_MAX_REASONS];
    size_t n = 0;
    assert_int_equal(orb_policy_decide(p, &who, inv, &out, r, ORB_POLICY_MAX_REASONS, &n), 0);
    assert_int_equal(out.max_grants, 9);
    assert_int_equal(out.max_endpoints, 2);
    assert_string_equal(r[n - 1].source, "20-users.ini:2 [user:#4242]");
    assert_string_equal(r[n - 2].source, "10-site.ini:3 [defaults]");
    who.uid = 1;
    assert_int_equal(orb_policy_decide(p, &who, inv, &out, r, ORB_POLICY_MAX_REASONS, &n), 0);
    assert_int_equal(out.max_grants, 5);
    assert_string_equal(r[n - 1].source, "9-late.ini:2 [group:#7] (largest of the groups)");
    free(inv);
    orb_policy_free(p);
    dir_free(&d);
}

static void test_duplicate_key_across_files(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "10-a.ini", "[group:gpu]\nnics = mlx5_0\n");
    put(&d, "20-b.ini", "; more\n[group:gpu]\nnics = mlx5_1\n");
    assert_bad_dir(&d, me(), "20-b.ini", ":3: duplicate key 'nics' in [group:gpu] (first set at 10-a.ini:2)");
    dir_free(&d);
}

/* ---- file checks: every one denies everything and names the file ------------------------ */

static void test_symlink(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "10-real.ini", good_text);
    assert_int_equal(symlinkat("10-real.ini", d.fd, "20-link.ini"), 0);
    assert_bad_dir(&d, me(), "20-link.ini", ": is a symbolic link");
    /* A dangling link too. */
    assert_int_equal(unlinkat(d.fd, "20-link.ini", 0), 0);
    assert_int_equal(symlinkat("/nonexistent", d.fd, "20-link.ini"), 0);
    assert_bad_dir(&d, me(), "20-link.ini", ": is a symbolic link");
    dir_free(&d);
}

static void test_writable_by_others(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put_mode(&d, "10-a.ini", good_text, strlen(good_text), 0664);
    assert_bad_dir(&d, me(), "10-a.ini", ": group-writable (mode 0664)");
    put_mode(&d, "10-a.ini", good_text, strlen(good_text), 0646);
    assert_bad_dir(&d, me(), "10-a.ini", ": world-writable (mode 0646)");
    put_mode(&d, "10-a.ini", good_text, strlen(good_text), 0400);
    struct orb_policy *p = load(&d, me(), 0); /* read-only for everyone else is fine */
    orb_policy_free(p);
    dir_free(&d);
}

static void test_wrong_owner(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "10-a.ini", good_text);
    /* The directory is checked first. */
    struct orb_policy *p = load(&d, me() + 1, ORB_ECONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s: directory owned by uid %u, expected uid %u", d.path, me(), me() + 1);
    assert_string_equal(orb_policy_error(p), want);
    assert_denies_all(p, d.path);
    orb_policy_free(p);
    if (getuid() != 0) {
        dir_free(&d);
        skip(); /* a file owned by someone else needs root to make */
    }
    assert_int_equal(fchownat(d.fd, "10-a.ini", 65534, 65534, 0), 0);
    snprintf(want, sizeof want, ": owned by uid 65534, expected uid %u", me());
    assert_bad_dir(&d, me(), "10-a.ini", want);
    dir_free(&d);
}

static void test_hard_links(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "10-a.ini", good_text);
    assert_int_equal(linkat(d.fd, "10-a.ini", d.fd, "other-name", 0), 0);
    assert_bad_dir(&d, me(), "10-a.ini", ": has 2 hard links, expected 1");
    dir_free(&d);
}

static void test_not_regular(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    assert_int_equal(mkdirat(d.fd, "10-dir.ini", 0755), 0);
    assert_bad_dir(&d, me(), "10-dir.ini", ": not a regular file");
    assert_int_equal(unlinkat(d.fd, "10-dir.ini", AT_REMOVEDIR), 0);
    /* A FIFO: opening must not block waiting for a writer. */
    assert_int_equal(mkfifoat(d.fd, "10-fifo.ini", 0644), 0);
    assert_bad_dir(&d, me(), "10-fifo.ini", ": not a regular file");
    dir_free(&d);
}

static void test_oversize_and_nul(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    size_t n = 64 * 1024;
    char *text = malloc(n + 1);
    assert_non_null(text);
    memset(text, '\n', n + 1);
    put_mode(&d, "10-big.ini", text, n, 0644); /* exactly the limit */
    struct orb_policy *p = load(&d, me(), 0);
    orb_policy_free(p);
    put_mode(&d, "10-big.ini", text, n + 1, 0644);
    assert_bad_dir(&d, me(), "10-big.ini", ": larger than 65536 bytes");
    free(text);
    put_mode(&d, "10-big.ini", "[defaults]\0nics = *\n", 20, 0644);
    assert_bad_dir(&d, me(), "10-big.ini", ": contains a NUL byte");
    dir_free(&d);
}

static void test_bad_text_in_file(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "10-good.ini", good_text);
    put(&d, "20-bad.ini", "[defaults]\nmax_grants = 1\nfoo = bar\n");
    assert_bad_dir(&d, me(), "20-bad.ini", ":3: unknown key 'foo' in [defaults]");
    put(&d, "20-bad.ini", "[defaults]\nmax_grants = 1\nmax_grants = 2\n");
    assert_bad_dir(&d, me(), "20-bad.ini", ":3: duplicate key 'max_grants' in [defaults] (first set at 20-bad.ini:2)");
    put(&d, "20-bad.ini", "[defaults]\nthis is not ini\n");
    assert_bad_dir(&d, me(), "20-bad.ini", ":2: syntax error: expected '[section]' or 'key = value'");
    put(&d, "20-bad.ini", "[group:x]\nnics = mlx5_0 mlx5_1\n");
    assert_bad_dir(&d, me(), "20-bad.ini",
                   ":2: bad value for 'nics': 'mlx5_0 mlx5_1' is not a device name, glob, guid:0x... or pci:dddd:bb:dd.f");
    dir_free(&d);
}

static void test_bad_file_name(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "10 a.ini", good_text);
    assert_bad_dir(&d, me(), "10 a.ini", ": file name outside [A-Za-z0-9_.@+-]{1,128}");
    assert_int_equal(unlinkat(d.fd, "10 a.ini", 0), 0);
    put(&d, "10\na.ini", good_text);
    assert_bad_dir(&d, me(), "10?a.ini", ": file name outside [A-Za-z0-9_.@+-]{1,128}");
    dir_free(&d);
}

static void test_directory_writable_by_others(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "10-a.ini", good_text);
    assert_int_equal(chmod(d.path, 0775), 0);
    struct orb_policy *p = load(&d, me(), ORB_ECONFIG);
    char want[512];
    snprintf(want, sizeof want, "%s: directory is group-writable (mode 0775)", d.path);
    assert_string_equal(orb_policy_error(p), want);
    orb_policy_free(p);
    assert_int_equal(chmod(d.path, 01777), 0);
    p = load(&d, me(), ORB_ECONFIG);
    snprintf(want, sizeof want, "%s: directory is world-writable (mode 1777)", d.path);
    assert_string_equal(orb_policy_error(p), want);
    orb_policy_free(p);
    /* A descriptor that is not a directory. */
    int fd = openat(d.fd, "10-a.ini", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(orb_policy_load_dir(fd, "f", me(), &p), ORB_ECONFIG);
    assert_string_equal(orb_policy_error(p), "f: not a directory");
    orb_policy_free(p);
    close(fd);
    dir_free(&d);
}

/* ---- check: every file reported --------------------------------------------------------- */

struct report_log {
    int calls;
    char lines[8][600];
};

static void record(void *ctx, const char *file, const char *error)
{
    struct report_log *log = ctx;
    if (log->calls < 8)
        snprintf(log->lines[log->calls], sizeof log->lines[0], "%s|%s", file, error ? error : "OK");
    log->calls++;
}

static void test_check_reports_every_file(void **state)
{
    (void)state;
    struct dir d;
    dir_init(&d);
    put(&d, "10-a.ini", "[defaults]\nmax_grants = 1\n");
    put(&d, "20-b.ini", "[defaults]\nmax_grants = 2\n");   /* duplicate of 10-a */
    put_mode(&d, "30-c.ini", good_text, strlen(good_text), 0666);
    put(&d, "40-d.ini", "[group:x]\nmax_grants = 2\n");
    struct report_log log = {0};
    assert_int_equal(orb_policy_check_dir(d.fd, d.path, me(), record, &log), ORB_ECONFIG);
    assert_int_equal(log.calls, 4);
    char want[600];
    snprintf(want, sizeof want, "%s/10-a.ini|OK", d.path);
    assert_string_equal(log.lines[0], want);
    snprintf(want, sizeof want, "%s/20-b.ini|%s/20-b.ini:2: duplicate key 'max_grants' in [defaults] (first set at 10-a.ini:2)",
             d.path, d.path);
    assert_string_equal(log.lines[1], want);
    snprintf(want, sizeof want, "%s/30-c.ini|%s/30-c.ini: world-writable (mode 0666)", d.path, d.path);
    assert_string_equal(log.lines[2], want);
    snprintf(want, sizeof want, "%s/40-d.ini|OK", d.path);
    assert_string_equal(log.lines[3], want);
    /* load_dir stops at the first problem and keeps it. */
    assert_bad_dir(&d, me(), "20-b.ini", ":2: duplicate key 'max_grants' in [defaults] (first set at 10-a.ini:2)");

    /* All good: every file OK and status 0. */
    assert_int_equal(unlinkat(d.fd, "20-b.ini", 0), 0);
    assert_int_equal(unlinkat(d.fd, "30-c.ini", 0), 0);
    memset(&log, 0, sizeof log);
    assert_int_equal(orb_policy_check_dir(d.fd, d.path, me(), record, &log), 0);
    assert_int_equal(log.calls, 2);
    assert_int_equal(orb_policy_check_dir(d.fd, d.path, me(), NULL, NULL), ORB_EINVAL);

    /* A problem with the directory itself is reported under its own name. */
    memset(&log, 0, sizeof log);
    assert_int_equal(orb_policy_check_dir(d.fd, d.path, me() + 1, record, &log), ORB_ECONFIG);
    assert_int_equal(log.calls, 1);
    snprintf(want, sizeof want, "%s|%s: directory owned by uid %u, expected uid %u", d.path, d.path, me(), me() + 1);
    assert_string_equal(log.lines[0], want);
    dir_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_directory_is_builtin),
        cmocka_unit_test(test_files_merge_in_name_order),
        cmocka_unit_test(test_duplicate_key_across_files),
        cmocka_unit_test(test_symlink),
        cmocka_unit_test(test_writable_by_others),
        cmocka_unit_test(test_wrong_owner),
        cmocka_unit_test(test_hard_links),
        cmocka_unit_test(test_not_regular),
        cmocka_unit_test(test_oversize_and_nul),
        cmocka_unit_test(test_bad_text_in_file),
        cmocka_unit_test(test_bad_file_name),
        cmocka_unit_test(test_directory_writable_by_others),
        cmocka_unit_test(test_check_reports_every_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
