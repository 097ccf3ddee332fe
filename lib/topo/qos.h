/* Internal: request priority for RDMA workers -- three FIFO tiers with aging (promotion),
 * deadline-aware arbitration among candidates of one NIC and tier, and the pre-dispatch
 * admission check. The rules follow Mooncake TENT (promotion policy, DeadlineMlu, greedy
 * arbitration); OrbiTE's differences are noted where they occur.
 *
 * Queues are intrusive: the caller embeds a struct orb_qos_entry in its own work item and owns
 * that memory; the queue set only links entries, so enqueue, promotion and dequeue never
 * allocate. A queue set belongs to one worker thread: it takes no lock, and callers serialise
 * every call on one set. All time comes from the injected clock (topo_clock.h). */
#ifndef ORB_TOPO_QOS_H
#define ORB_TOPO_QOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "topo_clock.h"

/* TENT's numbering: a lower number is more urgent. High is the default of a request. */
enum orb_qos_priority { ORB_PRIO_HIGH = 0, ORB_PRIO_MEDIUM = 1, ORB_PRIO_LOW = 2 };
#define ORB_QOS_NPRIO 3
#define ORB_QOS_ALL_TIERS 0x7u   /* allowed-tier mask with every tier set */

#define ORB_QOS_PROMOTION_TIMEOUT_NS 10000000ull /* 10 ms, as in TENT */
#define ORB_QOS_PROMOTION_CHECK_NS 1000000ull    /* a queue set checks at most once per 1 ms */
#define ORB_QOS_GREEDY_PICKS 64                  /* arbitration resolves this many slots exactly */
#define ORB_QOS_NO_DEADLINE 0ull                 /* TENT's "no deadline"; UINT64_MAX also means none */

/* One queued unit of work, embedded in the caller's item (recover it with container_of).
 * The caller fills priority, bytes, deadline_ns and nic before enqueueing; the queue set owns
 * `next`, `queued` and (on enqueue) `enqueue_ns` while the entry is queued. */
struct orb_qos_entry {
    struct orb_qos_entry *next;  /* queue link; meaningless while not queued */
    uint64_t enqueue_ns;         /* age origin; kept across promotion; 0 never times out */
    uint64_t deadline_ns;        /* absolute, same clock; 0 or UINT64_MAX: no deadline */
    uint64_t bytes;              /* payload length, for arbitration */
    uint8_t priority;            /* current tier (enum orb_qos_priority); promotion lowers it */
    uint8_t queued;              /* 1 while linked in a queue set */
    uint16_t nic;                /* local NIC id; arbitration candidates must share it */
};

struct orb_qos_config {
    uint64_t promotion_timeout_ns; /* age at which an entry counts as timed out; 0 disables aging */
    bool promotion_per_entry;      /* false (TENT default): an aged head promotes its whole tier */
};

/* ORB_QOS_PROMOTION_TIMEOUT_NS, head-only. */
void orb_qos_config_default(struct orb_qos_config *cfg);

struct orb_qos_set {
    struct orb_qos_entry *head[ORB_QOS_NPRIO];
    struct orb_qos_entry *tail[ORB_QOS_NPRIO];
    size_t count[ORB_QOS_NPRIO];
    struct orb_qos_config cfg;
    struct orb_clock clock;
    uint64_t next_check_ns;        /* earliest time of the next promotion pass */
    uint64_t promoted;             /* entries moved up one tier, lifetime */
};

/* Initialise an empty set (embedded by the worker; nothing to free). `clock` is copied.
 * Errors: ORB_EINVAL (NULL argument). */
int orb_qos_set_init(struct orb_qos_set *set, const struct orb_qos_config *cfg,
                     const struct orb_clock *clock);

/* Append entries[0..n) to their tiers in array order (a batch keeps its order), stamping each
 * with the same enqueue time from the clock. All or nothing: nothing is linked unless every
 * entry is valid. Errors: ORB_EINVAL (NULL, priority out of range), ORB_EBUSY (an entry is
 * already queued, or appears twice). */
int orb_qos_enqueue(struct orb_qos_set *set, struct orb_qos_entry *const *entries, size_t n);

/* Append one entry keeping its existing enqueue_ns (a retried slice keeps its age).
 * Errors: as orb_qos_enqueue. */
int orb_qos_requeue(struct orb_qos_set *set, struct orb_qos_entry *entry);

/* Put entries[0..n) back at the front of their tiers, in array order (entries[0] first),
 * keeping their enqueue_ns: the undo of orb_qos_pop_tier() after the caller reordered what it
 * took. All or nothing, as orb_qos_enqueue. Errors: as orb_qos_enqueue. */
int orb_qos_push_front(struct orb_qos_set *set, struct orb_qos_entry *const *entries, size_t n);

/* Remove the head of the most urgent non-empty tier whose bit (1 << priority) is set in
 * `allowed_tiers`; NULL when none. The entry is the caller's again. */
struct orb_qos_entry *orb_qos_pop(struct orb_qos_set *set, unsigned allowed_tiers);

/* The entry orb_qos_pop() would remove now, left queued; NULL when none. */
struct orb_qos_entry *orb_qos_peek(const struct orb_qos_set *set, unsigned allowed_tiers);

/* The number of entries queued in every tier. */
size_t orb_qos_total(const struct orb_qos_set *set);

/* A worker pass: from the most urgent non-empty allowed tier only, remove up to `max` entries
 * in FIFO order into out[]. Returns how many. */
size_t orb_qos_pop_tier(struct orb_qos_set *set, unsigned allowed_tiers,
                        struct orb_qos_entry **out, size_t max);

/* What orb_qos_take_where()'s filter says of one entry. */
enum orb_qos_take { ORB_QOS_LEAVE = 0, ORB_QOS_TAKE = 1, ORB_QOS_STOP = 2 };

/* Walk the allowed tiers, most urgent first, each in FIFO order, asking `filter` of every entry:
 * ORB_QOS_TAKE unlinks it into out[] (in walk order), ORB_QOS_LEAVE leaves it queued where it is
 * and goes on, ORB_QOS_STOP ends the walk (the entry stays). The walk also ends once `max` are
 * taken. For a worker whose head entry cannot go now (its destination is full) while entries
 * behind it could: the others are not held back. The filter must not change the set. Returns
 * how many were taken (0 on a NULL argument). */
size_t orb_qos_take_where(struct orb_qos_set *set, unsigned allowed_tiers,
                          enum orb_qos_take (*filter)(void *ctx, struct orb_qos_entry *e), void *ctx,
                          struct orb_qos_entry **out, size_t max);

/* Unlink a queued entry (cancellation). O(tier length).
 * Errors: ORB_EINVAL (NULL), ORB_ENOENT (not queued in this set). */
int orb_qos_remove(struct orb_qos_set *set, struct orb_qos_entry *entry);

/* One aging pass, at most once per ORB_QOS_PROMOTION_CHECK_NS (earlier calls return 0):
 * Medium -> High first; only if nothing moved, Low -> Medium. Promoted entries join the tail
 * of the next tier in their order and keep enqueue_ns. Head-only mode moves a whole tier when
 * its head timed out; per-entry mode moves exactly the timed-out entries. An entry times out
 * when enqueue_ns != 0 and now - enqueue_ns >= timeout. Returns the number moved. */
size_t orb_qos_promote(struct orb_qos_set *set);

static inline size_t orb_qos_count(const struct orb_qos_set *set, enum orb_qos_priority p)
{
    return set->count[p];
}

/* ---- deadline arbitration and admission --------------------------------------------------- */

/* TENT's DeadlineMlu: predicted transfer time over the remaining window,
 *   ((bytes_ahead + length) / bw_bytes_per_s) / ((deadline_ns - now_ns) / 1e9).
 * No deadline (0 or UINT64_MAX) or bw not > 0 (including NaN) gives 0: nothing to predict.
 * A deadline at or before now gives DBL_MAX: infinitely urgent. */
double orb_qos_deadline_mlu(uint64_t bytes_ahead, uint64_t length, uint64_t deadline_ns,
                            uint64_t now_ns, double bw_bytes_per_s);

/* Reusable sorting buffers for up to `capacity` candidates per call (allocated once, so that
 * arbitration allocates nothing per dispatch). Owned by one worker. */
struct orb_qos_arbiter;

/* Errors: ORB_EINVAL (capacity 0 or over 1 << 20), ORB_ENOMEM. */
int orb_qos_arbiter_new(uint32_t capacity, struct orb_qos_arbiter **out);
void orb_qos_arbiter_free(struct orb_qos_arbiter *arb);

/* Reorder cands[0..n) in place, most urgent first, for one local NIC and one tier.
 * `bytes_ahead` is what the NIC owes outside `cands` (posted plus unposted grant bytes); each
 * slot is scored behind the bytes of the slots before it. The first ORB_QOS_GREEDY_PICKS
 * slots are chosen greedily (highest DeadlineMlu, ties to the earlier candidate); the rest are
 * ranked once against the bytes accumulated by then, ties kept in FIFO order. Unknown
 * bandwidth (bw not > 0) leaves the order untouched.
 * Errors: ORB_EINVAL (NULL, candidates of different NICs or tiers), ORB_ERESOURCE (n over the
 * arbiter's capacity); cands is unchanged on error. */
int orb_qos_arbitrate(struct orb_qos_arbiter *arb, struct orb_qos_entry **cands, size_t n,
                      uint64_t bytes_ahead, double bw_bytes_per_s, uint64_t now_ns);

enum orb_qos_verdict {
    ORB_QOS_ADMIT = 0,          /* predicted to fit, or nothing to predict */
    ORB_QOS_ADMIT_UNMEASURED,   /* left eligible: a NIC lacks a sample or recovery owns the route */
    ORB_QOS_DROP_EXPIRED,       /* the deadline has already passed */
    ORB_QOS_DROP_INFEASIBLE     /* DeadlineMlu >= threshold */
};

struct orb_qos_admission {
    uint64_t bytes_ahead;       /* dispatched, unfinished RDMA payload bytes */
    uint64_t length;            /* this owner's payload bytes */
    uint64_t deadline_ns;       /* 0 or UINT64_MAX: none */
    uint64_t now_ns;
    double bw_bytes_per_s;      /* sum of transmit estimates of healthy NICs the owner's mask allows */
    double mlu_threshold;       /* e.g. 1.5; must be > 0 and finite */
    bool nic_unmeasured;        /* an eligible NIC has no rate and no transmit sample */
    bool recovery_owns_route;   /* the route snapshot is being recovered */
};

/* The pre-dispatch decision, same DeadlineMlu as arbitration. Order of the rules: no deadline
 * admits; a passed deadline drops (a fact, needing no estimate); an unmeasured NIC, a route in
 * recovery or unknown bandwidth leave the owner eligible; otherwise MLU >= threshold drops.
 * `mlu_out` (may be NULL) receives the computed MLU (0 when not computed).
 * Errors: ORB_EINVAL (NULL input, threshold not > 0 or not finite). */
int orb_qos_admit(const struct orb_qos_admission *in, enum orb_qos_verdict *verdict,
                  double *mlu_out);

#endif
