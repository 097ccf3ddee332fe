/* Internal: the RDMA transport's data path, shared by rdma_link.c (contexts, links, the lane
 * thread), rdma_requester.c and rdma_source.c.
 *
 * A request, end to end (docs/wire-protocol.md, "RDMA"):
 *  1. peer_open: segments to one source process (endpoint and epoch) share one connection
 *     (struct rdma_peer; each segment is a struct rdma_seg on it). The first makes one RC queue
 *     pair per rail (rail k on its k-th open NIC) and sends CONNECT on its control connection;
 *     the source makes its queue pairs (rail k on its (k mod n)-th NIC), connects them and
 *     answers CONNECT_OK; the requester connects its own. An engine that stages gives each
 *     segment a connection of its own, and a request staged at either end gets queue pairs of
 *     its own for each grant (PGRANT_REQ; the connection's carry only the ACK).
 *  2. peer_plan cuts the request into TENT's slices (lib/topo/slicing.h), each on a rail.
 *  3. Once every piece is submitted, the grant thread asks for a GRANT: the source pins the one
 *     registration that contains the whole range with the operation's permission, binds a
 *     one-use window per rail to exactly that range and direction on that rail's queue pair,
 *     and answers with the keys only after every bind completed.
 *  4. The requester posts the READ/WRITE slices on their rails; when a rail's slices are done it
 *     posts a SEND_WITH_INV of the rail's key carrying the 141-byte BINDING.
 *  5. The source accepts a rail's end only for the exact binding and the invalidated key; when
 *     every rail ended it unpins and sends the ACK; the requester completes the request's
 *     pieces when its own sends completed and the ACK arrived.
 * A work completion in error, a refused post or a broken message fails the request (and the
 * link); a request whose ACK does not come within io_timeout_s fails with ORB_ETIMEDOUT.
 *
 * Threads: the lanes (num_lanes threads) each poll their CQ pair of every context and drive
 * their links' completions and posts; the grant
 * threads (RDMA_GRANT_THREADS) run the requesters' GRANT calls, several at once; the source's control messages run on a TCP source
 * worker and wait (bounded) only for their own binds. Lock order: a peer's or source
 * connection's lock, then a link's lock; nothing is called out with a link lock held. */
#ifndef ORB_RDMA_DATA_H
#define ORB_RDMA_DATA_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/transport.h"
#include "rdma/ctrl.h"
#include "rdma/extents.h"
#include "rdma/qp.h"
#include "rdma/reg_mrs.h"
#include "rdma/window.h"
#include "topo/lane_cpus.h"
#include "topo/qos.h"
#include "topo/rail.h"
#include "topo/selector.h"
#include "topo/slots.h"
#include "topo/slicing.h"

struct orb_rdma_tp;

#define RDMA_RQ_DEPTH 32u          /* receives per link: ACKs (requester), BINDINGs (source) */
/* A peer with requests past its grant queue asks for more only once this many places are free:
 * were it to ask whenever one is, a full peer would carry one request per grant round trip. */
#define RDMA_GRANT_MIN_ROOM (ORB_RDMA_GRANT_BATCH / 2u)
#define RDMA_MSG_SLOT 256u         /* bytes per receive or send message slot */
_Static_assert(ORB_RDMA_ACKS_LEN_MAX <= RDMA_MSG_SLOT && ORB_RDMA_BINDING_LEN <= RDMA_MSG_SLOT,
               "an ACK or a BINDING fits a message slot");
#define RDMA_BIND_WAIT_NS (5ull * 1000000000ull)
/* Pre-dispatch admission drops a request whose DeadlineMlu reaches this (TENT suggests 1.2-1.5). */
#define RDMA_ADMISSION_MLU 1.5
#define RDMA_DRAIN_NS (30ull * 1000000000ull) /* stop: the destruction window for the flushes of failed links */
/* A source gives an answered grant the requester's io_timeout_s (its own) and this much more
 * for its end: the requester gives up first and fails its queue pairs. */
#define RDMA_GRANT_GRACE_NS (2ull * 1000000000ull)
#define RDMA_GRANT_THREADS 4u     /* GRANT calls in flight at once (they overlap the data) */
/* GRANT calls in flight to one peer at once: a peer that stops answering holds at most this
 * many grant threads until its calls time out, and the others serve the other peers. */
#define RDMA_GRANT_THREADS_PER_PEER (RDMA_GRANT_THREADS / 2u)
#define RDMA_MAX_LANES 16u        /* num_lanes is capped here */

/* One request's staging (rdma_staging.c): an extent of the arena (host memory), or a chunk of the
 * engine's staging pool (device memory; `pooled`). cpu NULL: none. */
struct rdma_stage {
    uint8_t *cpu;
    uint64_t off, len;
    bool pooled;
    uint32_t chunk;                /* pooled: the chunk's index in the pool */
    const struct orb_memkind_ops *kind; /* pooled: the staged memory's kind (counts a kept chunk) */
    bool held;                     /* a device copy through it was not proven to end: never put back */
};

/* The staging arena (host memory under the Staged policy): max_staging_bytes, mapped and
 * registered on every open NIC on first use. Device memory is staged through the engine's
 * staging pool instead (core/stage_pool.h), which TCP shares: its chunks are registered on every
 * open NIC the first time this transport stages through them, and stay so until it stops. */
struct rdma_staging {
    pthread_mutex_t lock;
    pthread_cond_t cond;           /* an extent came back */
    uint32_t waiters;
    uint8_t *base;                 /* NULL until made */
    struct orb_rdma_reg_mrs *mrs;
    struct orb_rdma_reg_mrs *kept; /* a failed make whose MRs could not be undone */
    int made_rc;                   /* a failed make, remembered */
    char made_why[256];
    struct orb_rdma_extents ext;
    struct orb_rdma_reg_mrs **chunk_mrs; /* by pool chunk index (lock); NULL: not registered yet */
    uint32_t nchunks;
    uint32_t pooled_taken;               /* pool chunks this transport holds now (lock) */
};

/* A lane: one thread that alone posts on its links (one thread per queue pair's doorbell) and
 * polls its CQ pair of every context. Links are dealt to lanes round-robin, so a peer's rails
 * run on different lanes and a device's work scales with them. Lane 0 also scans ACK deadlines
 * and reaps released peers and connections. */
struct rdma_lane {
    struct orb_rdma_tp *tp;
    uint32_t index;
    pthread_t thread;
    bool started;
    struct orb_lane_cpus place;    /* its NUMA node and CPUs (lib/topo/lane_cpus.h); unbound: -1 */
    atomic_int kick;               /* work queued for it to post */
    _Atomic uint64_t retry_ns;     /* a shared slot held work back: drain again then (0: none) */
    struct orb_qos_arbiter *arb;   /* deadline_bw_arbitration: its sorting buffers; else NULL */
    struct orb_qos_entry **cands;  /* and the candidates it orders (LANE_ARBITRATE_MAX) */
    /* progress_mode event_driven: it sleeps in poll() on its completion channels and wake_fd
     * (an eventfd) once idle, with its CQs armed; a kick writes wake_fd while it sleeps. */
    bool events;
    int wake_fd;
    atomic_int sleeping;
    uint64_t next_reclaim_ns;      /* its progress recovery looks again then (its own thread's) */
    /* drain_lane's room for a snapshot of its links beyond 64 (its own thread's), as large as
     * the lane has needed, so that a kick reaches every link of it; todo_from: where a snapshot
     * cut short (no memory to grow it) goes on next time. */
    struct rdma_link **todo;
    uint32_t todo_cap, todo_from;
    /* on_send_wc's room for the WRs one completion retires (its own thread's), as large as the
     * largest retirement so far; a link's send queue depth bounds it. */
    struct rdma_retired *retired;
    uint32_t retired_cap;
};

/* A lane's completion queue pair that was replaced (progress recovery): it stays until the last
 * queue pair made on it is destroyed, then its lane destroys it. */
struct rdma_cq_pair {
    struct rdma_cq_pair *next;     /* the context's replaced pairs (tp->lock) */
    struct ibv_cq *scq, *rcq;
    uint32_t lane, gen;
    uint32_t links;                /* queue pairs still on it (tp->lock) */
};

/* Which of a lane's CQ pair is armed (rdma_ctx.armed). */
enum { RDMA_ARMED_SCQ = 1, RDMA_ARMED_RCQ = 2 };

/* One open NIC's data-path state. */
struct rdma_ctx {
    bool ready;                    /* CQs made, an address found: it can carry rails */
    uint32_t nic;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    /* Its address: the lane's monitor may change it (a GID that changed, a port back with
     * another MTU) under addr_lock; new queue pairs read it there. */
    pthread_mutex_t addr_lock;
    uint8_t port, gid_index;
    union ibv_gid gid;
    uint16_t lid;
    enum ibv_mtu mtu;
    bool paused;                   /* its port was not active when it was opened */
    bool async_events;             /* its async event descriptor is non-blocking: the monitor reads it */
    bool fatal;                    /* a fatal device or CQ event: its rail stays fenced (lane 0's) */
    struct orb_rdma_hca_limits hca;
    struct ibv_cq *scq[RDMA_MAX_LANES], *rcq[RDMA_MAX_LANES]; /* one pair per lane */
    struct ibv_comp_channel *chan[RDMA_MAX_LANES]; /* event_driven: each lane's pair reports here */
    /* event_driven, each lane's own: which of its pair (RDMA_ARMED_SCQ, _RCQ) is armed and has
     * not raised the event yet; only those need arming again, or can still raise one. */
    uint8_t armed[RDMA_MAX_LANES];
    uint32_t cqe;                  /* each CQ's capacity */
    uint32_t cqe_charged[RDMA_MAX_LANES]; /* WR slots of the links on each lane's pair (tp->lock) */
    /* Progress recovery (rdma_link.c, reclaim_lane). A lane whose pair reported an error is
     * broken: its queue pairs fail and the rail stays fenced. Once every queue pair on the pair
     * has failed and has nothing outstanding, the lane makes a new pair (generation gen + 1) and
     * the old one goes to `retired`; the PD, its windows and MRs stay. Under tp->lock but for
     * the atomics. */
    atomic_uint broken_lanes;
    uint32_t gen[RDMA_MAX_LANES];  /* each lane's pair's generation */
    uint32_t pair_links[RDMA_MAX_LANES]; /* queue pairs charged on each lane's current pair */
    struct rdma_cq_pair *retired;
    uint64_t reclaim_after_ns;     /* no replacement try before (one that failed waits a second) */
    int32_t only_lane;             /* every link of it goes on this lane (soft-RoCE); -1: any */
    pthread_mutex_t wlock;         /* the window pool */
    struct orb_rdma_window_pool windows;
};

enum rdma_role { RDMA_ROLE_REQUESTER = 1, RDMA_ROLE_SOURCE = 2 };

/* What a send WR's cookie points at when it is not a payload piece (tagged with bit 0). */
enum rdma_wr_kind { RDMA_WR_BIND = 1, RDMA_WR_SENDINV = 2 };
struct rdma_wr_ctx {
    uint8_t kind;
    uint8_t rail;
    void *owner;                   /* struct rdma_grant (BIND) or struct rdma_req (SENDINV) */
};
#define RDMA_COOKIE_CTX 1u
#define RDMA_COOKIE_ACK 2u         /* a source's ACK; bits 2.. its send slot (rdma_link_post_locked) */

/* A payload piece's place in its link's queue until the lane posts it: by priority (three
 * tiers with promotion, lib/topo/qos.h), first in first out within one. */
struct rdma_wait {
    struct orb_qos_entry qe;       /* first member */
    struct rdma_wait *next;        /* a list of failed ones */
    struct orb_xfer *x;            /* NULL: a SEND_WITH_INV of req's rail `rail` */
    struct rdma_req *req;
    uint32_t rail;
};

/* One queue pair and its message buffers. */
struct rdma_link {
    struct orb_rdma_tp *tp;
    struct rdma_ctx *ctx;
    enum rdma_role role;
    uint32_t rail;
    uint32_t lane;                 /* the lane that posts on it and polls its completions */
    uint32_t gen;                  /* the generation of the lane's CQ pair it was made on */
    atomic_uint users;             /* lanes handling one of its completions now (see link_of) */
    void *owner;                   /* struct rdma_peer or struct rdma_src_conn */
    pthread_mutex_t lock;          /* the QP's posts, its tracker, the wait queue, the slots */
    struct orb_rdma_qp *qp;
    int failed;                    /* 0, or why it is dead */
    bool recv_flushed;             /* it failed by a receive's flush that nothing here asked for */
    atomic_bool down;              /* failed != 0, readable without the lock */
    atomic_bool fault;             /* it failed because the path did (retries ran out, no ACK,
                                    * its port went down), which rail health counts */
    uint8_t *buf;                  /* RDMA_RQ_DEPTH receive slots, then sq_depth send slots */
    struct ibv_mr *buf_mr;
    uint32_t send_next;
    /* Every signal_every-th send WR asks for a completion (signal_interval, capped at half the
     * send queue; 1 on a source's links); so does any WR nothing is queued behind. unsignaled
     * counts those posted since the last that asked. */
    uint32_t signal_every, unsignaled;
    uint32_t cqe_charge;
    struct orb_qos_set waits;      /* struct rdma_wait entries, by priority */
    bool reorder;                  /* waits arrived since they were last ordered by deadline */
    /* Waits other threads handed over (inbox_lock, a leaf), moved into `waits` by the lane
     * before it posts: a grant thread never waits for the lane's posts, which under soft-RoCE
     * send the whole message inside the call. */
    pthread_mutex_t inbox_lock;
    struct rdma_wait *inbox_head, *inbox_tail;
    struct rdma_ack_wait *acks_head, *acks_tail; /* source: ACKs waiting for send-queue room */
    /* Source: the grants that ended on this queue pair in the lane's current batch of receive
     * completions, sent as one ACK when the batch is done (rdma_link_flush_acks) or full. */
    struct orb_rdma_ack acks_staged[ORB_RDMA_ACKS_MAX];
    uint32_t nacks_staged;
    struct rdma_bind_wait *binds_head, *binds_tail; /* source: window binds for the lane to post */
    struct rdma_link *all_next;    /* tp's list (tp->lock) */
    /* A queue pair of one private grant: at the source, on that grant's protection domain (its
     * owner the struct rdma_pgrant); at the requester, made for that grant's request (its owner
     * the peer still) and freed once the request ended (tp->priv_reap, reap_next). */
    bool private_grant;
    struct rdma_link *reap_next;
};

/* A window bind a control handler queued for the lane (a grant's, for one rail). */
struct rdma_bind_wait {
    struct rdma_bind_wait *next;
    struct rdma_grant *grant;
    uint32_t rail;
};

/* A source's ACK message that found the send queue full. */
struct rdma_ack_wait {
    struct rdma_ack_wait *next;
    uint32_t len;
    uint8_t msg[ORB_RDMA_ACKS_LEN_MAX];
};

/* Requester side: one connection to a source process, shared by the segments open to it (its
 * endpoint and epoch) unless this engine stages. */
struct rdma_peer {
    struct rdma_peer *all_next;    /* tp's list (tp->lock) */
    struct orb_rdma_tp *tp;
    char endpoint[ORB_ENDPOINT_MAX];
    uint64_t incarnation;
    struct orb_epoch source_epoch;
    /* Under tp->lock: the segments using it; building while its first segment connects it
     * (others wait on tp->built for it); shared: later segments to the same process may join;
     * released once its last segment let go (nobody joins it then). */
    uint32_t users;
    bool building, shared, released;
    uint64_t rail_fence_pass;      /* the monitor's rail fence that charged it last (tp->lock) */
    /* width lanes of a queue pair per rail: lane j's of rail k at links[j * nrails + k]. Replaced
     * (with the width) only by a reconnect, under `lock`, while no request holds a grant. */
    uint32_t nrails, width;
    struct rdma_link *links[ORB_RDMA_MAX_RAILS];
    /* The source's NIC slot behind rail k (its CONNECT_OK): written by the first connect, before
     * anyone else uses p; a rebuild that names other NICs fails. With tp->rail_nic[k] it keys
     * the rail's health: (source epoch, local NIC, remote NIC). */
    uint8_t remote_nic[ORB_RDMA_MAX_RAILS];
    pthread_mutex_t lock;          /* the fields below */
    uint64_t next_request;
    uint32_t next_lane;            /* the lane the next grant request goes on, in turn */
    uint32_t inflight;             /* requests taken for a grant and not ended (<= RDMA_RQ_DEPTH) */
    uint32_t serving;              /* grant threads serving a batch of it (<= RDMA_GRANT_THREADS_PER_PEER) */
    struct rdma_req *active;       /* granted, by id (a list) */
    struct rdma_peer *reap_next;   /* tp->reap_peers (tp->lock) */
    /* Rebuilding the connection after the source lost it (rdma_requester.c, reconnect): one
     * builder at a time; links and incarnation are replaced under `lock` while no request holds
     * a grant; after a failed attempt, none before reconnect_after_ns. */
    pthread_mutex_t reconnect_lock;
    uint64_t reconnect_after_ns, reconnect_backoff_ns;
    char reconnect_why[192];
    /* Healing (rdma_requester.c, heal): a rail whose queue pairs died is rebuilt with the whole
     * connection once the connection is fenced (no new GRANT_REQ) and drained (no request
     * granted or being granted on it). Under `lock`; fence_cond says the fence lifted or a
     * request left. */
    bool fenced;
    uint32_t granting;             /* grant threads between their GRANT_REQ and start() */
    pthread_cond_t fence_cond;
    uint64_t heal_after_ns;        /* no rebuild for a rail other rails stand in for before then */
    /* A request granted on the connection failed without its ACK: the source holds its grant
     * until the grant expires and then fails the whole connection; it is healed before that. */
    bool poisoned;
    uint32_t suspect;              /* rails with failures on record in the health table */
};

/* What the core holds for one segment: the connection it uses and its own control path, which
 * the segment's requests' control messages travel on (valid until the segment is released,
 * which the core does after its last request ended). */
struct rdma_seg {
    struct rdma_peer *p;
    struct orb_control_path ctl;
};

/* A request's state: the core's per-request space (ops->request_private_size). */
struct rdma_ending;

struct rdma_req {
    struct orb_qos_entry qe;       /* first member: its place in the grant queue, by priority */
    struct rdma_req *next;         /* peer->active */
    uint8_t priority;              /* enum orb_priority */
    struct rdma_peer *peer;
    const struct orb_control_path *ctl; /* its segment's */
    uint64_t id;
    uint8_t op;                    /* ORB_XFER_READ / ORB_XFER_WRITE */
    uint64_t addr, length;         /* the whole request's remote range */
    uint64_t remote_target;        /* the address the grant's windows start at (GRANT's target) */
    uint64_t incarnation;          /* the connection its GRANT_REQ went on */
    uint32_t lane;                 /* and the lane of it whose queue pairs carry it */
    bool staged;                   /* moves through stage: this engine stages */
    struct rdma_stage stage;       /* the current slot's extent */
    /* A request staged at either end moves one slot at a time, each its own grant: the current
     * slot is [slot_off, +slot_len) of the request, at most slot_max bytes (0: no bound, the
     * whole request in one). The bound is this engine's slot when it stages, lowered to the
     * source's when a staging source names a smaller one. */
    uint64_t slot_max, slot_off, slot_len;
    bool slot_wrote;               /* a WRITE slot of it ended before: the peer's bytes changed */
    /* A request of several slots holds its whole range at the source from PIN to UNPIN (pin 0:
     * none); its slots' grants on the connection it was pinned on name the pin. */
    bool pin_asked;
    uint32_t pin, pin_generation;
    uint64_t pin_incarnation;
    uint32_t npieces, arrived;
    struct orb_xfer *pieces[ORB_SLICE_MAX];
    /* Rails are chosen at dispatch, for the pieces still live then: the selector's lease holds
     * their charges (slot lease_slot[i] for piece i) until each one's WR completes. */
    struct orb_lease lease;
    bool leased;
    uint8_t lease_slot[ORB_SLICE_MAX];
    uint64_t first_post_ns[ORB_RDMA_MAX_RAILS]; /* the lane's first post of a payload WR per rail */
    uint32_t rail_mask;
    uint32_t rail_failed;          /* rails where the path failed it (rail health counts them) */
    uint32_t rail_lost;            /* rails whose queue pair died under it, whatever the cause */
    /* A READ that lost a queue pair is asked for again, from its grant on, up to read_replays
     * times; `avoid` holds the rails that lost it before (another carries it when one can). */
    uint32_t replays, avoid;
    bool pieces_asked;             /* orb_xfer_may_start() was asked, once for good */
    uint32_t reroutes;             /* refusals naming queue pairs dead at the source */
    /* A half-open trial of a paused rail (lib/topo/rail.h) rides on this request, alone on that
     * rail: trial_token 0: none. */
    uint64_t trial_token;
    uint32_t trial_rail;
    bool trial_posted;
    struct orb_rdma_grant grant;
    uint32_t key_of_rail[ORB_RDMA_MAX_RAILS];
    /* Under peer->lock once granted: */
    uint32_t rail_left[ORB_RDMA_MAX_RAILS];   /* payload WRs not completed per rail */
    uint32_t rail_wrs[ORB_RDMA_MAX_RAILS];
    uint64_t rail_bytes[ORB_RDMA_MAX_RAILS];
    uint32_t outstanding;          /* WRs posted or queued and not completed */
    uint32_t sends_left;           /* SEND_WITH_INVs not completed */
    bool counted, granted, acked, ended; /* counted: in peer->inflight */
    bool expired;                  /* its ACK deadline passed (the scan failed it) */
    /* Its failure so far comes only from rail-ending SENDs' completions (a queue pair that died
     * once it had sent one, perhaps before the transport acknowledged it): an ACK that says the
     * grant ended well undoes it. Any other failure clears it (fail_locked). */
    bool send_failure_only;
    int status;                    /* the first failure */
    char why[320];                 /* its cause */
    /* The first failure was the source's device refusing an access to a window the source
     * granted (a remote access error): before that is reported, the source is asked whether it
     * still answers (a dying process's windows go with it), the ending kept in `verdict`. */
    bool device_refused;
    struct rdma_ending *verdict;
    uint64_t deadline;             /* the ACK's */
    /* A payload WR of it may have reached the device (posted, or refused without proof that it
     * was not taken): set by the lane that posts it, before its completion can be polled. Not
     * beside the flags above, which are read together under the peer's lock. */
    atomic_bool payload_posted;
    struct rdma_wr_ctx send_ctx[ORB_RDMA_MAX_RAILS];
    struct rdma_wait waits[ORB_SLICE_MAX + ORB_RDMA_MAX_RAILS];
    /* A private grant (the source's range is device memory it lends on queue pairs of the grant
     * alone): the queue pair made for it per rail, which carries its pieces and fenced SEND
     * instead of the connection's (NULL: the connection's). */
    bool private_grant;
    struct rdma_link *priv[ORB_RDMA_MAX_RAILS];
    /* Its grants go on connections of their own: this engine stages it, or the source said so
     * (a GRANT refusal "private only"): asked with PGRANT_REQ alone from then on. priv_windows:
     * the current private grant's keys are windows (ended by SEND_WITH_INV), not regions. */
    bool per_grant;
    bool priv_windows;
};

/* Source side: a whole request's range held from PIN to UNPIN (or the connection's end, or
 * io_timeout_s and the grace without a grant under it); its slots' grants use this
 * registration, admitted once, whatever happens to its lookup meanwhile. */
struct rdma_src_pin {
    struct orb_reg *reg;           /* NULL: the slot is free */
    uint8_t op;
    uint16_t generation;           /* of the slot's last pin; never 0 */
    uint64_t request, addr, length;
    uint64_t expires_ns;
};

/* Source side: one per requester peer (CONNECT). */
struct rdma_src_conn {
    struct rdma_src_conn *next;    /* tp's list (tp->lock) */
    struct orb_rdma_tp *tp;
    struct orb_epoch sender;
    uint64_t incarnation;          /* the requester's */
    /* Its queue pairs in CONNECT's order (lane by lane, a queue pair per requester rail in
     * each); a grant's "rails" are indices into them. */
    uint32_t nqps;
    struct rdma_link *links[ORB_RDMA_MAX_RAILS];
    uint32_t unconnected;          /* queue pairs left unconnected (in INIT), never granted */
    pthread_mutex_t lock;          /* grants */
    pthread_cond_t cond;           /* bind completions */
    struct rdma_grant *grants;
    uint32_t ngrants[ORB_RDMA_MAX_RAILS]; /* grants holding a receive of each queue pair */
    uint64_t next_grant;
    struct rdma_src_pin pins[ORB_RDMA_MAX_PINS]; /* PIN's "pin" k names pins[k - 1] */
    struct rdma_pgrant *pgrants;   /* private grants (conn lock) */
    uint32_t pgrants_ending;       /* of them, waiting for their teardown on lane 0 (conn lock) */
    /* Queue pairs of window grants on connections of their own that ended, for lane 0 (or the
     * connection's destruction) to free: their owner is the connection (conn lock; reap_next). */
    struct rdma_link *own_retired;
    int failed;
    bool closing;                  /* on tp->reap_conns (tp->lock) */
    uint32_t users;                /* control handlers using it (tp->lock): not reaped meanwhile */
    struct rdma_src_conn *reap_next;
};

/* What a control call waits for: grants of its message whose binds are still out. */
struct rdma_bind_batch {
    uint32_t left;
};

struct rdma_grant {
    struct rdma_grant *next;
    struct rdma_src_conn *conn;
    uint64_t id, generation;
    uint8_t nonce[ORB_RDMA_NONCE_LEN];
    uint64_t request;
    uint8_t op;
    uint64_t addr, length;
    uint32_t rail_mask, done_mask;
    struct orb_reg *pin;
    void *loan;                    /* the pin's range loan (staged device memory), given back with it */
    struct rdma_stage stage;       /* the source stages: the windows cover this, not the pin */
    uint64_t target;               /* where the windows start (the range, or the stage) */
    char why[ORB_RDMA_WHY_MAX + 1];/* why bind_status (a failure before the binds were posted) */
    struct orb_rdma_window *win[ORB_RDMA_MAX_RAILS];
    uint32_t key[ORB_RDMA_MAX_RAILS];
    /* gpu_source_reuse: the rails whose key is a DevX key (rdma/devx_key.h) instead of a window,
     * its object, and whether a key's destruction failed (the pin is then kept for good). */
    uint32_t devx_mask;
    uint32_t devx_handle[ORB_RDMA_MAX_RAILS];
    bool keep_pin;
    uint32_t binds_left;
    /* The control call waiting for this grant's binds among others (wait_binds() in
     * rdma_source.c, conn lock): the grant's last bind counts down its `left`, and only the
     * last of all wakes the call. NULL: nobody waits. */
    struct rdma_bind_batch *batch;
    int bind_status;
    bool abandoned;                /* its GRANT call gave up: the lane frees it */
    bool published;
    uint64_t expires_ns;           /* answered: its end must come by then (0: not answered yet) */
    struct rdma_wr_ctx bind_ctx[ORB_RDMA_MAX_RAILS];
    struct ibv_send_wr bind_wr[ORB_RDMA_MAX_RAILS];   /* built by the handler, posted by the lane */
    struct rdma_bind_wait bind_wait[ORB_RDMA_MAX_RAILS];
    /* A grant on connections of its own (either side stages; PGRANT_REQ): per rail a queue pair
     * made for it on the connection's NIC and domain, connected to one the requester made for it,
     * which binds its window (so only that pair can use the key) and receives its end. Retired
     * with the grant (lane 0 frees them). NULL: the connection's queue pairs. */
    struct rdma_link *own[ORB_RDMA_MAX_RAILS];
    bool own_links;
};

/* Source side: a private grant, for device memory under cuda_memory direct, where no window may
 * be bound: for each rail of it a protection domain of its own, the memory region of exactly the
 * range with the op's access only, and a queue pair on that domain, connected to one the
 * requester made for the grant. It ends with the requester's fenced SEND of the BINDING on each
 * rail; then lane 0 tears down the queue pairs, regions and domains (rdma_private.c), and only
 * after that the ACK goes, on the connection's own queue pair. One that fails or expires is torn
 * down the same way, without an ACK; its connection lives on. */
enum rdma_pgrant_state { RDMA_PGRANT_ACTIVE = 1, RDMA_PGRANT_ENDING = 2 };

struct rdma_pgrant {
    struct rdma_pgrant *next;      /* conn->pgrants */
    struct rdma_src_conn *conn;
    uint64_t id, generation;
    uint8_t nonce[ORB_RDMA_NONCE_LEN];
    uint64_t request;
    uint8_t op;
    uint64_t addr, length;
    uint32_t rail_mask, done_mask; /* queue pairs of the connection it runs beside */
    struct orb_reg *pin;
    struct ibv_pd *pd[ORB_RDMA_MAX_RAILS];
    struct ibv_mr *mr[ORB_RDMA_MAX_RAILS];
    struct rdma_link *link[ORB_RDMA_MAX_RAILS];
    enum rdma_pgrant_state state;  /* conn lock */
    int status;                    /* why it ends, when not by its bindings (0: by them) */
    char why[160];
    bool ack;                      /* every BINDING came: its end is acknowledged */
    uint64_t expires_ns;
};

/* ---- rdma_link.c ------------------------------------------------------------------------------ */

/* Prepare every open NIC's data path (address, CQs, window pool) and start the lane thread.
 * NICs that cannot carry rails are logged and left out. 0 or ORB_ENOMEM/ORB_EUNAVAILABLE. */
int rdma_data_start(struct orb_rdma_tp *tp);
/* Stop: no new work; every link to the error state and its flushes drained (within
 * RDMA_DRAIN_NS, whatever `deadline` says); the lane and grant threads joined; every pending
 * request ended with ORB_ECLOSED; the source's connections torn down. Requester links stay
 * until their peers are released. 0, or ORB_EUNQUIESCED when work requests were still
 * outstanding after the drain: then the requests, queue pairs and memory stay as they are, and
 * a later call polls the completion queues itself until `deadline` and finishes the stop once
 * nothing is outstanding. Once it returned 0, it returns 0. */
int rdma_data_stop(struct orb_rdma_tp *tp, uint64_t deadline);
/* After every peer was released: free the contexts' CQs and windows. */
void rdma_data_destroy(struct orb_rdma_tp *tp);

/* A link on context `c`: a QP in RESET with its message buffers, receives posted once
 * connected. Charged to max_endpoints and the CQ's capacity. It goes to the first lane from
 * `first_lane` (RDMA_ANY_LANE: the next in turn) with room in its CQs, one on the NIC's NUMA
 * node when there is one. ORB_ERESOURCE (a budget, named), ORB_ENOMEM, the device's refusal. */
#define RDMA_ANY_LANE UINT32_MAX /* and a context with only_lane set uses that one */
int rdma_link_new(struct orb_rdma_tp *tp, struct rdma_ctx *c, enum rdma_role role, uint32_t rail, uint32_t first_lane,
                  void *owner, struct rdma_link **out);
/* What a link carries: a connection's grants; one private grant (either side: a source's on the
 * grant's own protection domain, its receives to rdma_pgrant_on_recv); or one window grant's at
 * a source (on the connection's domain, its receives to rdma_src_on_recv). */
enum rdma_link_use { RDMA_LINK_SHARED = 0, RDMA_LINK_PRIVATE = 1, RDMA_LINK_ONE_GRANT = 2 };
/* The same on protection domain `pd` of `c` (a private grant's at a source), the QP and its
 * message buffers, for `use`. */
int rdma_link_new_on(struct orb_rdma_tp *tp, struct rdma_ctx *c, struct ibv_pd *pd, enum rdma_link_use use,
                     enum rdma_role role, uint32_t rail, uint32_t first_lane, void *owner, struct rdma_link **out);
/* Connect to `remote` and post every receive. */
int rdma_link_connect(struct rdma_link *l, const struct orb_rdma_qp_addr *remote);
/* Post one send WR (wr->wr_id is set here from the tracker) with `cookie`; with `msg`, its
 * `msg_len` (<= RDMA_MSG_SLOT) bytes are copied into the next send slot, which becomes the WR's
 * only SGE. `more`: another WR is queued right behind this one, so it may go unsignaled (its
 * completion is then learnt from a later one's: the send queue completes in order); without
 * `more` it is always signalled, so that no WR waits for a completion nobody will ask for.
 * ORB_ERESOURCE when the send queue is full (nothing posted), ORB_EPEER when the link is dead or
 * the device refused the post naming it (bad_wr) as not taken, RDMA_POST_UNKNOWN when it
 * refused it without that proof (the WR stays tracked); the link is failed in both cases. The
 * link's lock is held; only the lane posts. */
int rdma_link_post_locked(struct rdma_link *l, struct ibv_send_wr *wr, uint64_t cookie, const void *msg,
                          uint32_t msg_len, bool more);
/* Have the lane of `l` post what is queued on it: now when called on that lane, else by kicking it. */
void rdma_link_kick(struct rdma_link *l);

/* ---- shared priority slots (rdma_slots.c) ---- */
/* Attach the helper's slot object of shared_quota_shm_path (nothing when unset). Errors: the
 * helper's refusal or a damaged object (the engine then fails: never a silent local fallback),
 * ORB_EUNAVAILABLE (no helper session). */
int rdma_slots_attach(struct orb_rdma_tp *tp);
void rdma_slots_detach(struct orb_rdma_tp *tp);
/* May a payload post of `priority` go at now_ns? When not, *retry_ns is the next slot boundary. */
bool rdma_slots_allow(struct orb_rdma_tp *tp, unsigned priority, uint64_t now_ns, uint64_t *retry_ns);
/* Queue a grant's bind for the lane to post, and kick it. */
void rdma_link_queue_bind(struct rdma_link *l, struct rdma_bind_wait *w);
/* Add the end of a grant to the ACK `l`'s lane sends when its batch of receive completions is
 * done (link lock taken here); a full ACK goes at once. Its lane's thread only. ORB_EPEER: the
 * link is dead and nothing was added (the caller hands the ACK on). */
int rdma_link_stage_ack(struct rdma_link *l, const struct orb_rdma_ack *a);
/* Send the ACK of what was staged on `l`, if anything: posted, or queued behind earlier ones
 * while the send queue is full; one the dead link cannot take is handed on
 * (rdma_src_ack_lost). */
void rdma_link_flush_acks(struct rdma_link *l);
/* Queue an ACK message (`len` bytes, as orb_rdma_acks_encode() made it) on `l` and kick its
 * lane, which posts it: how an ACK another queue pair could not deliver moves to this one.
 * ORB_EPEER (the link is dead), ORB_ENOMEM. */
int rdma_link_queue_ack(struct rdma_link *l, const uint8_t *msg, uint32_t len);
/* Hand `w` to the link's lane, behind what was handed over before it (any thread, link lock not
 * needed); the lane queues it by priority when it next drains the link: kick it. */
void rdma_link_hand_over(struct rdma_link *l, struct rdma_wait *w);
/* The promotion settings of the transport's priority queues. */
void rdma_qos_config(const struct orb_rdma_tp *tp, struct orb_qos_config *out);
/* rdma_link_post_locked's answer when the device refused a post without naming it as not
 * taken (bad_wr): the link is failed and the WR stays tracked, as posted. */
#define RDMA_POST_UNKNOWN 1
/* Move the QP to the error state (every outstanding WR flushes) and remember `status`. */
void rdma_link_fail(struct rdma_link *l, int status);
/* The same, for a failure of the path rather than of the peer (rail health counts it). */
void rdma_link_fault(struct rdma_link *l, int status);
/* The monitor fenced rail `rail` under live queue pairs of connection `p` (tp->lock held): one
 * failure of its pair there (rdma_requester.c), once per connection and fence. */
void rdma_req_rail_fenced(struct rdma_peer *p, uint32_t rail);
/* Unhook from the lane and destroy (the QP must hold no bound window). 0, or ORB_EBUSY when the
 * device refused to destroy the QP or deregister its buffers: then they stay, for good (and a
 * private grant's PD with them). NULL: 0. Never on a lane inside a completion of `l`. */
int rdma_link_free(struct rdma_link *l);
/* Have lane 0 run its reaping soon (a private grant waits for teardown). */
void rdma_lane0_kick(struct orb_rdma_tp *tp);
/* Fail and free links[from..to), skipping empty places; each place is NULL afterwards. */
void rdma_links_drop(struct rdma_link **links, uint32_t from, uint32_t to);

/* ---- rdma_staging.c --------------------------------------------------------------------------- */

/* The staging arena's bookkeeping when host_memory is staged (none otherwise). 0 or ORB_ENOMEM. */
/* gpu_source_reuse (rdma_reuse.c). rdma_reuse_site: where NIC `nic`'s DevX keys are made and
 * checked (ORB_EUNAVAILABLE: it carries no rails, or was opened without the helper).
 * rdma_reuse_probe: the NICs of `m` that made and verified a key over [base, +len) as a grant
 * would (the others are logged and counted); *keep_out is set when a probe key could not be
 * destroyed, so that the registration's bytes and MRs must stay for good. */
struct orb_devx_key_site;
int rdma_reuse_site(struct orb_rdma_tp *tp, uint32_t nic, struct orb_devx_key_site *out);
uint64_t rdma_reuse_probe(struct orb_rdma_tp *tp, const struct orb_rdma_reg_mrs *m, uint64_t base, uint64_t len,
                          bool *keep_out);

int rdma_staging_start(struct orb_rdma_tp *tp);
/* Staging of `len` bytes for `reg`'s memory (at most its slot, rdma_stage_slot_shift): an extent of
 * the arena for host memory, a chunk of the engine's pool for device memory (taken as a source's
 * when `source`: sources may use the chunks requesters leave them), waiting until `deadline`
 * while staging is full (0: no wait, and ORB_EAGAIN when full). Errors: ORB_EUNAVAILABLE (this
 * engine does not stage), ORB_ERESOURCE (above max_staging_bytes or a chunk, or still full at the
 * deadline; a chunk a NIC would not register), ORB_ENOMEM/ORB_ERESOURCE/ORB_EPERM (the arena
 * could not be made: every later take fails the same way), ORB_ECLOSED (stopping). */
int rdma_stage_take(struct orb_rdma_tp *tp, const struct orb_reg *reg, uint64_t len, uint64_t deadline, bool source,
                    struct rdma_stage *out);
/* Give an extent back (cpu NULL: nothing); wakes waiters. */
void rdma_stage_put(struct orb_rdma_tp *tp, struct rdma_stage *s);
/* The staging slot of this engine for `reg`'s memory, as a shift (ORB_RDMA_SLOT_SHIFT_MIN..MAX):
 * the most bytes one grant of staged memory moves, at either end (a longer request moves slot by
 * slot): a quarter of the arena for host memory, a pool chunk for device memory. */
uint32_t rdma_stage_slot_shift(const struct orb_rdma_tp *tp, const struct orb_reg *reg);
/* The MRs on NIC `nic` of the staging `st` (held by the caller), or NULL. */
const struct orb_rdma_reg_mr *rdma_stage_mr(const struct orb_rdma_tp *tp, const struct rdma_stage *st, uint32_t nic);
/* Bytes of staging in use now. */
uint64_t rdma_staging_in_use(struct orb_rdma_tp *tp);
/* After the data path stopped: unregister and unmap (kept where a NIC refuses, or where
 * staging is still in use: then as rdma_staging_abandon()). */
void rdma_staging_destroy(struct orb_rdma_tp *tp);
/* The transport goes without proving its work's end: the staging stays as it is (in place: lanes
 * may still run), and every pool chunk registered with a NIC is retired in the pool (a chunk lent
 * now, when it comes back), so that the pool never frees or lends memory a NIC may still
 * reach. */
void rdma_staging_abandon(struct orb_rdma_tp *tp);

/* ---- rdma_requester.c ------------------------------------------------------------------------- */

int rdma_peer_open(void *tp, const char *endpoint, const struct orb_epoch *expected, uint64_t deadline,
                   const struct orb_control_path *ctl, void **peer_out);
int rdma_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan);
int rdma_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n);
void rdma_peer_release(void *peer);
/* Completions the lane hands over. */
void rdma_req_on_send(struct rdma_link *l, uint64_t cookie, const struct ibv_wc *wc, bool is_this);
void rdma_req_on_recv(struct rdma_link *l, const struct ibv_wc *wc, const uint8_t *msg);
/* The lane's periodic look at ACK deadlines. */
void rdma_req_scan(struct orb_rdma_tp *tp, uint64_t now);
/* Source: fail and let go of each connection holding a grant whose end did not come by its
 * expiry (the requester died, or lost the connection without a word): its windows, pins and
 * staging go with it, and the requester's next grant request finds it gone and reconnects. */
void rdma_src_scan(struct orb_rdma_tp *tp, uint64_t now);
/* End every request still pending (stop). */
void rdma_req_fail_all(struct orb_rdma_tp *tp, int status);
/* A queued wait was posted on `l` (the lane, link lock held): the NIC's transmit bookkeeping. */
void rdma_req_posted(struct rdma_wait *w, const struct rdma_link *l);
/* Post what waits for send-queue room on `l` (after completions freed some). */
void rdma_link_drain_waits(struct rdma_link *l);
/* The WR (and message) of a queued wait; a queued wait that could not be posted. */
void rdma_req_build(struct rdma_wait *w, const struct rdma_link *l, struct ibv_send_wr *wr, struct ibv_sge *sge,
                    uint64_t *cookie, uint8_t *msg, uint32_t *msg_len);
void rdma_req_wait_failed(struct rdma_wait *w, int status, bool path_failed);
/* Free released peers whose requests all ended (`force`: the lane is gone: all of them). */
void rdma_req_reap(struct orb_rdma_tp *tp, bool force);
void *rdma_grant_thread(void *arg);
/* Count a change that can let a queued request go and wake one grant thread (`all`: every
 * one), whether it waits on gcond or naps on the count. Any lock or none may be held. */
void rdma_grant_wake(struct orb_rdma_tp *tp, bool all);

/* ---- rdma_source.c ---------------------------------------------------------------------------- */

int rdma_source_control(void *tp, const struct orb_epoch *sender, const uint8_t *req, size_t len, uint8_t *resp,
                        size_t cap, size_t *resp_len);
void rdma_src_on_send(struct rdma_link *l, uint64_t cookie, const struct ibv_wc *wc);
/* A queued bind the lane could not post (the link is dead). */
void rdma_src_bind_failed(struct rdma_grant *g, uint32_t rail, int status);
/* An ACK that source link `l` did not deliver (its send ended in error, or it was still queued
 * when the link died): another live queue pair of the connection carries it. */
void rdma_src_ack_lost(struct rdma_link *l, const uint8_t *msg, uint32_t len);
void rdma_src_on_recv(struct rdma_link *l, const struct ibv_wc *wc, const uint8_t *msg);
/* Mark every source connection for teardown (stop). */
void rdma_src_close_all(struct orb_rdma_tp *tp);
/* Tear down connections marked for it once their work requests are in (`force`: now). */
void rdma_src_reap(struct orb_rdma_tp *tp, bool force);

/* A grant's admission on c: its queue pairs are c's and connected (ORB_EPROTO, ORB_EUNAVAILABLE),
 * and one registration holds the whole range with the op's permission (ORB_ENOENT, ORB_EPERM), or,
 * for a slot of a pinned request, the pin holds it (ORB_ENOENT); any GPU work recorded on it has
 * ended. 0 with *out retained (the caller releases it). */
int rdma_src_admit(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_grant_ask *in,
                   struct orb_reg **out);
/* Whether BINDING `b` carries exactly a grant's terms on c: its generation, nonce, request, range,
 * op and the rail's key, c's incarnation and both engines' epochs. */
bool rdma_src_binding_matches(const struct orb_rdma_binding *b, const struct rdma_src_conn *c, uint64_t generation,
                              const uint8_t nonce[ORB_RDMA_NONCE_LEN], uint64_t request, uint64_t addr,
                              uint64_t length, uint8_t op, uint32_t rkey);
/* Before a WRITE grant of Direct device memory (id `grant`) is acknowledged: what the NIC wrote
 * is made visible to the device (cuFlushGPUDirectRDMAWrites where it does not order NIC writes).
 * 0, or ORB_EUNAVAILABLE (logged) when the flush failed. Nothing to do for other grants. */
int rdma_src_gdr_visible(const struct orb_reg *pin, uint8_t op, uint64_t grant);

/* ---- rdma_private.c: private grants at the source -------------------------------------------- */

/* PGRANT_REQ on connection `c` (held by the caller): answers PGRANT into resp. Device memory
 * under cuda_memory direct gets regions of the grant's own domains; any other range a window
 * grant on queue pairs of its own (rdma_src_window_pgrant). */
int rdma_pgrant_serve(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_pgrant_req *in,
                      struct orb_rdma_pgrant *out);
/* A window grant on queue pairs of its own, for PGRANT_REQ (either side stages): the grant's
 * windows bound through queue pairs made for it and connected to the request's. 0 with *out
 * filled (keys ORB_RDMA_PGRANT_WINDOWS), or the refusal (out->slot_shift set with a staging
 * source's ORB_ERESOURCE). */
int rdma_src_window_pgrant(struct orb_rdma_tp *tp, struct rdma_src_conn *c, const struct orb_rdma_pgrant_req *in,
                           struct orb_rdma_pgrant *out);
/* A receive completion on a private grant's queue pair (msg NULL: it failed). */
void rdma_pgrant_on_recv(struct rdma_link *l, const struct ibv_wc *wc, const uint8_t *msg);
/* Lane 0: tear down the ending private grants of `c` (all of them with `all`: c is destroyed),
 * and ACK those whose bindings all came, unless `all`. */
void rdma_pgrant_reap(struct orb_rdma_tp *tp, struct rdma_src_conn *c, bool all);
/* The scan: private grants of `c` past their expiry end, without an ACK. */
void rdma_pgrant_scan(struct orb_rdma_tp *tp, struct rdma_src_conn *c, uint64_t now);

#endif
