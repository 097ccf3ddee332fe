/* The RDMA transport inside a real engine on real verbs devices (soft-RoCE in the test VM): it
 * starts from the real /sys inventory and opens every device; a pin, a blacklist and a device
 * mask narrow that, and a whitelist naming a device that does not exist fails the engine; under
 * the Direct policy a registration has, on every open context, a local-only MR over exactly its
 * bytes and, for remote access, a second one (the MW_BIND parent), both in that context's
 * protection domain, all gone after unregistering; the Staged policy registers nothing.
 *
 * A hardware check: it exits 77 without a verbs device (here); inside the VM it runs for real. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/engine_internal.h"
#include "rdma/rdma_transport.h"
#include "rdma/verbs.h"

static int ndevices;
static char first_name[64];

static orb_engine *engine_with(const char *const *kv)
{
    orb_rdma_config *rdma;
    assert_int_equal(orb_rdma_config_new(&rdma), 0);
    for (size_t i = 0; kv != NULL && kv[i] != NULL; i += 2)
        assert_int_equal(orb_rdma_config_set(rdma, kv[i], kv[i + 1]), 0);
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.helper_mode = ORB_HELPER_OFF;
    struct orb_engine_params p = {
        .field_mask = ORB_ENGINE_PARAM_CONFIG | ORB_ENGINE_PARAM_RDMA, .config = &cfg, .rdma = rdma};
    orb_engine *e = NULL;
    int rc = orb_engine_create_params(&p, &e);
    orb_rdma_config_free(rdma);
    if (rc != 0)
        return NULL;
    return e;
}

static struct orb_rdma_tp *tp_of(orb_engine *e)
{
    return e->tp[ORB_TRANSPORT_RDMA].state;
}

static int setup(void **state)
{
    (void)state;
    const struct orb_verbs *v;
    int n = 0;
    struct ibv_device **list = NULL;
    if (orb_verbs_get(&v) == 0)
        list = v->get_device_list(&n);
    if (list == NULL || n == 0) {
        if (getenv("ORBITE_VM") != NULL)
            fail_msg("no verbs device inside the test VM");
        printf("skipped: no verbs device\n");
        exit(77);
    }
    ndevices = n;
    /* The inventory names devices in natural order; the first of that order is the pin. */
    snprintf(first_name, sizeof first_name, "%s", v->get_device_name(list[0]));
    for (int i = 1; i < n; i++)
        if (strcmp(v->get_device_name(list[i]), first_name) < 0)
            snprintf(first_name, sizeof first_name, "%s", v->get_device_name(list[i]));
    v->free_device_list(list);
    return 0;
}

static void test_opens_every_device(void **state)
{
    (void)state;
    orb_engine *e = engine_with(NULL);
    assert_non_null(e);
    assert_non_null(e->tp[ORB_TRANSPORT_RDMA].ops);
    struct orb_rdma_tp *tp = tp_of(e);
    assert_int_equal(tp->dev.nopen, ndevices);
    for (uint32_t i = 0; i < tp->dev.nslots; i++) {
        assert_non_null(tp->dev.nics[i].pd);
        assert_int_equal(tp->dev.nics[i].route, ORB_RDMA_ROUTE_DIRECT);
        assert_true(tp->caps[i].queried);
        assert_true(tp->caps[i].mw_type_2b); /* rxe binds type-2B windows */
    }
    orb_engine_free(e);
}

static void test_filters_narrow_the_set(void **state)
{
    (void)state;
    const char *const pin[] = {"device", first_name, NULL};
    orb_engine *e = engine_with(pin);
    assert_non_null(e);
    assert_int_equal(tp_of(e)->dev.nopen, 1);
    assert_string_equal(tp_of(e)->dev.nics[0].name, first_name);
    orb_engine_free(e);

    if (ndevices > 1) {
        const char *const black[] = {"rdma_blacklist", first_name, NULL};
        e = engine_with(black);
        assert_non_null(e);
        assert_int_equal(tp_of(e)->dev.nopen, ndevices - 1);
        assert_null(tp_of(e)->dev.nics[0].pd);
        orb_engine_free(e);
        const char *const mask[] = {"device_mask", "0x2", NULL};
        e = engine_with(mask);
        assert_non_null(e);
        assert_int_equal(tp_of(e)->dev.nopen, 1);
        assert_non_null(tp_of(e)->dev.nics[1].pd);
        orb_engine_free(e);
    }

    const char *const missing[] = {"rdma_whitelist", "no_such_nic0", NULL};
    assert_null(engine_with(missing));
    assert_non_null(strstr(orb_last_error(), "no_such_nic0"));
}

static void check_mrs(orb_engine *e, const void *bytes, size_t len, bool remote)
{
    struct orb_reg *r = NULL;
    assert_int_equal(orb_registry_acquire(e->registry, (uint64_t)(uintptr_t)bytes, len, ORB_PERM_LOCAL, &r), 0);
    const struct orb_rdma_reg_mrs *m = orb_rdma_tp_reg_mrs(r);
    assert_non_null(m);
    struct orb_rdma_tp *tp = tp_of(e);
    assert_int_equal(m->count, (uint32_t)ndevices * (remote ? 2u : 1u));
    for (uint32_t i = 0; i < tp->dev.nslots; i++) {
        const struct orb_rdma_reg_mr *mr = orb_rdma_reg_mrs_on(m, i);
        assert_non_null(mr);
        assert_ptr_equal(mr->local->addr, bytes);
        assert_int_equal(mr->local->length, len);
        assert_ptr_equal(mr->local->pd, tp->dev.nics[i].pd);
        assert_ptr_equal(mr->local->context, tp->dev.nics[i].ctx);
        if (remote) {
            assert_non_null(mr->parent);
            assert_ptr_equal(mr->parent->addr, bytes);
            assert_int_equal(mr->parent->length, len);
            assert_ptr_equal(mr->parent->pd, tp->dev.nics[i].pd);
            assert_int_not_equal(mr->parent->lkey, mr->local->lkey);
        } else {
            assert_null(mr->parent);
        }
    }
    orb_registry_release(r);
}

static void test_direct_registration(void **state)
{
    (void)state;
    orb_engine *e = engine_with(NULL);
    assert_non_null(e);
    const size_t len = 4u << 20;
    orb_host_memory *m, *l;
    assert_int_equal(orb_host_memory_alloc(len, 0, &m), 0);
    assert_int_equal(orb_host_memory_alloc(65536 + 17, 0, &l), 0);
    orb_reg_id remote_id, local_id, odd_id;
    assert_int_equal(orb_register_host_memory(e, m, 0, len, ORB_PERM_REMOTE_WRITE, &remote_id), 0);
    assert_int_equal(orb_register_host_memory(e, l, 0, 65536, ORB_PERM_LOCAL, &local_id), 0);
    /* An unaligned start and length: the MR covers exactly those bytes. */
    assert_int_equal(orb_register_host_memory(e, l, 65536 + 3, 14, ORB_PERM_REMOTE_READ, &odd_id), 0);
    check_mrs(e, orb_host_memory_data(m), len, true);
    check_mrs(e, orb_host_memory_data(l), 65536, false);
    check_mrs(e, (uint8_t *)orb_host_memory_data(l) + 65536 + 3, 14, true);
    struct orb_rdma_stats c;
    assert_int_equal(orb_engine_rdma_stats(e, &c), 0);
    assert_int_equal(c.registrations, 3);
    assert_int_equal(c.memory_regions, (uint64_t)ndevices * 5);
    assert_int_equal(c.registered_bytes, len + 65536 + 14);

    assert_int_equal(orb_unregister_memory(e, remote_id), 0);
    assert_int_equal(orb_unregister_memory(e, local_id), 0);
    assert_int_equal(orb_unregister_memory(e, odd_id), 0);
    for (int i = 0; i < 5000; i++) {
        assert_int_equal(orb_engine_rdma_stats(e, &c), 0);
        if (c.memory_regions == 0)
            break;
        usleep(1000);
    }
    assert_int_equal(c.memory_regions, 0);
    assert_int_equal(c.registrations, 0);
    assert_int_equal(c.kept_memory_regions, 0);
    orb_host_memory_unref(m);
    orb_host_memory_unref(l);
    orb_engine_free(e);
}

/* A Direct registration that the device cannot take fails; it never falls back to staging. */
static void test_direct_registration_failure_is_an_error(void **state)
{
    (void)state;
    orb_engine *e = engine_with(NULL);
    assert_non_null(e);
    /* Read-only pages cannot back a LOCAL_WRITE MR. */
    static const uint8_t ro[8192] __attribute__((aligned(4096))) = {1};
    orb_host_memory *m;
    assert_int_equal(orb_host_memory_wrap((void *)(uintptr_t)ro, sizeof ro, NULL, NULL, &m), 0);
    orb_reg_id id;
    int rc = orb_register_host_memory(e, m, 0, sizeof ro, ORB_PERM_REMOTE_READ, &id);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(orb_last_error(), "rdma"));
    struct orb_rdma_stats c;
    assert_int_equal(orb_engine_rdma_stats(e, &c), 0);
    assert_int_equal(c.memory_regions, 0);
    assert_int_equal(c.registered_bytes, 0);
    orb_host_memory_unref(m);
    orb_engine_free(e);
}

static void test_staged_registers_nothing(void **state)
{
    (void)state;
    const char *const staged[] = {"host_memory", "staged", NULL};
    orb_engine *e = engine_with(staged);
    assert_non_null(e);
    orb_host_memory *m;
    assert_int_equal(orb_host_memory_alloc(65536, 0, &m), 0);
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(e, m, 0, 65536, ORB_PERM_REMOTE_WRITE, &id), 0);
    struct orb_rdma_stats c;
    assert_int_equal(orb_engine_rdma_stats(e, &c), 0);
    assert_int_equal(c.memory_regions, 0);
    assert_int_equal(orb_unregister_memory(e, id), 0);
    orb_host_memory_unref(m);
    orb_engine_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_opens_every_device),
        cmocka_unit_test(test_filters_narrow_the_set),
        cmocka_unit_test(test_direct_registration),
        cmocka_unit_test(test_direct_registration_failure_is_an_error),
        cmocka_unit_test(test_staged_registers_nothing),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
