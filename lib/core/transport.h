/* Internal: the transport operation table and the unit of work it moves (a slice, "xfer").
 *
 * The engine core knows no transport's internals: it checks and pins both ranges, cuts each
 * request into slices, hands the slices to a transport's peer, and counts completions. A
 * transport moves bytes and reports every accepted slice exactly once through orb_xfer_done(). */
#ifndef ORB_CORE_TRANSPORT_H
#define ORB_CORE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <orbite/orbite.h>

/* Lock order, outermost first. A thread holding one of these may take only those below it:
 *
 *   1. a transport's own locks (a TCP connection's lock, then its worker's inbox lock)
 *   2. a batch's lock                     (orb_xfer_done(), reports)
 *   3. the engine's lock                  (parking orphaned batches, notifications)
 *   4. the registry's table lock          (lookups and pins; pins are dropped without it)
 *   5. the release thread's queue lock    (handing over a retired registration's owner)
 *
 * Nothing calls outward: the core never calls a transport with a batch or engine lock held,
 * orb_xfer_done() never calls the transport, and no user code (release callbacks, log sinks
 * aside) runs under any of these locks. */

struct orb_batch;

enum orb_xfer_op {
    ORB_XFER_READ = ORB_OP_READ,   /* remote -> local */
    ORB_XFER_WRITE = ORB_OP_WRITE, /* local -> remote */
    ORB_XFER_NOTIFY = 2            /* local bytes delivered as a notification */
};

struct orb_xfer {
    struct orb_xfer *next;      /* free for the transport's queues while it owns the xfer */
    struct orb_batch *batch;    /* owner; opaque to transports */
    uint32_t request_index;     /* index of the request in its batch */
    uint8_t op;                 /* enum orb_xfer_op */
    uint8_t priority;           /* enum orb_priority (TCP does not schedule by it) */
    uint8_t *local;             /* CPU view of the local bytes (pinned by the batch) */
    uint64_t remote_addr;       /* unused for NOTIFY */
    uint64_t length;            /* > 0 */
    /* The whole request this slice belongs to, on the remote side: the source authorises that
     * range (one registration, the operation's permission) before it applies any slice of it.
     * Equal to remote_addr/length for a request of one slice; unused for NOTIFY. */
    uint64_t request_remote_addr;
    uint64_t request_length;
    uint64_t tag;               /* free for the transport */
};

/* Transports call this before putting the first byte of `x` on the wire. 0 means the batch
 * withdrew it (timeout or an earlier failure): the transport must not start it and completes it
 * with orb_xfer_done(x, ORB_ETIMEDOUT, ORB_REMOTE_EFFECT_NONE) or the status it prefers; the batch
 * counts it as never attempted. Call it exactly once per xfer, right before sending. */
int orb_xfer_may_start(struct orb_xfer *x);

/* Report the end of `x`, exactly once, from any thread. `status` is 0 or negative ORB_E*.
 * `effect` is ORB_REMOTE_EFFECT_UNKNOWN when a failed WRITE may have changed peer bytes (any of
 * its payload reached the socket and the source did not answer with an error). After this call
 * the transport must not touch x or x->local. It never calls back into the transport and never
 * runs user code (owners' release callbacks run on the engine's release thread), so transports
 * may call it with their own locks held. */
void orb_xfer_done(struct orb_xfer *x, int status, enum orb_remote_effect effect);

struct orb_transport_ops {
    enum orb_transport id;
    const char *name;

    /* Start workers and, if the engine's config enables it, the source service. */
    int (*start)(orb_engine *engine, void **tp_out);
    /* The bound source endpoint "host:port". ORB_EUNAVAILABLE without a source. */
    int (*endpoint)(void *tp, char *buf, size_t len);
    /* Fence source admission (no new connections or requests). Idempotent. */
    void (*close_source)(void *tp);
    /* Stop: join workers, close every socket, complete every pending xfer with ORB_ECLOSED.
     * After it returns no transport thread touches any memory. Idempotent. */
    void (*stop)(void *tp);
    /* Free after stop(). */
    void (*destroy)(void *tp);
    /* Outstanding work touching memory (source ops in progress + requester xfers accepted). */
    uint64_t (*inflight)(void *tp);

    /* Connect to a peer and prove its epoch. ORB_ESTALE on a wrong epoch. */
    int (*peer_open)(void *tp, const char *endpoint, const struct orb_epoch *expected,
                     uint64_t deadline, void **peer_out);
    int (*peer_describe)(void *peer, uint64_t deadline, struct orb_region_desc **regions_out,
                         size_t *count_out);
    /* Slice length for a request of `length` bytes (>= 1; the core cuts requests with it). */
    uint64_t (*peer_slice_len)(void *peer, uint64_t length);
    /* Queue `n` xfers. On 0 every xfer will be reported through orb_xfer_done(); on a negative
     * return (ORB_EPEER: the peer is known dead, ORB_ECLOSED) none was accepted. */
    int (*peer_submit)(void *peer, struct orb_xfer *const *xfers, size_t n);
    /* Drop the core's reference: connections close once their queues are empty. */
    void (*peer_release)(void *peer);
};

extern const struct orb_transport_ops orb_tcp_transport;

#endif
