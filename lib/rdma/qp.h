/* Internal: one RC queue pair of the RDMA transport.
 *
 *  - Depths: the send queue holds at most the settings' max_send_wr unresolved WRs (and never more
 *    than the device allows); READ depths follow the settings within the device's limits: a
 *    requested 0 stays 0, a positive request is capped at the device's limit, or at 1 when the
 *    device reports 0 (orb_rdma_rd_atomic_depth).
 *  - Connecting: each end publishes an address (GID, QP number, first PSN, LID, MTU) through the
 *    control connection; orb_rdma_qp_connect() moves the QP through INIT, RTR and RTS towards
 *    the other end's address with the smaller of both MTUs. The QP itself allows remote READ and
 *    WRITE: what a peer may touch is decided by the windows the source binds, never by the QP or
 *    an MR (whose keys never leave the process).
 *  - Exact WR identity (struct orb_rdma_wr_track): every posted send WR gets an id unique for the
 *    QP's lifetime. A completion whose id is not outstanding (old, duplicate, forged) retires
 *    nothing; a completion of an outstanding WR retires it and every WR posted before it (an RC
 *    send queue completes in order, and unsignaled WRs give no completion of their own).
 *  - Signalling (orb_rdma_signal_every): every Nth WR of a post and the post's last WR ask for a
 *    completion, with N the settings' signal_interval capped at half the send queue (at least 1),
 *    so that the queue can never fill with WRs nobody will hear about. */
#ifndef ORB_RDMA_QP_H
#define ORB_RDMA_QP_H

#include <stdbool.h>
#include <stdint.h>

#include "rdma/verbs.h"

/* What the other end of a connection needs to know about a QP (sent in the control messages). */
struct orb_rdma_qp_addr {
    uint8_t gid[16];
    uint32_t qpn;      /* 24 bits */
    uint32_t psn;      /* 24 bits: the first packet sequence number it sends */
    uint16_t lid;      /* 0 on RoCE */
    uint8_t mtu;       /* enum ibv_mtu: the port's active MTU */
    uint8_t read_depth; /* the RDMA READs it answers at once (max_dest_rd_atomic); 0: not stated */
};

/* The device limits that bound a QP (from ibv_query_device). */
struct orb_rdma_hca_limits {
    uint32_t max_qp_wr;
    uint32_t max_qp_rd_atom;       /* as responder */
    uint32_t max_qp_init_rd_atom;  /* as initiator */
};

struct orb_rdma_qp_params {
    uint8_t port;                  /* 1-based */
    uint8_t gid_index;
    union ibv_gid gid;             /* the local GID at gid_index */
    uint16_t lid;
    enum ibv_mtu mtu;              /* the port's active MTU */
    uint32_t max_send_wr;          /* the settings' budget per QP */
    uint32_t max_recv_wr;
    uint32_t max_rd_atomic;        /* requested (settings) */
    uint32_t max_dest_rd_atomic;
    uint8_t ack_timeout;           /* the local ACK timeout exponent (0: none) */
    uint8_t retry_count;           /* transport retries (0..7) */
    uint32_t psn;                  /* first PSN, 24 bits (random per QP) */
    uint64_t incarnation;          /* the high bits of this QP's WR ids */
};

/* Outstanding send WRs, in post order. */
struct orb_rdma_wr_slot {
    uint64_t id;
    uint64_t cookie;               /* the caller's: what the WR belongs to */
};

struct orb_rdma_wr_track {
    uint32_t cap;                  /* most WRs outstanding (the send queue's depth) */
    uint32_t head;                 /* oldest outstanding */
    uint32_t count;
    uint64_t incarnation;          /* bits 40.. of every id */
    uint64_t next_seq;             /* bits 0..39, never reused */
    struct orb_rdma_wr_slot *ring; /* cap slots */
};

struct orb_rdma_qp {
    const struct orb_verbs *v;
    struct ibv_qp *qp;
    uint8_t port, gid_index;
    bool connected;
    bool errored;                  /* moved to the error state (orb_rdma_qp_fail) */
    uint32_t rd_atomic, dest_rd_atomic; /* applied depths */
    uint8_t ack_timeout, retry_count;   /* applied at RTS */
    uint32_t sq_depth, rq_depth;
    struct orb_rdma_qp_addr local;
    struct orb_rdma_wr_track track;
};

/* The READ depth a QP uses for a `requested` depth on a device that reports `hca_limit`. */
uint32_t orb_rdma_rd_atomic_depth(uint32_t requested, uint32_t hca_limit);

/* The READs a queue pair keeps in flight towards a peer that answers `peer_read_depth` at once
 * (0: not stated): `own` (already capped by the device), never more than the peer's. */
uint32_t orb_rdma_rd_atomic_for_peer(uint32_t own, uint8_t peer_read_depth);

/* Signal every how many WRs: `interval` capped at half of `sq_depth`, at least 1. */
uint32_t orb_rdma_signal_every(uint32_t interval, uint32_t sq_depth);

/* Create an RC QP on `pd` with `send_cq`/`recv_cq`, in state RESET, into *out (the caller's,
 * freed by orb_rdma_qp_destroy). Errors: ORB_EINVAL (NULL, a zero depth), ORB_ERESOURCE (the
 * device refused the QP for lack of resources: ENOMEM/ENOSPC), ORB_EUNAVAILABLE (other), ORB_ENOMEM. */
int orb_rdma_qp_create(const struct orb_verbs *v, struct ibv_pd *pd, struct ibv_cq *send_cq,
                       struct ibv_cq *recv_cq, const struct orb_rdma_qp_params *p,
                       const struct orb_rdma_hca_limits *hca, struct orb_rdma_qp **out);

/* INIT -> RTR -> RTS towards `remote`. Errors: ORB_EINVAL (already connected, a bad address),
 * ORB_EUNAVAILABLE (the device refused a transition: the message names it and errno). */
int orb_rdma_qp_connect(struct orb_rdma_qp *q, const struct orb_rdma_qp_addr *remote);

/* Move the QP to the error state: every outstanding WR completes (flushed). Idempotent; a QP
 * never connected holds no WR and is left as it is. Not thread-safe against itself: callers
 * serialise (the link's failure path runs once). */
int orb_rdma_qp_fail(struct orb_rdma_qp *q);

/* Destroy. 0, or ORB_EBUSY when the device refused (the QP is then kept: never freed). */
int orb_rdma_qp_destroy(struct orb_rdma_qp *q);

/* ---- exact WR identity ---------------------------------------------------------------------- */

/* Errors: ORB_EINVAL (cap 0 or above 2^20), ORB_ENOMEM. */
int orb_rdma_wr_track_init(struct orb_rdma_wr_track *t, uint32_t cap, uint64_t incarnation);
void orb_rdma_wr_track_free(struct orb_rdma_wr_track *t);

/* Room for `n` more WRs? */
static inline bool orb_rdma_wr_track_room(const struct orb_rdma_wr_track *t, uint32_t n)
{
    return n <= t->cap - t->count;
}

/* Record `n` WRs about to be posted, in order, with the callers' cookies; their ids go to
 * ids_out. Errors: ORB_ERESOURCE (more than the free room: nothing recorded). */
int orb_rdma_wr_track_add(struct orb_rdma_wr_track *t, uint32_t n, const uint64_t *cookies, uint64_t *ids_out);

/* ibv_post_send refused the WR with id `first_bad` and everything after it: forget them (they
 * were never accepted). Only the newest WRs can be withdrawn; an id that is not outstanding, or
 * not followed only by newer WRs, is ORB_EPROTO and nothing changes (the caller must then treat
 * every outstanding WR as possibly accepted). */
int orb_rdma_wr_track_withdraw(struct orb_rdma_wr_track *t, uint64_t first_bad);

/* A send completion with id `wr_id`. When it is outstanding, every WR up to and including it is
 * retired: `each(ctx, cookie, is_this)` runs for each, oldest first (is_this for `wr_id`'s own),
 * and the number retired is returned. ORB_EPROTO when the id is not outstanding: nothing is
 * retired (an old, duplicate or foreign completion never repays current debt). */
int orb_rdma_wr_track_complete(struct orb_rdma_wr_track *t, uint64_t wr_id,
                               void (*each)(void *ctx, uint64_t cookie, bool is_this), void *ctx);

#endif
