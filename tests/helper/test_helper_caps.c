/* The installed helper as installed: a copy of orbite-helper with `setcap
 * cap_chown,cap_dac_override=p`, run by an unprivileged user, in a private mount namespace
 * (sysns.h) whose /etc/orbite/policy.d, /sys, /dev and /dev/shm are the test's. Checks:
 *  - the worker, which reads the library's bytes, holds no capability; the monitor holds the
 *    two expected ones, under its own filter; both are not dumpable;
 *  - each capability does its one job (a root-only uverbs node is opened, a new slot object
 *    and the private directory belong to root), and a copy without them is refused both;
 *  - a copy with one capability too many, and the test build with any, refuse to start;
 *  - secure-mode environment strings that ld.so dropped (LD_AUDIT) are wiped from
 *    /proc/PID/environ;
 *  - an account database that cannot be read denies everything;
 *  - a start-up refusal under a tiny RLIMIT_NOFILE still reaches the log, and a symlinked
 *    policy directory is named as such there.
 * Needs root, mount namespaces and overlayfs: exits 77 (skipped) otherwise. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"
#include "helper_test_util.h"
#include "sysns.h"
#include "tenant.h"
#include "topo/slots.h"

#define WAIT_MS 10000
#define EXPECTED_CAPS ((1u << CAP_CHOWN) | (1u << CAP_DAC_OVERRIDE))
#define COPY "/etc/orbite/orbite-helper-copy"
#define SLOT "caps-slot"
#define PRIVATE_DIR "/dev/shm/orbite+helper"

#define EXIT_STARTUP 1
#define EXIT_CAPS 3

static const char policy_text[] = "[defaults]\ntransports = tcp, rdma\nnics = mlx5_0\nslots = " SLOT "\n";

static struct hp_proc proc = {.pid = 0, .sock = -1, .seq = 1};

static void empty_shm(void)
{
    DIR *d = opendir("/dev/shm");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[600];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        hp_remove_tree(path);
    }
    closedir(d);
}

static int setup(void **state)
{
    (void)state;
    empty_shm();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    hp_close(&proc);
    if (proc.pid > 0)
        (void)hp_wait(&proc, WAIT_MS);
    proc.seq = 1;
    return 0;
}

static void spawn_copy(const char *exe, const char *const *envp)
{
    const char *argv[] = {exe, NULL};
    struct hp_spawn_opts o = {.argv = argv, .envp = envp}; /* as nobody (tenant.h) */
    assert_int_equal(hp_spawn(&proc, &o), 0);
}

static uint32_t hello_caps(void)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_encode_hello(proc.seq++, req, &len), 0);
    assert_int_equal(hp_call(&proc, req, len, NULL, 0, &m, rep, NULL), 0);
    int32_t status = 1;
    uint32_t version = 0, uid = 0, gid = 0, caps = 99;
    assert_int_equal(orb_hp_decode_hello_reply(&m, &status, &version, &uid, &gid, &caps), 0);
    assert_int_equal(status, 0);
    assert_int_equal(uid, HP_TENANT_ID);
    return caps;
}

static int32_t fd_request(const uint8_t *req, size_t len, int *fd_out)
{
    uint8_t rep[ORB_HP_MAX_MSG];
    struct orb_hp_msg m;
    int fd = -1;
    assert_int_equal(hp_call(&proc, req, len, NULL, 0, &m, rep, &fd), 0);
    int32_t status = 1;
    uint32_t nfds = 9;
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_true(status == 0 ? fd >= 0 : fd < 0);
    if (fd_out)
        *fd_out = fd;
    else if (fd >= 0)
        close(fd);
    return status;
}

static int32_t open_device(const char *nic)
{
    uint8_t req[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_open_device(proc.seq++, nic, req, &len), 0);
    return fd_request(req, len, NULL);
}

static int32_t slot_attach(const char *name, int *fd_out)
{
    uint8_t req[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_slot_attach(proc.seq++, name, ORB_SLOTS_DEFAULT_INTERVAL_NS, req, &len), 0);
    return fd_request(req, len, fd_out);
}

/* The POLICY reply of the current session, its status asserted 0. */
static struct orb_hp_policy policy_now(void)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_encode_empty(ORB_HP_POLICY, proc.seq++, req, &len), 0);
    assert_int_equal(hp_call(&proc, req, len, NULL, 0, &m, rep, NULL), 0);
    struct orb_hp_policy pol;
    int32_t status = 1;
    assert_int_equal(orb_hp_decode_policy_reply(&m, &status, &pol), 0);
    assert_int_equal(status, 0);
    return pol;
}

static void expect_exit(int code)
{
    hp_close(&proc);
    int ws = hp_wait(&proc, WAIT_MS);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), code);
}

/* /proc/PID/status as text. */
static void read_status(pid_t pid, char *buf, size_t len)
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

static uint64_t status_field(const char *status, const char *key, int base)
{
    uint64_t v = 0;
    assert_true(hp_status_field(status, key, base, &v));
    return v;
}

/* The one child of `parent` (the monitor of a worker). */
static pid_t child_of(pid_t parent)
{
    pid_t found = hp_child_of(parent, 1000);
    assert_true(found > 0);
    return found;
}

/* The monitor of `worker` once its start-up is over, its /proc status into `status`. The worker
 * answers HELLO as soon as it forked the monitor, which makes its capabilities effective and
 * loads its filter a moment later: under load the test can look in between. Within 2 s, or the
 * status as it is then. */
static pid_t settled_monitor(pid_t worker, char *status, size_t len)
{
    pid_t monitor = -1;
    for (int waited = 0; waited <= 2000; waited += 5) {
        monitor = child_of(worker);
        read_status(monitor, status, len);
        uint64_t eff = 0, seccomp = 0;
        if (hp_status_field(status, "CapEff:", 16, &eff) && eff == EXPECTED_CAPS &&
            hp_status_field(status, "Seccomp:", 10, &seccomp) && seccomp == 2)
            break;
        (void)poll(NULL, 0, 5);
    }
    return monitor;
}

/* Not dumpable: the entries inside its /proc directory belong to root, not to the tenant. */
static void expect_undumpable(pid_t pid)
{
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_uid, 0);
}

/* ---- the split of privilege --------------------------------------------------------------- */

static void test_worker_holds_nothing_monitor_holds_two_and_uses_them(void **state)
{
    (void)state;
    assert_int_equal(sysns_install_copy(ORB_HELPER_EXE, COPY, "cap_chown,cap_dac_override=p"), 0);
    spawn_copy(COPY, NULL);
    assert_int_equal(hello_caps(), EXPECTED_CAPS); /* what the monitor keeps */

    char status[8192];
    read_status(proc.pid, status, sizeof status);
    assert_int_equal(status_field(status, "Uid:", 10), HP_TENANT_ID);
    assert_int_equal(status_field(status, "CapPrm:", 16), 0);
    assert_int_equal(status_field(status, "CapEff:", 16), 0);
    assert_int_equal(status_field(status, "CapInh:", 16), 0);
    assert_int_equal(status_field(status, "CapAmb:", 16), 0);
    assert_int_equal(status_field(status, "NoNewPrivs:", 10), 1);
    assert_int_equal(status_field(status, "Seccomp:", 10), 2);
    expect_undumpable(proc.pid);

    pid_t monitor = settled_monitor(proc.pid, status, sizeof status);
    assert_int_equal(status_field(status, "Uid:", 10), HP_TENANT_ID);
    assert_int_equal(status_field(status, "CapPrm:", 16), EXPECTED_CAPS);
    assert_int_equal(status_field(status, "CapEff:", 16), EXPECTED_CAPS);
    assert_int_equal(status_field(status, "CapInh:", 16), 0);
    assert_int_equal(status_field(status, "CapAmb:", 16), 0);
    assert_int_equal(status_field(status, "NoNewPrivs:", 10), 1);
    assert_int_equal(status_field(status, "Seccomp:", 10), 2);
    expect_undumpable(monitor);

    /* CAP_DAC_OVERRIDE opens the root-only node: the device context then fails on the stand-in
     * node (ORB_EUNAVAILABLE), where a refused open would be ORB_EPERM. */
    assert_int_equal(open_device("mlx5_0"), ORB_EUNAVAILABLE);

    /* CAP_CHOWN gives the private directory and the new slot object to root. */
    int fd = -1;
    assert_int_equal(slot_attach(SLOT, &fd), 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_uid, 0);
    assert_int_equal(st.st_mode & 07777, 0644);
    assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    close(fd);
    assert_int_equal(lstat(PRIVATE_DIR, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_uid, 0);
    assert_int_equal(st.st_mode & 07777, 0700);
    /* The tenant cannot enter it, nor take the publication lock inside. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (hp_become_tenant() != 0)
            _exit(2);
        int dfd = open(PRIVATE_DIR, O_RDONLY | O_DIRECTORY);
        _exit(dfd < 0 && errno == EACCES ? 0 : 1);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);

    /* The monitor ends with the worker. */
    expect_exit(0);
    for (int tries = 0; tries < 400 && kill(monitor, 0) == 0; tries++)
        (void)poll(NULL, 0, 5);
    assert_int_equal(kill(monitor, 0), -1);
}

static void test_without_caps_privileged_steps_are_refused(void **state)
{
    (void)state;
    assert_int_equal(sysns_install_copy(ORB_HELPER_EXE, COPY, ""), 0);
    spawn_copy(COPY, NULL);
    assert_int_equal(hello_caps(), 0);
    assert_int_equal(open_device("mlx5_0"), ORB_EPERM);
    int fd = -1;
    assert_int_equal(slot_attach(SLOT, &fd), ORB_EUNAVAILABLE);
    struct stat st;
    assert_int_equal(lstat("/dev/shm/" SLOT, &st), -1); /* nothing left behind */
    assert_int_equal(lstat(PRIVATE_DIR, &st), -1);      /* not even a half-made directory */
    expect_exit(0);
}

static void expect_refusal_at_start(const char *exe)
{
    spawn_copy(exe, NULL);
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_encode_hello(proc.seq++, req, &len), 0);
    assert_int_equal(hp_call(&proc, req, len, NULL, 0, &m, rep, NULL), ORB_EPEER);
    int ws = hp_wait(&proc, WAIT_MS);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), EXIT_CAPS);
}

static void test_unexpected_capability_refuses_to_start(void **state)
{
    (void)state;
    assert_int_equal(sysns_install_copy(ORB_HELPER_EXE, COPY, "cap_chown,cap_dac_override,cap_net_raw=p"), 0);
    expect_refusal_at_start(COPY);
}

static void test_test_build_with_any_capability_refuses_to_start(void **state)
{
    (void)state;
    assert_int_equal(sysns_install_copy(ORB_HELPER_TEST_EXE, COPY, "cap_chown=p"), 0);
    expect_refusal_at_start(COPY);
    assert_int_equal(sysns_install_copy(ORB_HELPER_TEST_EXE, COPY, "cap_chown,cap_dac_override=p"), 0);
    expect_refusal_at_start(COPY);
}

/* ---- start-up ------------------------------------------------------------------------------- */

/* Non-NUL bytes of /proc/PID/environ (root may read it even when the process is not dumpable). */
static size_t environ_bytes(pid_t pid)
{
    char path[64], buf[65536];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    assert_true(n >= 0);
    size_t count = 0;
    for (ssize_t i = 0; i < n; i++)
        count += buf[i] != '\0';
    return count;
}

static void test_secure_mode_environment_is_wiped(void **state)
{
    (void)state;
    assert_int_equal(sysns_install_copy(ORB_HELPER_EXE, COPY, "cap_chown,cap_dac_override=p"), 0);
    /* In secure mode ld.so drops LD_AUDIT and LD_PRELOAD from environ but not from memory. */
    static const char *const env[] = {"LD_AUDIT=/nonexistent/audit.so", "LD_PRELOAD=/nonexistent/preload.so",
                                      "ORBITE_TEST_SECRET=do-not-leak", NULL};
    spawn_copy(COPY, env);
    assert_int_equal(hello_caps(), EXPECTED_CAPS);
    assert_int_equal(environ_bytes(proc.pid), 0);
    assert_int_equal(environ_bytes(child_of(proc.pid)), 0);
    expect_exit(0);
}

static void test_unreadable_accounts_deny_everything(void **state)
{
    (void)state;
    assert_int_equal(sysns_install_copy(ORB_HELPER_EXE, COPY, "cap_chown,cap_dac_override=p"), 0);
    /* In the namespace's /etc overlay only: the account files alone, and a passwd file the tenant
     * cannot read, which makes getpwuid_r() fail (EACCES) rather than find nothing. */
    assert_int_equal(hp_write_file("/etc", "nsswitch.conf", "passwd: files [UNAVAIL=return]\ngroup: files\n", 0644), 0);
    struct stat saved;
    assert_int_equal(stat("/etc/passwd", &saved), 0);
    assert_int_equal(chmod("/etc/passwd", 0), 0);
    spawn_copy(COPY, NULL);
    (void)hello_caps();
    struct orb_hp_policy pol = policy_now();
    assert_int_equal(chmod("/etc/passwd", saved.st_mode & 07777), 0);
    assert_int_equal(pol.transports, 0);
    assert_int_equal(pol.nic_mask, 0);
    assert_int_equal(pol.nslots, 0);
    expect_exit(0);

    /* Readable again: the same tenant gets what [defaults] grants. */
    spawn_copy(COPY, NULL);
    (void)hello_caps();
    pol = policy_now();
    assert_true(pol.transports & ORB_HP_T_RDMA);
    assert_int_equal(pol.nslots, 1);
    expect_exit(0);
}

/* The namespace's own /dev/log (its /dev is an overlay), bound here: what the helper logs. */
static int bind_log(void)
{
    int log = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(log >= 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "/dev/log");
    (void)unlink("/dev/log");
    assert_int_equal(bind(log, (const struct sockaddr *)&addr, sizeof addr), 0);
    assert_int_equal(chmod("/dev/log", 0666), 0);
    return log;
}

/* The next line logged, within 2 s. */
static void next_log_line(int log, char *line, size_t len)
{
    struct pollfd p = {.fd = log, .events = POLLIN, .revents = 0};
    assert_int_equal(poll(&p, 1, 2000), 1);
    ssize_t n = recv(log, line, len - 1, 0);
    assert_true(n > 0);
    line[n] = '\0';
}

static void test_refusal_under_a_tiny_descriptor_limit_is_logged(void **state)
{
    (void)state;
    assert_int_equal(sysns_install_copy(ORB_HELPER_EXE, COPY, "cap_chown,cap_dac_override=p"), 0);
    int log = bind_log();
    for (unsigned long limit = 5; limit <= 6; limit++) {
        const char *argv[] = {COPY, NULL};
        struct hp_spawn_opts o = {.argv = argv, .nofile = limit};
        assert_int_equal(hp_spawn(&proc, &o), 0);
        int ws = hp_wait(&proc, WAIT_MS);
        assert_true(WIFEXITED(ws));
        assert_int_equal(WEXITSTATUS(ws), EXIT_STARTUP);
        hp_close(&proc);
        char line[1024];
        next_log_line(log, line, sizeof line);
        print_message("limit %lu: %s\n", limit, line);
        assert_non_null(strstr(line, "orbite-helper"));
        assert_non_null(strstr(line, "RLIMIT_NOFILE"));
    }
    close(log);
    (void)unlink("/dev/log");
}

/* A symlinked policy directory denies everything, and the log names the cause. */
static void test_symlinked_policy_directory_is_named_in_the_log(void **state)
{
    (void)state;
    assert_int_equal(sysns_install_copy(ORB_HELPER_EXE, COPY, "cap_chown,cap_dac_override=p"), 0);
    int log = bind_log();
    assert_int_equal(rename("/etc/orbite/policy.d", "/etc/orbite/policy.real"), 0);
    assert_int_equal(symlink("policy.real", "/etc/orbite/policy.d"), 0);
    spawn_copy(COPY, NULL);
    (void)hello_caps();
    struct orb_hp_policy pol = policy_now();
    assert_int_equal(unlink("/etc/orbite/policy.d"), 0);
    assert_int_equal(rename("/etc/orbite/policy.real", "/etc/orbite/policy.d"), 0);
    assert_int_equal(pol.transports, 0);
    assert_int_equal(pol.nslots, 0);
    expect_exit(0);
    char line[1024];
    next_log_line(log, line, sizeof line);
    print_message("%s\n", line);
    assert_non_null(strstr(line, "/etc/orbite/policy.d"));
    assert_non_null(strstr(line, "symbolic link"));
    assert_null(strstr(line, "unknown key"));
    close(log);
    (void)unlink("/dev/log");
}

int main(void)
{
    if (!sysns_available()) {
        printf("skipped: needs root, mount namespaces and overlayfs\n");
        return 77;
    }
    /* A fixture /sys (two mlx5 NICs, uverbs0 = 1:3) and a root-only stand-in node. */
    struct hp_fixture fx;
    if (hp_fixture_create(&fx, "two-socket") != 0 || hp_fixture_mark_mlx5(&fx, "mlx5_0") != 0) {
        printf("cannot build the fixture\n");
        return 1;
    }
    struct sysns ns;
    memset(&ns, 0, sizeof ns);
    if (sysns_enter(&ns, fx.sysfs, true) != 0 || sysns_write_policy("10-test.ini", policy_text) != 0 ||
        mkdir("/dev/infiniband", 0755) != 0 || mknod("/dev/infiniband/uverbs0", S_IFCHR | 0600, makedev(1, 3)) != 0) {
        printf("cannot build the private system\n");
        hp_fixture_destroy(&fx);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_worker_holds_nothing_monitor_holds_two_and_uses_them, setup, teardown),
        cmocka_unit_test_setup_teardown(test_without_caps_privileged_steps_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unexpected_capability_refuses_to_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_test_build_with_any_capability_refuses_to_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secure_mode_environment_is_wiped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreadable_accounts_deny_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusal_under_a_tiny_descriptor_limit_is_logged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_symlinked_policy_directory_is_named_in_the_log, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    hp_fixture_destroy(&fx);
    return rc;
}
