/* Internal: the TCP transport's objects, shared by its source, requester and worker files.
 *
 * Threads: `tcp_workers` epoll workers own every connection's I/O (connections are spread over
 * them round-robin). A requester connection's send side may also be driven by a submitting
 * thread (one sender at a time, see struct tcp_req_conn); everything else about a connection
 * runs on its worker. */
#ifndef ORB_TCP_INTERNAL_H
#define ORB_TCP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/engine.h"
#include "core/transport.h"
#include "tcp_conn.h"

#define TCP_MAX_STRIPES 16u
#define TCP_MAX_WORKERS 16u
#define TCP_TX_BATCH 16u          /* requester frames gathered into one sendmsg() */
#define TCP_PREFIX_MAX 56u        /* header + fixed body of a requester frame */
#define TCP_SCRATCH_LEN (64u << 10) /* per-worker sink for refused WRITE payloads */
#define TCP_SCAN_NS (250ull * 1000 * 1000) /* timeout / fence checks */
#define TCP_TURN_BYTES (2ull << 20)  /* a worker's budget for one connection before the next */
#define TCP_DIRECT_SEND_BYTES (2ull << 20) /* a submitting thread sends at most this much itself */
#define TCP_SLICE_ALIGN (64ull << 10)
#define TCP_ACCEPT_BATCH 16u      /* connections accepted before other events get a turn */

/* Internal ops travelling in a requester connection's xfer queue: a caller waits for each. */
#define TCP_OP_DESCRIBE 0x80u
#define TCP_OP_CONTROL 0x81u     /* another transport's control message; its body is notify_data */
#define TCP_OP_IS_CALL(op) ((op) == TCP_OP_DESCRIBE || (op) == TCP_OP_CONTROL)

#define TCP_CONTAINER_OF(ptr, type, member) \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

struct tcp_transport;

struct tcp_worker {
    struct tcp_transport *tp;
    uint32_t index;
    int epfd;
    enum tcp_kind wake_kind;      /* epoll data of the eventfd */
    int wakefd;
    pthread_t thread;
    int thread_started;
    atomic_int scan_requested;    /* look at every connection (fence, release, send error) */

    pthread_mutex_t lock;         /* guards inbox, pokes and exiting */
    struct tcp_conn *inbox;       /* handed over, not adopted yet */
    struct tcp_conn *pokes;       /* adopted connections to serve again soon (any thread asks) */
    int exiting;                  /* no more handovers */

    /* Worker thread only: */
    struct tcp_conn *conns;       /* adopted connections */
    struct tcp_conn *ready_head, *ready_tail; /* spent their turn with work left */
    uint64_t turn_left;           /* budget of the connection being served */
    uint8_t *scratch;             /* TCP_SCRATCH_LEN bytes */
};

struct tcp_transport {
    orb_engine *engine;
    atomic_uint_fast64_t refs;        /* the owner (destroy) + one per live peer */

    /* Copied from the engine's configuration at start. */
    uint32_t nstripes;                /* to a peer on another host */
    uint32_t local_stripes;           /* to a peer on this host (<= TCP_MAX_STRIPES) */
    uint64_t stripe_threshold;
    uint32_t socket_buffer;
    uint64_t io_timeout_ns;           /* 0: never */
    uint64_t hello_timeout_ns;        /* a stranger's time to complete HELLO */
    uint32_t max_connections;         /* authenticated source connections */
    uint32_t max_strangers;           /* source connections that have not completed HELLO */

    uint32_t nworkers;
    struct tcp_worker *workers;
    atomic_uint next_worker;

    /* Source service. */
    int has_source;
    enum tcp_kind listen_kind;        /* epoll data of the listener */
    int listen_fd;                    /* owned by worker 0; -1 once closed */
    char endpoint[TCP_NAME_MAX];
    atomic_int source_closed;
    atomic_uint source_conns;         /* every live source connection */
    atomic_uint authed_conns;         /* those that completed HELLO (max_connections) */
    /* Strangers, source connections that have not completed HELLO, live on worker 0 (the
     * listener's) in accept order, so that the oldest can be dropped for a new one. Worker 0
     * only: */
    struct tcp_source_conn *strangers_head, *strangers_tail;
    uint32_t nstrangers;
    int listen_more;                  /* the accept loop stopped at its batch, not at EAGAIN */

    atomic_int stopping;
    atomic_int calls_abandoned;    /* the engine stops: calls stop waiting (tcp_abandon_calls) */
    pthread_mutex_t stop_lock;        /* serialises stop() */
    int stopped;                      /* stop_lock */

    atomic_uint_fast64_t inflight_xfers; /* accepted requester xfers not yet completed */
    atomic_uint_fast64_t source_pins;    /* source operations holding a registration pin */
};

/* ---- tcp_transport.c ------------------------------------------------------------------------ */

/* The worker for the next connection (round-robin). */
struct tcp_worker *tcp_next_worker(struct tcp_transport *tp);
/* Give `c` to `w` (any thread). ORB_ECLOSED when the worker is exiting: `c` stays the caller's. */
int tcp_worker_handover(struct tcp_worker *w, struct tcp_conn *c);
/* Ask `w` to look at every connection soon (any thread). */
void tcp_worker_kick(struct tcp_worker *w);
/* Ask `w` to serve `c` again soon (any thread; `c` must be adopted by `w` and not yet
 * forgotten). The cheap way for an application thread to hand work back to a worker: the worker
 * never waits for an application thread, it defers and is poked. */
void tcp_worker_poke(struct tcp_worker *w, struct tcp_conn *c);
/* Adopt `c` on `w` at once (its epoll set, its list) and serve it one turn (worker thread of
 * `w`). Returns 0, or -1 when `c` was torn down (do not use it). */
int tcp_worker_adopt_now(struct tcp_worker *w, struct tcp_conn *c);
/* Serve `c` again after the other ready connections (worker thread). */
void tcp_worker_defer(struct tcp_worker *w, struct tcp_conn *c);
/* Unregister and unlink `c` from its worker, poke list included (worker thread; does not close
 * the fd). */
void tcp_worker_forget(struct tcp_worker *w, struct tcp_conn *c);
void tcp_transport_unref(struct tcp_transport *tp);
/* 1 while the source admits connections and requests. */
int tcp_source_admits(struct tcp_transport *tp);

/* ---- tcp_source.c --------------------------------------------------------------------------- */

int tcp_source_listen(struct tcp_transport *tp);
/* Accept up to TCP_ACCEPT_BATCH connections; sets tp->listen_more when more may be waiting. */
void tcp_listener_on_event(struct tcp_worker *w);
void tcp_listener_close(struct tcp_transport *tp);
struct tcp_source_conn;
void tcp_source_conn_on_event(struct tcp_source_conn *s, uint32_t events);
/* Fence and timeout checks (worker thread). */
void tcp_source_conn_scan(struct tcp_source_conn *s, uint64_t now);
/* Close, release every pin and free (worker thread). */
void tcp_source_conn_kill(struct tcp_source_conn *s, const char *why);

/* ---- tcp_requester.c ------------------------------------------------------------------------ */

struct tcp_req_conn;
void tcp_req_conn_on_event(struct tcp_req_conn *c, uint32_t events);
/* Release, send-error, deferred-completion and timeout checks (worker thread). */
void tcp_req_conn_scan(struct tcp_req_conn *c, uint64_t now);
/* Close and complete everything queued with `status` (worker thread). */
void tcp_req_conn_kill(struct tcp_req_conn *c, int status);

int tcp_peer_open(void *tp, const char *endpoint, const struct orb_epoch *expected,
                  uint64_t deadline, const struct orb_control_path *ctl, void **peer_out);
int tcp_peer_lost(void *peer);
void tcp_abandon_calls(void *tp);
int tcp_peer_control(void *peer, uint8_t transport, const uint8_t *req, size_t len, uint8_t *resp,
                     size_t cap, size_t *resp_len, uint64_t deadline);
int tcp_peer_describe(void *peer, uint64_t deadline, struct orb_region_desc **regions_out,
                      size_t *count_out);
uint64_t tcp_peer_slice_len(void *peer, uint64_t length);
int tcp_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan);
int tcp_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n);
void tcp_peer_release(void *peer);

#endif
