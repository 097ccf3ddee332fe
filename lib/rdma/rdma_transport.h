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
 *
 * In this release the transport registers memory but does not move bytes yet: peer_open()
 * answers ORB_EUNAVAILABLE, so a segment carries every request on TCP. */
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

/* What discovery found. */
struct orb_rdma_discovery {
    struct orb_topo_inventory inv;
    uint64_t allowed;              /* NIC ids the policy allows (all without a policy) */
    bool policy;                   /* a helper's policy applies */
    bool rdma_granted;             /* the policy grants the RDMA transport (true without one) */
    uint64_t max_registered_bytes; /* the policy's budget (UINT64_MAX without one) */
    struct orb_helper *helper;     /* the open session, or NULL; the transport owns it */
};

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
};

/* The device limits a NIC reported when it was opened. */
struct orb_rdma_nic_caps {
    bool queried;
    bool mw_type_2b;             /* one-use windows (grants) can be bound on it */
    uint64_t max_mr_size;
    uint32_t max_qp_wr, max_cqe, max_qp_rd_atom, max_qp_init_rd_atom;
};

/* Counters, read with orb_rdma_tp_counters(). */
struct orb_rdma_counters {
    uint64_t registrations;      /* registrations holding MRs now */
    uint64_t mrs;                /* MRs held now, across contexts */
    uint64_t registered_bytes;   /* bytes of those registrations (each counted once) */
    uint64_t kept_mrs;           /* MRs a device refused to deregister (kept forever) */
};

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
    atomic_uint_fast64_t registrations, mrs, registered_bytes, kept_mrs;
};

/* start() with `env` (copied; its impl must outlive the transport). */
int orb_rdma_tp_start_with(orb_engine *engine, const struct orb_rdma_env *env, void **tp_out);

void orb_rdma_tp_counters(const struct orb_rdma_tp *tp, struct orb_rdma_counters *out);

/* The registration state the transport attached to `reg` (NULL: none: staged, or no RDMA). */
const struct orb_rdma_reg_mrs *orb_rdma_tp_reg_mrs(const struct orb_reg *reg);

#endif
