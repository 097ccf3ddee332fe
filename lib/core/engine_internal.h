/* Internal: the engine object, shared by engine.c, segment.c and batch.c (not by transports). */
#ifndef ORB_CORE_ENGINE_INTERNAL_H
#define ORB_CORE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine.h"
#include "transport.h"

struct orb_batch;

struct orb_notification_node {
    struct orb_notification_node *next;
    struct orb_notification_msg msg;
};

struct orb_engine {
    struct orb_engine_config cfg;
    struct orb_epoch epoch;
    struct orb_registry *registry;
    struct orb_reaper *reaper;   /* the release thread: owners' callbacks run there */
    const struct orb_transport_ops *tcp;
    void *tcp_state;

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

    pthread_mutex_t lock;     /* guards the fields below */
    int stopped;              /* the transport was stopped: no more I/O */
    int unquiesced;           /* close could not prove quiescence: never free */
    struct orb_notification_node *notes_head, *notes_tail;
    uint32_t notes_count;
    struct orb_batch *reap;   /* finished orphaned batches waiting to be freed outside callbacks */
};

/* orb_engine_create() with another operation table in the TCP slot (tests use a scripted one). */
int orb_engine_create_with(const struct orb_engine_config *cfg, const struct orb_transport_ops *tcp,
                           orb_engine **out);

void orb_engine_ref(orb_engine *engine);
void orb_engine_unref(orb_engine *engine);

/* The transport that carries a request's `transport` field. ORB_EUNAVAILABLE for transports
 * this build lacks. */
int orb_engine_pick_transport(orb_engine *engine, enum orb_transport requested,
                              const struct orb_transport_ops **ops_out);

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
    const struct orb_transport_ops *tp;
    void *peer;
    char endpoint[ORB_ENDPOINT_MAX];
    struct orb_epoch expected;
};
/* After the transport called the peer dead (ORB_EPEER): ask the endpoint once, briefly, whether
 * it now runs another epoch, so that a restarted peer is reported as ORB_ESTALE. Never replays
 * anything and never adopts the new process. Returns ORB_ESTALE or `status`. */
int orb_segment_classify_failure(struct orb_segment *segment, int status);
void orb_segment_ref(struct orb_segment *segment);
void orb_segment_unref(struct orb_segment *segment);

#endif
