/* The RDMA transport's source side: connections, grants, the end of a grant and its ACK (see
 * rdma_data.h). */
#include "rdma/rdma_data.h"
#include "rdma/turns.h"

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
#include "cuda/cuda_memory.h"
#include "rdma/devx_key.h"
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

/* Destroy a grant's DevX keys (revoking those not invalidated yet). One the device refuses to
 * destroy may still be in force: the grant's pin is then kept for good. Returns 0, or
 * ORB_EUNQUIESCED when any was refused. */
static int grant_destroy_keys(struct rdma_src_conn *c, struct rdma_grant *g)
{
    int rc = 0;
    for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++) {
        if (!(g->devx_mask & (1u << k)))
            continue;
        g->devx_mask &= ~(1u << k);
        struct orb_devx_key_site site;
        struct orb_devx_key key = {.handle = g->devx_handle[k], .key = g->key[k]};
        if (rdma_reuse_site(c->tp, c->links[k]->ctx->nic, &site) == 0 && orb_devx_key_destroy(&site, &key) == 0)
            continue;
        ORB_LOGW("rdma: grant %llu: DevX key 0x%08x could not be destroyed (%s); the memory it reaches is kept",
                 (unsigned long long)g->id, g->key[k], orb_last_error());
        atomic_fetch_add(&c->tp->kept_keys, 1);
        g->keep_pin = true;
        rc = ORB_EUNQUIESCED;
    }
    return rc;
}

/* Hand a grant's own queue pairs to lane 0 (they may be in the middle of a completion now). */
static void retire_own_links(struct rdma_src_conn *c, struct rdma_grant *g)
{
    uint32_t n = 0;
    pthread_mutex_lock(&c->lock);
    for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++) {
        struct rdma_link *l = g->own[k];
        if (l == NULL)
            continue;
        g->own[k] = NULL;
        l->reap_next = c->own_retired;
        c->own_retired = l;
        n++;
    }
    pthread_mutex_unlock(&c->lock);
    if (n > 0) {
        atomic_fetch_add(&c->tp->own_retired, n);
        rdma_lane0_kick(c->tp);
    }
}

/* Lane 0 or the connection's destruction: free c's retired own queue pairs (each waits out a
 * lane handling one of its completions). */
static void free_own_retired(struct rdma_src_conn *c)
{
    pthread_mutex_lock(&c->lock);
    struct rdma_link *list = c->own_retired;
    c->own_retired = NULL;
    pthread_mutex_unlock(&c->lock);
    while (list != NULL) {
        struct rdma_link *l = list;
        list = l->reap_next;
        rdma_link_fail(l, ORB_ECLOSED);
        (void)rdma_link_free(l); /* what the device keeps is counted there */
        atomic_fetch_sub(&c->tp->own_retired, 1);
    }
}

/* Undo a grant's windows, keys and pin. Windows whose binding may still be in force are
 * discarded (freed: that revokes them), invalidated ones go back to their pool; DevX keys are
 * destroyed. */
static void grant_release(struct rdma_src_conn *c, struct rdma_grant *g, bool invalidated_only_put)
{
    (void)grant_destroy_keys(c, g);
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
    retire_own_links(c, g);
    if (g->pin != NULL && g->keep_pin) {
        /* A key over the range may be in force: the pin (and with it the bytes, and unregister's
         * wait for them) is never given back. */
        g->pin = NULL;
        g->loan = NULL;
    } else if (g->pin != NULL) {
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
        for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS && !g->own_links; k++)
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

/* Let go of pin `k` of c (conn lock held). */
static void pin_drop_locked(struct rdma_src_conn *c, uint32_t k)
{
    orb_registry_release(c->pins[k].reg);
    c->pins[k].reg = NULL;
    c->pins[k].expires_ns = 0;
}

static void conn_destroy(struct rdma_src_conn *c)
{
    /* Its private grants go first (their queue pairs, regions and domains), without an ACK. */
    rdma_pgrant_reap(c->tp, c, true);
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
    for (uint32_t k = 0; k < ORB_RDMA_MAX_PINS; k++)
        if (c->pins[k].reg != NULL)
            pin_drop_locked(c, k);
    pthread_mutex_unlock(&c->lock);
    free_own_retired(c); /* before c goes: they name it as their owner */
    conn_free_links(c);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* Lane 0: the private grants that ended are torn down and acknowledged; window grants' own
 * queue pairs that ended are freed. */
static void reap_private(struct orb_rdma_tp *tp)
{
    if (atomic_load(&tp->pgrants_ending) == 0 && atomic_load(&tp->own_retired) == 0)
        return;
    /* Every connection, held (users) while it is looked at without tp->lock; short of memory
     * for a list of them all, a stack's worth at a time, the whole list in turns. */
    struct rdma_src_conn *stack[64], **held = stack;
    uint32_t cap = 64, n = 0, total = 0;
    pthread_mutex_lock(&tp->lock);
    for (const struct rdma_src_conn *c = tp->conns; c != NULL; c = c->next)
        total++;
    if (total > cap) {
        struct rdma_src_conn **all = malloc((size_t)total * sizeof *all);
        if (all != NULL) {
            held = all;
            cap = total;
        }
    }
    uint32_t skip = orb_turn_skip(tp->reap_from, total, cap);
    for (struct rdma_src_conn *c = tp->conns; c != NULL && n < cap; c = c->next) {
        if (skip > 0) {
            skip--;
            continue;
        }
        c->users++;
        held[n++] = c;
    }
    tp->reap_from = orb_turn_next(tp->reap_from, n, total);
    pthread_mutex_unlock(&tp->lock);
    for (uint32_t i = 0; i < n; i++) {
        rdma_pgrant_reap(tp, held[i], false);
        free_own_retired(held[i]);
        conn_put(tp, held[i]);
    }
    if (held != stack)
        free(held);
}

void rdma_src_reap(struct orb_rdma_tp *tp, bool force)
{
    reap_private(tp);
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
        /* A pin no grant used for io_timeout_s and the grace: its requester stopped asking. The
         * grants under it hold the registration themselves. */
        for (uint32_t k = 0; k < ORB_RDMA_MAX_PINS; k++)
            if (c->pins[k].reg != NULL && now >= c->pins[k].expires_ns) {
                ORB_LOGW("rdma: the pin of request %llu of a requester's connection %llx saw no grant within "
                         "io_timeout_s and %llu s more: let go", (unsigned long long)c->pins[k].request,
                         (unsigned long long)c->incarnation, (unsigned long long)(RDMA_GRANT_GRACE_NS / ORB_NS_PER_SEC));
                pin_drop_locked(c, k);
            }
        pthread_mutex_unlock(&c->lock);
        rdma_pgrant_scan(tp, c, now);
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

/* Whether memory of `pin` is staged here (the slot, as a shift) or not (0). */
static uint32_t staged_slot_shift(const struct orb_rdma_tp *tp, const struct orb_reg *pin)
{
    bool device = pin->kind->kind != ORB_MEM_HOST;
    bool staged = device ? tp->cfg->cuda_memory == ORB_RDMA_CUDA_STAGED : tp->host_staged;
    return staged ? rdma_stage_slot_shift(tp, pin) : 0;
}

/* PIN: hold a whole request's range for its slots, after the same authority checks a grant
 * makes; refusals travel in PINNED. A connection holds at most ORB_RDMA_MAX_PINS at once
 * (ORB_EAGAIN beyond: the requester goes on without one). */
static int src_pin(struct orb_rdma_tp *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len,
                   uint8_t *resp, size_t cap, size_t *resp_len)
{
    struct orb_rdma_pin_req in;
    int rc = orb_rdma_pin_decode(req, len, &in);
    if (rc != 0)
        return rc;
    struct rdma_src_conn *c = conn_get(tp, sender, in.incarnation);
    if (c == NULL)
        return orb_fail(ORB_ENOENT, "rdma: no connection %llx of this requester", (unsigned long long)in.incarnation);
    struct orb_rdma_pinned out;
    memset(&out, 0, sizeof out);
    struct orb_reg *reg = NULL;
    rc = orb_registry_acquire(orb_engine_registry(tp->engine), in.addr, in.length,
                              in.op == ORB_OP_READ ? ORB_PERM_REMOTE_READ : ORB_PERM_REMOTE_WRITE, &reg);
    if (rc == 0) {
        pthread_mutex_lock(&c->lock);
        uint32_t k = 0;
        while (k < ORB_RDMA_MAX_PINS && c->pins[k].reg != NULL)
            k++;
        if (c->failed != 0) {
            rc = orb_fail(ORB_EPEER, "rdma: the connection is failed");
        } else if (k == ORB_RDMA_MAX_PINS) {
            rc = orb_fail(ORB_EAGAIN, "rdma: the connection holds %u pins already", ORB_RDMA_MAX_PINS);
        } else {
            struct rdma_src_pin *p = &c->pins[k];
            p->generation = (uint16_t)(p->generation == 0xffffu ? 1 : p->generation + 1);
            p->reg = reg;
            p->op = in.op;
            p->request = in.request;
            p->addr = in.addr;
            p->length = in.length;
            p->expires_ns = orb_now_ns() + tp->io_timeout_ns + RDMA_GRANT_GRACE_NS;
            out.pin = k + 1;
            out.generation = p->generation;
            out.slot_shift = staged_slot_shift(tp, reg);
            reg = NULL; /* the pin's now */
        }
        pthread_mutex_unlock(&c->lock);
        orb_registry_release(reg);
    }
    if (rc != 0) {
        out.status = rc;
        snprintf(out.why, sizeof out.why, "%s", orb_last_error());
    }
    conn_put(tp, c);
    return orb_rdma_pinned_encode(&out, resp, cap, resp_len);
}

/* UNPIN: let go of a pin of this connection; ORB_ENOENT in UNPINNED when it is not held (it
 * expired, or never was). */
static int src_unpin(struct orb_rdma_tp *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len,
                     uint8_t *resp, size_t cap, size_t *resp_len)
{
    struct orb_rdma_unpin in;
    int rc = orb_rdma_unpin_decode(req, len, &in);
    if (rc != 0)
        return rc;
    struct rdma_src_conn *c = conn_get(tp, sender, in.incarnation);
    if (c == NULL)
        return orb_fail(ORB_ENOENT, "rdma: no connection %llx of this requester", (unsigned long long)in.incarnation);
    int32_t status = 0;
    pthread_mutex_lock(&c->lock);
    struct rdma_src_pin *p = &c->pins[in.pin - 1];
    if (p->reg != NULL && p->generation == in.generation)
        pin_drop_locked(c, in.pin - 1);
    else
        status = ORB_ENOENT;
    pthread_mutex_unlock(&c->lock);
    conn_put(tp, c);
    return orb_rdma_unpinned_encode(status, resp, cap, resp_len);
}

/* The registration of `in`'s pin, pinned once more for its grant: the pin must be held by c
 * for the same operation and contain the grant's range (conn lock taken). Its use keeps it. */
static int pinned_reg(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_grant_ask *in,
                      struct orb_reg **out)
{
    pthread_mutex_lock(&c->lock);
    struct rdma_src_pin *p = &c->pins[in->pin - 1];
    bool ok = p->reg != NULL && p->generation == in->pin_generation && p->op == in->op && in->addr >= p->addr &&
              in->addr - p->addr <= p->length && in->length <= p->length - (in->addr - p->addr);
    if (ok) {
        orb_registry_retain(p->reg);
        *out = p->reg;
        p->expires_ns = orb_now_ns() + tp->io_timeout_ns + RDMA_GRANT_GRACE_NS;
    }
    pthread_mutex_unlock(&c->lock);
    return ok ? 0 : orb_fail(ORB_ENOENT, "rdma: the grant's pin %u is not held for it (it expired, or names "
                             "another range or operation)", in->pin);
}

int rdma_src_admit(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_grant_ask *in,
                   struct orb_reg **out)
{
    if ((in->rail_mask >> c->nqps) != 0)
        return orb_fail(ORB_EPROTO, "rdma: queue pairs 0x%x asked for on a connection of %u", in->rail_mask, c->nqps);
    if (in->rail_mask & c->unconnected)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: queue pairs 0x%x asked for are not connected here",
                        in->rail_mask & c->unconnected);
    struct orb_reg *pin = NULL;
    int rc;
    if (in->pin != 0) /* a slot of a pinned request: its registration, admitted at PIN */
        rc = pinned_reg(tp, c, in, &pin);
    else
        rc = orb_registry_acquire(orb_engine_registry(tp->engine), in->addr, in->length,
                                  in->op == ORB_OP_READ ? ORB_PERM_REMOTE_READ : ORB_PERM_REMOTE_WRITE, &pin);
    if (rc == 0 && (rc = orb_reg_ready(pin)) != 0) /* a producer's recorded GPU work ends first */
        orb_registry_release(pin);
    if (rc != 0)
        return rc;
    *out = pin;
    return 0;
}

int rdma_src_gdr_visible(const struct orb_reg *pin, uint8_t op, uint64_t grant)
{
    const struct orb_rdma_reg_mrs *m = orb_rdma_tp_reg_mrs(pin);
    if (op != ORB_OP_WRITE || m == NULL || !m->gdr_flush || orb_cuda_memory_gdr_flush(pin->owner) == 0)
        return 0;
    ORB_LOGW("rdma: grant %llu: %s", (unsigned long long)grant, orb_last_error());
    return ORB_EUNAVAILABLE;
}

bool rdma_src_binding_matches(const struct orb_rdma_binding *b, const struct rdma_src_conn *c, uint64_t generation,
                              const uint8_t nonce[ORB_RDMA_NONCE_LEN], uint64_t request, uint64_t addr,
                              uint64_t length, uint8_t op, uint32_t rkey)
{
    return b->generation == generation && memcmp(b->nonce, nonce, ORB_RDMA_NONCE_LEN) == 0 &&
           b->request == request && b->addr == addr && b->length == length && b->op == op && b->rkey == rkey &&
           b->incarnation == c->incarnation && memcmp(b->requester.bytes, c->sender.bytes, 16) == 0 &&
           memcmp(b->source.bytes, orb_engine_epoch(c->tp->engine)->bytes, 16) == 0;
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
static int stage_in(const struct orb_reg *pin, uint64_t addr, void *stage, uint64_t len, bool *held)
{
    void *cpu = pin->kind->cpu_view(pin, addr);
    if (cpu != NULL) {
        memcpy(stage, cpu, len);
        return 0;
    }
    if (pin->kind->to_host == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: %s memory cannot be staged", pin->kind->name);
    return pin->kind->to_host(pin, addr, stage, (size_t)len, held);
}

static int stage_out(const struct orb_reg *pin, uint64_t addr, const void *stage, uint64_t len, bool *held)
{
    void *cpu = pin->kind->cpu_view(pin, addr);
    if (cpu != NULL) {
        memcpy(cpu, stage, len);
        return 0;
    }
    int rc = pin->kind->from_host != NULL ? pin->kind->from_host(pin, addr, stage, (size_t)len, held)
                                          : orb_fail(ORB_EUNAVAILABLE, "rdma: %s memory cannot be staged",
                                                     pin->kind->name);
    if (rc != 0)
        ORB_LOGW("rdma source: a WRITE's staged bytes could not be copied to %s memory: %s", pin->kind->name,
                 orb_last_error());
    return rc;
}

/* gpu_source_reuse: whether DevX keys can serve this grant of Direct device memory: every rail
 * it asks for is on a NIC that passed the registration's probe, and one key can span it. */
static bool reuse_serves(const struct orb_rdma_tp *tp, const struct rdma_src_conn *c, const struct orb_rdma_reg_mrs *m,
                         const struct orb_rdma_grant_ask *in)
{
    if (!tp->cfg->gpu_source_reuse || m == NULL || m->reuse_mask == 0 || in->length > ORB_DEVX_KEY_LEN_MAX)
        return false;
    for (uint32_t k = 0; k < c->nqps; k++) {
        if (!(in->rail_mask & (1u << k)))
            continue;
        const struct rdma_link *l = c->links[k];
        if (l == NULL || !(m->reuse_mask & (UINT64_C(1) << l->ctx->nic)))
            return false;
    }
    return true;
}

/* A DevX key per rail of `g`, bound to that rail's queue pair of the connection, exactly the
 * range, the op's right only, checked by the helper; no bind to wait for. */
static int reuse_keys(struct orb_rdma_tp *tp, struct rdma_src_conn *c, struct rdma_grant *g,
                      const struct orb_rdma_reg_mrs *m)
{
    for (uint32_t k = 0; k < c->nqps; k++) {
        if (!(g->rail_mask & (1u << k)))
            continue;
        struct rdma_link *l = c->links[k];
        const struct orb_rdma_reg_mr *mr = orb_rdma_reg_mrs_on(m, l->ctx->nic);
        struct orb_devx_key_site site;
        struct orb_devx_key key;
        int rc = mr == NULL || mr->local == NULL
                     ? orb_fail(ORB_EUNAVAILABLE, "rdma: the registration has no memory region on NIC %u", l->ctx->nic)
                     : rdma_reuse_site(tp, l->ctx->nic, &site);
        if (rc == 0) {
            pthread_mutex_lock(&l->ctx->wlock);
            rc = orb_devx_key_make(&site, l->qp->qp->qp_num, mr->local->lkey, g->addr, g->length, g->op, &key);
            pthread_mutex_unlock(&l->ctx->wlock);
        }
        if (rc == ORB_EUNQUIESCED) {
            atomic_fetch_add(&tp->kept_keys, 1);
            g->keep_pin = true;
        }
        if (rc != 0) {
            /* A refusal's ORB_EPEER or ORB_EAGAIN would mean the connection is lost, or to ask
             * again: a key that could not be made is neither. */
            return rc == ORB_EPEER || rc == ORB_EAGAIN ? orb_fail_wrap(ORB_EUNAVAILABLE, "rdma: a DevX grant key") : rc;
        }
        g->key[k] = key.key;
        g->devx_handle[k] = key.handle;
        g->devx_mask |= 1u << k;
    }
    return 0;
}

/* Prepare one request's grant: the registration pinned with the operation's permission, the
 * budgets reserved, a staging extent filled when this engine stages, and a window bind per rail
 * queued for the lane. On success *out is linked on the connection with its binds in flight;
 * grant_publish() answers it once they are done. ORB_EPEER with *lost (zero on entry) set: the
 * asked queue pairs that are dead here. ORB_ERESOURCE with *slot_shift (zero on entry) set: the
 * range is staged here in slots of 2^*slot_shift bytes, fewer than were asked for. */
static int grant_prepare(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_grant_ask *in,
                         const struct orb_rdma_qp_addr *own_qps, struct rdma_grant **out, uint32_t *lost,
                         uint32_t *slot_shift, bool *private_only)
{
    struct orb_reg *pin = NULL;
    int rc = rdma_src_admit(tp, c, in, &pin);
    if (rc != 0)
        return rc;
    /* Direct: windows on the registration's own parent MRs. Staged: on an extent of the staging
     * arena, which holds a READ's bytes before the grant and a WRITE's until its end. */
    bool device = pin->kind->kind != ORB_MEM_HOST;
    bool staged = device ? tp->cfg->cuda_memory == ORB_RDMA_CUDA_STAGED : tp->host_staged;
    bool reuse = device && !staged && own_qps == NULL && reuse_serves(tp, c, orb_rdma_tp_reg_mrs(pin), in);
    if (device && !staged && !reuse) {
        /* A window is never bound on a device MR: the requester asks again for a private grant
         * (rdma_private.c). */
        orb_registry_release(pin);
        *private_only = true;
        return orb_fail(ORB_EUNAVAILABLE, "rdma: device memory under cuda_memory direct is granted only on private "
                        "queue pairs");
    }
    /* Staged memory moves a slot per grant: a longer request is told the slot and comes back
     * slot by slot (remote staging), so no request waits for more staging than a slot. */
    uint32_t shift = staged ? rdma_stage_slot_shift(tp, pin) : 0;
    if (staged && in->length > (1ull << shift)) {
        orb_registry_release(pin);
        *slot_shift = shift;
        return orb_fail(ORB_ERESOURCE, "rdma: the range is staged here in slots of %llu bytes; %llu were asked for "
                        "in one grant", 1ull << shift, (unsigned long long)in->length);
    }
    if (staged && own_qps == NULL) {
        /* Staged here: on connections of this grant's own (PGRANT_REQ), never the shared ones. */
        orb_registry_release(pin);
        *private_only = true;
        return orb_fail(ORB_EUNAVAILABLE, "rdma: the range is staged at the source, which grants it only on queue "
                        "pairs of the grant's own");
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
    /* A grant on queue pairs of its own receives its end there: no receive of the connection's. */
    g->own_links = own_qps != NULL;
    for (uint32_t k = 0; k < c->nqps && !g->own_links; k++) {
        if ((g->rail_mask & (1u << k)) && c->ngrants[k] >= RDMA_RQ_DEPTH) {
            atomic_fetch_sub(&tp->active_grants, 1);
            pthread_mutex_unlock(&c->lock);
            rc = orb_fail(ORB_EAGAIN, "rdma: rail %u holds %u grants, as many as it has receives", k,
                          RDMA_RQ_DEPTH);
            goto release;
        }
    }
    for (uint32_t k = 0; k < c->nqps && !g->own_links; k++)
        if (g->rail_mask & (1u << k))
            c->ngrants[k]++;
    g->published = true; /* charged; published to the requester only by grant_publish() */
    g->id = ++c->next_grant;
    g->next = c->grants;
    c->grants = g;
    pthread_mutex_unlock(&c->lock);

    /* Its own queue pairs: per rail one on the NIC, domain and lane of the connection's, connected
     * to the requester's made for this grant (own_qps, in rail order). */
    for (uint32_t k = 0, i = 0; k < c->nqps && g->own_links && rc == 0; k++) {
        if (!(g->rail_mask & (1u << k)))
            continue;
        struct rdma_link *cl = c->links[k];
        rc = rdma_link_new_on(tp, cl->ctx, cl->ctx->pd, RDMA_LINK_ONE_GRANT, RDMA_ROLE_SOURCE, k, cl->lane, c, &g->own[k]);
        if (rc == ORB_ERESOURCE) /* max_endpoints or the CQs, for now: other grants' go as they end */
            rc = orb_fail_wrap(ORB_EAGAIN, "rdma: a grant's own queue pair");
        if (rc == 0)
            rc = rdma_link_connect(g->own[k], &own_qps[i++]);
    }
    if (rc != 0)
        goto unlink;

    g->target = in->addr;
    if (staged) {
        if ((rc = rdma_stage_take(tp, pin, in->length, 0, true, &g->stage)) != 0)
            goto unlink;
        if (in->op == ORB_OP_READ && (rc = stage_in(pin, in->addr, g->stage.cpu, in->length, &g->stage.held)) != 0) {
            /* A refusal's ORB_EPEER or ORB_EAGAIN would tell the requester that the connection
             * is lost, or to ask again: a copy that failed here is neither. */
            if (rc == ORB_EPEER || rc == ORB_EAGAIN)
                rc = orb_fail_wrap(ORB_EUNAVAILABLE, "rdma: staging the range at the source");
            goto unlink;
        }
        g->target = (uint64_t)(uintptr_t)g->stage.cpu;
    }

    if (reuse) {
        rc = reuse_keys(tp, c, g, m);
        if (rc != 0 && rc != ORB_EUNQUIESCED && rc != ORB_ENOMEM) {
            /* The NIC passed the probe but this key failed (the history full, say): the request
             * is served privately instead, as where reuse is off. */
            ORB_LOGW("rdma: a DevX key for grant %llu failed (%s); it is granted privately",
                     (unsigned long long)g->id, orb_last_error());
            *private_only = true;
            rc = orb_fail(ORB_EUNAVAILABLE, "rdma: no DevX key for this range now; granted on private queue pairs");
        }
        if (rc != 0)
            goto unlink;
        *out = g;
        return 0;
    }

    /* A window and its parent MR for every rail first: a rail that has none (the key history
     * full, say) fails the grant before any bind is queued, so the windows taken for the other
     * rails go back unbound, their keys unspent, instead of being discarded. */
    const struct orb_rdma_reg_mr *parents[ORB_RDMA_MAX_RAILS] = {0};
    for (uint32_t k = 0; k < c->nqps && rc == 0; k++) {
        if (!(g->rail_mask & (1u << k)))
            continue;
        struct rdma_link *l = c->links[k];
        parents[k] = staged ? rdma_stage_mr(tp, &g->stage, l->ctx->nic) : orb_rdma_reg_mrs_on(m, l->ctx->nic);
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
        struct rdma_link *l = g->own_links ? g->own[k] : c->links[k];
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

/* Wait up to RDMA_BIND_WAIT_NS for every grant of gs[0..n) to have its binds back; whether they
 * all did (conn lock not held). The lane wakes this call once, with the last bind of all, not
 * once per bind. */
static bool wait_binds(struct rdma_src_conn *c, struct rdma_grant *const *gs, uint32_t n)
{
    uint64_t deadline = orb_deadline_after(RDMA_BIND_WAIT_NS);
    struct rdma_bind_batch batch = {0};
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < n; i++) {
        if (gs[i] != NULL && gs[i]->binds_left > 0) {
            gs[i]->batch = &batch;
            batch.left++;
        }
    }
    while (batch.left > 0) {
        struct timespec ts = orb_deadline_timespec(deadline);
        if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) == ETIMEDOUT)
            break;
    }
    bool done = batch.left == 0;
    for (uint32_t i = 0; i < n; i++) /* `batch` ends with this call */
        if (gs[i] != NULL)
            gs[i]->batch = NULL;
    pthread_mutex_unlock(&c->lock);
    return done;
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
        int e = grant_prepare(tp, c, &in.ask[i], NULL, &gs[i], &out->g[i].lost_qps, &out->g[i].slot_shift,
                              &out->g[i].private_only);
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
    bool late = !wait_binds(c, gs, in.count);
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

int rdma_src_window_pgrant(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_pgrant_req *in,
                           struct orb_rdma_pgrant *out)
{
    struct orb_rdma_grant_ask a = orb_rdma_pgrant_ask(in);
    struct rdma_grant *g = NULL;
    uint32_t lost = 0, shift = 0;
    bool private_only = false;
    int rc = grant_prepare(tp, c, &a, in->qps, &g, &lost, &shift, &private_only);
    if (rc != 0) {
        out->slot_shift = rc == ORB_ERESOURCE ? shift : 0;
        return rc;
    }
    /* Its queue pairs' addresses, fixed now (the requester cannot end it before it has them). */
    struct orb_rdma_qp_addr qps[ORB_RDMA_MAX_RAILS];
    uint32_t n = 0;
    for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++)
        if (g->rail_mask & (1u << k))
            qps[n++] = g->own[k]->qp->local;
    bool late = !wait_binds(c, &g, 1);
    if (late) {
        /* Its own queue pairs go with it; the connection's are not involved. */
        grant_abandon(c, g);
        return orb_fail(ORB_ETIMEDOUT, "rdma: binding the grant's windows did not complete in time");
    }
    struct orb_rdma_grant pub;
    memset(&pub, 0, sizeof pub);
    pthread_mutex_lock(&c->lock);
    grant_publish(c, g, &pub); /* unlocks; frees g on a failed bind */
    if (pub.status != 0)
        return orb_fail(pub.status, "%s", pub.why);
    out->status = 0;
    out->keys = ORB_RDMA_PGRANT_WINDOWS;
    out->grant = pub.grant;
    out->generation = pub.generation;
    memcpy(out->nonce, pub.nonce, sizeof out->nonce);
    out->target = pub.target;
    out->nqps = n;
    memcpy(out->rkeys, pub.rkeys, sizeof out->rkeys);
    memcpy(out->qps, qps, sizeof out->qps);
    return 0;
}

/* PGRANT_REQ: a private grant (rdma_private.c); a refusal is answered in PGRANT with its cause. */
static int src_pgrant(struct orb_rdma_tp *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len,
                      uint8_t *resp, size_t cap, size_t *resp_len)
{
    struct orb_rdma_pgrant_req in;
    int rc = orb_rdma_pgrant_req_decode(req, len, &in);
    if (rc != 0)
        return rc;
    struct rdma_src_conn *c = conn_get(tp, sender, in.incarnation);
    if (c == NULL)
        return orb_fail(ORB_ENOENT, "rdma: no connection %llx of this requester", (unsigned long long)in.incarnation);
    struct orb_rdma_pgrant *out = calloc(1, sizeof *out);
    if (out == NULL) {
        conn_put(tp, c);
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for a PGRANT");
    }
    int e = rdma_pgrant_serve(tp, c, &in, out);
    conn_put(tp, c);
    if (e == ORB_EPROTO) {
        free(out);
        return e;
    }
    if (e != 0) {
        uint32_t shift = e == ORB_ERESOURCE ? out->slot_shift : 0; /* a staging source's slot */
        memset(out, 0, sizeof *out);
        out->status = e;
        out->slot_shift = shift;
        snprintf(out->why, sizeof out->why, "%s", orb_last_error());
    }
    rc = orb_rdma_pgrant_encode(out, resp, cap, resp_len);
    free(out);
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
    case ORB_RDMA_PIN: return src_pin(tp, sender, req, len, resp, cap, resp_len);
    case ORB_RDMA_UNPIN: return src_unpin(tp, sender, req, len, resp, cap, resp_len);
    case ORB_RDMA_PGRANT_REQ: return src_pgrant(tp, sender, req, len, resp, cap, resp_len);
    default: return orb_fail(ORB_EPROTO, "rdma: control message of kind %u is not a request", kind);
    }
}

/* ---- completions ------------------------------------------------------------------------------- */

/* One of `g`'s binds ended: bound (status 0: the window of `rail` carries its key now) or not.
 * The waiting control handler is woken with the last bind it waits for; an abandoned grant is
 * freed with its last bind. */
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
    if (g->binds_left == 0 && g->batch != NULL && --g->batch->left == 0)
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
            /* The bytes are this side's own, in the send slot the cookie names. */
            const uint8_t *sent = l->buf + (size_t)(cookie >> 2) * RDMA_MSG_SLOT;
            uint32_t len = (uint32_t)orb_rdma_acks_len(sent, RDMA_MSG_SLOT);
            if (len > 0)
                rdma_src_ack_lost(l, sent, len);
            else
                ORB_LOGE("rdma: rail %u: a failed ACK's send slot holds no ACK: its grants' ends are not sent again",
                         l->rail);
        }
        return;
    }
    struct rdma_wr_ctx *x = (struct rdma_wr_ctx *)(uintptr_t)(cookie & ~(uint64_t)RDMA_COOKIE_CTX);
    bind_ended(x->owner, x->rail, ok ? 0 : ORB_EPEER);
}

void rdma_src_ack_lost(struct rdma_link *l, const uint8_t *msg, uint32_t len)
{
    /* The requester takes an ACK once and ignores the same one again: one that did arrive after
     * all costs nothing. */
    struct rdma_src_conn *c = l->owner;
    for (uint32_t i = 1; i < c->nqps; i++) {
        struct rdma_link *o = c->links[(l->rail + i) % c->nqps];
        if (o != NULL && rdma_link_queue_ack(o, msg, len) == 0) {
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
    if (l->private_grant) {
        rdma_pgrant_on_recv(l, wc, msg);
        return;
    }
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
    else if ((g->own_links ? g->own[l->rail] : c->links[l->rail]) != l)
        snprintf(why, sizeof why, "grant %llu: rail %u's end came on a queue pair that is not the grant's",
                 (unsigned long long)b.grant, b.rail);
    else if (!rdma_src_binding_matches(&b, c, g->generation, g->nonce, g->request, g->addr, g->length, g->op,
                                       g->key[l->rail]))
        snprintf(why, sizeof why, "grant %llu: the completion's binding is not the grant's", (unsigned long long)b.grant);
    else if (!orb_rdma_wc_invalidates(wc, g->key[l->rail]))
        snprintf(why, sizeof why, "grant %llu: the completion did not invalidate the rail's key",
                 (unsigned long long)b.grant);
    if (why[0] != '\0') {
        pthread_mutex_unlock(&c->lock);
        conn_fail(c, ORB_EPROTO, why);
        return;
    }
    /* The window is dead now: it goes back to its pool (a DevX key is destroyed with the grant). */
    struct rdma_ctx *x = l->ctx;
    if (g->win[l->rail] != NULL) {
        pthread_mutex_lock(&x->wlock);
        orb_rdma_window_put(&x->windows, g->win[l->rail]);
        pthread_mutex_unlock(&x->wlock);
        g->win[l->rail] = NULL;
    }
    g->done_mask |= bit;
    bool done = g->done_mask == g->rail_mask;
    if (done)
        grant_unlink(c, g);
    pthread_mutex_unlock(&c->lock);
    if (!done)
        return;
    int status = 0;
    if (g->stage.cpu != NULL && g->op == ORB_OP_WRITE) /* the pin still holds the range */
        status = stage_out(g->pin, g->addr, g->stage.cpu, g->length, &g->stage.held);
    bool reused = g->devx_mask != 0;
    if (reused) {
        /* Every key is invalidated; destroyed before the ACK, and what the NIC wrote into the
         * device made visible to it. A key that stays makes the end uncertain. */
        if (rdma_src_gdr_visible(g->pin, g->op, g->id) != 0)
            status = ORB_EUNAVAILABLE;
        int kept = grant_destroy_keys(c, g);
        if (kept != 0 && status == 0)
            status = kept;
    }
    uint64_t request = g->request, id = g->id;
    bool own = g->own_links;
    orb_engine_count_served(tp->engine, ORB_TRANSPORT_RDMA, g->op == ORB_OP_READ ? ORB_OP_READ : ORB_OP_WRITE,
                            g->length, 1, status);
    grant_release(c, g, true); /* its own queue pairs go to lane 0 */
    free(g);
    atomic_fetch_add(&tp->grants_served, 1);
    if (reused)
        atomic_fetch_add(&tp->reuse_grants, 1);
    if (own)
        atomic_fetch_add(&tp->own_grants, 1);
    struct orb_rdma_ack a = {.request = request, .grant = id, .status = status};
    uint8_t ack[ORB_RDMA_ACK_LEN];
    if (!own) {
        /* With the others of this batch of completions on the rail, in one SEND (the lane
         * flushes it when the batch is done); or, the rail having died since the binding came,
         * on another live queue pair of the connection. */
        if (rdma_link_stage_ack(l, &a) == 0)
            return;
        orb_rdma_ack_encode(&a, ack);
        rdma_src_ack_lost(l, ack, ORB_RDMA_ACK_LEN);
        return;
    }
    /* A grant of its own queue pairs: on the connection's queue pair of the rail, which its own
     * lane posts. */
    struct rdma_link *cl = c->links[l->rail];
    orb_rdma_ack_encode(&a, ack);
    if (rdma_link_queue_ack(cl, ack, ORB_RDMA_ACK_LEN) != 0)
        rdma_src_ack_lost(cl, ack, ORB_RDMA_ACK_LEN);
}
