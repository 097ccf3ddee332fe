/* The library's side of orbite-helper against tests/helperlib/fake_helper: spawn (what the
 * child inherits), HELLO, every call, every protocol violation, deadlines, helper death,
 * reaping, descriptor hygiene and concurrent callers. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "common.h"
#include "fake_data.h"
#include "helper/helper_client.h"

#ifndef FAKE_HELPER_PATH
#error "FAKE_HELPER_PATH must name the fake_helper program"
#endif
#ifndef EXPECTED_HELPER_PATH
#error "EXPECTED_HELPER_PATH must be the installed helper path CMake configured"
#endif

#define SECOND 1000000000ull
#define CALL_TIMEOUT (5 * SECOND)
#define SHORT_TIMEOUT (300ull * 1000000ull)

static char tmpdir[] = "/tmp/orb-helperlib-XXXXXX";

static int setup_group(void **state)
{
    (void)state;
    return mkdtemp(tmpdir) == NULL ? -1 : 0;
}

static int teardown_group(void **state)
{
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    orb_helper_test_set_command(NULL, NULL);
    return system(cmd) == 0 ? 0 : -1;
}

static void use_fake(const char *mode, const char *report)
{
    const char *args[] = { mode, report, NULL };
    assert_int_equal(orb_helper_test_set_command(FAKE_HELPER_PATH, args), 0);
}

static struct orb_helper *open_fake(const char *mode, uint64_t timeout_ns)
{
    use_fake(mode, NULL);
    struct orb_helper *h = NULL;
    int rc = orb_helper_open(ORB_HELPER_REQUIRED, timeout_ns, &h);
    if (rc != 0)
        fail_msg("mode %s: open gave %d: %s", mode, rc, orb_last_error());
    assert_non_null(h);
    return h;
}

/* Close the session and check its helper is gone and reaped. */
static void close_and_check_reaped(struct orb_helper *h)
{
    struct orb_helper_info info;
    assert_int_equal(orb_helper_info(h, &info), 0);
    assert_true(info.pid > 0);
    orb_helper_close(h);
    errno = 0;
    assert_int_equal(waitpid(info.pid, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
}

static int is_char_device(int fd, unsigned maj, unsigned min)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == maj &&
           minor(st.st_rdev) == min;
}

/* ---- arguments, modes and a missing helper --------------------------------------------------- */

static void test_arguments(void **state)
{
    (void)state;
    struct orb_helper *h = (struct orb_helper *)(uintptr_t)0x1;
    assert_int_equal(orb_helper_open(ORB_HELPER_AUTO, CALL_TIMEOUT, NULL), ORB_EINVAL);
    assert_int_equal(orb_helper_open((enum orb_helper_mode)7, CALL_TIMEOUT, &h), ORB_EINVAL);
    assert_ptr_equal(h, (struct orb_helper *)(uintptr_t)0x1);
    orb_helper_close(NULL);

    struct orb_topo_inventory inv;
    struct orb_hp_policy policy;
    struct orb_helper_info info;
    uint32_t found = 0;
    int fd = -7;
    struct orb_hp_devx_verify v = { .nic = FAKE_NIC_OK, .key = 1, .length = 1, .access = 1 };
    assert_int_equal(orb_helper_inventory(NULL, &inv), ORB_EINVAL);
    assert_int_equal(orb_helper_policy(NULL, &policy), ORB_EINVAL);
    assert_int_equal(orb_helper_info(NULL, &info), ORB_EINVAL);
    assert_int_equal(orb_helper_peermem_probe(NULL, &found), ORB_EINVAL);
    assert_int_equal(orb_helper_open_device(NULL, FAKE_NIC_OK, &fd), ORB_EINVAL);
    assert_int_equal(orb_helper_slot_attach(NULL, FAKE_SLOT, 1000, &fd), ORB_EINVAL);
    assert_int_equal(orb_helper_devx_verify(NULL, &v), ORB_EINVAL);

    /* Too many test arguments. */
    const char *many[18];
    for (size_t i = 0; i < 17; i++)
        many[i] = "x";
    many[17] = NULL;
    assert_int_equal(orb_helper_test_set_command(FAKE_HELPER_PATH, many), ORB_EINVAL);

    /* Names are checked before anything is sent, so the session survives them. */
    h = open_fake("good", CALL_TIMEOUT);
    char long_name[ORB_HP_NAME_MAX + 2];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    const char *bad_names[] = { "",       ".",       "..",       "a/b",
                                "../x",   "mlx5 0",  "mlx5_0\n", long_name };
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        assert_int_equal(orb_helper_open_device(h, bad_names[i], &fd), ORB_EINVAL);
        assert_int_equal(orb_helper_slot_attach(h, bad_names[i], 1000, &fd), ORB_EINVAL);
    }
    assert_int_equal(orb_helper_open_device(h, NULL, &fd), ORB_EINVAL);
    assert_int_equal(orb_helper_open_device(h, FAKE_NIC_OK, NULL), ORB_EINVAL);
    assert_int_equal(fd, -7);
    memset(v.nic, 'a', sizeof v.nic); /* not NUL-terminated */
    assert_int_equal(orb_helper_devx_verify(h, &v), ORB_EINVAL);
    assert_int_equal(orb_helper_peermem_probe(h, NULL), ORB_EINVAL);
    assert_int_equal(orb_helper_peermem_probe(h, &found), 0);
    assert_int_equal(found, FAKE_PEERMEM_FOUND);
    close_and_check_reaped(h);
}

static void test_off_never_spawns(void **state)
{
    (void)state;
    char script[512], marker[512];
    snprintf(script, sizeof script, "%s/marker-off.sh", tmpdir);
    snprintf(marker, sizeof marker, "%s/marker-off", tmpdir);
    assert_int_equal(write_marker_script(script, marker), 0);
    assert_int_equal(orb_helper_test_set_command(script, NULL), 0);

    struct orb_helper *h = NULL;
    assert_int_equal(orb_helper_open(ORB_HELPER_OFF, CALL_TIMEOUT, &h), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "off"));
    assert_null(h);
    assert_false(file_exists(marker));
    assert_true(no_children_left());

    /* The control: the same command does run when the mode allows it. It says nothing, so the
     * session fails with ORB_EPEER. */
    assert_int_equal(orb_helper_open(ORB_HELPER_AUTO, CALL_TIMEOUT, &h), ORB_EPEER);
    assert_null(h);
    assert_true(file_exists(marker));
    assert_true(no_children_left());
}

static void test_failure_tolerated(void **state)
{
    (void)state;
    assert_true(orb_helper_failure_tolerated(ORB_HELPER_AUTO, ORB_EUNAVAILABLE));
    assert_true(orb_helper_failure_tolerated(ORB_HELPER_OFF, ORB_EUNAVAILABLE));
    assert_false(orb_helper_failure_tolerated(ORB_HELPER_REQUIRED, ORB_EUNAVAILABLE));
    static const int others[] = { ORB_EPROTO, ORB_EPEER, ORB_ETIMEDOUT, ORB_EPERM, ORB_ENOMEM, 0 };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        assert_false(orb_helper_failure_tolerated(ORB_HELPER_AUTO, others[i]));
        assert_false(orb_helper_failure_tolerated(ORB_HELPER_REQUIRED, others[i]));
    }
}

static void test_missing_or_unexecutable_helper(void **state)
{
    (void)state;
    int fds_before = count_open_fds();
    char missing[512], plain[512];
    snprintf(missing, sizeof missing, "%s/no-such-helper", tmpdir);
    snprintf(plain, sizeof plain, "%s/not-executable", tmpdir);
    assert_int_equal(write_file(plain, "#!/bin/sh\nexit 0\n", 0644), 0);

    const char *paths[] = { missing, plain, tmpdir };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        assert_int_equal(orb_helper_test_set_command(paths[i], NULL), 0);
        for (int mode = ORB_HELPER_AUTO; mode <= ORB_HELPER_REQUIRED; mode++) {
            struct orb_helper *h = NULL;
            int rc = orb_helper_open((enum orb_helper_mode)mode, CALL_TIMEOUT, &h);
            assert_int_equal(rc, ORB_EUNAVAILABLE);
            assert_null(h);
            assert_non_null(strstr(orb_last_error(), paths[i]));
            assert_int_equal(orb_helper_failure_tolerated((enum orb_helper_mode)mode, rc),
                             mode == ORB_HELPER_AUTO);
        }
    }
    assert_true(no_children_left());
    assert_int_equal(count_open_fds(), fds_before);
}

static void test_installed_path(void **state)
{
    (void)state;
    const char *path = orb_helper_installed_path();
    assert_string_equal(path, EXPECTED_HELPER_PATH);
    assert_int_equal(path[0], '/');
    size_t len = strlen(path);
    assert_true(len > strlen("/orbite-helper"));
    assert_string_equal(path + len - strlen("/orbite-helper"), "/orbite-helper");

    /* Without the test override the installed path is what runs; the environment has no say. */
    assert_int_equal(orb_helper_test_set_command(NULL, NULL), 0);
    if (file_exists(path)) {
        print_message("an orbite-helper is installed at %s: not starting it\n", path);
        return;
    }
    setenv("ORBITE_HELPER", FAKE_HELPER_PATH, 1);
    setenv("ORBITE_HELPER_PATH", FAKE_HELPER_PATH, 1);
    struct orb_helper *h = NULL;
    assert_int_equal(orb_helper_open(ORB_HELPER_AUTO, CALL_TIMEOUT, &h), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), path));
    unsetenv("ORBITE_HELPER");
    unsetenv("ORBITE_HELPER_PATH");
}

/* ---- what the helper inherits ---------------------------------------------------------------- */

static char *read_report(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static void expect_line(const char *report, const char *line)
{
    char needle[128];
    snprintf(needle, sizeof needle, "%s\n", line);
    if (strstr(report, needle) == NULL)
        fail_msg("report lacks '%s':\n%s", line, report);
}

static void test_child_inherits_nothing(void **state)
{
    (void)state;
    char report_path[512], report[2048];
    snprintf(report_path, sizeof report_path, "%s/report", tmpdir);

    /* Things a careless spawn would pass on: environment, a leaked descriptor, a blocked
     * signal, an ignored signal. */
    setenv("ORBITE_TEST_SECRET", "1", 1);
    setenv("RDMAV_DRIVERS", "/tmp/evil.so", 1);
    int leaked = open("/dev/zero", O_RDONLY); /* no O_CLOEXEC on purpose */
    assert_true(leaked >= 0);
    sigset_t usr1, old_mask;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    assert_int_equal(pthread_sigmask(SIG_BLOCK, &usr1, &old_mask), 0);
    struct sigaction ign = { .sa_handler = SIG_IGN }, old_pipe;
    assert_int_equal(sigaction(SIGPIPE, &ign, &old_pipe), 0);

    use_fake("good", report_path);
    struct orb_helper *h = NULL;
    int rc = orb_helper_open(ORB_HELPER_AUTO, CALL_TIMEOUT, &h);

    sigaction(SIGPIPE, &old_pipe, NULL);
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    close(leaked);
    unsetenv("ORBITE_TEST_SECRET");
    unsetenv("RDMAV_DRIVERS");
    if (rc != 0)
        fail_msg("open gave %d: %s", rc, orb_last_error());

    read_report(report_path, report, sizeof report);
    expect_line(report, "argv0=orbite-helper");
    expect_line(report, "env=0");
    expect_line(report, "fds=0,1,2,3");
    expect_line(report, "stdio_devnull=1");
    expect_line(report, "fd3_seqpacket=1");
    expect_line(report, "fd3_cloexec=0");
    expect_line(report, "blocked_signals=0");
    expect_line(report, "sigpipe_default=1");
    close_and_check_reaped(h);
}

/* ---- a well-behaved helper ------------------------------------------------------------------- */

static void test_good_session(void **state)
{
    (void)state;
    int fds_before = count_open_fds();
    struct orb_helper *h = open_fake("good", CALL_TIMEOUT);

    struct orb_helper_info info;
    assert_int_equal(orb_helper_info(h, &info), 0);
    assert_int_equal(info.version, ORB_HP_VERSION);
    assert_int_equal(info.uid, getuid());
    assert_int_equal(info.gid, getgid());
    assert_int_equal(info.caps_kept, 0);

    struct orb_topo_inventory *got = malloc(sizeof *got), *want = malloc(sizeof *want);
    assert_non_null(got);
    assert_non_null(want);
    fake_inventory(want);
    assert_int_equal(orb_helper_inventory(h, got), 0);
    assert_int_equal(got->nnics, 2);
    assert_string_equal(got->nics[1].name, "mlx5_1");
    assert_memory_equal(got, want, sizeof *got);

    struct orb_hp_policy policy, want_policy;
    fake_policy(&want_policy);
    assert_int_equal(orb_helper_policy(h, &policy), 0);
    assert_memory_equal(&policy, &want_policy, sizeof policy);

    /* An fd arrives close-on-exec and is what the helper opened. */
    int fd = -1;
    assert_int_equal(orb_helper_open_device(h, FAKE_NIC_OK, &fd), 0);
    assert_true(fd > 2);
    assert_true(is_char_device(fd, 1, 3));
    assert_true((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    close(fd);

    /* Refusals come back as statuses; outputs untouched; the session stays up. */
    fd = -7;
    assert_int_equal(orb_helper_open_device(h, FAKE_NIC_DENIED, &fd), ORB_EPERM);
    assert_non_null(strstr(orb_last_error(), FAKE_NIC_DENIED));
    assert_int_equal(orb_helper_open_device(h, "mlx5_9", &fd), ORB_ENOENT);
    assert_int_equal(orb_helper_slot_attach(h, "other", 1000000, &fd), ORB_ENOENT);
    assert_int_equal(fd, -7);

    assert_int_equal(orb_helper_slot_attach(h, FAKE_SLOT, 1000000, &fd), 0);
    assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    assert_true((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    close(fd);

    uint32_t found = 0;
    assert_int_equal(orb_helper_peermem_probe(h, &found), 0);
    assert_int_equal(found, FAKE_PEERMEM_FOUND);

    struct orb_hp_devx_verify v = { .nic = FAKE_NIC_OK, .obj_handle = FAKE_DEVX_HANDLE_OK,
                                     .key = FAKE_DEVX_KEY_OK, .qpn = 7, .addr = 4096, .length = 4096,
                                     .access = 1 };
    assert_int_equal(orb_helper_devx_verify(h, &v), 0);
    v.obj_handle = FAKE_DEVX_HANDLE_OK + 1; /* the handle travels: another object is refused */
    assert_int_equal(orb_helper_devx_verify(h, &v), ORB_EPERM);
    v.obj_handle = FAKE_DEVX_HANDLE_OK;
    v.key = FAKE_DEVX_KEY_OK + 1;
    assert_int_equal(orb_helper_devx_verify(h, &v), ORB_EPERM);
    snprintf(v.nic, sizeof v.nic, "%s", FAKE_NIC_DENIED);
    assert_int_equal(orb_helper_devx_verify(h, &v), ORB_EUNAVAILABLE);

    /* Still in sync after the refusals. */
    assert_int_equal(orb_helper_inventory(h, got), 0);
    assert_memory_equal(got, want, sizeof *got);
    free(got);
    free(want);
    close_and_check_reaped(h);
    assert_int_equal(count_open_fds(), fds_before);
}

static void test_empty_inventory(void **state)
{
    (void)state;
    struct orb_helper *h = open_fake("empty-inventory", CALL_TIMEOUT);
    struct orb_topo_inventory *inv = malloc(sizeof *inv);
    assert_non_null(inv);
    memset(inv, 0xa5, sizeof *inv);
    assert_int_equal(orb_helper_inventory(h, inv), 0);
    assert_int_equal(inv->nnics, 0);
    assert_int_equal(inv->ngpus, 0);
    assert_int_equal(inv->nnuma, 0);
    assert_int_equal(inv->nics[0].id, 0); /* cleared, not left over */
    free(inv);
    close_and_check_reaped(h);
}

/* ---- a helper that breaks the protocol ------------------------------------------------------- */

enum call { C_INVENTORY, C_POLICY, C_OPEN_DEVICE, C_PEERMEM, C_DEVX };

static int make_call(struct orb_helper *h, enum call call)
{
    static struct orb_topo_inventory inv;
    struct orb_hp_policy policy;
    uint32_t found = 0xdead;
    int fd = -7, rc;
    struct orb_hp_devx_verify v = { .nic = FAKE_NIC_OK, .obj_handle = FAKE_DEVX_HANDLE_OK,
                                     .key = FAKE_DEVX_KEY_OK, .qpn = 7, .addr = 4096, .length = 4096,
                                     .access = 1 };
    memset(&inv, 0x5a, sizeof inv);
    memset(&policy, 0x5a, sizeof policy);
    switch (call) {
    case C_INVENTORY:
        rc = orb_helper_inventory(h, &inv);
        if (rc != 0)
            assert_int_equal(inv.nnics, 0x5a5a5a5a);
        return rc;
    case C_POLICY:
        rc = orb_helper_policy(h, &policy);
        if (rc != 0)
            assert_int_equal(policy.nslots, 0x5a5a5a5a);
        return rc;
    case C_OPEN_DEVICE:
        rc = orb_helper_open_device(h, FAKE_NIC_OK, &fd);
        if (rc != 0)
            assert_int_equal(fd, -7);
        else
            close(fd);
        return rc;
    case C_PEERMEM:
        rc = orb_helper_peermem_probe(h, &found);
        if (rc != 0)
            assert_int_equal(found, 0xdead);
        return rc;
    case C_DEVX:
        return orb_helper_devx_verify(h, &v);
    }
    return -100;
}

static void test_protocol_violations(void **state)
{
    (void)state;
    static const struct {
        const char *mode;
        enum call call;
        int status;
        const char *message;
    } cases[] = {
        { "wrong-type", C_POLICY, ORB_EPROTO, "type" },
        { "wrong-seq", C_POLICY, ORB_EPROTO, "sequence" },
        { "oversized", C_POLICY, ORB_EPROTO, "larger" },
        { "short", C_POLICY, ORB_EPROTO, "POLICY" },
        { "two-fds", C_OPEN_DEVICE, ORB_EPROTO, "descriptors" },
        { "no-fd", C_OPEN_DEVICE, ORB_EPROTO, "descriptor" },
        { "fd-on-refusal", C_OPEN_DEVICE, ORB_EPROTO, "descriptor" },
        { "fd-on-peermem", C_PEERMEM, ORB_EPROTO, "descriptor" },
        { "bad-status", C_PEERMEM, ORB_EPROTO, "status" },
        { "peermem-bits", C_PEERMEM, ORB_EPROTO, "PEERMEM" },
        { "count-changes", C_INVENTORY, ORB_EPROTO, "changed" },
        { "misordered", C_INVENTORY, ORB_EPROTO, "id" },
        { "trailing", C_DEVX, ORB_EPROTO, "DEVX" },
        { "die", C_POLICY, ORB_EPEER, "POLICY" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fds_before = count_open_fds();
        struct orb_helper *h = open_fake(cases[i].mode, CALL_TIMEOUT);
        /* Requests before the fault are served normally. */
        uint32_t found = 0;
        if (cases[i].call != C_PEERMEM)
            assert_int_equal(orb_helper_peermem_probe(h, &found), 0);
        int rc = make_call(h, cases[i].call);
        if (rc != cases[i].status || strstr(orb_last_error(), cases[i].message) == NULL)
            fail_msg("mode %s: got %d (%s), expected %d naming '%s'", cases[i].mode, rc,
                     orb_last_error(), cases[i].status, cases[i].message);
        /* The session is over: every later call fails the same way, at once. */
        double t0 = now_s();
        assert_int_equal(make_call(h, C_PEERMEM), cases[i].status);
        assert_int_equal(make_call(h, C_POLICY), cases[i].status);
        assert_non_null(strstr(orb_last_error(), "ended"));
        assert_true(now_s() - t0 < 1.0);
        close_and_check_reaped(h);
        if (count_open_fds() != fds_before)
            fail_msg("mode %s: %d descriptors before, %d after", cases[i].mode, fds_before,
                     count_open_fds());
    }
}

static void test_hello_failures(void **state)
{
    (void)state;
    static const struct {
        const char *mode;
        int status;
    } cases[] = {
        { "hello-die", ORB_EPEER },     { "hello-version", ORB_EPROTO },
        { "hello-uid", ORB_EPROTO },    { "hello-refuse", ORB_EPERM },
        { "hello-type", ORB_EPROTO },   { "hello-hang", ORB_ETIMEDOUT },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fds_before = count_open_fds();
        use_fake(cases[i].mode, NULL);
        struct orb_helper *h = (struct orb_helper *)(uintptr_t)0x1;
        /* Only the hanging helper waits out its deadline; the others answer at once, but a
         * sanitized, loaded machine can take a good part of a short deadline just to start the
         * fake, so they get the long one. */
        bool hangs = cases[i].status == ORB_ETIMEDOUT;
        double t0 = now_s();
        int rc = orb_helper_open(ORB_HELPER_AUTO, hangs ? SHORT_TIMEOUT : CALL_TIMEOUT, &h);
        double took = now_s() - t0;
        if (rc != cases[i].status)
            fail_msg("mode %s: got %d (%s), expected %d", cases[i].mode, rc, orb_last_error(),
                     cases[i].status);
        assert_string_not_equal(orb_last_error(), "");
        assert_false(orb_helper_failure_tolerated(ORB_HELPER_AUTO, rc));
        assert_ptr_equal(h, (struct orb_helper *)(uintptr_t)0x1);
        assert_true(took < 5.0);
        assert_true(no_children_left());
        assert_int_equal(count_open_fds(), fds_before);
    }
}

static void test_deadline(void **state)
{
    (void)state;
    int fds_before = count_open_fds();
    /* The one deadline covers starting the helper and its HELLO too: a second fits both on a
     * loaded, sanitized machine. */
    struct orb_helper *h = open_fake("hang", SECOND);
    double t0 = now_s();
    assert_int_equal(make_call(h, C_POLICY), ORB_ETIMEDOUT);
    double took = now_s() - t0;
    assert_true(took >= 0.95);
    assert_true(took < 5.0);
    /* Later calls do not wait again. */
    t0 = now_s();
    assert_int_equal(make_call(h, C_PEERMEM), ORB_ETIMEDOUT);
    assert_true(now_s() - t0 < 0.2);
    /* The hung helper was killed when the session ended: close does not wait for it. */
    t0 = now_s();
    close_and_check_reaped(h);
    assert_true(now_s() - t0 < 0.25);
    assert_int_equal(count_open_fds(), fds_before);
}

static void test_close_kills_a_lingering_helper(void **state)
{
    (void)state;
    /* A second of session timeout: spawning the helper and its HELLO fit in it on a loaded host
     * under a sanitizer too; close waits that long for the lingering helper, then kills it. */
    struct orb_helper *h = open_fake("linger", SECOND);
    uint32_t found = 0;
    assert_int_equal(orb_helper_peermem_probe(h, &found), 0);
    double t0 = now_s();
    close_and_check_reaped(h);
    double took = now_s() - t0;
    assert_true(took >= 0.9);
    assert_true(took < 5.0);

    /* A well-behaved helper exits on EOF well before the deadline. */
    h = open_fake("good", 10 * SECOND);
    t0 = now_s();
    close_and_check_reaped(h);
    assert_true(now_s() - t0 < 5.0);
}

static void test_application_reaps_children(void **state)
{
    (void)state;
    /* With SIGCHLD ignored the kernel reaps children itself: close must not wait or kill a
     * recycled pid. */
    struct sigaction ign = { .sa_handler = SIG_IGN }, old;
    assert_int_equal(sigaction(SIGCHLD, &ign, &old), 0);
    struct orb_helper *h = open_fake("good", 10 * SECOND);
    uint32_t found = 0;
    assert_int_equal(orb_helper_peermem_probe(h, &found), 0);
    double t0 = now_s();
    orb_helper_close(h);
    assert_true(now_s() - t0 < 5.0);
    sigaction(SIGCHLD, &old, NULL);
    assert_true(no_children_left());
}

/* ---- concurrent callers ---------------------------------------------------------------------- */

#define THREADS 4
#define ROUNDS 40

static void *caller(void *arg)
{
    struct orb_helper *h = arg;
    for (int i = 0; i < ROUNDS; i++) {
        uint32_t found = 0;
        struct orb_hp_policy p;
        int fd = -1;
        if (orb_helper_peermem_probe(h, &found) != 0 || found != FAKE_PEERMEM_FOUND)
            return (void *)1;
        if (orb_helper_policy(h, &p) != 0 || p.nslots != 2)
            return (void *)2;
        if (orb_helper_open_device(h, FAKE_NIC_OK, &fd) != 0)
            return (void *)3;
        close(fd);
        if (orb_helper_open_device(h, FAKE_NIC_DENIED, &fd) != ORB_EPERM)
            return (void *)4;
    }
    return NULL;
}

static void test_concurrent_calls(void **state)
{
    (void)state;
    int fds_before = count_open_fds();
    struct orb_helper *h = open_fake("good", CALL_TIMEOUT);
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, caller, h), 0);
    for (int i = 0; i < THREADS; i++) {
        void *result = NULL;
        assert_int_equal(pthread_join(threads[i], &result), 0);
        assert_null(result);
    }
    close_and_check_reaped(h);
    assert_int_equal(count_open_fds(), fds_before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_off_never_spawns),
        cmocka_unit_test(test_failure_tolerated),
        cmocka_unit_test(test_missing_or_unexecutable_helper),
        cmocka_unit_test(test_installed_path),
        cmocka_unit_test(test_child_inherits_nothing),
        cmocka_unit_test(test_hello_failures),
        cmocka_unit_test(test_protocol_violations),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_close_kills_a_lingering_helper),
        cmocka_unit_test(test_application_reaps_children),
        cmocka_unit_test(test_good_session),
        cmocka_unit_test(test_empty_inventory),
        cmocka_unit_test(test_concurrent_calls),
    };
    return cmocka_run_group_tests(tests, setup_group, teardown_group);
}
