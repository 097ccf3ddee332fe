/* The RDMA data path's contexts, links and lane thread (see rdma_data.h). */
#include "rdma/rdma_data.h"
#include "rdma/turns.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/error.h"
#include "core/log.h"
#include "core/random.h"
#include "core/thread_name.h"
#include "rdma/rdma_transport.h"
#include "topo/sysfs.h"

#define LANE_BATCH 16
#define LANE_IDLE_SPINS 256        /* empty polls before a polling lane naps */
#define LANE_EVENT_SPINS 8         /* empty polls before an event-driven lane arms and sleeps */
#define LANE_CLOCK_EVERY 32        /* lane 0 reads the clock for its scans every 32 empty turns */
#define LANE_NAP_NS 50000          /* the first nap: 50 us, doubling while idle */
#define LANE_NAP_MAX_NS 200000     /* at most 200 us: queued work waits no longer than that */
#define LANE_DRAIN_NAP_MAX_NS 25600000 /* a stop's drain: a lane looks again at least this often */
#define SCAN_EVERY_NS 100000000ull /* ACK deadlines, every 100 ms */
#define MONITOR_EVERY_NS 1000000000ull /* port states, every second */
#define RECLAIM_EVERY_NS 10000000ull /* progress recovery looks at its lane every 10 ms */
#define LANE_ARBITRATE_MAX 4096    /* waiting WRs of one tier ordered by deadline at once */

/* ---- contexts --------------------------------------------------------------------------------- */

/* A GID's rank: IPv4-mapped first, then RoCE v2, v1, IB. */
static int gid_score(enum orb_gid_type type, bool ipv4)
{
    return (type == ORB_GID_ROCE_V2 ? 4 : type == ORB_GID_ROCE_V1 ? 2 : 1) + (ipv4 ? 8 : 0);
}

static bool gid_is_ipv4(const uint8_t raw[16])
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(raw, mapped, sizeof mapped) == 0;
}

/* The port and GID a NIC's rails use: the settings' pins, else the first active port's first
 * IPv4-mapped RoCE v2 GID, else its first RoCE v2, v1 or IB GID; with `inactive`, a port in any
 * state (a rail that starts paused). */
static int pick_address(const struct orb_rdma_tp *tp, const struct orb_topo_nic *n, bool inactive, uint8_t *port,
                        uint8_t *gid_index, union ibv_gid *gid)
{
    int best = -1;
    for (uint32_t p = 0; p < n->nports && p < ORB_TOPO_MAX_PORTS; p++) {
        const struct orb_topo_port *pt = &n->ports[p];
        if (tp->cfg->port != 0 && pt->num != tp->cfg->port)
            continue;
        if (!inactive && pt->state != ORB_PORT_ACTIVE && pt->state != ORB_PORT_ACTIVE_DEFER)
            continue;
        for (uint32_t g = 0; g < pt->ngids; g++) {
            const struct orb_topo_gid *e = &pt->gids[g];
            if (tp->cfg->gid_index >= 0 && e->index != (uint16_t)tp->cfg->gid_index)
                continue;
            int score = gid_score((enum orb_gid_type)e->type, e->is_ipv4 != 0);
            if (score > best) {
                best = score;
                *port = pt->num;
                *gid_index = (uint8_t)e->index;
                memcpy(gid->raw, e->raw, sizeof gid->raw);
            }
        }
        if (best >= 0)
            return 0;
    }
    return -1;
}

static const struct orb_topo_nic *inventory_nic(const struct orb_rdma_tp *tp, uint32_t id)
{
    for (uint32_t i = 0; i < tp->disc.inv.nnics; i++)
        if (tp->disc.inv.nics[i].id == id)
            return &tp->disc.inv.nics[i];
    return NULL;
}

/* Destroy both queues of a replaced pair: 0, or -1 when one is kept (it may hold a queue pair
 * the device would not destroy). */
static int destroy_pair(struct orb_rdma_tp *tp, struct rdma_cq_pair *p)
{
    int s = tp->v->destroy_cq(p->scq), r = tp->v->destroy_cq(p->rcq);
    return s != 0 || r != 0 ? -1 : 0;
}

static void ctx_free(struct orb_rdma_tp *tp, struct rdma_ctx *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->wlock);
    uint32_t kept = orb_rdma_window_pool_fini(&c->windows);
    pthread_mutex_unlock(&c->wlock);
    if (kept > 0)
        ORB_LOGE("rdma: NIC %u: %u memory windows could not be freed", c->nic, kept);
    while (c->retired != NULL) {
        struct rdma_cq_pair *old = c->retired;
        c->retired = old->next;
        if (destroy_pair(tp, old) != 0)
            ORB_LOGE("rdma: NIC %u: a replaced completion queue could not be destroyed: kept", c->nic);
        free(old);
    }
    for (uint32_t i = 0; i < RDMA_MAX_LANES; i++) {
        bool cq_kept = false;
        if (c->scq[i] != NULL && tp->v->destroy_cq(c->scq[i]) != 0)
            cq_kept = true;
        if (c->rcq[i] != NULL && tp->v->destroy_cq(c->rcq[i]) != 0)
            cq_kept = true;
        if (cq_kept)
            ORB_LOGE("rdma: NIC %u: a completion queue could not be destroyed: kept", c->nic);
        else if (c->chan[i] != NULL && tp->v->destroy_comp_channel(c->chan[i]) != 0)
            ORB_LOGE("rdma: NIC %u: a completion channel could not be destroyed: kept", c->nic);
    }
    pthread_mutex_destroy(&c->wlock);
    pthread_mutex_destroy(&c->addr_lock);
    free(c);
}

static int ctx_new(struct orb_rdma_tp *tp, uint32_t nic, struct rdma_ctx **out)
{
    const struct orb_rdma_nic *n = &tp->dev.nics[nic];
    const struct orb_topo_nic *inv = inventory_nic(tp, nic);
    if (inv == NULL || !tp->caps[nic].queried)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: %s: no inventory entry or limits", n->name);
    if (!tp->caps[nic].mw_type_2b)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: %s: no type-2B memory windows, so it cannot serve grants",
                        n->name);
    struct rdma_ctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: out of memory");
    pthread_mutex_init(&c->wlock, NULL);
    c->nic = nic;
    /* Soft-RoCE contexts are dealt one lane each, in turn. */
    c->only_lane = tp->caps[nic].one_lane ? (int32_t)(tp->nrails % tp->nlanes) : -1;
    c->ctx = n->ctx;
    c->pd = n->pd;
    int rc;
    pthread_mutex_init(&c->addr_lock, NULL);
    if (pick_address(tp, inv, false, &c->port, &c->gid_index, &c->gid) != 0) {
        /* A port that is down now but has its address: the rail starts paused, and the monitor
         * resumes it once the port is active. */
        if (pick_address(tp, inv, true, &c->port, &c->gid_index, &c->gid) != 0) {
            rc = orb_fail(ORB_EUNAVAILABLE, "rdma: %s: no port with a usable GID", n->name);
            goto free_ctx;
        }
        c->paused = true;
        ORB_LOGW("rdma: %s: port %u is not active: its rail starts paused and resumes once it is", n->name, c->port);
    }
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof pa);
    int err = tp->env.query_port(tp->ops_impl, c->ctx, c->port, &pa);
    if (err != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "rdma: %s: cannot query port %u: %s", n->name, c->port, strerror(err));
        goto free_ctx;
    }
    c->mtu = pa.active_mtu;
    c->lid = pa.lid;
    /* The monitor reads the device's async events without blocking. */
    int afl = fcntl(c->ctx->async_fd, F_GETFL);
    c->async_events = afl >= 0 && fcntl(c->ctx->async_fd, F_SETFL, afl | O_NONBLOCK) == 0;
    if (!c->async_events)
        ORB_LOGW("rdma: %s: its async events cannot be read without blocking: the monitor only scans", n->name);
    c->hca.max_qp_wr = tp->caps[nic].max_qp_wr;
    c->hca.max_qp_rd_atom = tp->caps[nic].max_qp_rd_atom;
    c->hca.max_qp_init_rd_atom = tp->caps[nic].max_qp_init_rd_atom;
    c->cqe = tp->cfg->max_cqes;
    if (tp->caps[nic].max_cqe > 0 && c->cqe > tp->caps[nic].max_cqe)
        c->cqe = tp->caps[nic].max_cqe;
    for (uint32_t i = 0; i < tp->nlanes; i++) {
        if (tp->cfg->progress_mode == ORB_RDMA_PROGRESS_EVENT_DRIVEN) {
            c->chan[i] = tp->v->create_comp_channel(c->ctx);
            int fl = c->chan[i] != NULL ? fcntl(c->chan[i]->fd, F_GETFL) : -1;
            if (fl < 0 || fcntl(c->chan[i]->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
                rc = orb_fail(ORB_EUNAVAILABLE, "rdma: %s: cannot make the completion channel of lane %u: %s",
                              n->name, i, strerror(errno));
                goto free_ctx;
            }
        }
        c->scq[i] = tp->v->create_cq(c->ctx, (int)c->cqe, NULL, c->chan[i], 0);
        c->rcq[i] = tp->v->create_cq(c->ctx, (int)c->cqe, NULL, c->chan[i], 0);
        if (c->scq[i] == NULL || c->rcq[i] == NULL) {
            rc = orb_fail(ORB_EUNAVAILABLE, "rdma: %s: cannot create the completion queues of lane %u (%u entries): %s",
                          n->name, i, c->cqe, strerror(errno));
            goto free_ctx;
        }
    }
    orb_rdma_window_pool_init(&c->windows, &orb_rdma_verbs_mw_ops, (void *)(uintptr_t)tp->v, c->pd,
                              tp->cfg->max_window_key_indices);
    c->ready = true;
    *out = c;
    return 0;

free_ctx:
    ctx_free(tp, c);
    return rc;
}

/* ---- links ------------------------------------------------------------------------------------ */

int rdma_link_new(struct orb_rdma_tp *tp, struct rdma_ctx *c, enum rdma_role role, uint32_t rail, uint32_t first_lane,
                  void *owner, struct rdma_link **out)
{
    return rdma_link_new_on(tp, c, c->pd, RDMA_LINK_SHARED, role, rail, first_lane, owner, out);
}

int rdma_link_new_on(struct orb_rdma_tp *tp, struct rdma_ctx *c, struct ibv_pd *pd, enum rdma_link_use use,
                     enum rdma_role role, uint32_t rail, uint32_t first_lane, void *owner, struct rdma_link **out)
{
    /* A source's queue pair carries no payload: a window bind for each grant it may hold (one
     * per receive) and their ACKs, so it is sized for those rather than by max_send_wr, and
     * never queues one behind the other; one grant's posts one bind at most (a private grant's
     * nothing at all). */
    uint32_t sq = role == RDMA_ROLE_SOURCE ? (use != RDMA_LINK_SHARED ? 2u : 2 * RDMA_RQ_DEPTH) : tp->cfg->max_send_wr;
    bool private_grant = use == RDMA_LINK_PRIVATE;
    if (c->hca.max_qp_wr > 0 && sq > c->hca.max_qp_wr)
        sq = c->hca.max_qp_wr;
    uint32_t charge = sq + RDMA_RQ_DEPTH;
    pthread_mutex_lock(&tp->lock);
    if (tp->endpoints >= tp->cfg->max_endpoints) {
        pthread_mutex_unlock(&tp->lock);
        return orb_fail(ORB_ERESOURCE, "rdma: max_endpoints (%u) queue pairs exist already", tp->cfg->max_endpoints);
    }
    /* The next lane in turn (from first_lane when given) whose CQs have room: one on the NIC's
     * NUMA node when there is one, else any. */
    uint32_t from = first_lane == RDMA_ANY_LANE ? tp->next_lane : first_lane;
    const struct orb_topo_nic *nic = inventory_nic(tp, c->nic);
    int32_t node = nic != NULL ? nic->numa_node : ORB_TOPO_NUMA_UNKNOWN;
    uint32_t lane = tp->nlanes;
    uint32_t tries = c->only_lane >= 0 ? 1 : tp->nlanes;
    if (c->only_lane >= 0)
        from = (uint32_t)c->only_lane;
    for (int pass = node >= 0 ? 0 : 1; pass < 2 && lane == tp->nlanes; pass++)
        for (uint32_t i = 0; i < tries && lane == tp->nlanes; i++) {
            uint32_t k = (from + i) % tp->nlanes;
            if ((pass == 1 || tp->lanes[k].place.node == node) && c->cqe_charged[k] + charge <= c->cqe)
                lane = k;
        }
    if (lane == tp->nlanes) {
        pthread_mutex_unlock(&tp->lock);
        return orb_fail(ORB_ERESOURCE, "rdma: NIC %u: its completion queues (max_cqes %u) are full", c->nic,
                        c->cqe);
    }
    tp->next_lane = lane + 1;
    tp->endpoints++;
    c->cqe_charged[lane] += charge;
    c->pair_links[lane]++;
    /* The lane's pair now: a replacement waits for this queue pair (it is charged on it). */
    struct ibv_cq *scq = c->scq[lane], *rcq = c->rcq[lane];
    uint32_t gen = c->gen[lane];
    pthread_mutex_unlock(&tp->lock);

    int rc;
    struct rdma_link *l = calloc(1, sizeof *l);
    if (l == NULL) {
        rc = orb_fail(ORB_ENOMEM, "rdma: out of memory for a link");
        goto uncharge;
    }
    l->tp = tp;
    l->ctx = c;
    l->role = role;
    l->rail = rail;
    l->lane = lane;
    l->gen = gen;
    atomic_init(&l->users, 0);
    atomic_init(&l->down, false);
    atomic_init(&l->fault, false);
    l->owner = owner;
    l->private_grant = private_grant;
    l->cqe_charge = charge;
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->inbox_lock, NULL);
    struct orb_qos_config qc;
    rdma_qos_config(tp, &qc);
    (void)orb_qos_set_init(&l->waits, &qc, &orb_clock_monotonic);
    pthread_mutex_lock(&c->addr_lock); /* the monitor may change the address */
    struct orb_rdma_qp_params p = {
        .port = c->port, .gid_index = c->gid_index, .gid = c->gid, .lid = c->lid, .mtu = c->mtu,
        .max_send_wr = sq, .max_recv_wr = RDMA_RQ_DEPTH, .max_rd_atomic = tp->cfg->max_rd_atomic,
        .max_dest_rd_atomic = tp->cfg->max_dest_rd_atomic, .ack_timeout = (uint8_t)tp->cfg->ack_timeout,
        .retry_count = (uint8_t)tp->cfg->retry_count, .psn = (uint32_t)orb_random_u64() & 0xffffffu,
        .incarnation = orb_random_u64() & 0xffffffu,
    };
    pthread_mutex_unlock(&c->addr_lock);
    rc = orb_rdma_qp_create(tp->v, pd, scq, rcq, &p, &c->hca, &l->qp);
    if (rc != 0)
        goto free_link;
    l->signal_every = role == RDMA_ROLE_REQUESTER ? orb_rdma_signal_every(tp->cfg->signal_interval, l->qp->sq_depth) : 1;
    size_t bytes = (size_t)(RDMA_RQ_DEPTH + l->qp->sq_depth) * RDMA_MSG_SLOT;
    l->buf = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (l->buf == NULL) {
        rc = orb_fail(ORB_ENOMEM, "rdma: out of memory for a link's messages");
        goto free_qp;
    }
    memset(l->buf, 0, bytes);
    l->buf_mr = tp->v->reg_mr_iova2(pd, l->buf, bytes, (uint64_t)(uintptr_t)l->buf, ORB_RDMA_LOCAL_ACCESS);
    if (l->buf_mr == NULL) {
        rc = orb_fail(ORB_ERESOURCE, "rdma: cannot register a link's message buffers: %s", strerror(errno));
        goto free_buf;
    }
    pthread_mutex_lock(&tp->lock);
    l->all_next = tp->links;
    tp->links = l;
    pthread_mutex_unlock(&tp->lock);
    /* Made on a pair that broke meanwhile: it fails with the others there. */
    if (atomic_load(&c->broken_lanes) & (1u << lane))
        rdma_link_fail(l, ORB_EPEER);
    *out = l;
    return 0;

free_buf:
    free(l->buf);
free_qp:
    (void)orb_rdma_qp_destroy(l->qp);
free_link:
    pthread_mutex_destroy(&l->inbox_lock);
    pthread_mutex_destroy(&l->lock);
    free(l);
uncharge:
    pthread_mutex_lock(&tp->lock);
    tp->endpoints--;
    c->cqe_charged[lane] -= charge;
    c->pair_links[lane]--;
    pthread_mutex_unlock(&tp->lock);
    return rc;
}

static int post_recv(struct rdma_link *l, uint32_t slot)
{
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)(l->buf + (size_t)slot * RDMA_MSG_SLOT),
                          .length = RDMA_MSG_SLOT, .lkey = l->buf_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    return l->tp->v->post_recv(l->qp->qp, &wr, &bad);
}

int rdma_link_connect(struct rdma_link *l, const struct orb_rdma_qp_addr *remote)
{
    int rc = orb_rdma_qp_connect(l->qp, remote);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < RDMA_RQ_DEPTH; i++) {
        int err = post_recv(l, i);
        if (err != 0)
            return orb_fail(ORB_EUNAVAILABLE, "rdma: cannot post a receive: %s", strerror(err));
    }
    return 0;
}

/* What `l` is, for the log. */
static const char *role_name(const struct rdma_link *l)
{
    return l->role == RDMA_ROLE_SOURCE ? "source" : "requester";
}

/* Mark `l` dead with `status` (its lock held). Whether this was its first failure. */
static bool mark_failed_locked(struct rdma_link *l, int status)
{
    if (l->failed != 0)
        return false;
    l->failed = status != 0 ? status : ORB_EPEER;
    atomic_store(&l->down, true);
    return true;
}

int rdma_link_post_locked(struct rdma_link *l, struct ibv_send_wr *wr, uint64_t cookie, const void *msg,
                          uint32_t msg_len, bool more)
{
    if (l->failed != 0)
        return orb_fail(ORB_EPEER, "rdma: the link of rail %u is dead (%s)", l->rail, orb_strerror(l->failed));
    if (!orb_rdma_wr_track_room(&l->qp->track, 1))
        return ORB_ERESOURCE;
    struct ibv_sge sge;
    if (msg != NULL) {
        uint32_t slot = RDMA_RQ_DEPTH + (l->send_next++ % l->qp->sq_depth);
        uint8_t *buf = l->buf + (size_t)slot * RDMA_MSG_SLOT;
        if (cookie == RDMA_COOKIE_ACK) /* its completion finds the bytes again, should it fail */
            cookie |= (uint64_t)slot << 2;
        memcpy(buf, msg, msg_len);
        sge.addr = (uint64_t)(uintptr_t)buf;
        sge.length = msg_len;
        sge.lkey = l->buf_mr->lkey;
        wr->sg_list = &sge;
        wr->num_sge = 1;
    }
    uint64_t id;
    (void)orb_rdma_wr_track_add(&l->qp->track, 1, &cookie, &id);
    wr->wr_id = id;
    wr->next = NULL;
    bool signal = !more || l->signal_every <= 1 || l->unsignaled + 1 >= l->signal_every;
    if (signal)
        wr->send_flags |= IBV_SEND_SIGNALED;
    else
        wr->send_flags &= ~(unsigned)IBV_SEND_SIGNALED;
    struct ibv_send_wr *bad = NULL;
    int err = l->tp->v->post_send(l->qp->qp, wr, &bad);
    if (err == 0) {
        l->unsignaled = signal ? 0 : l->unsignaled + 1;
        if ((cookie & 3u) == RDMA_COOKIE_ACK)
            atomic_fetch_add(&l->tp->ack_messages, 1);
        return 0;
    }
    /* Refused. Only a bad_wr naming this very WR proves the device did not take it; any other
     * answer leaves it possibly taken: it stays tracked (charged), and its flush or completion
     * ends it -- or nothing does, and it stays outstanding (a stop then cannot prove quiescence). */
    bool proven = bad == wr;
    if (proven)
        (void)orb_rdma_wr_track_withdraw(&l->qp->track, id);
    atomic_fetch_add(&l->tp->errors, 1);
    if (mark_failed_locked(l, ORB_EPEER))
        (void)orb_rdma_qp_fail(l->qp);
    ORB_LOGW("rdma: %s rail %u: the device refused a work request (opcode %d): %s%s; the link is failed",
             role_name(l), l->rail, (int)wr->opcode, strerror(err),
             proven ? "" : ", without saying it was not taken: it stays outstanding until the device ends it");
    (void)orb_fail(ORB_EPEER, "rdma: the device refused a work request on rail %u: %s", l->rail, strerror(err));
    return proven ? ORB_EPEER : RDMA_POST_UNKNOWN;
}

void rdma_qos_config(const struct orb_rdma_tp *tp, struct orb_qos_config *out)
{
    orb_qos_config_default(out);
    out->promotion_timeout_ns = tp->cfg->priority_promotion_timeout_ns;
    out->promotion_per_entry = tp->cfg->priority_promotion_per_entry;
}

/* The deadline of `w`'s request: its pieces share their batch's. */
static uint64_t wait_deadline(const struct rdma_wait *w)
{
    if (w->x != NULL)
        return w->x->deadline_ns;
    for (uint32_t i = 0; i < w->req->npieces; i++)
        if (w->req->pieces[i] != NULL)
            return w->req->pieces[i]->deadline_ns;
    return ORB_DEADLINE_NONE;
}

/* Queue `w` for the lane, behind what waits at its priority (link lock held). */
static void enqueue_locked(struct rdma_link *l, struct rdma_wait *w)
{
    w->next = NULL;
    w->qe.priority = w->req->priority;
    w->qe.bytes = w->x != NULL ? w->x->length : 0;
    w->qe.deadline_ns = wait_deadline(w);
    w->qe.nic = (uint16_t)l->ctx->nic;
    struct orb_qos_entry *e = &w->qe;
    l->reorder = true;
    if (orb_qos_enqueue(&l->waits, &e, 1) != 0)
        ORB_LOGE("rdma: rail %u: a work request could not be queued: %s", l->rail, orb_last_error());
}

void rdma_link_hand_over(struct rdma_link *l, struct rdma_wait *w)
{
    w->next = NULL;
    pthread_mutex_lock(&l->inbox_lock);
    if (l->inbox_tail != NULL)
        l->inbox_tail->next = w;
    else
        l->inbox_head = w;
    l->inbox_tail = w;
    pthread_mutex_unlock(&l->inbox_lock);
}

/* Move what was handed over into the wait queue, in the order it came (link lock held). */
static void take_inbox_locked(struct rdma_link *l)
{
    pthread_mutex_lock(&l->inbox_lock);
    struct rdma_wait *w = l->inbox_head;
    l->inbox_head = l->inbox_tail = NULL;
    pthread_mutex_unlock(&l->inbox_lock);
    while (w != NULL) {
        struct rdma_wait *next = w->next;
        enqueue_locked(l, w);
        w = next;
    }
}

/* Queue an ACK message behind the link's others (link lock held): it goes out when completions
 * free the send queue, or when the lane is kicked. */
static int queue_ack_locked(struct rdma_link *l, const uint8_t *msg, uint32_t len)
{
    if (len == 0 || len > ORB_RDMA_ACKS_LEN_MAX)
        return orb_fail(ORB_EINVAL, "rdma: an ACK of %u bytes", len);
    struct rdma_ack_wait *w = malloc(sizeof *w);
    if (w == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for a queued ACK");
    memcpy(w->msg, msg, len);
    w->len = len;
    w->next = NULL;
    if (l->acks_tail != NULL)
        l->acks_tail->next = w;
    else
        l->acks_head = w;
    l->acks_tail = w;
    return 0;
}

static void post_ack_wr(struct ibv_send_wr *wr)
{
    memset(wr, 0, sizeof *wr);
    wr->opcode = IBV_WR_SEND;
}

/* Send what is staged on `l` as one ACK (link lock held): posted, or queued behind earlier ones
 * while the send queue is full. 0, or the message the dead link cannot take in msg/len (the
 * caller hands it on, without the lock). */
static int flush_acks_locked(struct rdma_link *l, uint8_t msg[ORB_RDMA_ACKS_LEN_MAX], uint32_t *len)
{
    *len = (uint32_t)orb_rdma_acks_encode(l->acks_staged, l->nacks_staged, msg);
    l->nacks_staged = 0;
    if (*len == 0)
        return 0;
    struct ibv_send_wr wr;
    post_ack_wr(&wr);
    int rc = l->failed != 0      ? orb_fail(ORB_EPEER, "rdma: the link of rail %u is dead", l->rail)
             : l->acks_head != NULL ? ORB_ERESOURCE
                                    : rdma_link_post_locked(l, &wr, RDMA_COOKIE_ACK, msg, *len, false);
    if (rc == RDMA_POST_UNKNOWN) /* failed; its completion, if one comes, hands it on again */
        rc = ORB_EPEER;
    if (rc == ORB_ERESOURCE)
        rc = queue_ack_locked(l, msg, *len);
    return rc;
}

int rdma_link_stage_ack(struct rdma_link *l, const struct orb_rdma_ack *a)
{
    pthread_mutex_lock(&l->lock);
    if (l->failed != 0) {
        pthread_mutex_unlock(&l->lock);
        return orb_fail(ORB_EPEER, "rdma: the link of rail %u is dead", l->rail);
    }
    l->acks_staged[l->nacks_staged++] = *a;
    bool full = l->nacks_staged == ORB_RDMA_ACKS_MAX;
    pthread_mutex_unlock(&l->lock);
    if (full)
        rdma_link_flush_acks(l);
    return 0;
}

void rdma_link_flush_acks(struct rdma_link *l)
{
    uint8_t msg[ORB_RDMA_ACKS_LEN_MAX];
    uint32_t len = 0;
    pthread_mutex_lock(&l->lock);
    int rc = l->nacks_staged > 0 ? flush_acks_locked(l, msg, &len) : 0;
    pthread_mutex_unlock(&l->lock);
    if (rc != 0)
        rdma_src_ack_lost(l, msg, len);
}

int rdma_link_queue_ack(struct rdma_link *l, const uint8_t *msg, uint32_t len)
{
    pthread_mutex_lock(&l->lock);
    int rc = l->failed != 0 ? orb_fail(ORB_EPEER, "rdma: the link of rail %u is dead", l->rail)
                            : queue_ack_locked(l, msg, len);
    pthread_mutex_unlock(&l->lock);
    if (rc == 0)
        rdma_link_kick(l);
    return rc;
}

/* Post queued binds while the send queue has room (link lock held). Binds that cannot be posted
 * (a dead link) are handed back in *failed. */
static void drain_binds_locked(struct rdma_link *l, struct rdma_bind_wait **failed, int *failed_status)
{
    while (l->binds_head != NULL) {
        struct rdma_bind_wait *w = l->binds_head;
        struct rdma_grant *g = w->grant;
        int rc = rdma_link_post_locked(l, &g->bind_wr[w->rail],
                                       (uint64_t)(uintptr_t)&g->bind_ctx[w->rail] | RDMA_COOKIE_CTX, NULL, 0,
                                       false);
        if (rc == ORB_ERESOURCE)
            return;
        l->binds_head = w->next;
        if (l->binds_head == NULL)
            l->binds_tail = NULL;
        /* RDMA_POST_UNKNOWN: possibly taken, so its window may be bound: it ends with its
         * completion (a flush), like a posted one. */
        if (rc != 0 && rc != RDMA_POST_UNKNOWN) {
            w->next = *failed;
            *failed = w;
            *failed_status = rc;
        }
    }
}

void rdma_link_queue_bind(struct rdma_link *l, struct rdma_bind_wait *w)
{
    pthread_mutex_lock(&l->lock);
    w->next = NULL;
    if (l->binds_tail != NULL)
        l->binds_tail->next = w;
    else
        l->binds_head = w;
    l->binds_tail = w;
    pthread_mutex_unlock(&l->lock);
    rdma_link_kick(l);
}

/* The lane the calling thread is, or NULL. */
static _Thread_local const struct rdma_lane *this_lane;

/* Wake a lane sleeping on its channels (event_driven). The lane announces its sleep before its
 * last look at `kick`, and a kicker sets `kick` before looking at `sleeping` (both sequentially
 * consistent): one of the two always sees the other, so no kick is lost. */
static void lane_wake(struct rdma_lane *lane)
{
    if (lane->events && atomic_load(&lane->sleeping)) {
        uint64_t one = 1;
        if (write(lane->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
            ORB_LOGW("rdma: lane %u: cannot be woken: %s", lane->index, strerror(errno));
    }
}

void rdma_lane0_kick(struct orb_rdma_tp *tp)
{
    if (tp->lanes == NULL || tp->nlanes == 0)
        return;
    atomic_store(&tp->lanes[0].kick, 1);
    lane_wake(&tp->lanes[0]);
}

void rdma_link_kick(struct rdma_link *l)
{
    struct rdma_lane *lane = &l->tp->lanes[l->lane];
    if (this_lane == lane) {
        rdma_link_drain_waits(l);
    } else {
        atomic_store(&lane->kick, 1);
        lane_wake(lane);
    }
}

/* Post queued ACKs while the send queue has room (link lock held). On a dead link the ACKs not
 * posted are taken off into *lost (the caller hands them on); one the device may have taken
 * stays with its completion, which does that. */
static void drain_acks_locked(struct rdma_link *l, struct rdma_ack_wait **lost)
{
    while (l->acks_head != NULL) {
        struct rdma_ack_wait *w = l->acks_head;
        struct ibv_send_wr wr;
        post_ack_wr(&wr);
        int rc = rdma_link_post_locked(l, &wr, RDMA_COOKIE_ACK, w->msg, w->len, false);
        if (rc == ORB_ERESOURCE)
            return;
        if (rc != 0 && rc != RDMA_POST_UNKNOWN) {
            *lost = l->acks_head;
            l->acks_head = l->acks_tail = NULL;
            return;
        }
        l->acks_head = w->next;
        if (l->acks_head == NULL)
            l->acks_tail = NULL;
        free(w);
    }
}

static void free_acks_locked(struct rdma_link *l)
{
    while (l->acks_head != NULL) {
        struct rdma_ack_wait *w = l->acks_head;
        l->acks_head = w->next;
        free(w);
    }
    l->acks_tail = NULL;
}

/* deadline_bw_arbitration: when work arrived, order the waiting WRs of the most urgent tier (up
 * to LANE_ARBITRATE_MAX of them) by how much of their remaining time this rail's backlog and
 * their own bytes take (lib/topo/qos.h, TENT's DeadlineMlu); FIFO where nothing is known. On the
 * link's lane, its lock held. */
static void arbitrate_locked(struct rdma_link *l)
{
    struct orb_rdma_tp *tp = l->tp;
    struct rdma_lane *lane = &tp->lanes[l->lane];
    if (lane->arb == NULL || !l->reorder)
        return; /* the order holds until new work arrives */
    l->reorder = false;
    struct orb_qos_entry **cands = lane->cands;
    struct orb_qos_arbiter *arb = lane->arb;
    size_t n = orb_qos_pop_tier(&l->waits, ORB_QOS_ALL_TIERS, cands, LANE_ARBITRATE_MAX);
    if (n > 1) {
        struct orb_nic_load load[ORB_RDMA_MAX_RAILS];
        uint32_t count = 0;
        if (orb_selector_load_stats(tp->sel, load, ORB_RDMA_MAX_RAILS, &count) == 0 && l->rail < count) {
            const struct orb_nic_load *r = &load[l->rail];
            (void)orb_qos_arbitrate(arb, cands, n, r->posted_bytes, orb_nic_load_rate(r), orb_now_ns());
        }
    }
    if (n > 0 && orb_qos_push_front(&l->waits, cands, n) != 0)
        ORB_LOGE("rdma: rail %u: ordered work requests could not be queued again: %s", l->rail, orb_last_error());
}

void rdma_link_drain_waits(struct rdma_link *l)
{
    struct rdma_wait *failed = NULL;
    int failed_status = 0;
    bool failed_path = false;
    pthread_mutex_lock(&l->lock);
    if (l->role == RDMA_ROLE_SOURCE) {
        struct rdma_bind_wait *bfailed = NULL;
        int bstatus = 0;
        drain_binds_locked(l, &bfailed, &bstatus);
        struct rdma_ack_wait *lost = NULL;
        drain_acks_locked(l, &lost);
        pthread_mutex_unlock(&l->lock);
        while (lost != NULL) {
            struct rdma_ack_wait *next = lost->next;
            rdma_src_ack_lost(l, lost->msg, lost->len);
            free(lost);
            lost = next;
        }
        while (bfailed != NULL) {
            struct rdma_bind_wait *next = bfailed->next;
            rdma_src_bind_failed(bfailed->grant, bfailed->rail, bstatus);
            bfailed = next;
        }
        return;
    }
    take_inbox_locked(l);
    (void)orb_qos_promote(&l->waits);
    arbitrate_locked(l);
    uint64_t now = l->tp->slots_map != NULL ? orb_now_ns() : 0;
    for (;;) {
        struct rdma_wait *w = (struct rdma_wait *)orb_qos_peek(&l->waits, ORB_QOS_ALL_TIERS);
        if (w == NULL)
            break;
        uint64_t retry = 0;
        if (!rdma_slots_allow(l->tp, w->qe.priority, now, &retry)) {
            /* The most urgent waiting post may not go in this slot, so no other may: the lane
             * drains this link again at the next boundary. */
            struct rdma_lane *lane = &l->tp->lanes[l->lane];
            uint64_t cur = atomic_load(&lane->retry_ns);
            while ((cur == 0 || retry < cur) && !atomic_compare_exchange_weak(&lane->retry_ns, &cur, retry))
                ;
            break;
        }
        struct ibv_send_wr wr;
        uint64_t cookie;
        uint8_t msg[RDMA_MSG_SLOT];
        uint32_t msg_len = 0;
        struct ibv_sge sge;
        rdma_req_build(w, l, &wr, &sge, &cookie, msg, &msg_len);
        /* Unsignaled only with work right behind it that will be posted too: under shared
         * slots the next one may be held back, and this one's end would wait for it. */
        bool more = l->tp->slots_map == NULL && orb_qos_total(&l->waits) > 1;
        int rc = rdma_link_post_locked(l, &wr, cookie, msg_len > 0 ? msg : NULL, msg_len, more);
        if (rc == ORB_ERESOURCE)
            break;
        (void)orb_qos_pop(&l->waits, ORB_QOS_ALL_TIERS); /* w */
        if (rc == 0 || rc == RDMA_POST_UNKNOWN) { /* possibly taken: its completion (a flush) ends it */
            rdma_req_posted(w, l);
        } else {
            w->next = failed;
            failed = w;
            failed_status = rc;
            failed_path = atomic_load(&l->fault); /* refused because the link's path failed */
        }
    }
    pthread_mutex_unlock(&l->lock);
    while (failed != NULL) {
        struct rdma_wait *next = failed->next;
        rdma_req_wait_failed(failed, failed_status, failed_path);
        failed = next;
    }
}

void rdma_link_fail(struct rdma_link *l, int status)
{
    pthread_mutex_lock(&l->lock);
    bool first = mark_failed_locked(l, status);
    pthread_mutex_unlock(&l->lock);
    if (first && status != ORB_ECLOSED)
        ORB_LOGD("rdma: %s rail %u (qp %u): the link fails (%s)",
                 role_name(l), l->rail, l->qp->qp->qp_num,
                 orb_strerror(status));
    if (first && orb_rdma_qp_fail(l->qp) != 0)
        ORB_LOGW("%s", orb_last_error());
}

void rdma_link_fault(struct rdma_link *l, int status)
{
    pthread_mutex_lock(&l->lock);
    /* Failed already without a cause (ORB_EPEER: its receives' flushes, polled from their own
     * completion queue, can come before the send completion that says why): the path is it. */
    if (l->failed == 0 || l->failed == ORB_EPEER)
        atomic_store(&l->fault, true);
    pthread_mutex_unlock(&l->lock);
    rdma_link_fail(l, status);
}

/* The freed queue pair `l` leaves the CQ pair it was made on (tp->lock held): its lane's
 * current one, or a replaced one, which its lane destroys once none is left on it. */
static void uncharge_pair_locked(struct rdma_link *l)
{
    struct rdma_ctx *c = l->ctx;
    if (l->gen == c->gen[l->lane]) {
        c->cqe_charged[l->lane] -= l->cqe_charge;
        c->pair_links[l->lane]--;
        return;
    }
    for (struct rdma_cq_pair *old = c->retired; old != NULL; old = old->next)
        if (old->lane == l->lane && old->gen == l->gen) {
            old->links--;
            return;
        }
}

int rdma_link_free(struct rdma_link *l)
{
    if (l == NULL)
        return 0;
    struct orb_rdma_tp *tp = l->tp;
    pthread_mutex_lock(&tp->lock);
    for (struct rdma_link **pp = &tp->links; *pp != NULL; pp = &(*pp)->all_next) {
        if (*pp == l) {
            *pp = l->all_next;
            break;
        }
    }
    pthread_mutex_unlock(&tp->lock);
    /* Unhooked: no lane finds it any more; wait out one that is handling its completion. */
    while (atomic_load(&l->users) > 0)
        sched_yield();
    if (orb_rdma_qp_destroy(l->qp) != 0) {
        /* The queue pair may still reach memory: it, its buffers and its charges (an endpoint,
         * its CQ entries) stay for good, and nothing tries again. */
        atomic_fetch_add(&tp->kept_qps, 1);
        ORB_LOGE("%s: the queue pair, its buffers and its charges are kept", orb_last_error());
        return ORB_EBUSY;
    }
    pthread_mutex_lock(&tp->lock);
    tp->endpoints--;
    uncharge_pair_locked(l);
    pthread_mutex_unlock(&tp->lock);
    if (tp->v->dereg_mr(l->buf_mr) != 0) {
        ORB_LOGE("rdma: a link's message buffers could not be deregistered: kept");
        return ORB_EBUSY;
    }
    free(l->buf);
    free_acks_locked(l);
    pthread_mutex_destroy(&l->inbox_lock);
    pthread_mutex_destroy(&l->lock);
    free(l);
    return 0;
}

void rdma_links_drop(struct rdma_link **links, uint32_t from, uint32_t to)
{
    for (uint32_t k = from; k < to; k++) {
        if (links[k] == NULL)
            continue;
        rdma_link_fail(links[k], ORB_ECLOSED);
        rdma_link_free(links[k]);
        links[k] = NULL;
    }
}

/* ---- the lane --------------------------------------------------------------------------------- */

/* The link whose QP has number `qpn` on context `c`, or NULL; it is not freed until
 * link_put(). */
static struct rdma_link *link_of(struct orb_rdma_tp *tp, const struct rdma_ctx *c, uint32_t qpn)
{
    pthread_mutex_lock(&tp->lock);
    struct rdma_link *l = tp->links;
    while (l != NULL && !(l->ctx == c && l->qp->local.qpn == qpn))
        l = l->all_next;
    if (l != NULL)
        atomic_fetch_add(&l->users, 1);
    pthread_mutex_unlock(&tp->lock);
    return l;
}

static void link_put(struct rdma_link *l)
{
    atomic_fetch_sub(&l->users, 1);
}

struct rdma_retired {
    uint64_t cookie;
    bool is_this;
};
struct retire_list {
    struct rdma_retired *items;
    uint32_t n, cap;
    uint32_t lost;                 /* retired without room to note them (no memory to grow it) */
};

static void note_retired(void *ctx, uint64_t cookie, bool is_this)
{
    struct retire_list *r = ctx;
    if (r->n < r->cap)
        r->items[r->n++] = (struct rdma_retired){cookie, is_this};
    else
        r->lost++;
}

/* Whether a completion's error is the path's (rail health counts it against the rail) rather
 * than the peer's authority refusing the access (a revoked or wrong key, an operation it does
 * not allow) or a local memory protection error; a flush is the consequence of an earlier one.
 * Soft-RoCE reports a port that went down as a local QP operation error. */
static bool wc_is_path_failure(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS:
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_MW_BIND_ERR:
        return false;
    default:
        return true;
    }
}

/* A flush on `l` that nothing here asked for (the link was live, or only a receive's flush had
 * failed it): the device moved the queue pair to the error state on its own. A send flush says
 * it without doubt (the send queue completes in order: an error completion would have come
 * first), so it is warned of and taken for a failure of the queue pair's path, which a READ on
 * it is asked again elsewhere for and rail health counts (soft-RoCE does this when its port goes
 * down, and when its responder refuses a request, such as a READ it replays after the window's
 * key was invalidated). A receive flush may come before the send completion that says why (they
 * are polled from different queues), so it is only noted, and remembered for the send side.
 * Whether it was such a send flush. */
static bool note_unasked_flush(struct rdma_link *l, const struct ibv_wc *wc, bool recv)
{
    if (wc->status != IBV_WC_WR_FLUSH_ERR)
        return false;
    pthread_mutex_lock(&l->lock);
    bool live = l->failed == 0;
    bool unasked = live || (!recv && l->recv_flushed && !atomic_load(&l->fault) && l->failed == ORB_EPEER);
    if (recv && live)
        l->recv_flushed = true;
    pthread_mutex_unlock(&l->lock);
    if (!unasked)
        return false;
    const char *role = role_name(l);
    if (recv) {
        ORB_LOGD("rdma: %s rail %u (qp %u): a receive was flushed before anything here failed the queue pair", role,
                 l->rail, l->qp->qp->qp_num);
        return false;
    }
    ORB_LOGW("rdma: %s rail %u (qp %u): a send work request was flushed though nothing here failed the queue pair: "
             "the device moved it to the error state without an error completion; its path is taken to have failed",
             role, l->rail, l->qp->qp->qp_num);
    return true;
}

static void on_send_wc(struct rdma_lane *lane, struct rdma_link *l, const struct ibv_wc *wc)
{
    struct orb_rdma_tp *tp = lane->tp;
    pthread_mutex_lock(&l->lock);
    /* One completion retires at most every WR outstanding on the link (unsignaled ones before
     * it): room for all of them, each handled below without the link's lock. */
    uint32_t most = l->qp->track.count;
    if (most > lane->retired_cap) {
        struct rdma_retired *grown = realloc(lane->retired, (size_t)most * sizeof *grown);
        if (grown != NULL) {
            lane->retired = grown;
            lane->retired_cap = most;
        }
    }
    struct retire_list r = {.items = lane->retired, .cap = lane->retired_cap};
    int rc = orb_rdma_wr_track_complete(&l->qp->track, wc->wr_id, note_retired, &r);
    pthread_mutex_unlock(&l->lock);
    if (rc < 0) {
        ORB_LOGW("rdma: rail %u: %s; the link is failed", l->rail, orb_last_error());
        rdma_link_fail(l, ORB_EPROTO);
        return;
    }
    if (r.lost > 0) {
        /* Their owners never learn that they ended: the link fails, and those requests end by
         * their deadline (io_timeout_s) rather than wait for good. */
        ORB_LOGE("rdma: rail %u: out of memory for the %u work requests one completion retired: the link is failed",
                 l->rail, r.lost + r.n);
        rdma_link_fail(l, ORB_ENOMEM);
    }
    if (wc->status != IBV_WC_SUCCESS) {
        bool unasked = note_unasked_flush(l, wc, false);
        if (wc->status != IBV_WC_WR_FLUSH_ERR) {
            ORB_LOGW("rdma: %s rail %u: a work request ended with %s", role_name(l),
                     l->rail, tp->v->wc_status_str(wc->status));
            atomic_fetch_add(&tp->errors, 1);
        }
        if (wc_is_path_failure(wc->status) || unasked)
            rdma_link_fault(l, ORB_EPEER);
        else
            rdma_link_fail(l, ORB_EPEER);
    }
    for (uint32_t i = 0; i < r.n; i++) {
        if (l->role == RDMA_ROLE_REQUESTER)
            rdma_req_on_send(l, r.items[i].cookie, wc, r.items[i].is_this);
        else
            rdma_src_on_send(l, r.items[i].cookie, r.items[i].is_this ? wc : NULL);
    }
    rdma_link_drain_waits(l);
}

static void on_recv_wc(struct rdma_link *l, const struct ibv_wc *wc)
{
    uint64_t slot = wc->wr_id;
    if (slot >= RDMA_RQ_DEPTH) {
        ORB_LOGW("rdma: rail %u: a receive completion names slot %llu of %u: the link is failed", l->rail,
                 (unsigned long long)slot, RDMA_RQ_DEPTH);
        rdma_link_fail(l, ORB_EPROTO);
        return;
    }
    if (wc->status != IBV_WC_SUCCESS) {
        (void)note_unasked_flush(l, wc, true);
        if (wc->status != IBV_WC_WR_FLUSH_ERR) {
            ORB_LOGW("rdma: rail %u: a receive ended with %s", l->rail, l->tp->v->wc_status_str(wc->status));
            atomic_fetch_add(&l->tp->errors, 1);
        }
        rdma_link_fail(l, ORB_EPEER);
        if (l->role == RDMA_ROLE_SOURCE)
            rdma_src_on_recv(l, wc, NULL);
        return;
    }
    const uint8_t *msg = l->buf + slot * RDMA_MSG_SLOT;
    if (l->role == RDMA_ROLE_REQUESTER)
        rdma_req_on_recv(l, wc, msg);
    else
        rdma_src_on_recv(l, wc, msg);
    pthread_mutex_lock(&l->lock);
    int dead = l->failed;
    pthread_mutex_unlock(&l->lock);
    int err = dead ? 0 : post_recv(l, (uint32_t)slot);
    if (err != 0) {
        ORB_LOGW("rdma: rail %u: a receive could not be posted again (%s): the link is failed", l->rail,
                 strerror(err));
        rdma_link_fail(l, ORB_EPEER);
    }
}

/* Whether `l` is one of links[0..n). */
static bool listed(struct rdma_link *const *links, uint32_t n, const struct rdma_link *l)
{
    for (uint32_t i = 0; i < n; i++)
        if (links[i] == l)
            return true;
    return false;
}

static int poll_cq(struct rdma_lane *lane, struct rdma_ctx *c, struct ibv_cq *cq, bool send)
{
    struct orb_rdma_tp *tp = lane->tp;
    struct ibv_wc wc[LANE_BATCH];
    int n = ibv_poll_cq(cq, LANE_BATCH, wc);
    if (n <= 0)
        return 0;
    /* Source queue pairs whose receives ended grants here: each sends one ACK for all of them
     * after the batch (held until then). A private grant's queue pair sends its own. */
    struct rdma_link *acking[LANE_BATCH];
    uint32_t nacking = 0;
    for (int i = 0; i < n; i++) {
        struct rdma_link *l = link_of(tp, c, wc[i].qp_num);
        if (l == NULL) {
            /* A link being destroyed: its flushes need no one, but an error is still the cause
             * of something and is said. */
            if (wc[i].status != IBV_WC_SUCCESS && wc[i].status != IBV_WC_WR_FLUSH_ERR)
                ORB_LOGW("rdma: qp %u (being closed): a %s completion ended with %s", wc[i].qp_num,
                         send ? "send" : "receive", tp->v->wc_status_str(wc[i].status));
            continue;
        }
        if (send)
            on_send_wc(lane, l, &wc[i]);
        else
            on_recv_wc(l, &wc[i]);
        if (!send && l->role == RDMA_ROLE_SOURCE && !l->private_grant && !listed(acking, nacking, l)) {
            acking[nacking++] = l; /* its use is let go after the flush (no lane frees links in here) */
            continue;
        }
        link_put(l);
    }
    for (uint32_t k = 0; k < nacking; k++) {
        rdma_link_flush_acks(acking[k]);
        link_put(acking[k]);
    }
    return n;
}

/* Post what the grant threads and control handlers queued on this lane's links (a lane alone
 * rings its links' doorbells). */
static int drain_lane(struct rdma_lane *lane)
{
    struct orb_rdma_tp *tp = lane->tp;
    struct rdma_link *stack[64], **todo = stack;
    uint32_t room = 64, mine = 0, n = 0;
    pthread_mutex_lock(&tp->lock);
    for (const struct rdma_link *l = tp->links; l != NULL; l = l->all_next)
        mine += l->lane == lane->index;
    if (mine > room) {
        if (mine > lane->todo_cap) {
            /* Grown under tp->lock (no I/O there), kept for the lane's life. */
            uint32_t cap = mine + mine / 2;
            struct rdma_link **grown = realloc(lane->todo, (size_t)cap * sizeof *grown);
            if (grown != NULL) {
                lane->todo = grown;
                lane->todo_cap = cap;
            }
        }
        if (lane->todo_cap > room) {
            todo = lane->todo;
            room = lane->todo_cap;
        }
    }
    /* Every link of the lane; short of memory, a room's worth in turns, and the lane is kicked
     * again for the rest. */
    uint32_t skip = orb_turn_skip(lane->todo_from, mine, room);
    for (struct rdma_link *l = tp->links; l != NULL && n < room; l = l->all_next) {
        if (l->lane != lane->index)
            continue;
        if (skip > 0) {
            skip--;
            continue;
        }
        atomic_fetch_add(&l->users, 1);
        todo[n++] = l; /* each looks at its own queues under its own lock */
    }
    lane->todo_from = orb_turn_next(lane->todo_from, n, mine);
    pthread_mutex_unlock(&tp->lock);
    if (n < mine)
        atomic_store(&lane->kick, 1);
    for (uint32_t i = 0; i < n; i++) {
        rdma_link_drain_waits(todo[i]);
        link_put(todo[i]);
    }
    return (int)n;
}

/* Send WRs outstanding on any link (tp->lock taken here). */
static uint32_t outstanding_wrs(struct orb_rdma_tp *tp)
{
    uint32_t n = 0;
    pthread_mutex_lock(&tp->lock);
    for (struct rdma_link *l = tp->links; l != NULL; l = l->all_next) {
        pthread_mutex_lock(&l->lock);
        n += l->qp->track.count;
        pthread_mutex_unlock(&l->lock);
    }
    pthread_mutex_unlock(&tp->lock);
    return n;
}

/* Whether this lane's CQ pair of context c can see completions: a context whose links all go
 * on one lane (soft-RoCE) has none on the others, and a lane neither polls nor arms those (on a
 * software device every poll and arm is work on the CPUs the device's work runs on). */
static bool lane_serves(const struct rdma_lane *lane, const struct rdma_ctx *c)
{
    return c != NULL && (c->only_lane < 0 || (uint32_t)c->only_lane == lane->index);
}

/* Poll this lane's CQ pair of every context it serves once; the number of completions handled. */
static int poll_lane(struct rdma_lane *lane)
{
    struct orb_rdma_tp *tp = lane->tp;
    int got = 0;
    for (uint32_t i = 0; i < tp->dev.nslots; i++) {
        struct rdma_ctx *c = tp->dctx[i];
        if (!lane_serves(lane, c))
            continue;
        got += poll_cq(lane, c, c->scq[lane->index], true);
        got += poll_cq(lane, c, c->rcq[lane->index], false);
    }
    return got;
}

/* Arm `cq` unless `bit` of *armed says it still is; false: it could not be. */
static bool arm_once(struct ibv_cq *cq, uint8_t *armed, uint8_t bit)
{
    if (*armed & bit)
        return true;
    if (ibv_req_notify_cq(cq, 0) != 0)
        return false;
    *armed |= bit;
    return true;
}

/* Arm this lane's CQs for their next completion. A CQ still armed from an earlier turn is left
 * as it is: its arm holds until it raises its event (on a software device every arm is a system
 * call). false: one could not be armed (keep polling). */
static bool lane_arm(struct rdma_lane *lane)
{
    struct orb_rdma_tp *tp = lane->tp;
    uint32_t k = lane->index;
    for (uint32_t i = 0; i < tp->dev.nslots; i++) {
        struct rdma_ctx *c = tp->dctx[i];
        if (!lane_serves(lane, c))
            continue;
        if (!arm_once(c->scq[k], &c->armed[k], RDMA_ARMED_SCQ) || !arm_once(c->rcq[k], &c->armed[k], RDMA_ARMED_RCQ))
            return false;
    }
    return true;
}

/* Take the events waiting on context c's channel of this lane (it polled readable), each
 * acknowledged at once. Only an armed CQ raises one, so after the first, reading stops when none
 * of the pair is left armed (a read that finds nothing is a system call too); an event left
 * unread keeps the channel readable for the next sleep. */
static void take_events(struct rdma_lane *lane, struct rdma_ctx *c)
{
    struct orb_rdma_tp *tp = lane->tp;
    uint32_t k = lane->index;
    struct ibv_cq *cq;
    void *cq_ctx;
    do {
        if (tp->v->get_cq_event(c->chan[k], &cq, &cq_ctx) != 0)
            return;
        tp->v->ack_cq_events(cq, 1);
        if (cq == c->scq[k])
            c->armed[k] &= (uint8_t)~RDMA_ARMED_SCQ;
        else if (cq == c->rcq[k])
            c->armed[k] &= (uint8_t)~RDMA_ARMED_RCQ;
        /* else the last event of a replaced pair */
    } while (c->armed[k] != 0);
}

/* event_driven, with the CQs armed and found empty after arming (a completion that came before
 * the arm raises no event): sleep until a completion event, a kick, the next deadline scan
 * (lane 0) or a second; then take the events, each acknowledged at once. */
static void lane_sleep(struct rdma_lane *lane, uint64_t next_scan)
{
    struct orb_rdma_tp *tp = lane->tp;
    struct pollfd fds[ORB_TOPO_MAX_NICS + 1];
    struct rdma_ctx *owner[ORB_TOPO_MAX_NICS];
    nfds_t n = 0;
    for (uint32_t i = 0; i < tp->dev.nslots && n < ORB_TOPO_MAX_NICS; i++) {
        struct rdma_ctx *c = tp->dctx[i];
        if (!lane_serves(lane, c) || c->chan[lane->index] == NULL)
            continue;
        owner[n] = c;
        fds[n++] = (struct pollfd){.fd = c->chan[lane->index]->fd, .events = POLLIN};
    }
    fds[n] = (struct pollfd){.fd = lane->wake_fd, .events = POLLIN};
    atomic_store(&lane->sleeping, 1);
    int timeout_ms = lane->index == 0 ? orb_deadline_poll_ms(next_scan) : 1000;
    uint64_t retry = atomic_load(&lane->retry_ns);
    if (retry != 0) {
        /* A shared slot held work back: wake for the boundary that may let it go. */
        int until = orb_deadline_poll_ms(retry);
        if (until < timeout_ms)
            timeout_ms = until;
    }
    if (atomic_load(&lane->kick)) {
        timeout_ms = 0;
    } else if (atomic_load(&tp->stopping)) {
        /* Draining: this lane's flushes raise its events, but the last one may come on another
         * lane's queues, so the lane looks again every LANE_DRAIN_NAP_MAX_NS (as a polling one
         * does), and at the window's end at the latest. */
        const int nap_ms = (int)(LANE_DRAIN_NAP_MAX_NS / 1000000);
        int until = orb_deadline_poll_ms(tp->drain_deadline);
        if (until > nap_ms)
            until = nap_ms;
        if (until < timeout_ms)
            timeout_ms = until;
    }
    (void)poll(fds, n + 1, timeout_ms);
    atomic_store(&lane->sleeping, 0);
    for (nfds_t k = 0; k < n; k++) {
        if (fds[k].revents & POLLIN)
            take_events(lane, owner[k]);
    }
    if (fds[n].revents & POLLIN) {
        uint64_t v;
        if (read(lane->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
            ORB_LOGW("rdma: lane %u: its wake-up descriptor: %s", lane->index, strerror(errno));
    }
}

/* Fail the requester queue pairs of rail k as the path's failure: what they carry flushes now
 * rather than after the device's retransmissions run out; and count one failure against each
 * connection's pair on the rail whose queue pairs were live (its path did fail). */
static void fail_rail_links(struct orb_rdma_tp *tp, uint32_t k)
{
    pthread_mutex_lock(&tp->lock);
    uint64_t pass = ++tp->rail_fence_passes; /* a connection this pass charged carries it */
    for (struct rdma_link *l = tp->links; l != NULL; l = l->all_next) {
        if (l->role != RDMA_ROLE_REQUESTER || l->rail != k)
            continue;
        bool live = !atomic_load(&l->down);
        rdma_link_fault(l, ORB_EPEER);
        struct rdma_peer *p = l->owner; /* a requester link's owner */
        if (live && p->rail_fence_pass != pass) {
            p->rail_fence_pass = pass;
            rdma_req_rail_fenced(p, k);
        }
    }
    pthread_mutex_unlock(&tp->lock);
}

static const char *port_state_name(int err, enum ibv_port_state st)
{
    if (err != 0)
        return "not readable";
    switch (st) {
    case IBV_PORT_DOWN: return "down";
    case IBV_PORT_INIT: return "initializing";
    case IBV_PORT_ARMED: return "armed";
    default: return "not active";
    }
}

/* The best valid GID of c's port now, read from the device (the settings' gid_index: that one
 * only). The GID type comes from the device where this rdma-core can say, else from the
 * inventory's entry of that index. false: none. */
static bool rank_gids(const struct orb_rdma_tp *tp, const struct rdma_ctx *c, uint8_t *index, union ibv_gid *gid)
{
    const struct orb_topo_nic *inv = inventory_nic(tp, c->nic);
    int best = -1;
    uint32_t first = tp->cfg->gid_index >= 0 ? (uint32_t)tp->cfg->gid_index : 0;
    uint32_t last = tp->cfg->gid_index >= 0 ? first : ORB_TOPO_MAX_GIDS - 1;
    for (uint32_t i = first; i <= last && i <= UINT8_MAX; i++) {
        union ibv_gid g;
        memset(&g, 0, sizeof g);
        static const uint8_t zero[16];
        if (tp->v->query_gid(c->ctx, c->port, (int)i, &g) != 0 || memcmp(g.raw, zero, sizeof zero) == 0)
            continue;
        enum orb_gid_type type = ORB_GID_IB;
        struct ibv_gid_entry e;
        if (tp->v->query_gid_ex != NULL && tp->v->query_gid_ex(c->ctx, c->port, i, &e, 0, sizeof e) == 0) {
            type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? ORB_GID_ROCE_V2
                   : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? ORB_GID_ROCE_V1 : ORB_GID_IB;
        } else {
            for (uint32_t p = 0; inv != NULL && p < inv->nports && p < ORB_TOPO_MAX_PORTS; p++)
                for (uint32_t j = 0; inv->ports[p].num == c->port && j < inv->ports[p].ngids; j++)
                    if (inv->ports[p].gids[j].index == i)
                        type = (enum orb_gid_type)inv->ports[p].gids[j].type;
        }
        int score = gid_score(type, gid_is_ipv4(g.raw));
        if (score > best) {
            best = score;
            *index = (uint8_t)i;
            *gid = g;
        }
    }
    return best >= 0;
}

/* Whether c's address still holds: its GID index still has its GID. Where it does not, the
 * best valid GID now (gid_index pinned: whatever that index holds, if anything) becomes the
 * address, into *changed; false when there is none. */
static bool address_holds(const struct orb_rdma_tp *tp, struct rdma_ctx *c, bool *changed)
{
    *changed = false;
    pthread_mutex_lock(&c->addr_lock);
    union ibv_gid now;
    memset(&now, 0, sizeof now);
    bool same = tp->v->query_gid(c->ctx, c->port, c->gid_index, &now) == 0 &&
                memcmp(now.raw, c->gid.raw, sizeof now.raw) == 0;
    bool found = same;
    if (!same) {
        uint8_t index = c->gid_index;
        union ibv_gid g;
        found = rank_gids(tp, c, &index, &g);
        if (found) {
            c->gid_index = index;
            c->gid = g;
            *changed = true;
        }
    }
    pthread_mutex_unlock(&c->addr_lock);
    return found;
}

static const char *async_event_name(enum ibv_event_type t)
{
    switch (t) {
    case IBV_EVENT_PORT_ERR: return "port error";
    case IBV_EVENT_PORT_ACTIVE: return "port active";
    case IBV_EVENT_GID_CHANGE: return "GID change";
    case IBV_EVENT_LID_CHANGE: return "LID change";
    case IBV_EVENT_QP_FATAL: return "queue pair fatal";
    case IBV_EVENT_QP_REQ_ERR: return "queue pair request error";
    case IBV_EVENT_QP_ACCESS_ERR: return "queue pair access error";
    case IBV_EVENT_CQ_ERR: return "completion queue error";
    case IBV_EVENT_DEVICE_FATAL: return "device fatal";
    default: return "other";
    }
}

/* A completion queue of context `c` (rail k) reported an error: the lane whose pair it is breaks
 * (see struct rdma_ctx): every queue pair on that pair fails now, and the monitor keeps the
 * rail fenced until the lane has a new pair. A replaced pair's error changes nothing (its
 * queue pairs failed already). false: `cq` is no lane's. */
static bool lane_broke(struct orb_rdma_tp *tp, struct rdma_ctx *c, uint32_t k, const struct ibv_cq *cq)
{
    pthread_mutex_lock(&tp->lock); /* the lanes replace their pairs under it */
    uint32_t lane = tp->nlanes;
    for (uint32_t i = 0; i < tp->nlanes && lane == tp->nlanes; i++)
        if (c->scq[i] == cq || c->rcq[i] == cq)
            lane = i;
    if (lane == tp->nlanes) {
        bool replaced = false;
        for (const struct rdma_cq_pair *old = c->retired; old != NULL && !replaced; old = old->next)
            replaced = old->scq == cq || old->rcq == cq;
        pthread_mutex_unlock(&tp->lock);
        if (replaced)
            ORB_LOGD("rdma: rail %u: an error of a replaced completion queue", k);
        return replaced;
    }
    if ((atomic_fetch_or(&c->broken_lanes, 1u << lane) & (1u << lane)) == 0) {
        atomic_fetch_add(&tp->reclaim_work, 1);
        ORB_LOGW("rdma: rail %u (%s): lane %u's completion queues reported an error: their queue pairs fail, and the "
                 "rail is fenced until the lane has new ones", k, tp->dev.nics[c->nic].name, lane);
    }
    for (struct rdma_link *l = tp->links; l != NULL; l = l->all_next)
        if (l->ctx == c && l->lane == lane && l->gen == c->gen[lane])
            rdma_link_fail(l, ORB_EPEER);
    pthread_mutex_unlock(&tp->lock);
    return true;
}

/* Replace lane `lane`'s broken CQ pair of `c` once it is drained -- every queue pair charged on
 * it listed, failed and with nothing outstanding, so that no completion it owes can be lost
 * with it -- keeping the context's PD, windows and MRs (the lane's own thread: nobody else
 * polls or arms its pairs). A pair with work outstanding is never replaced: it stays fenced. */
static void replace_pair(struct orb_rdma_tp *tp, struct rdma_ctx *c, uint32_t lane)
{
    pthread_mutex_lock(&tp->lock);
    uint32_t listed = 0;
    bool drained = true;
    for (struct rdma_link *l = tp->links; l != NULL && drained; l = l->all_next) {
        if (l->ctx != c || l->lane != lane || l->gen != c->gen[lane])
            continue;
        listed++;
        pthread_mutex_lock(&l->lock);
        drained = l->failed != 0 && l->qp->track.count == 0;
        pthread_mutex_unlock(&l->lock);
    }
    if (!drained || listed != c->pair_links[lane] || orb_now_ns() < c->reclaim_after_ns) {
        pthread_mutex_unlock(&tp->lock);
        return;
    }
    struct rdma_cq_pair *old = malloc(sizeof *old);
    struct ibv_cq *scq = old != NULL ? tp->v->create_cq(c->ctx, (int)c->cqe, NULL, c->chan[lane], 0) : NULL;
    struct ibv_cq *rcq = scq != NULL ? tp->v->create_cq(c->ctx, (int)c->cqe, NULL, c->chan[lane], 0) : NULL;
    if (rcq == NULL) {
        ORB_LOGW("rdma: %s: lane %u's completion queues cannot be replaced now (%s): the rail stays fenced, another "
                 "try in a second", tp->dev.nics[c->nic].name, lane, old == NULL ? "out of memory" : strerror(errno));
        if (scq != NULL && tp->v->destroy_cq(scq) != 0)
            ORB_LOGE("rdma: %s: a new completion queue could not be destroyed: kept", tp->dev.nics[c->nic].name);
        free(old);
        c->reclaim_after_ns = orb_now_ns() + ORB_NS_PER_SEC;
        pthread_mutex_unlock(&tp->lock);
        return;
    }
    *old = (struct rdma_cq_pair){.next = c->retired, .scq = c->scq[lane], .rcq = c->rcq[lane], .lane = lane,
                                 .gen = c->gen[lane], .links = listed};
    c->retired = old; /* the lane's break becomes this pair's destruction in reclaim_work */
    c->scq[lane] = scq;
    c->rcq[lane] = rcq;
    c->gen[lane]++;
    c->armed[lane] = 0; /* the new pair starts unarmed */
    c->cqe_charged[lane] = 0;
    c->pair_links[lane] = 0;
    atomic_fetch_and(&c->broken_lanes, ~(1u << lane));
    atomic_fetch_add(&tp->progress_recoveries, 1);
    pthread_mutex_unlock(&tp->lock);
    ORB_LOGI("rdma: %s: lane %u has new completion queues; the old ones go with their last %u queue pair(s), the "
             "protection domain and memory regions stay", tp->dev.nics[c->nic].name, lane, listed);
}

/* Destroy lane `lane`'s replaced pairs of `c` that no queue pair uses any more. */
static void free_retired(struct orb_rdma_tp *tp, struct rdma_ctx *c, uint32_t lane)
{
    pthread_mutex_lock(&tp->lock);
    for (struct rdma_cq_pair **pp = &c->retired; *pp != NULL;) {
        struct rdma_cq_pair *old = *pp;
        if (old->lane != lane || old->links > 0) {
            pp = &old->next;
            continue;
        }
        *pp = old->next;
        atomic_fetch_sub(&tp->reclaim_work, 1);
        if (destroy_pair(tp, old) != 0)
            ORB_LOGE("rdma: %s: a replaced completion queue could not be destroyed: kept", tp->dev.nics[c->nic].name);
        free(old);
    }
    pthread_mutex_unlock(&tp->lock);
}

/* This lane's part of progress recovery, every RECLAIM_EVERY_NS while there is any: its broken
 * pairs replaced once drained, its replaced pairs destroyed once unused. One atomic load per
 * pass of the lane otherwise. */
static void reclaim_lane(struct rdma_lane *lane)
{
    struct orb_rdma_tp *tp = lane->tp;
    if (atomic_load(&tp->reclaim_work) == 0)
        return;
    uint64_t now = orb_now_ns();
    if (now < lane->next_reclaim_ns)
        return;
    lane->next_reclaim_ns = now + RECLAIM_EVERY_NS;
    for (uint32_t i = 0; i < tp->dev.nslots; i++) {
        struct rdma_ctx *c = tp->dctx[i];
        if (c == NULL)
            continue;
        if (atomic_load(&c->broken_lanes) & (1u << lane->index))
            replace_pair(tp, c, lane->index);
        free_retired(tp, c, lane->index);
    }
}

/* The devices' async events (lane 0, at each deadline scan): a port or address event makes the
 * monitor scan now; a queue pair's error fails its link; a lane's completion queue's error
 * breaks that lane's pair (lane_broke: replaced once drained); a fatal device event, or an
 * error of a queue that is no lane's, fences the device's rail for good. Each
 * event is acknowledged at once (a queue pair's destruction waits for that). Whether the monitor
 * should scan now. */
static bool async_events(struct orb_rdma_tp *tp)
{
    bool scan = false;
    for (uint32_t k = 0; k < tp->nrails; k++) {
        struct rdma_ctx *c = tp->dctx[tp->rail_nic[k]];
        struct ibv_async_event ev;
        for (int n = 0; c->async_events && n < 64 && tp->v->get_async_event(c->ctx, &ev) == 0; n++) {
            const char *name = tp->dev.nics[c->nic].name;
            struct rdma_link *l = NULL;
            switch (ev.event_type) {
            case IBV_EVENT_PORT_ERR:
            case IBV_EVENT_PORT_ACTIVE:
            case IBV_EVENT_GID_CHANGE:
            case IBV_EVENT_LID_CHANGE:
                ORB_LOGI("rdma: rail %u (%s): %s event", k, name, async_event_name(ev.event_type));
                scan = true;
                break;
            case IBV_EVENT_QP_FATAL:
            case IBV_EVENT_QP_REQ_ERR:
            case IBV_EVENT_QP_ACCESS_ERR:
                ORB_LOGW("rdma: rail %u (%s): qp %u: %s event: its link is failed", k, name, ev.element.qp->qp_num,
                         async_event_name(ev.event_type));
                if ((l = link_of(tp, c, ev.element.qp->qp_num)) != NULL) {
                    if (ev.event_type == IBV_EVENT_QP_ACCESS_ERR)
                        rdma_link_fail(l, ORB_EPERM);
                    else
                        rdma_link_fault(l, ORB_EPEER);
                    link_put(l);
                }
                break;
            case IBV_EVENT_CQ_ERR:
                if (lane_broke(tp, c, k, ev.element.cq)) {
                    scan = true;
                    break;
                }
                ORB_LOGE("rdma: rail %u (%s): an error event of a completion queue that is not a lane's", k, name);
                if (!c->fatal) {
                    c->fatal = true;
                    ORB_LOGE("rdma: rail %u (%s): the rail is fenced for good", k, name);
                }
                scan = true;
                break;
            case IBV_EVENT_DEVICE_FATAL:
                if (!c->fatal) {
                    c->fatal = true;
                    ORB_LOGE("rdma: rail %u (%s): %s event: the rail is fenced for good", k, name,
                             async_event_name(ev.event_type));
                }
                scan = true;
                break;
            default:
                ORB_LOGD("rdma: rail %u (%s): async event %d", k, name, (int)ev.event_type);
                break;
            }
            tp->v->ack_async_event(&ev);
        }
    }
    return scan;
}

/* The monitor's scan (lane 0, every second, with or without traffic): each rail's port and
 * address. A port that is not active, or whose address changed, fences its rail -- no slice,
 * trial or rebuild goes there -- and fails the requester queue pairs on it; a changed GID is
 * replaced by the best valid one now (automatic gid_index) or what the pinned index holds. A
 * rail whose port is active with an address that held since the last scan opens its route
 * again (so queue pairs of an old address have had a scan's time to drain), and its queue pairs
 * are rebuilt when a request wants the rail. */
static void monitor_scan(struct orb_rdma_tp *tp)
{
    atomic_fetch_add(&tp->monitor_ticks, 1);
    for (uint32_t k = 0; k < tp->nrails; k++) {
        struct rdma_ctx *c = tp->dctx[tp->rail_nic[k]];
        struct ibv_port_attr pa;
        memset(&pa, 0, sizeof pa);
        int err = tp->env.query_port(tp->ops_impl, c->ctx, c->port, &pa);
        atomic_fetch_add(&tp->route_queries, 1);
        bool port_up = err == 0 && (pa.state == IBV_PORT_ACTIVE || pa.state == IBV_PORT_ACTIVE_DEFER);
        bool active = port_up && !c->fatal && atomic_load(&c->broken_lanes) == 0;
        bool changed = false, holds = active && address_holds(tp, c, &changed);
        uint32_t bit = 1u << k;
        bool was_down = (atomic_load(&tp->routes_down) & bit) != 0;
        const char *name = tp->dev.nics[c->nic].name;
        if (changed)
            ORB_LOGW("rdma: rail %u (%s port %u): its address changed: GID index %u now, the rail is fenced for a "
                     "scan", k, name, c->port, c->gid_index);
        else if (active && !holds)
            ORB_LOGW("rdma: rail %u (%s port %u): no valid GID: the rail is fenced until it has one", k, name, c->port);
        if ((!holds || changed) && !was_down) {
            atomic_fetch_or(&tp->routes_down, bit);
            if (!port_up && !c->fatal)
                ORB_LOGW("rdma: rail %u (%s port %u): the port is %s: the rail is fenced until it is active again", k,
                         name, c->port, port_state_name(err, pa.state));
            fail_rail_links(tp, k);
        } else if (holds && !changed && was_down) {
            pthread_mutex_lock(&c->addr_lock);
            c->mtu = pa.active_mtu;
            c->lid = pa.lid;
            pthread_mutex_unlock(&c->addr_lock);
            atomic_fetch_and(&tp->routes_down, ~bit);
            atomic_fetch_add(&tp->route_recoveries, 1);
            ORB_LOGI("rdma: rail %u (%s port %u): the port is active with a valid address: the rail's route is open",
                     k, name, c->port);
        }
    }
}

static void *lane_main(void *arg)
{
    struct rdma_lane *lane = arg;
    orb_thread_name("rdma-lane%u", lane->index);
    struct orb_rdma_tp *tp = lane->tp;
    this_lane = lane;
    uint32_t idle = 0, turns = 0;
    uint64_t nap = LANE_NAP_NS;
    uint64_t next_scan = orb_now_ns() + SCAN_EVERY_NS, next_monitor = orb_now_ns() + MONITOR_EVERY_NS;
    for (;;) {
        /* Stopping: every link is in the error state; run until their flushes are in, so that
         * no device access is left behind the completions, or until the drain's deadline. */
        if (atomic_load(&tp->stopping) &&
            (orb_now_ns() >= tp->drain_deadline || outstanding_wrs(tp) == 0))
            break;
        int got = 0;
        /* Kicked, or a shared slot's boundary that may let held-back work go has come. */
        uint64_t retry = atomic_load(&lane->retry_ns);
        bool slot_due = retry != 0 && orb_now_ns() >= retry;
        if (slot_due)
            atomic_store(&lane->retry_ns, 0);
        if (atomic_exchange(&lane->kick, 0) || slot_due)
            got += drain_lane(lane);
        got += poll_lane(lane);
        reclaim_lane(lane);
        /* The scans are due every 100 ms: lane 0 reads the clock after a turn that did work
         * (which may have taken long: on a software device a post does the transfer) and every
         * LANE_CLOCK_EVERY empty turns, not on each (where the clock source is not the TSC,
         * reading it is a system call). */
        if (lane->index == 0 && (got > 0 || ++turns >= LANE_CLOCK_EVERY)) {
            turns = 0;
            uint64_t now = orb_now_ns();
            if (now >= next_scan) {
                rdma_req_scan(tp, now);
                rdma_src_scan(tp, now);
                if (async_events(tp))
                    next_monitor = now;
                next_scan = now + SCAN_EVERY_NS;
            }
            if (now >= next_monitor) {
                monitor_scan(tp);
                next_monitor = now + MONITOR_EVERY_NS;
            }
            /* Lane 0 frees links here, holding no completion; other lanes hold theirs through
             * link_of()/link_put(), which rdma_link_free() waits out. */
            rdma_req_reap(tp, false);
            rdma_src_reap(tp, false);
        }
        if (got > 0) {
            idle = 0;
            nap = LANE_NAP_NS;
            continue;
        }
        /* A lane that slept looks at the clock on its next turn. */
        if (lane->events) {
            if (++idle >= LANE_EVENT_SPINS) {
                idle = 0;
                if (lane_arm(lane) && poll_lane(lane) == 0) {
                    lane_sleep(lane, next_scan);
                    turns = LANE_CLOCK_EVERY;
                }
            }
            continue;
        }
        if (++idle >= LANE_IDLE_SPINS) {
            struct timespec ts = {0, (long)nap};
            nanosleep(&ts, NULL);
            turns = LANE_CLOCK_EVERY;
            /* Draining, nothing new is posted: only flushes are awaited, and noticing them a
             * few milliseconds later costs nothing (the drain can last its whole window). */
            if (nap < (atomic_load(&tp->stopping) ? LANE_DRAIN_NAP_MAX_NS : LANE_NAP_MAX_NS))
                nap *= 2;
        }
    }
    return NULL;
}

/* The rail health table, with the settings' thresholds (the doubling stops at five minutes, or
 * at the cooldown when that is longer). */
static int health_start(struct orb_rdma_tp *tp)
{
    struct orb_rail_config rc;
    orb_rail_config_default(&rc);
    rc.error_threshold = tp->cfg->rail_error_threshold;
    rc.error_window_ns = tp->cfg->rail_error_window_ns;
    rc.cooldown_ns = tp->cfg->rail_cooldown_ns;
    if (rc.max_cooldown_ns < rc.cooldown_ns)
        rc.max_cooldown_ns = rc.cooldown_ns;
    rc.probe_interval_ns = tp->cfg->rail_probe_interval_ns;
    rc.max_rail_pairs = tp->cfg->max_rail_pairs;
    int err = orb_rail_table_new(&rc, &orb_clock_monotonic, &tp->health);
    return err != 0 ? orb_fail_wrap(err, "rdma: the rail health table") : 0;
}

/* The rails' selector, seeded from each rail's port rate; its tier row from the NICs' tiers. */
static int selector_start(struct orb_rdma_tp *tp)
{
    uint64_t mbps[ORB_RDMA_MAX_RAILS];
    memset(tp->rail_tier, ORB_SELECT_EXCLUDED, sizeof tp->rail_tier);
    for (uint32_t k = 0; k < tp->nrails; k++) {
        const struct rdma_ctx *c = tp->dctx[tp->rail_nic[k]];
        for (uint32_t row = 0; row <= ORB_TOPO_MAX_NUMA; row++)
            tp->rail_tier[row][k] = tp->nic_tier[row][c->nic];
        const struct orb_topo_nic *n = inventory_nic(tp, c->nic);
        mbps[k] = 0;
        for (uint32_t p = 0; n != NULL && p < n->nports && p < ORB_TOPO_MAX_PORTS; p++)
            if (n->ports[p].num == c->port)
                mbps[k] = n->ports[p].rate_mbps;
    }
    struct orb_selector_config sc;
    orb_selector_config_default(&sc);
    sc.smart_selection = tp->cfg->smart_selection;
    return orb_selector_create(&sc, tp->nrails, mbps, &orb_clock_monotonic, &tp->sel);
}

static int sysfs_node_cpus(void *ctx, int32_t node, struct orb_cpuset *out)
{
    return orb_topo_node_cpus(*(const int *)ctx, node, out);
}

/* Each lane's NUMA node and CPUs: the rails' NICs' nodes, within the CPUs this process may use. */
static void lanes_place(struct orb_rdma_tp *tp)
{
    int32_t rail_node[ORB_RDMA_MAX_RAILS];
    for (uint32_t k = 0; k < tp->nrails; k++) {
        const struct orb_topo_nic *n = inventory_nic(tp, tp->dctx[tp->rail_nic[k]]->nic);
        rail_node[k] = n != NULL ? n->numa_node : ORB_TOPO_NUMA_UNKNOWN;
    }
    struct orb_cpuset allowed;
    memset(&allowed, 0, sizeof allowed);
    cpu_set_t cs;
    CPU_ZERO(&cs);
    if (sched_getaffinity(0, sizeof cs, &cs) == 0)
        for (uint32_t cpu = 0; cpu < ORB_CPUSET_MAX && cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &cs))
                orb_cpuset_add(&allowed, cpu);
    int fd = open("/sys", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct orb_lane_cpus place[RDMA_MAX_LANES];
    int rc = fd >= 0 ? orb_lane_cpus_plan(rail_node, tp->nrails, tp->nlanes, sysfs_node_cpus, &fd, &allowed, place)
                     : ORB_EUNAVAILABLE;
    if (fd >= 0)
        (void)close(fd);
    for (uint32_t i = 0; rc == 0 && i < tp->nlanes; i++) {
        tp->lanes[i].place = place[i];
        if (place[i].node >= 0)
            ORB_LOGI("rdma: lane %u runs on NUMA node %d (%u CPUs)", i, (int)place[i].node,
                     orb_cpuset_count(&place[i].cpus));
    }
}

/* Start lane `lane`'s thread, on its CPUs when it has some. */
static int lane_spawn(struct rdma_lane *lane)
{
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0)
        return -1;
    if (lane->place.node >= 0) {
        cpu_set_t cs;
        CPU_ZERO(&cs);
        for (uint32_t cpu = 0; cpu < ORB_CPUSET_MAX && cpu < CPU_SETSIZE; cpu++)
            if (orb_cpuset_has(&lane->place.cpus, cpu))
                CPU_SET(cpu, &cs);
        if (pthread_attr_setaffinity_np(&attr, sizeof cs, &cs) != 0)
            ORB_LOGW("rdma: lane %u: cannot be bound to node %d's CPUs; it runs unbound", lane->index,
                     (int)lane->place.node);
    }
    int rc = pthread_create(&lane->thread, &attr, lane_main, lane);
    pthread_attr_destroy(&attr);
    return rc;
}

int rdma_data_start(struct orb_rdma_tp *tp)
{
    pthread_mutex_init(&tp->lock, NULL);
    pthread_mutex_init(&tp->glock, NULL);
    pthread_mutex_init(&tp->priv_lock, NULL);
    (void)orb_cond_init_monotonic(&tp->gcond);
    (void)orb_cond_init_monotonic(&tp->built);
    tp->grant_idle = false; /* no walk found the grant queue stuck yet */
    struct orb_qos_config qc;
    rdma_qos_config(tp, &qc);
    (void)orb_qos_set_init(&tp->gq, &qc, &orb_clock_monotonic);
    tp->io_timeout_ns = (uint64_t)orb_engine_cfg(tp->engine)->io_timeout_s * ORB_NS_PER_SEC;
    if (tp->env.query_port == NULL)
        return 0; /* registrations only */
    tp->nlanes = tp->cfg->num_lanes < RDMA_MAX_LANES ? tp->cfg->num_lanes : RDMA_MAX_LANES;
    tp->lanes = calloc(tp->nlanes, sizeof *tp->lanes);
    if (tp->lanes == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for %u lanes", tp->nlanes);
    bool events = tp->cfg->progress_mode == ORB_RDMA_PROGRESS_EVENT_DRIVEN;
    for (uint32_t i = 0; i < tp->nlanes; i++) {
        tp->lanes[i].tp = tp;
        tp->lanes[i].index = i;
        tp->lanes[i].place.node = ORB_TOPO_NUMA_UNKNOWN;
        tp->lanes[i].wake_fd = -1;
        atomic_init(&tp->lanes[i].kick, 0);
        atomic_init(&tp->lanes[i].retry_ns, 0);
        atomic_init(&tp->lanes[i].sleeping, 0);
    }
    for (uint32_t i = 0; tp->cfg->deadline_bw_arbitration && i < tp->nlanes; i++)
        if (orb_qos_arbiter_new(LANE_ARBITRATE_MAX, &tp->lanes[i].arb) != 0 ||
            (tp->lanes[i].cands = calloc(LANE_ARBITRATE_MAX, sizeof *tp->lanes[i].cands)) == NULL)
            return orb_fail(ORB_ENOMEM, "rdma: lane %u: no memory for its arbitration buffers", i);
    for (uint32_t i = 0; events && i < tp->nlanes; i++) {
        tp->lanes[i].events = true;
        tp->lanes[i].wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (tp->lanes[i].wake_fd < 0)
            return orb_fail(ORB_ERESOURCE, "rdma: lane %u: cannot make its wake-up descriptor: %s", i,
                            strerror(errno));
    }
    for (uint32_t i = 0; i < tp->dev.nslots && tp->nrails < ORB_RDMA_MAX_RAILS; i++) {
        if (tp->dev.nics[i].pd == NULL)
            continue;
        struct rdma_ctx *c = NULL;
        if (ctx_new(tp, i, &c) != 0) {
            ORB_LOGW("%s: it carries no requests", orb_last_error());
            continue;
        }
        tp->dctx[i] = c;
        if (c->paused)
            atomic_fetch_or(&tp->routes_down, 1u << tp->nrails);
        tp->rail_nic[tp->nrails++] = i;
    }
    if (tp->nrails == 0)
        return 0;
    int rc = health_start(tp);
    if (rc == 0)
        rc = selector_start(tp);
    if (rc == 0)
        rc = rdma_staging_start(tp);
    if (rc != 0)
        return rc;
    lanes_place(tp);
    tp->data = true;
    atomic_store(&tp->stopping, 0);
    for (uint32_t i = 0; i < tp->nlanes; i++) {
        if (lane_spawn(&tp->lanes[i]) != 0) {
            tp->lane_started = i > 0;
            (void)rdma_data_stop(tp, 0);
            tp->data = false;
            return orb_fail(ORB_EUNAVAILABLE, "rdma: cannot start lane %u", i);
        }
        tp->lanes[i].started = true;
    }
    tp->lane_started = true;
    for (uint32_t i = 0; i < RDMA_GRANT_THREADS; i++) {
        if (pthread_create(&tp->granter[i], NULL, rdma_grant_thread, tp) != 0) {
            (void)rdma_data_stop(tp, 0);
            return orb_fail(ORB_EUNAVAILABLE, "rdma: cannot start the grant threads");
        }
        tp->granters++;
    }
    return 0;
}

/* The end of stop, once no work request is outstanding: what was never granted or is still
 * waiting ends with ORB_ECLOSED, the source's connections go, released peers are freed. */
static void stop_finish(struct orb_rdma_tp *tp)
{
    rdma_req_fail_all(tp, ORB_ECLOSED);
    rdma_src_close_all(tp);
    rdma_src_reap(tp, true);
    rdma_req_reap(tp, true);
}

/* After the lanes are gone: poll their completion queues here until nothing is outstanding or
 * `deadline`. Whether nothing is. */
static bool drain_inline(struct orb_rdma_tp *tp, uint64_t deadline)
{
    for (;;) {
        if (outstanding_wrs(tp) == 0)
            return true;
        int got = 0;
        for (uint32_t i = 0; i < tp->nlanes; i++)
            got += poll_lane(&tp->lanes[i]);
        if (got == 0) {
            if (orb_now_ns() >= deadline)
                return outstanding_wrs(tp) == 0;
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
}

/* 0, or ORB_EUNQUIESCED when a queue pair could not be destroyed (it may still reach memory). */
static int kept_verdict(struct orb_rdma_tp *tp)
{
    uint64_t kept = atomic_load(&tp->kept_qps);
    if (kept == 0)
        return 0;
    return orb_fail(ORB_EUNQUIESCED, "rdma: %llu queue pair(s) could not be destroyed: the memory they may reach stays held",
                    (unsigned long long)kept);
}

int rdma_data_stop(struct orb_rdma_tp *tp, uint64_t deadline)
{
    if (!tp->data)
        return 0;
    if (atomic_load(&tp->stopping)) {
        if (!tp->unquiesced)
            return kept_verdict(tp);
        /* An earlier stop could not prove the end of every work request: wait again. */
        if (!drain_inline(tp, deadline))
            return orb_fail(ORB_EUNQUIESCED, "rdma: %u work requests are still outstanding: the memory they use stays "
                                             "held", outstanding_wrs(tp));
        ORB_LOGI("rdma: stop: every work request ended at last");
        tp->unquiesced = false;
        stop_finish(tp);
        return kept_verdict(tp);
    }
    tp->drain_deadline = orb_now_ns() + RDMA_DRAIN_NS;
    atomic_store(&tp->stopping, 1);
    pthread_mutex_lock(&tp->glock);
    rdma_grant_wake(tp, true);
    pthread_mutex_unlock(&tp->glock);
    for (uint32_t i = 0; i < tp->granters; i++)
        pthread_join(tp->granter[i], NULL);
    tp->granters = 0;
    /* Nothing new is posted now; what is posted flushes. */
    pthread_mutex_lock(&tp->lock);
    /* Every link, however many (a link is freed only under tp->lock; failing one takes only its
     * own lock). */
    for (struct rdma_link *l = tp->links; l != NULL; l = l->all_next)
        rdma_link_fail(l, ORB_ECLOSED);
    pthread_cond_broadcast(&tp->built); /* segments waiting for a connection's builder give up */
    pthread_mutex_unlock(&tp->lock);
    for (uint32_t i = 0; i < tp->nlanes; i++)
        lane_wake(&tp->lanes[i]); /* a sleeping lane sees stopping at once */
    for (uint32_t i = 0; i < tp->nlanes; i++) {
        if (tp->lanes[i].started)
            pthread_join(tp->lanes[i].thread, NULL);
        tp->lanes[i].started = false;
    }
    tp->lane_started = false;
    /* The lanes ran until the flushes were in or the drain window (separate from the caller's
     * deadline) passed. A work request still outstanding may yet touch its memory: its request
     * stays pending, and its queue pair, registrations and memory stay, until a later stop sees
     * it end. */
    uint32_t left = outstanding_wrs(tp);
    if (left > 0) {
        tp->unquiesced = true;
        ORB_LOGE("rdma: stop: %u work requests did not flush within the drain window: their requests, queue pairs "
                 "and memory are kept",
                 left);
        return orb_fail(ORB_EUNQUIESCED, "rdma: %u work requests did not flush within the %llu s drain window", left,
                        (unsigned long long)(RDMA_DRAIN_NS / ORB_NS_PER_SEC));
    }
    stop_finish(tp);
    return kept_verdict(tp);
}

void rdma_data_destroy(struct orb_rdma_tp *tp)
{
    rdma_req_reap(tp, true); /* private grants' queue pairs retired since the stop */
    if (tp->links != NULL) {
        ORB_LOGE("rdma: links are left at destroy: their contexts are kept");
        rdma_staging_abandon(tp); /* their grants may still reach staging chunks */
        return;
    }
    rdma_staging_destroy(tp);
    orb_selector_free(tp->sel);
    tp->sel = NULL;
    orb_rail_table_free(tp->health);
    tp->health = NULL;
    for (uint32_t i = 0; tp->lanes != NULL && i < tp->nlanes; i++) {
        if (tp->lanes[i].wake_fd >= 0)
            close(tp->lanes[i].wake_fd);
        orb_qos_arbiter_free(tp->lanes[i].arb);
        free(tp->lanes[i].cands);
        free(tp->lanes[i].todo);
        free(tp->lanes[i].retired);
    }
    free(tp->lanes);
    tp->lanes = NULL;
    for (uint32_t i = 0; i < ORB_TOPO_MAX_NICS; i++) {
        ctx_free(tp, tp->dctx[i]);
        tp->dctx[i] = NULL;
    }
    pthread_cond_destroy(&tp->gcond);
    pthread_cond_destroy(&tp->built);
    pthread_mutex_destroy(&tp->glock);
    pthread_mutex_destroy(&tp->lock);
    pthread_mutex_destroy(&tp->priv_lock);
}
