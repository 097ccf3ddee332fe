/* Internal: the transport operation table, the unit of work it moves (a piece of a request,
 * "xfer"), the plan that cuts a request into pieces, and per-transport registration state.
 *
 * The engine core knows no transport's internals. For each request it checks and pins the local
 * range, asks the request's transport once for a plan (pieces, each with its rail), hands the
 * pieces to that transport's peer, and counts completions. A transport moves bytes and reports
 * every accepted piece exactly once through orb_xfer_done(). A piece names its local bytes as a
 * registration, an offset into it and a memory kind, never as a CPU pointer: device memory has
 * none, and an RDMA transport needs the registration's keys, not an address. */
#ifndef ORB_CORE_TRANSPORT_H
#define ORB_CORE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <orbite/orbite.h>

#include "registry.h"

/* Lock order, outermost first. A thread holding one of these may take only those below it:
 *
 *   1. a transport's own locks (a TCP connection's lock, then its worker's inbox lock)
 *   2. a batch's lock                     (orb_xfer_done(), reports)
 *   3. the engine's lock                  (parking orphaned batches, notifications)
 *   4. the registry's writer lock, then its table lock (lookups and pins; pins drop without it)
 *   5. the release thread's queue lock    (handing over a retired registration)
 *   leaves: a memory kind's locks (a device allocation's loan, copy and readiness locks) and
 *           the stager's queue lock, taken under any of the above, holding nothing else
 *
 * Nothing calls outward: the core never calls a transport with a batch or engine lock held,
 * orb_xfer_done() never calls the transport, and no user code (release callbacks, log sinks
 * aside) runs under any of these locks. A registration's per-transport state is created by
 * reg_attach() on the registering thread, under the registry's writer lock only, and retired by
 * reg_retire() on the engine's release thread with no lock held. */

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
    uint8_t priority;           /* enum orb_priority */
    uint8_t mem_kind;           /* enum orb_mem_kind of local_reg (HOST for a notification) */
    uint8_t reserved0;
    uint32_t rail;              /* the plan's rail for this piece (0 for transports without); a
                                 * transport that chooses rails at dispatch rewrites it then */
    uint32_t piece_index;       /* position in the request's plan */
    /* The local bytes: [local_offset, +length) of local_reg, pinned by the batch until the xfer
     * is reported done. NULL for a notification, whose bytes are notify_data. */
    struct orb_reg *local_reg;
    uint64_t local_offset;
    const uint8_t *notify_data; /* NOTIFY only: the payload, owned by the batch */
    /* Host staging standing in for local bytes without a CPU view (stager.h): set by the core
     * before the transport gets the piece, for the piece's whole life; the transport moves the
     * bytes there instead (orb_xfer_local_cpu() returns it). NULL otherwise. */
    uint8_t *stage;
    uint64_t remote_addr;       /* unused for NOTIFY */
    uint64_t length;            /* > 0 */
    /* The whole request this piece belongs to, on the remote side: the source authorises that
     * range (one registration, the operation's permission) before it applies any piece of it.
     * Equal to remote_addr/length for a request of one piece; unused for NOTIFY. */
    uint64_t request_remote_addr;
    uint64_t request_length;
    /* The transport's per-request space (ops->request_private_size bytes, zeroed before the
     * plan, shared by every piece of the request, freed by the core after the last piece ends);
     * NULL when the transport asks for none. */
    void *request_private;
    uint64_t tag;               /* free for the transport */
    /* When the caller stops waiting for the request: orb_submit_and_wait's deadline, or
     * ORB_DEADLINE_NONE (an asynchronous batch). For ordering only; the core enforces it. */
    uint64_t deadline_ns;
};

/* The CPU address of the xfer's first local byte, or NULL when its memory kind has no CPU view
 * (device memory: the transport stages it or uses the registration's keys). */
static inline uint8_t *orb_xfer_local_cpu(const struct orb_xfer *x)
{
    if (x->op == ORB_XFER_NOTIFY || x->local_reg == NULL)
        return (uint8_t *)(uintptr_t)x->notify_data;
    if (x->stage != NULL)
        return x->stage;
    const struct orb_reg *reg = x->local_reg;
    return (uint8_t *)reg->kind->cpu_view(reg, reg->base + x->local_offset);
}

/* Transports call this before putting the first byte of `x` on the wire. 0 means the batch
 * withdrew it (timeout or an earlier failure): the transport must not start it and completes it
 * with orb_xfer_done(x, ORB_ETIMEDOUT, ORB_REMOTE_EFFECT_NONE) or the status it prefers; the batch
 * counts it as never attempted. Call it exactly once per xfer, right before sending. */
int orb_xfer_may_start(struct orb_xfer *x);

/* Report the end of `x`, exactly once, from any thread. `status` is 0 or negative ORB_E*.
 * `effect` is ORB_REMOTE_EFFECT_UNKNOWN when a failed WRITE may have changed peer bytes (any of
 * its payload reached the peer and the source did not answer with an error). After this call
 * the transport must not touch x, its local bytes or its request_private space. It never calls
 * back into the transport and never runs user code: a registration whose last pin it drops is
 * retired (reg_retire, owners' release callbacks) on the engine's release thread. So transports
 * may call it with their own locks held. */
void orb_xfer_done(struct orb_xfer *x, int status, enum orb_remote_effect effect);
/* The same with the failure's cause (copied; NULL or "" for none): the batch's report message
 * names it when this request is the batch's first failure, so the caller learns why (a budget,
 * the device's completion status, the source's answer) and not only the status. */
void orb_xfer_done_why(struct orb_xfer *x, int status, enum orb_remote_effect effect, const char *why);

/* ---- plans ----------------------------------------------------------------------------------- */

/* Most pieces one request may be cut into: every piece is an xfer the core allocates. */
#define ORB_PLAN_MAX_PIECES (1u << 24)
/* Pieces a plan holds without an allocation. */
#define ORB_PLAN_INLINE 4

struct orb_plan_piece {
    uint64_t offset;            /* from the start of the request */
    uint64_t length;            /* > 0 */
    uint32_t rail;              /* copied into the xfer */
    uint32_t reserved;
};

/* What a transport plans from: one checked request whose local range is pinned. */
struct orb_plan_input {
    uint8_t op;                 /* enum orb_xfer_op: READ or WRITE */
    uint8_t priority;           /* enum orb_priority */
    uint8_t mem_kind;           /* enum orb_mem_kind of the local registration */
    uint64_t length;            /* > 0 */
    uint64_t remote_addr;
    const struct orb_reg *local_reg;
    uint64_t local_offset;
    void *request_private;      /* zeroed request_private_size bytes, or NULL */
};

/* A plan: the transport fills it through orb_plan_pieces(), once per request. The pieces must
 * lie back to back in offset order from 0 and cover exactly the request's length; the core
 * checks that and refuses the request (ORB_EINVAL naming the transport) otherwise, so a
 * transport's mistake can never make the core write past what it allocated. */
struct orb_plan {
    uint32_t count;
    struct orb_plan_piece *pieces;                     /* inline_pieces or a heap array */
    struct orb_plan_piece inline_pieces[ORB_PLAN_INLINE];
};

/* Storage for `count` pieces (1..ORB_PLAN_MAX_PIECES) of `plan`, which then holds `count`
 * pieces whose contents the transport writes. Call it once per plan. Errors: ORB_EINVAL (count
 * 0, above the maximum, or storage already taken), ORB_ENOMEM. */
int orb_plan_pieces(struct orb_plan *plan, uint32_t count, struct orb_plan_piece **out);

/* Cut [0, length) into pieces of `piece_len` bytes (the last may be shorter), all on rail 0:
 * the plan of transports that slice evenly. piece_len 0 or above length means one piece.
 * Errors: as orb_plan_pieces() (ORB_ERESOURCE when the count would exceed the maximum). */
int orb_plan_even(struct orb_plan *plan, uint64_t length, uint64_t piece_len);

/* ---- the operation table ---------------------------------------------------------------------- */

/* ---- the control path ------------------------------------------------------------------------ */

/* Largest control message one transport sends another engine's same transport (and its answer). */
#define ORB_CONTROL_MAX 4096u

/* How a transport other than TCP talks to its counterpart at the source: through the segment's
 * TCP control connection (wire CONTROL_REQ/CONTROL_RESP), request and answer. Given to peer_open;
 * valid until that peer is released. */
struct orb_control_path {
    void *peer; /* the segment's TCP peer */
    /* Send `req` (1..ORB_CONTROL_MAX bytes) to the source engine's `transport` and wait, until
     * `deadline`, for its answer in `resp` (cap >= ORB_CONTROL_MAX). Errors: the source's refusal
     * (its status and message), ORB_ETIMEDOUT, ORB_EPEER (the connection died), ORB_ECLOSED,
     * ORB_EINVAL, ORB_ENOMEM. Thread-safe; calls from several threads queue on the connection. */
    int (*call)(void *peer, uint8_t transport, const uint8_t *req, size_t len, uint8_t *resp, size_t cap,
                size_t *resp_len, uint64_t deadline);
    /* 0 while the connection lives; once it died, why (ORB_EPEER: lost, so the source may have
     * been restarted; ORB_EPROTO, ...). Never blocks. */
    int (*lost)(void *peer);
};

/* start()'s answer for a transport that is not on this host (positive: not an error). */
#define ORB_TP_NOT_HERE 1

struct orb_transport_ops {
    enum orb_transport id;      /* its slot in the engine's array */
    const char *name;
    /* Bytes of per-request space the core provides to this transport (0: none). */
    size_t request_private_size;
    /* 1: the transport moves local bytes through the CPU only; the core stages local memory
     * without a CPU view for it (stager.h), in pieces the transport plans no longer than
     * ORB_STAGE_CHUNK. 0: the transport takes such memory itself, or refuses it in its plan. */
    int stages_through_cpu;
    /* 1: with stages_through_cpu 0, the transport moves memory without a CPU view itself (its own
     * staging or device registration), so ORB_TRANSPORT_UNSPEC may give it such requests. 0: it
     * does not, and UNSPEC takes TCP for them (unless a transport with peer_accepts takes them). */
    int moves_device_memory;

    /* Start workers and, if the engine's config enables it, the source service. 0: started;
     * ORB_TP_NOT_HERE: not on this host (not asked for, no device, library missing: the detail
     * message says which), and the engine carries on without it; a negative ORB_E* fails the
     * engine's creation (the configuration asked for something this host cannot honour). */
    int (*start)(orb_engine *engine, void **tp_out);
    /* The bound source endpoint "host:port". ORB_EUNAVAILABLE without a source. Only the control
     * transport (TCP) has one; may be NULL for others. */
    int (*endpoint)(void *tp, char *buf, size_t len);
    /* Fence source admission (no new connections or requests). Idempotent. */
    void (*close_source)(void *tp);
    /* Stop: join workers, close every connection, complete every pending xfer with ORB_ECLOSED.
     * 0: quiescence is proven: no transport thread and no device touches any memory the
     * transport was given, and every pending xfer was completed. ORB_EUNQUIESCED (the detail
     * message says what is left): not proven by `deadline` (or by the transport's own drain
     * window): the work whose end is unproven stays pending and its memory, registrations and
     * loans stay held; the caller may call stop again, which keeps waiting until its new
     * deadline. Once it returned 0, further calls return 0. */
    int (*stop)(void *tp, uint64_t deadline);
    /* Before any transport stops: calls waiting on this transport's connections (control
     * messages, descriptions) end now with ORB_ECLOSED instead of waiting out their deadlines,
     * so that another transport's stop is not held up by one of them. NULL: none to cut. */
    void (*abandon_calls)(void *tp);
    /* Free after stop(), once every registration's state was retired. */
    void (*destroy)(void *tp);
    /* Outstanding work touching memory (source ops in progress + requester xfers accepted). */
    uint64_t (*inflight)(void *tp);

    /* Per-registration state (memory regions, keys), optional. reg_attach runs before the
     * registration becomes visible and writes what it created to *state_out; a failure refuses
     * the registration (nothing of it becomes visible). reg_retire undoes it after the last pin
     * of the registration dropped, on the engine's release thread, before the owner's bytes are
     * released. Both may block. reg_retire returns 0, or a negative ORB_E* when some of the
     * state could not be undone (a memory region the device refused to deregister): the
     * transport keeps that state, and the engine keeps the owner's bytes for the process's
     * lifetime rather than release memory a device may still access. */
    int (*reg_attach)(void *tp, const struct orb_reg *reg, void **state_out);
    int (*reg_retire)(void *tp, const struct orb_reg *reg, void *state);
    /* Optional: the ORB_GPU_ROUTE_* bits reg_attach registered `reg` by (its `state`), which a
     * Describe answer reports for it. */
    uint32_t (*reg_gpu_routes)(void *tp, const struct orb_reg *reg, const void *state);

    /* Connect to a peer and prove its epoch. `ctl` is the segment's control path (NULL for TCP,
     * which is it). ORB_ESTALE on a wrong epoch; ORB_EUNAVAILABLE when the peer has no
     * compatible path for this transport (the segment goes on without it). */
    int (*peer_open)(void *tp, const char *endpoint, const struct orb_epoch *expected,
                     uint64_t deadline, const struct orb_control_path *ctl, void **peer_out);
    /* The control transport (TCP) only, NULL for others: orb_control_path.call on `peer`. */
    int (*peer_control)(void *peer, uint8_t transport, const uint8_t *req, size_t len, uint8_t *resp,
                        size_t cap, size_t *resp_len, uint64_t deadline);
    /* The control transport only, NULL for others: orb_control_path.lost on `peer`. */
    int (*peer_lost)(void *peer);
    /* At the source: answer a control message that the engine `sender`'s same transport sent
     * (through orb_engine_control()). Writes at most `cap` (>= ORB_CONTROL_MAX) bytes. Runs on a
     * TCP source worker: it must finish promptly (no waiting on a peer). NULL: no control
     * messages. A negative return is sent back as the refusal, with the detail message. */
    int (*control)(void *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                   size_t cap, size_t *resp_len);
    /* The transport's public counters (struct orb_rdma_stats for RDMA); NULL: none. */
    int (*stats)(void *tp, void *out, size_t len);
    /* Its NICs' load (struct orb_rdma_nic_load[cap] for RDMA; out NULL and cap 0: the count
     * only); NULL: none. */
    int (*nic_load)(void *tp, void *out, size_t cap, size_t *count);
    /* The peer's published regions. Only the control transport (TCP) answers; may be NULL. */
    int (*peer_describe)(void *peer, uint64_t deadline, struct orb_region_desc **regions_out,
                         size_t *count_out);
    /* Plan one request, once: fill `plan` through orb_plan_pieces() (or orb_plan_even()) and,
     * if the transport keeps per-request state, in->request_private. */
    int (*peer_plan)(void *peer, const struct orb_plan_input *in, struct orb_plan *plan);
    /* ORB_TRANSPORT_UNSPEC asks this before it chooses the transport for a request (NULL: the
     * transport takes any request with a path): 1 when it would carry `op` between `local` (a
     * pinned registration) and the peer's [remote_addr, +length), 0 when another should. May
     * ask the peer over the control path, by `deadline` at the latest. */
    int (*peer_accepts)(void *peer, uint8_t op, const struct orb_reg *local, uint64_t remote_addr, uint64_t length,
                        uint64_t deadline);
    /* Queue `n` xfers. On 0 every xfer will be reported through orb_xfer_done(); on a negative
     * return (ORB_EPEER: the peer is known dead, ORB_ECLOSED) none was accepted. */
    int (*peer_submit)(void *peer, struct orb_xfer *const *xfers, size_t n);
    /* Drop the core's reference: connections close once their queues are empty. */
    void (*peer_release)(void *peer);
    /* Optional: a waiting caller's share of the work, for transports whose completions the
     * caller can take itself (shared-memory rings). BEGIN: a caller starts polling this peer
     * (the transport's own thread may stand back meanwhile); STEP: take what completed, report
     * it through orb_xfer_done() from the calling thread, never block; END: the caller stops
     * because what it waited for settled (it is likely back soon: the transport's thread may
     * take over a little later); HANDOFF: the caller stops but still waits, asleep (the
     * transport's thread takes over now). Returns, for STEP, 1 while this peer has requests in
     * flight, else 0; 0 for the others. NULL: nothing to poll. */
    int (*peer_poll)(void *peer, int step);
};

enum orb_poll_step { ORB_POLL_BEGIN = 0, ORB_POLL_STEP = 1, ORB_POLL_END = 2, ORB_POLL_HANDOFF = 3 };

extern const struct orb_transport_ops orb_tcp_transport;
extern const struct orb_transport_ops orb_rdma_transport;
extern const struct orb_transport_ops orb_nvlink_transport;
extern const struct orb_transport_ops orb_shm_transport;

#endif
