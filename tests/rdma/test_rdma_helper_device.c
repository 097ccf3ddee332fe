/* An unprivileged tenant's engine with the helper on real verbs devices (the test VM's rails
 * topology): the administrator's policy allows the tenant rxe_a0 and none of the other three
 * devices, with a registration budget.
 *
 *  - ORB_HELPER_AUTO: the engine carries requests on rxe_a0 alone; the process holds a uverbs
 *    descriptor of rxe_a0 and of no other device (a denied device is never opened); the budget
 *    refuses a registration past it with ORB_ERESOURCE; a READ and a WRITE against a source on
 *    rxe_b0 move every byte.
 *  - ORB_HELPER_REQUIRED: rxe's provider cannot import a context from the helper, so the policy
 *    cannot be enforced: the engine fails with ORB_EUNAVAILABLE naming the device and its
 *    provider, and leaves no device open.
 *  - Shared priority slots: with shared_quota_shm_path naming a slot the policy grants, the
 *    helper creates and publishes the object and the engine gates its payload posts by it: High
 *    requests are never held back, Low ones are (slot_deferrals) and still all complete; a slot
 *    the policy does not grant fails the engine with ORB_EPERM, and so does (ORB_EUNAVAILABLE)
 *    asking for shared slots without the helper.
 *
 * Each tenant is a fresh process (this program run again with --tenant) that drops from root
 * to nobody before it creates its engine and starts the test build of the helper with the policy
 * directory written here. The policy and the slot objects belong to the tenant (the helper's
 * --policy-owner), so that the test build creates slot objects without CAP_CHOWN. The source is
 * an engine of this (root) process without the helper.
 *
 * A hardware check: it exits 77 without the rails topology's devices or without root (needed to
 * write a root-owned policy and to become the tenant); inside the test VM it runs for real. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/clock.h"
#include "core/engine_internal.h"
#include "helper/helper_client.h"
#include "device_util.h"
#include "rdma/verbs.h"
#include "../helper/tenant.h"

#ifndef ORB_HELPER_TEST_EXE
#error "ORB_HELPER_TEST_EXE must name the test build of orbite-helper"
#endif

#define TIMEOUT_NS (120ull * 1000000000ull)
#define SRC_LEN (4u << 20)
#define BUDGET "6M"
#define BUF_LEN (4u << 20) /* one fits the budget, two do not */
#define ALLOWED "rxe_a0"
#define SLOT "orbite-test-slots"

static char policy_dir[64];
static orb_engine *src;
static orb_host_memory *src_mem;
static orb_reg_id src_id;
static uint8_t *sbytes;

struct hello {
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    uint64_t base;
};

static uint8_t pattern(uint64_t i, uint32_t seed)
{
    return (uint8_t)((i * 2654435761u) >> 13) ^ (uint8_t)seed;
}

/* ---- the tenant (a child process) ------------------------------------------------------------ */

static int failures;

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "tenant: FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                         \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)

/* The RDMA devices whose uverbs nodes this process holds open, comma-separated in fd order. */
static void open_devices(char *out, size_t len)
{
    out[0] = '\0';
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[64], target[256], ibdev[80];
        snprintf(path, sizeof path, "/proc/self/fd/%.20s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        const char *node = strstr(target, "/dev/infiniband/uverbs");
        if (node == NULL)
            continue;
        snprintf(path, sizeof path, "/sys/class/infiniband_verbs/%.20s/ibdev", node + strlen("/dev/infiniband/"));
        FILE *f = fopen(path, "re");
        if (f == NULL || fgets(ibdev, sizeof ibdev, f) == NULL)
            snprintf(ibdev, sizeof ibdev, "?%s", node);
        if (f != NULL)
            fclose(f);
        ibdev[strcspn(ibdev, "\n")] = '\0';
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%s%s", used > 0 ? "," : "", ibdev);
    }
    closedir(d);
}

static orb_engine *tenant_engine_with(enum orb_helper_mode mode, const char *shm_path)
{
    const char *const kv[] = {"shared_quota_shm_path", shm_path, NULL};
    orb_engine *e = NULL;
    return rdma_test_engine(shm_path != NULL ? kv : NULL, 0, mode, &e) == 0 ? e : NULL;
}

static orb_engine *tenant_engine(enum orb_helper_mode mode)
{
    return tenant_engine_with(mode, NULL);
}

static void tenant_auto(const struct hello *h)
{
    orb_engine *e = tenant_engine(ORB_HELPER_AUTO);
    CHECK(e != NULL, "engine with the helper: %s", orb_last_error());
    if (e == NULL)
        return;
    CHECK(e->tp[ORB_TRANSPORT_RDMA].ops != NULL, "no RDMA transport");
    char held[512];
    open_devices(held, sizeof held);
    CHECK(strcmp(held, ALLOWED) == 0, "the process holds the devices [%s], not [" ALLOWED "]", held);
    struct orb_rdma_nic_load load[4];
    size_t n = 0;
    int rc = orb_engine_rdma_nic_load(e, load, 4, &n);
    CHECK(rc == 0 && n == 1 && strcmp(load[0].name, ALLOWED) == 0, "rails: rc %d, %zu, first %s", rc, n,
          n > 0 ? load[0].name : "-");
    struct orb_rdma_stats st;
    CHECK(orb_engine_rdma_stats(e, &st) == 0 && st.nics_open == 1, "nics_open %u", st.nics_open);

    /* The policy's registration budget. */
    orb_host_memory *mem = NULL, *more = NULL;
    orb_reg_id id = 0, id2 = 0;
    CHECK(orb_host_memory_alloc(BUF_LEN, 0, &mem) == 0, "%s", orb_last_error());
    CHECK(orb_host_memory_alloc(BUF_LEN, 0, &more) == 0, "%s", orb_last_error());
    if (mem == NULL || more == NULL)
        goto free_engine;
    rc = orb_register_host_memory(e, mem, 0, BUF_LEN, ORB_PERM_LOCAL, &id);
    CHECK(rc == 0, "a registration inside the budget: %s", orb_last_error());
    rc = orb_register_host_memory(e, more, 0, BUF_LEN, ORB_PERM_LOCAL, &id2);
    CHECK(rc == ORB_ERESOURCE && strstr(orb_last_error(), "policy allows 6291456 registered bytes") != NULL,
          "past the budget: %d %s", rc, orb_last_error());

    /* Bytes over the one allowed device. */
    uint8_t *b = orb_host_memory_data(mem);
    orb_segment *seg = NULL;
    rc = orb_open_segment(e, h->endpoint, &h->epoch, TIMEOUT_NS, &seg);
    CHECK(rc == 0 && seg->peer[ORB_TRANSPORT_RDMA] != NULL, "segment: %s", orb_last_error());
    if (rc == 0) {
        struct orb_request r;
        memset(&r, 0, sizeof r);
        r.transport = ORB_TRANSPORT_RDMA;
        r.op = ORB_OP_READ;
        r.local_addr = (uint64_t)(uintptr_t)b;
        r.remote_addr = h->base + 3;
        r.length = (1u << 20) + 1;
        memset(b, 0, BUF_LEN);
        struct orb_batch_report rep;
        rc = orb_submit_and_wait(e, seg, &r, 1, NULL, TIMEOUT_NS, &rep);
        CHECK(rc == 0, "READ: %s", orb_last_error());
        uint64_t bad = 0;
        for (uint64_t i = 0; rc == 0 && i < r.length; i++)
            bad += b[i] != pattern(i + 3, 1);
        CHECK(rc == 0 && bad == 0 && b[r.length] == 0, "READ: %llu bytes differ", (unsigned long long)bad);
        for (uint64_t i = 0; i < (1u << 20); i++)
            b[i] = pattern(i, 77);
        r.op = ORB_OP_WRITE;
        r.remote_addr = h->base + (2u << 20);
        r.length = 1u << 20;
        rc = orb_submit_and_wait(e, seg, &r, 1, NULL, TIMEOUT_NS, &rep);
        CHECK(rc == 0, "WRITE: %s", orb_last_error());
        CHECK(orb_engine_rdma_stats(e, &st) == 0 && st.completed_reads > 0 && st.completed_writes > 0,
              "reads %llu writes %llu", (unsigned long long)st.completed_reads,
              (unsigned long long)st.completed_writes);
        orb_segment_close(seg);
    }
    open_devices(held, sizeof held);
    CHECK(strcmp(held, ALLOWED) == 0, "after the transfers the process holds [%s]", held);
    if (id != 0)
        CHECK(orb_unregister_memory(e, id) == 0, "%s", orb_last_error());
free_engine:
    orb_engine_free(e);
    orb_host_memory_unref(mem);
    orb_host_memory_unref(more);
    open_devices(held, sizeof held);
    CHECK(held[0] == '\0', "after the engine the process holds [%s]", held);
}

static void tenant_required(void)
{
    orb_engine *e = tenant_engine(ORB_HELPER_REQUIRED);
    CHECK(e == NULL, "an engine that cannot enforce the policy was created");
    if (e != NULL) {
        orb_engine_free(e);
        return;
    }
    const char *why = orb_last_error();
    CHECK(strstr(why, ALLOWED ": its provider (rxe (soft-RoCE over ") != NULL, "the cause: %s", why);
    CHECK(strstr(why, "helper required") != NULL, "the cause: %s", why);
    char held[512];
    open_devices(held, sizeof held);
    CHECK(held[0] == '\0', "the failed engine left [%s] open", held);
}

/* `n` 64 KiB READs of priority `prio` in one batch, checked; 0 or the failure. */
static int reads(orb_engine *e, orb_segment *seg, const struct hello *h, uint8_t *b, int n, enum orb_priority prio)
{
    struct orb_request r[32];
    memset(r, 0, sizeof r);
    for (int i = 0; i < n && i < 32; i++) {
        r[i].transport = ORB_TRANSPORT_RDMA;
        r[i].op = ORB_OP_READ;
        r[i].priority = prio;
        r[i].local_addr = (uint64_t)(uintptr_t)b + ((uint64_t)i << 16);
        r[i].remote_addr = h->base + ((uint64_t)i << 16);
        r[i].length = 1u << 16;
    }
    memset(b, 0, (size_t)n << 16);
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(e, seg, r, (size_t)n, NULL, TIMEOUT_NS, &rep);
    for (uint64_t i = 0; rc == 0 && i < ((uint64_t)n << 16); i++)
        if (b[i] != pattern(i, 1))
            rc = ORB_EPROTO;
    return rc;
}

static void tenant_slots(const struct hello *h)
{
    orb_engine *e = tenant_engine_with(ORB_HELPER_AUTO, "/orbite-not-granted");
    CHECK(e == NULL && strstr(orb_last_error(), "/orbite-not-granted") != NULL, "an ungranted slot: %s",
          orb_last_error());
    orb_engine_free(e);
    e = tenant_engine_with(ORB_HELPER_AUTO, "/" SLOT);
    CHECK(e != NULL, "engine with the shared slots: %s", orb_last_error());
    if (e == NULL)
        return;
    orb_host_memory *mem = NULL;
    orb_reg_id id = 0;
    orb_segment *seg = NULL;
    CHECK(orb_host_memory_alloc(2u << 20, 0, &mem) == 0, "%s", orb_last_error());
    if (mem == NULL)
        goto free_engine;
    CHECK(orb_register_host_memory(e, mem, 0, 2u << 20, ORB_PERM_LOCAL, &id) == 0, "%s", orb_last_error());
    CHECK(orb_open_segment(e, h->endpoint, &h->epoch, TIMEOUT_NS, &seg) == 0, "segment: %s", orb_last_error());
    if (seg == NULL)
        goto free_memory;
    uint8_t *b = orb_host_memory_data(mem);
    struct orb_rdma_stats st;
    /* High is admitted in every slot. */
    for (int round = 0; round < 5; round++)
        CHECK(reads(e, seg, h, b, 32, ORB_PRIORITY_HIGH) == 0, "High READs: %s", orb_last_error());
    CHECK(orb_engine_rdma_stats(e, &st) == 0 && st.slot_deferrals == 0, "High was held back %llu times",
          (unsigned long long)st.slot_deferrals);
    /* Low only in one slot of three: some of its posts wait for it, and all complete. */
    uint64_t give_up = orb_now_ns() + 20ull * 1000000000ull;
    do {
        CHECK(reads(e, seg, h, b, 32, ORB_PRIORITY_LOW) == 0, "Low READs: %s", orb_last_error());
        CHECK(orb_engine_rdma_stats(e, &st) == 0, "%s", orb_last_error());
    } while (st.slot_deferrals == 0 && orb_now_ns() < give_up && failures == 0);
    CHECK(st.slot_deferrals > 0, "Low posts were never held back");
    fprintf(stderr, "tenant (slots): %llu deferrals\n", (unsigned long long)st.slot_deferrals);
    orb_segment_close(seg);
free_memory:
    if (id != 0)
        CHECK(orb_unregister_memory(e, id) == 0, "%s", orb_last_error());
    orb_host_memory_unref(mem);
free_engine:
    orb_engine_free(e);
}

static _Noreturn void tenant_main(const char *mode, int hello_fd)
{
    struct hello h;
    if (read(hello_fd, &h, sizeof h) != (ssize_t)sizeof h)
        _exit(2);
    /* The locked-memory limit an administrator gives RDMA users (root may raise it), then the
     * tenant's identity: no capabilities, no groups. */
    struct rlimit lim = {.rlim_cur = 64u << 20, .rlim_max = 64u << 20};
    if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0 || hp_become_tenant() != 0 || getuid() == 0) {
        fprintf(stderr, "tenant: cannot become uid %u: %s\n", HP_TENANT_ID, strerror(errno));
        _exit(3);
    }
    char owner[16];
    snprintf(owner, sizeof owner, "%u", HP_TENANT_ID);
    const char *args[] = {"--policy-dir", policy_dir, "--policy-owner", owner, NULL};
    if (orb_helper_test_set_command(ORB_HELPER_TEST_EXE, args) != 0)
        _exit(4);
    if (strcmp(mode, "auto") == 0)
        tenant_auto(&h);
    else if (strcmp(mode, "slots") == 0)
        tenant_slots(&h);
    else
        tenant_required();
    fprintf(stderr, "tenant (%s): %d failure(s)\n", mode, failures);
    _exit(failures == 0 ? 0 : 1);
}

/* ---- this process: the policy, the source, the tenants ------------------------------------------- */

static void write_policy(void)
{
    snprintf(policy_dir, sizeof policy_dir, "/tmp/orbite-policy-XXXXXX");
    assert_non_null(mkdtemp(policy_dir));
    assert_int_equal(chmod(policy_dir, 0755), 0); /* the tenant's helper reads it */
    char path[128];
    snprintf(path, sizeof path, "%s/50-tenant.ini", policy_dir);
    FILE *f = fopen(path, "we");
    assert_non_null(f);
    fprintf(f, "[defaults]\nnics = none\n\n[user:#%u]\ntransports = tcp, rdma\nnics = " ALLOWED
               "\nmax_registered_bytes = " BUDGET "\nmax_endpoints = 16\nmax_grants = 64\nslots = " SLOT "\n",
            HP_TENANT_ID);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(chown(path, HP_TENANT_ID, HP_TENANT_ID), 0);
    assert_int_equal(chown(policy_dir, HP_TENANT_ID, HP_TENANT_ID), 0);
}

static int setup(void **state)
{
    (void)state;
    const char *topo = getenv("ORBITE_VM_TOPOLOGY");
    bool in_vm = topo != NULL && strcmp(topo, "rails") == 0;
    if (!rdma_test_present("rxe_a0,rxe_a1,rxe_b0,rxe_b1") || getuid() != 0) {
        if (in_vm)
            fail_msg("the rails topology lacks its four rxe devices, or this is not root");
        printf("skipped: needs root and the rails topology's rxe devices (the test VM has them)\n");
        exit(77);
    }
    write_policy();
    static const char *const kv[] = {"rdma_whitelist", "rxe_b0", NULL};
    if (rdma_test_engine(kv, 1, ORB_HELPER_OFF, &src) != 0)
        fail_msg("source engine: %s", orb_last_error());
    assert_int_equal(orb_host_memory_alloc(SRC_LEN, 0, &src_mem), 0);
    sbytes = orb_host_memory_data(src_mem);
    for (uint64_t i = 0; i < SRC_LEN; i++)
        sbytes[i] = pattern(i, 1);
    assert_int_equal(orb_register_host_memory(src, src_mem, 0, SRC_LEN, ORB_PERM_REMOTE_WRITE, &src_id), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    assert_int_equal(orb_unregister_memory(src, src_id), 0);
    orb_engine_free(src);
    orb_host_memory_unref(src_mem);
    char path[128];
    snprintf(path, sizeof path, "%s/50-tenant.ini", policy_dir);
    (void)unlink(path);
    (void)rmdir(policy_dir);
    return 0;
}

/* Run this program as a tenant in `mode`; its exit status. */
static int run_tenant(const char *mode)
{
    struct hello h;
    memset(&h, 0, sizeof h);
    assert_int_equal(orb_engine_endpoint(src, h.endpoint, sizeof h.endpoint), 0);
    assert_int_equal(orb_engine_source_epoch(src, &h.epoch), 0);
    h.base = (uint64_t)(uintptr_t)sbytes;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(write(fds[1], &h, sizeof h), (ssize_t)sizeof h);
    close(fds[1]);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char fd[16];
        snprintf(fd, sizeof fd, "%d", fds[0]);
        execl("/proc/self/exe", "test_rdma_helper_device", "--tenant", mode, fd, policy_dir, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_auto_opens_only_the_allowed_device(void **state)
{
    (void)state;
    assert_int_equal(run_tenant("auto"), 0);
    for (uint64_t i = 0; i < (1u << 20); i++)
        if (sbytes[(2u << 20) + i] != pattern(i, 77))
            fail_msg("byte %llu of the tenant's WRITE differs", (unsigned long long)i);
    assert_int_equal(sbytes[(3u << 20)], pattern(3u << 20, 1)); /* not a byte past */
}

static void test_required_fails_naming_the_provider(void **state)
{
    (void)state;
    assert_int_equal(run_tenant("required"), 0);
}

static void test_shared_slots_gate_low_priority(void **state)
{
    (void)state;
    assert_int_equal(run_tenant("slots"), 0);
    /* Without the helper nobody creates or publishes the slots: the engine refuses. */
    static const char *const kv[] = {"shared_quota_shm_path", "/" SLOT, NULL};
    orb_engine *e = NULL;
    assert_int_equal(rdma_test_engine(kv, 0, ORB_HELPER_OFF, &e), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "needs orbite-helper"));
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--tenant") == 0) {
        snprintf(policy_dir, sizeof policy_dir, "%s", argv[4]);
        tenant_main(argv[2], atoi(argv[3]));
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_opens_only_the_allowed_device),
        cmocka_unit_test(test_required_fails_naming_the_provider),
        cmocka_unit_test(test_shared_slots_gate_low_priority),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
