/* Internal: the RDMA transport's state, and the seams its tests use.
 *
 * An engine runs the RDMA transport only when it was given RDMA settings
 * (orb_engine_create_params() with ORB_ENGINE_PARAM_RDMA): an engine without them never loads
 * libibverbs and never starts the helper. Starting it:
 *   1. loads libibverbs (missing: not on this host);
 *   2. discovers the NICs: through the helper's INVENTORY and POLICY when a helper session is
 *      open (the policy's NIC mask bounds what may be opened, its RDMA grant whether any may),
 *      else from /sys. A helper that is installed but fails is an error in every mode; an
 *      absent one is an error only in ORB_HELPER_REQUIRED;
 *   3. filters them with the settings' whitelist, blacklist, device_mask, pins and NUMA rules
 *      (lib/topo/topo_config.h): a filter that leaves nothing, or a pin that does not hold, is
 *      ORB_ECONFIG;
 *   4. opens each remaining NIC (lib/rdma/devices.h), recording its device limits.
 * No NIC left, or none opened: not on this host, and the engine runs on TCP.
 *
 * Registrations (host memory), by the settings' host_memory policy:
 *   - direct: the registration's MRs on every open context (lib/rdma/reg_mrs.h), before it is
 *     visible, charged to the helper policy's max_registered_bytes when a policy applies;
 *   - staged: none: the payload moves through the transport's private registered staging.
 * Memory without a CPU view (device memory) gets no MR: it always moves through that staging,
 * copied with its memory kind's own copies (GPUDirect registration is not part of this release).
 *
 * The data path (connections, grants, READ/WRITE) is rdma_data.h's. */
#ifndef ORB_RDMA_TRANSPORT_H
#define ORB_RDMA_TRANSPORT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/rdma_config.h"
#include "core/transport.h"
#include "rdma/devices.h"
#include "rdma/reg_mrs.h"
#include "topo/qos.h"
#include "topo/selector.h"
#include "topo/slots.h"

/* What discovery found. */
struct orb_rdma_discovery {
    struct orb_topo_inventory inv;
    uint64_t allowed;              /* NIC ids the policy allows (all without a policy) */
    bool policy;                   /* a helper's policy applies */
    bool rdma_granted;             /* the policy grants the RDMA transport (true without one) */
    uint64_t max_registered_bytes; /* the policy's budget (UINT64_MAX without one) */
    struct orb_helper *helper;     /* the open session, or NULL; the transport owns it */
};

struct orb_devx_key_ops;
struct orb_hp_devx_verify;

/* Where the transport's native calls go. orb_rdma_transport uses libibverbs, the helper and
 * /sys; tests pass scripted ones to orb_rdma_tp_start_with(). */
struct orb_rdma_env {
    void *impl;
    /* Load the verbs library: 0, or ORB_EUNAVAILABLE (the message names what is missing). */
    int (*load_verbs)(void *impl, const struct orb_verbs **out);
    int (*discover)(void *impl, enum orb_helper_mode mode, struct orb_rdma_discovery *out);
    /* Device opening and MRs; NULL: the real ones over the loaded library. */
    const struct orb_rdma_open_ops *open_ops;
    const struct orb_rdma_mr_ops *mr_ops;
    /* ibv_query_device; 0 or an errno value. */
    int (*query_device)(void *impl, struct ibv_context *ctx, struct ibv_device_attr *out);
    /* ibv_query_port; 0 or an errno value. NULL: no data path (registrations only). */
    int (*query_port)(void *impl, struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *out);
    /* DevX keys (gpu_source_reuse), with `impl`, and their check; NULL: the kernel's, checked
     * by the helper session. */
    const struct orb_devx_key_ops *devx_ops;
    int (*devx_verify)(void *impl, const struct orb_hp_devx_verify *v);
};

/* The device limits a NIC reported when it was opened. */
struct orb_rdma_nic_caps {
    bool queried;
    bool mw_type_2b;             /* one-use windows (grants) can be bound on it */
    uint64_t max_mr_size;
    uint32_t max_qp_wr, max_cqe, max_qp_rd_atom, max_qp_init_rd_atom;
    /* Driven by soft-RoCE (rdma_rxe), as sysfs says: under Linux 6.1 its queue pairs stall when
     * two threads post and poll queue pairs of one device at once, so all of the device's go on
     * one lane. */
    bool one_lane;
};

struct rdma_ctx;
struct rdma_link;
struct rdma_src_conn;
struct rdma_req;
struct rdma_peer;
struct rdma_staging;
struct rdma_lane;
struct orb_rail_table;

struct orb_rdma_tp {
    orb_engine *engine;
    const struct orb_rdma_config *cfg;   /* the engine's copy; the engine outlives the transport */
    const struct orb_verbs *v;
    struct orb_rdma_env env;
    struct orb_rdma_verbs_impl verbs;    /* impl of the real tables */
    void *ops_impl;                      /* impl given to the open and MR tables */
    struct orb_rdma_discovery disc;
    struct orb_rdma_devices dev;
    struct orb_rdma_nic_caps caps[ORB_TOPO_MAX_NICS];
    atomic_uint_fast64_t registrations, mrs, registered_bytes, kept_mrs; /* orb_engine_rdma_stats */
    atomic_uint_fast64_t dmabuf_registrations, peermem_registrations;
    atomic_uint_fast64_t slots_moved; /* staged_slots */
    atomic_uint_fast64_t private_grants; /* private_grants */
    atomic_uint_fast64_t own_grants;     /* own_connection_grants */
    atomic_uint_fast64_t grant_trips;    /* grant_round_trips */
    atomic_uint_fast64_t ack_messages;   /* ack_messages */
    atomic_uint_fast64_t reuse_grants, reuse_probe_failures, kept_keys;
    atomic_uint_fast64_t pgrants_ending; /* private grants waiting for their teardown on lane 0 */
    atomic_uint_fast64_t own_retired;    /* window grants' own queue pairs waiting for lane 0 to free them */

    /* The data path (rdma_data.h); data is false where it does not run. */
    bool data;
    uint64_t io_timeout_ns;
    struct rdma_ctx *dctx[ORB_TOPO_MAX_NICS];   /* by NIC slot; NULL when not ready */
    uint32_t nrails;
    uint32_t rail_nic[16];                      /* ORB_RDMA_MAX_RAILS: rail k's NIC slot */
    pthread_mutex_t lock;                       /* links, conns, endpoints, CQ charges */
    struct rdma_link *links;
    struct rdma_peer *peers;
    pthread_cond_t built;                       /* a connection's first segment built it (tp->lock) */
    struct rdma_src_conn *conns;
    struct rdma_peer *reap_peers;               /* released, freed by the lane */
    struct rdma_src_conn *reap_conns;           /* closing, freed by the lane */
    pthread_mutex_t priv_lock;                  /* priv_reap (a leaf lock) */
    struct rdma_link *priv_reap;                /* requester queue pairs of ended private grants */
    uint32_t src_scan_turn;                     /* where the grant-expiry scan goes on (tp->lock) */
    uint32_t reap_from;                         /* where a short private-grant reap goes on (tp->lock) */
    uint64_t rail_fence_passes;                 /* fail_rail_links() calls so far (tp->lock) */
    uint64_t drain_deadline;
    uint32_t endpoints;                         /* QPs, against max_endpoints */
    atomic_int stopping;
    bool unquiesced;                            /* stop left work requests outstanding */
    struct rdma_lane *lanes;                    /* nlanes of them (rdma_data.h) */
    uint32_t nlanes;
    uint32_t next_lane;                         /* the lane the next link gets (tp->lock) */
    pthread_t granter[4];                       /* RDMA_GRANT_THREADS */
    bool lane_started;                          /* the lanes run */
    uint32_t granters;                          /* started */
    pthread_mutex_t glock;                      /* the grant queue */
    pthread_cond_t gcond;
    struct orb_qos_set gq;                      /* requests waiting for a grant thread, by priority */
    struct rdma_req *verdicts;                  /* refused by the source's device, waiting for a grant
                                                 * thread to ask whether the source lives (glock) */
    /* Counts what can let a queued request go: a request queued, a peer's room back, a grant
     * thread of a peer's share free, a refusal to settle, the stop. A walk of the queue that
     * found nothing to take at count N is not repeated until the count moves (grant_idle_gen,
     * glock): a queue held up by a peer that does not answer is not walked again and again.
     * Grant threads that found nothing nap on the count itself (a futex word, without glock),
     * so that a change made under a peer's lock alone cannot be missed; grant_nappers says
     * whether a change needs a FUTEX_WAKE (rdma_grant_wake). */
    _Atomic uint32_t grant_gen;
    _Atomic uint32_t grant_nappers;
    uint32_t grant_idle_gen;
    bool grant_idle;                            /* a walk found nothing at grant_idle_gen (glock) */
    struct rdma_staging *staging;               /* the arena (mapped on first use); NULL before start */
    bool host_staged;                           /* host_memory staged: host memory moves through it */
    struct orb_topo_ranks *ranks;               /* the priority matrix compiled; NULL: none */
    /* Tiers of host memory: row 0 of unknown node, row 1 + N of node N (set in numa_rows). */
    uint64_t numa_rows;
    uint8_t nic_tier[1 + ORB_TOPO_MAX_NUMA][ORB_TOPO_MAX_NICS]; /* by NIC id */
    struct orb_selector *sel;                   /* picks a rail per slice (selector index = rail) */
    uint8_t rail_tier[1 + ORB_TOPO_MAX_NUMA][ORB_TOPO_MAX_NICS]; /* the same by rail, then excluded */
    atomic_uint_fast64_t inflight_reqs, active_grants;
    atomic_uint_fast64_t completed_reads, completed_writes, payload_send_cqes, grants_served, errors;
    atomic_uint_fast64_t staged_transfers;
    /* shared_quota_shm_path: the helper's slot object, mapped read-only (rdma_slots.c); NULL:
     * local scheduling. */
    void *slots_map;
    size_t slots_len;
    struct orb_slots_reader slots;
    atomic_uint_fast64_t slot_deferrals;        /* payload drains the slot held back */
    atomic_uint_fast64_t deadline_drops;        /* requests admission dropped before dispatch */
    atomic_uint_fast64_t reconnects;            /* requester connections rebuilt */
    atomic_uint_fast64_t read_replays;          /* READs asked again after a path failure */
    atomic_uint_fast64_t connections;           /* requester connections built, not released */
    atomic_uint_fast64_t source_connections;    /* source connections made, not closing */
    /* Rail health per (peer epoch, local rail, remote rail): lib/topo/rail.h; NULL without a
     * data path. Rail k is "NIC" k to it on both sides. */
    struct orb_rail_table *health;
    /* The monitor (lane 0, every RDMA_MONITOR_EVERY_NS): rails whose port is not active. */
    _Atomic uint32_t routes_down;
    atomic_uint_fast64_t monitor_ticks, route_queries, route_recoveries;
    atomic_uint_fast64_t kept_qps;              /* queue pairs the device refused to destroy */
    atomic_uint_fast64_t progress_recoveries;   /* lanes whose CQ pair was replaced */
    atomic_uint reclaim_work;                   /* broken lanes and replaced CQ pairs not yet destroyed:
                                                 * while 0 the lanes skip progress recovery */
};

/* start() with `env` (copied; its impl must outlive the transport). */
int orb_rdma_tp_start_with(orb_engine *engine, const struct orb_rdma_env *env, void **tp_out);
/* The environment orb_rdma_transport starts with (libibverbs, the helper, /sys), for tests that
 * replace one part of it. */
const struct orb_rdma_env *orb_rdma_real_env(void);

/* The registration state the transport attached to `reg` (NULL: none: staged, or no RDMA). */
const struct orb_rdma_reg_mrs *orb_rdma_tp_reg_mrs(const struct orb_reg *reg);

#endif
