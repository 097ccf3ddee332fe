/* Private grants at the source (rdma_data.h, struct rdma_pgrant): device memory under cuda_memory
 * direct is never covered by a memory window, so each grant of it gets, on each of its rails, a
 * protection domain of its own, a memory region of exactly the range with the op's access only,
 * and a queue pair on that domain. The requester's queue pair for the grant is the only one that
 * can reach the region; the grant ends with its fenced SEND of the BINDING on every rail, after
 * which lane 0 destroys the queue pairs, regions and domains, and only then sends the ACK, on the
 * connection's own queue pair. */
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
#include "rdma/gdr.h"
#include "rdma/rdma_transport.h"

/* The region of exactly [addr, +len) of `pin` on `pd`, with the op's remote access only, by the
 * route that registered the range (the same boundary as its local-only MRs). */
static int region_on(struct orb_rdma_tp *tp, const struct orb_reg *pin, const struct orb_rdma_reg_mrs *m,
                     struct ibv_pd *pd, uint64_t addr, uint64_t len, uint8_t op, struct ibv_mr **out)
{
    unsigned access = op == ORB_OP_READ ? (unsigned)IBV_ACCESS_REMOTE_READ
                                        : (unsigned)(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
    const struct orb_rdma_mr_ops *ops = tp->env.mr_ops;
    struct ibv_mr *mr = NULL;
    errno = 0;
    if (m->route == ORB_GDR_ROUTE_DMABUF) {
        if (ops->reg_dmabuf == NULL || m->dmabuf_fd < 0)
            return orb_fail(ORB_EUNAVAILABLE, "rdma: a private grant's region: no dma-buf registration here");
        mr = ops->reg_dmabuf(tp->ops_impl, pd, m->dmabuf_offset + (addr - pin->base), len, addr, m->dmabuf_fd, access);
    } else {
        mr = ops->reg_mr(tp->ops_impl, pd, (void *)(uintptr_t)addr, len, addr, access);
    }
    if (mr == NULL) {
        int err = errno != 0 ? errno : EINVAL;
        return orb_fail(orb_rdma_mr_status(err), "rdma: a private grant's region of %llu bytes by %s: %s",
                        (unsigned long long)len, orb_gdr_route_name((enum orb_gdr_route)m->route), strerror(err));
    }
    *out = mr;
    return 0;
}

/* Destroy g's queue pairs, regions and domains, each only once what could still reach it is gone.
 * 0, or ORB_EUNQUIESCED when the device refused one: that and what lies under it stay, for good,
 * with the registration's memory (never retried). */
static int undo_rails(struct orb_rdma_tp *tp, struct rdma_pgrant *g)
{
    int rc = 0;
    for (uint32_t k = 0; k < ORB_RDMA_MAX_RAILS; k++) {
        bool kept = false;
        if (g->link[k] != NULL) {
            kept = rdma_link_free(g->link[k]) != 0;
            g->link[k] = NULL;
        }
        if (!kept && g->mr[k] != NULL) {
            int err = tp->env.mr_ops->dereg_mr(tp->ops_impl, g->mr[k]);
            if (err != 0) {
                ORB_LOGE("rdma: a private grant's region could not be deregistered (%s): it is kept, with its "
                         "memory and domain", strerror(err));
                atomic_fetch_add(&tp->kept_mrs, 1);
                kept = true;
            }
            g->mr[k] = NULL;
        }
        if (!kept && g->pd[k] != NULL) {
            int err = tp->v->dealloc_pd(g->pd[k]);
            if (err != 0) {
                ORB_LOGE("rdma: a private grant's protection domain could not be freed (%s): it is kept",
                         strerror(err));
                kept = true;
            }
        }
        g->pd[k] = NULL;
        if (kept)
            rc = ORB_EUNQUIESCED;
    }
    return rc;
}

/* Let go of g's registration and charge (kept: the memory stays with what the device kept). */
static void release(struct orb_rdma_tp *tp, struct rdma_pgrant *g, bool kept)
{
    if (g->pin != NULL) {
        if (kept)
            orb_reg_keep_owner(g->pin);
        orb_registry_release(g->pin);
        g->pin = NULL;
    }
    if (!kept) /* an uncertain end keeps its admission */
        atomic_fetch_sub(&tp->active_grants, 1);
}

int rdma_pgrant_serve(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_pgrant_req *in,
                      struct orb_rdma_pgrant *out)
{
    /* Admitted as any grant of the range (a slot of a pinned request: on the pin's registration). */
    struct orb_rdma_grant_ask a = orb_rdma_pgrant_ask(in);
    struct orb_reg *pin = NULL;
    int rc = rdma_src_admit(tp, c, &a, &pin);
    if (rc != 0)
        return rc;
    const struct orb_rdma_reg_mrs *m = orb_rdma_tp_reg_mrs(pin);
    if (pin->kind->kind == ORB_MEM_HOST || tp->cfg->cuda_memory != ORB_RDMA_CUDA_DIRECT || m == NULL || m->route == 0) {
        /* Memory a window may cover: a window grant on queue pairs of its own. */
        orb_registry_release(pin);
        return rdma_src_window_pgrant(tp, c, in, out);
    }
    if (atomic_fetch_add(&tp->active_grants, 1) >= tp->cfg->max_grants) {
        atomic_fetch_sub(&tp->active_grants, 1);
        orb_registry_release(pin);
        return orb_fail(ORB_EAGAIN, "rdma: max_grants (%u) grants are active", tp->cfg->max_grants);
    }
    struct rdma_pgrant *g = calloc(1, sizeof *g);
    if (g == NULL) {
        atomic_fetch_sub(&tp->active_grants, 1);
        orb_registry_release(pin);
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for a private grant");
    }
    g->conn = c;
    g->pin = pin;
    g->request = in->request;
    g->op = in->op;
    g->addr = in->addr;
    g->length = in->length;
    g->rail_mask = in->rail_mask;
    g->generation = 1;
    if ((rc = orb_random_bytes(g->nonce, sizeof g->nonce)) != 0)
        goto undo;
    /* Each rail: its domain, the exact region and a queue pair there, on the NIC and lane of the
     * connection's queue pair for that rail, connected to the requester's for this grant. */
    uint32_t i = 0;
    for (uint32_t k = 0; k < c->nqps; k++) {
        if (!(in->rail_mask & (1u << k)))
            continue;
        struct rdma_link *cl = c->links[k];
        struct rdma_ctx *x = cl->ctx;
        if ((g->pd[k] = tp->v->alloc_pd(x->ctx)) == NULL) {
            rc = orb_fail(ORB_ERESOURCE, "rdma: NIC %u: no protection domain for a private grant: %s", x->nic,
                          strerror(errno != 0 ? errno : ENOMEM));
            goto undo;
        }
        if ((rc = region_on(tp, pin, m, g->pd[k], in->addr, in->length, in->op, &g->mr[k])) != 0)
            goto undo;
        if ((rc = rdma_link_new_on(tp, x, g->pd[k], RDMA_LINK_PRIVATE, RDMA_ROLE_SOURCE, k, cl->lane, g, &g->link[k])) != 0) {
            /* max_endpoints or the completion queues are full for now: other grants' queue pairs
             * go with their ends, so the requester asks again. */
            if (rc == ORB_ERESOURCE)
                rc = orb_fail_wrap(ORB_EAGAIN, "rdma: a private grant's queue pair");
            goto undo;
        }
        if ((rc = rdma_link_connect(g->link[k], &in->qps[i])) != 0)
            goto undo;
        out->rkeys[i] = g->mr[k]->rkey;
        out->qps[i] = g->link[k]->qp->local;
        i++;
    }
    pthread_mutex_lock(&c->lock);
    if (c->failed != 0) {
        pthread_mutex_unlock(&c->lock);
        rc = orb_fail(ORB_EPEER, "rdma: the connection is failed");
        goto undo;
    }
    g->id = ++c->next_grant;
    g->state = RDMA_PGRANT_ACTIVE;
    g->expires_ns = orb_deadline_after(tp->io_timeout_ns + RDMA_GRANT_GRACE_NS);
    g->next = c->pgrants;
    c->pgrants = g;
    pthread_mutex_unlock(&c->lock);
    out->status = 0;
    out->grant = g->id;
    out->generation = g->generation;
    memcpy(out->nonce, g->nonce, sizeof out->nonce);
    out->target = in->addr;
    out->nqps = i;
    return 0;

undo: {
    char why[256];
    snprintf(why, sizeof why, "%s", orb_last_error());
    bool kept = undo_rails(tp, g) != 0;
    release(tp, g, kept);
    free(g);
    return orb_fail(rc, "%s", why);
}
}

/* End `g` (conn lock held): lane 0 tears it down. Whether it was active until now. */
static bool end_locked(struct rdma_src_conn *c, struct rdma_pgrant *g, int status, const char *why)
{
    if (g->state != RDMA_PGRANT_ACTIVE)
        return false;
    g->state = RDMA_PGRANT_ENDING;
    g->status = status;
    g->ack = status == 0;
    snprintf(g->why, sizeof g->why, "%s", why);
    c->pgrants_ending++;
    atomic_fetch_add(&c->tp->pgrants_ending, 1);
    return true;
}

void rdma_pgrant_on_recv(struct rdma_link *l, const struct ibv_wc *wc, const uint8_t *msg)
{
    struct rdma_pgrant *g = l->owner;
    struct rdma_src_conn *c = g->conn;
    struct orb_rdma_tp *tp = l->tp;
    char why[160] = "";
    int status = ORB_EPROTO;
    struct orb_rdma_binding b;
    if (msg == NULL) {
        status = ORB_EPEER;
        snprintf(why, sizeof why, "its queue pair on rail %u failed (%s)", l->rail, tp->v->wc_status_str(wc->status));
    } else if (orb_rdma_binding_decode(msg, wc->byte_len, &b) != 0) {
        snprintf(why, sizeof why, "%s", orb_last_error());
    } else if (wc->opcode != IBV_WC_RECV || (wc->wc_flags & IBV_WC_WITH_INV)) {
        snprintf(why, sizeof why, "its end on rail %u was not a plain SEND", l->rail);
    }
    pthread_mutex_lock(&c->lock);
    uint32_t bit = 1u << l->rail;
    if (why[0] == '\0') {
        if (b.grant != g->id || b.rail != l->rail || (g->done_mask & bit))
            snprintf(why, sizeof why, "a completion for grant %llu rail %u on grant %llu rail %u",
                     (unsigned long long)b.grant, b.rail, (unsigned long long)g->id, l->rail);
        else if (!rdma_src_binding_matches(&b, c, g->generation, g->nonce, g->request, g->addr, g->length, g->op,
                                           g->mr[l->rail]->rkey))
            snprintf(why, sizeof why, "grant %llu: the completion's binding is not the grant's",
                     (unsigned long long)g->id);
    }
    bool ended;
    if (why[0] != '\0') {
        ended = end_locked(c, g, status, why);
    } else {
        g->done_mask |= bit;
        ended = g->done_mask == g->rail_mask && end_locked(c, g, 0, "");
    }
    pthread_mutex_unlock(&c->lock);
    if (ended && why[0] != '\0')
        ORB_LOGW("rdma: private grant %llu (request %llu) fails: %s", (unsigned long long)g->id,
                 (unsigned long long)g->request, why);
    if (ended)
        rdma_lane0_kick(tp);
}

/* Send the ACK of a grant that ended by its bindings, on a live queue pair of the connection. */
static void send_ack(struct rdma_src_conn *c, const struct rdma_pgrant *g, int status)
{
    uint8_t ack[ORB_RDMA_ACK_LEN];
    struct orb_rdma_ack a = {.request = g->request, .grant = g->id, .status = status};
    orb_rdma_ack_encode(&a, ack);
    for (uint32_t k = 0; k < c->nqps; k++) {
        uint32_t q = (uint32_t)__builtin_ctz(g->rail_mask) + k; /* its own rails first */
        struct rdma_link *l = c->links[q % c->nqps];
        if (l != NULL && !atomic_load(&l->down) && rdma_link_queue_ack(l, ack, sizeof ack) == 0)
            return;
    }
    ORB_LOGW("rdma: the ACK of private grant %llu found no live queue pair of its connection",
             (unsigned long long)g->id);
}

static void teardown(struct orb_rdma_tp *tp, struct rdma_src_conn *c, struct rdma_pgrant *g, bool ack)
{
    int status = g->ack ? 0 : g->status;
    /* What the NIC wrote into the device is visible to it before the grant ends. */
    if (g->ack && rdma_src_gdr_visible(g->pin, g->op, g->id) != 0)
        status = ORB_EUNAVAILABLE;
    int undone = undo_rails(tp, g);
    if (undone != 0 && status == 0)
        status = undone; /* the end is not certain: the request must not count as done */
    release(tp, g, undone != 0);
    if (g->ack) {
        orb_engine_count_served(tp->engine, ORB_TRANSPORT_RDMA, g->op == ORB_OP_READ ? ORB_OP_READ : ORB_OP_WRITE,
                                g->length, 1, status);
        atomic_fetch_add(&tp->grants_served, 1);
        atomic_fetch_add(&tp->private_grants, 1);
    } else if (g->status != ORB_ECLOSED) {
        ORB_LOGD("rdma: private grant %llu (request %llu) torn down: %s", (unsigned long long)g->id,
                 (unsigned long long)g->request, g->why);
    }
    if (ack && g->ack)
        send_ack(c, g, status);
    free(g);
}

void rdma_pgrant_reap(struct orb_rdma_tp *tp, struct rdma_src_conn *c, bool all)
{
    for (;;) {
        pthread_mutex_lock(&c->lock);
        struct rdma_pgrant **pp = &c->pgrants;
        while (*pp != NULL && !all && (*pp)->state != RDMA_PGRANT_ENDING)
            pp = &(*pp)->next;
        struct rdma_pgrant *g = *pp;
        if (g != NULL) {
            *pp = g->next;
            if (g->state == RDMA_PGRANT_ENDING) {
                c->pgrants_ending--;
                atomic_fetch_sub(&tp->pgrants_ending, 1);
            } else {
                g->status = ORB_ECLOSED;
                snprintf(g->why, sizeof g->why, "its connection is torn down");
            }
        }
        pthread_mutex_unlock(&c->lock);
        if (g == NULL)
            return;
        teardown(tp, c, g, !all);
    }
}

void rdma_pgrant_scan(struct orb_rdma_tp *tp, struct rdma_src_conn *c, uint64_t now)
{
    bool ended = false;
    pthread_mutex_lock(&c->lock);
    for (struct rdma_pgrant *g = c->pgrants; g != NULL; g = g->next)
        if (g->state == RDMA_PGRANT_ACTIVE && now >= g->expires_ns) {
            ORB_LOGW("rdma: private grant %llu (request %llu) did not end within io_timeout_s and %llu s more: "
                     "torn down", (unsigned long long)g->id, (unsigned long long)g->request,
                     (unsigned long long)(RDMA_GRANT_GRACE_NS / ORB_NS_PER_SEC));
            ended |= end_locked(c, g, ORB_ETIMEDOUT, "its end did not come in time");
        }
    pthread_mutex_unlock(&c->lock);
    if (ended)
        rdma_lane0_kick(tp);
}
