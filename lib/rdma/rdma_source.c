/* The RDMA transport's source side: connections, grants, the end of a grant and its ACK (see
 * rdma_data.h). */
#include "rdma/rdma_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/registry.h"
#include "rdma/rdma_transport.h"

/* ---- connections ------------------------------------------------------------------------------ */

/* The connection (sender, incarnation), or NULL (tp->lock held). */
static struct rdma_src_conn *find_conn(struct orb_rdma_tp *tp, const struct orb_epoch *sender, uint64_t incarnation)
{
    for (struct rdma_src_conn *c = tp->conns; c != NULL; c = c->next)
        if (c->incarnation == incarnation && memcmp(c->sender.bytes, sender->bytes, sizeof sender->bytes) == 0 &&
            !c->closing)
            return c;
    return NULL;
}

/* find_conn() for a handler: the connection is not torn down until conn_put(). */
static struct rdma_src_conn *conn_get(struct orb_rdma_tp *tp, const struct orb_epoch *sender, uint64_t incarnation)
{
    pthread_mutex_lock(&tp->lock);
    struct rdma_src_conn *c = find_conn(tp, sender, incarnation);
    if (c != NULL)
        c->users++;
    pthread_mutex_unlock(&tp->lock);
    return c;
}

static void conn_put(struct orb_rdma_tp *tp, struct rdma_src_conn *c)
{
    pthread_mutex_lock(&tp->lock);
    c->users--;
    pthread_mutex_unlock(&tp->lock);
}

static void conn_free_links(struct rdma_src_conn *c)
{
    rdma_links_drop(c->links, 0, c->nqps);
}

/* Undo a grant's windows and pin. Windows whose binding may still be in force are discarded
 * (freed: that revokes them), invalidated ones go back to their pool. */
static void grant_release(struct rdma_src_conn *c, struct rdma_grant *g, bool invalidated_only_put)
{
    for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++) {
        if (g->win[k] == NULL)
            continue;
        struct rdma_ctx *x = c->links[k]->ctx;
        pthread_mutex_lock(&x->wlock);
        if (invalidated_only_put && (g->done_mask & (1u << k)))
            orb_rdma_window_put(&x->windows, g->win[k]);
        else
            orb_rdma_window_discard(&x->windows, g->win[k]);
        pthread_mutex_unlock(&x->wlock);
        g->win[k] = NULL;
    }
    rdma_stage_put(c->tp, &g->stage); /* after the windows on it are gone */
    if (g->pin != NULL) {
        orb_reg_loan_end(g->pin, g->loan);
        g->loan = NULL;
        orb_registry_release(g->pin);
        g->pin = NULL;
    }
}

/* Unhook `g` from its connection (conn lock held). */
static void grant_unlink(struct rdma_src_conn *c, struct rdma_grant *g)
{
    for (struct rdma_grant **pp = &c->grants; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    }
    if (g->published) {
        for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++)
            if (g->rail_mask & (1u << k))
                c->ngrants[k]--;
        atomic_fetch_sub(&c->tp->active_grants, 1);
    }
}

/* Fail a connection: its queue pairs to the error state, its published grants revoked. The
 * links themselves go later (rdma_src_reap), once their flushes are in. */
static void conn_fail(struct rdma_src_conn *c, int status, const char *why)
{
    pthread_mutex_lock(&c->lock);
    int first = c->failed == 0;
    if (first)
        c->failed = status;
    pthread_mutex_unlock(&c->lock);
    if (!first)
        return;
    if (status == ORB_ECLOSED)
        ORB_LOGD("rdma: a requester's connection closes: %s", why);
    else
        ORB_LOGW("rdma: a requester's connection is failed: %s", why);
    for (uint32_t k = 0; k < c->nqps; k++)
        if (c->links[k] != NULL)
            rdma_link_fail(c->links[k], status);
}

static void conn_mark_closing(struct orb_rdma_tp *tp, struct rdma_src_conn *c)
{
    /* tp->lock held */
    if (c->closing)
        return;
    c->closing = true;
    atomic_fetch_sub(&tp->source_connections, 1);
    for (struct rdma_src_conn **pp = &tp->conns; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    c->reap_next = tp->reap_conns;
    tp->reap_conns = c;
}

static uint32_t conn_outstanding(struct rdma_src_conn *c)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < c->nqps; k++) {
        if (c->links[k] == NULL)
            continue;
        pthread_mutex_lock(&c->links[k]->lock);
        n += c->links[k]->qp->track.count;
        pthread_mutex_unlock(&c->links[k]->lock);
    }
    return n;
}

static void conn_destroy(struct rdma_src_conn *c)
{
    /* Every grant goes: windows discarded (their QPs are failed), pins dropped. */
    pthread_mutex_lock(&c->lock);
    while (c->grants != NULL) {
        struct rdma_grant *g = c->grants;
        grant_unlink(c, g);
        pthread_mutex_unlock(&c->lock);
        grant_release(c, g, false);
        free(g);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    conn_free_links(c);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void rdma_src_reap(struct orb_rdma_tp *tp, bool force)
{
    pthread_mutex_lock(&tp->lock);
    struct rdma_src_conn *list = tp->reap_conns, *keep = NULL;
    tp->reap_conns = NULL;
    pthread_mutex_unlock(&tp->lock);
    while (list != NULL) {
        struct rdma_src_conn *c = list;
        list = c->reap_next;
        pthread_mutex_lock(&tp->lock);
        bool used = c->users > 0;
        pthread_mutex_unlock(&tp->lock);
        pthread_mutex_lock(&c->lock);
        bool binding = false;
        for (struct rdma_grant *g = c->grants; g != NULL; g = g->next)
            binding |= g->binds_left > 0;
        pthread_mutex_unlock(&c->lock);
        if (used || (!force && (binding || conn_outstanding(c) > 0))) {
            c->reap_next = keep;
            keep = c;
            continue;
        }
        conn_destroy(c);
    }
    if (keep != NULL) {
        pthread_mutex_lock(&tp->lock);
        struct rdma_src_conn *tail = keep;
        while (tail->reap_next != NULL)
            tail = tail->reap_next;
        tail->reap_next = tp->reap_conns;
        tp->reap_conns = keep;
        pthread_mutex_unlock(&tp->lock);
    }
}

#define SCAN_CONNS_MAX 16u /* connections failed per scan; the next scan takes the rest */

void rdma_src_scan(struct orb_rdma_tp *tp, uint64_t now)
{
    struct rdma_src_conn *held[SCAN_CONNS_MAX];
    uint32_t n = 0, count = 0;
    pthread_mutex_lock(&tp->lock);
    for (struct rdma_src_conn *c = tp->conns; c != NULL; c = c->next)
        count++;
    /* Up to SCAN_CONNS_MAX of them, starting where the last scan stopped. */
    uint32_t skip = count > SCAN_CONNS_MAX ? tp->src_scan_turn % count : 0;
    for (struct rdma_src_conn *c = tp->conns; n < SCAN_CONNS_MAX && n < count; c = c->next) {
        if (c == NULL)
            c = tp->conns; /* wrap */
        if (skip > 0) {
            skip--;
            continue;
        }
        c->users++; /* not reaped while looked at */
        held[n++] = c;
    }
    tp->src_scan_turn += n;
    pthread_mutex_unlock(&tp->lock);
    for (uint32_t i = 0; i < n; i++) {
        struct rdma_src_conn *c = held[i];
        uint64_t expired = 0, request = 0;
        pthread_mutex_lock(&c->lock);
        for (struct rdma_grant *g = c->grants; g != NULL && expired == 0; g = g->next)
            if (g->expires_ns != 0 && now >= g->expires_ns) {
                expired = g->id;
                request = g->request;
            }
        pthread_mutex_unlock(&c->lock);
        if (expired != 0) {
            ORB_LOGW("rdma: grant %llu (request %llu) of a requester's connection %llx did not end within "
                     "io_timeout_s and %llu s more: the connection is failed and let go",
                     (unsigned long long)expired, (unsigned long long)request, (unsigned long long)c->incarnation,
                     (unsigned long long)(RDMA_GRANT_GRACE_NS / ORB_NS_PER_SEC));
            conn_fail(c, ORB_ETIMEDOUT, "a grant's end did not come in time");
        }
        pthread_mutex_lock(&tp->lock);
        if (expired != 0)
            conn_mark_closing(tp, c); /* reaped once its flushes are in: its grants go then */
        c->users--;
        pthread_mutex_unlock(&tp->lock);
    }
}

void rdma_src_close_all(struct orb_rdma_tp *tp)
{
    pthread_mutex_lock(&tp->lock);
    while (tp->conns != NULL) {
        struct rdma_src_conn *c = tp->conns;
        pthread_mutex_unlock(&tp->lock);
        conn_fail(c, ORB_ECLOSED, "the transport stops");
        pthread_mutex_lock(&tp->lock);
        conn_mark_closing(tp, c);
    }
    pthread_mutex_unlock(&tp->lock);
}

static int src_connect(struct orb_rdma_tp *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len,
                       uint8_t *resp, size_t cap, size_t *resp_len)
{
    struct orb_rdma_connect in;
    int rc = orb_rdma_connect_decode(ORB_RDMA_CONNECT, req, len, &in);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&tp->lock);
    bool exists = find_conn(tp, sender, in.incarnation) != NULL;
    pthread_mutex_unlock(&tp->lock);
    if (exists)
        return orb_fail(ORB_EEXIST, "rdma: this requester's connection %llx exists already",
                        (unsigned long long)in.incarnation);
    struct rdma_src_conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for a connection");
    c->tp = tp;
    c->sender = *sender;
    c->incarnation = in.incarnation;
    pthread_mutex_init(&c->lock, NULL);
    (void)orb_cond_init_monotonic(&c->cond);
    struct orb_rdma_connect out;
    memset(&out, 0, sizeof out);
    out.incarnation = in.incarnation;
    /* The requester's rails: queue pair k of each lane goes to NIC (k mod n), so that hosts
     * cabled rail to rail pair NICs the same way on every lane. The width is the smaller lane
     * count, and narrower still where a budget cannot hold more lanes (at least one). */
    uint32_t rails = in.nqps / in.lanes;
    uint32_t lanes = in.lanes < tp->nlanes ? in.lanes : tp->nlanes;
    for (uint32_t k = 0; k < rails * lanes; k++) {
        struct rdma_ctx *x = tp->dctx[tp->rail_nic[(k % rails) % tp->nrails]];
        rc = rdma_link_new(tp, x, RDMA_ROLE_SOURCE, k, RDMA_ANY_LANE, c, &c->links[k]);
        if (rc == ORB_ERESOURCE && k >= rails) {
            ORB_LOGD("rdma: a requester's connection gets %u lane(s) of %u: %s", k / rails, in.lanes,
                     orb_last_error());
            lanes = k / rails;
            break;
        }
        if (rc != 0)
            goto free_conn;
        c->nqps = k + 1;
        out.qps[k].nic = (uint8_t)x->nic;
        out.qps[k].qp = c->links[k]->qp->local;
    }
    /* A lane cut short by the budget goes before anything is connected: a connected queue pair
     * would flush its receives, and a flushed receive fails the connection it belongs to. */
    rdma_links_drop(c->links, rails * lanes, c->nqps);
    c->nqps = rails * lanes;
    /* A queue pair the requester does not connect, or whose port is down here, or that fails
     * to connect, stays unconnected (in INIT: a queue pair moved to the error state would flush
     * its receives, which fails the connection): the answer says so, and grants never use it.
     * The connection needs one rail connected on every lane. */
    uint32_t dead_rails = 0;
    char dead_why[200] = "";
    for (uint32_t k = 0; k < c->nqps; k++) {
        uint32_t rail = (k % rails) % tp->nrails; /* this engine's rail of the queue pair */
        int st = 0;
        if (in.qps[k].unconnected)
            st = orb_fail(ORB_EUNAVAILABLE, "the requester's port of it is down");
        else if (atomic_load(&tp->routes_down) & (1u << rail))
            st = orb_fail(ORB_EUNAVAILABLE, "the port of rail %u is down here", rail);
        else
            st = rdma_link_connect(c->links[k], &in.qps[k].qp);
        if (st != 0) {
            snprintf(dead_why, sizeof dead_why, "%s", orb_last_error());
            c->unconnected |= 1u << k;
            out.qps[k].unconnected = true;
            dead_rails |= 1u << (k % rails);
        }
    }
    if (dead_rails == (1u << rails) - 1) {
        rc = orb_fail(ORB_EUNAVAILABLE, "rdma: no rail of a requester's connection could be connected (%s)", dead_why);
        goto free_conn;
    }
    if (dead_rails != 0)
        ORB_LOGI("rdma: a requester's connection leaves rails 0x%x unconnected: %s", dead_rails, dead_why);
    out.nqps = c->nqps;
    out.lanes = lanes;
    if ((rc = orb_rdma_connect_encode(ORB_RDMA_CONNECT_OK, &out, resp, cap, resp_len)) != 0)
        goto free_conn;
    pthread_mutex_lock(&tp->lock);
    c->next = tp->conns;
    tp->conns = c;
    atomic_fetch_add(&tp->source_connections, 1);
    pthread_mutex_unlock(&tp->lock);
    return 0;

free_conn:
    {
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        conn_destroy(c);
        return orb_fail(rc, "%s", why);
    }
}

static int src_disconnect(struct orb_rdma_tp *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len,
                          uint8_t *resp, size_t cap, size_t *resp_len)
{
    uint64_t incarnation;
    int rc = orb_rdma_disconnect_decode(req, len, &incarnation);
    if (rc != 0)
        return rc;
    struct rdma_src_conn *c = conn_get(tp, sender, incarnation);
    if (c == NULL)
        return orb_fail(ORB_ENOENT, "rdma: no connection %llx of this requester", (unsigned long long)incarnation);
    conn_fail(c, ORB_ECLOSED, "the requester disconnected");
    pthread_mutex_lock(&tp->lock);
    conn_mark_closing(tp, c);
    c->users--;
    bool lane = tp->lane_started;
    pthread_mutex_unlock(&tp->lock);
    if (!lane)
        rdma_src_reap(tp, true);
    return orb_rdma_disconnect_encode(incarnation, resp, cap, resp_len);
}

/* PING: the echo says this process is alive and serving its control connection, nothing more
 * (it touches no connection or grant). */
static int src_ping(const uint8_t *req, size_t len, uint8_t *resp, size_t cap, size_t *resp_len)
{
    uint64_t nonce;
    int rc = orb_rdma_ping_decode(req, len, &nonce);
    if (rc != 0)
        return rc;
    return orb_rdma_ping_encode(nonce, resp, cap, resp_len);
}

/* ---- grants ----------------------------------------------------------------------------------- */

/* The queue pairs of `mask` that are dead on connection c. */
static uint32_t dead_qps(const struct rdma_src_conn *c, uint32_t mask)
{
    uint32_t dead = 0;
    for (uint32_t k = 0; k < c->nqps; k++)
        if ((mask & (1u << k)) && atomic_load(&c->links[k]->down))
            dead |= 1u << k;
    return dead;
}

/* A staged grant's bytes in and out of the registration: memcpy where it has a CPU view, the
 * memory kind's own copy (device memory) where not. */
static int stage_in(const struct orb_reg *pin, uint64_t addr, void *stage, uint64_t len)
{
    void *cpu = pin->kind->cpu_view(pin, addr);
    if (cpu != NULL) {
        memcpy(stage, cpu, len);
        return 0;
    }
    if (pin->kind->to_host == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: %s memory cannot be staged", pin->kind->name);
    return pin->kind->to_host(pin, addr, stage, (size_t)len);
}

static int stage_out(const struct orb_reg *pin, uint64_t addr, const void *stage, uint64_t len)
{
    void *cpu = pin->kind->cpu_view(pin, addr);
    if (cpu != NULL) {
        memcpy(cpu, stage, len);
        return 0;
    }
    int rc = pin->kind->from_host != NULL ? pin->kind->from_host(pin, addr, stage, (size_t)len)
                                          : orb_fail(ORB_EUNAVAILABLE, "rdma: %s memory cannot be staged",
                                                     pin->kind->name);
    if (rc != 0)
        ORB_LOGW("rdma source: a WRITE's staged bytes could not be copied to %s memory: %s", pin->kind->name,
                 orb_last_error());
    return rc;
}

/* Prepare one request's grant: the registration pinned with the operation's permission, the
 * budgets reserved, a staging extent filled when this engine stages, and a window bind per rail
 * queued for the lane. On success *out is linked on the connection with its binds in flight;
 * grant_publish() answers it once they are done. ORB_EPEER with *lost (zero on entry) set: the
 * asked queue pairs that are dead here. */
static int grant_prepare(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_grant_ask *in,
                         struct rdma_grant **out, uint32_t *lost)
{
    int rc;
    if ((in->rail_mask >> c->nqps) != 0)
        return orb_fail(ORB_EPROTO, "rdma: queue pairs 0x%x asked for on a connection of %u", in->rail_mask, c->nqps);
    if (in->rail_mask & c->unconnected)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: queue pairs 0x%x asked for are not connected here",
                        in->rail_mask & c->unconnected);
    struct orb_reg *pin = NULL;
    rc = orb_registry_acquire(orb_engine_registry(tp->engine), in->addr, in->length,
                              in->op == ORB_OP_READ ? ORB_PERM_REMOTE_READ : ORB_PERM_REMOTE_WRITE, &pin);
    if (rc == 0 && (rc = orb_reg_ready(pin)) != 0) /* a producer's recorded GPU work ends first */
        orb_registry_release(pin);
    if (rc != 0)
        return rc;
    /* Direct: windows on the registration's own parent MRs. Staged: on an extent of the staging
     * arena, which holds a READ's bytes before the grant and a WRITE's until its end. */
    bool device = pin->kind->kind != ORB_MEM_HOST;
    bool staged = device ? tp->cfg->cuda_memory == ORB_RDMA_CUDA_STAGED : tp->host_staged;
    if (device && !staged) {
        /* A window is never bound on a device MR: a GPU source takes private grant connections,
         * which this release does not make. */
        orb_registry_release(pin);
        return orb_fail(ORB_EUNAVAILABLE, "rdma: device memory as a source under cuda_memory direct needs private "
                        "grant connections, which this release does not make");
    }
    const struct orb_rdma_reg_mrs *m = orb_rdma_tp_reg_mrs(pin);
    if (m == NULL && !staged) {
        orb_registry_release(pin);
        return orb_fail(ORB_EUNAVAILABLE, "rdma: the registration has no memory regions here");
    }
    /* Staged device bytes are this grant's while its copies run. */
    void *loan = NULL;
    if (staged && (rc = orb_reg_loan(pin, in->addr, in->length, in->op == ORB_OP_WRITE, &loan)) != 0) {
        orb_registry_release(pin);
        return rc;
    }
    struct rdma_grant *g = calloc(1, sizeof *g);
    if (g == NULL) {
        orb_reg_loan_end(pin, loan);
        orb_registry_release(pin);
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for a grant");
    }
    g->conn = c;
    g->pin = pin;
    g->loan = loan;
    g->request = in->request;
    g->op = in->op;
    g->addr = in->addr;
    g->length = in->length;
    g->rail_mask = in->rail_mask;
    g->generation = 1;
    if ((rc = orb_random_bytes(g->nonce, sizeof g->nonce)) != 0)
        goto release;

    /* Reserve: the grant budget and a receive on every rail. Both are spent only for a moment:
     * "not now" (ORB_EAGAIN) makes the requester ask again. */
    pthread_mutex_lock(&c->lock);
    if (c->failed != 0) {
        pthread_mutex_unlock(&c->lock);
        rc = orb_fail(ORB_EPEER, "rdma: the connection is failed");
        goto release;
    }
    /* A queue pair of the connection died here (its rail's path): named in the refusal, so
     * that the requester gives the request other rails. */
    if ((*lost = dead_qps(c, g->rail_mask)) != 0) {
        pthread_mutex_unlock(&c->lock);
        rc = orb_fail(ORB_EPEER, "rdma: queue pair(s) 0x%x of the connection are failed at the source", *lost);
        goto release;
    }
    if (atomic_fetch_add(&tp->active_grants, 1) >= tp->cfg->max_grants) {
        atomic_fetch_sub(&tp->active_grants, 1);
        pthread_mutex_unlock(&c->lock);
        rc = orb_fail(ORB_EAGAIN, "rdma: max_grants (%u) grants are active", tp->cfg->max_grants);
        goto release;
    }
    for (uint32_t k = 0; k < c->nqps; k++) {
        if ((g->rail_mask & (1u << k)) && c->ngrants[k] >= RDMA_RQ_DEPTH) {
            atomic_fetch_sub(&tp->active_grants, 1);
            pthread_mutex_unlock(&c->lock);
            rc = orb_fail(ORB_EAGAIN, "rdma: rail %u holds %u grants, as many as it has receives", k,
                          RDMA_RQ_DEPTH);
            goto release;
        }
    }
    for (uint32_t k = 0; k < c->nqps; k++)
        if (g->rail_mask & (1u << k))
            c->ngrants[k]++;
    g->published = true; /* charged; published to the requester only by grant_publish() */
    g->id = ++c->next_grant;
    g->next = c->grants;
    c->grants = g;
    pthread_mutex_unlock(&c->lock);

    g->target = in->addr;
    if (staged) {
        if ((rc = rdma_stage_take(tp, in->length, 0, &g->stage)) != 0)
            goto unlink;
        if (in->op == ORB_OP_READ && (rc = stage_in(pin, in->addr, g->stage.cpu, in->length)) != 0)
            goto unlink;
        g->target = (uint64_t)(uintptr_t)g->stage.cpu;
    }

    /* A window and its parent MR for every rail first: a rail that has none (the key history
     * full, say) fails the grant before any bind is queued, so the windows taken for the other
     * rails go back unbound, their keys unspent, instead of being discarded. */
    const struct orb_rdma_reg_mr *parents[ORB_RDMA_MAX_RAILS] = {0};
    for (uint32_t k = 0; k < c->nqps && rc == 0; k++) {
        if (!(g->rail_mask & (1u << k)))
            continue;
        struct rdma_link *l = c->links[k];
        parents[k] = staged ? rdma_stage_mr(tp, l->ctx->nic) : orb_rdma_reg_mrs_on(m, l->ctx->nic);
        if (parents[k] == NULL || parents[k]->parent == NULL) {
            rc = orb_fail(ORB_EUNAVAILABLE, "rdma: the registration has no window parent on NIC %u", l->ctx->nic);
            break;
        }
        pthread_mutex_lock(&l->ctx->wlock);
        rc = orb_rdma_window_take(&l->ctx->windows, &g->win[k]);
        pthread_mutex_unlock(&l->ctx->wlock);
    }
    if (rc != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++) {
            if (g->win[k] == NULL)
                continue;
            struct rdma_ctx *x = c->links[k]->ctx;
            pthread_mutex_lock(&x->wlock);
            orb_rdma_window_put(&x->windows, g->win[k]);
            pthread_mutex_unlock(&x->wlock);
            g->win[k] = NULL;
        }
        rc = orb_fail(rc, "%s", why);
        goto unlink;
    }

    /* Bind each rail's window on that rail's queue pair, exactly the range, one direction. */
    for (uint32_t k = 0; k < c->nqps; k++) {
        if (!(g->rail_mask & (1u << k)))
            continue;
        struct rdma_link *l = c->links[k];
        uint32_t key = 0;
        pthread_mutex_lock(&l->ctx->wlock);
        rc = orb_rdma_window_bind_wr(&l->ctx->windows, g->win[k], parents[k]->parent, g->target, in->length, in->op,
                                     0, &g->bind_wr[k], &key);
        pthread_mutex_unlock(&l->ctx->wlock);
        if (rc != 0)
            break;
        g->key[k] = key;
        g->bind_ctx[k] = (struct rdma_wr_ctx){.kind = RDMA_WR_BIND, .rail = (uint8_t)k, .owner = g};
        g->bind_wait[k] = (struct rdma_bind_wait){.grant = g, .rail = k};
        pthread_mutex_lock(&c->lock);
        g->binds_left++;
        pthread_mutex_unlock(&c->lock);
        rdma_link_queue_bind(l, &g->bind_wait[k]); /* the lane posts it */
    }
    if (rc != 0) {
        /* Binds already queued still come back; grant_publish() answers the failure. */
        pthread_mutex_lock(&c->lock);
        if (g->bind_status == 0) {
            g->bind_status = rc;
            snprintf(g->why, sizeof g->why, "%s", orb_last_error());
        }
        pthread_mutex_unlock(&c->lock);
    }
    *out = g;
    return 0;

unlink:
    pthread_mutex_lock(&c->lock);
    grant_unlink(c, g);
    pthread_mutex_unlock(&c->lock);
    grant_release(c, g, false);
    free(g);
    return rc;

release:
    orb_reg_loan_end(g->pin, g->loan);
    orb_registry_release(g->pin);
    free(g);
    return rc;
}

/* Give up on a prepared grant that is not published: freed now, or by the lane with its last
 * bind. */
static void grant_abandon(struct rdma_src_conn *c, struct rdma_grant *g)
{
    pthread_mutex_lock(&c->lock);
    g->abandoned = true;
    bool now = g->binds_left == 0;
    if (now)
        grant_unlink(c, g);
    pthread_mutex_unlock(&c->lock);
    if (now) {
        grant_release(c, g, false);
        free(g);
    }
}

/* Whether every grant of gs[0..n) has its binds back (conn lock held). */
static bool binds_done(struct rdma_grant *const *gs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (gs[i] != NULL && gs[i]->binds_left > 0)
            return false;
    return true;
}

/* Answer one prepared grant after its binds: the keys, or the failure (the grant undone). */
static void grant_publish(struct rdma_src_conn *c, struct rdma_grant *g, struct orb_rdma_grant *out)
{
    /* conn lock held on entry, released on return */
    if (g->bind_status != 0) {
        int status = g->bind_status;
        char why[sizeof g->why];
        snprintf(why, sizeof why, "%s", g->why[0] != '\0' ? g->why : "rdma: a window bind failed at the device");
        /* A bind that failed because its queue pair died: the refusal names the dead ones. */
        uint32_t lost = dead_qps(c, g->rail_mask);
        grant_unlink(c, g);
        pthread_mutex_unlock(&c->lock);
        grant_release(c, g, false);
        free(g);
        out->status = lost != 0 ? ORB_EPEER : status;
        out->lost_qps = lost;
        snprintf(out->why, sizeof out->why, "%s", why);
        return;
    }
    out->status = 0;
    g->expires_ns = orb_now_ns() + c->tp->io_timeout_ns + RDMA_GRANT_GRACE_NS;
    out->grant = g->id;
    out->generation = g->generation;
    memcpy(out->nonce, g->nonce, sizeof out->nonce);
    out->target = g->target;
    out->nkeys = 0;
    for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++)
        if (g->rail_mask & (1u << k))
            out->rkeys[out->nkeys++] = g->key[k];
    pthread_mutex_unlock(&c->lock);
}

static int src_grant(struct orb_rdma_tp *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len,
                     uint8_t *resp, size_t cap, size_t *resp_len)
{
    struct orb_rdma_grant_req in;
    int rc = orb_rdma_grant_req_decode(req, len, &in);
    if (rc != 0)
        return rc;
    struct rdma_src_conn *c = conn_get(tp, sender, in.incarnation);
    if (c == NULL)
        return orb_fail(ORB_ENOENT, "rdma: no connection %llx of this requester", (unsigned long long)in.incarnation);
    struct orb_rdma_grants *out = calloc(1, sizeof *out);
    if (out == NULL) {
        conn_put(tp, c);
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for a GRANT");
    }
    /* Every request's binds go out first; one wait covers them all. */
    struct rdma_grant *gs[ORB_RDMA_GRANT_BATCH] = {NULL};
    out->count = in.count;
    for (uint32_t i = 0; i < in.count; i++) {
        int e = grant_prepare(tp, c, &in.ask[i], &gs[i], &out->g[i].lost_qps);
        if (e == ORB_EPROTO) {
            /* A broken request is no refusal: the message is refused whole. */
            char why[256];
            snprintf(why, sizeof why, "%s", orb_last_error());
            rc = e;
            for (uint32_t j = 0; j < i; j++)
                if (gs[j] != NULL)
                    grant_abandon(c, gs[j]);
            free(out);
            conn_put(tp, c);
            return orb_fail(rc, "%s", why);
        }
        if (e != 0) {
            out->g[i].status = e;
            snprintf(out->g[i].why, sizeof out->g[i].why, "%s", orb_last_error());
        }
    }
    uint64_t deadline = orb_deadline_after(RDMA_BIND_WAIT_NS);
    pthread_mutex_lock(&c->lock);
    while (!binds_done(gs, in.count)) {
        struct timespec ts = orb_deadline_timespec(deadline);
        if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) == ETIMEDOUT && !binds_done(gs, in.count))
            break;
    }
    bool late = !binds_done(gs, in.count);
    pthread_mutex_unlock(&c->lock);
    for (uint32_t i = 0; i < in.count; i++) {
        struct rdma_grant *g = gs[i];
        if (g == NULL)
            continue;
        if (late) {
            /* Nothing of this message is published: the lane frees what is still binding. */
            grant_abandon(c, g);
            out->g[i].status = ORB_ETIMEDOUT;
            snprintf(out->g[i].why, sizeof out->g[i].why, "rdma: binding the grant's windows did not complete in time");
            continue;
        }
        pthread_mutex_lock(&c->lock);
        grant_publish(c, g, &out->g[i]); /* unlocks */
    }
    if (late)
        conn_fail(c, ORB_ETIMEDOUT, "a window bind did not complete in time");
    rc = orb_rdma_grants_encode(out, resp, cap, resp_len);
    free(out);
    conn_put(tp, c);
    return rc;
}

int rdma_source_control(void *tp_, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                        size_t cap, size_t *resp_len)
{
    struct orb_rdma_tp *tp = tp_;
    if (!tp->data)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: no NIC of the source carries requests");
    if (atomic_load(&tp->stopping))
        return orb_fail(ORB_ECLOSED, "rdma: the source's transport is stopped");
    uint8_t kind;
    int rc = orb_rdma_ctrl_kind(req, len, &kind);
    if (rc != 0)
        return rc;
    switch (kind) {
    case ORB_RDMA_CONNECT: return src_connect(tp, sender, req, len, resp, cap, resp_len);
    case ORB_RDMA_GRANT_REQ: return src_grant(tp, sender, req, len, resp, cap, resp_len);
    case ORB_RDMA_DISCONNECT: return src_disconnect(tp, sender, req, len, resp, cap, resp_len);
    case ORB_RDMA_PING: return src_ping(req, len, resp, cap, resp_len);
    default: return orb_fail(ORB_EPROTO, "rdma: control message of kind %u is not a request", kind);
    }
}

/* ---- completions ------------------------------------------------------------------------------- */

/* One of `g`'s binds ended: bound (status 0: the window of `rail` carries its key now) or not.
 * The waiting control handler is woken; an abandoned grant is freed with its last bind. */
static void bind_ended(struct rdma_grant *g, uint32_t rail, int status)
{
    struct rdma_src_conn *c = g->conn;
    pthread_mutex_lock(&c->lock);
    if (status == 0)
        orb_rdma_window_bound(g->win[rail], g->key[rail]);
    else if (g->bind_status == 0)
        g->bind_status = status;
    g->binds_left--;
    bool orphan = g->binds_left == 0 && g->abandoned;
    if (orphan)
        grant_unlink(c, g);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (orphan) {
        grant_release(c, g, false);
        free(g);
    }
}

void rdma_src_on_send(struct rdma_link *l, uint64_t cookie, const struct ibv_wc *wc)
{
    bool ok = wc == NULL || wc->status == IBV_WC_SUCCESS;
    if (cookie & RDMA_COOKIE_ACK) {
        /* Nothing waits for an ACK here; one that may not have arrived goes again, elsewhere. */
        if (!ok) {
            uint8_t msg[ORB_RDMA_ACK_LEN];
            memcpy(msg, l->buf + (size_t)(cookie >> 2) * RDMA_MSG_SLOT, sizeof msg);
            rdma_src_ack_lost(l, msg);
        }
        return;
    }
    struct rdma_wr_ctx *x = (struct rdma_wr_ctx *)(uintptr_t)(cookie & ~(uint64_t)RDMA_COOKIE_CTX);
    bind_ended(x->owner, x->rail, ok ? 0 : ORB_EPEER);
}

void rdma_src_ack_lost(struct rdma_link *l, const uint8_t msg[ORB_RDMA_ACK_LEN])
{
    /* The requester takes an ACK once and ignores the same one again: one that did arrive after
     * all costs nothing. */
    struct rdma_src_conn *c = l->owner;
    for (uint32_t i = 1; i < c->nqps; i++) {
        struct rdma_link *o = c->links[(l->rail + i) % c->nqps];
        if (o != NULL && rdma_link_queue_ack(o, msg) == 0) {
            ORB_LOGD("rdma: an ACK that queue pair %u did not deliver goes on queue pair %u", l->rail, o->rail);
            return;
        }
    }
    conn_fail(c, ORB_EPEER, "an ACK could not be delivered on any queue pair of the connection");
}

void rdma_src_bind_failed(struct rdma_grant *g, uint32_t rail, int status)
{
    bind_ended(g, rail, status);
}

void rdma_src_on_recv(struct rdma_link *l, const struct ibv_wc *wc, const uint8_t *msg)
{
    struct rdma_src_conn *c = l->owner;
    struct orb_rdma_tp *tp = l->tp;
    if (msg == NULL) {
        /* The rail's queue pair is dead (a flush, or its path failed: the link is failed). Only
         * that rail is lost: the grants that hold it stay until the connection ends (the
         * requester rebuilds it, or they expire) and the other rails go on serving. A message
         * longer than a receive slot is the requester's breach: the connection ends. */
        if (wc->status == IBV_WC_LOC_LEN_ERR)
            conn_fail(c, ORB_EPROTO, "a message longer than a receive slot came in");
        return;
    }
    struct orb_rdma_binding b;
    if (orb_rdma_binding_decode(msg, wc->byte_len, &b) != 0) {
        conn_fail(c, ORB_EPROTO, orb_last_error());
        return;
    }
    char why[160] = "";
    pthread_mutex_lock(&c->lock);
    struct rdma_grant *g = c->grants;
    while (g != NULL && g->id != b.grant)
        g = g->next;
    uint32_t bit = 1u << l->rail;
    if (g == NULL || g->binds_left > 0 || g->abandoned)
        snprintf(why, sizeof why, "a completion for grant %llu, which is not active", (unsigned long long)b.grant);
    else if (b.rail != l->rail || !(g->rail_mask & bit) || (g->done_mask & bit))
        snprintf(why, sizeof why, "grant %llu: a completion for rail %u, which it does not hold", (unsigned long long)b.grant,
                 b.rail);
    else if (b.generation != g->generation || memcmp(b.nonce, g->nonce, sizeof g->nonce) != 0 ||
             b.request != g->request || b.addr != g->addr || b.length != g->length || b.op != g->op ||
             b.rkey != g->key[l->rail] || b.incarnation != c->incarnation ||
             memcmp(b.requester.bytes, c->sender.bytes, 16) != 0 ||
             memcmp(b.source.bytes, orb_engine_epoch(tp->engine)->bytes, 16) != 0)
        snprintf(why, sizeof why, "grant %llu: the completion's binding is not the grant's", (unsigned long long)b.grant);
    else if (!orb_rdma_wc_invalidates(wc, g->key[l->rail]))
        snprintf(why, sizeof why, "grant %llu: the completion did not invalidate the rail's key",
                 (unsigned long long)b.grant);
    if (why[0] != '\0') {
        pthread_mutex_unlock(&c->lock);
        conn_fail(c, ORB_EPROTO, why);
        return;
    }
    /* The window is dead now: it goes back to its pool. */
    struct rdma_ctx *x = l->ctx;
    pthread_mutex_lock(&x->wlock);
    orb_rdma_window_put(&x->windows, g->win[l->rail]);
    pthread_mutex_unlock(&x->wlock);
    g->win[l->rail] = NULL;
    g->done_mask |= bit;
    bool done = g->done_mask == g->rail_mask;
    if (done)
        grant_unlink(c, g);
    pthread_mutex_unlock(&c->lock);
    if (!done)
        return;
    int status = 0;
    if (g->stage.cpu != NULL && g->op == ORB_OP_WRITE) /* the pin still holds the range */
        status = stage_out(g->pin, g->addr, g->stage.cpu, g->length);
    uint64_t request = g->request, id = g->id;
    grant_release(c, g, true);
    free(g);
    atomic_fetch_add(&tp->grants_served, 1);
    uint8_t ack[ORB_RDMA_ACK_LEN];
    struct orb_rdma_ack a = {.request = request, .grant = id, .status = status};
    orb_rdma_ack_encode(&a, ack);
    if (rdma_link_post_ack(l, ack) != 0) /* the rail died since the binding came */
        rdma_src_ack_lost(l, ack);
}
