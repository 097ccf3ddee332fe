/* The RDMA transport: start-up (library, discovery, filters, contexts) and registrations (see
 * rdma_transport.h). */
#include "rdma/rdma_transport.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "cuda/cuda_kind.h"
#include "cuda/cuda_memory.h"
#include "rdma/gdr.h"
#include "rdma/rdma_data.h"
#include "helper/helper_client.h"
#include "topo/matrix.h"
#include "topo/mem_numa.h"
#include "topo/sysfs.h"
#include "topo/tiers.h"
#include "topo/topo_config.h"

/* The helper's start and every call of its session. */
#define HELPER_TIMEOUT_NS (10ull * 1000000000ull)

/* ---- MRs a device would not let go of ---------------------------------------------------- */

/* They stay reachable for the process's lifetime: never freed, never retried. */
struct kept_mrs {
    struct kept_mrs *next;
    struct orb_rdma_reg_mrs *mrs;
};
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept_mrs *kept_head;

static void keep_forever(struct orb_rdma_tp *tp, struct orb_rdma_reg_mrs *m)
{
    atomic_fetch_add(&tp->kept_mrs, m->count);
    struct kept_mrs *k = malloc(sizeof *k);
    pthread_mutex_lock(&kept_lock);
    if (k != NULL) {
        k->mrs = m;
        k->next = kept_head;
        kept_head = k;
    }
    pthread_mutex_unlock(&kept_lock);
    /* Without the node the table is unreachable but still never freed: the same effect. */
}

/* ---- the real environment ------------------------------------------------------------------ */

static int real_load_verbs(void *impl, const struct orb_verbs **out)
{
    (void)impl;
    return orb_verbs_get(out);
}

static int discover_sysfs(struct orb_rdma_discovery *out)
{
    int fd = open("/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: cannot open /sys: %s", strerror(errno));
    int rc = orb_topo_load_sysfs(fd, &out->inv);
    (void)close(fd);
    if (rc != 0)
        return rc;
    out->allowed = UINT64_MAX;
    out->policy = false;
    out->rdma_granted = true;
    out->max_registered_bytes = UINT64_MAX;
    return 0;
}

/* The provider of `nic` as sysfs names it, for messages (devices.c). */
static int sysfs_describe_provider(void *impl, const char *nic, char *buf, size_t len)
{
    (void)impl;
    int fd = open("/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: cannot open /sys: %s", strerror(errno));
    int rc = orb_topo_nic_provider(fd, nic, buf, len);
    (void)close(fd);
    return rc;
}

static int real_discover(void *impl, enum orb_helper_mode mode, struct orb_rdma_discovery *out)
{
    (void)impl;
    out->helper = NULL;
    if (mode != ORB_HELPER_OFF) {
        struct orb_helper *h = NULL;
        int rc = orb_helper_open(mode, HELPER_TIMEOUT_NS, &h);
        if (rc != 0) {
            if (!orb_helper_failure_tolerated(mode, rc))
                return orb_fail_wrap(rc, "rdma: the helper is required (or failed)");
            ORB_LOGI("rdma: no helper (%s): discovering the NICs from /sys", orb_last_error());
        } else {
            struct orb_hp_policy p;
            rc = orb_helper_inventory(h, &out->inv);
            if (rc == 0)
                rc = orb_helper_policy(h, &p);
            if (rc != 0) {
                rc = orb_fail_wrap(rc, "rdma: the helper's inventory or policy");
                orb_helper_close(h);
                return rc;
            }
            out->helper = h;
            out->allowed = p.nic_mask;
            out->policy = true;
            out->rdma_granted = (p.transports & ORB_HP_T_RDMA) != 0;
            out->max_registered_bytes = p.max_registered_bytes;
            return 0;
        }
    }
    return discover_sysfs(out);
}

static int real_query_device(void *impl, struct ibv_context *ctx, struct ibv_device_attr *out)
{
    const struct orb_rdma_verbs_impl *vi = impl;
    return vi->v->query_device(ctx, out);
}

static int real_query_port(void *impl, struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *out)
{
    const struct orb_rdma_verbs_impl *vi = impl;
    return orb_verbs_query_port(vi->v, ctx, port, out);
}

static const struct orb_rdma_env real_env = {
    .impl = NULL,
    .load_verbs = real_load_verbs,
    .discover = real_discover,
    .open_ops = NULL,
    .mr_ops = NULL,
    .query_device = real_query_device,
    .query_port = real_query_port,
};

const struct orb_rdma_env *orb_rdma_real_env(void)
{
    return &real_env;
}

/* ---- start --------------------------------------------------------------------------------- */

/* The NICs' tiers for host memory of each location, from discovery and the priority matrix
 * (priority_matrix, else custom_json_path; an invalid one fails the engine, never falls back):
 * row 0 for memory of unknown node ("*"), row 1 + N for memory on node N, for the nodes the
 * inventory has (node 0 alone on a host without NUMA data). */
/* Row 1 + node: the tiers of host memory on `node` (nodes beyond "cpu:N"'s range get none). */
static int node_row(struct orb_rdma_tp *tp, const struct orb_topo_config *tc, uint64_t eligible, int32_t node)
{
    if (node < 0 || node > ORB_LOCATION_CPU_MAX)
        return 0;
    struct orb_location loc = {.kind = ORB_LOC_CPU, .index = (uint8_t)node};
    tp->numa_rows |= 1ull << node;
    return orb_topo_tiers_ranked(&tp->disc.inv, tc, eligible, tp->ranks, loc, tp->nic_tier[1 + node]);
}

static int locality_rows(struct orb_rdma_tp *tp, const struct orb_topo_config *tc, uint64_t eligible)
{
    const struct orb_topo_inventory *inv = &tp->disc.inv;
    int rc = orb_topo_ranks_load(tp->cfg->priority_matrix, tp->cfg->custom_json_path, inv, eligible, &tp->ranks);
    if (rc != 0)
        return orb_fail_wrap(rc, "rdma: the NIC priority matrix");
    struct orb_location any = {.kind = ORB_LOC_ANY, .index = 0};
    rc = orb_topo_tiers_ranked(inv, tc, eligible, tp->ranks, any, tp->nic_tier[0]);
    tp->numa_rows = 0;
    if (rc == 0 && inv->nnuma == 0)
        rc = node_row(tp, tc, eligible, 0);
    for (uint32_t i = 0; rc == 0 && i < inv->nnuma && i < ORB_TOPO_MAX_NUMA; i++)
        rc = node_row(tp, tc, eligible, inv->numa[i].id);
    if (rc != 0)
        return orb_fail_wrap(rc, "rdma: the NICs' locality tiers");
    if (tp->ranks != NULL)
        ORB_LOGI("rdma: NIC ranks per memory location from %s",
                 tp->cfg->priority_matrix != NULL ? "priority_matrix" : tp->cfg->custom_json_path);
    return 0;
}

/* Not on this host: the reason is the detail message. */
static int not_here(const char *why)
{
    (void)orb_fail(ORB_EUNAVAILABLE, "%s", why);
    return ORB_TP_NOT_HERE;
}

static void query_caps(struct orb_rdma_tp *tp)
{
    /* The real /sys only where the devices are real (a scripted environment has none). */
    int sysfs = tp->env.open_ops == NULL ? open("/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    for (uint32_t i = 0; i < tp->dev.nslots; i++) {
        const struct orb_rdma_nic *n = &tp->dev.nics[i];
        if (n->pd == NULL)
            continue;
        struct ibv_device_attr a;
        memset(&a, 0, sizeof a);
        int err = tp->env.query_device(tp->ops_impl, n->ctx, &a);
        if (err != 0) {
            ORB_LOGW("rdma: %s: cannot query its limits: %s", n->name, strerror(err));
            continue;
        }
        struct orb_rdma_nic_caps *c = &tp->caps[i];
        c->queried = true;
        c->mw_type_2b = (a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0;
        c->max_mr_size = a.max_mr_size;
        c->max_qp_wr = a.max_qp_wr > 0 ? (uint32_t)a.max_qp_wr : 0;
        c->max_cqe = a.max_cqe > 0 ? (uint32_t)a.max_cqe : 0;
        c->max_qp_rd_atom = a.max_qp_rd_atom > 0 ? (uint32_t)a.max_qp_rd_atom : 0;
        c->max_qp_init_rd_atom = a.max_qp_init_rd_atom > 0 ? (uint32_t)a.max_qp_init_rd_atom : 0;
        if (!c->mw_type_2b)
            ORB_LOGW("rdma: %s: no type-2B memory windows: it cannot carry grants", n->name);
        c->one_lane = sysfs >= 0 && orb_topo_nic_is_rxe(sysfs, n->name);
        if (c->one_lane)
            ORB_LOGI("rdma: %s: soft-RoCE: its queue pairs share one lane", n->name);
    }
    if (sysfs >= 0)
        (void)close(sysfs);
}

static void log_opened(const struct orb_rdma_tp *tp)
{
    char list[512];
    size_t used = 0;
    list[0] = '\0';
    for (uint32_t i = 0; i < tp->dev.nslots && used < sizeof list; i++) {
        const struct orb_rdma_nic *n = &tp->dev.nics[i];
        if (n->pd == NULL)
            continue;
        int w = snprintf(list + used, sizeof list - used, "%s%s (%s)", used > 0 ? ", " : "", n->name,
                         n->route == ORB_RDMA_ROUTE_IMPORTED ? "through the helper" : "opened here");
        if (w < 0)
            break;
        used += (size_t)w;
    }
    ORB_LOGI("rdma: %u NIC(s) open: %s; host memory policy %s", tp->dev.nopen, list,
             tp->cfg->host_memory == ORB_RDMA_HOST_STAGED ? "staged" : "direct");
}

static void tp_free(struct orb_rdma_tp *tp)
{
    uint32_t kept = orb_rdma_devices_close(&tp->dev);
    if (kept > 0)
        ORB_LOGE("rdma: %u device objects could not be released: they are kept", kept);
    orb_helper_close(tp->disc.helper);
    orb_topo_ranks_free(tp->ranks);
    rdma_slots_detach(tp);
    free(tp);
}

int orb_rdma_tp_start_with(orb_engine *engine, const struct orb_rdma_env *env, void **tp_out)
{
    const struct orb_rdma_config *cfg = orb_engine_rdma_config(engine);
    if (cfg == NULL)
        return not_here("rdma: the engine was created without RDMA settings");
    if (cfg->cuda_memory == ORB_RDMA_CUDA_DIRECT && cfg->disable_gpu_direct_rdma)
        return orb_fail(ORB_ECONFIG, "rdma keys 'cuda_memory' direct and 'disable_gpu_direct_rdma' true contradict "
                        "each other: direct device memory is GPUDirect RDMA");
    if (cfg->gpu_source_reuse && cfg->cuda_memory != ORB_RDMA_CUDA_DIRECT)
        return orb_fail(ORB_ECONFIG, "rdma key 'gpu_source_reuse' true needs 'cuda_memory' direct: it is how a GPU "
                        "source under direct grants its memory");
    /* mlx5 can scatter a small READ's result into the completion and copy it with the CPU, which
     * device memory cannot take: Direct device memory needs the provider told not to. */
    const char *scatter = getenv("MLX5_SCATTER_TO_CQE");
    if (cfg->cuda_memory == ORB_RDMA_CUDA_DIRECT && (scatter == NULL || strcmp(scatter, "0") != 0))
        return orb_fail(ORB_ECONFIG, "rdma key 'cuda_memory' direct needs MLX5_SCATTER_TO_CQE=0 in the environment "
                        "before the process starts (it is %s%s%s)", scatter != NULL ? "\"" : "unset",
                        scatter != NULL ? scatter : "", scatter != NULL ? "\"" : "");
    struct orb_rdma_tp *tp = calloc(1, sizeof *tp);
    if (tp == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: cannot allocate the transport");
    tp->engine = engine;
    tp->cfg = cfg;
    tp->env = *env;
    int rc = tp->env.load_verbs(tp->env.impl, &tp->v);
    if (rc != 0) {
        free(tp);
        return rc == ORB_EUNAVAILABLE ? ORB_TP_NOT_HERE : rc;
    }
    enum orb_helper_mode mode = (enum orb_helper_mode)orb_engine_cfg(engine)->helper_mode;
    rc = tp->env.discover(tp->env.impl, mode, &tp->disc);
    if (rc != 0) {
        free(tp);
        return rc;
    }
    if (!tp->disc.rdma_granted) {
        rc = not_here("rdma: the helper's policy grants this tenant no RDMA");
        goto free_tp;
    }
    struct orb_topo_config tc;
    uint64_t eligible = 0;
    if ((rc = orb_topo_config_from_rdma(cfg, &tc)) != 0 || (rc = orb_topo_filter(&tp->disc.inv, &tc, &eligible)) != 0) {
        rc = orb_fail_wrap(rc, "rdma: the NIC filters");
        goto free_tp;
    }
    if ((rc = locality_rows(tp, &tc, eligible)) != 0)
        goto free_tp;
    uint64_t allowed = eligible & tp->disc.allowed;
    if (allowed == 0) {
        rc = not_here(eligible != 0 ? "rdma: the helper's policy allows none of the eligible RDMA NICs"
                                    : "rdma: no usable RDMA NIC on this host");
        goto free_tp;
    }

    /* The device and MR tables: the environment's, or libibverbs' over the helper session. */
    struct orb_rdma_open_ops open_ops;
    if (tp->env.open_ops != NULL) {
        open_ops = *tp->env.open_ops;
        tp->ops_impl = tp->env.impl;
    } else {
        orb_rdma_devices_verbs_ops(&tp->verbs, tp->v, tp->disc.helper, &open_ops);
        open_ops.describe_provider = sysfs_describe_provider;
        tp->ops_impl = &tp->verbs;
    }
    if (tp->env.mr_ops == NULL)
        tp->env.mr_ops = orb_rdma_verbs_mr_ops_for(tp->v);
    rc = orb_rdma_devices_open(&open_ops, tp->ops_impl, &tp->disc.inv, allowed, mode, &tp->dev);
    if (rc != 0)
        goto free_tp;
    if (tp->dev.nopen == 0) {
        rc = not_here("rdma: none of the eligible NICs could be opened (see the log)");
        goto free_tp;
    }
    query_caps(tp);
    if ((rc = rdma_slots_attach(tp)) != 0)
        goto free_tp;
    rc = rdma_data_start(tp);
    if (rc != 0) {
        ORB_LOGW("%s: requests travel on TCP", orb_last_error());
        rc = 0;
    }
    log_opened(tp);
    *tp_out = tp;
    return 0;

free_tp:
    {
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        tp_free(tp);
        if (rc == ORB_TP_NOT_HERE)
            (void)orb_fail(ORB_EUNAVAILABLE, "%s", why);
        else
            (void)orb_fail(rc, "%s", why);
    }
    return rc;
}

static int rdma_start(orb_engine *engine, void **tp_out)
{
    return orb_rdma_tp_start_with(engine, &real_env, tp_out);
}

/* ---- registrations --------------------------------------------------------------------------- */

static int charge_bytes(struct orb_rdma_tp *tp, uint64_t len)
{
    uint64_t cur = atomic_load(&tp->registered_bytes);
    for (;;) {
        if (len > tp->disc.max_registered_bytes || cur > tp->disc.max_registered_bytes - len)
            return orb_fail(ORB_ERESOURCE, "rdma: the helper's policy allows %llu registered bytes; %llu are "
                            "registered and this registration adds %llu",
                            (unsigned long long)tp->disc.max_registered_bytes, (unsigned long long)cur,
                            (unsigned long long)len);
        if (atomic_compare_exchange_weak(&tp->registered_bytes, &cur, cur + len))
            return 0;
    }
}

/* Whether a peer-memory module says it is loaded: the helper's probe when a helper session is
 * open, else the same files read here. */
static bool peermem_loaded(struct orb_rdma_tp *tp)
{
    uint32_t found = 0;
    if (tp->disc.helper != NULL) {
        if (orb_helper_peermem_probe(tp->disc.helper, &found) != 0) {
            ORB_LOGW("rdma: the helper's peer-memory probe failed (%s): taken as no module", orb_last_error());
            return false;
        }
        return found != 0;
    }
    int sys = open("/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sys < 0)
        return false;
    found = orb_gdr_probe_peermem(sys);
    (void)close(sys);
    return found != 0;
}

/* Device memory under cuda_memory direct: local-only MRs by the route the settings and the host
 * give (rdma/gdr.h), that route only; any failure is the registration's. */
static int gdr_attach(struct orb_rdma_tp *tp, const struct orb_reg *reg, void **state_out)
{
    if (reg->kind != &orb_memkind_cuda)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: %s memory cannot be registered with the NICs", reg->kind->name);
    orb_cuda_memory *mem = reg->owner;
    struct orb_gdr_facts f = {.verbs_dmabuf = tp->env.mr_ops->reg_dmabuf != NULL};
    int rc = orb_cuda_device_dmabuf(orb_cuda_memory_device(mem), &f.cuda_dmabuf);
    if (rc != 0)
        return rc;
    /* The module is asked about only when it could decide. */
    if (tp->cfg->gpu_direct_registration == ORB_RDMA_GDR_PEERMEM ||
        (tp->cfg->gpu_direct_registration == ORB_RDMA_GDR_AUTO && !(f.cuda_dmabuf && f.verbs_dmabuf)))
        f.peermem = peermem_loaded(tp);
    enum orb_gdr_route route = 0;
    if ((rc = orb_gdr_choose(tp->cfg->gpu_direct_registration, &f, &route)) != 0)
        return rc;
    /* A NIC touches these bytes behind the driver's back: its synchronous operations on them
     * must synchronize, and what it writes must become visible to the device's own work (in
     * order, or by a flush after each READ). */
    bool ordered = false, flushable = false;
    if ((rc = orb_cuda_memory_sync_memops(mem)) != 0 ||
        (rc = orb_cuda_device_gdr_writes(orb_cuda_memory_device(mem), &ordered, &flushable)) != 0)
        return rc;
    if (!ordered && !flushable)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: device %d does not order GPUDirect writes and cannot flush them "
                        "(cuFlushGPUDirectRDMAWrites): its memory takes no Direct registration",
                        orb_cuda_memory_device(mem));
    if ((rc = charge_bytes(tp, reg->len)) != 0)
        return rc;
    struct orb_rdma_reg_mrs *m = NULL;
    if (route == ORB_GDR_ROUTE_DMABUF) {
        int fd = -1;
        uint64_t base = 0, size = 0;
        if ((rc = orb_cuda_memory_dmabuf(mem, &fd, &base, &size)) == 0) {
            /* The whole allocation exported; the MR holds exactly the registered range. */
            rc = orb_rdma_reg_mrs_create_dmabuf(tp->env.mr_ops, tp->ops_impl, &tp->dev, fd, reg->base - base, reg->base,
                                                reg->len, &m);
            if (rc != 0 && m == NULL)
                (void)close(fd);
        }
    } else {
        rc = orb_rdma_reg_mrs_create(tp->env.mr_ops, tp->ops_impl, &tp->dev, (void *)(uintptr_t)reg->base, reg->base,
                                     reg->len, false, &m);
    }
    if (rc != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        if (m != NULL) {
            keep_forever(tp, m);
            orb_reg_keep_owner(reg);
        } else {
            atomic_fetch_sub(&tp->registered_bytes, reg->len);
        }
        /* Never another route, never staging: the application asked for Direct. */
        return orb_fail(rc, "rdma: registering device memory by %s: %s", orb_gdr_route_name(route), why);
    }
    m->route = (uint8_t)route;
    m->gdr_flush = !ordered;
    if (tp->cfg->gpu_source_reuse && reg->perm != ORB_PERM_LOCAL) {
        bool keep = false;
        m->reuse_mask = rdma_reuse_probe(tp, m, reg->base, reg->len, &keep);
        if (keep) {
            /* A probe key over these bytes may still be in force: they and their MRs stay. */
            keep_forever(tp, m);
            orb_reg_keep_owner(reg);
            return orb_fail(ORB_EUNQUIESCED, "rdma: a gpu_source_reuse probe key over the registration could not be "
                            "destroyed; its memory is kept for good");
        }
    }
    atomic_fetch_add(route == ORB_GDR_ROUTE_DMABUF ? &tp->dmabuf_registrations : &tp->peermem_registrations, 1);
    atomic_fetch_add(&tp->registrations, 1);
    atomic_fetch_add(&tp->mrs, m->count);
    ORB_LOGD("rdma: a device registration of %llu bytes by %s", (unsigned long long)reg->len,
             orb_gdr_route_name(route));
    *state_out = m;
    return 0;
}

static int rdma_reg_attach(void *tp_, const struct orb_reg *reg, void **state_out)
{
    struct orb_rdma_tp *tp = tp_;
    *state_out = NULL;
    /* Memory without a CPU view (device memory): staged by cuda_memory's default, else Direct. */
    if (reg->kind->kind != ORB_MEM_HOST)
        return tp->cfg->cuda_memory == ORB_RDMA_CUDA_DIRECT ? gdr_attach(tp, reg, state_out) : 0;
    /* Staged: the payload moves through private staging; the application's bytes get no MR. */
    if (tp->cfg->host_memory == ORB_RDMA_HOST_STAGED)
        return 0;
    int rc = charge_bytes(tp, reg->len);
    if (rc != 0)
        return rc;
    void *cpu = reg->kind->cpu_view(reg, reg->base);
    struct orb_rdma_reg_mrs *m = NULL;
    rc = orb_rdma_reg_mrs_create(tp->env.mr_ops, tp->ops_impl, &tp->dev, cpu, reg->base, reg->len,
                                 reg->perm != ORB_PERM_LOCAL, &m);
    if (rc != 0) {
        if (m != NULL) {
            /* The undo failed: the device may still map these bytes, so they stay too. */
            keep_forever(tp, m);
            orb_reg_keep_owner(reg);
        } else {
            atomic_fetch_sub(&tp->registered_bytes, reg->len);
        }
        return rc;
    }
    /* Pinned now, so the pages are where they stay: their node picks the tiers of requests. */
    m->numa_node = orb_mem_numa_node(cpu);
    atomic_fetch_add(&tp->registrations, 1);
    atomic_fetch_add(&tp->mrs, m->count);
    *state_out = m;
    return 0;
}

static uint32_t rdma_reg_gpu_routes(void *tp_, const struct orb_reg *reg, const void *state)
{
    (void)tp_;
    (void)reg;
    const struct orb_rdma_reg_mrs *m = state;
    return m->route == ORB_GDR_ROUTE_DMABUF ? ORB_GPU_ROUTE_DMABUF
           : m->route == ORB_GDR_ROUTE_PEERMEM ? ORB_GPU_ROUTE_PEERMEM
                                                : 0;
}

static int rdma_reg_retire(void *tp_, const struct orb_reg *reg, void *state)
{
    struct orb_rdma_tp *tp = tp_;
    struct orb_rdma_reg_mrs *m = state;
    uint32_t count = m->count;
    int rc = orb_rdma_reg_mrs_destroy(tp->env.mr_ops, tp->ops_impl, m);
    atomic_fetch_sub(&tp->registrations, 1);
    if (rc != 0) {
        atomic_fetch_sub(&tp->mrs, count);
        keep_forever(tp, m);
        return rc; /* the charge stays with the kept bytes */
    }
    atomic_fetch_sub(&tp->mrs, count);
    atomic_fetch_sub(&tp->registered_bytes, reg->len);
    return 0;
}

const struct orb_rdma_reg_mrs *orb_rdma_tp_reg_mrs(const struct orb_reg *reg)
{
    return reg->tp_state[ORB_TRANSPORT_RDMA];
}


static int rdma_stats(void *tp_, void *out, size_t len)
{
    struct orb_rdma_tp *tp = tp_;
    struct orb_rdma_stats st;
    if (len != sizeof st)
        return orb_fail(ORB_EINVAL, "rdma stats: %zu bytes asked for, not %zu", len, sizeof st);
    memset(&st, 0, sizeof st);
    st.nics_open = tp->dev.nopen;
    st.rails = tp->nrails;
    st.helper = tp->disc.helper != NULL;
    st.completed_reads = atomic_load(&tp->completed_reads);
    st.completed_writes = atomic_load(&tp->completed_writes);
    st.payload_send_cqes = atomic_load(&tp->payload_send_cqes);
    st.errors = atomic_load(&tp->errors);
    st.registrations = atomic_load(&tp->registrations);
    st.memory_regions = atomic_load(&tp->mrs);
    st.registered_bytes = atomic_load(&tp->registered_bytes);
    st.kept_memory_regions = atomic_load(&tp->kept_mrs);
    st.dmabuf_registrations = atomic_load(&tp->dmabuf_registrations);
    st.peermem_registrations = atomic_load(&tp->peermem_registrations);
    st.staged_slots = atomic_load(&tp->slots_moved);
    st.private_grants = atomic_load(&tp->private_grants);
    st.reuse_grants = atomic_load(&tp->reuse_grants);
    st.reuse_probe_failures = atomic_load(&tp->reuse_probe_failures);
    st.kept_keys = atomic_load(&tp->kept_keys);
    st.own_connection_grants = atomic_load(&tp->own_grants);
    st.grant_round_trips = atomic_load(&tp->grant_trips);
    st.ack_messages = atomic_load(&tp->ack_messages);
    st.requests_in_flight = atomic_load(&tp->inflight_reqs);
    st.grants_active = atomic_load(&tp->active_grants);
    st.grants_served = atomic_load(&tp->grants_served);
    st.staging_bytes = tp->data ? rdma_staging_in_use(tp) : 0;
    st.staged_transfers = atomic_load(&tp->staged_transfers);
    st.slot_deferrals = atomic_load(&tp->slot_deferrals);
    st.deadline_drops = atomic_load(&tp->deadline_drops);
    st.reconnects = atomic_load(&tp->reconnects);
    st.read_replays = atomic_load(&tp->read_replays);
    st.progress_recoveries = atomic_load(&tp->progress_recoveries);
    st.connections = atomic_load(&tp->connections);
    st.source_connections = atomic_load(&tp->source_connections);
    if (tp->health != NULL) {
        struct orb_rail_stats rs;
        orb_rail_stats(tp->health, &rs);
        st.rail_errors = rs.errors;
        st.rail_open_pairs = rs.open_pairs;
        st.rail_probes = rs.probes;
        st.rail_recoveries = rs.recoveries;
    }
    st.monitor_ticks = atomic_load(&tp->monitor_ticks);
    st.route_queries = atomic_load(&tp->route_queries);
    st.route_recoveries = atomic_load(&tp->route_recoveries);
    st.routes_down = (uint64_t)__builtin_popcount(atomic_load(&tp->routes_down));
    st.kept_queue_pairs = atomic_load(&tp->kept_qps);
    memcpy(out, &st, sizeof st);
    return 0;
}

static int rdma_nic_load(void *tp_, void *out_, size_t cap, size_t *count)
{
    struct orb_rdma_tp *tp = tp_;
    if (!tp->data || tp->sel == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: none of this engine's NICs carries requests");
    if (out_ == NULL && cap == 0) {
        *count = tp->nrails;
        return 0;
    }
    if (cap < tp->nrails)
        return orb_fail(ORB_EINVAL, "orb_engine_rdma_nic_load: room for %zu NICs, %u rails", cap, tp->nrails);
    struct orb_nic_load l[ORB_RDMA_MAX_RAILS];
    uint32_t n = 0;
    int rc = orb_selector_load_stats(tp->sel, l, ORB_RDMA_MAX_RAILS, &n);
    if (rc != 0)
        return rc;
    struct orb_rdma_nic_load *out = out_;
    for (uint32_t k = 0; k < n && k < tp->nrails; k++) {
        const struct rdma_ctx *c = tp->dctx[tp->rail_nic[k]];
        struct orb_rdma_nic_load *o = &out[k];
        memset(o, 0, sizeof *o);
        o->rail = k;
        snprintf(o->name, sizeof o->name, "%s", tp->dev.nics[c->nic].name);
        o->port = c->port;
        o->port_active = (atomic_load(&tp->routes_down) & (1u << k)) == 0;
        o->healthy = l[k].healthy && o->port_active;
        struct orb_rail_nic_stats rn;
        if (tp->health != NULL && orb_rail_nic_stats(tp->health, tp->rail_nic[k], &rn) == 0) {
            o->rail_errors = rn.errors;
            o->rail_probes = rn.probes;
            o->rail_open_pairs = rn.open_pairs;
        }
        o->link_mbps = l[k].link_mbps;
        o->effective_mbps = l[k].effective_mbps;
        o->selection_bps = l[k].selection_bps;
        o->transmit_bps = l[k].transmit_bps;
        o->charged_bytes = l[k].charged_bytes;
        o->posted_bytes = l[k].posted_bytes;
        o->completed_bytes = l[k].completed_bytes;
        o->allocated_bytes = l[k].allocated_bytes;
    }
    *count = tp->nrails;
    return 0;
}

/* ---- lifecycle and peers ------------------------------------------------------------------- */

static void rdma_close_source(void *tp)
{
    (void)tp; /* the engine's source flag fences control messages (orb_engine_control) */
}

static int rdma_stop(void *tp, uint64_t deadline)
{
    return rdma_data_stop(tp, deadline);
}

static void rdma_destroy(void *tp_)
{
    struct orb_rdma_tp *tp = tp_;
    if (rdma_data_stop(tp, orb_now_ns()) != 0) {
        /* Never reached through the engine, which keeps an unquiesced engine for good. */
        ORB_LOGE("rdma: destroy: %s: the transport is kept", orb_last_error());
        rdma_staging_abandon(tp); /* the pool may go: the chunks NICs may reach stay */
        return;
    }
    rdma_data_destroy(tp);
    tp_free(tp);
}

static uint64_t rdma_inflight(void *tp_)
{
    struct orb_rdma_tp *tp = tp_;
    return atomic_load(&tp->inflight_reqs) + atomic_load(&tp->active_grants);
}

const struct orb_transport_ops orb_rdma_transport = {
    .id = ORB_TRANSPORT_RDMA,
    .name = "rdma",
    .request_private_size = sizeof(struct rdma_req),
    .moves_device_memory = 1,
    .start = rdma_start,
    .endpoint = NULL,
    .close_source = rdma_close_source,
    .stop = rdma_stop,
    .destroy = rdma_destroy,
    .inflight = rdma_inflight,
    .reg_attach = rdma_reg_attach,
    .reg_retire = rdma_reg_retire,
    .reg_gpu_routes = rdma_reg_gpu_routes,
    .peer_open = rdma_peer_open,
    .peer_describe = NULL,
    .peer_plan = rdma_peer_plan,
    .peer_submit = rdma_peer_submit,
    .peer_release = rdma_peer_release,
    .control = rdma_source_control,
    .stats = rdma_stats,
    .nic_load = rdma_nic_load,
};
