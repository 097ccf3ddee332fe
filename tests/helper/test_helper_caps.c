/* File capabilities as installed: a copy of the helper with `setcap cap_chown,cap_dac_override=p`
 * run by an unprivileged user (setpriv). Only the expected capabilities are permitted, none is
 * effective between calls, each works for its one call, the process is not dumpable, and a copy
 * with one capability too many refuses to start. Needs root to set capabilities and create
 * device nodes: exits 77 (skipped) otherwise. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"
#include "helper_test_util.h"
#include "topo/slots.h"

#define SETPRIV "/usr/bin/setpriv"
#define NOBODY 65534u
#define WAIT_MS 10000
#define EXPECTED_CAPS ((1u << CAP_CHOWN) | (1u << CAP_DAC_OVERRIDE))

struct fixture {
    struct hp_fixture fx;
    char exe[600];
    struct hp_proc p;
};

/* Copy orbite-helper-test into the fixture and give it `caps` ("" for none). */
static void install_copy(struct fixture *f, const char *caps)
{
    snprintf(f->exe, sizeof f->exe, "%s/orbite-helper-copy", f->fx.root);
    int in = open(ORB_HELPER_TEST_EXE, O_RDONLY | O_CLOEXEC);
    int out = open(f->exe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
    assert_true(in >= 0 && out >= 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        assert_int_equal(write(out, buf, (size_t)n), n);
    close(in);
    assert_int_equal(fchmod(out, 0755), 0);
    close(out);
    if (caps[0] != '\0') {
        cap_t c = cap_from_text(caps);
        assert_non_null(c);
        assert_int_equal(cap_set_file(f->exe, c), 0);
        cap_free(c);
    }
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->p.sock = -1;
    assert_int_equal(hp_fixture_create(&f->fx, "two-socket"), 0);
    /* Root's policy, a node only root can open (uverbs0 = 1:3 in the fixture's sysfs), an
     * mlx5 driver for it, and (the helper's --device-context fake) no kernel device context on
     * the stand-in node: this test is about capabilities. */
    assert_int_equal(hp_fixture_mark_mlx5(&f->fx, "mlx5_0"), 0);
    assert_int_equal(hp_write_file(f->fx.policy, "10-test.ini",
                                   "[defaults]\ntransports = tcp, rdma\nnics = mlx5_0\nslots = caps-slot\n", 0644),
                     0);
    char node[600];
    snprintf(node, sizeof node, "%s/uverbs0", f->fx.dev);
    assert_int_equal(mknod(node, S_IFCHR | 0600, makedev(1, 3)), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    hp_close(&f->p);
    if (f->p.pid > 0)
        (void)hp_wait(&f->p, WAIT_MS);
    hp_fixture_destroy(&f->fx);
    free(f);
    return 0;
}

/* Run the copy as nobody through setpriv. */
static void run_as_nobody(struct fixture *f)
{
    const char *argv[] = {SETPRIV, "--reuid=65534", "--regid=65534", "--clear-groups", "--", f->exe,
                          "--sysfs-root", f->fx.sysfs, "--policy-dir", f->fx.policy, "--dev-dir", f->fx.dev,
                          "--shm-dir", f->fx.shm, "--policy-owner", "0", "--device-context", "fake", NULL};
    struct hp_spawn_opts o = {.argv = argv};
    assert_int_equal(hp_spawn(&f->p, &o), 0);
}

static void read_proc_status(pid_t pid, char *buf, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    ssize_t n = read(fd, buf, len - 1);
    assert_true(n > 0);
    buf[n] = '\0';
    close(fd);
}

/* Between calls: only the expected set permitted, nothing effective, inheritable or ambient. */
static void expect_bracketed_caps(pid_t pid)
{
    char status[8192];
    read_proc_status(pid, status, sizeof status);
    uint64_t v = 99;
    assert_true(hp_status_field(status, "CapEff:", 16, &v));
    assert_int_equal(v, 0);
    assert_true(hp_status_field(status, "CapPrm:", 16, &v));
    assert_int_equal(v, EXPECTED_CAPS);
    assert_true(hp_status_field(status, "CapInh:", 16, &v));
    assert_int_equal(v, 0);
    assert_true(hp_status_field(status, "CapAmb:", 16, &v));
    assert_int_equal(v, 0);
    assert_true(hp_status_field(status, "NoNewPrivs:", 10, &v));
    assert_int_equal(v, 1);
    assert_true(hp_status_field(status, "Seccomp:", 10, &v));
    assert_int_equal(v, 2);
    assert_true(hp_status_field(status, "Uid:", 10, &v));
    assert_int_equal(v, NOBODY);
    /* Not dumpable: the entries inside its /proc directory belong to root, not to the tenant. */
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_uid, 0);
}

static void test_expected_caps_bracketed_and_used(void **state)
{
    struct fixture *f = *state;
    install_copy(f, "cap_chown,cap_dac_override=p");
    run_as_nobody(f);

    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_encode_hello(f->p.seq++, req, &len), 0);
    assert_int_equal(hp_call(&f->p, req, len, NULL, 0, &m, rep, NULL), 0);
    int32_t status = 1;
    uint32_t version = 0, uid = 0, gid = 0, caps = 0;
    assert_int_equal(orb_hp_decode_hello_reply(&m, &status, &version, &uid, &gid, &caps), 0);
    assert_int_equal(status, 0);
    assert_int_equal(uid, NOBODY);
    assert_int_equal(gid, NOBODY);
    assert_int_equal(caps, EXPECTED_CAPS);
    expect_bracketed_caps(f->p.pid);

    /* CAP_DAC_OVERRIDE opens the root-only node... */
    assert_int_equal(orb_hp_encode_open_device(f->p.seq++, "mlx5_0", req, &len), 0);
    int fd = -1;
    assert_int_equal(hp_call(&f->p, req, len, NULL, 0, &m, rep, &fd), 0);
    uint32_t nfds = 0;
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(status, 0);
    assert_true(fd >= 0);
    close(fd);
    expect_bracketed_caps(f->p.pid);

    /* ...and CAP_CHOWN gives the new slot object to root. */
    assert_int_equal(orb_hp_encode_slot_attach(f->p.seq++, "caps-slot", ORB_SLOTS_DEFAULT_INTERVAL_NS, req, &len), 0);
    assert_int_equal(hp_call(&f->p, req, len, NULL, 0, &m, rep, &fd), 0);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(status, 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_uid, 0);
    assert_int_equal(st.st_mode & 07777, 0644);
    close(fd);
    expect_bracketed_caps(f->p.pid);

    hp_close(&f->p);
    int ws = hp_wait(&f->p, WAIT_MS);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
}

static void test_without_caps_privileged_calls_are_refused(void **state)
{
    struct fixture *f = *state;
    install_copy(f, "");
    run_as_nobody(f);
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_encode_hello(f->p.seq++, req, &len), 0);
    assert_int_equal(hp_call(&f->p, req, len, NULL, 0, &m, rep, NULL), 0);
    int32_t status = 1;
    uint32_t version = 0, uid = 0, gid = 0, caps = 99;
    assert_int_equal(orb_hp_decode_hello_reply(&m, &status, &version, &uid, &gid, &caps), 0);
    assert_int_equal(caps, 0);
    assert_int_equal(orb_hp_encode_open_device(f->p.seq++, "mlx5_0", req, &len), 0);
    int fd = -1;
    uint32_t nfds = 0;
    assert_int_equal(hp_call(&f->p, req, len, NULL, 0, &m, rep, &fd), 0);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(status, ORB_EPERM);
    assert_int_equal(orb_hp_encode_slot_attach(f->p.seq++, "caps-slot", ORB_SLOTS_DEFAULT_INTERVAL_NS, req, &len), 0);
    assert_int_equal(hp_call(&f->p, req, len, NULL, 0, &m, rep, &fd), 0);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(status, ORB_EUNAVAILABLE);
    char path[600];
    struct stat st;
    snprintf(path, sizeof path, "%s/caps-slot", f->fx.shm);
    assert_int_equal(lstat(path, &st), -1); /* nothing left behind */
    hp_close(&f->p);
    int ws = hp_wait(&f->p, WAIT_MS);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
}

static void test_unexpected_capability_refuses_to_start(void **state)
{
    struct fixture *f = *state;
    install_copy(f, "cap_chown,cap_dac_override,cap_net_raw=p");
    run_as_nobody(f);
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_encode_hello(f->p.seq++, req, &len), 0);
    assert_int_equal(hp_call(&f->p, req, len, NULL, 0, &m, rep, NULL), ORB_EPEER);
    int ws = hp_wait(&f->p, WAIT_MS);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 3);
}

int main(void)
{
    if (geteuid() != 0 || access(SETPRIV, X_OK) != 0) {
        printf("skipped: needs root and %s\n", SETPRIV);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unexpected_capability_refuses_to_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_without_caps_privileged_calls_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expected_caps_bracketed_and_used, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
