/* Internal: the engine object, shared by engine.c, segment.c and batch.c (not by transports). */
#ifndef ORB_CORE_ENGINE_INTERNAL_H
#define ORB_CORE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine.h"
#include "metrics.h"
#include "transport.h"

struct orb_batch;
struct orb_metrics_http;

struct orb_notification_node {
    struct orb_notification_node *next;
    struct orb_notification_msg msg;
};

/* One started transport. */
#define ORB_TP_WHY_MAX 192

struct orb_tp_slot {
    const struct orb_transport_ops *ops; /* NULL: not started (absent, or not on this host) */
    void *state;
    char absent_why[ORB_TP_WHY_MAX];     /* why start() said "not here"; "" otherwise */
};

struct orb_engine {
    struct orb_engine_config cfg;
    struct orb_epoch epoch;
    struct orb_registry *registry;
    struct orb_reaper *reaper;   /* the release thread: owners' callbacks run there */
    /* By transport id. TCP is always present: it is also the control connection (HELLO,
     * describe, notifications, and the other transports' handshakes). */
    struct orb_tp_slot tp[ORB_TRANSPORT_SLOTS];
    struct orb_reg_hooks reg_hooks;
    struct orb_rdma_config *rdma_cfg; /* the engine's copy; NULL: no RDMA transport wanted */

    /* The user's handle + one per open segment and live batch: the struct (and the transport
     * state that segments point into) outlives orb_engine_free() while they exist. */
    atomic_uint_fast64_t refs;
    atomic_int source_open;
    atomic_int requester_open;
    atomic_uint live_batches;
    /* Waiters may spin (busy_poll_us) only when the engine's threads and the waiter fit the
     * CPUs this process may run on: a spinning caller must never take the CPU from the worker
     * whose completion it waits for. */
    int spin_allowed;
    /* Whether a waiting caller may poll a transport's completions itself (peer_poll): with
     * busy_poll_us and at least two CPUs, one for the caller and one for the peer it waits on. */
    int poll_allowed;

    struct orb_metrics_counters metrics; /* counters of orb_engine_metrics() */
    /* The Prometheus exporter (ORB_ENGINE_PARAM_METRICS), NULL without one or once stopped. */
    _Atomic(struct orb_metrics_http *) http;

    pthread_mutex_t lock;     /* guards the fields below */
    int stopped;              /* the transport was stopped: no more I/O */
    int unquiesced;           /* close could not prove quiescence: never free */
    struct orb_notification_node *notes_head, *notes_tail;
    uint32_t notes_count;
    struct orb_batch *reap;   /* finished orphaned batches waiting to be freed outside callbacks */
    struct orb_stager *stager; /* host staging, made on first use (orb_engine_stager) */
    int stager_failed;        /* it could not be made: later staged requests fail at once */
    struct orb_stage_pool *stage_pool; /* host staging chunks, shared by the stager and transports */
};

/* orb_engine_create_params() with other operation tables (tests use scripted ones). `rdma` may
 * be NULL (no RDMA settings). `ops[0..n)` go into the slots their ids name; one of them must be
 * TCP. A table whose start() answers ORB_TP_NOT_HERE is left out; any failure fails the
 * creation. */
int orb_engine_create_with(const struct orb_engine_config *cfg, const struct orb_rdma_config *rdma,
                           const struct orb_transport_ops *const *ops, size_t n, orb_engine **out);

void orb_engine_ref(orb_engine *engine);

/* The engine's stager (stager.h), made on first use; NULL when it cannot be made (the detail
 * message says why) or the engine is stopped. */
struct orb_stager *orb_engine_stager(orb_engine *engine);
void orb_engine_unref(orb_engine *engine);


/* Park a finished batch whose user handle is gone; freed by orb_engine_reap(). Safe to call
 * from transport callbacks (takes only the engine lock). */
void orb_engine_defer_free(orb_engine *engine, struct orb_batch *batch);
/* Free parked batches. Never call from a transport callback. */
void orb_engine_reap(orb_engine *engine);

/* batch.c */
void orb_batch_destroy(struct orb_batch *batch);
struct orb_batch *orb_batch_reap_next(struct orb_batch *batch);
void orb_batch_set_reap_next(struct orb_batch *batch, struct orb_batch *next);

/* segment.c */
struct orb_segment {
    atomic_uint_fast64_t refs;   /* the user's handle + one per batch */
    orb_engine *engine;          /* referenced */
    /* One peer per transport of the engine, by transport id; NULL where that transport has no
     * path to this peer (peer_status says why). The TCP peer always exists. */
    void *peer[ORB_TRANSPORT_SLOTS];
    int peer_status[ORB_TRANSPORT_SLOTS];
    char peer_why[ORB_TRANSPORT_SLOTS][ORB_TP_WHY_MAX]; /* the detail of a failed peer_open */
    struct orb_control_path control;   /* over the TCP peer, for the other transports */
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch expected;
};
/* The transport slot that carries a request asking for `requested` on `segment`: that one when
 * the segment has a path on it, the best one with a path for ORB_TRANSPORT_UNSPEC.
 * Errors: ORB_EINVAL (unknown transport), ORB_EUNAVAILABLE (the message says why). */
int orb_segment_pick(const struct orb_segment *segment, enum orb_transport requested,
                     unsigned *slot_out);
/* For ORB_TRANSPORT_UNSPEC, once the local range is pinned: a transport preferred to `slot`
 * (orb_segment_pick's choice) that takes only some requests and accepts this one (asking its
 * peer by `deadline` at the latest), else `slot`. */
unsigned orb_segment_prefer(const struct orb_segment *segment, unsigned slot, const struct orb_reg *local, uint8_t op,
                            uint64_t remote_addr, uint64_t length, uint64_t deadline);
/* After the transport called the peer dead (ORB_EPEER): ask the endpoint once, briefly, whether
 * it now runs another epoch, so that a restarted peer is reported as ORB_ESTALE. Never replays
 * anything and never adopts the new process. Returns ORB_ESTALE or `status`. */
int orb_segment_classify_failure(struct orb_segment *segment, int status);
void orb_segment_ref(struct orb_segment *segment);
void orb_segment_unref(struct orb_segment *segment);

#endif
