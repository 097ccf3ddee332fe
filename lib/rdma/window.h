/* Internal: the one-use memory windows through which a source grants a peer exactly one
 * request's range in one direction, and the key history that keeps an old key from ever
 * regaining authority.
 *
 *  - A window is a type-2 memory window of the context's PD. It is bound with an IBV_WR_BIND_MW
 *    posted on the very QP the peer's accesses arrive on (a type-2 window answers no other QP),
 *    on the registration's MW_BIND parent MR, to [addr, +len) exactly, with REMOTE_READ for a
 *    peer's READ or REMOTE_WRITE for a peer's WRITE, never both.
 *  - Key history: the pool remembers, for every window index the PD ever handed out, each key
 *    (the low 8 bits of the rkey) that index ever carried, the allocation's own included. A bind
 *    takes the next key the index never had; an index with no key left is parked: kept
 *    allocated and never bound again. A window whose binding could not be proven over (its QP
 *    failed first) is discarded: freed, which revokes its binding for sure, while its keys stay
 *    in the history, so that the index, if the device hands it out again, never carries an old
 *    key. The history holds at most max_window_key_indices indices; an allocation that would
 *    need more is freed again and the grant refused (ORB_ERESOURCE), never served by reuse.
 *  - The peer ends a grant with a SEND_WITH_INV of the key. orb_rdma_wc_invalidates() decides
 *    whether a receive completion is that: a successful receive whose invalidated key is this
 *    one, flagged IBV_WC_WITH_INV, or unflagged without immediate data (soft-RoCE does not set
 *    the flag). Only then does the window return to the pool.
 *
 * A window still bound to a QP holds that QP: discard (or end) it before destroying the QP
 * (soft-RoCE stalls a QP's destruction for about 50 s while a window is bound to it).
 *
 * Not thread-safe: a pool belongs to the one thread that serves its PD's grants. */
#ifndef ORB_RDMA_WINDOW_H
#define ORB_RDMA_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#include "rdma/verbs.h"

struct orb_rdma_window {
    struct orb_rdma_window *next; /* free list */
    struct ibv_mw *mw;
    uint32_t rkey;                /* the key of the latest bind (or the allocation's) */
    uint32_t binds;               /* binds made by this window */
    bool bound;                   /* a bind is in force (until its invalidation is seen) */
};

/* How a pool allocates and frees windows; tests script it. */
struct orb_rdma_mw_ops {
    struct ibv_mw *(*alloc_mw)(void *impl, struct ibv_pd *pd); /* NULL with errno */
    int (*dealloc_mw)(void *impl, struct ibv_mw *mw);           /* 0 or errno */
};

/* ibv_alloc_mw(pd, IBV_MW_TYPE_2) / ibv_dealloc_mw through the loaded verbs table, which the
 * pool's impl must be (a const struct orb_verbs *). */
extern const struct orb_rdma_mw_ops orb_rdma_verbs_mw_ops;

/* The keys one window index ever carried. */
struct orb_rdma_key_history {
    uint32_t index;               /* rkey >> 8 */
    uint32_t used_count;
    uint64_t used[4];             /* bit k: key byte k was used */
};

struct orb_rdma_window_pool {
    const struct orb_rdma_mw_ops *ops;
    void *impl;
    struct ibv_pd *pd;
    uint32_t max_indices;         /* max_window_key_indices */
    uint32_t allocated;           /* windows allocated and not freed: in use + free + parked */
    uint32_t parked;
    uint32_t in_use;
    struct orb_rdma_window *free_list;
    struct orb_rdma_window *parked_list;
    /* Open addressing by index; `hist_cap` a power of two, at most half full. */
    struct orb_rdma_key_history *hist;
    uint32_t hist_cap, hist_count;
    uint8_t next_variant;         /* the low byte the next device-made key asks for first */
};

void orb_rdma_window_pool_init(struct orb_rdma_window_pool *p, const struct orb_rdma_mw_ops *ops, void *impl,
                               struct ibv_pd *pd, uint32_t max_indices);

/* Free every window not in use, parked ones included (the PD goes next), and the history.
 * Returns the number the device refused to free (kept). Windows still in use are the caller's
 * to return or discard first. */
uint32_t orb_rdma_window_pool_fini(struct orb_rdma_window_pool *p);

/* A window with a key left, from the free list or newly allocated. Errors: ORB_EAGAIN
 * (max_window_key_indices reached while windows are in use: ask again once one came back),
 * ORB_ERESOURCE (reached with none in use: the message says how many are parked), ORB_EUNAVAILABLE (the
 * device cannot allocate a type-2 window: errno named), ORB_ENOMEM. */
int orb_rdma_window_take(struct orb_rdma_window_pool *p, struct orb_rdma_window **out);

/* Fill *wr to bind `w` with a key its index never had to [addr, +len) of `parent` for the
 * peer's `op` (ORB_OP_READ: REMOTE_READ; ORB_OP_WRITE: REMOTE_WRITE), signaled, with `wr_id`.
 * The key is spent from then on, whatever becomes of the bind. Returns the key the window will
 * carry once the bind completes. Errors: ORB_EINVAL (NULL, len 0, a range outside the parent, a
 * window bound already or without a key left). */
int orb_rdma_window_bind_wr(struct orb_rdma_window_pool *p, struct orb_rdma_window *w, struct ibv_mr *parent,
                            uint64_t addr, uint64_t len, int op, uint64_t wr_id, struct ibv_send_wr *wr,
                            uint32_t *key_out);

/* The bind WR completed successfully: the window carries `key` now. */
void orb_rdma_window_bound(struct orb_rdma_window *w, uint32_t key);

/* Whether receive completion `wc` is the invalidation of `rkey` (see above). */
bool orb_rdma_wc_invalidates(const struct ibv_wc *wc, uint32_t rkey);

/* Return a window whose binding is over (invalidated, or its bind never took effect): back to
 * the free list, or parked when its keys are spent. */
void orb_rdma_window_put(struct orb_rdma_window_pool *p, struct orb_rdma_window *w);

/* Retire a window whose binding could not be proven over (its QP failed before the peer's
 * invalidation arrived, or a bind's outcome is unknown): freed, which revokes any binding; its
 * keys stay in the history. A window the device refuses to free is parked instead (kept). */
void orb_rdma_window_discard(struct orb_rdma_window_pool *p, struct orb_rdma_window *w);

/* Keys the device makes itself (mlx5 DevX indirect keys, rdma/devx_key.h) share the PD's key
 * space with windows, so they share the history and its max_window_key_indices bound: the
 * device picks the index, the caller the low byte.
 *
 * orb_rdma_key_history_used: whether `key` was ever handed out on this PD (a window's or a
 * device key's), or is 0. orb_rdma_key_history_next: the next low byte after `from` that the
 * index of `key` never carried (-1: none left). orb_rdma_key_history_claim: record `key` as
 * spent; ORB_ERESOURCE when its index would exceed max_window_key_indices, ORB_EINVAL when
 * it is spent already (never handed out twice), ORB_ENOMEM. */
bool orb_rdma_key_history_used(const struct orb_rdma_window_pool *p, uint32_t key);
int orb_rdma_key_history_next(const struct orb_rdma_window_pool *p, uint32_t key, uint32_t from);
int orb_rdma_key_history_claim(struct orb_rdma_window_pool *p, uint32_t key);

/* Keys the index of `w` has left (0: it is spent). */
uint32_t orb_rdma_window_keys_left(const struct orb_rdma_window_pool *p, const struct orb_rdma_window *w);

/* The key after `rkey` (the low 8 bits advance; the index stays). */
static inline uint32_t orb_rdma_next_key(uint32_t rkey)
{
    return (rkey & 0xffffff00u) | ((rkey + 1u) & 0xffu);
}

#endif
