/* What the RDMA device tests share: the NIC lists a run uses (the VM's rails topology by default,
 * or what hardware/run.sh names), whether those devices are here, an engine made from RDMA
 * settings given as key/value pairs, its stats, and the clock. Header-only; each test includes
 * it once. */
#ifndef ORB_TESTS_RDMA_DEVICE_UTIL_H
#define ORB_TESTS_RDMA_DEVICE_UTIL_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <orbite/orbite.h>

#include "core/engine_internal.h"
#include "core/error.h"
#include "rdma/verbs.h"

/* The monotonic clock, in ns. */
static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* e's RDMA stats. A test that cannot read them ends here, naming why. */
static inline struct orb_rdma_stats stats_of(orb_engine *e)
{
    struct orb_rdma_stats s;
    if (orb_engine_rdma_stats(e, &s) != 0) {
        fprintf(stderr, "orb_engine_rdma_stats: %s\n", orb_last_error());
        abort();
    }
    return s;
}

/* The value of `var`, or `dflt` when it is unset or empty. */
static inline const char *rdma_test_nics(const char *var, const char *dflt)
{
    const char *v = getenv(var);
    return v != NULL && v[0] != '\0' ? v : dflt;
}
#define RDMA_TEST_REQUESTER_NICS rdma_test_nics("ORBITE_RDMA_REQUESTER_NICS", "rxe_a0,rxe_a1")
#define RDMA_TEST_SOURCE_NICS rdma_test_nics("ORBITE_RDMA_SOURCE_NICS", "rxe_b0,rxe_b1")

/* Whether every device of the comma list `list` is here. */
static inline bool rdma_test_present(const char *list)
{
    const struct orb_verbs *v;
    int n = 0;
    struct ibv_device **devs = NULL;
    if (orb_verbs_get(&v) == 0)
        devs = v->get_device_list(&n);
    char copy[256];
    snprintf(copy, sizeof copy, "%s", list);
    bool all = devs != NULL;
    for (char *save = NULL, *name = strtok_r(copy, ",", &save); all && name != NULL;
         name = strtok_r(NULL, ",", &save)) {
        bool found = false;
        for (int i = 0; i < n && !found; i++)
            found = strcmp(v->get_device_name(devs[i]), name) == 0;
        all = found;
    }
    if (devs != NULL)
        v->free_device_list(devs);
    return all;
}

/* An engine with the RDMA settings kv[] (key, value pairs, NULL-terminated; NULL: defaults;
 * the key "io_timeout_s" sets the engine's own setting instead), the helper setting `helper` and
 * the source side on or off, into *out. 0, or the failing call's status with orb_last_error()
 * saying why (a setting the RDMA config refused included). The transports are ops[0..n)
 * (orb_engine_create_with: tests replace one), or the library's own where ops is NULL. */
static inline int rdma_test_engine_with(const char *const *kv, int source, enum orb_helper_mode helper,
                                        const struct orb_transport_ops *const *ops, size_t n, orb_engine **out)
{
    orb_rdma_config *rdma = NULL;
    int rc = orb_rdma_config_new(&rdma);
    uint32_t io_timeout_s = 0;
    for (size_t i = 0; rc == 0 && kv != NULL && kv[i] != NULL; i += 2) {
        if (strcmp(kv[i], "io_timeout_s") == 0)
            io_timeout_s = (uint32_t)strtoul(kv[i + 1], NULL, 10);
        else if ((rc = orb_rdma_config_set(rdma, kv[i], kv[i + 1])) != 0)
            (void)orb_fail_wrap(rc, "%s = %s", kv[i], kv[i + 1]);
    }
    if (rc == 0) {
        struct orb_engine_config cfg;
        orb_engine_config_init(&cfg);
        cfg.helper_mode = helper;
        cfg.enable_source = source;
        if (io_timeout_s != 0)
            cfg.io_timeout_s = io_timeout_s;
        struct orb_engine_params p = {.field_mask = ORB_ENGINE_PARAM_CONFIG | ORB_ENGINE_PARAM_RDMA,
                                      .config = &cfg, .rdma = rdma};
        rc = ops != NULL ? orb_engine_create_with(&cfg, rdma, ops, n, out) : orb_engine_create_params(&p, out);
    }
    orb_rdma_config_free(rdma);
    return rc;
}

/* rdma_test_engine_with() with the library's own transports. */
static inline int rdma_test_engine(const char *const *kv, int source, enum orb_helper_mode helper, orb_engine **out)
{
    return rdma_test_engine_with(kv, source, helper, NULL, 0, out);
}

#endif
