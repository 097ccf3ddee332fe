/* One RC queue pair of the RDMA transport (see qp.h). */
#include "rdma/qp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define SEQ_BITS 40
#define SEQ_MASK ((UINT64_C(1) << SEQ_BITS) - 1)
#define TRACK_CAP_MAX (1u << 20)

/* RC retransmission comes from the settings (ack_timeout, retry_count: by default 4.096 us x
 * 2^18 ~ 1 s per try, 7 tries). A receiver that is not ready (its receive queue momentarily
 * empty while its progress thread is descheduled) is retried without end (7): the transport's
 * own flow control (receives per grant and per ACK) makes room eventually, and a peer that is
 * gone still fails by io_timeout_s. */
#define QP_RNR_RETRY 7 /* 7: retry without end (IB: the RNR retry count 7 is infinite) */
#define QP_MIN_RNR_TIMER 12
#define QP_HOP_LIMIT 64

uint32_t orb_rdma_rd_atomic_depth(uint32_t requested, uint32_t hca_limit)
{
    if (requested == 0)
        return 0;
    uint32_t cap = hca_limit > 0 ? hca_limit : 1;
    return requested < cap ? requested : cap;
}

uint32_t orb_rdma_rd_atomic_for_peer(uint32_t own, uint8_t peer_read_depth)
{
    return peer_read_depth != 0 && peer_read_depth < own ? peer_read_depth : own;
}

uint32_t orb_rdma_signal_every(uint32_t interval, uint32_t sq_depth)
{
    uint32_t cap = sq_depth / 2;
    if (cap == 0)
        cap = 1;
    if (interval == 0)
        interval = 1;
    return interval < cap ? interval : cap;
}

static int status_of_errno(int err)
{
    return err == ENOMEM || err == ENOSPC || err == EAGAIN ? ORB_ERESOURCE : ORB_EUNAVAILABLE;
}

int orb_rdma_qp_create(const struct orb_verbs *v, struct ibv_pd *pd, struct ibv_cq *send_cq,
                       struct ibv_cq *recv_cq, const struct orb_rdma_qp_params *p,
                       const struct orb_rdma_hca_limits *hca, struct orb_rdma_qp **out)
{
    if (v == NULL || pd == NULL || send_cq == NULL || recv_cq == NULL || p == NULL || hca == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "rdma: qp: NULL argument");
    if (p->max_send_wr == 0 || p->max_recv_wr == 0 || p->port == 0)
        return orb_fail(ORB_EINVAL, "rdma: qp: zero queue depth or port");
    uint32_t sq = p->max_send_wr, rq = p->max_recv_wr;
    if (hca->max_qp_wr > 0) {
        if (sq > hca->max_qp_wr)
            sq = hca->max_qp_wr;
        if (rq > hca->max_qp_wr)
            rq = hca->max_qp_wr;
    }
    struct orb_rdma_qp *q = calloc(1, sizeof *q);
    if (q == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: qp: out of memory");
    int rc = orb_rdma_wr_track_init(&q->track, sq, p->incarnation);
    if (rc != 0)
        goto free_q;
    struct ibv_qp_init_attr init;
    memset(&init, 0, sizeof init);
    init.send_cq = send_cq;
    init.recv_cq = recv_cq;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = sq;
    init.cap.max_recv_wr = rq;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    errno = 0;
    q->qp = v->create_qp(pd, &init);
    if (q->qp == NULL) {
        int err = errno != 0 ? errno : EIO;
        rc = orb_fail(status_of_errno(err), "rdma: cannot create a queue pair (%u/%u WRs): %s", sq, rq,
                      strerror(err));
        goto free_track;
    }
    q->v = v;
    q->port = p->port;
    q->gid_index = p->gid_index;
    q->sq_depth = sq;
    q->rq_depth = rq;
    q->rd_atomic = orb_rdma_rd_atomic_depth(p->max_rd_atomic, hca->max_qp_init_rd_atom);
    q->dest_rd_atomic = orb_rdma_rd_atomic_depth(p->max_dest_rd_atomic, hca->max_qp_rd_atom);
    q->ack_timeout = p->ack_timeout <= 31 ? p->ack_timeout : 31;
    q->retry_count = p->retry_count <= 7 ? p->retry_count : 7;
    memcpy(q->local.gid, p->gid.raw, sizeof q->local.gid);
    q->local.qpn = q->qp->qp_num;
    q->local.psn = p->psn & 0xffffffu;
    q->local.lid = p->lid;
    q->local.mtu = (uint8_t)p->mtu;
    q->local.read_depth = (uint8_t)(q->dest_rd_atomic < 255 ? q->dest_rd_atomic : 255);
    *out = q;
    return 0;

free_track:
    orb_rdma_wr_track_free(&q->track);
free_q:
    free(q);
    return rc;
}

static int transition(struct orb_rdma_qp *q, struct ibv_qp_attr *a, int mask, const char *state)
{
    int err = q->v->modify_qp(q->qp, a, mask);
    if (err != 0)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: qp %u: the device refused the move to %s: %s", q->local.qpn,
                        state, strerror(err));
    return 0;
}

int orb_rdma_qp_connect(struct orb_rdma_qp *q, const struct orb_rdma_qp_addr *remote)
{
    if (q == NULL || remote == NULL)
        return orb_fail(ORB_EINVAL, "rdma: qp: NULL argument");
    if (q->connected)
        return orb_fail(ORB_EINVAL, "rdma: qp %u is connected already", q->local.qpn);
    if (remote->qpn == 0 || remote->qpn > 0xffffffu || remote->psn > 0xffffffu || remote->mtu < IBV_MTU_256 ||
        remote->mtu > IBV_MTU_4096)
        return orb_fail(ORB_EINVAL, "rdma: qp %u: the peer's address is malformed (qpn %u, psn %u, mtu %u)",
                        q->local.qpn, remote->qpn, remote->psn, remote->mtu);
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = q->port;
    a.pkey_index = 0;
    a.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    int rc = transition(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
    if (rc != 0)
        return rc;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)(remote->mtu < q->local.mtu ? remote->mtu : q->local.mtu);
    a.dest_qp_num = remote->qpn;
    a.rq_psn = remote->psn;
    a.max_dest_rd_atomic = (uint8_t)q->dest_rd_atomic;
    a.min_rnr_timer = QP_MIN_RNR_TIMER;
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, remote->gid, sizeof remote->gid);
    a.ah_attr.grh.sgid_index = q->gid_index;
    a.ah_attr.grh.hop_limit = QP_HOP_LIMIT;
    a.ah_attr.dlid = remote->lid;
    a.ah_attr.port_num = q->port;
    rc = transition(q, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                    "RTR");
    if (rc != 0)
        return rc;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = q->ack_timeout;
    a.retry_cnt = q->retry_count;
    a.rnr_retry = QP_RNR_RETRY;
    a.sq_psn = q->local.psn;
    /* Never more READs in flight than the peer answers at once: a responder that recycles its
     * read resources (soft-RoCE does) drops a retried READ whose resource is gone, and the queue
     * pair stalls. */
    q->rd_atomic = orb_rdma_rd_atomic_for_peer(q->rd_atomic, remote->read_depth);
    a.max_rd_atomic = (uint8_t)q->rd_atomic;
    rc = transition(q, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC,
                    "RTS");
    if (rc != 0)
        return rc;
    q->connected = true;
    return 0;
}

int orb_rdma_qp_fail(struct orb_rdma_qp *q)
{
    /* A queue pair never connected holds no work request (receives are posted once it is), and
     * one already in error has flushed: nothing to move (rxe refuses RESET -> ERR). */
    if (q == NULL || !q->connected || q->errored)
        return 0;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_ERR;
    int rc = transition(q, &a, IBV_QP_STATE, "ERR");
    q->errored = rc == 0;
    return rc;
}

int orb_rdma_qp_destroy(struct orb_rdma_qp *q)
{
    if (q == NULL)
        return 0;
    int err = q->v->destroy_qp(q->qp);
    if (err != 0)
        return orb_fail(ORB_EBUSY, "rdma: qp %u: the device refused to destroy it: %s", q->local.qpn,
                        strerror(err));
    orb_rdma_wr_track_free(&q->track);
    free(q);
    return 0;
}

/* ---- exact WR identity ------------------------------------------------------------------------ */

int orb_rdma_wr_track_init(struct orb_rdma_wr_track *t, uint32_t cap, uint64_t incarnation)
{
    if (t == NULL || cap == 0 || cap > TRACK_CAP_MAX)
        return orb_fail(ORB_EINVAL, "rdma: WR tracking for %u WRs", cap);
    memset(t, 0, sizeof *t);
    t->ring = calloc(cap, sizeof t->ring[0]);
    if (t->ring == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: WR tracking: out of memory");
    t->cap = cap;
    t->incarnation = incarnation & ((UINT64_C(1) << (64 - SEQ_BITS)) - 1);
    t->next_seq = 1; /* id 0 is never outstanding */
    return 0;
}

void orb_rdma_wr_track_free(struct orb_rdma_wr_track *t)
{
    if (t == NULL)
        return;
    free(t->ring);
    t->ring = NULL;
    t->cap = t->count = 0;
}

int orb_rdma_wr_track_add(struct orb_rdma_wr_track *t, uint32_t n, const uint64_t *cookies, uint64_t *ids_out)
{
    if (!orb_rdma_wr_track_room(t, n))
        return orb_fail(ORB_ERESOURCE, "rdma: %u send WRs would exceed the queue's %u (%u outstanding)", n,
                        t->cap, t->count);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id = (t->incarnation << SEQ_BITS) | (t->next_seq & SEQ_MASK);
        t->next_seq++;
        if ((t->next_seq & SEQ_MASK) == 0)
            t->next_seq = 1; /* 2^40 WRs later; the oldest outstanding is far newer by then */
        struct orb_rdma_wr_slot *s = &t->ring[(t->head + t->count) % t->cap];
        s->id = id;
        s->cookie = cookies != NULL ? cookies[i] : 0;
        t->count++;
        ids_out[i] = id;
    }
    return 0;
}

/* Position (0 = oldest) of `id` among the outstanding WRs, or -1. Ids are usually consecutive in
 * post order, so the offset from the oldest is the difference of their sequence numbers. */
static int64_t position_of(const struct orb_rdma_wr_track *t, uint64_t id)
{
    if (t->count == 0 || (id >> SEQ_BITS) != t->incarnation)
        return -1;
    uint64_t oldest = t->ring[t->head].id & SEQ_MASK;
    uint64_t seq = id & SEQ_MASK;
    uint64_t off = (seq - oldest) & SEQ_MASK;
    if (off < t->count && t->ring[(t->head + (uint32_t)off) % t->cap].id == id)
        return (int64_t)off;
    /* Not consecutive (a withdrawn suffix left a gap, or the sequence wrapped past 0), or not
     * outstanding at all: look at every outstanding WR (at most the queue's depth). */
    for (uint32_t i = 0; i < t->count; i++)
        if (t->ring[(t->head + i) % t->cap].id == id)
            return (int64_t)i;
    return -1;
}

int orb_rdma_wr_track_withdraw(struct orb_rdma_wr_track *t, uint64_t first_bad)
{
    int64_t pos = position_of(t, first_bad);
    if (pos < 0)
        return orb_fail(ORB_EPROTO, "rdma: the refused WR 0x%llx is not outstanding",
                        (unsigned long long)first_bad);
    t->count = (uint32_t)pos;
    return 0;
}

int orb_rdma_wr_track_complete(struct orb_rdma_wr_track *t, uint64_t wr_id,
                               void (*each)(void *ctx, uint64_t cookie, bool is_this), void *ctx)
{
    int64_t pos = position_of(t, wr_id);
    if (pos < 0)
        return orb_fail(ORB_EPROTO, "rdma: a completion for WR 0x%llx, which is not outstanding",
                        (unsigned long long)wr_id);
    int retired = 0;
    for (int64_t i = 0; i <= pos; i++) {
        const struct orb_rdma_wr_slot *s = &t->ring[t->head];
        t->head = (t->head + 1) % t->cap;
        t->count--;
        retired++;
        if (each != NULL)
            each(ctx, s->cookie, i == pos);
    }
    return retired;
}
