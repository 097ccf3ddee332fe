/* Which NICs an engine opens, and how (lib/rdma/devices.c), on a scripted operation table: the
 * policy's mask, the helper's answers (a descriptor to import, a refusal, a provider that cannot
 * import), ORB_HELPER_AUTO against ORB_HELPER_REQUIRED, failures at every step, and stable
 * slots. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/error.h"
#include "rdma/devices.h"

#define NNICS 5

/* What the fake answers for each NIC (by inventory id), and what it saw. */
struct script {
    int helper_status[NNICS];     /* 0: a descriptor; else that status */
    bool import_fails[NNICS];
    bool open_fails[NNICS];
    bool pd_fails[NNICS];
    bool dealloc_fails[NNICS];
    int helper_calls[NNICS], direct_calls[NNICS], imports[NNICS];
    int open_contexts, open_pds;
    int last_fd[NNICS];
    int current;                  /* the NIC of the last helper call (descriptor numbers repeat) */
    char ctx_mem[NNICS][1];
    char pd_mem[NNICS][1];
};

static struct script sc;

static int nic_index(const char *name)
{
    int i = -1;
    assert_int_equal(sscanf(name, "nic%d", &i), 1);
    assert_true(i >= 0 && i < NNICS);
    return i;
}

static int ctx_index(struct ibv_context *ctx)
{
    for (int i = 0; i < NNICS; i++)
        if ((void *)ctx == (void *)sc.ctx_mem[i])
            return i;
    fail_msg("unknown context");
    return -1;
}

static int fake_helper_open_device(void *impl, const char *nic, int *fd_out)
{
    (void)impl;
    int i = nic_index(nic);
    sc.helper_calls[i]++;
    if (sc.helper_status[i] != 0)
        return orb_fail(sc.helper_status[i], "fake helper: %s refused", nic);
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    sc.last_fd[i] = fd;
    sc.current = i;
    *fd_out = fd;
    return 0;
}

static struct ibv_context *fake_import(void *impl, int fd)
{
    (void)impl;
    int i = sc.current;
    assert_int_equal(sc.last_fd[i], fd);
    sc.imports[i]++;
    if (sc.import_fails[i]) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    close(fd); /* the context owns it from here, as an imported ibv_context does */
    sc.open_contexts++;
    return (struct ibv_context *)(void *)sc.ctx_mem[i];
}

static struct ibv_context *fake_open_direct(void *impl, const char *nic)
{
    (void)impl;
    int i = nic_index(nic);
    sc.direct_calls[i]++;
    if (sc.open_fails[i]) {
        errno = ENODEV;
        return NULL;
    }
    sc.open_contexts++;
    return (struct ibv_context *)(void *)sc.ctx_mem[i];
}

static int fake_close(void *impl, struct ibv_context *ctx)
{
    (void)impl;
    (void)ctx_index(ctx);
    sc.open_contexts--;
    return 0;
}

static struct ibv_pd *fake_alloc_pd(void *impl, struct ibv_context *ctx)
{
    (void)impl;
    int i = ctx_index(ctx);
    if (sc.pd_fails[i]) {
        errno = ENOMEM;
        return NULL;
    }
    sc.open_pds++;
    return (struct ibv_pd *)(void *)sc.pd_mem[i];
}

static int fake_dealloc_pd(void *impl, struct ibv_pd *pd)
{
    (void)impl;
    for (int i = 0; i < NNICS; i++) {
        if ((void *)pd == (void *)sc.pd_mem[i]) {
            if (sc.dealloc_fails[i])
                return EBUSY;
            sc.open_pds--;
            return 0;
        }
    }
    fail_msg("unknown PD");
    return -1;
}

static int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        n += fcntl(fd, F_GETFD) >= 0;
    return n;
}

static int fake_describe_provider(void *impl, const char *nic, char *buf, size_t len)
{
    (void)impl;
    snprintf(buf, len, "fake provider of %s", nic);
    return 0;
}

static struct orb_rdma_open_ops ops(bool helper)
{
    struct orb_rdma_open_ops o = {
        .helper_open_device = helper ? fake_helper_open_device : NULL,
        .import_device = fake_import,
        .open_direct = fake_open_direct,
        .close_device = fake_close,
        .alloc_pd = fake_alloc_pd,
        .dealloc_pd = fake_dealloc_pd,
        .describe_provider = fake_describe_provider,
    };
    return o;
}

/* NICs nic0..nic4 with ids 0..4; nic2 failed discovery (kept, unusable). */
static struct orb_topo_inventory inv;

static int setup(void **state)
{
    (void)state;
    memset(&sc, 0, sizeof sc);
    for (int i = 0; i < NNICS; i++)
        sc.last_fd[i] = -1;
    memset(&inv, 0, sizeof inv);
    inv.nnics = NNICS;
    for (int i = 0; i < NNICS; i++) {
        inv.nics[i].id = (uint8_t)i;
        inv.nics[i].usable = i != 2;
        snprintf(inv.nics[i].name, sizeof inv.nics[i].name, "nic%d", i);
    }
    return 0;
}

static void test_bad_arguments(void **state)
{
    (void)state;
    struct orb_rdma_open_ops o = ops(false);
    struct orb_rdma_devices d;
    assert_int_equal(orb_rdma_devices_open(NULL, NULL, &inv, ~0ull, ORB_HELPER_OFF, &d), ORB_EINVAL);
    assert_int_equal(orb_rdma_devices_open(&o, NULL, NULL, ~0ull, ORB_HELPER_OFF, &d), ORB_EINVAL);
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, ~0ull, ORB_HELPER_OFF, NULL), ORB_EINVAL);
    o.open_direct = NULL;
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, ~0ull, ORB_HELPER_OFF, &d), ORB_EINVAL);
    assert_int_equal(orb_rdma_devices_close(NULL), 0);
}

/* Without a helper: every allowed usable NIC directly; the others are never touched; a failure
 * keeps its slot and renumbers nothing. */
static void test_direct_open_follows_the_mask_and_keeps_slots(void **state)
{
    (void)state;
    struct orb_rdma_open_ops o = ops(false);
    sc.open_fails[3] = true;
    struct orb_rdma_devices d;
    uint64_t allowed = (1u << 0) | (1u << 2) | (1u << 3) | (1u << 4); /* nic1 denied */
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, allowed, ORB_HELPER_OFF, &d), 0);
    assert_int_equal(d.nslots, NNICS);
    assert_int_equal(d.nopen, 2);
    assert_int_equal(d.nics[0].route, ORB_RDMA_ROUTE_DIRECT);
    assert_non_null(d.nics[0].pd);
    assert_int_equal(d.nics[1].status, ORB_EPERM); /* outside the mask */
    assert_int_equal(sc.direct_calls[1], 0);       /* never opened, not even tried */
    assert_int_equal(d.nics[2].status, ORB_EUNAVAILABLE); /* failed discovery */
    assert_int_equal(sc.direct_calls[2], 0);
    assert_int_equal(d.nics[3].status, ORB_ENOENT);
    assert_null(d.nics[3].ctx);
    assert_int_equal(d.nics[4].id, 4);
    assert_int_equal(d.nics[4].route, ORB_RDMA_ROUTE_DIRECT);
    assert_string_equal(d.nics[4].name, "nic4");
    assert_int_equal(orb_rdma_devices_close(&d), 0);
    assert_int_equal(sc.open_contexts, 0);
    assert_int_equal(sc.open_pds, 0);
    assert_int_equal(d.nopen, 0);
    assert_int_equal(orb_rdma_devices_close(&d), 0); /* idempotent */
}

/* With a helper: a descriptor is imported (enforced), a refusal leaves the NIC closed and it is
 * never opened directly either. */
static void test_helper_imports_and_refusals(void **state)
{
    (void)state;
    struct orb_rdma_open_ops o = ops(true);
    sc.helper_status[1] = ORB_EPERM;
    sc.helper_status[4] = ORB_ENOENT;
    struct orb_rdma_devices d;
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, ~0ull, ORB_HELPER_REQUIRED, &d), 0);
    assert_int_equal(d.nics[0].route, ORB_RDMA_ROUTE_IMPORTED);
    assert_int_equal(d.nics[3].route, ORB_RDMA_ROUTE_IMPORTED);
    assert_int_equal(d.nics[1].status, ORB_EPERM);
    assert_int_equal(d.nics[4].status, ORB_ENOENT);
    for (int i = 0; i < NNICS; i++)
        assert_int_equal(sc.direct_calls[i], 0);
    assert_int_equal(d.nopen, 2);
    assert_int_equal(orb_rdma_devices_close(&d), 0);
    assert_int_equal(sc.open_contexts, 0);
}

/* A provider that cannot import (rxe): AUTO opens it directly, honouring the policy; REQUIRED
 * refuses the whole open, naming the device and its provider, and leaves nothing open; without a
 * provider description the message says so. */
static void test_provider_without_import_auto_and_required(void **state)
{
    (void)state;
    struct orb_rdma_open_ops o = ops(true);
    sc.helper_status[3] = ORB_EUNAVAILABLE;
    struct orb_rdma_devices d;
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, ~0ull, ORB_HELPER_AUTO, &d), 0);
    assert_int_equal(d.nics[0].route, ORB_RDMA_ROUTE_IMPORTED);
    assert_int_equal(d.nics[3].route, ORB_RDMA_ROUTE_DIRECT);
    assert_int_equal(sc.direct_calls[3], 1);
    assert_int_equal(orb_rdma_devices_close(&d), 0);

    memset(sc.direct_calls, 0, sizeof sc.direct_calls);
    memset(&d, 0x5a, sizeof d);
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, ~0ull, ORB_HELPER_REQUIRED, &d), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "nic3: its provider (fake provider of nic3) cannot import"));
    assert_int_equal(sc.direct_calls[3], 0);
    assert_int_equal(sc.open_contexts, 0); /* nic0, imported first, was closed again */
    assert_int_equal(sc.open_pds, 0);
    o.describe_provider = NULL;
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, ~0ull, ORB_HELPER_REQUIRED, &d), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "nic3: its provider (not named by sysfs)"));
}

/* A helper session that fails ends the whole open, whatever the mode. */
static void test_helper_session_failure_ends_the_open(void **state)
{
    (void)state;
    struct orb_rdma_open_ops o = ops(true);
    sc.helper_status[3] = ORB_EPEER;
    struct orb_rdma_devices d;
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, ~0ull, ORB_HELPER_AUTO, &d), ORB_EPEER);
    assert_int_equal(sc.open_contexts, 0);
    assert_int_equal(sc.direct_calls[3], 0);
}

/* A failed import gives the descriptor back (closed), a failed PD closes its context: each NIC
 * alone, the others open. */
static void test_failures_release_what_they_took(void **state)
{
    (void)state;
    struct orb_rdma_open_ops o = ops(true);
    sc.import_fails[0] = true;
    sc.pd_fails[3] = true;
    int fds_before = open_fds();
    struct orb_rdma_devices d;
    assert_int_equal(orb_rdma_devices_open(&o, NULL, &inv, ~0ull, ORB_HELPER_REQUIRED, &d), 0);
    assert_int_equal(d.nics[0].status, ORB_EUNAVAILABLE);
    assert_int_equal(sc.imports[0], 1);
    assert_int_equal(open_fds(), fds_before); /* the refused descriptor was closed */
    assert_int_equal(d.nics[3].status, ORB_EUNAVAILABLE);
    assert_null(d.nics[3].ctx);
    assert_int_equal(d.nics[1].route, ORB_RDMA_ROUTE_IMPORTED);
    assert_int_equal(d.nics[4].route, ORB_RDMA_ROUTE_IMPORTED);
    assert_int_equal(d.nopen, 2);
    assert_int_equal(sc.open_contexts, 2);
    /* A PD that cannot be released keeps it and its context: never freed twice. */
    sc.dealloc_fails[4] = true;
    assert_int_equal(orb_rdma_devices_close(&d), 1);
    assert_int_equal(sc.open_contexts, 1);
    assert_non_null(d.nics[4].ctx);
    sc.dealloc_fails[4] = false;
    assert_int_equal(orb_rdma_devices_close(&d), 0);
    assert_int_equal(sc.open_contexts, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_bad_arguments, setup),
        cmocka_unit_test_setup(test_direct_open_follows_the_mask_and_keeps_slots, setup),
        cmocka_unit_test_setup(test_helper_imports_and_refusals, setup),
        cmocka_unit_test_setup(test_provider_without_import_auto_and_required, setup),
        cmocka_unit_test_setup(test_helper_session_failure_ends_the_open, setup),
        cmocka_unit_test_setup(test_failures_release_what_they_took, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
