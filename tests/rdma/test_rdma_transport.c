/* The RDMA transport's start-up and registrations (lib/rdma/rdma_transport.c) inside a real
 * engine, on a scripted environment: no settings means no libibverbs; a missing library, a
 * policy without RDMA and no usable NIC leave the engine on TCP; filters and pins that do not
 * hold fail the engine; the policy's NIC mask bounds what is opened; under the Direct policy
 * every registration has a local-only MR (and for remote access an MW_BIND parent) on every
 * open context before it is visible, all or nothing, retired on the release thread before the
 * owner's release; a device that refuses a deregistration keeps the MR and the bytes; the
 * Staged policy registers nothing; the policy's byte budget holds. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "core/engine_internal.h"
#include "core/error.h"
#include "rdma/rdma_transport.h"

#define NNICS 3
#define MAX_MRS 64

struct fake_mr {
    struct ibv_mr mr;
    unsigned access;
    int nic;
};

/* What the environment answers, and what it saw. */
static struct {
    int verbs_status;          /* load_verbs */
    int verbs_loads;
    uint64_t allowed;          /* the policy's NIC mask */
    bool policy, rdma_granted;
    uint64_t max_bytes;
    bool with_helper;          /* helper_open_device present: the provider cannot import */
    int reg_fail_at;           /* the n-th reg_mr (1-based) fails with ENOMEM; 0: none */
    bool dereg_fails;          /* every dereg_mr fails */
    int reg_calls, dereg_calls;
    int opened[NNICS];
    int live_mrs;
    struct fake_mr *mrs[MAX_MRS];
    pthread_t dereg_thread;
    atomic_int dereg_seq;
    int release_seq;
    atomic_int seq;
    char ctx_mem[NNICS];
    char pd_mem[NNICS];
} sc;

static struct orb_verbs fake_verbs;
/* The MR fakes run on the registering thread and on the engine's release thread. */
static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;

static int f_load_verbs(void *impl, const struct orb_verbs **out)
{
    (void)impl;
    sc.verbs_loads++;
    if (sc.verbs_status != 0)
        return orb_fail(sc.verbs_status, "fake: libibverbs.so.1 is missing");
    *out = &fake_verbs;
    return 0;
}

static int f_discover(void *impl, enum orb_helper_mode mode, struct orb_rdma_discovery *out)
{
    (void)impl, (void)mode;
    memset(&out->inv, 0, sizeof out->inv);
    out->inv.nnics = NNICS;
    for (int i = 0; i < NNICS; i++) {
        struct orb_topo_nic *n = &out->inv.nics[i];
        n->id = (uint8_t)i;
        n->usable = 1;
        n->nports = 1;
        snprintf(n->name, sizeof n->name, "nic%d", i);
        n->numa_node = -1;
        n->ports[0].num = 1;
        n->ports[0].state = ORB_PORT_ACTIVE;
        n->ports[0].link_layer = ORB_LINK_ETHERNET;
    }
    out->allowed = sc.allowed;
    out->policy = sc.policy;
    out->rdma_granted = sc.rdma_granted;
    out->max_registered_bytes = sc.max_bytes;
    out->helper = NULL;
    return 0;
}

static int nic_of_name(const char *name)
{
    int i = -1;
    assert_int_equal(sscanf(name, "nic%d", &i), 1);
    assert_true(i >= 0 && i < NNICS);
    return i;
}

static int f_helper_open_device(void *impl, const char *nic, int *fd_out)
{
    (void)impl, (void)nic, (void)fd_out;
    return orb_fail(ORB_EUNAVAILABLE, "fake helper: not an mlx5 device");
}
static struct ibv_context *f_import(void *impl, int fd)
{
    (void)impl, (void)fd;
    fail_msg("nothing is imported in this test");
    return NULL;
}
static struct ibv_context *f_open_direct(void *impl, const char *nic)
{
    (void)impl;
    int i = nic_of_name(nic);
    sc.opened[i]++;
    return (struct ibv_context *)(void *)&sc.ctx_mem[i];
}
static int f_close_device(void *impl, struct ibv_context *ctx)
{
    (void)impl, (void)ctx;
    return 0;
}
static struct ibv_pd *f_alloc_pd(void *impl, struct ibv_context *ctx)
{
    (void)impl;
    int i = (int)((char *)(void *)ctx - sc.ctx_mem);
    return (struct ibv_pd *)(void *)&sc.pd_mem[i];
}
static int f_dealloc_pd(void *impl, struct ibv_pd *pd)
{
    (void)impl, (void)pd;
    return 0;
}

static struct ibv_mr *f_reg_mr(void *impl, struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
                               unsigned access)
{
    (void)impl;
    pthread_mutex_lock(&fake_lock);
    sc.reg_calls++;
    if (sc.reg_fail_at > 0 && sc.reg_calls == sc.reg_fail_at) {
        pthread_mutex_unlock(&fake_lock);
        errno = ENOMEM;
        return NULL;
    }
    struct fake_mr *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.lkey = (uint32_t)sc.reg_calls;
    m->mr.rkey = (uint32_t)sc.reg_calls;
    m->access = access;
    m->nic = (int)((char *)(void *)pd - sc.pd_mem);
    assert_int_equal(iova, (uint64_t)(uintptr_t)addr);
    for (int i = 0; i < MAX_MRS; i++) {
        if (sc.mrs[i] == NULL) {
            sc.mrs[i] = m;
            sc.live_mrs++;
            pthread_mutex_unlock(&fake_lock);
            return &m->mr;
        }
    }
    fail_msg("too many MRs");
    return NULL;
}
static int f_dereg_mr(void *impl, struct ibv_mr *mr)
{
    (void)impl;
    pthread_mutex_lock(&fake_lock);
    sc.dereg_calls++;
    sc.dereg_thread = pthread_self();
    atomic_store(&sc.dereg_seq, atomic_fetch_add(&sc.seq, 1));
    if (sc.dereg_fails) {
        pthread_mutex_unlock(&fake_lock);
        return EBUSY;
    }
    for (int i = 0; i < MAX_MRS; i++) {
        if (sc.mrs[i] != NULL && &sc.mrs[i]->mr == mr) {
            free(sc.mrs[i]);
            sc.mrs[i] = NULL;
            sc.live_mrs--;
            pthread_mutex_unlock(&fake_lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    fail_msg("deregistering an unknown MR");
    return EINVAL;
}
static int f_query_device(void *impl, struct ibv_context *ctx, struct ibv_device_attr *out)
{
    (void)impl, (void)ctx;
    memset(out, 0, sizeof *out);
    out->device_cap_flags = IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    out->max_mr_size = UINT64_MAX;
    out->max_qp_wr = 4096;
    return 0;
}

static struct orb_rdma_open_ops open_ops = {
    .helper_open_device = NULL, .import_device = f_import, .open_direct = f_open_direct,
    .close_device = f_close_device, .alloc_pd = f_alloc_pd, .dealloc_pd = f_dealloc_pd,
};
static const struct orb_rdma_mr_ops mr_ops = {.reg_mr = f_reg_mr, .dereg_mr = f_dereg_mr};

static int scripted_start(orb_engine *engine, void **tp_out)
{
    open_ops.helper_open_device = sc.with_helper ? f_helper_open_device : NULL;
    struct orb_rdma_env env = {
        .impl = NULL, .load_verbs = f_load_verbs, .discover = f_discover, .open_ops = &open_ops,
        .mr_ops = &mr_ops, .query_device = f_query_device,
    };
    return orb_rdma_tp_start_with(engine, &env, tp_out);
}

static struct orb_transport_ops scripted_rdma;

static int locked_read(const int *field)
{
    pthread_mutex_lock(&fake_lock);
    int v = *field;
    pthread_mutex_unlock(&fake_lock);
    return v;
}
#define LIVE_MRS() locked_read(&sc.live_mrs)
#define DEREG_CALLS() locked_read(&sc.dereg_calls)

static void reset(void)
{
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < MAX_MRS; i++)
        free(sc.mrs[i]);
    memset(&sc, 0, sizeof sc);
    sc.allowed = UINT64_MAX;
    sc.rdma_granted = true;
    sc.max_bytes = UINT64_MAX;
    scripted_rdma = orb_rdma_transport;
    scripted_rdma.start = scripted_start;
    pthread_mutex_unlock(&fake_lock);
}

/* An engine with RDMA settings `kv` ("key=value" pairs, NULL-terminated; NULL: no settings). */
static int make_engine(const char *const *kv, enum orb_helper_mode mode, orb_engine **out)
{
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.helper_mode = mode;
    orb_rdma_config *rdma = NULL;
    if (kv != NULL) {
        assert_int_equal(orb_rdma_config_new(&rdma), 0);
        for (size_t i = 0; kv[i] != NULL; i += 2)
            assert_int_equal(orb_rdma_config_set(rdma, kv[i], kv[i + 1]), 0);
    }
    const struct orb_transport_ops *ops[] = {&orb_tcp_transport, &scripted_rdma};
    int rc = orb_engine_create_with(&cfg, rdma, ops, 2, out);
    orb_rdma_config_free(rdma);
    return rc;
}

static struct orb_rdma_tp *rdma_of(orb_engine *e)
{
    return e->tp[ORB_TRANSPORT_RDMA].state;
}

static void counters(orb_engine *e, struct orb_rdma_stats *c)
{
    assert_int_equal(orb_engine_rdma_stats(e, c), 0);
}

static int setup(void **state)
{
    (void)state;
    reset();
    return 0;
}

static const char *const no_keys[] = {NULL};

/* ---- start ----------------------------------------------------------------------------------- */

static void test_no_settings_no_rdma(void **state)
{
    (void)state;
    orb_engine *e;
    assert_int_equal(make_engine(NULL, ORB_HELPER_OFF, &e), 0);
    assert_null(e->tp[ORB_TRANSPORT_RDMA].ops);
    assert_int_equal(sc.verbs_loads, 0); /* never even looked for the library */
    struct orb_rdma_stats st;
    assert_int_equal(orb_engine_rdma_stats(e, &st), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "without RDMA settings"));
    assert_int_equal(orb_engine_rdma_stats(NULL, &st), ORB_EINVAL);
    assert_int_equal(orb_engine_rdma_stats(e, NULL), ORB_EINVAL);
    struct orb_rdma_nic_load l[2];
    size_t count = 99;
    assert_int_equal(orb_engine_rdma_nic_load(e, l, 2, &count), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "without RDMA settings"));
    assert_int_equal(orb_engine_rdma_nic_load(e, NULL, 0, &count), ORB_EUNAVAILABLE);
    assert_int_equal(orb_engine_rdma_nic_load(NULL, l, 2, &count), ORB_EINVAL);
    assert_int_equal(orb_engine_rdma_nic_load(e, l, 2, NULL), ORB_EINVAL);
    assert_int_equal(orb_engine_rdma_nic_load(e, NULL, 2, &count), ORB_EINVAL);
    assert_int_equal(count, 99); /* written only on success */
    orb_engine_free(e);
}

static void test_not_on_this_host(void **state)
{
    (void)state;
    orb_engine *e;
    /* No library. */
    sc.verbs_status = ORB_EUNAVAILABLE;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_OFF, &e), 0);
    assert_null(e->tp[ORB_TRANSPORT_RDMA].ops);
    assert_int_equal(sc.verbs_loads, 1);
    assert_non_null(strstr(e->tp[ORB_TRANSPORT_RDMA].absent_why, "libibverbs.so.1"));
    orb_engine_free(e);
    /* The policy grants no RDMA: nothing is opened. */
    reset();
    sc.policy = true;
    sc.rdma_granted = false;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_OFF, &e), 0);
    assert_null(e->tp[ORB_TRANSPORT_RDMA].ops);
    assert_int_equal(sc.opened[0] + sc.opened[1] + sc.opened[2], 0);
    orb_engine_free(e);
    /* The policy allows none of the NICs. */
    reset();
    sc.policy = true;
    sc.allowed = UINT64_C(1) << 40;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_OFF, &e), 0);
    assert_null(e->tp[ORB_TRANSPORT_RDMA].ops);
    assert_int_equal(sc.opened[0] + sc.opened[1] + sc.opened[2], 0);
    orb_engine_free(e);
}

static void test_filters_and_policy(void **state)
{
    (void)state;
    orb_engine *e;
    /* The policy's mask: nic1 is never opened. */
    sc.policy = true;
    sc.allowed = 0x5;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_OFF, &e), 0);
    assert_non_null(e->tp[ORB_TRANSPORT_RDMA].ops);
    assert_int_equal(sc.opened[0], 1);
    assert_int_equal(sc.opened[1], 0);
    assert_int_equal(sc.opened[2], 1);
    assert_int_equal(rdma_of(e)->dev.nopen, 2);
    assert_int_equal(rdma_of(e)->dev.nics[1].status, ORB_EPERM);
    assert_true(rdma_of(e)->caps[0].mw_type_2b);
    orb_engine_free(e);

    /* A device pin opens that NIC only. */
    reset();
    const char *const pin[] = {"device", "nic2", NULL};
    assert_int_equal(make_engine(pin, ORB_HELPER_OFF, &e), 0);
    assert_int_equal(sc.opened[0] + sc.opened[1], 0);
    assert_int_equal(sc.opened[2], 1);
    orb_engine_free(e);

    /* A blacklist and a device mask. */
    reset();
    const char *const black[] = {"rdma_blacklist", "nic0", "device_mask", "0x3", NULL};
    assert_int_equal(make_engine(black, ORB_HELPER_OFF, &e), 0);
    assert_int_equal(sc.opened[0] + sc.opened[2], 0);
    assert_int_equal(sc.opened[1], 1);
    orb_engine_free(e);

    /* A pin that does not hold, or filters that leave nothing, fail the engine: no fallback. */
    reset();
    const char *const missing[] = {"device", "nic7", NULL};
    assert_int_equal(make_engine(missing, ORB_HELPER_OFF, &e), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "nic7"));
    const char *const nothing[] = {"rdma_whitelist", "nic0", "rdma_blacklist", "nic1", "device_mask", "0x6", NULL};
    assert_int_equal(make_engine(nothing, ORB_HELPER_OFF, &e), ORB_ECONFIG);
    assert_int_equal(sc.opened[0] + sc.opened[1] + sc.opened[2], 0);

    /* GPUDirect switched off while device memory is asked to be direct: a configuration error
     * naming both keys, before any device is opened; staged device memory goes with it. */
    reset();
    const char *const contradiction[] = {"cuda_memory", "direct", "disable_gpu_direct_rdma", "true", NULL};
    assert_int_equal(make_engine(contradiction, ORB_HELPER_OFF, &e), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "cuda_memory"));
    assert_non_null(strstr(orb_last_error(), "disable_gpu_direct_rdma"));
    assert_int_equal(sc.opened[0] + sc.opened[1] + sc.opened[2], 0);
    reset();
    const char *const staged[] = {"cuda_memory", "staged", "disable_gpu_direct_rdma", "true", NULL};
    assert_int_equal(make_engine(staged, ORB_HELPER_OFF, &e), 0);
    assert_non_null(e->tp[ORB_TRANSPORT_RDMA].ops);
    orb_engine_free(e);

    /* gpu_source_reuse is how a GPU source under direct grants: without direct it is a
     * configuration error naming both keys, before any device is opened. */
    reset();
    const char *const reuse_staged[] = {"cuda_memory", "staged", "gpu_source_reuse", "true", NULL};
    assert_int_equal(make_engine(reuse_staged, ORB_HELPER_OFF, &e), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "gpu_source_reuse"));
    assert_non_null(strstr(orb_last_error(), "cuda_memory"));
    assert_int_equal(sc.opened[0] + sc.opened[1] + sc.opened[2], 0);
    reset();
    const char *const reuse_off[] = {"cuda_memory", "staged", "gpu_source_reuse", "false", NULL};
    assert_int_equal(make_engine(reuse_off, ORB_HELPER_OFF, &e), 0);
    orb_engine_free(e);
}

/* With the helper required, a provider that cannot import a context fails the engine and names
 * the device; with AUTO the device is opened here. */
static void test_helper_required_cannot_import(void **state)
{
    (void)state;
    orb_engine *e;
    sc.with_helper = true;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_REQUIRED, &e), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "nic0"));
    assert_non_null(strstr(orb_last_error(), "cannot import"));
    assert_int_equal(sc.opened[0] + sc.opened[1] + sc.opened[2], 0);

    reset();
    sc.with_helper = true;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_AUTO, &e), 0);
    assert_int_equal(rdma_of(e)->dev.nopen, NNICS);
    for (int i = 0; i < NNICS; i++)
        assert_int_equal(rdma_of(e)->dev.nics[i].route, ORB_RDMA_ROUTE_DIRECT);
    orb_engine_free(e);
}

/* ---- registrations ------------------------------------------------------------------------- */

static atomic_int released;
static void note_release(void *ptr, size_t len, void *ctx)
{
    (void)len, (void)ctx;
    free(ptr);
    sc.release_seq = atomic_fetch_add(&sc.seq, 1);
    atomic_fetch_add(&released, 1);
}

static void wait_released(int n)
{
    for (int i = 0; i < 5000 && atomic_load(&released) < n; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&released), n);
}

static int count_mrs(int nic, unsigned access, const void *addr, size_t len)
{
    int n = 0;
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < MAX_MRS; i++) {
        const struct fake_mr *m = sc.mrs[i];
        if (m != NULL && m->nic == nic && m->access == access && m->mr.addr == addr && m->mr.length == len)
            n++;
    }
    pthread_mutex_unlock(&fake_lock);
    return n;
}

static void test_direct_registration(void **state)
{
    (void)state;
    sc.policy = true;
    sc.allowed = 0x5; /* nic0 and nic2 */
    orb_engine *e;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_OFF, &e), 0);
    atomic_store(&released, 0);

    /* Remote access: a local-only MR and an MW_BIND parent on each open context. */
    uint8_t *a = malloc(8192);
    assert_non_null(a);
    orb_reg_id ida;
    assert_int_equal(orb_register_memory(e, a, 8192, ORB_PERM_REMOTE_WRITE, note_release, NULL, &ida), 0);
    assert_int_equal(LIVE_MRS(), 4);
    for (int nic = 0; nic < NNICS; nic += 2) {
        assert_int_equal(count_mrs(nic, IBV_ACCESS_LOCAL_WRITE, a, 8192), 1);
        assert_int_equal(count_mrs(nic, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND, a, 8192), 1);
    }
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < MAX_MRS; i++) /* nothing grants remote access by itself */
        if (sc.mrs[i] != NULL)
            assert_int_equal(sc.mrs[i]->access & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE), 0);
    pthread_mutex_unlock(&fake_lock);
    struct orb_rdma_stats c;
    counters(e, &c);
    assert_int_equal(c.registrations, 1);
    assert_int_equal(c.memory_regions, 4);
    assert_int_equal(c.registered_bytes, 8192);
    struct orb_rdma_stats st;
    memset(&st, 0xff, sizeof st);
    assert_int_equal(orb_engine_rdma_stats(e, &st), 0);
    assert_int_equal(st.registrations, 1);
    assert_int_equal(st.memory_regions, 4);
    assert_int_equal(st.registered_bytes, 8192);
    assert_int_equal(st.nics_open, 2);
    assert_int_equal(st.rails, 0); /* this environment has no data path */
    size_t nloads = 7;
    assert_int_equal(orb_engine_rdma_nic_load(e, NULL, 0, &nloads), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "carries requests"));
    assert_int_equal(nloads, 7);
    assert_int_equal(st.comp_mask, 0);
    assert_int_equal(st.staging_bytes, 0); /* direct: no staging */
    assert_int_equal(st.staged_transfers, 0);
    assert_int_equal(st.helper, 0); /* the NICs were opened without a helper here */
    assert_int_equal(st.read_replays, 0);
    assert_int_equal(st.progress_recoveries, 0);

    /* Local only: the local-only MR alone. */
    uint8_t *b = malloc(4096);
    assert_non_null(b);
    orb_reg_id idb;
    assert_int_equal(orb_register_memory(e, b, 4096, ORB_PERM_LOCAL, note_release, NULL, &idb), 0);
    assert_int_equal(LIVE_MRS(), 6);
    assert_int_equal(count_mrs(0, IBV_ACCESS_LOCAL_WRITE, b, 4096), 1);
    assert_int_equal(count_mrs(2, IBV_ACCESS_LOCAL_WRITE, b, 4096), 1);
    assert_int_equal(count_mrs(1, IBV_ACCESS_LOCAL_WRITE, b, 4096), 0);

    /* The table the data path reads. */
    struct orb_local_region region;
    assert_int_equal(orb_resolve_local_address(e, (uint64_t)(uintptr_t)a, 1, &region), 0);

    /* Unregistering deregisters on the release thread, before the owner's release. */
    assert_int_equal(orb_unregister_memory(e, ida), 0);
    wait_released(1);
    assert_true(atomic_load(&sc.dereg_seq) < sc.release_seq);
    pthread_mutex_lock(&fake_lock);
    assert_false(pthread_equal(sc.dereg_thread, pthread_self()));
    pthread_mutex_unlock(&fake_lock);
    assert_int_equal(LIVE_MRS(), 2);
    assert_int_equal(orb_unregister_memory(e, idb), 0);
    wait_released(2);
    assert_int_equal(LIVE_MRS(), 0);
    counters(e, &c);
    assert_int_equal(c.registrations, 0);
    assert_int_equal(c.memory_regions, 0);
    assert_int_equal(c.registered_bytes, 0);
    assert_int_equal(c.kept_memory_regions, 0);
    orb_engine_free(e);
}

/* One MR that cannot be created refuses the registration: the copies made before it are gone,
 * nothing is visible, and the caller keeps the bytes. */
static void test_direct_registration_all_or_nothing(void **state)
{
    (void)state;
    orb_engine *e;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_OFF, &e), 0);
    atomic_store(&released, 0);
    sc.reg_fail_at = 4; /* nic0 local, nic0 parent, nic1 local, nic1 parent fails */
    uint8_t *a = malloc(4096);
    assert_non_null(a);
    orb_reg_id id;
    assert_int_equal(orb_register_memory(e, a, 4096, ORB_PERM_REMOTE_READ, note_release, NULL, &id),
                     ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "nic1"));
    assert_non_null(strstr(orb_last_error(), "parent"));
    assert_non_null(strstr(orb_last_error(), "rdma"));
    assert_int_equal(LIVE_MRS(), 0);
    assert_int_equal(DEREG_CALLS(), 3);
    struct orb_local_region region;
    assert_int_equal(orb_resolve_local_address(e, (uint64_t)(uintptr_t)a, 1, &region), ORB_ENOENT);
    struct orb_rdma_stats c;
    counters(e, &c);
    assert_int_equal(c.registrations, 0);
    assert_int_equal(c.registered_bytes, 0);
    usleep(10000);
    assert_int_equal(atomic_load(&released), 0);
    free(a); /* still ours */

    /* The same through a batch: the other ranges' MRs are undone too. */
    orb_host_memory *owner;
    assert_int_equal(orb_host_memory_alloc(3 * 4096, 0, &owner), 0);
    struct orb_host_range r[3];
    for (int i = 0; i < 3; i++)
        r[i] = (struct orb_host_range){.owner = owner, .offset = (size_t)i * 4096, .length = 4096,
                                       .perm = ORB_PERM_LOCAL};
    pthread_mutex_lock(&fake_lock);
    sc.reg_calls = 0;
    sc.reg_fail_at = 2 * NNICS + 2; /* range 2's second NIC */
    pthread_mutex_unlock(&fake_lock);
    orb_reg_id ids[3];
    assert_int_equal(orb_register_host_memory_batch(e, r, 3, ids), ORB_ERESOURCE);
    assert_int_equal(LIVE_MRS(), 0);
    sc.reg_fail_at = 0;
    assert_int_equal(orb_register_host_memory_batch(e, r, 3, ids), 0);
    assert_int_equal(LIVE_MRS(), 3 * NNICS);
    for (int i = 0; i < 3; i++)
        assert_int_equal(orb_unregister_memory(e, ids[i]), 0);
    orb_host_memory_unref(owner);
    orb_engine_free(e);
    assert_int_equal(LIVE_MRS(), 0);
}

/* A device that will not deregister keeps its MR and the bytes under it, forever. */
static void test_refused_deregistration_keeps_bytes(void **state)
{
    (void)state;
    orb_engine *e;
    sc.allowed = 0x1;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_OFF, &e), 0);
    atomic_store(&released, 0);
    uint8_t *bytes = malloc(4096);
    assert_non_null(bytes);
    orb_host_memory *owner;
    assert_int_equal(orb_host_memory_wrap(bytes, 4096, note_release, NULL, &owner), 0);
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(e, owner, 0, 4096, ORB_PERM_REMOTE_WRITE, &id), 0);
    pthread_mutex_lock(&fake_lock);
    sc.dereg_fails = true;
    pthread_mutex_unlock(&fake_lock);
    assert_int_equal(orb_unregister_memory(e, id), 0);
    orb_host_memory_unref(owner);
    for (int i = 0; i < 5000 && DEREG_CALLS() < 2; i++)
        usleep(1000);
    usleep(20000);
    assert_int_equal(DEREG_CALLS(), 2);
    assert_int_equal(atomic_load(&released), 0);
    struct orb_rdma_stats c;
    counters(e, &c);
    assert_int_equal(c.kept_memory_regions, 2);
    assert_int_equal(c.memory_regions, 0);
    assert_int_equal(c.registrations, 0);
    orb_engine_free(e);
    assert_int_equal(atomic_load(&released), 0);
    /* The test drops the reference the engine kept, so that it ends without a leak. */
    orb_host_memory_unref(owner);
    assert_int_equal(atomic_load(&released), 1);
    pthread_mutex_lock(&fake_lock);
    sc.dereg_fails = false;
    /* The fake's MR records stay: the transport keeps them reachable for the process's life. */
    for (int i = 0; i < MAX_MRS; i++)
        sc.mrs[i] = NULL;
    pthread_mutex_unlock(&fake_lock);
}

static void test_staged_registers_nothing(void **state)
{
    (void)state;
    orb_engine *e;
    const char *const staged[] = {"host_memory", "staged", NULL};
    assert_int_equal(make_engine(staged, ORB_HELPER_OFF, &e), 0);
    assert_non_null(e->tp[ORB_TRANSPORT_RDMA].ops);
    orb_host_memory *owner;
    assert_int_equal(orb_host_memory_alloc(4096, 0, &owner), 0);
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(e, owner, 0, 4096, ORB_PERM_REMOTE_WRITE, &id), 0);
    assert_int_equal(sc.reg_calls, 0);
    assert_int_equal(orb_unregister_memory(e, id), 0);
    orb_host_memory_unref(owner);
    orb_engine_free(e);
}

static void test_policy_byte_budget(void **state)
{
    (void)state;
    orb_engine *e;
    sc.policy = true;
    sc.max_bytes = 12288;
    assert_int_equal(make_engine(no_keys, ORB_HELPER_OFF, &e), 0);
    orb_host_memory *owner;
    assert_int_equal(orb_host_memory_alloc(4 * 4096, 0, &owner), 0);
    orb_reg_id a, b, c;
    assert_int_equal(orb_register_host_memory(e, owner, 0, 8192, ORB_PERM_LOCAL, &a), 0);
    assert_int_equal(orb_register_host_memory(e, owner, 8192, 8192, ORB_PERM_LOCAL, &b), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "policy"));
    assert_int_equal(LIVE_MRS(), NNICS);
    assert_int_equal(orb_register_host_memory(e, owner, 8192, 4096, ORB_PERM_LOCAL, &c), 0);
    assert_int_equal(orb_unregister_memory(e, a), 0);
    /* The charge returns once the MRs are gone (on the release thread). */
    int rc = ORB_ERESOURCE;
    for (int i = 0; i < 5000 && rc == ORB_ERESOURCE; i++) {
        rc = orb_register_host_memory(e, owner, 8192, 8192, ORB_PERM_LOCAL, &b);
        if (rc == ORB_ERESOURCE)
            usleep(1000);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(orb_unregister_memory(e, b), 0);
    assert_int_equal(orb_unregister_memory(e, c), 0);
    orb_host_memory_unref(owner);
    orb_engine_free(e);
    assert_int_equal(LIVE_MRS(), 0);
}

/* Where no NIC carries requests (here: an environment without a data path) the segment opens on
 * TCP alone, and a request that names RDMA says why it cannot go. */
static void test_requests_stay_on_tcp(void **state)
{
    (void)state;
    orb_engine *src, *req;
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.enable_source = 1;
    orb_rdma_config *rdma;
    assert_int_equal(orb_rdma_config_new(&rdma), 0);
    const struct orb_transport_ops *ops[] = {&orb_tcp_transport, &scripted_rdma};
    assert_int_equal(orb_engine_create_with(&cfg, rdma, ops, 2, &src), 0);
    cfg.enable_source = 0;
    assert_int_equal(orb_engine_create_with(&cfg, rdma, ops, 2, &req), 0);
    orb_rdma_config_free(rdma);
    char ep[ORB_ENDPOINT_MAX];
    assert_int_equal(orb_engine_endpoint(src, ep, sizeof ep), 0);
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_source_epoch(src, &epoch), 0);
    orb_segment *seg;
    assert_int_equal(orb_open_segment(req, ep, &epoch, 5000000000ull, &seg), 0);
    orb_host_memory *m;
    assert_int_equal(orb_host_memory_alloc(4096, 0, &m), 0);
    memset(orb_host_memory_data(m), 0x3c, 4096);
    orb_reg_id sid, lid;
    assert_int_equal(orb_register_host_memory(src, m, 0, 4096, ORB_PERM_REMOTE_READ, &sid), 0);
    orb_host_memory *l;
    assert_int_equal(orb_host_memory_alloc(4096, 0, &l), 0);
    assert_int_equal(orb_register_host_memory(req, l, 0, 4096, ORB_PERM_LOCAL, &lid), 0);
    struct orb_request r;
    memset(&r, 0, sizeof r);
    r.op = ORB_OP_READ;
    r.local_addr = (uint64_t)(uintptr_t)orb_host_memory_data(l);
    r.remote_addr = (uint64_t)(uintptr_t)orb_host_memory_data(m);
    r.length = 4096;
    r.transport = ORB_TRANSPORT_RDMA;
    struct orb_batch_report rep;
    assert_int_equal(orb_submit_and_wait(req, seg, &r, 1, NULL, 5000000000ull, &rep), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "no NIC of this engine carries requests"));
    r.transport = ORB_TRANSPORT_UNSPEC;
    assert_int_equal(orb_submit_and_wait(req, seg, &r, 1, NULL, 5000000000ull, &rep), 0);
    assert_int_equal(((uint8_t *)orb_host_memory_data(l))[4095], 0x3c);
    orb_segment_close(seg);
    assert_int_equal(orb_unregister_memory(req, lid), 0);
    assert_int_equal(orb_unregister_memory(src, sid), 0);
    orb_host_memory_unref(l);
    orb_host_memory_unref(m);
    orb_engine_free(req);
    orb_engine_free(src);
    assert_int_equal(LIVE_MRS(), 0);
}

static int teardown_all(void **state)
{
    (void)state;
    reset();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_no_settings_no_rdma, setup),
        cmocka_unit_test_setup(test_not_on_this_host, setup),
        cmocka_unit_test_setup(test_filters_and_policy, setup),
        cmocka_unit_test_setup(test_helper_required_cannot_import, setup),
        cmocka_unit_test_setup(test_direct_registration, setup),
        cmocka_unit_test_setup(test_direct_registration_all_or_nothing, setup),
        cmocka_unit_test_setup(test_refused_deregistration_keeps_bytes, setup),
        cmocka_unit_test_setup(test_staged_registers_nothing, setup),
        cmocka_unit_test_setup(test_policy_byte_budget, setup),
        cmocka_unit_test_setup(test_requests_stay_on_tcp, setup),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_all);
}
