/* orbite-helper as a process: start-up, the real seccomp filter, dispatch rules and every
 * request, through the test build (orbite-helper-test) and the installed build. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "common/helper_proto.h"
#include "helper/helper.h"
#include "helper/testing.h"
#include "helper_test_util.h"
#include "tenant.h"
#include "topo/slots.h"
#include "topo/sysfs.h"

#define WAIT_MS 10000
#define SLOT_NAME "orbite-test-slot"

#define EXIT_EOF 0
#define EXIT_PROTOCOL 2
#define EXIT_ORPHAN 4
#define EXIT_STALLED 5
#define EXIT_USAGE 64

static const char policy_mlx5_0[] = "[defaults]\n"
                                    "transports = tcp, rdma\n"
                                    "nics = mlx5_0\n"
                                    "gpus = *\n"
                                    "slots = " SLOT_NAME "\n";

static const char policy_all_nics[] = "[defaults]\n"
                                      "transports = tcp, rdma\n"
                                      "nics = *\n";

struct session {
    struct hp_fixture fx;
    struct hp_proc p;
    char owner[16];
};

/* A character device the tenant may open (mknod's mode is cut by the umask). */
static int make_node(const char *path, dev_t dev)
{
    return mknod(path, S_IFCHR | 0666, dev) == 0 && chmod(path, 0666) == 0 ? 0 : -1;
}

/* Start orbite-helper-test on the fixture tree with `policy` (NULL: no policy file) and device
 * context creation `context` ("kernel", as installed, or "fake" for stand-in nodes). */
static void start_with(struct session *s, const char *policy, const char *context)
{
    if (policy) {
        assert_int_equal(hp_write_file(s->fx.policy, "10-test.ini", policy, 0644), 0);
        char path[600];
        snprintf(path, sizeof path, "%s/10-test.ini", s->fx.policy);
        assert_int_equal(hp_give_to_tenant(path), 0);
    }
    /* The tenant administers its own fixture: policy files and slot objects are its. */
    snprintf(s->owner, sizeof s->owner, "%u", (unsigned)hp_tenant_uid());
    const char *argv[] = {ORB_HELPER_TEST_EXE, "--sysfs-root", s->fx.sysfs, "--policy-dir", s->fx.policy,
                          "--dev-dir", s->fx.dev, "--shm-dir", s->fx.shm, "--policy-owner", s->owner,
                          "--device-context", context, NULL};
    struct hp_spawn_opts o = {.argv = argv, .leak_fd = true};
    assert_int_equal(hp_spawn(&s->p, &o), 0);
}

static void start(struct session *s, const char *policy)
{
    start_with(s, policy, "kernel");
}

static int setup(void **state)
{
    struct session *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->p.sock = -1;
    assert_int_equal(hp_fixture_create(&s->fx, "two-socket"), 0);
    assert_int_equal(hp_fixture_mark_mlx5(&s->fx, "mlx5_0"), 0);
    assert_int_equal(hp_fixture_mark_mlx5(&s->fx, "mlx5_1"), 0);
    *state = s;
    return 0;
}

static int teardown(void **state)
{
    struct session *s = *state;
    hp_close(&s->p);
    if (s->p.pid > 0)
        (void)hp_wait(&s->p, WAIT_MS);
    hp_fixture_destroy(&s->fx);
    free(s);
    return 0;
}

/* Close the socket and expect a clean exit. */
static void expect_exit(struct session *s, int code)
{
    hp_close(&s->p);
    int status = hp_wait(&s->p, WAIT_MS);
    assert_true(status >= 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), code);
}

/* Send one datagram and expect the helper to end the session with `code` without replying. */
static void expect_session_end(struct session *s, const uint8_t *req, size_t len, const int *fds, size_t nfds,
                               int code)
{
    uint8_t rep[ORB_HP_MAX_MSG];
    struct orb_hp_msg m;
    int rc = hp_call(&s->p, req, len, fds, nfds, &m, rep, NULL);
    assert_int_equal(rc, ORB_EPEER); /* EOF, no reply */
    int status = hp_wait(&s->p, WAIT_MS);
    assert_true(status >= 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), code);
}

static int32_t status_of(struct session *s, const uint8_t *req, size_t len, int *fd_out)
{
    uint8_t rep[ORB_HP_MAX_MSG];
    struct orb_hp_msg m;
    assert_int_equal(hp_call(&s->p, req, len, NULL, 0, &m, rep, fd_out), 0);
    assert_int_equal(m.hdr.type, ((uint16_t)(req[6] | req[7] << 8)) + 1);
    int32_t status = 1;
    assert_int_equal(orb_hp_decode_status(&m, &status), 0);
    return status;
}

static int32_t open_device(struct session *s, const char *nic, int *fd_out)
{
    uint8_t req[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_open_device(s->p.seq++, nic, req, &len), 0);
    uint8_t rep[ORB_HP_MAX_MSG];
    struct orb_hp_msg m;
    int fd = -1;
    assert_int_equal(hp_call(&s->p, req, len, NULL, 0, &m, rep, &fd), 0);
    int32_t status = 1;
    uint32_t nfds = 9;
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_int_equal(nfds, status == 0 ? 1u : 0u);
    assert_true(status == 0 ? fd >= 0 : fd < 0);
    if (fd_out)
        *fd_out = fd;
    else if (fd >= 0)
        close(fd);
    return status;
}

static int32_t slot_attach(struct session *s, const char *name, uint64_t interval, int *fd_out)
{
    uint8_t req[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_slot_attach(s->p.seq++, name, interval, req, &len), 0);
    uint8_t rep[ORB_HP_MAX_MSG];
    struct orb_hp_msg m;
    int fd = -1;
    assert_int_equal(hp_call(&s->p, req, len, NULL, 0, &m, rep, &fd), 0);
    int32_t status = 1;
    uint32_t nfds = 9;
    assert_int_equal(orb_hp_decode_fd_reply(&m, &status, &nfds), 0);
    assert_true(status == 0 ? fd >= 0 : fd < 0);
    *fd_out = fd;
    return status;
}

static uint32_t inventory_total(struct session *s, uint8_t kind, uint32_t index, struct orb_topo_nic *nic,
                                int32_t *status)
{
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_inventory(s->p.seq++, kind, index, req, &len), 0);
    struct orb_hp_msg m;
    assert_int_equal(hp_call(&s->p, req, len, NULL, 0, &m, rep, NULL), 0);
    static struct orb_topo_nic nic_buf;
    static struct orb_topo_gpu gpu_buf;
    static struct orb_topo_numa numa_buf;
    uint32_t total = 0;
    assert_int_equal(orb_hp_decode_inventory_reply(&m, kind, status, &total, &nic_buf, &gpu_buf, &numa_buf), 0);
    if (nic)
        *nic = nic_buf;
    return total;
}

/* ---- refusals at start-up ---------------------------------------------------------------------- */

static void test_installed_helper_refuses_test_options(void **state)
{
    struct session *s = *state;
    /* The fixture tree would give the tenant mlx5_0; the installed helper must not even look. */
    assert_int_equal(hp_write_file(s->fx.policy, "10-test.ini", policy_all_nics, 0644), 0);
    const char *argv[] = {ORB_HELPER_EXE, "--sysfs-root", s->fx.sysfs, "--policy-dir", s->fx.policy, NULL};
    struct hp_spawn_opts o = {.argv = argv};
    assert_int_equal(hp_spawn(&s->p, &o), 0);
    uint8_t req[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_hello(1, req, &len), 0);
    expect_session_end(s, req, len, NULL, 0, EXIT_USAGE);
}

static void test_fd3_not_a_socket_exits(void **state)
{
    struct session *s = *state;
    const char *argv[] = {ORB_HELPER_TEST_EXE, NULL};
    struct hp_spawn_opts o = {.argv = argv, .fd3_not_socket = true};
    assert_int_equal(hp_spawn(&s->p, &o), 0);
    int status = hp_wait(&s->p, WAIT_MS);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), EXIT_ORPHAN);
}

static void test_installed_helper_serves_hello(void **state)
{
    struct session *s = *state;
    const char *argv[] = {ORB_HELPER_EXE, NULL};
    struct hp_spawn_opts o = {.argv = argv};
    assert_int_equal(hp_spawn(&s->p, &o), 0);
    assert_int_equal(hp_hello(&s->p), 0);
    expect_exit(s, EXIT_EOF);
}

/* ---- the sandbox ------------------------------------------------------------------------------- */

static void test_forbidden_syscall_kills_with_sigsys(void **state)
{
    struct session *s = *state;
    start(s, NULL);
    assert_int_equal(hp_hello(&s->p), 0);
    uint8_t req[ORB_HP_HEADER_LEN], rep[ORB_HP_MAX_MSG];
    hp_raw_header(req, ORB_HELPER_TEST_FORBIDDEN, ORB_HP_HEADER_LEN, s->p.seq++);
    struct orb_hp_msg m;
    assert_int_equal(hp_call(&s->p, req, sizeof req, NULL, 0, &m, rep, NULL), ORB_EPEER);
    int status = hp_wait(&s->p, WAIT_MS);
    assert_true(status >= 0);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGSYS);
}

/* What the worker's filter refuses by its arguments, or outright now that the monitor does the
 * privileged steps: opening a path (AT_FDCWD), removing an entry, touching capabilities. */
static void test_forbidden_arguments_kill_with_sigsys(void **state)
{
    struct session *s = *state;
    static const uint16_t calls[] = {ORB_HELPER_TEST_FORBIDDEN_OPENAT, ORB_HELPER_TEST_FORBIDDEN_UNLINKAT,
                                     ORB_HELPER_TEST_FORBIDDEN_CAPSET};
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        start(s, NULL);
        assert_int_equal(hp_hello(&s->p), 0);
        uint8_t req[ORB_HP_HEADER_LEN], rep[ORB_HP_MAX_MSG];
        hp_raw_header(req, calls[i], ORB_HP_HEADER_LEN, s->p.seq++);
        struct orb_hp_msg m;
        assert_int_equal(hp_call(&s->p, req, sizeof req, NULL, 0, &m, rep, NULL), ORB_EPEER);
        int status = hp_wait(&s->p, WAIT_MS);
        assert_true(status >= 0);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSYS)
            fail_msg("test request 0x%x: wait status 0x%x, expected SIGSYS", calls[i], status);
        hp_close(&s->p);
        s->p.seq = 1;
    }
}

static uint64_t slot_sequence(const void *map)
{
    return __atomic_load_n((const uint64_t *)((const uint8_t *)map + 72), __ATOMIC_ACQUIRE);
}

/* Whether the slot's sequence advances within `ms`. */
static bool slot_advances(const void *map, int ms)
{
    uint64_t before = slot_sequence(map);
    for (int waited = 0; waited < ms; waited += 2) {
        usleep(2000);
        if (slot_sequence(map) != before)
            return true;
    }
    return false;
}

/* A library that sends requests and never reads the replies: the worker gives up on it within
 * its reply deadline and ends the session with its own exit code, while the slot it publishes
 * stays current the whole time (the monitor publishes, not the worker), and a second helper on
 * the same slot takes over once the first is gone. */
static void test_library_that_never_reads_is_dropped_and_publication_goes_on(void **state)
{
    struct session *s = *state;
    start(s, policy_mlx5_0);
    assert_int_equal(hp_hello(&s->p), 0);
    int fd = -1;
    assert_int_equal(slot_attach(s, SLOT_NAME, ORB_SLOTS_DEFAULT_INTERVAL_NS, &fd), 0);
    void *map = mmap(NULL, ORB_HELPER_SLOT_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    assert_ptr_not_equal(map, MAP_FAILED);
    close(fd);
    /* A second session of the same tenant attached to the same object, not publishing. */
    struct hp_proc first = s->p; /* the session that will stall */
    start(s, NULL);              /* the policy file is already there */
    struct hp_proc other = s->p;
    s->p = first;
    assert_int_equal(hp_hello(&other), 0);
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_slot_attach(other.seq++, SLOT_NAME, ORB_SLOTS_DEFAULT_INTERVAL_NS, req, &len), 0);
    struct orb_hp_msg m;
    int other_fd = -1;
    assert_int_equal(hp_call(&other, req, len, NULL, 0, &m, rep, &other_fd), 0);
    assert_true(other_fd >= 0);
    close(other_fd);

    /* Keep sending whenever the socket takes more, never reading, until the helper gives up. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    unsigned sent = 0;
    bool checked = false;
    int status = -1;
    double waited = 0;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        if (waited > 8.0)
            fail_msg("the helper still serves a library that never reads, after %.1f s and %u requests", waited, sent);
        assert_int_equal(orb_hp_encode_empty(ORB_HP_POLICY, s->p.seq++, req, &len), 0);
        if (send(s->p.sock, req, len, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)len) {
            sent++;
            continue;
        }
        if (!checked && sent > 10) {
            /* The worker is stuck on a reply or about to be; the slot is still published. */
            assert_true(slot_advances(map, 200));
            checked = true;
        }
        pid_t r = waitpid(s->p.pid, &status, WNOHANG);
        if (r == s->p.pid) {
            s->p.pid = 0;
            break;
        }
        usleep(1000);
    }
    print_message("sent %u requests, never reading; the session ended after %.2f s\n", sent, waited);
    assert_true(checked);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), EXIT_STALLED);
    hp_close(&s->p);
    /* The other helper takes over within its takeover interval. */
    usleep(50000);
    assert_true(slot_advances(map, 200));
    munmap(map, ORB_HELPER_SLOT_SIZE);
    hp_close(&other);
    status = hp_wait(&other, WAIT_MS);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), EXIT_EOF);
}

static void test_environment_fds_and_confinement_after_start(void **state)
{
    struct session *s = *state;
    start(s, NULL); /* spawned with a secret in the environment and fd 9 leaked */
    assert_int_equal(hp_hello(&s->p), 0);
    struct hp_self_report r;
    assert_int_equal(hp_self_report(&s->p, &r), 0);
    assert_int_equal(r.environ_bytes, 0);
    /* 0-2 (/dev/null), 3 (the socket), the held sysfs, the test build's /proc/self, and the
     * monitor's socket: /dev/infiniband and /dev/shm stay with the monitor. */
    assert_int_equal(r.nfds, 7);
    for (int i = 0; i < 6; i++)
        assert_int_equal(r.fds[i], i);
    uint64_t v = 99;
    assert_true(hp_status_field(r.status, "NoNewPrivs:", 10, &v));
    assert_int_equal(v, 1);
    assert_true(hp_status_field(r.status, "Seccomp:", 10, &v));
    assert_int_equal(v, 2); /* filter mode */
    assert_true(hp_status_field(r.status, "CapEff:", 16, &v));
    assert_int_equal(v, 0);
    assert_true(hp_status_field(r.status, "CapInh:", 16, &v));
    assert_int_equal(v, 0);
    assert_true(hp_status_field(r.status, "CapAmb:", 16, &v));
    assert_int_equal(v, 0);
    assert_true(hp_status_field(r.status, "CapPrm:", 16, &v));
    assert_int_equal(v & ~(uint64_t)3, 0); /* at most CAP_CHOWN and CAP_DAC_OVERRIDE */
    if (getuid() != 0) {
        /* Inside a non-dumpable process's /proc directory, entries belong to root. */
        char path[64];
        struct stat st;
        snprintf(path, sizeof path, "/proc/%d/fd", (int)s->p.pid);
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(st.st_uid, 0);
    }
    expect_exit(s, EXIT_EOF);
}

/* ---- a whole session under the filter -------------------------------------------------------- */

static void test_full_session_every_request(void **state)
{
    struct session *s = *state;
    /* Evidence for the peer-memory probe: one version file, and a bare module directory. */
    assert_int_equal(hp_mkdirs(s->fx.sysfs, "module/nvidia_peermem", 0755), 0);
    char mod[600];
    snprintf(mod, sizeof mod, "%s/module/nvidia_peermem", s->fx.sysfs);
    assert_int_equal(hp_write_file(mod, "version", "1.0\n", 0444), 0);
    assert_int_equal(hp_mkdirs(s->fx.sysfs, "kernel/mm/memory_peers/nv_mem", 0755), 0);
    /* As root, a character device with mlx5_0's numbers (1:3) stands in for uverbs0. */
    char node[600];
    snprintf(node, sizeof node, "%s/uverbs0", s->fx.dev);
    bool have_node = getuid() == 0 && make_node(node, makedev(1, 3)) == 0;

    int sysfd = open(s->fx.sysfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    static struct orb_topo_inventory inv;
    assert_int_equal(orb_topo_load_sysfs(sysfd, &inv), 0);
    close(sysfd);
    assert_true(inv.nnics >= 2);

    /* The stand-in node has no uverbs ioctl: the full session fakes the device context
     * (test_open_device_real_context_under_the_filter runs the real one). */
    start_with(s, policy_mlx5_0, "fake");
    assert_int_equal(hp_hello(&s->p), 0);

    /* POLICY */
    uint8_t req[ORB_HP_MAX_MSG], rep[ORB_HP_MAX_MSG];
    size_t len = 0;
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_encode_empty(ORB_HP_POLICY, s->p.seq++, req, &len), 0);
    assert_int_equal(hp_call(&s->p, req, len, NULL, 0, &m, rep, NULL), 0);
    static struct orb_hp_policy pol;
    int32_t status = 1;
    assert_int_equal(orb_hp_decode_policy_reply(&m, &status, &pol), 0);
    assert_int_equal(status, 0);
    assert_int_equal(pol.nic_mask, 1u); /* mlx5_0 is NIC id 0 */
    assert_true(pol.transports & ORB_HP_T_RDMA);
    assert_int_equal(pol.nslots, 1);
    assert_string_equal(pol.slots[0], SLOT_NAME);

    /* INVENTORY: NICs filtered to mlx5_0, GPUs and NUMA nodes as discovered */
    struct orb_topo_nic nic;
    assert_int_equal(inventory_total(s, ORB_HP_INV_NIC, 0, &nic, &status), 1);
    assert_int_equal(status, 0);
    assert_string_equal(nic.name, "mlx5_0");
    assert_int_equal(nic.id, 0);
    inventory_total(s, ORB_HP_INV_NIC, 1, NULL, &status);
    assert_int_equal(status, ORB_ENOENT);
    if (inv.ngpus > 0) {
        assert_int_equal(inventory_total(s, ORB_HP_INV_GPU, 0, NULL, &status), inv.ngpus);
        assert_int_equal(status, 0);
    }
    if (inv.nnuma > 0) {
        assert_int_equal(inventory_total(s, ORB_HP_INV_NUMA, inv.nnuma - 1, NULL, &status), inv.nnuma);
        assert_int_equal(status, 0);
    }

    /* OPEN_DEVICE: denied, unknown, and the allowed NIC */
    assert_int_equal(open_device(s, "mlx5_1", NULL), ORB_EPERM);
    assert_int_equal(open_device(s, "mlx5_9", NULL), ORB_ENOENT);
    int dev_fd = -1;
    int32_t open_status = open_device(s, "mlx5_0", &dev_fd);
    if (have_node) {
        assert_int_equal(open_status, 0);
        struct stat st;
        assert_int_equal(fstat(dev_fd, &st), 0);
        assert_true(S_ISCHR(st.st_mode));
        assert_int_equal(st.st_rdev, makedev(1, 3));
        assert_true(fcntl(dev_fd, F_GETFD) & FD_CLOEXEC);
        close(dev_fd);
    } else {
        assert_int_equal(open_status, ORB_EUNAVAILABLE); /* no node in the fake /dev/infiniband */
    }

    /* PEERMEM_PROBE: only the version file counts */
    assert_int_equal(orb_hp_encode_empty(ORB_HP_PEERMEM_PROBE, s->p.seq++, req, &len), 0);
    assert_int_equal(hp_call(&s->p, req, len, NULL, 0, &m, rep, NULL), 0);
    uint32_t found = 0;
    assert_int_equal(orb_hp_decode_peermem_reply(&m, &status, &found), 0);
    assert_int_equal(status, 0);
    assert_int_equal(found, 1u << 2);

    /* SLOT_ATTACH: not in the policy, then ours */
    int slot_fd = -1;
    assert_int_equal(slot_attach(s, "someone-elses", ORB_SLOTS_DEFAULT_INTERVAL_NS, &slot_fd), ORB_EPERM);
    assert_int_equal(slot_attach(s, SLOT_NAME, ORB_SLOTS_DEFAULT_INTERVAL_NS, &slot_fd), 0);
    struct stat st;
    assert_int_equal(fstat(slot_fd, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0644);
    assert_int_equal(st.st_uid, hp_tenant_uid());
    assert_int_equal(fcntl(slot_fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    assert_ptr_equal(mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, slot_fd, 0), MAP_FAILED);
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, slot_fd, 0);
    assert_ptr_not_equal(map, MAP_FAILED);
    struct orb_clock_domain dom;
    assert_int_equal(orb_clock_domain_current(&dom), 0);
    struct orb_slots_reader reader;
    assert_int_equal(orb_slots_reader_open(map, (size_t)st.st_size, &dom, ORB_SLOTS_DEFAULT_INTERVAL_NS, 0, &reader),
                     0);
    /* The publisher keeps the slot current from the serve loop. */
    struct timespec ts;
    uint64_t seq0 = __atomic_load_n((const uint64_t *)((const uint8_t *)map + 72), __ATOMIC_ACQUIRE);
    usleep(20000);
    uint64_t seq1 = __atomic_load_n((const uint64_t *)((const uint8_t *)map + 72), __ATOMIC_ACQUIRE);
    assert_true(seq1 > seq0);
    uint32_t slot = 9;
    /* Read at the real time now: the publisher may have written after a fixed "now" (a sleep
     * that overran under load), and a slot stamped after the reader's `now` reads as damaged. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    enum orb_slots_source src = orb_slots_read(&reader, now, &slot);
    if (src != ORB_SLOTS_PUBLISHED && src != ORB_SLOTS_DERIVED)
        fail_msg("the helper's slot read as source %d", (int)src);
    munmap(map, (size_t)st.st_size);
    close(slot_fd);

    /* DEVX_VERIFY: with the device open, the real object query reaches the stand-in node
     * through the filter and finds no uverbs ioctl there; without it, OPEN_DEVICE comes first. */
    struct orb_hp_devx_verify v = {.obj_handle = 1, .key = 0x1234, .qpn = 7, .addr = 4096, .length = 4096,
                                   .access = 1};
    snprintf(v.nic, sizeof v.nic, "mlx5_0");
    assert_int_equal(orb_hp_encode_devx_verify(s->p.seq++, &v, req, &len), 0);
    assert_int_equal(status_of(s, req, len, NULL), have_node ? ORB_EUNAVAILABLE : ORB_EINVAL);
    snprintf(v.nic, sizeof v.nic, "mlx5_1");
    assert_int_equal(orb_hp_encode_devx_verify(s->p.seq++, &v, req, &len), 0);
    assert_int_equal(status_of(s, req, len, NULL), ORB_EPERM);

    /* Nothing leaked and nothing extra: the start-up set and the device dup. The slot object
     * is the monitor's, never the worker's. */
    struct hp_self_report r;
    assert_int_equal(hp_self_report(&s->p, &r), 0);
    assert_int_equal(r.nfds, 7u + (have_node ? 1u : 0u));
    expect_exit(s, EXIT_EOF);
}

/* The real device context creation under the real filter: the uverbs ioctl is admitted (no
 * SIGSYS), the stand-in node refuses it, nothing is handed over or kept. */
static void test_open_device_real_context_under_the_filter(void **state)
{
    struct session *s = *state;
    char node[600];
    snprintf(node, sizeof node, "%s/uverbs0", s->fx.dev);
    if (getuid() != 0 || make_node(node, makedev(1, 3)) != 0) {
        skip(); /* a character device needs root */
        return;
    }
    start(s, policy_mlx5_0);
    assert_int_equal(hp_hello(&s->p), 0);
    int fd = 5;
    assert_int_equal(open_device(s, "mlx5_0", &fd), ORB_EUNAVAILABLE);
    assert_int_equal(fd, -1);
    struct hp_self_report r;
    assert_int_equal(hp_self_report(&s->p, &r), 0);
    assert_int_equal(r.nfds, 7u); /* the start-up set as in the full session, no device dup */
    expect_exit(s, EXIT_EOF);
}

static void test_open_device_checks_the_node(void **state)
{
    struct session *s = *state;
    /* uverbs0: a symlink to a character device; uverbs1: a regular file. */
    char path[600];
    snprintf(path, sizeof path, "%s/uverbs0", s->fx.dev);
    assert_int_equal(symlink("/dev/null", path), 0);
    assert_int_equal(hp_write_file(s->fx.dev, "uverbs1", "", 0666), 0);
    start(s, policy_all_nics);
    assert_int_equal(hp_hello(&s->p), 0);
    assert_int_equal(open_device(s, "mlx5_0", NULL), ORB_EPERM);
    assert_int_equal(open_device(s, "mlx5_1", NULL), ORB_EPERM);
    if (getuid() == 0) {
        /* A character device with numbers other than sysfs gives (1:7 for 1:5). */
        assert_int_equal(unlink(path), 0);
        snprintf(path, sizeof path, "%s/uverbs1", s->fx.dev);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(make_node(path, makedev(1, 7)), 0);
        assert_int_equal(open_device(s, "mlx5_1", NULL), ORB_EPERM);
    }
    expect_exit(s, EXIT_EOF);
}

static void test_bad_policy_file_denies_everything(void **state)
{
    struct session *s = *state;
    start(s, "[defaults]\nnics = *\ntransports = tcp, rdma\nno_such_key = 1\n");
    assert_int_equal(hp_hello(&s->p), 0);
    int32_t status = 1;
    assert_int_equal(inventory_total(s, ORB_HP_INV_NIC, 0, NULL, &status), 0);
    assert_int_equal(status, ORB_ENOENT);
    assert_int_equal(open_device(s, "mlx5_0", NULL), ORB_EPERM);
    expect_exit(s, EXIT_EOF);
}

/* ---- dispatch rules and malformed messages ---------------------------------------------------- */

static void start_and_hello(struct session *s)
{
    start(s, policy_mlx5_0);
    assert_int_equal(hp_hello(&s->p), 0);
}

static void test_request_before_hello_ends_session(void **state)
{
    struct session *s = *state;
    start(s, policy_mlx5_0);
    uint8_t req[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_empty(ORB_HP_POLICY, 1, req, &len), 0);
    expect_session_end(s, req, len, NULL, 0, EXIT_PROTOCOL);
}

static void test_repeated_hello_ends_session(void **state)
{
    struct session *s = *state;
    start_and_hello(s);
    uint8_t req[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_hello(s->p.seq++, req, &len), 0);
    expect_session_end(s, req, len, NULL, 0, EXIT_PROTOCOL);
}

static void test_hello_of_another_version_is_answered_then_ends(void **state)
{
    struct session *s = *state;
    start(s, policy_mlx5_0);
    uint8_t req[ORB_HP_HEADER_LEN + 4], rep[ORB_HP_MAX_MSG];
    hp_raw_header(req, ORB_HP_HELLO, sizeof req, 1);
    req[16] = ORB_HP_VERSION + 1;
    req[17] = req[18] = req[19] = 0;
    struct orb_hp_msg m;
    assert_int_equal(hp_call(&s->p, req, sizeof req, NULL, 0, &m, rep, NULL), 0);
    int32_t status = 0;
    assert_int_equal(orb_hp_decode_status(&m, &status), 0);
    assert_int_equal(status, ORB_EPROTO);
    int ws = hp_wait(&s->p, WAIT_MS);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), EXIT_PROTOCOL);
}

static void test_unknown_and_reply_types_end_session(void **state)
{
    struct session *s = *state;
    static const uint16_t types[] = {0, 1, ORB_HP_HELLO_REPLY, ORB_HP_TYPE_MAX + 1, 0x7F04, 0xFFFF};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        start_and_hello(s);
        uint8_t req[ORB_HP_HEADER_LEN + 4] = {0};
        hp_raw_header(req, types[i], sizeof req, s->p.seq++);
        expect_session_end(s, req, sizeof req, NULL, 0, EXIT_PROTOCOL);
        hp_close(&s->p);
    }
}

static void test_library_sending_fds_ends_session(void **state)
{
    struct session *s = *state;
    start_and_hello(s);
    uint8_t req[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_empty(ORB_HP_POLICY, s->p.seq++, req, &len), 0);
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    expect_session_end(s, req, len, &fd, 1, EXIT_PROTOCOL);
    close(fd);
}

static void test_malformed_datagrams_end_session(void **state)
{
    struct session *s = *state;
    uint8_t req[ORB_HP_MAX_MSG + 64];
    size_t len = 0;
    struct {
        const char *what;
        size_t len;
    } cases[] = {{"short header", 8}, {"bad magic", 0}, {"bad version", 0}, {"length field", 0},
                 {"trailing byte", 0}, {"empty body", 0}, {"oversized", ORB_HP_MAX_MSG + 16},
                 {"bad inventory kind", 0}, {"bad name", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        start_and_hello(s);
        memset(req, 0, sizeof req);
        assert_int_equal(orb_hp_encode_open_device(s->p.seq++, "mlx5_0", req, &len), 0);
        switch (i) {
        case 0: len = cases[i].len; break;
        case 1: req[0] ^= 0xFF; break;
        case 2: req[4] = 9; break;
        case 3: req[8] ^= 1; break;
        case 4: len += 1; req[8] = (uint8_t)len; break;
        case 5: hp_raw_header(req, ORB_HP_OPEN_DEVICE, ORB_HP_HEADER_LEN, 9); len = ORB_HP_HEADER_LEN; break;
        case 6: hp_raw_header(req, ORB_HP_POLICY, (uint32_t)cases[i].len, 9); len = cases[i].len; break;
        case 7:
            assert_int_equal(orb_hp_encode_inventory(9, 0, 0, req, &len), 0);
            req[16] = 7;
            break;
        case 8: req[18] = '/'; break;
        }
        print_message("case: %s\n", cases[i].what);
        expect_session_end(s, req, len, NULL, 0, EXIT_PROTOCOL);
        hp_close(&s->p);
    }
}

/* Deterministic mutation: every single-byte change of a valid SLOT_ATTACH either gets a reply
 * or ends the session with the protocol status; the helper never crashes or hangs. */
static void test_mutated_requests_never_crash(void **state)
{
    struct session *s = *state;
    uint8_t valid[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_slot_attach(2, SLOT_NAME, ORB_SLOTS_DEFAULT_INTERVAL_NS, valid, &len), 0);
    static const uint8_t deltas[] = {0x01, 0x80, 0xFF};
    for (size_t pos = 0; pos < len; pos++) {
        for (size_t d = 0; d < sizeof deltas; d++) {
            if (pos >= ORB_HP_HEADER_LEN && d == 1 && pos % 3 != 0)
                continue; /* keep the run short: body bytes get two of the three deltas */
            start_and_hello(s);
            uint8_t req[ORB_HP_MAX_MSG];
            memcpy(req, valid, len);
            req[pos] ^= deltas[d];
            uint8_t rep[ORB_HP_MAX_MSG];
            struct orb_hp_msg m;
            int fd = -1;
            int rc = hp_call(&s->p, req, len, NULL, 0, &m, rep, &fd);
            if (fd >= 0)
                close(fd);
            hp_close(&s->p);
            int ws = hp_wait(&s->p, WAIT_MS);
            assert_true(ws >= 0);
            assert_true(WIFEXITED(ws));
            assert_int_equal(WEXITSTATUS(ws), rc == 0 ? EXIT_EOF : EXIT_PROTOCOL);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_installed_helper_refuses_test_options, setup, teardown),
        cmocka_unit_test_setup_teardown(test_installed_helper_serves_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd3_not_a_socket_exits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forbidden_syscall_kills_with_sigsys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forbidden_arguments_kill_with_sigsys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_library_that_never_reads_is_dropped_and_publication_goes_on, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_environment_fds_and_confinement_after_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_before_hello_ends_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repeated_hello_ends_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello_of_another_version_is_answered_then_ends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_and_reply_types_end_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_library_sending_fds_ends_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_datagrams_end_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_policy_file_denies_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_device_checks_the_node, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_device_real_context_under_the_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_session_every_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mutated_requests_never_crash, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
